"""The two planners, one protocol: an analysis and a `PlanRequest` in, a scheduled plan out.

- The distance planner (HyperOffload's, the default): `select`, `filter_plan` and `prefetch`
  chained, the same plan as running the three stages one by one.
- The budget planner (``request.budget``, ``stream_weights`` or ``strategy="budget"``): chooses
  what to offload so the peak fits the budget at the least cost
  (`offloadctl.planning.budget.strategy.budget_plan`).

`plan_with` picks one by the request; the trade-off (``max_slowdown``,
`offloadctl.planning.tradeoff`) sits on top of them, and `offloadctl.planning.make.make_plan`
picks among all three.
"""

from __future__ import annotations

from offloadctl.analysis.graph import Analysis
from offloadctl.core.bulk import paused_gc
from offloadctl.planning.budget.strategy import budget_plan
from offloadctl.planning.filter import filter_plan
from offloadctl.planning.outcome import PlanOutcome
from offloadctl.planning.prefetch import prefetch
from offloadctl.planning.request import PlanRequest
from offloadctl.planning.select import select

__all__ = ["distance_plan", "plan_with"]


@paused_gc()
def distance_plan(analysis: Analysis, request: PlanRequest) -> PlanOutcome:
    """HyperOffload's planner: select at ``select_distance``, keep the first ``select_num``, prefetch."""
    request.report("selecting")
    selected = select.run(analysis, request)
    request.report("filtering")
    # chained, so each stage's input can be freed once the next stage has copied it (big plans)
    filtered = filter_plan.run(selected, request)
    del selected
    request.report("scheduling")
    return PlanOutcome(prefetch.run(filtered, request))


def plan_with(analysis: Analysis, request: PlanRequest) -> PlanOutcome:
    """The scheduled plan of the planner the request asks for: the budget planner when it gives a
    budget or weight streaming (or ``strategy="budget"``), else the distance planner. A request
    with ``max_slowdown`` goes to `offloadctl.planning.make.make_plan`."""
    if request.uses_budget:
        outcome = budget_plan(analysis, request)
        request.report("scheduling")
        return outcome
    return distance_plan(analysis, request)
