"""The plan and its report: HyperOffload's ``Run()`` pass by pass, then the figures of what runs.

MindSpore's ``HyperOffloadOptimizer::Run()`` calls, over one operations queue,
``GenerateParameterOperations``, ``GenerateActivationOperations``, ``AdjustHyperOffloadNodePosition``,
``AddEventNodes``, ``BuildExecutionOrder`` and ``AssignHyperOffloadIds``. offloadctl makes its plan
by the same steps and nothing else, each a `Pass` over one `Planning` state, in this order
(`offloadctl.planning.passes.PIPELINE`):

=========  ====================================================  =========================================
pass       the seed's step                                       writes
=========  ====================================================  =========================================
select     GenerateParameterOperations, ...ActivationOperations  ``selection``: every tensor's verdict
filter     OffloadInfoFilterByNumber (or a budget, a slowdown)   ``plan`` (new, "filtered"), ``simulation``
prefetch   AdjustHyperOffloadNodePosition                        ``plan`` in place ("scheduled")
events     AddEventNodes                                         ``plan`` in place: ``summary.events``
pins       BuildExecutionOrder                                   ``plan`` in place: ``summary.pins``
=========  ====================================================  =========================================

(``AssignHyperOffloadIds`` has no pass: an offload's id is its number among the selected tensors,
given by select.) After the pipeline this module reports on its plan (`REPORT`): the figures of what
runs (`with_figures`: the simulation the verdict quotes, recorded in the plan as ``summary.estimate`` for
``apply`` to quote) and a weak plan's next step (`with_next_step`). The report needs the rewrite, a
layer above the planner's, so it is no pass.

`planned` runs the pipeline and the report and gives the whole state, for the command's verdict;
`planned_document` gives the plan document alone: what ``offloadctl plan`` writes and
``offloadctl.make_plan`` (its flat keywords read by `make_plan`) returns, one path for both.

The figures are those of what runs: under the DEFAULT order (every host but Python) the rewrite as
the walk over it runs (pins and copies included, `offloadctl.rewriting.preview`); for a plan made
for a device (``plan --device``), the model and its rewrite as that device places them. A weak plan
(one that lowers the peak by under 5%, not itself a budget plan) gets as its next step the budget
plan halfway between the lower bound and the peak, made and simulated here on graphs of up to
`NEXT_STEP_FIGURES_MAX_POSITIONS` positions; above that the command is given without its figures
(making them takes about as long as the plan itself).
"""

from __future__ import annotations

from collections.abc import Callable
from shlex import quote
from typing import Any

from offloadctl.analysis.graph import Analysis
from offloadctl.core.bulk import paused_gc
from offloadctl.core.errors import OffloadError
from offloadctl.core.plantypes import Plan
from offloadctl.loading.input_shapes import given_dims
from offloadctl.planning.advice import NextStep
from offloadctl.planning.budget.strategy import BudgetUnreachable, budget_figures
from offloadctl.planning.make import run_passes
from offloadctl.planning.passes import PIPELINE, Planning
from offloadctl.planning.request import NO_PROGRESS, BudgetPart, PlanRequest, Progress, SelectPart
from offloadctl.rewriting.figures import as_the_device_runs, run_order_figures
from offloadctl.rewriting.modes import planned_copy_mode
from offloadctl.simulation.base import is_rewritten
from offloadctl.simulation.estimate import (
    Estimate,
    estimate_figures,
    record_estimate,
    recorded_estimate,
    streams_declined,
)
from offloadctl.simulation.result import SimResult, simulate

__all__ = [
    "HELPFUL_CUT",
    "NEXT_STEP_FIGURES_MAX_POSITIONS",
    "REPORT",
    "STEPS",
    "make_plan",
    "next_step",
    "planned",
    "planned_document",
    "suggested_budget",
    "verdict_figures",
    "with_figures",
    "with_next_step",
]

#: a plan that lowers the peak by less than this fraction gets a computed next step
HELPFUL_CUT = 0.05

#: Above this many positions a weak plan's next step is given without its figures: its budget plan
#: would take about as long again as the plan itself.
NEXT_STEP_FIGURES_MAX_POSITIONS = 20_000


#: the report's steps after the pipeline, as the progress display says them
REPORT = ("simulating peak memory and time", "the next step")
#: the steps `planned` says to its progress: the pipeline's passes and the report's
STEPS = len(PIPELINE) + len(REPORT)


# --------------------------------------------------------------------------------------------------
# the figures


