"""The exact budget search: an integer covering program, solved by HiGHS (highspy).

The budget strategy's choice (which intervals to offload so every step fits the budget, at the
least cost) is an integer program over 0/1 *columns* (offload a candidate at all; offload one of
its intervals) whose chosen columns free bytes on ranges of steps. `CoverProblem` states it
neutrally: columns with a cost, *terms* (column, first step, last step, bytes freed per unit of
the column), the bytes each step is over the budget before any choice, and extra linear rows
(an interval needs its candidate offloaded, ...).

Memory is written as a running sum over steps, not a row per step per interval: steps are cut
into segments wherever some term starts or ends, a continuous variable R_j holds the bytes freed
in segment j, and row j says R_j = R_(j-1) + (terms starting at j) - (terms ending just before j).
Each term adds two nonzeros, so the program has O(steps + intervals) nonzeros. R_j is bounded
below by the segment's largest excess: the budget holds at every step.

The time limit is a promise. HiGHS honours its own ``time_limit`` between steps, but some of its
root-node work (cut separation with conflict analysis, on big symmetric programs) can run for
minutes without looking at the clock or at an interrupt. So the solver runs in a child process
(forked where the platform has fork): it reports every improving plan as it finds it, and the
parent stops it at the limit (plus a short grace) and keeps the best plan reported, with the bound
HiGHS had proven by then. HiGHS prints a banner on the standard output when a solver is first
created; the child sends it to /dev/null (a ``--json`` document must be alone on stdout).
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = ["CoverProblem", "CoverSolution", "solve_cover"]

_GRACE_S = 2.0  # past the time limit, how long the child may take to stop on its own


@dataclass
class CoverProblem:
    """An integer covering program over steps (see the module docstring).

    Attributes:
        steps: number of steps.
        excess: per step, bytes above the budget before any choice (<= 0: the step fits).
        cost: per column, its cost in the objective.
        lower, upper: per column, its bounds.
        integer: per column, whether it must be a whole number.
        term_column, term_first, term_last, term_bytes: freed bytes: column c frees
            ``term_bytes`` x (its value) at every step first..last (negative: holds memory).
        rows: extra rows (columns, coefficients, lower, upper).
    """

    steps: int
    excess: np.ndarray
    cost: list[float] = field(default_factory=list)
    lower: list[float] = field(default_factory=list)
    upper: list[float] = field(default_factory=list)
    integer: list[bool] = field(default_factory=list)
    term_column: list[int] = field(default_factory=list)
    term_first: list[int] = field(default_factory=list)
    term_last: list[int] = field(default_factory=list)
    term_bytes: list[float] = field(default_factory=list)
    rows: list[tuple[list[int], list[float], float, float]] = field(default_factory=list)

    def column(self, cost: float, *, lower: float = 0.0, upper: float = 1.0, integer: bool = True) -> int:
        self.cost.append(cost)
        self.lower.append(lower)
        self.upper.append(upper)
        self.integer.append(integer)
        return len(self.cost) - 1

    def frees(self, column: int, first: int, last: int, nbytes: float) -> None:
        if first <= last:
            self.term_column.append(column)
            self.term_first.append(first)
            self.term_last.append(last)
            self.term_bytes.append(nbytes)

    def row(self, columns: list[int], coefficients: list[float], lower: float, upper: float) -> None:
        self.rows.append((columns, coefficients, lower, upper))

    def _segments(self) -> tuple[np.ndarray, np.ndarray]:
        """(first step of each segment, largest excess in it)."""
        cuts = np.unique(
            np.concatenate(
                (
                    [0],
                    np.asarray(self.term_first, dtype=np.int64),
                    np.asarray(self.term_last, dtype=np.int64) + 1,
                )
            )
        )
        cuts = cuts[cuts < self.steps]
        need = np.maximum.reduceat(np.asarray(self.excess, dtype=np.float64), cuts) if self.steps else np.zeros(0)
        return cuts, need


@dataclass
class CoverSolution:
    """What HiGHS returned."""

    status: str  # "optimal", "time-limit", "infeasible", or another HiGHS model status in words
    values: np.ndarray | None  # per column of the problem (None when no solution was found)
    objective: float | None
    bound: float | None  # proven lower bound on the objective
    seconds: float
    columns: int
    rows: int
    nonzeros: int


@contextlib.contextmanager
def _quiet_stdout() -> Iterator[None]:
    """Send file descriptor 1 to /dev/null (HiGHS writes its banner there from C++)."""
    sys.stdout.flush()
    saved = os.dup(1)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def _model(problem: CoverProblem) -> dict[str, Any]:
    """The program as HiGHS arrays (column-wise), with the running-sum columns and rows added."""
    cuts, need = problem._segments()
    segments = len(cuts)
    ncols = len(problem.cost)
    nrows = segments + len(problem.rows)
    cost = np.concatenate((np.asarray(problem.cost, dtype=np.float64), np.zeros(segments)))
    lower = np.concatenate((np.asarray(problem.lower, dtype=np.float64), need))
    upper = np.concatenate((np.asarray(problem.upper, dtype=np.float64), np.full(segments, np.inf)))
    integer = np.concatenate((np.asarray(problem.integer, dtype=bool), np.zeros(segments, dtype=bool)))
    row_index: list[np.ndarray] = []
    col_index: list[np.ndarray] = []
    coef: list[np.ndarray] = []
    # running-sum rows j: R_j - R_(j-1) - (terms starting at j) + (terms ending just before j) = 0
    seg = np.arange(segments)
    row_index += [seg, seg[1:]]
    col_index += [ncols + seg, ncols + seg[1:] - 1]
    coef += [np.ones(segments), -np.ones(max(segments - 1, 0))]
    if problem.term_column:
        tcol = np.asarray(problem.term_column, dtype=np.int64)
        tbytes = np.asarray(problem.term_bytes, dtype=np.float64)
        end = np.asarray(problem.term_last, dtype=np.int64) + 1
        inside = end < problem.steps
        row_index += [
            np.searchsorted(cuts, np.asarray(problem.term_first, dtype=np.int64)),
            np.searchsorted(cuts, end[inside]),
        ]
        col_index += [tcol, tcol[inside]]
        coef += [-tbytes, tbytes[inside]]
    for k, (cols, coefs, _, _) in enumerate(problem.rows):
        row_index.append(np.full(len(cols), segments + k))
        col_index.append(np.asarray(cols, dtype=np.int64))
        coef.append(np.asarray(coefs, dtype=np.float64))
    rows = np.concatenate(row_index)
    cols = np.concatenate(col_index)
    vals = np.concatenate(coef)
    # sort by column, merging entries of one column in one row (a term ending where another starts)
    key = cols * nrows + rows
    order = np.argsort(key, kind="stable")
    unique, first = np.unique(key[order], return_index=True)
    vals = np.add.reduceat(vals[order], first) if len(vals) else vals
    cols, rows = unique // max(nrows, 1), unique % max(nrows, 1)
    return {
        "num_col": ncols + segments,
        "num_row": nrows,
        "cost": cost,
        "lower": lower,
        "upper": upper,
        "integer": integer,
        "row_lower": np.concatenate((np.zeros(segments), np.asarray([r[2] for r in problem.rows], dtype=np.float64))),
        "row_upper": np.concatenate((np.zeros(segments), np.asarray([r[3] for r in problem.rows], dtype=np.float64))),
        "start": np.searchsorted(cols, np.arange(ncols + segments + 1)).astype(np.int32),
        "index": rows.astype(np.int32),
        "value": vals,
        "problem_columns": ncols,
        "cuts": cuts,
    }


def _run(
    model: dict[str, Any],
    start: np.ndarray | None,
    time_limit: float,
    integral_objective: bool,
    options: dict[str, bool | float | str] | None,
    send: Callable[[tuple], None],
) -> tuple:
    """Solve ``model`` with HiGHS; improving solutions go to ``send``; returns the final message."""
    with _quiet_stdout():
        import highspy

        h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", float(time_limit))
    h.setOptionValue("mip_rel_gap", 0.0 if integral_objective else 1e-7)
    h.setOptionValue("mip_abs_gap", 0.999 if integral_objective else 0.0)
    for key, value in (options or {}).items():
        h.setOptionValue(key, value)
    lp = highspy.HighsLp()
    lp.num_col_ = model["num_col"]
    lp.num_row_ = model["num_row"]
    lp.col_cost_ = model["cost"]
    lp.col_lower_ = model["lower"]
    lp.col_upper_ = np.where(np.isinf(model["upper"]), highspy.kHighsInf, model["upper"])
    lp.row_lower_ = np.where(np.isinf(model["row_lower"]), -highspy.kHighsInf, model["row_lower"])
    lp.row_upper_ = np.where(np.isinf(model["row_upper"]), highspy.kHighsInf, model["row_upper"])
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = model["start"]
    lp.a_matrix_.index_ = model["index"]
    lp.a_matrix_.value_ = model["value"]
    lp.integrality_ = [
        highspy.HighsVarType.kInteger if i else highspy.HighsVarType.kContinuous for i in model["integer"]
    ]
    h.passModel(lp)
    ncols = model["problem_columns"]
    if start is not None:
        sol = highspy.HighsSolution()
        sol.col_value = list(start)
        sol.value_valid = True
        h.setSolution(sol)

    def improved(event: Any) -> None:
        out = event.data_out
        bound = float(out.mip_dual_bound)
        send(
            (
                "improved",
                float(out.objective_function_value),
                bound if np.isfinite(bound) else None,
                np.asarray(out.mip_solution[:ncols], dtype=np.float64),
            )
        )

    h.cbMipImprovingSolution.subscribe(improved)
    h.run()
    status = h.getModelStatus()
    info = h.getInfo()
    words = {
        highspy.HighsModelStatus.kOptimal: "optimal",
        highspy.HighsModelStatus.kTimeLimit: "time-limit",
        highspy.HighsModelStatus.kInfeasible: "infeasible",
    }.get(status) or h.modelStatusToString(status)
    values = objective = None
    if info.primal_solution_status == 2:  # a feasible solution
        values = np.asarray(h.getSolution().col_value[:ncols], dtype=np.float64)
        objective = float(info.objective_function_value)
    bound = float(info.mip_dual_bound)
    return ("done", words, objective, bound if np.isfinite(bound) else None, values)


def _child(conn: Any, model: dict[str, Any], start: Any, time_limit: float, integral: bool, options: Any) -> None:
    code = 0
    try:
        conn.send(_run(model, start, time_limit, integral, options, conn.send))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which decides
        code = 1
        with contextlib.suppress(Exception):
            conn.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        conn.close()
        os._exit(code)  # no atexit handlers, no second flush of the parent's buffers


def solve_cover(
    problem: CoverProblem,
    *,
    start: np.ndarray | None = None,
    time_limit: float = 60.0,
    integral_objective: bool = False,
    options: dict[str, bool | float | str] | None = None,
) -> CoverSolution:
    """Solve ``problem`` with HiGHS in at most ``time_limit`` seconds (plus a short grace), starting
    from ``start`` (problem column values).

    ``integral_objective``: every feasible objective is a whole number, so a gap below 1 proves
    optimality. ``options``: more HiGHS options.
    """
    model = _model(problem)
    full_start = None
    if start is not None:
        full_start = np.concatenate((np.asarray(start, dtype=np.float64), _running_sums(problem, model["cuts"], start)))
    sizes = (model["num_col"], model["num_row"], len(model["value"]))
    t0 = time.perf_counter()
    if "fork" not in multiprocessing.get_all_start_methods():  # pragma: no cover - Linux has fork
        answer = _run(model, full_start, time_limit, integral_objective, options, lambda message: None)
        return _solution(answer, None, time.perf_counter() - t0, sizes)
    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    sys.stdout.flush()
    sys.stderr.flush()
    child = ctx.Process(
        target=_child, args=(send, model, full_start, time_limit, integral_objective, options), daemon=True
    )
    child.start()
    send.close()
    best: tuple[Any, ...] | None = None
    final: tuple[Any, ...] | None = None
    deadline = t0 + time_limit + _GRACE_S
    try:
        while final is None:
            left = deadline - time.perf_counter()
            if left <= 0 or not receive.poll(left):
                break
            try:
                message = receive.recv()
            except EOFError:
                break
            if message[0] == "improved":
                best = message
            else:
                final = message
    finally:
        if child.is_alive():
            child.kill()
        child.join()
        receive.close()
    if final is not None and final[0] == "error":
        raise RuntimeError(f"HiGHS failed: {final[1]}")
    return _solution(final, best, time.perf_counter() - t0, sizes)


def _solution(final: tuple | None, best: tuple | None, seconds: float, sizes: tuple[int, int, int]) -> CoverSolution:
    if final is not None:
        _, status, objective, bound, values = final
        return CoverSolution(status, values, objective, bound, seconds, *sizes)
    # stopped at the time limit while HiGHS was not looking at the clock: its last report stands
    if best is None:
        return CoverSolution("time-limit", None, None, None, seconds, *sizes)
    _, objective, bound, values = best
    return CoverSolution("time-limit", values, objective, bound, seconds, *sizes)


def _running_sums(problem: CoverProblem, cuts: np.ndarray, values: np.ndarray) -> np.ndarray:
    """R_j of each segment for given column values (a consistent starting point)."""
    diff = np.zeros(len(cuts) + 1)
    if problem.term_column:
        amount = np.asarray(problem.term_bytes) * np.asarray(values)[np.asarray(problem.term_column)]
        np.add.at(diff, np.searchsorted(cuts, np.asarray(problem.term_first)), amount)
        end = np.asarray(problem.term_last) + 1
        np.add.at(diff, np.searchsorted(cuts, end), -amount)
    return np.cumsum(diff)[: len(cuts)]
