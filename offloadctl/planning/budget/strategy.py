"""The budget strategy's entry points: `BudgetSearch` (prepared once per selected plan, run at any
budget), `budget_filter` (one search), `check_budget` (a scheduled plan against the timeline), the
plan's ``budget`` object (`BudgetResult`) and the memory figures of a plan (`memory_profile`,
`plan_peak`, `bytes_moved`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from offloadctl.analysis import timeline
from offloadctl.analysis.graph import Analysis
from offloadctl.analysis.timeline import lower_bound
from offloadctl.contract.document import check_plan_model, record_stage, require_stage
from offloadctl.contract.types import Offload, Plan
from offloadctl.core.errors import OffloadError
from offloadctl.core.units import byte_arg, fmt_bytes
from offloadctl.planning.budget.candidates import candidates, plan_entry, reject
from offloadctl.planning.budget.exact import DEFAULT_TIME_LIMIT
from offloadctl.planning.budget.search import Outcome, solve
from offloadctl.planning.budget.streaming import DEFAULT_STREAM_DEPTH, stream_states
from offloadctl.planning.filter import DEFAULT_MIN_BYTES, DEFAULT_SELECT_NUM, first_use_key
from offloadctl.planning.prefetch import DEFAULT_PREFETCH_DISTANCE, DEFAULT_RELEASE_DISTANCE
from offloadctl.planning.select import select
from offloadctl.simulation.costs import (
    COPY_MODES,
    BytesMoved,
    CopyCost,
    CopyTiming,
    InlineTime,
    StreamStall,
    copy_timing,
    make_cost,
    plan_cost,
)
from offloadctl.simulation.profiles import DEFAULT_PROFILE, Profile, load_profile

__all__ = [
    "BudgetResult",
    "BudgetSearch",
    "BudgetUnreachable",
    "budget_filter",
    "bytes_moved",
    "check_budget",
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
    """What the strategy found, besides the plan."""

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

    def to_json(self, prefetch_distance: int, release_distance: int) -> dict[str, Any]:
        doc = {
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


class BudgetSearch:
    """The budget strategy prepared once for a selected plan, to run at any number of budgets.

    What does not depend on the budget is done once and kept: the checks of the plan and the
    model, the lower bound, the candidates (with and without weights) and the device timing of
    copies on streams. `filter` runs one search; `budget_filter` is one `BudgetSearch` and one
    `filter`. The frontier (`offloadctl.planning.tradeoff`) runs many.
    """

    def __init__(
        self,
        plan: Plan,
        analysis: Analysis,
        *,
        prefetch_distance: int = DEFAULT_PREFETCH_DISTANCE,
        release_distance: int = DEFAULT_RELEASE_DISTANCE,
        select_num: int = DEFAULT_SELECT_NUM,
        min_bytes: int = DEFAULT_MIN_BYTES,
        stream_weights: bool = False,
        stream_depth: int = DEFAULT_STREAM_DEPTH,
    ) -> None:
        require_stage(plan, "selected", "the budget strategy")
        check_plan_model(plan, analysis.loaded.sha256, analysis.loaded.path)
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
        if select_num != DEFAULT_SELECT_NUM:
            logger.warning(
                "--select-num %d is not used by the budget strategy (it fits the budget instead)", select_num
            )
        self.plan = plan
        self.analysis = analysis
        self.prefetch_distance = prefetch_distance
        self.release_distance = release_distance
        self.select_num = select_num
        self.min_bytes = min_bytes
        self.stream_weights = stream_weights
        self.stream_depth = stream_depth
        self.lower_bound, self.lower_bound_position = lower_bound(analysis)
        self.peak_before = plan_peak(analysis, None)[0]
        sel = plan["options"]["select"]
        self.params = sel["params"] or stream_weights
        self._prepared: dict[bool, tuple] = {}
        self._timing: dict[int, tuple[Profile, CopyTiming]] = {}

    def _prepare(self, with_params: bool) -> tuple:
        """(selected plan, candidates, candidates too small, streamed states, streaming info), once each."""
        if with_params not in self._prepared:
            sel = self.plan["options"]["select"]
            if sel["select_distance"] == 0 and sel["params"] == with_params:
                selected0 = self.plan  # already every candidate (read only here)
            else:
                selected0 = select(
                    self.analysis,
                    select_distance=0,
                    activations=sel["activations"],
                    params=with_params,
                    force=tuple(sel.get("force", ())),
                    never=tuple(sel.get("never", ())),
                )
            cands, small = candidates(self.analysis, selected0, self.min_bytes)
            stream = info = None
            if self.stream_weights:
                stream, info = stream_states(cands, self.stream_depth)
            self._prepared[with_params] = (selected0, cands, small, stream, info)
        return self._prepared[with_params]

    def timing(self, profile: Profile) -> CopyTiming:
        """When each node runs on ``profile``, computed once per profile."""
        hit = self._timing.get(id(profile))
        if hit is None or hit[0] is not profile:
            hit = self._timing[id(profile)] = (profile, copy_timing(self.analysis, profile))
        return hit[1]

    def _attempt(
        self,
        with_params: bool,
        budget: int | None,
        cost: CopyCost,
        *,
        timing: CopyTiming | None,
        optimal: bool,
        time_limit: float,
        report: Callable[[str], None] | None,
    ) -> tuple:
        selected0, cands, small, stream, info = self._prepare(with_params)
        outcome = solve(
            self.analysis,
            cands,
            budget=budget,
            prefetch_distance=self.prefetch_distance,
            release_distance=self.release_distance,
            stream=stream,
            cost=cost,
            optimal=optimal,
            time_limit=time_limit,
            report=report,
            timing=timing,
        )
        return selected0, cands, small, info, outcome

    def filter(
        self,
        budget_bytes: int | None,
        *,
        objective: str | CopyCost = "bytes",
        profile: str | Profile | None = None,
        copies: str = "inline",
        optimal: bool = False,
        time_limit: float = DEFAULT_TIME_LIMIT,
        report: Callable[[str], None] | None = None,
        quiet: bool = False,
    ) -> Plan:
        """The "filtered" plan whose peak fits ``budget_bytes`` at the least cost (see `budget_filter`).

        ``quiet``: do not warn when weights join the candidates (a sweep over many budgets reads
        ``weights_added_by_budget`` instead).
        """
        analysis = self.analysis
        if copies not in COPY_MODES:
            raise OffloadError(f"unknown copy mode {copies!r}", hint=f"use one of {', '.join(COPY_MODES)}")
        if optimal and not (math.isfinite(time_limit) and time_limit > 0):
            raise OffloadError(
                f"the exact search's time limit {time_limit} is not a finite number of seconds above 0",
                hint="for example --time-limit 60",
            )
        prof = profile if isinstance(profile, Profile) else load_profile(profile or DEFAULT_PROFILE)
        timing = self.timing(prof) if copies == "streams" else None
        if isinstance(objective, CopyCost):
            cost = objective
        elif objective == "time" and copies == "streams":
            cost = StreamStall(self.timing(prof))
        else:
            cost = make_cost(objective, prof)
        if optimal and not cost.linear:
            raise OffloadError(
                "the exact search (--optimal) supports only the linear objectives: bytes, "
                "or time with copies in line; with copies on streams a copy's price depends on the compute "
                "around it, which the program cannot state",
                hint="drop --optimal, or use --copies inline (or --objective bytes)",
            )
        if optimal and budget_bytes is None:
            logger.warning("--optimal needs --budget: without a budget there is nothing to optimise")
        lb, lb_pos, before = self.lower_bound, self.lower_bound_position, self.peak_before
        if budget_bytes is not None and budget_bytes < lb:
            raise BudgetUnreachable(
                f"budget {fmt_bytes(budget_bytes)} is below the lower bound {fmt_bytes(lb)} ({lb} bytes) of "
                f"{analysis.loaded.path} ({_where(analysis, lb_pos)}); the peak is {fmt_bytes(before)} without offload",
                hint=f"give --budget {byte_arg(lb)} or more",
                reachable=lb,
            )
        search: dict[str, Any] = {"timing": timing, "optimal": optimal, "time_limit": time_limit, "report": report}
        first = self._attempt(self.params, budget_bytes, cost, **search)
        chosen = first
        weights_added = False
        retry = None
        if not first[-1].fits and not self.params:
            retry = self._attempt(True, budget_bytes, cost, **search)
            if retry[-1].fits:
                if not quiet:
                    logger.warning(
                        "activations alone cannot fit the budget: weights were considered too (as with --params)"
                    )
                chosen = retry
                weights_added = True
        if not chosen[-1].fits:
            best = min(a[-1].reachable for a in (first, retry) if a is not None and a[-1].reachable is not None)
            raise BudgetUnreachable(
                f"the budget strategy cannot fit {analysis.loaded.path} into {fmt_bytes(budget_bytes)}: the best peak "
                f"reachable is {fmt_bytes(best)} ({best} bytes; lower bound {fmt_bytes(lb)}, peak without offload "
                f"{fmt_bytes(before)})",
                hint=f"raise --budget to at least {byte_arg(best)}, "
                "or allow more candidates (--params, fewer --never patterns)",
                reachable=best,
            )
        build: dict[str, Any] = dict(
            budget_bytes=budget_bytes,
            cost=cost,
            profile=prof,
            copies=copies,
            optimal=optimal,
            time_limit=time_limit,
            weights_added=weights_added,
        )
        if cost.objective != "time" or budget_bytes is None or isinstance(objective, CopyCost):
            return self._build(chosen, **build)
        # the time objective is priced copy by copy; the plan the bytes objective finds is checked too,
        # and the faster of the two (estimated as the chosen copy mode runs) is kept, so asking for
        # time never gives a longer estimate than asking for bytes
        with_params = True if chosen is retry else self.params
        other = self._attempt(
            with_params, budget_bytes, BytesMoved(), timing=timing, optimal=False, time_limit=time_limit, report=report
        )
        if not other[-1].fits:  # pragma: no cover - the same candidates fit under any price
            return self._build(chosen, **build)
        if copies == "inline":  # the copies' time in line: a sum the planners' states give
            inline = InlineTime(prof)
            mine_s, theirs_s = chosen[-1].planner.moved(inline), other[-1].planner.moved(inline)
            kept = "bytes" if theirs_s < mine_s - 1e-12 * max(mine_s, 1e-30) else "time"
            new = self._build(chosen, **build) if kept == "time" else self._build(other, **build, searched=chosen[-1])
        else:
            new = self._build(chosen, **build)
            theirs = self._build(other, **build, searched=chosen[-1])
            mine_s, theirs_s = self._stall(new, prof), self._stall(theirs, prof)
            kept = "bytes" if theirs_s < mine_s - 1e-12 * max(mine_s, 1e-30) else "time"
            if kept == "bytes":
                new = theirs
        new["budget"]["compared"] = {"copies": copies, "stall_s": {"time": mine_s, "bytes": theirs_s}, "kept": kept}
        return new

    def _stall(self, filtered: Plan, profile: Profile) -> float:
        """The time a filtered plan's copies add to the baseline with copies on streams (the simulator's)."""
        from offloadctl.planning.prefetch import prefetch
        from offloadctl.simulation.result import simulate

        scheduled = prefetch(filtered, prefetch_distance=self.prefetch_distance, release_distance=self.release_distance)
        times = simulate(self.analysis, scheduled, profile=profile).times
        assert times is not None  # a simulation with a profile has its times
        return times.overlapped - times.baseline

    def _build(
        self,
        attempt: tuple,
        *,
        budget_bytes: int | None,
        cost: CopyCost,
        profile: Profile,
        copies: str,
        optimal: bool,
        time_limit: float,
        weights_added: bool,
        searched: Outcome | None = None,
    ) -> Plan:
        """The filtered plan of one search's outcome, priced by ``cost``.

        ``searched``: the search whose bound (and solver) the plan reports, when its plan is another
        search's (the plan the bytes objective found, kept for the time objective).
        """
        analysis = self.analysis
        n = analysis.num_positions
        selected0, cands, small, stream_info, kept = attempt
        planner = kept.planner
        outcome = kept if searched is None else searched
        new = record_stage(  # only the chosen offloads go into the new plan: the selected ones are not copied
            {**self.plan, "offloads": []},
            "filtered",
            "filter",
            {
                "select_num": self.select_num,
                "min_bytes": self.min_bytes,
                "strategy": "budget",
                "budget_bytes": budget_bytes,
                "profile": profile.name if cost.objective == "time" or copies == "streams" else None,
                "objective": cost.objective,
                "copies": copies,
                "optimal": optimal,
                "time_limit_s": float(time_limit) if optimal else None,
            },
        )
        new["strategy"] = "budget"
        offloads: list[Offload] = []
        handled = {c.name for c in cands} | {r["tensor"] for r in small}
        rejected = [dict(r) for r in selected0["rejected"] if r["tensor"] not in handled] + small
        chosen: dict[str, str] = {}
        for i, c in enumerate(cands):
            st = planner.state[i]
            if st.offloaded:
                offloads.append(plan_entry(c, st, n))
                if planner.fixed[i]:
                    chosen[c.name] = "streamed weight (layer group)"
                elif c.forced:
                    chosen[c.name] = "forced (--force)"
                else:
                    chosen[c.name] = "needed to fit the budget"
            else:
                why = "the peak fits the budget without it" if budget_bytes is not None else "no budget given"
                rejected.append(reject(c.name, c.kind, c.b, "budget-not-needed", why, c.entries))
        offloads.sort(key=first_use_key)
        for i, e in enumerate(offloads):
            e["id"] = i
        new["offloads"] = offloads
        new["rejected"] = rejected
        peak, pos = planner.peak()
        total = planner.moved(cost)
        result = BudgetResult(
            requested=budget_bytes,
            lower_bound=self.lower_bound,
            lower_bound_position=self.lower_bound_position,
            peak_before=self.peak_before,
            peak=peak,
            peak_position=pos,
            moved=bytes_moved(new),
            weights_added=weights_added,
            stream=stream_info,
            chosen=chosen,
            objective=cost.to_json(),
            cost=_round_cost(total, cost),
            copies=copies,
        )
        bound, source = (outcome.bound, "steps") if outcome.bound is not None else (None, None)
        if budget_bytes is None:
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
        new["budget"] = result.to_json(self.prefetch_distance, self.release_distance)
        return new


def budget_filter(
    plan: Plan,
    analysis: Analysis,
    *,
    budget_bytes: int | None,
    prefetch_distance: int = DEFAULT_PREFETCH_DISTANCE,
    release_distance: int = DEFAULT_RELEASE_DISTANCE,
    select_num: int = DEFAULT_SELECT_NUM,
    min_bytes: int = DEFAULT_MIN_BYTES,
    stream_weights: bool = False,
    stream_depth: int = DEFAULT_STREAM_DEPTH,
    profile: str | Profile | None = None,
    report: Callable[[str], None] | None = None,
    objective: str | CopyCost = "bytes",
    copies: str = "inline",
    optimal: bool = False,
    time_limit: float = DEFAULT_TIME_LIMIT,
) -> Plan:
    """Turn a "selected" plan into a "filtered" plan whose peak fits ``budget_bytes`` at the least cost.

    Args:
        plan: a plan at stage "selected" for ``analysis``'s model; its select options (activations,
            params, force, never) are kept, its select distance is not used.
        analysis: the analysed model the plan was made for.
        budget_bytes: the peak to fit, or None to offload only what ``stream_weights`` and
            ``--force`` ask for.
        prefetch_distance: the global prefetch distance the prefetch stage will use; each offload
            gets its own distance, at most this, so the peak stays within the budget.
        release_distance: the release distance the prefetch stage will use.
        select_num: recorded; the budget strategy does not cap the number of offloads.
        min_bytes: candidates smaller than this are not considered.
        stream_weights: stream weights in by layer group (see the module docstring).
        stream_depth: how many groups ahead a group is copied in.
        profile: device profile (name or file) of the time objective and of copies on streams.
        report: called with a line of text as the search goes (the peak left to fit).
        objective: what to minimise: ``"bytes"`` (bytes moved), ``"time"`` (the estimated time the
            copies add under ``copies``, on ``profile``; the plan the bytes objective finds is
            checked too and the faster kept), or any `offloadctl.simulation.costs.CopyCost`.
        copies: ``"inline"`` (copies on the compute stream, what onnxruntime runs) or ``"streams"``
            (an estimate for copies on separate streams: prefetches are placed for the shared link).
        optimal: also solve the exact program (HiGHS) from the greedy's plan (linear objectives only).
        time_limit: seconds the exact program may take; the best plan found by then is kept.

    Raises:
        OffloadError: the plan is for another model, ``optimal`` with a cost that is not linear, or
            the budget cannot be reached (`BudgetUnreachable`: the message gives the lower bound
            and the best peak reachable).
    """
    return BudgetSearch(
        plan,
        analysis,
        prefetch_distance=prefetch_distance,
        release_distance=release_distance,
        select_num=select_num,
        min_bytes=min_bytes,
        stream_weights=stream_weights,
        stream_depth=stream_depth,
    ).filter(
        budget_bytes,
        objective=objective,
        profile=profile,
        copies=copies,
        optimal=optimal,
        time_limit=time_limit,
        report=report,
    )


def _round_cost(value: float, cost: CopyCost) -> float | int:
    return int(round(value)) if cost.integral else float(value)


def check_budget(analysis: Analysis, plan: Plan) -> Plan:
    """Check a scheduled budget plan against the timeline and record its figures in ``plan["budget"]``.

    Returns the plan (updated in place).

    Raises:
        OffloadError: the predicted peak exceeds the budget (a bug in the strategy: never expected).
    """
    info = plan.get("budget")
    if info is None:
        return plan
    peak, pos = timeline.peak_of(timeline.profile(analysis, plan, prefetch_distance=0))
    requested = info.get("requested_bytes")
    if requested is not None and peak > requested:
        raise OffloadError(
            f"internal error: the budget plan for {analysis.loaded.path} peaks at {fmt_bytes(peak)} ({peak} bytes) > "
            f"budget {fmt_bytes(requested)} ({requested} bytes)",
            hint="please report it with the model; meanwhile use the distance strategy (--select-distance)",
        )
    info["predicted_peak_bytes"] = int(peak)
    info["predicted_peak_position"] = pos
    info["bytes_moved"] = bytes_moved(plan)
    return plan