def with_figures(state: Planning) -> Planning:
    """``state`` with the figures of what runs: its plan's simulation (the planner's own when it made one),
    the peaks and time of the rewrite as it runs (`offloadctl.rewriting.figures.run_order_figures`)
    recorded in the plan (``summary.estimate``, which ``apply`` quotes); for copies on streams that gain no
    time or hold more than in line, the in-line figures and why (``streams_declined``). A model that
    already holds copies gets none (simulate the rewritten model instead)."""
    plan, analysis, request, progress = state.plan, state.analysis, state.request, state.progress
    assert plan is not None
    progress.report(REPORT[0])
    if is_rewritten(analysis):  # a model that holds copies: simulate the rewritten model instead
        return state
    with paused_gc():
        result = state.simulation or simulate(analysis, plan, profile=request.budget.device_profile)
    copies = planned_copy_mode(plan)
    figures = run_order_figures(plan, analysis, result, request, copies, progress)
    if copies == "streams" and plan["offloads"]:
        in_line = run_order_figures(plan, analysis, result, request, "inline", progress)
        declined = streams_declined(figures, in_line.peak.after)
        if declined is not None:  # no time gained, or more held: the plan's copies run in line, as it quotes
            plan["summary"]["events"] = {**plan["summary"]["events"], "copies": "inline", "streams_declined": declined}
            assert in_line.time_s is not None and in_line.slowdown is not None  # (streams are priced on a profile)
            assert figures.time_s is not None and figures.slowdown is not None
            figures = in_line.replace(
                time_s={**in_line.time_s, "overlapped": figures.time_s["overlapped"]},
                slowdown={**in_line.slowdown, "overlapped": figures.slowdown["overlapped"]},
                streams_declined=declined,
            )
    record_estimate(plan, figures)  # apply quotes it
    return state.replace(simulation=result)


def verdict_figures(state: Planning) -> Estimate:
    """The figures a plan's verdict quotes: those `with_figures` recorded in it (the peaks of what
    runs), else its simulation's."""
    assert state.plan is not None and state.simulation is not None
    return recorded_estimate(state.plan) or estimate_figures(state.simulation, state.request.copies)


# --------------------------------------------------------------------------------------------------
# the next step


