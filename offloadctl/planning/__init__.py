"""Plan: the stages select -> filter -> prefetch, and the passes that chain them.

`request` is the one typed options object (`PlanRequest`, a part per stage, validated once);
`select`, `filter` and `prefetch` are the single-rule stages (select reads a tensor's uses through
`uses` and where onnxruntime reads it in host memory through `host_reads`); `budget` is the budget planner
(candidates, greedy and exact searches, weight streaming); `planners` is the distance planner;
`tradeoff` sits on top of both (the frontier, ``--max-slowdown``); `passes` is the plan's pipeline,
HyperOffload's steps as declared passes over one state (select, filter, prefetch, events, pins), each
saying what it reads, writes, requires and ensures and whether it changes the plan in place; `make`
runs them (`scheduled_plan`, the planner's plan alone; the plan document, with the report made after
the pipeline, is `offloadctl.pipeline.planned_document`); `outcome` is what a
planner returns; `explain` and `advice` say why a plan is what it is. Nothing here edits ONNX.
"""
