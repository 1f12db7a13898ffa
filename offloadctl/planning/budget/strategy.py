"""The budget planner's entry points: `BudgetSearch` (prepared once, `offloadctl.planning.budget.prepared`,
and run at any budget and copy mode), `budget_plan` (an analysis and a request to a scheduled plan),
`budget_filter` (the filter stage with a budget: a selected plan to a filtered one) and the memory
figures of a plan (`memory_profile`, `plan_peak`). The plan a search makes, with its ``budget``
record, is built in `offloadctl.planning.budget.build`.

The planner selects once (`offloadctl.planning.select.Selection`, at select distance 0, weights
looked at in the same pass in case activations alone cannot fit), searches, and schedules the plan
it found with the prefetch stage's rule (`offloadctl.planning.prefetch`); the peak it records is its
own working set's, the timeline's by construction. It simulates only to compare the time and bytes
objectives' plans with copies on streams, and hands that simulation back.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

import numpy as np

from offloadctl.analysis import timeline
from offloadctl.analysis.graph import Analysis
from offloadctl.contract.document import check_plan_model, require_stage
from offloadctl.core.errors import OffloadError
from offloadctl.core.plantypes import Compared, Plan
from offloadctl.core.units import byte_arg, fmt_bytes
from offloadctl.planning.budget.build import Attempt, Pricing, build_plan
from offloadctl.planning.budget.prepared import Prepared
from offloadctl.planning.budget.solve import solve
from offloadctl.planning.outcome import PlanOutcome
from offloadctl.planning.prefetch import prefetch, prefetch_own
from offloadctl.planning.request import (
    DEFAULT_PREFETCH_DISTANCE,
    DEFAULT_RELEASE_DISTANCE,
    DEFAULT_SELECT_NUM,
    NO_PROGRESS,
    FilterRequest,
    PlanRequest,
    Progress,
    SelectPart,
)
from offloadctl.planning.select import Selection
from offloadctl.simulation.costs import (
    BytesMoved,
    CopyCost,
    InlineTime,
    StreamStall,
    linear_objective,
    make_cost,
    optimal_refusal,
)
from offloadctl.simulation.result import simulate

__all__ = [
    "BudgetSearch",
    "BudgetUnreachable",
    "Found",
    "budget_figures",
    "budget_filter",
    "budget_plan",
    "memory_profile",
    "plan_peak",
]

logger = logging.getLogger(__name__)


def _where(analysis: Analysis, pos: int | None) -> str:
    if pos is None or pos >= analysis.num_positions:
        return "the graph outputs, all on the device at the end of the run"
    return f"the working set of node {analysis.node_names[pos]!r} at position {pos}: its inputs, outputs and weights"


def memory_profile(
    analysis: Analysis,
    plan: Plan | None = None,
    *,
    prefetch_distance: int = DEFAULT_PREFETCH_DISTANCE,
    release_distance: int = DEFAULT_RELEASE_DISTANCE,
) -> np.ndarray:
    """Device bytes live at each step 0..n (step n = the end of the run) under ``plan``.

    A plan before the prefetch stage (``h2d_before``, ``release_after`` null) is placed with each
    offload's own ``prefetch_distance`` or else ``prefetch_distance``, and ``release_distance``,
    as the prefetch stage would. See `offloadctl.analysis.timeline.profile`.
    """
    return timeline.profile(analysis, plan, prefetch_distance=prefetch_distance, release_distance=release_distance)


def plan_peak(
    analysis: Analysis,
    plan: Plan | None = None,
    *,
    prefetch_distance: int = DEFAULT_PREFETCH_DISTANCE,
    release_distance: int = DEFAULT_RELEASE_DISTANCE,
) -> tuple[int, int]:
    """(peak bytes, step of the first peak) of :func:`memory_profile`."""
    return timeline.peak_of(
        memory_profile(analysis, plan, prefetch_distance=prefetch_distance, release_distance=release_distance)
    )


class BudgetUnreachable(OffloadError):
    """No plan of the budget strategy fits the budget; ``reachable`` is the best peak it can reach."""

    def __init__(self, message: str, *, hint: str | None = None, reachable: int) -> None:
        super().__init__(message, hint=hint)
        self.reachable = reachable


@dataclass
class Found:
    """What a search found: its filtered plan and, where the search scheduled and simulated it itself
    (comparing both objectives' plans), the scheduled plan with its simulation; which objective's plan
    was kept and both plans' stalls (time's, bytes')."""

    filtered: Plan
    scheduled: PlanOutcome | None = None
    kept: str = "time"
    stalls: tuple[float, float] = (0.0, 0.0)


class BudgetSearch:
    """The budget planner prepared once, to run at any number of budgets and copy modes.

    What does not depend on the budget is done once and kept: the checks of the model, the
    selection (weights looked at too), the lower bound, the candidates with and without weights and
    the device timing of copies on streams. `plan` gives a scheduled plan at one budget, `filter`
    the filtered plan the filter stage writes. The trade-off (`offloadctl.planning.tradeoff`) runs
    many.

    Its arguments are `offloadctl.planning.budget.prepared.Prepared`'s (``listed`` False for
    `budget_figures`), and ``progress``, where a long search says what it is doing.
    """

    def __init__(
        self,
        analysis: Analysis,
        options: FilterRequest,
        select: SelectPart,
        *,
        base: Plan | None = None,
        listed: bool = True,
        selection: Selection | None = None,
        progress: Progress = NO_PROGRESS,
    ) -> None:
        if listed and options.filter.select_num != DEFAULT_SELECT_NUM:
            logger.warning(
                "--select-num %d is not used by the budget strategy (it fits the budget instead)",
                options.filter.select_num,
            )
        self.progress = progress
        self.prepared = Prepared(analysis, options, select, base=base, listed=listed, selection=selection)
        self.analysis = self.prepared.analysis  # counting the profile's kernel scratch
        self.options = options
        self.budget = options.budget  # the budget planner's own part

    def _attempt(
        self, with_params: bool, budget: int | None, cost: CopyCost, copies: str, floored: bool = True
    ) -> Attempt:
        found = self.prepared.candidates(with_params, floored)
        timing = self.prepared.timing(self.budget.device_profile) if copies == "streams" else None
        outcome = solve(
            self.analysis,
            found.cands,
            self.options,
            self.progress,
            budget=budget,
            stream=found.stream,
            cost=cost,
            timing=timing,
        )
        return Attempt(found, outcome)

    def _cost(self, copies: str) -> CopyCost:
        objective, prof = self.budget.search_objective, self.budget.device_profile
        if isinstance(objective, CopyCost):
            return objective
        if objective == "time" and copies == "streams":
            return StreamStall(self.prepared.timing(prof))
        assert isinstance(objective, str)
        return make_cost(objective, prof)

    def _check_budget(self, budget: int | None) -> None:
        lb, pos = self.prepared.lower_bound, self.prepared.lower_bound_position
        if budget is not None and budget < lb:
            raise BudgetUnreachable(
                f"budget {fmt_bytes(budget)} is below the lower bound {fmt_bytes(lb)} ({lb} bytes) of "
                f"{self.analysis.loaded.path} ({_where(self.analysis, pos)}); the peak is "
                f"{fmt_bytes(self.prepared.peak_before)} without offload",
                hint=f"give --budget {byte_arg(lb)} or more",
                reachable=lb,
            )

    def _fitting(self, budget: int | None, cost: CopyCost, copies: str, quiet: bool) -> tuple[Attempt, bool]:
        """The attempt that fits, and whether weights had to join the candidates."""
        first = self._attempt(self.prepared.params, budget, cost, copies)
        if first.outcome.fits:
            return first, False
        retry = None
        if not self.prepared.params:
            retry = self._attempt(True, budget, cost, copies)
            if retry.outcome.fits:
                if not quiet:
                    logger.warning(
                        "activations alone cannot fit the budget: weights were considered too (as with --params)"
                    )
                return retry, True
        with_params = self.prepared.params or retry is not None
        if not self.prepared.floor.given:  # the copies worth less than their cost, when nothing else fits
            small = self._attempt(with_params, budget, cost, copies, floored=False)
            if small.outcome.fits:
                if not quiet and with_params and not self.prepared.params:
                    logger.warning("activations alone cannot fit the budget: weights were considered too")
                if not quiet:
                    logger.warning(
                        "the budget needs copies smaller than a copy is worth here (%s, the lesser of what the link "
                        "moves in one copy's fixed time and 0.1%% of the peak): they were considered too",
                        fmt_bytes(self.prepared.floor.bytes),
                    )
                return small, with_params and not self.prepared.params
            retry = small
        raise self._unreachable(budget, [a for a in (first, retry) if a is not None])

    def _unreachable(self, budget: int | None, attempts: list[Attempt]) -> BudgetUnreachable:
        """The error of a budget no attempt fits: the best peak reachable, and what would allow more."""
        best = min(a.outcome.reachable for a in attempts if a.outcome.reachable is not None)
        fused = self.prepared.selection.options.fused
        kept = (
            f"; {len(fused)} tensors stay on the device for onnxruntime's fusions at the measured profile's "
            "optimization level (reason fused): a profile at a lower --opt-level keeps none"
            if fused
            else ""
        )
        bound, before = self.prepared.lower_bound, self.prepared.peak_before
        return BudgetUnreachable(
            f"the budget strategy cannot fit {self.analysis.loaded.path} into {fmt_bytes(budget)}: the best peak "
            f"reachable is {fmt_bytes(best)} ({best} bytes; lower bound {fmt_bytes(bound)}, peak without "
            f"offload {fmt_bytes(before)})",
            hint=f"raise --budget to at least {byte_arg(best)}, "
            f"or allow more candidates (--params, fewer --never patterns){kept}",
            reachable=best,
        )

    def _search(self, budget: int | None, copies: str, quiet: bool) -> Found:
        if self.budget.optimal and not linear_objective(self.budget.search_objective, copies):
            message, fix = optimal_refusal()  # (a request refuses it when it is made)
            raise OffloadError(message, hint=fix)
        self._check_budget(budget)
        cost = self._cost(copies)
        chosen, weights_added = self._fitting(budget, cost, copies, quiet)
        build = Pricing(budget, cost, copies, weights_added)
        if cost.objective != "time" or budget is None or isinstance(self.budget.search_objective, CopyCost):
            return Found(build_plan(self.prepared, chosen, build))
        # The time objective is priced copy by copy; the plan the bytes objective finds is checked too,
        # and the faster of the two (estimated as the chosen copy mode runs) is kept, so asking for time
        # never gives a longer estimate than asking for bytes.
        floored = chosen.candidates.floored
        other = self._attempt(self.prepared.params or weights_added, budget, BytesMoved(), copies, floored)
        if not other.outcome.fits:  # pragma: no cover - the same candidates fit under any price
            return Found(build_plan(self.prepared, chosen, build))
        if copies == "inline" and self.budget.device_profile.measured is None:
            # the copies' time in line: a sum the planners' states give (a datasheet profile prices no pins)
            inline = InlineTime(self.budget.device_profile)
            mine_s, theirs_s = chosen.outcome.planner.moved(inline), other.outcome.planner.moved(inline)
            kept = "bytes" if theirs_s < mine_s - 1e-12 * max(mine_s, 1e-30) else "time"
            found = Found(
                build_plan(self.prepared, chosen, build)
                if kept == "time"
                else build_plan(self.prepared, other, build, searched=chosen.outcome)
            )
        else:
            found = self._compare_simulated(chosen, other, build, "overlapped" if copies == "streams" else "serialized")
            kept, (mine_s, theirs_s) = found.kept, found.stalls
        compared: Compared = {"copies": copies, "stall_s": {"time": mine_s, "bytes": theirs_s}, "kept": kept}
        found.filtered["budget"]["compared"] = compared
        if found.scheduled is not None:
            found.scheduled.plan["budget"]["compared"] = compared
        return found

    def _compare_simulated(self, chosen: Attempt, other: Attempt, build: Pricing, key: str) -> Found:
        """Both plans simulated, the stall (``key``: ``overlapped`` or ``serialized``) the simulator's, the
        one kept handing its simulation back: with copies on streams a copy's price depends on the compute
        around it, and under a measured profile the time in line includes the order pins' nodes."""
        mine = Found(build_plan(self.prepared, chosen, build))
        theirs = Found(build_plan(self.prepared, other, build, searched=chosen.outcome))
        for found in (mine, theirs):
            scheduled = prefetch(found.filtered, self.options.prefetch)
            found.scheduled = PlanOutcome(
                scheduled, simulate(self.analysis, scheduled, profile=self.budget.device_profile)
            )
        stalls = (_stall(mine.scheduled, key), _stall(theirs.scheduled, key))
        kept = "bytes" if stalls[1] < stalls[0] - 1e-12 * max(stalls[0], 1e-30) else "time"
        found = theirs if kept == "bytes" else mine
        found.kept, found.stalls = kept, stalls
        return found

    def filter(self, budget: int | None = None, *, copies: str | None = None, quiet: bool = False) -> Plan:
        """The "filtered" plan whose peak fits ``budget`` (default: the options') at the least cost.

        ``copies`` overrides the options' copy mode; ``quiet``: do not warn when weights join the
        candidates (a sweep over many budgets reads ``weights_added_by_budget`` instead).

        Raises:
            BudgetUnreachable: the budget is below the lower bound or cannot be reached.
        """
        budget = self.budget.budget if budget is None else budget
        return self._search(budget, copies or self.budget.copies, quiet).filtered

    def found(self, budget: int | None = None) -> Found:
        """What the search at ``budget`` (default: the options') finds: the filtered plan, and where the
        search placed the prefetches itself (copies on streams, the time objective), the scheduled plan
        and its simulation.

        Raises:
            BudgetUnreachable: the budget is below the lower bound or cannot be reached.
        """
        return self._search(self.budget.budget if budget is None else budget, self.budget.copies, False)

    def plan(self, budget: int | None = None, *, copies: str | None = None, quiet: bool = False) -> PlanOutcome:
        """The scheduled plan whose peak fits ``budget`` at the least cost (see `filter`), and its
        simulation on the options' profile when the search made one."""
        budget = self.budget.budget if budget is None else budget
        found = self._search(budget, copies or self.budget.copies, quiet)
        # the filtered plan was built for this call alone: it is scheduled as it is, not copied
        return found.scheduled or PlanOutcome(prefetch_own(found.filtered, self.options.prefetch))


def _stall(scheduled: PlanOutcome | None, key: str) -> float:
    """The time a scheduled plan's copies (and pins) add to the baseline, as the simulator runs them
    (``key``: ``overlapped``, copies on streams, or ``serialized``, in line)."""
    result = scheduled.simulation if scheduled is not None else None
    assert result is not None and result.times is not None  # a simulation with a profile has its times
    return float(getattr(result.times, key)) - result.times.baseline


def budget_figures(analysis: Analysis, request: PlanRequest) -> PlanOutcome:
    """`budget_plan`'s plan for its figures alone: the same offloads (so the same peak and time),
    but no ``rejected`` list, which on a big model is most of the work and of the document. Not a
    plan to write or to apply."""
    return BudgetSearch(analysis, request, request.selecting, listed=False).plan(quiet=True)


def budget_plan(analysis: Analysis, request: PlanRequest, progress: Progress = NO_PROGRESS) -> PlanOutcome:
    """The budget planner: an analysis and a `offloadctl.planning.request.PlanRequest` to a scheduled
    plan that fits ``request.budget.budget`` at the least cost (``stream_weights``: weights streamed in by
    layer group). See the package docstring for the rules.

    Raises:
        OffloadError: ``optimal`` with a cost that is not linear, or the budget cannot be reached
            (`BudgetUnreachable`: the message gives the lower bound and the best peak reachable).
    """
    progress.report("selecting")
    search = BudgetSearch(analysis, request, request.selecting, progress=progress)
    progress.report("fitting the budget")
    return search.plan()


def budget_filter(plan: Plan, analysis: Analysis, options: FilterRequest, progress: Progress = NO_PROGRESS) -> Plan:
    """The filter stage with a budget: a "selected" plan to a "filtered" plan whose peak fits
    ``options.budget.budget`` at the least cost.

    The plan's select options (activations, params, force, never, and the host nodes of a plan
    made for a device) are kept, its select distance is not used: the planner weighs every idle
    stretch. Each offload gets its own prefetch distance, at most ``options.prefetch.prefetch_distance``, so
    that the peak stays within the budget once the prefetch stage has run.

    Raises:
        OffloadError: the plan is for another model, not at stage "selected" or records no select
            options, ``optimal`` with a cost that is not linear, or the budget cannot be reached
            (`BudgetUnreachable`).
    """
    require_stage(plan, "selected", "the budget strategy")
    check_plan_model(plan, analysis.loaded.sha256, analysis.loaded.path)
    recorded_select = plan["options"].get("select")
    if recorded_select is None:
        raise OffloadError(
            f"the selected plan for {analysis.loaded.path} records no select options (options.select): the budget "
            "strategy selects again with them",
            hint="make the plan with offloadctl select, which records them (or add them to options.select)",
        )
    # every option the select stage recorded (those of plan --device too), at distance 0
    select = dataclasses.replace(SelectPart.of_record(recorded_select), select_distance=0)
    progress.report("fitting the budget")
    return BudgetSearch(analysis, options, select, base=plan, progress=progress).filter()
