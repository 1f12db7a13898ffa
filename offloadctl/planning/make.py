"""The whole plan in one call: the planner a request asks for, or the trade-off on top of them.

`plan_for` is what ``offloadctl plan`` runs: ``max_slowdown`` goes to the trade-off
(`offloadctl.planning.tradeoff.plan_within_slowdown`), any other request to its planner
(`offloadctl.planning.planners.plan_with`). `make_plan` is the same with the request's options as
keywords, and returns the planner's plan alone. The Python API's ``offloadctl.make_plan(analysis,
budget="800KiB")`` is `offloadctl.job.make_plan`: the document ``offloadctl plan`` writes, the
figures it records (``summary``) included.
"""

from __future__ import annotations

from offloadctl.analysis.graph import Analysis
from offloadctl.core.plantypes import Plan
from offloadctl.planning.outcome import PlanOutcome
from offloadctl.planning.planners import plan_with
from offloadctl.planning.request import PlanRequest, RequestError, taking
from offloadctl.planning.tradeoff import plan_within_slowdown

__all__ = ["make_plan", "plan_for"]


def plan_for(analysis: Analysis, request: PlanRequest) -> PlanOutcome:
    """The scheduled plan for ``request`` (select, filter by count or by budget, prefetch; or the largest
    cut within ``max_slowdown``), with the simulation the planner made of it, if any."""
    if request.strategy == "frontier":
        raise RequestError(
            "a frontier is a plan for every budget, not one plan",
            hint="use offloadctl frontier MODEL (offloadctl.planning.tradeoff.Tradeoff), or give a budget",
        )
    if request.max_slowdown is not None:
        request.report("fitting the slowdown")
        return plan_within_slowdown(analysis, request)
    return plan_with(analysis, request)


@taking(PlanRequest)
def make_plan(analysis: Analysis, request: PlanRequest) -> Plan:
    """The whole scheduled plan in one call: select, filter (by count, or by budget) and prefetch.

    With the distance strategy (HyperOffload's, the default) the result equals chaining `select`,
    `filter_plan` and `prefetch`. With ``budget`` (or ``stream_weights``, or ``strategy="budget"``)
    the budget planner chooses what to offload so the simulated peak fits; with ``max_slowdown``
    the trade-off finds the largest cut in peak memory within that estimated slowdown.

    Takes a `PlanRequest`'s fields as keywords (each documented there): ``select_distance``,
    ``activations``, ``params``, ``force``, ``never`` (select); ``select_num``, ``min_bytes``
    (filter); ``prefetch_distance``, ``release_distance`` (prefetch); ``strategy``, ``budget``,
    ``stream_weights``, ``stream_depth``, ``objective``, ``profile``, ``copies``, ``optimal``,
    ``time_limit``, ``max_slowdown`` (budget); and ``step``, a progress callback. A ready request
    goes to ``make_plan.run(analysis, request)``.

    Raises:
        OffloadError: contradictory options (`offloadctl.planning.request.RequestError`), or a
            budget below the lower bound or out of reach (the message gives the lower bound and the
            best peak reachable).
    """
    return plan_for(analysis, request).plan
