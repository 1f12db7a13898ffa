"""The planner's plan in one call: `scheduled_plan` runs the passes that make it
(`offloadctl.planning.passes.PLANNER_PASSES`: select, filter by count or by budget or within a
slowdown, prefetch) and returns the scheduled plan, without the figures and the pins that
`offloadctl plan` records. The plan document ``offloadctl plan`` writes, made by the same pipeline and
the report after it, is `offloadctl.pipeline.planned_document` (``offloadctl.make_plan``).
"""

from __future__ import annotations

from collections.abc import Iterable

from offloadctl.analysis.graph import Analysis
from offloadctl.core.plantypes import Plan
from offloadctl.planning.passes import PLANNER_PASSES, Pass, Planning
from offloadctl.planning.request import NO_PROGRESS, PlanRequest, Progress, RequestError

__all__ = ["run_passes", "scheduled_plan"]


def run_passes(
    analysis: Analysis, request: PlanRequest, passes: Iterable[Pass], progress: Progress = NO_PROGRESS
) -> Planning:
    """The state the ``passes`` leave, run in order over ``analysis`` and ``request``, each saying its
    name to ``progress`` as it starts.

    Raises:
        OffloadError: a frontier asked for (a plan for every budget, not one plan), contradictory
            options, or a budget out of reach (the message gives the lower bound and the best peak).
    """
    if request.budget.strategy == "frontier":
        raise RequestError(
            "a frontier is a plan for every budget, not one plan",
            hint="use offloadctl frontier MODEL (offloadctl.planning.tradeoff.Tradeoff), or give a budget",
        )
    state = Planning(analysis, request, progress)
    for step in passes:
        state = step(state)
    return state


def scheduled_plan(analysis: Analysis, request: PlanRequest, progress: Progress = NO_PROGRESS) -> Plan:
    """The scheduled plan of select, filter (by count, or by budget) and prefetch, in one call.

    With the distance strategy (HyperOffload's, the default) the result equals chaining `select`,
    `filter_plan` and `prefetch`. With ``request.budget.budget`` (or ``stream_weights``, or
    ``strategy="budget"``) the budget planner chooses what to offload so the simulated peak fits; with
    ``max_slowdown`` the trade-off finds the largest cut in peak memory within that estimated slowdown.
    Each option is documented on its part (`offloadctl.planning.request`);
    ``PlanRequest.of_options(budget="1MiB", params=True)`` makes a request from flat keywords.

    Raises:
        OffloadError: contradictory options (`offloadctl.planning.request.RequestError`), or a
            budget below the lower bound or out of reach (the message gives the lower bound and the
            best peak reachable).
    """
    plan = run_passes(analysis, request, PLANNER_PASSES, progress).plan
    assert plan is not None  # FILTER made one
    return plan
