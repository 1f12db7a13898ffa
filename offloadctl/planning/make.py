"""The planner's plan in one call: `scheduled_plan` runs the passes that make it
(`offloadctl.planning.passes.PLANNER_PASSES`: select, filter by count or by budget or within a
slowdown, prefetch) and returns the scheduled plan, without the figures and the pins that
`offloadctl plan` records. The plan document ``offloadctl plan`` writes, made by the same passes and
those after them, is `offloadctl.pipeline.make_plan` (``offloadctl.make_plan``).
"""

from __future__ import annotations

from collections.abc import Iterable

from offloadctl.analysis.graph import Analysis
from offloadctl.core.plantypes import Plan
from offloadctl.planning.passes import PLANNER_PASSES, Pass, Planning
from offloadctl.planning.request import PlanRequest, RequestError, taking

__all__ = ["run_passes", "scheduled_plan"]


def run_passes(analysis: Analysis, request: PlanRequest, passes: Iterable[Pass]) -> Planning:
    """The state the ``passes`` leave, run in order over ``analysis`` and ``request``.

    Raises:
        OffloadError: a frontier asked for (a plan for every budget, not one plan), contradictory
            options, or a budget out of reach (the message gives the lower bound and the best peak).
    """
    if request.strategy == "frontier":
        raise RequestError(
            "a frontier is a plan for every budget, not one plan",
            hint="use offloadctl frontier MODEL (offloadctl.planning.tradeoff.Tradeoff), or give a budget",
        )
    state = Planning(analysis, request)
    for step in passes:
        state = step(state)
    return state


@taking(PlanRequest)
def scheduled_plan(analysis: Analysis, request: PlanRequest) -> Plan:
    """The scheduled plan of select, filter (by count, or by budget) and prefetch, in one call.

    With the distance strategy (HyperOffload's, the default) the result equals chaining `select`,
    `filter_plan` and `prefetch`. With ``budget`` (or ``stream_weights``, or ``strategy="budget"``)
    the budget planner chooses what to offload so the simulated peak fits; with ``max_slowdown``
    the trade-off finds the largest cut in peak memory within that estimated slowdown.

    Takes a `PlanRequest`'s fields as keywords (each documented there): ``select_distance``,
    ``activations``, ``params``, ``force``, ``never`` (select); ``select_num``, ``min_bytes``
    (filter); ``prefetch_distance``, ``release_distance`` (prefetch); ``strategy``, ``budget``,
    ``stream_weights``, ``stream_depth``, ``objective``, ``profile``, ``copies``, ``optimal``,
    ``time_limit``, ``max_slowdown`` (budget); and ``step``, a progress callback. A ready request
    goes to ``scheduled_plan.run(analysis, request)``.

    Raises:
        OffloadError: contradictory options (`offloadctl.planning.request.RequestError`), or a
            budget below the lower bound or out of reach (the message gives the lower bound and the
            best peak reachable).
    """
    plan = run_passes(analysis, request, PLANNER_PASSES).plan
    assert plan is not None  # FILTER made one
    return plan
