"""Scale benchmark: planning and rewriting large models against the I/O floor of onnx load + save.

For several model sizes (transformer-like stacks from ``bench/gen_large.py``, weights in one
external data file) it measures, each in a fresh subprocess, side by side in one run:

- floor: ``onnx.load`` (with external data) + ``onnx.save`` to one external data file, i.e. the
  cost of reading and writing the same model with the same external-data handling;
- plan (library): ``load_model`` + ``analyse`` + ``make_plan`` + ``write_plan`` (default options),
  and the same with ``params=True`` (``--params``);
- plan (command line): ``offloadctl plan MODEL -o PLAN --params``, what users run: the library's
  work plus the simulation behind its verdict line (peak before and after, estimated time), whose
  figures it records in the plan for ``apply`` to quote;
- apply: ``offloadctl apply PLAN -o OUT --model MODEL`` on the ``--params`` plan, the output in
  another folder (so the weights are copied beside it);
- the budget path: ``offloadctl plan MODEL -o PLAN --params --budget B`` (B the budget a weak plan's
  next step suggests, halfway between the lower bound and the peak) and ``apply`` of its plan, which
  offloads thousands of tensors, so that apply writes their copies and order pins;
- peak memory (VmHWM) of the planning subprocess, next to the size of the graph proto without
  weights and the peak of a subprocess that only imports offloadctl; and, for one size, the
  planning peak of the same graph with about 10x the weight bytes. The command runs shape
  inference in a forked child (`offloadctl.core.ahead`): its peak is shown beside the command's,
  and its CPU time counts in the command's (the two share pages, so the sum overstates).

Every task runs in a fresh Python process, timed from after its imports (onnx, offloadctl and its
command line) to its end. With ``--repeat N`` the tasks run N times, interleaved, and each figure
is the fastest of its N runs (other work on the machine only ever adds time).

Figures are ratios measured on this machine in this run, not absolute claims. Goals (reported, not
asserted): ``offloadctl plan --params`` + ``apply``, and the budget path, within 2x the floor at 100k nodes; planning
memory independent of weight bytes. Each size runs twice, with ``--hidden`` and with the small weights
of ``--small-hidden``, where the floor is short and the fixed costs of the command show.

    python bench/bench_scale.py            # 1k, 10k, 100k nodes (a few minutes on 2 cores)
    python bench/bench_scale.py --quick    # small sizes, seconds
    python bench/bench_scale.py --sizes 100000 --repeat 3
    python bench/bench_scale.py --big      # adds a model with over 2 GiB of weights (disk!)
    python bench/bench_scale.py --json     # one JSON document on stdout (progress on stderr)
    python bench/bench_scale.py --sizes 100000 --repeat 4 --against HEAD~3

``--against REV`` compares this tree with a git revision side by side: the two commands
(``offloadctl plan MODEL --params`` and ``apply``) run from both source trees in turn, in every round,
on the same model, and the table gives each side's fastest time and their ratio, and for each path
the median of its CPU-time ratio round by round (``--json`` lists each round's): the two sides of
a round run back to back, so a slow turn of the machine slows both. These machines change speed by
more than the changes one measures, so two revisions compare only in one run.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gen_large  # noqa: E402

__all__ = ["main"]

_CHILD = "--child"


def _peak_rss() -> int:
    """Peak resident set size of this process in bytes (VmHWM)."""
    with open("/proc/self/status", encoding="ascii") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    import resource  # pragma: no cover - systems without /proc

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # pragma: no cover


def _children_cpu() -> float:
    """CPU seconds of this process's children that have ended (a command's forked helper)."""
    times = os.times()
    return times.children_user + times.children_system


def _child_peak() -> int:
    """The largest peak resident set size of this process's children that have ended, in bytes
    (0 for none): the child in which a command runs shape inference beside its analysis."""
    import resource

    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024


def _console_script():
    """The console script's function (`offloadctl ...`), and its commands imported."""
    try:
        from offloadctl._entry import main
    except ImportError:  # a revision from before the entry point had its own module
        from offloadctl.cli import main
    from offloadctl.cli import cli  # noqa: F401 - imported before the clock starts

    return main


