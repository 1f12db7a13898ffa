"""The exact budget search: the greedy's choice written as an integer covering program
(`offloadctl.planning.budget.optimal`), solved from the greedy's states within a time limit, and its
answer checked in exact integer bytes before it is trusted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from offloadctl.analysis import timeline
from offloadctl.core.plantypes import Solver
from offloadctl.planning.budget.candidates import Cand, Intervals, State, span_changes, spans_in_state
from offloadctl.simulation.costs import CopyCost

__all__ = ["ExactReport", "solve_exact"]


class Planner(Protocol):
    """What the exact search reads of the greedy's planner (`offloadctl.planning.budget.search.Planner`)."""

    n: int
    cands: list[Cand]
    release: int
    cost: CopyCost
    state: list[State]
    fixed: np.ndarray
    iv: Intervals
    rows: list[list[int]]

    def state_cost(self, i: int, st: State | None = None, cost: CopyCost | None = None) -> float: ...
    def moved(self, cost: CopyCost | None = None) -> float: ...
    def _row_ranges(self, j: int) -> list[timeline.Span]: ...


_TIME_SCALE = 1e6  # the time objective goes to HiGHS in microseconds (costs near 1 solve better)


@dataclass
class ExactReport:
    """What the exact search did."""

    status: str
    seconds: float
    time_limit: float
    columns: int
    rows: int
    nonzeros: int
    bound: float | None  # proven lower bound on the cost, in the objective's unit
    answer: str  # "accepted", or why the greedy's plan was kept

    def to_json(self) -> Solver:
        return {
            "name": "HiGHS",
            "status": self.status,
            "seconds": round(self.seconds, 3),
            "time_limit_s": self.time_limit,
            "columns": self.columns,
            "rows": self.rows,
            "nonzeros": self.nonzeros,
            "answer": self.answer,
        }


@dataclass
class _Program:
    """The covering program being written: its columns' starting values and which column stands for
    each candidate (y: offloaded at all) and interval (x)."""

    prob: Any
    scale: float
    start: list[float] = field(default_factory=list)
    y_of: dict[int, int] = field(default_factory=dict)
    x_of: dict[int, int] = field(default_factory=dict)


def solve_exact(
    p: Planner, base: np.ndarray, pinned: set[int], budget: int, time_limit: float
) -> tuple[ExactReport, list[State] | None]:
    """Solve the choice exactly from the greedy's states; returns the solver's states if they beat them.

    ``base``: the profile with only the fixed choices (streamed weights, ``pinned`` forced tensors)
    applied; every other candidate starts not offloaded in the program.
    """
    from offloadctl.planning.budget.optimal import CoverProblem, solve_cover

    program = _Program(CoverProblem(steps=p.n + 1, excess=base - budget), 1.0 if p.cost.integral else _TIME_SCALE)
    for i, c in enumerate(p.cands):
        if not (p.fixed[i] or i in pinned or not p.rows[i]):
            _add_candidate(program, p, i, c)
    prob, start = program.prob, program.start
    solution = solve_cover(prob, start=np.asarray(start), time_limit=time_limit, integral_objective=p.cost.integral)
    bound = solution.bound / program.scale if solution.bound is not None else None
    report = ExactReport(
        solution.status, solution.seconds, time_limit, solution.columns, solution.rows, solution.nonzeros, bound, ""
    )
    if solution.values is None:
        report.answer = "no solution found in the time limit: the greedy's plan is kept"
        return report, None
    chosen = _solved_states(p, program, solution.values)
    peak = _exact_peak(p, base, chosen, pinned)
    if peak > budget:
        report.answer = (
            f"rejected: its plan peaks at {peak} bytes > budget {budget} (solver tolerance); the greedy's plan is kept"
        )
        return report, None
    if sum(p.state_cost(i, s) for i, s in enumerate(chosen)) >= p.moved():
        report.answer = "no cheaper than the greedy's plan, which is kept"
        return report, None
    report.answer = "accepted"
    return report, chosen


