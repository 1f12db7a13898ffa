"""Peak memory against estimated time: the frontier of budget plans, and the plan with the largest
cut in peak memory within an estimated slowdown.

This module owns the budget sweep behind ``offloadctl frontier`` and ``offloadctl plan
--max-slowdown``. It runs the budget strategy (`offloadctl.planning.budget.strategy.BudgetSearch`, prepared
once: selection, candidates and device timing are shared by every budget) at budgets from the
model's peak down to its lower bound, schedules each plan (`offloadctl.planning.prefetch`) and times
it with the simulator (`offloadctl.simulation`) under a copy mode:

- ``inline``: copies on the compute stream, what onnxruntime runs today (the simulator's
  "serialized" time);
- ``streams``: copies on the copy stream ``apply --copies streams`` writes, hidden behind compute
  where the window allows, its event nodes priced (the simulator's "overlapped" time); not yet
  timed on a device.

The budgets are `budget_grid`: evenly spaced from the peak (nothing offloaded, the baseline) down to
the lower bound; when the search cannot reach a budget, the sweep ends with the best peak it can
reach. `Tradeoff.within` picks, among the same budgets, the plan with the lowest peak whose
estimated time is at most ``max_slowdown`` times the baseline, then bisects the budgets between it
and the next one down (which did not qualify) to cut a little more. It therefore never ends above
a frontier point of the same sweep that qualifies. Nothing here edits ONNX.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypedDict

from offloadctl.analysis.graph import Analysis
from offloadctl.core.errors import OffloadError
from offloadctl.core.plantypes import Plan
from offloadctl.planning.budget.strategy import BudgetSearch, BudgetUnreachable
from offloadctl.planning.outcome import PlanOutcome
from offloadctl.planning.planners import distance_plan
from offloadctl.planning.request import NO_PROGRESS, BudgetPart, PlanRequest, Progress
from offloadctl.planning.select import Selection
from offloadctl.simulation.base import is_rewritten
from offloadctl.simulation.costs import COPY_MODES, InlineTime, copies_of, copy_mode_label, plan_cost
from offloadctl.simulation.result import SimResult, simulate

__all__ = [
    "DEFAULT_POINTS",
    "Point",
    "Tradeoff",
    "budget_grid",
    "dominated",
    "point_of",
    "plan_within_slowdown",
]

logger = logging.getLogger(__name__)

DEFAULT_POINTS = 16  # budgets of a frontier, from the peak down to the lower bound
REFINE_STEPS = 6  # bisections of --max-slowdown below the best budget of the sweep
_TOLERANCE = 1e-9  # relative slack on a slowdown (float sums of node times)


def budget_grid(peak: int, lower_bound: int, points: int = DEFAULT_POINTS) -> list[int]:
    """``points`` budgets from ``peak`` down to ``lower_bound``, evenly spaced, without repeats."""
    if points < 2 or peak <= lower_bound:
        return [peak]
    span = peak - lower_bound
    grid = [lower_bound + (span * k) // (points - 1) for k in range(points - 1, -1, -1)]
    return list(dict.fromkeys(grid))


def _time_of(result: SimResult, copies: str) -> float:
    times = result.times
    assert times is not None
    return times.serialized if copies == "inline" else times.overlapped


class PointDoc(TypedDict):
    """A frontier point in a ``--json`` document (`Point.to_json`)."""

    budget_bytes: int | None
    peak_bytes: int
    time_s: float
    slowdown: float
    bytes_moved: int
    copies: int
    offloads: int
    weights_added: bool


@dataclass(frozen=True)
class Point:
    """One plan on the frontier: its budget, peak, estimated time and what it moves."""

    copies: str
    budget_bytes: int | None  # None: a plan not made for a budget (the default plan)
    peak_bytes: int
    time_s: float
    baseline_s: float
    bytes_moved: int
    copy_count: int
    offloads: int
    weights_added: bool = False

    @property
    def slowdown(self) -> float:
        return self.time_s / self.baseline_s if self.baseline_s > 0 else 1.0

    def to_json(self) -> PointDoc:
        return {
            "budget_bytes": self.budget_bytes,
            "peak_bytes": self.peak_bytes,
            "time_s": self.time_s,
            "slowdown": self.slowdown,
            "bytes_moved": self.bytes_moved,
            "copies": self.copy_count,
            "offloads": self.offloads,
            "weights_added": self.weights_added,
        }


def dominated(points: Sequence[Point]) -> list[bool]:
    """For each point, whether another has a peak and a time no higher, one of them lower.

    A plan made for a lower budget also fits a higher one, so a dominated point is never the best
    answer at its budget: the frontier proper is the points that are not dominated.
    """
    flags = []
    for p in points:
        slack = _TOLERANCE * p.time_s
        flags.append(
            any(
                q.peak_bytes <= p.peak_bytes
                and q.time_s <= p.time_s + slack
                and (q.peak_bytes < p.peak_bytes or q.time_s < p.time_s - slack)
                for q in points
            )
        )
    return flags


def point_of(result: SimResult, plan: Plan | None, copies: str, budget: int | None = None) -> Point:
    """The frontier point of a simulated plan under a copy mode."""
    assert result.times is not None
    record = plan.get("budget") if plan is not None else None
    return Point(
        copies=copies,
        budget_bytes=budget,
        peak_bytes=result.peak_after,
        time_s=_time_of(result, copies),
        baseline_s=result.times.baseline,
        bytes_moved=sum(result.transfer_bytes.values()),
        copy_count=sum(result.copies.values()),
        offloads=len(plan["offloads"]) if plan else 0,
        weights_added=record is not None and record["weights_added_by_budget"],
    )


class Tradeoff:
    """Budget plans of one model at any budget, timed under either copy mode.

    Args:
        analysis: the analysed model (not one already rewritten).
        request: a request for the frontier (``strategy="frontier"``) or for a slowdown limit
            (``max_slowdown``): the candidates (select options, ``min_bytes``), the distances, the
            objective each budget search minimises and the device profile of the time estimates;
            each plan names its own budget and copy mode. None: the frontier with every default.
    """

    def __init__(
        self, analysis: Analysis, request: PlanRequest | None = None, *, selection: Selection | None = None
    ) -> None:
        if is_rewritten(analysis):
            raise OffloadError(
                f"{analysis.loaded.path} already contains copies: trading memory for time needs the original model",
                hint="plan the model before offloadctl apply",
            )
        request = request or PlanRequest(budget=BudgetPart(strategy="frontier"))
        if request.budget.strategy != "frontier" and request.budget.max_slowdown is None:
            raise OffloadError(
                "a trade-off is asked for with a frontier or a slowdown limit",
                hint='give PlanRequest(budget=BudgetPart(strategy="frontier")) or BudgetPart(max_slowdown=X)',
            )
        self.request = request  # every budget and copy mode is asked for plan by plan
        self.profile = self.request.budget.device_profile
        self.objective = self.request.budget.objective_name
        # the pipeline's selection, when given
        self.search = BudgetSearch(analysis, self.request, self.request.selecting, selection=selection)
        self.analysis = self.search.analysis  # counting the profile's kernel scratch
        self.peak_bytes = self.search.prepared.peak_before
        self.lower_bound_bytes = self.search.prepared.lower_bound
        base = simulate(analysis, None, profile=self.profile).times
        assert base is not None
        self.baseline_s = base.baseline

    def plan(self, budget: int, copies: str = "inline") -> Plan:
        """The scheduled budget plan at ``budget`` for a copy mode.

        Raises:
            BudgetUnreachable: the budget cannot be reached (``reachable`` says what can).
        """
        return self.search.plan(budget, copies=copies, quiet=True).plan

    def point(self, budget: int, copies: str = "inline") -> tuple[Point, Plan]:
        """The plan at ``budget`` and its point; raises `BudgetUnreachable` as `plan`.

        The figures are the simulator's, taken where the search already has them: the peak the
        planner predicts (its working set, the timeline's), the copies' time in line (their sum), and on streams
        the stall the time objective simulated when it compared its plan with the bytes
        objective's; otherwise the plan is simulated.
        """
        plan = self.plan(budget, copies)
        info = plan["budget"]
        compared = info.get("compared")
        if copies == "inline":
            stall = plan_cost(plan, InlineTime(self.profile))
        elif compared is not None and compared["copies"] == copies:
            stall = compared["stall_s"][compared["kept"]]
        else:
            return point_of(simulate(self.analysis, plan, profile=self.profile), plan, copies, budget), plan
        counts = [copies_of(off) for off in plan["offloads"]]
        return Point(
            copies=copies,
            budget_bytes=budget,
            peak_bytes=info["predicted_peak_bytes"],
            time_s=self.baseline_s + stall,
            baseline_s=self.baseline_s,
            bytes_moved=info["bytes_moved"],
            copy_count=sum(d + h for d, h in counts),
            offloads=len(plan["offloads"]),
            weights_added=bool(info.get("weights_added_by_budget")),
        ), plan

    def sweep(
        self, copies: str, points: int = DEFAULT_POINTS, *, step: Callable[[str], None] | None = None
    ) -> list[tuple[Point, Plan]]:
        """Plans from the peak down to the lower bound (or the best peak reachable), one per budget."""
        found: list[tuple[Point, Plan]] = []
        for budget in budget_grid(self.peak_bytes, self.lower_bound_bytes, points):
            if step is not None:
                step(f"{copy_mode_label(copies).split(',')[0]}: budget {budget} bytes")
            try:
                found.append(self.point(budget, copies))
            except BudgetUnreachable as exc:
                last = found[-1][0].budget_bytes if found else None  # the smallest budget reached so far
                if exc.reachable < (last if last is not None else self.peak_bytes):
                    try:
                        found.append(self.point(exc.reachable, copies))
                    except BudgetUnreachable:
                        pass
                break
        return found

    def frontier(
        self,
        modes: Sequence[str] = COPY_MODES,
        points: int = DEFAULT_POINTS,
        *,
        step: Callable[[str], None] | None = None,
    ) -> dict[str, list[Point]]:
        """The frontier of each copy mode: one `Point` per budget of `sweep`."""
        return {mode: [p for p, _ in self.sweep(mode, points, step=step)] for mode in modes}

    def default_plan(self) -> tuple[Plan, SimResult]:
        """HyperOffload's default plan (``offloadctl plan MODEL`` with no options) and its simulation."""
        plan = distance_plan(self.analysis, PlanRequest()).plan
        return plan, simulate(self.analysis, plan, profile=self.profile)

    def within(
        self,
        max_slowdown: float,
        copies: str = "inline",
        points: int = DEFAULT_POINTS,
        *,
        step: Callable[[str], None] | None = None,
    ) -> tuple[Plan, Point, int]:
        """The plan with the lowest peak whose estimated time is at most ``max_slowdown`` x the baseline.

        Returns:
            (scheduled plan, its point, how many budgets were tried). When no budget below the peak
            qualifies, the plan at the peak (nothing offloaded).
        """
        if not (math.isfinite(max_slowdown) and max_slowdown >= 1):
            raise OffloadError(
                f"--max-slowdown {max_slowdown} is not a finite number of at least 1",
                hint="give 1.05 for at most 5% slower",
            )
        limit = max_slowdown * (1 + _TOLERANCE)
        tried = self.sweep(copies, points, step=step)
        ok = [(p, plan) for p, plan in tried if p.slowdown <= limit]
        best_point, best_plan = min(ok, key=lambda pp: (pp[0].peak_bytes, pp[0].time_s))
        best_budget = best_point.budget_bytes
        assert best_budget is not None  # every point of a sweep has its budget
        count = len(tried)
        # bisect between the best budget and the next one down, which did not qualify
        below = [p.budget_bytes for p, _ in tried if p.budget_bytes is not None and p.budget_bytes < best_budget]
        if below:
            refined, best_plan, best_point = self._refine(
                max(below), best_budget, limit, copies, best_plan, best_point, step
            )
            count += refined
        return best_plan, best_point, count

    def _refine(
        self,
        lo: int,
        hi: int,
        limit: float,
        copies: str,
        best_plan: Plan,
        best_point: Point,
        step: Callable[[str], None] | None,
    ) -> tuple[int, Plan, Point]:
        """Bisect budgets between ``lo`` (over the limit) and ``hi`` (within it) for a lower peak within
        ``limit``: (budgets tried, the best plan, its point)."""
        count = 0
        for _ in range(REFINE_STEPS):
            if hi - lo <= 1:
                break
            mid = (lo + hi) // 2
            if step is not None:
                step(f"{copy_mode_label(copies).split(',')[0]}: budget {mid} bytes")
            count += 1
            try:
                candidate, plan = self.point(mid, copies)
            except BudgetUnreachable:
                lo = mid
                continue
            if candidate.slowdown > limit:
                lo = mid
                continue
            hi = mid
            if candidate.peak_bytes < best_point.peak_bytes:
                best_point, best_plan = candidate, plan
        return count, best_plan, best_point


def plan_within_slowdown(
    analysis: Analysis,
    request: PlanRequest,
    points: int = DEFAULT_POINTS,
    *,
    selection: Selection | None = None,
    progress: Progress = NO_PROGRESS,
) -> PlanOutcome:
    """The scheduled plan with the largest cut in peak memory whose estimated time, under
    ``request.copies``, is at most ``request.budget.max_slowdown`` times the baseline (``plan
    --max-slowdown``); the figures go into ``plan["budget"]["max_slowdown"]`` and
    ``options.filter.max_slowdown``."""
    max_slowdown, copies = request.budget.max_slowdown, request.copies
    assert max_slowdown is not None  # a request sent here has one
    trade = Tradeoff(analysis, request, selection=selection)
    step = None if progress.step is None else (lambda text: progress.report(text, new=False))
    plan, point, tried = trade.within(max_slowdown, copies, points, step=step)
    within = point.peak_bytes < trade.peak_bytes
    if point.weights_added:
        logger.warning("activations alone cannot fit the budget chosen: weights were considered too (as with --params)")
    if not within:
        logger.warning(
            "no cut in peak memory keeps the estimated time within %.3gx the baseline (%s, profile %s): "
            "the plan offloads nothing (offloadctl frontier MODEL shows what each cut costs)",
            max_slowdown,
            copy_mode_label(copies),
            trade.profile.name,
        )
    for options in (plan["options"]["filter"], plan["history"][-2]["options"]):
        options["max_slowdown"] = float(max_slowdown)
    plan["budget"]["max_slowdown"] = {
        "requested": float(max_slowdown),
        "copies": copies,
        "profile": trade.profile.name,
        "baseline_s": point.baseline_s,
        "time_s": point.time_s,
        "slowdown": point.slowdown,
        "within": within,
        "budget_bytes": point.budget_bytes if within else None,
        "peak_before_bytes": trade.peak_bytes,
        "peak_bytes": point.peak_bytes,
        "budgets_tried": tried,
    }
    return PlanOutcome(plan)