def _child(task: str, args: list[str]) -> dict:
    """Run one measured task in this (fresh) process; return seconds and peak memory."""
    import onnx  # imported before the clock starts, like offloadctl below

    if task in ("plan", "import"):
        import offloadctl.analysis.graph
        import offloadctl.contract.document
        import offloadctl.loading.model
        import offloadctl.planning.make
        import offloadctl.planning.request
    console_script = _console_script() if task in ("plan-cli", "plan-budget", "apply", "import") else None

    def command(*argv: str) -> None:
        """The console script (`offloadctl ...`), as users run it."""
        try:
            console_script(list(argv))
        except SystemExit as exc:
            if exc.code:
                raise

    start, cpu_start, children_start = time.perf_counter(), time.process_time(), _children_cpu()
    if task == "import":
        pass
    elif task == "floor":
        model_path, out_path = args
        model = onnx.load(model_path)
        onnx.save(
            model,
            out_path,
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=Path(out_path).name + ".data",
        )
    elif task == "plan":
        model_path, out_path, params = args
        loaded = offloadctl.loading.model.load_model(model_path)
        analysis = offloadctl.analysis.graph.analyse(loaded)
        make = offloadctl.planning.make  # the planner's plan alone (make_plan in a revision before the pipeline)
        scheduled = getattr(make, "scheduled_plan", None) or make.make_plan
        request = getattr(offloadctl.planning.request.PlanRequest, "of_options", None)
        if request is not None:  # the request as composed data; keywords in a revision before it
            plan = scheduled(analysis, request(params=params == "params"))
        else:
            plan = scheduled(analysis, params=params == "params")
        offloadctl.contract.document.write_plan(out_path, plan)
    elif task == "plan-cli":
        model_path, out_path = args
        command("plan", model_path, "-o", out_path, "--params")
    elif task == "plan-budget":
        model_path, out_path, budget = args
        command("plan", model_path, "-o", out_path, "--params", "--budget", budget)
    elif task == "apply":
        plan_path, out_path, model_path = args
        command("apply", plan_path, "-o", out_path, "--model", model_path)
    else:
        raise SystemExit(f"unknown task {task}")
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    cpu += _children_cpu() - children_start  # the child that runs shape inference beside the analysis
    import offloadctl

    source = str(Path(offloadctl.__file__).resolve().parents[1])
    return {"seconds": seconds, "cpu_seconds": cpu, "peak": _peak_rss(), "child_peak": _child_peak(), "source": source}


