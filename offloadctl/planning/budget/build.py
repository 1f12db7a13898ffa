"""The filtered plan one budget search makes (`build_plan`), its ``budget`` record (`BudgetResult`), and
the bytes a plan copies per run (`bytes_moved`).

A search (`Attempt`: its candidate set and `offloadctl.planning.budget.solve.Outcome`) is priced as
`Pricing` says; the record states the peak, the cost, the proven bound on the cost and why each offload
was chosen.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from offloadctl.contract.document import record_stage
from offloadctl.core.plantypes import BudgetRecord, FilterOptions, Objective, Offload, Plan, Solver
from offloadctl.planning.budget.candidates import plan_entry, reject
from offloadctl.planning.budget.prepared import Candidates, Prepared
from offloadctl.planning.budget.solve import Outcome
from offloadctl.planning.filter import first_use_key
from offloadctl.simulation.costs import BytesMoved, CopyCost, plan_cost

__all__ = ["Attempt", "BudgetResult", "Pricing", "build_plan", "bytes_moved"]


def bytes_moved(plan: Plan) -> int:
    """Bytes a plan copies per run: one D2H per activation, one H2D per reload group and output."""
    return int(plan_cost(plan, BytesMoved()))


@dataclass
class Attempt:
    """One search over one candidate set."""

    candidates: Candidates
    outcome: Outcome


@dataclass(frozen=True)
class Pricing:
    """What one search fits and how its plan is priced."""

    budget: int | None
    cost: CopyCost
    copies: str
    weights_added: bool


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
    objective: Objective = field(default_factory=lambda: BytesMoved().to_json())
    cost: float = 0.0
    cost_bound: float | None = None
    bound_source: str | None = None  # "steps" (the cheapest cover of the worst steps) or "solver"
    optimal: bool = False
    search: str = "greedy"
    solver: Solver | None = None
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


def build_plan(prepared: Prepared, attempt: Attempt, pricing: Pricing, *, searched: Outcome | None = None) -> Plan:
    """The filtered plan of one search's outcome, priced by ``pricing.cost``.

    ``searched``: the search whose bound (and solver) the plan reports, when its plan is another
    search's (the plan the bytes objective found, kept for the time objective).
    """
    options = prepared.options
    budget, cost, copies = pricing.budget, pricing.cost, pricing.copies
    new = record_stage(  # only the chosen offloads go into the new plan: the selected ones are not copied
        {**prepared.base, "offloads": []}, "filtered", "filter", _recorded(prepared, cost, copies, budget)
    )
    new["strategy"] = "budget"
    offloads, rejected, chosen = _entries(prepared, attempt, budget)
    new["offloads"] = offloads
    new["rejected"] = rejected
    planner = attempt.outcome.planner
    peak, pos = planner.peak()
    total = planner.moved(cost)
    result = BudgetResult(
        requested=budget,
        lower_bound=prepared.lower_bound,
        lower_bound_position=prepared.lower_bound_position,
        peak_before=prepared.peak_before,
        peak=int(peak),
        peak_position=pos,
        moved=bytes_moved(new),
        weights_added=pricing.weights_added,
        stream=attempt.candidates.stream_info,
        chosen=chosen,
        objective=cost.to_json(),
        cost=_round_cost(total, cost),
        copies=copies,
    )
    _record_bound(result, attempt.outcome if searched is None else searched, total, cost, budget, searched)
    new["budget"] = result.to_json(options.prefetch.prefetch_distance, options.prefetch.release_distance)
    return new


def _recorded(prepared: Prepared, cost: CopyCost, copies: str, budget: int | None) -> FilterOptions:
    options = prepared.options
    return {
        "select_num": options.filter.select_num,
        "min_bytes": prepared.floor.bytes,
        "strategy": "budget",
        "budget_bytes": budget,
        "profile": options.budget.device_profile.name if cost.objective == "time" or copies == "streams" else None,
        "objective": cost.objective,
        "copies": copies,
        "optimal": options.budget.optimal,
        "time_limit_s": float(options.budget.time_limit) if options.budget.optimal else None,
    }


def _entries(prepared: Prepared, attempt: Attempt, budget: int | None) -> tuple[list[Offload], list, dict[str, str]]:
    """The plan's offloads (in first-use order), its rejections (none unless ``prepared.listed``), and why
    each offload was chosen."""
    planner = attempt.outcome.planner
    found = attempt.candidates
    offloads: list[Offload] = []
    rejected = []
    if prepared.listed:
        handled = {c.name for c in found.cands} | {r["tensor"] for r in found.small}
        rejected = [dict(r) for r in found.rejected if r["tensor"] not in handled] + found.small
    chosen: dict[str, str] = {}
    for i, c in enumerate(found.cands):
        st = planner.state[i]
        if st.offloaded:
            offloads.append(plan_entry(c, st, prepared.analysis))
            if planner.fixed[i]:
                chosen[c.name] = "streamed weight (layer group)"
            elif c.forced:
                chosen[c.name] = "forced (--force)"
            else:
                chosen[c.name] = "needed to fit the budget"
        elif prepared.listed:
            why = "the peak fits the budget without it" if budget is not None else "no budget given"
            rejected.append(reject(c.name, c.kind, c.size, "budget-not-needed", why, c.entries))
    offloads.sort(key=first_use_key)
    for i, e in enumerate(offloads):
        e["id"] = i
    return offloads, rejected, chosen


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


def _round_cost(value: float, cost: CopyCost) -> float | int:
    return int(round(value)) if cost.integral else float(value)
