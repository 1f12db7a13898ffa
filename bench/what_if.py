"""What the command path would cost without its two largest parts, side by side in one run.

The command path is ``offloadctl plan MODEL -o PLAN --params`` and then ``offloadctl apply PLAN``; its
floor is ``onnx.load`` + ``onnx.save`` of the same model with its weights in one external data file,
measured by ``bench/bench_scale.py``'s own floor task. Next to them this runs two what-ifs:

- *no next step*: ``plan`` with the weak plan's next step (a budget plan made and simulated so
  that its figures are the ones the suggested command gives) replaced by one that gives None;
- *no rejected list either*: the same, with the plan written with an empty ``rejected`` list, and
  ``apply`` of that plan (so neither command builds, checks, writes or reads the entries).

Their plans are not ones to ship: the what-ifs say what the two parts cost, not that they can go.
Each task runs in a fresh process, timed from after its imports to its end; with ``--repeat N``
the tasks run N times, interleaved. Each ×floor figure is the path's time over the floor with the
same statistic: the fastest run of each task, and the median run of each.

    python bench/what_if.py MODEL.onnx --repeat 5
    python bench/what_if.py --nodes 100000 --hidden 8 --repeat 5    # a generated model
    python bench/what_if.py --json                                  # one JSON document on stdout
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_scale  # noqa: E402

import gen_large  # noqa: E402

__all__ = ["main"]

_CHILD = "--child"

#: (row, its plan task, its apply task)
PATHS = [
    ("as it is", "plan", "apply"),
    ("without the weak plan's next step", "plan-no-next-step", "apply"),
    ("also without writing and reading rejected", "plan-no-rejected", "apply-no-rejected"),
]
TASKS = ("floor", "plan", "plan-no-next-step", "plan-no-rejected", "apply", "apply-no-rejected")


def _child(task: str, model: str, work: str) -> float:
    """Run one command (a plan or apply task) in this (fresh) process; its seconds after the imports."""
    from offloadctl import pipeline
    from offloadctl._entry import main
    from offloadctl.cli import plan_cmd
    from offloadctl.contract import document

    plans = {t: os.path.join(work, f"{t}.json") for t in ("plan", "plan-no-next-step", "plan-no-rejected")}
    if task in ("plan-no-next-step", "plan-no-rejected"):
        pipeline.next_step = lambda *args, **kwargs: None  # the next-step pass then gives none
    if task == "plan-no-rejected":
        write = document.write_plan
        plan_cmd.write_plan = lambda path, plan: write(path, {**plan, "rejected": []})
    if task.startswith("plan"):
        argv = ["plan", model, "-o", plans[task], "--params", "--json"]
    else:
        plan = plans["plan-no-rejected" if task == "apply-no-rejected" else "plan"]
        folder = Path(work) / task
        folder.mkdir(exist_ok=True)
        for old in folder.iterdir():
            old.unlink()
        argv = ["apply", plan, "-o", str(folder / "model.onnx"), "--model", model, "--json"]
    start = time.perf_counter()
    try:
        main(argv)
    except SystemExit as exc:
        if exc.code:
            raise
    return time.perf_counter() - start


def _measure(task: str, model: Path, work: Path) -> tuple[float, dict | None]:
    """One task in a fresh process: its seconds, and the command's ``--json`` document (None for the floor)."""
    if task == "floor":
        return bench_scale._measure("floor", str(model), str(work / "floor.onnx"))["seconds"], None
    proc = subprocess.run(
        [sys.executable, __file__, _CHILD, task, str(model), str(work)], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise SystemExit(f"{task} failed:\n{proc.stderr[-4000:]}")
    *document, seconds = proc.stdout.strip().splitlines()
    return float(seconds), json.loads("\n".join(document)) if document else None


def measure(model: Path, repeat: int, console: Console) -> dict:
    """Every task ``repeat`` times, interleaved; the figures of each path by both statistics."""
    runs: dict[str, list[float]] = {task: [] for task in TASKS}
    next_steps: dict[str, bool] = {}  # plan task -> whether its last run gave a next step
    with tempfile.TemporaryDirectory(prefix="what_if_") as tmp:
        work = Path(tmp)
        for r in range(repeat):
            for task in TASKS:
                console.log(f"round {r + 1} of {repeat}: {task}")
                seconds, document = _measure(task, model, work)
                runs[task].append(seconds)
                if task.startswith("plan") and document is not None:
                    next_steps[task] = document.get("next_step") is not None
        plans = {t: json.loads((work / f"{t}.json").read_text()) for t in ("plan", "plan-no-rejected")}
    figures: dict[str, dict] = {}
    for name, stat in (("fastest", min), ("median", statistics.median)):
        floor = stat(runs["floor"])
        figures[name] = {
            "floor_s": floor,
            "paths": [
                {
                    "path": row,
                    "plan_s": stat(runs[plan]),
                    "apply_s": stat(runs[apply]),
                    "over_floor": (stat(runs[plan]) + stat(runs[apply])) / floor,
                }
                for row, plan, apply in PATHS
            ],
        }
    return {
        "model": str(model),
        "repeat": repeat,
        "rejected_entries": len(plans["plan"]["rejected"]["rows"]),
        "rejected_entries_what_if": len(plans["plan-no-rejected"]["rejected"]["rows"]),
        "next_step_given": next_steps,
        "runs_s": runs,
        **figures,
    }


def _table(result: dict) -> Table:
    table = Table(title=f"the command path over the load + save floor ({result['repeat']} rounds)")
    for column in ("path", "plan s", "apply s", "×floor, fastest", "×floor, median"):
        table.add_column(column, justify="left" if column == "path" else "right")
    for fastest, median in zip(result["fastest"]["paths"], result["median"]["paths"], strict=True):
        table.add_row(
            fastest["path"],
            f"{fastest['plan_s']:.2f}",
            f"{fastest['apply_s']:.2f}",
            f"{fastest['over_floor']:.2f}x",
            f"{median['over_floor']:.2f}x",
        )
    return table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", help="the model (default: a generated one)")
    parser.add_argument("--nodes", type=int, default=100_000, help="nodes of the generated model")
    parser.add_argument("--hidden", type=int, default=8, help="hidden size of the generated model")
    parser.add_argument("--repeat", type=int, default=3, help="rounds of every task")
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    args = parser.parse_args(argv)
    console = Console(stderr=True)
    with tempfile.TemporaryDirectory(prefix="what_if_model_") as tmp:
        if args.model is None:
            config = gen_large.LargeModelConfig(layers=gen_large.layers_for_nodes(args.nodes), hidden=args.hidden)
            console.log(f"generating {config.num_nodes} nodes, hidden {args.hidden}")
            model = gen_large.generate(Path(tmp) / "model.onnx", config).path
        else:
            model = Path(args.model).resolve()
        result = measure(model, max(1, args.repeat), console)
    if args.json:
        print(json.dumps(result, indent=1))
        return
    Console().print(_table(result))
    fastest, median = result["fastest"]["floor_s"], result["median"]["floor_s"]
    Console().print(
        f"floor {fastest:.2f} s fastest, {median:.2f} s median; the plan lists {result['rejected_entries']} "
        "rejections. The what-ifs' plans are not ones to ship."
    )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == _CHILD:
        print(_child(*sys.argv[2:5]))
    else:
        main()