def _measure(task: str, *args: str, source: Path | None = None) -> dict:
    """Run one task in a fresh process; ``source``: the source tree whose offloadctl it imports
    (None: the one this interpreter finds)."""
    env = None
    if source is not None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(source), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, __file__, _CHILD, task, *args], capture_output=True, text=True, check=False, env=env
    )
    if proc.returncode != 0:
        side = f" (revision tree {source})" if source is not None else ""
        raise SystemExit(f"{task}{side} failed:\n{proc.stderr[-4000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    if source is not None and Path(result["source"]) != source.resolve():
        raise SystemExit(f"{task} imported offloadctl from {result['source']}, not from the revision tree {source}")
    return result


#: the commands users run, timed from each source tree when comparing revisions: the default
#: path (``plan --params`` and apply of its plan) and the budget path, whose plan has thousands of
#: copies and order pins (``plan --params --budget`` and apply of its plan)
_COMMAND_TASKS = ("plan_cli", "apply", "plan_budget", "apply_budget")
_PATHS = {"default": ("plan_cli", "apply"), "budget": ("plan_budget", "apply_budget")}


def _fastest(runs: list[dict]) -> dict:
    """The fastest of several runs of one task (its own peak memory with it), with the least CPU
    time of those runs."""
    return {**min(runs, key=lambda r: r["seconds"]), "cpu_seconds": min(r["cpu_seconds"] for r in runs)}


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"  # pragma: no cover


def _bench_size(
    work: Path, nodes: int, hidden: int, console: Console, repeat: int = 1, against: Path | None = None
) -> dict:
    folder = work / f"n{nodes}_h{hidden}"
    folder.mkdir()
    out_dir = folder / "out"
    out_dir.mkdir()
    config = gen_large.LargeModelConfig(layers=gen_large.layers_for_nodes(nodes), hidden=hidden)
    console.log(f"generating {config.num_nodes} nodes, hidden {hidden}, {_fmt_bytes(config.weight_bytes)} of weights")
    gen = gen_large.generate(folder / "model.onnx", config)
    row = {"nodes": gen.num_nodes, "weights": gen.weight_bytes, "proto": gen.path.stat().st_size}
    runs: dict[str, list[dict]] = {name: [] for name in ("floor", "plan", "plan_params", *_COMMAND_TASKS)}
    if against is not None:
        runs.update({f"against_{name}": [] for name in _COMMAND_TASKS})
    for k in range(repeat):
        round_ = f" (round {k + 1} of {repeat})" if repeat > 1 else ""
        console.log(f"  load + save floor{round_}")
        runs["floor"].append(_measure("floor", str(gen.path), str(out_dir / "roundtrip.onnx")))
        for f in out_dir.iterdir():
            f.unlink()
        console.log("  plan")
        runs["plan"].append(_measure("plan", str(gen.path), str(folder / "plan.json"), ""))
        console.log("  plan --params")
        runs["plan_params"].append(_measure("plan", str(gen.path), str(folder / "plan_params.json"), "params"))
        # with a revision to compare: both trees' commands in turn, the first to run alternating by round
        sides = [("", None), ("against_", against)] if against is not None else [("", None)]
        if k % 2:
            sides.reverse()
        for prefix, source in sides:
            console.log(f"  offloadctl plan --params{' (revision)' if prefix else ''}")
            plan_path = folder / f"{prefix}plan_cli.json"
            runs[f"{prefix}plan_cli"].append(_measure("plan-cli", str(gen.path), str(plan_path), source=source))
        for prefix, source in sides:
            console.log(f"  apply{' (revision)' if prefix else ''}")
            _apply(runs[f"{prefix}apply"], folder / f"{prefix}plan_cli.json", out_dir, gen.path, source)
        budget = _next_budget(folder / "plan_cli.json")
        for prefix, source in sides:
            console.log(f"  offloadctl plan --params --budget {budget}{' (revision)' if prefix else ''}")
            plan_path = folder / f"{prefix}plan_budget.json"
            runs[f"{prefix}plan_budget"].append(
                _measure("plan-budget", str(gen.path), str(plan_path), budget, source=source)
            )
        for prefix, source in sides:
            console.log(f"  apply of the budget plan{' (revision)' if prefix else ''}")
            _apply(runs[f"{prefix}apply_budget"], folder / f"{prefix}plan_budget.json", out_dir, gen.path, source)
    row.update({task: _fastest(r) for task, r in runs.items()})
    if against is not None:
        row["rounds"] = {task: r for task, r in runs.items() if task.removeprefix("against_") in _COMMAND_TASKS}
    row["offloads"] = len(json.loads((folder / "plan_cli.json").read_text())["offloads"])
    row["budget"] = budget
    row["budget_offloads"] = len(json.loads((folder / "plan_budget.json").read_text())["offloads"])
    shutil.rmtree(folder)
    return row


def _apply(runs: list[dict], plan_path: Path, out_dir: Path, model: Path, source: Path | None) -> None:
    """Time one `offloadctl apply` of ``plan_path`` into ``out_dir`` (emptied after)."""
    runs.append(_measure("apply", str(plan_path), str(out_dir / "model.offload.onnx"), str(model), source=source))
    for f in out_dir.iterdir():
        f.unlink()


def _next_budget(plan_path: Path) -> str:
    """The budget a weak plan's next step suggests (halfway between the lower bound and the peak, in
    whole KiB), from the estimate ``offloadctl plan`` records in its plan: a plan that offloads
    thousands of tensors, so that apply writes thousands of copies and order pins."""
    # imported here, not at the top: the measured children run this file too, some with an older
    # revision's offloadctl, which may not have it
    try:
        from offloadctl.pipeline import suggested_budget
    except ImportError:  # a revision before the pipeline module
        from offloadctl.job import suggested_budget  # type: ignore[attr-defined,no-redef]

    estimate = json.loads(plan_path.read_text())["summary"]["estimate"]
    return f"{suggested_budget(estimate['lower_bound_bytes'], estimate['peak_bytes']['before']) // 1024}KiB"


def _memory_check(work: Path, nodes: int, hidden: int, console: Console) -> list[dict]:
    """Planning peak memory for the same graph with 1x and about 10x the weight bytes."""
    rows = []
    for h in (hidden, int(round(hidden * math.sqrt(10)))):
        folder = work / f"mem_h{h}"
        folder.mkdir()
        config = gen_large.LargeModelConfig(layers=gen_large.layers_for_nodes(nodes), hidden=h)
        console.log(f"memory check: {config.num_nodes} nodes, {_fmt_bytes(config.weight_bytes)} of weights")
        gen = gen_large.generate(folder / "model.onnx", config)
        m = _measure("plan", str(gen.path), str(folder / "plan.json"), "params")
        rows.append({"hidden": h, "weights": gen.weight_bytes, "proto": gen.path.stat().st_size, **m})
        shutil.rmtree(folder)
    return rows


def _against_figures(row: dict) -> dict:
    """This tree's commands against the revision's, measured in the same rounds: the revision's
    seconds, and the ratios (this tree / the revision) of wall time and of CPU time, for each command
    and for each path (`_PATHS`: its plan and its apply together), with the revision's path over the
    floor. Each is the fastest of its rounds."""
    figures: dict = {}
    for task in _COMMAND_TASKS:
        if f"against_{task}" not in row:
            continue
        ours, theirs = row[task], row[f"against_{task}"]
        figures.update(
            {
                f"{task}_s": theirs["seconds"],
                f"{task}_ratio": ours["seconds"] / theirs["seconds"],
                f"{task}_cpu_ratio": ours["cpu_seconds"] / theirs["cpu_seconds"],
            }
        )
    for name, tasks in _PATHS.items():
        if any(f"against_{t}" not in row for t in tasks):
            continue
        ours, theirs = (sum(row[f"{side}{t}"]["seconds"] for t in tasks) for side in ("", "against_"))
        ours_cpu, theirs_cpu = (sum(row[f"{side}{t}"]["cpu_seconds"] for t in tasks) for side in ("", "against_"))
        prefix = "" if name == "default" else f"{name}_"
        figures.update(
            {
                f"{tasks[0]}_plus_apply_over_floor": theirs / row["floor"]["seconds"],
                f"{prefix}both_ratio": ours / theirs,
                f"{prefix}both_cpu_ratio": ours_cpu / theirs_cpu,
            }
        )
        if "rounds" in row:
            figures[f"{prefix}both_paired_cpu_ratios"] = _paired(row["rounds"], tasks)
    return figures


def _paired(rounds: dict[str, list[dict]], tasks: tuple[str, ...]) -> list[float]:
    """The path's CPU-time ratio (this tree / the revision) in each round, the two sides of a round
    run back to back, sorted: their median drifts less with the machine's speed than the ratio of
    the fastest runs does."""
    count = len(rounds[tasks[0]])
    ratios = [
        sum(rounds[t][k]["cpu_seconds"] for t in tasks) / sum(rounds[f"against_{t}"][k]["cpu_seconds"] for t in tasks)
        for k in range(count)
    ]
    return sorted(ratios)


def _revision_tree(work: Path, revision: str) -> tuple[Path, str]:
    """The source tree of a git revision of this checkout, extracted under ``work``; and its commit."""
    root = Path(__file__).resolve().parents[1]
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        raise SystemExit(
            f"--against {revision}: not a commit of the git checkout {root} (give a commit, tag or branch)"
        ) from None
    tree = work / f"revision-{commit[:12]}"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(root), "archive", "--format=tar", commit], capture_output=True)
    if archive.returncode != 0:
        raise SystemExit(f"--against {revision}: git archive failed: {archive.stderr.decode(errors='replace').strip()}")
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(tree, filter="data")
    return tree, commit


