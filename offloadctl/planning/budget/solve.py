"""One budget search, start to end (`solve`): the choices it does not make (streamed weights, forced
tensors), the greedy to the budget, the pruning, the exact program when asked, and the prefetches
placed, over a `offloadctl.planning.budget.search.Planner`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from offloadctl.analysis import timeline
from offloadctl.analysis.graph import Analysis
from offloadctl.planning.budget.candidates import (
    Cand,
    State,
    span_changes,
    spans_in_state,
)
from offloadctl.planning.budget.exact import ExactReport, solve_exact
from offloadctl.planning.budget.search import Planner
from offloadctl.planning.request import FilterRequest, Progress
from offloadctl.simulation.costs import CopyCost, CopyTiming

__all__ = ["Outcome", "solve"]


@dataclass
class Outcome:
    planner: Planner
    fits: bool
    reachable: int | None = None  # the best peak reachable, when it does not fit
    bound: float | None = None
    exact: ExactReport | None = None


def solve(
    analysis: Analysis,
    cands: list[Cand],
    options: FilterRequest,
    progress: Progress,
    *,
    budget: int | None,
    stream: dict[str, State] | None,
    cost: CopyCost,
    timing: CopyTiming | None = None,
) -> Outcome:
    """One search at ``budget`` (given apart from the options': the trade-off searches at many budgets
    with one request), priced by ``cost``, with the options' distances, exact search and time limit;
    ``timing`` places prefetches for copies on streams (None: copies in line)."""
    prefetch_distance, release_distance = options.prefetch.prefetch_distance, options.prefetch.release_distance
    p = Planner(
        analysis, cands, release_distance, cost, lambda text: progress.report(text, new=False), lead=prefetch_distance
    )

    def place(limit: float) -> None:
        if timing is None:
            p.place_prefetch(limit, prefetch_distance, caps)
        else:
            p.place_prefetch_streams(limit, prefetch_distance, timing, caps)

    caps, pinned = _fixed_choices(p, cands, budget, stream)
    if budget is None:
        place(math.inf)
        return Outcome(p, True)
    if p.peak()[0] > budget:
        reachable = p.best_reachable()
        if reachable > budget:
            return Outcome(p, False, reachable=reachable)
    bound = p.cost_bound(budget) if not release_distance and cost.linear else None
    if not p.greedy(budget):  # a release hold can leave a step no interval frees
        return Outcome(p, False, reachable=p.best_reachable())
    p.report("fitting the budget: dropping offloads it does not need")
    p.prune(budget)
    exact = None
    if options.budget.optimal:
        p.report("fitting the budget: solving the exact program")
        exact, states = solve_exact(p, _program_base(p, pinned), pinned, budget, options.budget.time_limit)
        if states is not None:
            for i, st in enumerate(states):
                if st != p.state[i]:
                    p.set(i, st)
    p.report("fitting the budget: placing prefetches")
    place(budget)
    return Outcome(p, True, bound=bound, exact=exact)


def _fixed_choices(
    p: Planner, cands: list[Cand], budget: int | None, stream: dict[str, State] | None
) -> tuple[dict[str, int], set[int]]:
    """Set what the search does not choose: streamed weights (their lead, with a budget, capped at
    their depth and placed later) and forced tensors (their largest gap). Returns (the streamed
    weights' lead caps, the forced tensors the search has no interval of)."""
    caps: dict[str, int] = {}
    forced: list[int] = []
    for i, c in enumerate(cands):
        if stream and c.name in stream:
            p.fixed[i] = True
            if budget is None:
                p.set(i, stream[c.name])
            else:
                caps[c.name] = stream[c.name].distance
                p.set(i, State(True, stream[c.name].cuts, 0))
        elif c.forced:
            forced.append(i)
    pinned = {i for i in forced if not p.rows[i]}
    for i in forced:
        c = cands[i]
        if c.is_act and c.num_gaps:
            best = max(range(c.num_gaps), key=lambda k: (c.gap_len(k), -k))
            p.set(i, State(True, frozenset({best})))
        else:  # a weight, or a graph output nobody reads: its outer or trailing stretch
            p.set(i, State(True))
    return caps, pinned


def _program_base(p: Planner, pinned: set[int]) -> np.ndarray:
    """The profile with only the fixed choices applied: forced tensors the program decides on are
    taken back to not offloaded (without touching the planner)."""
    values = p.ws.values()
    firsts: list[int] = []
    lasts: list[int] = []
    sizes: list[int] = []
    for i, c in enumerate(p.cands):
        st = p.state[i]
        if p.fixed[i] or i in pinned or not st.offloaded:
            continue
        for s, e, delta in span_changes(
            spans_in_state(c, st, p.n, p.release), spans_in_state(c, State(), p.n, p.release), c.size
        ):
            firsts.append(s)
            lasts.append(e)
            sizes.append(delta)
    return values + timeline.sweep(p.n + 1, firsts, lasts, sizes)
