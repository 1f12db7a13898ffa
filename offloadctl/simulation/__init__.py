"""Simulate: what a plan (or a rewritten model) does to peak memory and run time.

The simulator is also the planners' oracle, so it sits below them. Its rooms: `base` (the model's
original nodes with tensors as integer ids), `program` (the steps with a plan's copies), `memory`
(bytes alive at every step, the peak, the lower bound), `timing` (node costs and run time with
copies in line or on streams), `result` (`simulate` and `SimResult`), `costs` (what a copy costs:
bytes or time, the planners' objectives), `estimate` (a simulation's figures for verdicts and
plans), `points` (one plan at several shapes), `arena`, `ortcpu` (onnxruntime's CPU allocation
planner and BFC arena replayed), `ortstreams` (its reuse plan for several logic streams on one
device) and `profiles` (device profiles: bundled datasheets and measured ones). It reads an
`Analysis`, a plan and a profile; it never edits ONNX.
"""