def _summary(rows: list[dict], big: dict | None, memory: list[dict], baseline: int) -> dict:
    """The measurements with their ratios, as plain JSON values."""
    sized = []
    for row in rows + ([big] if big else []):
        floor = row["floor"]["seconds"]
        sized.append(
            {
                **{k: row[k] for k in ("nodes", "weights", "proto", "offloads")},
                "floor_s": floor,
                "plan_s": row["plan"]["seconds"],
                "plan_params_s": row["plan_params"]["seconds"],
                "plan_cli_s": row["plan_cli"]["seconds"],
                "apply_s": row["apply"]["seconds"],
                "plan_params_plus_apply_over_floor": (row["plan_params"]["seconds"] + row["apply"]["seconds"]) / floor,
                "plan_cli_plus_apply_over_floor": (row["plan_cli"]["seconds"] + row["apply"]["seconds"]) / floor,
                "budget": row["budget"],
                "budget_offloads": row["budget_offloads"],
                "plan_budget_s": row["plan_budget"]["seconds"],
                "apply_budget_s": row["apply_budget"]["seconds"],
                "plan_budget_plus_apply_over_floor": (row["plan_budget"]["seconds"] + row["apply_budget"]["seconds"])
                / floor,
                "plan_peak_rss": max(row["plan"]["peak"], row["plan_params"]["peak"]),
                "plan_cli_peak_rss": row["plan_cli"]["peak"],
                "plan_cli_child_peak_rss": row["plan_cli"].get("child_peak", 0),
                **({"against": _against_figures(row)} if "against_plan_cli" in row else {}),
            }
        )
    return {
        "sizes": sized,
        "import_peak_rss": baseline,
        "weights_check": [{k: m[k] for k in ("hidden", "weights", "proto", "peak", "seconds")} for m in memory],
        "weights_ratio": memory[1]["weights"] / memory[0]["weights"],
        "peak_ratio": memory[1]["peak"] / memory[0]["peak"],
    }


