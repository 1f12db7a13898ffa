"""The two planners, one protocol: an analysis and a `PlanRequest` in, a scheduled plan out.

- The distance planner (HyperOffload's, the default): `select`, `filter_plan` and `prefetch`
  chained, the same plan as running the three stages one by one (the filter looks at the select
  stage's records, so that entries are built only for the offloads it keeps).
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
from offloadctl.core.plantypes import Rejection, rejection
from offloadctl.planning.budget.strategy import budget_plan
from offloadctl.planning.filter import filtered, verdicts
from offloadctl.planning.outcome import PlanOutcome
from offloadctl.planning.prefetch import prefetch
from offloadctl.planning.request import PlanRequest
from offloadctl.planning.select import Chosen, selected_plan, selection_for

__all__ = ["distance_plan", "plan_with"]


@paused_gc()
def distance_plan(analysis: Analysis, request: PlanRequest) -> PlanOutcome:
    """HyperOffload's planner: select at ``select_distance``, keep the first ``select_num``, prefetch."""
    request.report("selecting")
    distance = request.select_distance
    selection = selection_for(analysis, request)
    chosen, rejected = selection.at_distance(distance, weights=request.params)
    request.report("filtering")
    # the filter's verdicts on the select stage's records, which come in plan order (the first-use
    # order the filter sorts entries into): entries are built only for what it keeps (a big model
    # selects tens of thousands of tensors, to keep a hundred)
    kept: list[tuple[int, Chosen]] = []
    dropped: list[Rejection] = []
    gaps, numbers = None, selection.numbers
    for number, (record, verdict) in enumerate(zip(chosen, verdicts(((c.forced, c.size) for c in chosen), request))):
        if verdict is None:
            kept.append((number, record))
        else:
            gaps = selection.reload_gaps(distance) if gaps is None else gaps
            gap = int(gaps[numbers[record.tensor]])
            dropped.append(rejection(record.tensor, record.kind, record.size, "filter", *verdict, gap))
    filtered_plan = filtered(selected_plan(analysis, request, kept, rejected), dropped, request)
    request.report("scheduling")
    return PlanOutcome(prefetch.run(filtered_plan, request))


def plan_with(analysis: Analysis, request: PlanRequest) -> PlanOutcome:
    """The scheduled plan of the planner the request asks for: the budget planner when it gives a
    budget or weight streaming (or ``strategy="budget"``), else the distance planner. A request
    with ``max_slowdown`` goes to `offloadctl.planning.make.make_plan`."""
    if request.uses_budget:
        outcome = budget_plan(analysis, request)
        request.report("scheduling")
        return outcome
    return distance_plan(analysis, request)
