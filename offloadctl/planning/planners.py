"""The distance planner (HyperOffload's, the default): the select stage's verdicts at
``select_distance``, the first ``select_num`` kept (`filtered_by_number`), prefetch. The same plan
as running the three stages one by one; the filter looks at the select stage's records, so that
entries are built only for the offloads it keeps. `offloadctl.planning.passes.FILTER` filters with
it; the trade-off (`offloadctl.planning.tradeoff`) compares its plans with `distance_plan`.
"""

from __future__ import annotations

from offloadctl.analysis.graph import Analysis
from offloadctl.core.bulk import paused_gc
from offloadctl.core.plantypes import Plan, Rejection, rejection
from offloadctl.planning.filter import filtered, verdicts
from offloadctl.planning.outcome import PlanOutcome
from offloadctl.planning.prefetch import prefetch_own
from offloadctl.planning.request import PlanRequest
from offloadctl.planning.select import Chosen, Selection, selected_plan, selection_for

__all__ = ["distance_plan", "filtered_by_number"]


@paused_gc()
def filtered_by_number(analysis: Analysis, request: PlanRequest, selection: Selection) -> Plan:
    """HyperOffload's filter on ``selection``'s records at ``request.select.select_distance``, which come in
    the first-use order the filter sorts entries into: the "filtered" plan, entries built only for
    the offloads it keeps (a big model selects tens of thousands of tensors, to keep a hundred)."""
    select = request.selecting
    distance = select.select_distance
    chosen, rejected = selection.at_distance(distance, weights=select.params)
    kept: list[tuple[int, Chosen]] = []
    dropped: list[Rejection] = []
    gaps, numbers = None, selection.numbers
    for number, (record, verdict) in enumerate(
        zip(chosen, verdicts(((c.forced, c.size) for c in chosen), request.filter))
    ):
        if verdict is None:
            kept.append((number, record))
        else:
            gaps = selection.reload_gaps(distance) if gaps is None else gaps
            gap = int(gaps[numbers[record.tensor]])
            dropped.append(rejection(record.tensor, record.kind, record.size, "filter", *verdict, gap))
    return filtered(selected_plan(analysis, select, kept, rejected), dropped, request.filter)


def distance_plan(analysis: Analysis, request: PlanRequest) -> PlanOutcome:
    """HyperOffload's planner: select at ``select_distance``, keep the first ``select_num``, prefetch."""
    plan = filtered_by_number(analysis, request, selection_for(analysis, request.selecting))
    return PlanOutcome(prefetch_own(plan, request.prefetch))
