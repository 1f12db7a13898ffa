"""The budget planner's entry points: `BudgetSearch` (prepared once, run at any budget and copy mode),
`budget_plan` (an analysis and a request to a scheduled plan), `budget_filter` (the filter stage
with a budget: a selected plan to a filtered one), the plan's ``budget`` record (`BudgetResult`) and
the memory figures of a plan (`memory_profile`, `plan_peak`, `bytes_moved`).

The planner selects once (`offloadctl.planning.select.Selection`, at select distance 0, weights
looked at in the same pass in case activations alone cannot fit), searches, and schedules the plan
it found with the prefetch stage's rule (`offloadctl.planning.prefetch`); the peak it records is its
own working set's, the timeline's by construction. It simulates only to compare the time and bytes
objectives' plans with copies on streams, and hands that simulation back.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from offloadctl.analysis import timeline
from offloadctl.analysis.graph import Analysis
from offloadctl.contract.document import check_plan_model, record_stage, require_stage
from offloadctl.core.errors import OffloadError
from offloadctl.core.plantypes import BudgetRecord, Compared, Offload, Plan, Rejection
from offloadctl.core.units import byte_arg, fmt_bytes
from offloadctl.planning.budget.candidates import Cand, candidates, plan_entry, reject
from offloadctl.planning.budget.solve import Outcome, solve
from offloadctl.planning.budget.streaming import stream_states
from offloadctl.planning.filter import first_use_key
from offloadctl.planning.outcome import PlanOutcome
from offloadctl.planning.prefetch import prefetch, prefetch_own
from offloadctl.planning.request import (
    DEFAULT_PREFETCH_DISTANCE,
    DEFAULT_RELEASE_DISTANCE,
    FilterRequest,
    PrefetchPart,
    SelectPart,
    taking2,
)
from offloadctl.planning.select import selection_for
from offloadctl.simulation.costs import (
    BytesMoved,
    CopyCost,
    CopyTiming,
    InlineTime,
    StreamStall,
    copy_timing,
    make_cost,
    plan_cost,
)
from offloadctl.simulation.memory import lower_bound, resident_profile
from offloadctl.simulation.profiles import Profile
from offloadctl.simulation.result import SimResult, simulate
from offloadctl.simulation.timing import count_scratch

__all__ = [
    "BudgetResult",
    "BudgetSearch",
    "BudgetUnreachable",
    "Found",
    "budget_figures",
    "budget_filter",
    "budget_plan",
    "bytes_moved",
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


def bytes_moved(plan: Plan) -> int:
    """Bytes a plan copies per run: one D2H per activation, one H2D per reload group and output."""
    return int(plan_cost(plan, BytesMoved()))


@dataclass
class BudgetResult:
    """What the planner found, besides the plan (its ``budget`` record, `to_json`)."""

    requested: int | None
    lower_bound: int
    lower_bound_position: int | None
    peak_before: int
    peak: int
    peak_position: int
    moved: int
    weights_added: bool = False
    stream: dict[str, Any] | None = None
    chosen: dict[str, str] = field(default_factory=dict)
    objective: dict[str, Any] = field(default_factory=lambda: BytesMoved().to_json())
    cost: float = 0.0
    cost_bound: float | None = None
    bound_source: str | None = None  # "steps" (the cheapest cover of the worst steps) or "solver"
    optimal: bool = False
    search: str = "greedy"
    solver: dict[str, Any] | None = None
    copies: str = "inline"

    @property
    def gap(self) -> float | None:
        """(cost - proven bound) / cost; 0 for a plan that costs nothing."""
        if self.cost_bound is None:
            return None
        if self.cost <= 0:
            return 0.0
        return max(0.0, (self.cost - self.cost_bound) / self.cost)

    def to_json(self, prefetch_distance: int, release_distance: int) -> BudgetRecord:
        doc: BudgetRecord = {
            "requested_bytes": self.requested,
            "lower_bound_bytes": self.lower_bound,
            "lower_bound_position": self.lower_bound_position,
            "peak_before_bytes": self.peak_before,
            "predicted_peak_bytes": self.peak,
            "predicted_peak_position": self.peak_position,
            "bytes_moved": self.moved,
            "assumed_prefetch_distance": prefetch_distance,
            "assumed_release_distance": release_distance,
            "weights_added_by_budget": self.weights_added,
            "search": self.search,
            "objective": self.objective,
            "copies": self.copies,
            "cost": self.cost,
            "cost_bound": self.cost_bound,
            "gap": self.gap,
            "bound_source": self.bound_source,
            "optimal": self.optimal,
            "solver": self.solver,
            "chosen": self.chosen,
        }
        if self.stream is not None:
            doc["stream_weights"] = self.stream
        return doc


class BudgetUnreachable(OffloadError):
    """No plan of the budget strategy fits the budget; ``reachable`` is the best peak it can reach."""

    def __init__(self, message: str, *, hint: str | None = None, reachable: int) -> None:
        super().__init__(message, hint=hint)
        self.reachable = reachable


@dataclass
class _Attempt:
    """One search over one candidate set."""

    rejected: list[Rejection]  # the rejections of the selection the candidates come from
    cands: list[Cand]
    small: list  # rejections for --min-bytes
    stream_info: dict[str, Any] | None
    outcome: Outcome


@dataclass(frozen=True)
class _Pricing:
    """What one search fits and how its plan is priced."""

    budget: int | None
    cost: CopyCost
    copies: str
    weights_added: bool


@dataclass
class Found:
    """A search's filtered plan, and the simulation of its scheduled plan when one was made; with
    copies on streams, which objective's plan was kept and both plans' stalls (time's, bytes')."""

    filtered: Plan
    scheduled: Plan | None = None
    simulation: SimResult | None = None
    kept: str = "time"
    stalls: tuple[float, float] = (0.0, 0.0)


class BudgetSearch:
    """The budget planner prepared once, to run at any number of budgets and copy modes.

    What does not depend on the budget is done once and kept: the checks of the model, the
    selection (weights looked at too), the lower bound, the candidates with and without weights and
    the device timing of copies on streams. `plan` gives a scheduled plan at one budget, `filter`
    the filtered plan the filter stage writes. The trade-off (`offloadctl.planning.tradeoff`) runs
    many.

    Args:
        analysis: the analysed model.
        options: the budget planner's options (`FilterRequest`, or a whole `PlanRequest`).
        select: the candidates' select options (their select distance is not used: the planner
            weighs every idle stretch).
        base: the selected plan whose model, options and history the plans extend (None: the
            planner's own selection at select distance 0).
        listed: False for plans made for their figures alone (`budget_figures`): the same offloads,
            an empty ``rejected`` list.
    """

    def __init__(
        self,
        analysis: Analysis,
        options: FilterRequest,
        select: SelectPart,
        *,
        base: Plan | None = None,
        listed: bool = True,
    ) -> None:
        dynamic = [
            name
            for name in analysis.graph_inputs
            if (info := analysis.infos.get(name)) is not None and info.copyable and info.bytes is None
        ]
        if dynamic:
            raise OffloadError(
                f"a budget cannot be checked for {analysis.loaded.path}: input(s) {', '.join(dynamic)} have dynamic "
                "dimensions, so the sizes of the tensors computed from them are unknown",
                hint="pin them with --input-shape NAME=D0,D1,... (on select or plan)",
            )
        self.analysis = analysis
        self.options = options
        # the kernel scratch a measured profile records is part of every step's memory, as simulate counts it
        count_scratch(analysis, options.device_profile)
        self.params = select.params or options.stream_weights
        self.listed = listed
        self.selection = selection_for(analysis, select)  # a distance plan made before shares it
        self.base = base if base is not None else self.selection.header(weights=select.params)
        # the bound and the peak from the simulation's base, which a simulation of the plan reuses
        self.lower_bound, self.lower_bound_position = lower_bound(analysis)
        self.peak_before = timeline.peak_of(resident_profile(analysis))[0]
        self._prepared: dict[bool, tuple] = {}
        self._timing: dict[int, tuple[Profile, CopyTiming]] = {}

    def _prepare(self, with_params: bool) -> tuple:
        """(the selection's rejections, candidates, candidates too small, streamed states, streaming info),
        once each."""
        if with_params not in self._prepared:
            rejected = self.selection.rejected(weights=with_params) if self.listed else []
            cands, small = candidates(self.analysis, self.selection, with_params, self.options.min_size)
            stream = info = None
            if self.options.stream_weights:
                stream, info = stream_states(cands, self.options.stream_depth)
            self._prepared[with_params] = (rejected, cands, small, stream, info)
        return self._prepared[with_params]

    def timing(self, profile: Profile) -> CopyTiming:
        """When each node runs on ``profile``, computed once per profile."""
        hit = self._timing.get(id(profile))
        if hit is None or hit[0] is not profile:
            hit = self._timing[id(profile)] = (profile, copy_timing(self.analysis, profile))
        return hit[1]

    def _attempt(self, with_params: bool, budget: int | None, cost: CopyCost, copies: str) -> _Attempt:
        rejected, cands, small, stream, info = self._prepare(with_params)
        timing = self.timing(self.options.device_profile) if copies == "streams" else None
        outcome = solve(self.analysis, cands, self.options, budget=budget, stream=stream, cost=cost, timing=timing)
        return _Attempt(rejected, cands, small, info, outcome)

    def _cost(self, copies: str) -> CopyCost:
        objective, prof = self.options.search_objective, self.options.device_profile
        if isinstance(objective, CopyCost):
            return objective
        if objective == "time" and copies == "streams":
            return StreamStall(self.timing(prof))
        assert isinstance(objective, str)
        return make_cost(objective, prof)

    def _check_budget(self, budget: int | None) -> None:
        lb, pos = self.lower_bound, self.lower_bound_position
        if budget is not None and budget < lb:
            raise BudgetUnreachable(
                f"budget {fmt_bytes(budget)} is below the lower bound {fmt_bytes(lb)} ({lb} bytes) of "
                f"{self.analysis.loaded.path} ({_where(self.analysis, pos)}); the peak is "
                f"{fmt_bytes(self.peak_before)} without offload",
                hint=f"give --budget {byte_arg(lb)} or more",
                reachable=lb,
            )

    def _fitting(self, budget: int | None, cost: CopyCost, copies: str, quiet: bool) -> tuple[_Attempt, bool]:
        """The attempt that fits, and whether weights had to join the candidates."""
        first = self._attempt(self.params, budget, cost, copies)
        if first.outcome.fits:
            return first, False
        retry = None
        if not self.params:
            retry = self._attempt(True, budget, cost, copies)
            if retry.outcome.fits:
                if not quiet:
                    logger.warning(
                        "activations alone cannot fit the budget: weights were considered too (as with --params)"
                    )
                return retry, True
        best = min(a.outcome.reachable for a in (first, retry) if a is not None and a.outcome.reachable is not None)
        fused = self.selection.options.fused
        kept = (
            f"; {len(fused)} tensors stay on the device for onnxruntime's fusions at the measured profile's "
            "optimization level (reason fused): a profile at a lower --opt-level keeps none"
            if fused
            else ""
        )
        raise BudgetUnreachable(
            f"the budget strategy cannot fit {self.analysis.loaded.path} into {fmt_bytes(budget)}: the best peak "
            f"reachable is {fmt_bytes(best)} ({best} bytes; lower bound {fmt_bytes(self.lower_bound)}, peak without "
            f"offload {fmt_bytes(self.peak_before)})",
            hint=f"raise --budget to at least {byte_arg(best)}, "
            f"or allow more candidates (--params, fewer --never patterns){kept}",
            reachable=best,
        )

    def _search(self, budget: int | None, copies: str, quiet: bool) -> Found:
        if self.options.optimal and not self._cost(copies).linear:
            raise OffloadError(
                "the exact search (--optimal) supports only the linear objectives: bytes, "
                "or time with copies in line; with copies on streams a copy's price depends on the compute "
                "around it, which the program cannot state",
                hint="drop --optimal, or use --copies inline (or --objective bytes)",
            )
        self._check_budget(budget)
        cost = self._cost(copies)
        chosen, weights_added = self._fitting(budget, cost, copies, quiet)
        build = _Pricing(budget, cost, copies, weights_added)
        if cost.objective != "time" or budget is None or isinstance(self.options.search_objective, CopyCost):
            return Found(self._build(chosen, build))
        # The time objective is priced copy by copy; the plan the bytes objective finds is checked too,
        # and the faster of the two (estimated as the chosen copy mode runs) is kept, so asking for time
        # never gives a longer estimate than asking for bytes.
        other = self._attempt(self.params or weights_added, budget, BytesMoved(), copies)
        if not other.outcome.fits:  # pragma: no cover - the same candidates fit under any price
            return Found(self._build(chosen, build))
        if copies == "inline" and self.options.device_profile.measured is None:
            # the copies' time in line: a sum the planners' states give (a datasheet profile prices no pins)
            inline = InlineTime(self.options.device_profile)
            mine_s, theirs_s = chosen.outcome.planner.moved(inline), other.outcome.planner.moved(inline)
            kept = "bytes" if theirs_s < mine_s - 1e-12 * max(mine_s, 1e-30) else "time"
            found = Found(
                self._build(chosen, build) if kept == "time" else self._build(other, build, searched=chosen.outcome)
            )
        else:
            found = self._compare_simulated(chosen, other, build, "overlapped" if copies == "streams" else "serialized")
            kept, (mine_s, theirs_s) = found.kept, found.stalls
        compared: Compared = {"copies": copies, "stall_s": {"time": mine_s, "bytes": theirs_s}, "kept": kept}
        for plan in (found.filtered, found.scheduled):
            if plan is not None:
                plan["budget"]["compared"] = compared
        return found

    def _compare_simulated(self, chosen: _Attempt, other: _Attempt, build: _Pricing, key: str) -> Found:
        """Both plans simulated, the stall (``key``: ``overlapped`` or ``serialized``) the simulator's, the
        one kept handing its simulation back: with copies on streams a copy's price depends on the compute
        around it, and under a measured profile the time in line includes the order pins' nodes."""
        mine = Found(self._build(chosen, build))
        theirs = Found(self._build(other, build, searched=chosen.outcome))
        for found in (mine, theirs):
            found.scheduled = prefetch.run(found.filtered, self._prefetch_part())
            found.simulation = simulate(self.analysis, found.scheduled, profile=self.options.device_profile)
        stalls = (_stall(mine.simulation, key), _stall(theirs.simulation, key))
        kept = "bytes" if stalls[1] < stalls[0] - 1e-12 * max(stalls[0], 1e-30) else "time"
        found = theirs if kept == "bytes" else mine
        found.kept, found.stalls = kept, stalls
        return found

    def _prefetch_part(self) -> PrefetchPart:
        return PrefetchPart(
            prefetch_distance=self.options.prefetch_distance, release_distance=self.options.release_distance
        )

    def filter(self, budget: int | None = None, *, copies: str | None = None, quiet: bool = False) -> Plan:
        """The "filtered" plan whose peak fits ``budget`` (default: the options') at the least cost.

        ``copies`` overrides the options' copy mode; ``quiet``: do not warn when weights join the
        candidates (a sweep over many budgets reads ``weights_added_by_budget`` instead).

        Raises:
            BudgetUnreachable: the budget is below the lower bound or cannot be reached.
        """
        budget = self.options.budget_bytes if budget is None else budget
        return self._search(budget, copies or self.options.copies, quiet).filtered

    def found(self, budget: int | None = None) -> Found:
        """What the search at ``budget`` (default: the options') finds: the filtered plan, and where the
        search placed the prefetches itself (copies on streams, the time objective), the scheduled plan
        and its simulation.

        Raises:
            BudgetUnreachable: the budget is below the lower bound or cannot be reached.
        """
        return self._search(self.options.budget_bytes if budget is None else budget, self.options.copies, False)

    def plan(self, budget: int | None = None, *, copies: str | None = None, quiet: bool = False) -> PlanOutcome:
        """The scheduled plan whose peak fits ``budget`` at the least cost (see `filter`), and its
        simulation on the options' profile when the search made one."""
        budget = self.options.budget_bytes if budget is None else budget
        found = self._search(budget, copies or self.options.copies, quiet)
        # the filtered plan was built for this call alone: it is scheduled as it is, not copied
        scheduled = found.scheduled or prefetch_own(found.filtered, self._prefetch_part())
        return PlanOutcome(scheduled, found.simulation)

    def _build(self, attempt: _Attempt, pricing: _Pricing, *, searched: Outcome | None = None) -> Plan:
        """The filtered plan of one search's outcome, priced by ``pricing.cost``.

        ``searched``: the search whose bound (and solver) the plan reports, when its plan is another
        search's (the plan the bytes objective found, kept for the time objective).
        """
        options = self.options
        budget, cost, copies = pricing.budget, pricing.cost, pricing.copies
        new = record_stage(  # only the chosen offloads go into the new plan: the selected ones are not copied
            {**self.base, "offloads": []}, "filtered", "filter", self._recorded(cost, copies, budget)
        )
        new["strategy"] = "budget"
        offloads, rejected, chosen = self._entries(attempt, budget)
        new["offloads"] = offloads
        new["rejected"] = rejected
        planner = attempt.outcome.planner
        peak, pos = planner.peak()
        total = planner.moved(cost)
        result = BudgetResult(
            requested=budget,
            lower_bound=self.lower_bound,
            lower_bound_position=self.lower_bound_position,
            peak_before=self.peak_before,
            peak=int(peak),
            peak_position=pos,
            moved=bytes_moved(new),
            weights_added=pricing.weights_added,
            stream=attempt.stream_info,
            chosen=chosen,
            objective=cost.to_json(),
            cost=_round_cost(total, cost),
            copies=copies,
        )
        _record_bound(result, attempt.outcome if searched is None else searched, total, cost, budget, searched)
        new["budget"] = result.to_json(options.prefetch_distance, options.release_distance)
        return new

    def _recorded(self, cost: CopyCost, copies: str, budget: int | None) -> dict[str, Any]:
        options = self.options
        return {
            "select_num": options.select_num,
            "min_bytes": options.min_size,
            "strategy": "budget",
            "budget_bytes": budget,
            "profile": options.device_profile.name if cost.objective == "time" or copies == "streams" else None,
            "objective": cost.objective,
            "copies": copies,
            "optimal": options.optimal,
            "time_limit_s": float(options.time_limit) if options.optimal else None,
        }

    def _entries(self, attempt: _Attempt, budget: int | None) -> tuple[list[Offload], list, dict[str, str]]:
        """The plan's offloads (in first-use order), its rejections (none unless `listed`), and why each
        offload was chosen."""
        planner = attempt.outcome.planner
        offloads: list[Offload] = []
        rejected = []
        if self.listed:
            handled = {c.name for c in attempt.cands} | {r["tensor"] for r in attempt.small}
            rejected = [dict(r) for r in attempt.rejected if r["tensor"] not in handled] + attempt.small
        chosen: dict[str, str] = {}
        for i, c in enumerate(attempt.cands):
            st = planner.state[i]
            if st.offloaded:
                offloads.append(plan_entry(c, st, self.analysis))
                if planner.fixed[i]:
                    chosen[c.name] = "streamed weight (layer group)"
                elif c.forced:
                    chosen[c.name] = "forced (--force)"
                else:
                    chosen[c.name] = "needed to fit the budget"
            elif self.listed:
                why = "the peak fits the budget without it" if budget is not None else "no budget given"
                rejected.append(reject(c.name, c.kind, c.size, "budget-not-needed", why, c.entries))
        offloads.sort(key=first_use_key)
        for i, e in enumerate(offloads):
            e["id"] = i
        return offloads, rejected, chosen


def _stall(result: SimResult | None, key: str) -> float:
    """The time a scheduled plan's copies (and pins) add to the baseline, as the simulator runs them
    (``key``: ``overlapped``, copies on streams, or ``serialized``, in line)."""
    assert result is not None and result.times is not None  # a simulation with a profile has its times
    return float(getattr(result.times, key)) - result.times.baseline


def _record_bound(
    result: BudgetResult, outcome: Outcome, total: float, cost: CopyCost, budget: int | None, searched: Outcome | None
) -> None:
    """The proven bound on the cost (the steps', or the solver's when it proved more), and whether the
    plan is proven optimal."""
    bound, source = (outcome.bound, "steps") if outcome.bound is not None else (None, None)
    if budget is None:
        bound, source = total, "steps"  # nothing to choose: the fixed choices are the only plan
    if outcome.exact is not None:
        result.search = "exact"
        result.solver = outcome.exact.to_json()
        solver_bound = outcome.exact.bound
        if solver_bound is not None and (bound is None or solver_bound > bound):
            bound, source = solver_bound, "solver"
        if (
            searched is None
            and outcome.exact.status == "optimal"
            and outcome.exact.answer in ("accepted", "no cheaper than the greedy's plan, which is kept")
        ):
            result.optimal = True
            bound, source = total, "solver"
    if bound is not None and cost.linear:
        if cost.integral:
            bound = math.ceil(bound - 1e-6)
        result.cost_bound = _round_cost(min(bound, total), cost)
        result.bound_source = source


def budget_figures(analysis: Analysis, request: Any) -> PlanOutcome:
    """`budget_plan`'s plan for its figures alone: the same offloads (so the same peak and time),
    but no ``rejected`` list, which on a big model is most of the work and of the document. Not a
    plan to write or to apply."""
    return BudgetSearch(analysis, request, request, listed=False).plan(quiet=True)


def budget_plan(analysis: Analysis, request: Any) -> PlanOutcome:
    """The budget planner: an analysis and a `offloadctl.planning.request.PlanRequest` to a scheduled
    plan that fits ``request.budget`` at the least cost (``stream_weights``: weights streamed in by
    layer group). See the package docstring for the rules.

    Raises:
        OffloadError: ``optimal`` with a cost that is not linear, or the budget cannot be reached
            (`BudgetUnreachable`: the message gives the lower bound and the best peak reachable).
    """
    request.report("selecting")
    search = BudgetSearch(analysis, request, request)
    request.report("fitting the budget")
    return search.plan()


@taking2(FilterRequest)
def budget_filter(plan: Plan, analysis: Analysis, options: FilterRequest) -> Plan:
    """The filter stage with a budget: a "selected" plan to a "filtered" plan whose peak fits
    ``options.budget`` at the least cost (``options``: `FilterRequest`, or its fields as keywords).

    The plan's select options (activations, params, force, never, and the host nodes of a plan
    made for a device) are kept, its select distance is not used: the planner weighs every idle
    stretch. Each offload gets its own prefetch distance, at most ``options.prefetch_distance``, so
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
    select = SelectPart(**{**recorded_select, "select_distance": 0})
    options.report("fitting the budget")
    return BudgetSearch(analysis, options, select, base=plan).filter()


def _round_cost(value: float, cost: CopyCost) -> float | int:
    return int(round(value)) if cost.integral else float(value)