def _against_table(rows: list[dict], revision: str, commit: str, fastest: str) -> Table:
    table = Table(
        title=f"this tree / {revision} ({commit[:12]}), the same rounds{fastest}: ratio < 1 is faster (wall time; "
        "CPU: the path's CPU time, which the machine's other work does not add to; --json has the seconds)"
    )
    for col in (
        "nodes",
        "weights",
        "plan --params",
        "apply",
        "default path",
        "CPU",
        "CPU, rounds' median",
        "REV ×floor",
        "plan --budget",
        "apply",
        "budget path",
        "CPU",
        "CPU, rounds' median",
        "REV ×floor",
    ):
        table.add_column(col, justify="right")
    for row in rows:
        fig = _against_figures(row)
        table.add_row(
            f"{row['nodes']:,}",
            _fmt_bytes(row["weights"]),
            *(f"{fig[key]:.3f}" for key in ("plan_cli_ratio", "apply_ratio", "both_ratio", "both_cpu_ratio")),
            f"{statistics.median(fig['both_paired_cpu_ratios']):.3f}",
            f"{fig['plan_cli_plus_apply_over_floor']:.2f}",
            *(
                f"{fig[key]:.3f}"
                for key in ("plan_budget_ratio", "apply_budget_ratio", "budget_both_ratio", "budget_both_cpu_ratio")
            ),
            f"{statistics.median(fig['budget_both_paired_cpu_ratios']):.3f}",
            f"{fig['plan_budget_plus_apply_over_floor']:.2f}",
        )
    return table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Plan/apply time and planning memory on large generated models.")
    parser.add_argument("--quick", action="store_true", help="small sizes only (seconds)")
    parser.add_argument(
        "--big", action="store_true", help="also a model with over 2 GiB of weights (needs ~7 GiB disk)"
    )
    parser.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")], help="node counts, e.g. 1000,10000")
    parser.add_argument("--hidden", type=int, default=32, help="hidden size of the generated models (default 32)")
    parser.add_argument(
        "--small-hidden",
        type=int,
        default=8,
        help="also each size with this hidden size, whose small weights let the fixed costs show against the floor "
        "(default 8; 0: leave out)",
    )
    parser.add_argument("--workdir", type=Path, default=None, help="where to write the models (default: a temp dir)")
    parser.add_argument("--json", action="store_true", help="print the measurements as one JSON document (for CI)")
    parser.add_argument("--repeat", type=int, default=1, help="run every task N times and keep the fastest (default 1)")
    parser.add_argument(
        "--against",
        metavar="REV",
        help="also run the commands from git revision REV of this checkout, in turn with this tree's, and give "
        "the ratios (this tree / REV)",
    )
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    sizes = args.sizes or ([300, 3000] if args.quick else [1000, 10_000, 100_000])
    console = Console(stderr=True)
    out = Console() if sys.stdout.isatty() else Console(width=120)
    work = Path(tempfile.mkdtemp(prefix="offloadctl-bench-", dir=args.workdir))
    try:
        against, commit = _revision_tree(work, args.against) if args.against else (None, None)
        baseline = _measure("import")["peak"]
        small = [args.small_hidden] if args.small_hidden and args.small_hidden != args.hidden else []
        hiddens = [args.hidden, *small]
        rows = [_bench_size(work, n, h, console, args.repeat, against) for n in sizes for h in hiddens]
        big = None
        if args.big:
            # ~2.3 GiB of weights: hidden 1024 is 48 MiB per layer.
            big = _bench_size(work, 48 * gen_large.BASE_NODES_PER_LAYER + 2, 1024, console, args.repeat)
        memory = _memory_check(work, sizes[min(1, len(sizes) - 1)], args.hidden, console)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    if args.json:
        summary = _summary(rows, big, memory, baseline)
        if commit is not None:
            summary["against"] = {"revision": args.against, "commit": commit}
        print(json.dumps(summary, indent=1))
        return
    fastest = f", fastest of {args.repeat} runs each" if args.repeat > 1 else ""
    table = Table(title=f"time over the load + save floor (same run, same machine{fastest})")
    for col in (
        "nodes",
        "weights",
        "floor s",
        "plan s",
        "×floor",
        "plan --params s",
        "×floor",
        "offloadctl plan --params s",
        "×floor",
        "apply s",
        "library + apply ×floor",
        "command line + apply ×floor",
    ):
        table.add_column(col, justify="right")
    paths = Table(title=f"the two command paths over the floor (the same runs{fastest})")
    for col in (
        "nodes",
        "weights",
        "floor s",
        "plan --params s",
        "apply s",
        "×floor",
        "budget B",
        "plan --params --budget B s",
        "apply s",
        "×floor",
    ):
        paths.add_column(col, justify="right")
    memory_table = Table(title="planning peak memory (VmHWM of the planning process)")
    for col in (
        "nodes",
        "graph proto",
        "plan peak RSS",
        "peak − import-only",
        "÷ graph proto",
        "offloadctl plan peak RSS",
    ):
        memory_table.add_column(col, justify="right")
    for row in rows + ([big] if big else []):
        floor = row["floor"]["seconds"]
        cells = [
            f"{row['nodes']:,}",
            _fmt_bytes(row["weights"]),
            f"{floor:.2f}",
            f"{row['plan']['seconds']:.2f}",
            f"{row['plan']['seconds'] / floor:.2f}",
            f"{row['plan_params']['seconds']:.2f}",
            f"{row['plan_params']['seconds'] / floor:.2f}",
            f"{row['plan_cli']['seconds']:.2f}",
            f"{row['plan_cli']['seconds'] / floor:.2f}",
            f"{row['apply']['seconds']:.2f}",
            f"{(row['plan_params']['seconds'] + row['apply']['seconds']) / floor:.2f}",
            f"{(row['plan_cli']['seconds'] + row['apply']['seconds']) / floor:.2f}",
        ]
        table.add_row(*cells)
        paths.add_row(
            f"{row['nodes']:,}",
            _fmt_bytes(row["weights"]),
            f"{floor:.2f}",
            f"{row['plan_cli']['seconds']:.2f}",
            f"{row['apply']['seconds']:.2f}",
            f"{(row['plan_cli']['seconds'] + row['apply']['seconds']) / floor:.2f}",
            row["budget"],
            f"{row['plan_budget']['seconds']:.2f}",
            f"{row['apply_budget']['seconds']:.2f}",
            f"{(row['plan_budget']['seconds'] + row['apply_budget']['seconds']) / floor:.2f}",
        )
        peak = max(row["plan"]["peak"], row["plan_params"]["peak"])
        memory_table.add_row(
            f"{row['nodes']:,}",
            _fmt_bytes(row["proto"]),
            _fmt_bytes(peak),
            _fmt_bytes(peak - baseline),
            f"{(peak - baseline) / row['proto']:.1f}",
            _fmt_bytes(row["plan_cli"]["peak"])
            + (f" (+ child {_fmt_bytes(row['plan_cli']['child_peak'])})" if row["plan_cli"].get("child_peak") else ""),
        )
    out.print(table)
    out.print(
        "plan s and plan --params s: the library (load, analyse, make_plan, write_plan); offloadctl plan --params s: "
        "the command, which also simulates the plan for its verdict line. apply rewrites by the command's plan "
        f"({', '.join(str(r['offloads']) for r in rows)} offloads) into another folder, "
        "so it also copies the data file."
    )
    out.print(paths)
    out.print(
        "The default path: offloadctl plan --params and apply of its plan. The budget path: offloadctl plan --params "
        "--budget B, B the budget a weak plan's next step suggests (halfway between the lower bound and the peak), "
        f"and apply of its plan ({', '.join(str(r['budget_offloads']) for r in rows)} offloads, with their copies "
        "and order pins)."
    )
    if commit is not None:
        out.print(_against_table(rows, args.against, commit, fastest))
    out.print(memory_table)
    out.print(f"import-only peak RSS: {_fmt_bytes(baseline)}")

    mem = Table(title="planning peak memory vs weight bytes (same graph, other hidden size)")
    for col in ("hidden", "weights", "graph proto", "plan --params peak RSS", "plan s"):
        mem.add_column(col, justify="right")
    for m in memory:
        mem.add_row(
            str(m["hidden"]),
            _fmt_bytes(m["weights"]),
            _fmt_bytes(m["proto"]),
            _fmt_bytes(m["peak"]),
            f"{m['seconds']:.2f}",
        )
    out.print(mem)
    ratio = memory[1]["weights"] / memory[0]["weights"]
    growth = memory[1]["peak"] / memory[0]["peak"]
    out.print(f"weights x{ratio:.1f} -> planning peak x{growth:.2f}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == _CHILD:
        print(json.dumps(_child(sys.argv[2], sys.argv[3:])))
    else:
        main()
