"""Plan: the stages select -> filter -> prefetch, pure functions from plan to new plan.

`request` is the one typed options object (`PlanRequest`, a part per stage, validated once);
`select`, `filter` and `prefetch` are the single-rule stages; `budget` is the budget planner
(candidates, greedy and exact searches, weight streaming); `planners` turns an analysis and a
request into a scheduled plan with either planner, `make` is the one entry (`make_plan`) and
`outcome` what a planner returns; `tradeoff` sits on top (the frontier, ``--max-slowdown``);
`explain` and `advice` say why a plan is what it is. Nothing here edits ONNX.
"""