def _solved_states(p: Planner, program: _Program, values: Any) -> list[State]:
    """Each candidate's state as the solver's ``values`` choose it (the greedy's for those not in the program)."""
    chosen = list(p.state)
    for i, y in program.y_of.items():
        cuts = frozenset(int(p.iv.gap[j]) for j in p.rows[i] if j in program.x_of and values[program.x_of[j]] > 0.5)
        chosen[i] = State(True, cuts) if values[y] > 0.5 else State()
    return chosen


def _add_candidate(program: _Program, p: Planner, i: int, c: Any) -> None:
    """Candidate ``i``'s columns (offloaded at all; each interval) and rows, started from the greedy."""
    iv, prob, start = p.iv, program.prob, program.start
    st = p.state[i]
    y = prob.column(float(iv.opening_cost[i]) * program.scale, lower=1.0 if c.forced else 0.0)
    start.append(float(st.offloaded))
    program.y_of[i] = y
    gaps: list[tuple[int, int, int]] = []  # (entry, column, row)
    for j in p.rows[i]:
        g = int(iv.gap[j])
        if g < 0:
            for first, last in p._row_ranges(j):
                prob.frees(y, first, last, c.size)
            if c.is_act:
                gaps.append((int(iv.entry[j]), y, j))
            continue
        x = prob.column(float(iv.own_cost[j]) * program.scale)
        start.append(float(g in st.cuts))
        program.x_of[j] = x
        for first, last in p._row_ranges(j):
            prob.frees(x, first, last, c.size)
        prob.row([x, y], [1.0, -1.0], -math.inf, 0.0)  # an interval needs its tensor offloaded
        gaps.append((int(iv.entry[j]), x, j))
    if c.is_act and iv.opening[i] < 0:  # an activation is offloaded for the sake of its gaps
        cols = [col for _, col, _ in gaps]
        prob.row([y] + cols, [1.0] + [-1.0] * len(cols), -math.inf, 0.0)
    if c.is_act and p.release:
        _release_rows(program, p, c, gaps)


def _release_rows(program: _Program, p: Planner, c: Any, gaps: list[tuple[int, int, int]]) -> None:
    """The buffer is held release_distance steps past the first freed stretch:
    first_k = before_k - before_(k-1), before_k = "some stretch up to k is freed"."""
    prob, start = program.prob, program.start
    previous = None
    taken_before = 0.0
    for entry, col, _ in sorted(gaps):
        before = prob.column(0.0, integer=False)
        taken_before = max(taken_before, start[col])
        start.append(taken_before)
        prob.row([before, col], [1.0, -1.0], 0.0, math.inf)
        if previous is None:
            prob.row([before, col], [1.0, -1.0], -math.inf, 0.0)
        else:
            prob.row([before, previous], [1.0, -1.0], 0.0, math.inf)
            prob.row([before, previous, col], [1.0, -1.0, -1.0], -math.inf, 0.0)
        hold = (entry + 1, min(entry + p.release, max(p.n - 1, 0)))
        prob.frees(before, hold[0], hold[1], -c.size)
        if previous is not None:
            prob.frees(previous, hold[0], hold[1], c.size)
        previous = before


def _exact_peak(p: Planner, base: np.ndarray, states: list[State], pinned: set[int]) -> int:
    """The peak of ``states`` in exact integer bytes, recomputed from the spans (no incremental state)."""
    firsts: list[int] = []
    lasts: list[int] = []
    sizes: list[int] = []
    for i, (c, st) in enumerate(zip(p.cands, states)):
        if p.fixed[i] or i in pinned or not st.offloaded:
            continue
        for s, e, delta in span_changes(
            spans_in_state(c, State(), p.n, p.release), spans_in_state(c, st, p.n, p.release), c.size
        ):
            firsts.append(s)
            lasts.append(e)
            sizes.append(delta)
    values = np.asarray(base, dtype=np.int64) + timeline.sweep(p.n + 1, firsts, lasts, sizes)
    return int(values.max())