def suggested_budget(lower_bound: int, peak: int) -> int:
    """The budget a weak plan's next step plans at: halfway between the lower bound and the peak, in
    whole KiB (so the command it prints says what was planned)."""
    budget = max(lower_bound, (lower_bound + peak) // 2)
    return -(-budget // 1024) * 1024


def with_next_step(state: Planning) -> Planning:
    """``state`` with its plan's next step (`next_step`), when it is a weak plan that has figures."""
    state.progress.report(REPORT[1])
    if state.simulation is None or state.plan is None:
        return state
    step = next_step(state.analysis, state.plan, state.simulation, state.request, state.progress)
    return state.replace(next_step=step)


@paused_gc()
def _budget_step(analysis: Analysis, budget: int, request: PlanRequest) -> tuple[int | None, float | None]:
    """The peak (as the plan would say it) and estimated slowdown of the budget plan at ``budget`` that a
    weak plan's next step gives, made and simulated (nothing is written, so no rejections are listed);
    (None, None) when no budget plan can be made."""
    try:
        outcome = budget_figures(
            analysis,
            PlanRequest(
                select=SelectPart(params=True, host=request.select.host),
                budget=BudgetPart(budget=budget, profile=request.budget.device_profile),
            ),
        )
    except OffloadError:
        return None, None
    better = outcome.plan  # its figures only: no estimate or pins are recorded in it
    sim = outcome.simulation or simulate(analysis, better, profile=request.budget.device_profile, planned_here=True)
    peak = run_order_figures(better, analysis, sim, request).peak.after  # as the plan would say
    return peak, sim.times.slowdown["serialized"] if sim.times is not None else None


def next_step(
    analysis: Analysis, plan: Plan, result: SimResult, request: PlanRequest, progress: Progress = NO_PROGRESS
) -> NextStep | None:
    """For a plan that lowers the peak by under 5% (not itself a budget plan): the budget plan halfway
    between the lower bound and the peak as a copy-pasteable command (the model's own pins and dims
    in it), with the figures it gives, made and simulated here; None otherwise or when it does no
    better. Above `NEXT_STEP_FIGURES_MAX_POSITIONS` positions the command comes without figures
    (``peak_after`` and ``slowdown`` None): run it to see them."""
    recorded = recorded_estimate(plan)
    before, after = result.peak_before, recorded.peak.after if recorded else result.peak_after  # as the verdict says it
    budget = suggested_budget(result.lower_bound_bytes, before)
    if before <= 0 or before - after >= HELPFUL_CUT * before or request.budget.uses_budget or budget >= before:
        return None
    peak: int | None = None
    slowdown: float | None = None
    if analysis.num_positions <= NEXT_STEP_FIGURES_MAX_POSITIONS:
        progress.report("finding a plan that helps")
        peak, slowdown = _budget_step(analysis, budget, request)
        if peak is None or peak >= min(after, (1 - HELPFUL_CUT) * before):  # it must help, by 5%
            return None
    return NextStep(_budget_command(analysis, request, budget), budget, before, peak, slowdown)


def _budget_command(analysis: Analysis, request: PlanRequest, budget: int) -> str:
    loaded = analysis.loaded
    flags = [f"--input-shape {quote(f'{n}=' + ','.join(map(str, s)))}" for n, s in loaded.input_shapes.items()]
    flags += [f"--dim {quote(f'{n}={v}')}" for n, v in given_dims(loaded.dims).items()]  # sums follow
    if analysis.order != "priority":
        flags.append(f"--execution-order {analysis.order}")
    if request.select.device:
        flags.append(f"--device {request.select.device}")
    if loaded.sizes_from_run is not None:  # the sizes it counts came from a run
        inputs = loaded.sizes_from_run.get("inputs")
        flags.append(f"--inputs {quote(str(inputs))}" if inputs else "--sizes-from-run")
    parts = ["offloadctl plan", quote(str(loaded.path)), "--params", f"--budget {budget // 1024}KiB", *flags]
    return " ".join(parts) + " -o PLAN.json"


# --------------------------------------------------------------------------------------------------
# the plan and its report


def planned(
    analysis: Analysis, request: PlanRequest, progress: Progress = NO_PROGRESS, *, next_step: bool = True
) -> Planning:
    """The state `PIPELINE` leaves for ``request`` on ``analysis``, with its report: the plan document with
    its figures (`with_figures`; no simulation for a model that already holds copies) and, with
    ``next_step``, a weak plan's next step (`with_next_step`).

    Raises:
        OffloadError: contradictory options, or a budget out of reach (for a plan made for a device,
            the message also gives the model's peak as that device runs it).
    """
    try:
        state = with_figures(run_passes(analysis, request, PIPELINE, progress))
    except BudgetUnreachable as exc:
        if not request.select.device:
            raise
        raise as_the_device_runs(exc, analysis, request) from None
    state = _in_line_when_declined(state)
    return with_next_step(state) if next_step else state


def _in_line_when_declined(state: Planning) -> Planning:
    """``state``, or, when its plan was made for copies on streams that gain no time as the executor runs
    them (`streams_declined`), the same request planned in line: a budget or slowdown search priced for
    copies in line, loads placed by distance, with the streams figures that declined it recorded beside
    (``summary.events.streams_declined``). A budget the plan in line cannot reach keeps the first plan,
    whose copies run in line too."""
    summary: dict[str, Any] = state.plan.get("summary", {}) if state.plan is not None else {}
    declined = summary.get("events", {}).get("streams_declined")
    if not declined:
        return state
    state.progress.report("planning the copies in line: on streams they gain no time")
    try:
        again = with_figures(run_passes(state.analysis, state.request.with_copies("inline"), PIPELINE, state.progress))
    except BudgetUnreachable:
        return state
    plan = again.plan
    assert plan is not None
    plan["summary"]["events"]["streams_declined"] = declined
    if "estimate" in plan["summary"]:
        plan["summary"]["estimate"]["streams_declined"] = declined
    return again


def planned_document(analysis: Analysis, request: PlanRequest, progress: Progress = NO_PROGRESS) -> Plan:
    """The plan document ``offloadctl plan`` writes for the same request: `PIPELINE`'s plan, with the
    figures ``apply`` quotes (``summary.estimate``), the events (``summary.events``) and the order
    pins' layout (``summary.pins``). (`offloadctl.planning.make.scheduled_plan` gives the planner's plan
    alone.)"""
    plan = planned(analysis, request, progress, next_step=False).plan
    assert plan is not None
    return plan


def make_plan(analysis: Analysis, *, progress: Callable[..., None] | None = None, **options: Any) -> Plan:
    """`planned_document` for the Python API's flat keywords (``budget="1.5GiB", params=True``), each a
    field of one part of the request (`offloadctl.planning.request.PlanRequest.of_options`); ``progress``
    is called with the name of each stage as it starts (``progress("scheduling")``), and with
    ``new=False`` for news from a long search."""
    return planned_document(analysis, PlanRequest.of_options(**options), Progress(progress))
