"""Where `offloadctl plan MODEL --params` spends its time: each phase the command runs, timed in one
process through the library, with the garbage collector held as the command holds it.

Phases: load and analyse, the distance plan, the simulation behind the verdict line (with the
figures of what runs), writing the plan, and the weak plan's next step (a budget plan, made and
simulated, when the plan lowers the peak by under 5%). Each is printed in seconds and as a share of
the whole, so the shares compare across machines; absolute times on a shared machine are noise.

    python bench/plan_phases.py MODEL.onnx
    python bench/plan_phases.py --nodes 100000 --hidden 8    # a generated model (bench/gen_large.py)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from offloadctl.contract.document import write_plan  # noqa: E402
from offloadctl.core.bulk import keep_what_is_built  # noqa: E402
from offloadctl.job import Job, next_step, run_order_figures  # noqa: E402
from offloadctl.planning.make import plan_for  # noqa: E402
from offloadctl.planning.request import PlanRequest  # noqa: E402
from offloadctl.simulation.result import simulate  # noqa: E402

import gen_large  # noqa: E402

__all__ = ["main"]


def phases(model: Path, out: Path) -> list[tuple[str, float]]:
    """(phase, seconds) of `offloadctl plan MODEL --params`, in the order the command runs them."""
    keep_what_is_built()
    marks: list[tuple[str, float]] = []
    start = time.perf_counter()

    def mark(what: str) -> None:
        nonlocal start
        now = time.perf_counter()
        marks.append((what, now - start))
        start = now

    analysis = Job.of_model(model).analysis
    mark("load and analyse")
    request = PlanRequest(params=True)
    plan = plan_for(analysis, request).plan
    mark("distance plan")
    result = simulate(analysis, plan, profile=request.device_profile)
    run_order_figures(plan, analysis, result, request)
    mark("verdict simulation")
    write_plan(out, plan)
    mark("write the plan")
    next_step(analysis, plan, result, request)
    mark("next step")
    return marks


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
    total = sum(s for _, s in marks)
    for what, seconds in marks:
        print(f"{what:20s} {seconds:6.2f} s  {100 * seconds / total:5.1f}%")
    print(f"{'all':20s} {total:6.2f} s")


if __name__ == "__main__":
    main()
