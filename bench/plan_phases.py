"""Where `offloadctl plan MODEL --params` spends its time: each phase the command runs, timed in one
process through the library, with the garbage collector held as the command holds it.

Phases: load and analyse (shape inference running beside it in a child, as in the command, and
converting every size), the distance plan, the simulation behind the verdict line (with the
figures of what runs), writing the plan, and the weak plan's next step (a budget plan, made and
simulated, when the plan lowers the peak by under 5%). Each is printed in seconds and as a share of
the whole, so the shares compare across machines; absolute times on a shared machine are noise.
The next step's own parts follow, indented: the budget planner's selection, its baseline memory
profile, its candidates, the search, building the plan, and the simulation of that plan (each
timed around the function the planner calls).

    python bench/plan_phases.py MODEL.onnx
    python bench/plan_phases.py --nodes 100000 --hidden 8    # a generated model (bench/gen_large.py)
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import offloadctl.pipeline  # noqa: E402
import offloadctl.planning.budget.prepared  # noqa: E402
import offloadctl.planning.budget.strategy  # noqa: E402
from offloadctl.contract.document import write_plan  # noqa: E402
from offloadctl.core.bulk import keep_what_is_built, paused_gc  # noqa: E402
from offloadctl.job import Job  # noqa: E402
from offloadctl.pipeline import _budget_step, suggested_budget  # noqa: E402
from offloadctl.planning.make import scheduled_plan  # noqa: E402
from offloadctl.planning.request import PlanRequest  # noqa: E402
from offloadctl.rewriting.figures import run_order_figures  # noqa: E402
from offloadctl.simulation.result import simulate  # noqa: E402

import gen_large  # noqa: E402

__all__ = ["main"]


_prepared = offloadctl.planning.budget.prepared
_strategy = offloadctl.planning.budget.strategy
#: the next step's parts: (label, the object holding the function, its name)
NEXT_STEP_PARTS = [
    ("selection", _prepared, "selection_for"),
    ("baseline profile", _prepared, "resident_profile"),
    ("candidates", _prepared, "candidates"),
    ("search", _strategy, "solve"),
    ("building the plan", _strategy, "build_plan"),
    ("simulating it", offloadctl.pipeline, "simulate"),
]


@contextlib.contextmanager
def timed_parts(parts: list[tuple[str, Any, str]], totals: dict[str, float]) -> Iterator[None]:
    """Add the seconds spent in each named function to ``totals`` while the block runs (the
    functions are wrapped where their callers look them up, and restored after)."""
    saved = [(holder, name, getattr(holder, name)) for _, holder, name in parts]

    def wrap(label: str, func: Any) -> Any:
        @functools.wraps(func)
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return func(*args, **kwargs)
            finally:
                totals[label] = totals.get(label, 0.0) + time.perf_counter() - start

        return timed

    try:
        for (label, holder, name), (_, _, func) in zip(parts, saved):
            setattr(holder, name, wrap(label, func))
        yield
    finally:
        for holder, name, func in saved:
            setattr(holder, name, func)


def phases(model: Path, out: Path) -> list[tuple[str, float]]:
    """(phase, seconds) of `offloadctl plan MODEL --params`, in the order the command runs them; the
    next step's parts (`NEXT_STEP_PARTS`) follow it, labelled with a leading "  "."""
    keep_what_is_built()
    marks: list[tuple[str, float]] = []
    start = time.perf_counter()

    def mark(what: str) -> None:
        nonlocal start
        now = time.perf_counter()
        marks.append((what, now - start))
        start = now

    analysis = Job.of_model(model, infer_ahead=True).analysis  # as the command opens it
    analysis.unknown_sizes()  # the command's first look at sizes, which waits for shape inference
    mark("load and analyse")
    request = PlanRequest.of_options(params=True)
    plan = scheduled_plan(analysis, request)
    mark("distance plan")
    result = simulate(analysis, plan, profile=request.budget.device_profile)
    run_order_figures(plan, analysis, result, request)
    mark("verdict simulation")
    write_plan(out, plan)
    mark("write the plan")
    parts: dict[str, float] = {}
    with timed_parts(NEXT_STEP_PARTS, parts), paused_gc():  # the command holds the collector here too
        # the next step's budget plan (`offloadctl.pipeline.next_step` gives only its command on a graph this big)
        _budget_step(analysis, suggested_budget(result.lower_bound_bytes, result.peak_before), request)
    mark("next step")
    return marks + [(f"  {label}", parts.get(label, 0.0)) for label, _, _ in NEXT_STEP_PARTS]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Phase times of offloadctl plan --params.")
    parser.add_argument("model", nargs="?", type=Path, help="the model (default: a generated one)")
    parser.add_argument("--nodes", type=int, default=100_000, help="nodes of the generated model")
    parser.add_argument("--hidden", type=int, default=8, help="hidden size of the generated model")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="offloadctl-phases-") as tmp:
        model = args.model
        if model is None:
            config = gen_large.LargeModelConfig(layers=gen_large.layers_for_nodes(args.nodes), hidden=args.hidden)
            model = gen_large.generate(Path(tmp) / "model.onnx", config).path
        marks = phases(model, Path(tmp) / "plan.json")
    total = sum(s for what, s in marks if not what.startswith(" "))
    for what, seconds in marks:
        print(f"{what:20s} {seconds:6.2f} s  {100 * seconds / total:5.1f}%")
    print(f"{'all':20s} {total:6.2f} s")


if __name__ == "__main__":
    main()
