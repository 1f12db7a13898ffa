"""Budget strategy benchmark: its speed against the distance strategy, and its quality against the old search.

One run prints, side by side:

1. Speed. On generated transformer-like models with weights (``bench/gen_large.py``, hidden size
   32), ``offloadctl plan MODEL --budget B --params`` with B halfway between the lower bound and
   the peak, against ``offloadctl plan MODEL --select-distance 100 --params`` on the same model.
   Each command runs in a fresh process, the two alternate, ``--repeat`` times; the ratio of the
   medians is reported for wall time and for CPU time (user + system of the child). Goal: at most
   3 at 10,000 and at 100,000 nodes.
2. Quality. Every case of ``bench/budget_cases.py`` (each sample and each generated benchmark
   model, budgets at 1.1x the lower bound and halfway to the peak, activations / ``--params`` /
   ``--stream-weights``) against ``bench/budget_reference.json``, the figures of the greedy search
   this one replaced: today's search must fit whenever the old one did and move no more bytes.
3. With ``--exact``: greedy against ``--optimal`` (HiGHS) on every case with weights, with the
   solve times and the gap; with ``--exact-scale 1000,3000,10000``: on generated models of those
   sizes, whether the exact search proves the optimum within ``--time-limit`` seconds.
4. Objectives (skip with ``--no-objectives``). On every case with weights and both copy modes
   (copies in line; copies on streams, an estimate not yet timed on a device), the
   simulated time of the plan ``--objective time`` makes against the plan ``--objective bytes``
   makes at the same budget, on ``--profile`` (default ascend-910b): the time objective must never
   be slower (the run exits 1 otherwise), and the table says by how much it is faster. On streams
   it also prices the prefetch placement: the bytes plan placed for copies in line (the longest lead
   the budget allows) against the same choice placed for the shared link. Search times are side by
   side (the time objective runs the bytes search too, to compare).

Timing figures are ratios measured in this run on this machine: on a busy machine they are noise,
re-run them on a quiet one. The quality comparison is deterministic; a case that got worse makes
the run exit 1.

    python bench/bench_budget.py                  # 10k and 100k nodes, 3 runs each; quality
    python bench/bench_budget.py --quick          # 1k and 3k nodes, 1 run each; quality
    python bench/bench_budget.py --exact          # adds greedy against exact on every case
    python bench/bench_budget.py --json           # one JSON document on stdout (progress on stderr)
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from offloadctl.analysis.graph import analyse  # noqa: E402
from offloadctl.analysis.timeline import lower_bound  # noqa: E402
from offloadctl.loading.model import load_model  # noqa: E402
from offloadctl.planning.request import PlanRequest  # noqa: E402
from offloadctl.simulation.memory import peak_memory  # noqa: E402

import budget_cases  # noqa: E402
import gen_large  # noqa: E402

__all__ = ["main"]

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = Path(__file__).resolve().parent / "budget_reference.json"
GOAL = 3.0


def _generate(folder: Path, nodes: int) -> Path:
    path = folder / f"gen-{nodes}.onnx"
    if not path.exists():
        config = gen_large.LargeModelConfig(layers=gen_large.layers_for_nodes(nodes), hidden=32)
        gen_large.generate(path, config)
    return path


def _halfway(path: Path) -> int:
    analysis = analyse(load_model(path))
    return (lower_bound(analysis)[0] + peak_memory(analysis)[0]) // 2


def _run(args: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of ``offloadctl ARGS`` in a fresh process."""
    before = os.times()
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "offloadctl", *args], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = os.times()
    if done.returncode != 0:
        raise RuntimeError(f"offloadctl {' '.join(args)} failed:\n{done.stderr}")
    return wall, (after.children_user - before.children_user) + (after.children_system - before.children_system)


def speed(sizes: list[int], repeat: int, folder: Path, progress: Console) -> list[dict[str, Any]]:
    rows = []
    for nodes in sizes:
        model = _generate(folder, nodes)
        budget = _halfway(model)
        runs: dict[str, list[tuple[float, float]]] = {"distance": [], "budget": []}
        commands = {
            "distance": [
                "plan",
                str(model),
                "-o",
                str(folder / "distance.json"),
                "--select-distance",
                "100",
                "--params",
            ],
            "budget": ["plan", str(model), "-o", str(folder / "budget.json"), "--budget", str(budget), "--params"],
        }
        for k in range(repeat):
            for name in ("distance", "budget") if k % 2 == 0 else ("budget", "distance"):
                progress.print(f"[dim]{nodes} nodes, run {k + 1}/{repeat}: {name}[/]")
                runs[name].append(_run(commands[name]))
        med = {
            name: (statistics.median(w for w, _ in r), statistics.median(c for _, c in r)) for name, r in runs.items()
        }
        plan = json.loads((folder / "budget.json").read_text())
        rows.append(
            {
                "nodes": nodes,
                "budget_bytes": budget,
                "offloads": len(plan["offloads"]),
                "distance_wall_s": [w for w, _ in runs["distance"]],
                "budget_wall_s": [w for w, _ in runs["budget"]],
                "distance_cpu_s": [c for _, c in runs["distance"]],
                "budget_cpu_s": [c for _, c in runs["budget"]],
                "ratio_wall": med["budget"][0] / med["distance"][0],
                "ratio_cpu": med["budget"][1] / med["distance"][1],
                "goal": GOAL,
            }
        )
    return rows


def quality(models: list[str] | None, folder: Path, progress: Console) -> list[dict[str, Any]]:
    reference = json.loads(REFERENCE.read_text(encoding="utf-8"))["cases"]
    rows = []
    loaded: dict[str, Any] = {}
    for case in budget_cases.cases(models):
        if case.key not in reference:
            continue
        if case.model not in loaded:
            loaded.clear()
            progress.print(f"[dim]quality: {case.model}[/]")
            loaded[case.model] = budget_cases.load(case.model, folder)
        now = budget_cases.run_case(loaded[case.model], case)
        old = reference[case.key]
        info = now.pop("plan_budget", None) or {}
        rows.append(
            {
                "case": case.key,
                "budget_bytes": now["budget"],
                "reference": {k: old.get(k) for k in ("fits", "bytes_moved", "seconds")},
                "now": {
                    "fits": now["fits"],
                    "bytes_moved": now.get("bytes_moved"),
                    "seconds": now["seconds"],
                    "cost_bound": info.get("cost_bound"),
                    "gap": info.get("gap"),
                },
                "fits_ok": now["fits"] or not old["fits"],
                "bytes_ok": not (old["fits"] and now["fits"]) or now["bytes_moved"] <= old["bytes_moved"],
            }
        )
    return rows


def exact(models: list[str] | None, folder: Path, time_limit: float, progress: Console) -> list[dict[str, Any]]:
    rows = []
    loaded: dict[str, Any] = {}
    for case in budget_cases.cases(models):
        if case.mode != "params":
            continue
        if case.model not in loaded:
            loaded.clear()
            loaded[case.model] = budget_cases.load(case.model, folder)
        progress.print(f"[dim]exact: {case.key}[/]")
        greedy = budget_cases.run_case(loaded[case.model], case)
        best = budget_cases.run_case(loaded[case.model], case, optimal=True, time_limit=time_limit)
        info = best["plan_budget"]
        rows.append(
            {
                "case": case.key,
                "nodes": loaded[case.model].num_positions,
                "greedy_bytes": greedy.get("bytes_moved"),
                "greedy_s": greedy["seconds"],
                "exact_bytes": best.get("bytes_moved"),
                "proven_optimal": info["optimal"],
                "gap": info["gap"],
                "solve_s": info["solver"]["seconds"],
                "status": info["solver"]["status"],
                "nonzeros": info["solver"]["nonzeros"],
            }
        )
    return rows


def exact_scale(sizes: list[int], folder: Path, time_limit: float, progress: Console) -> list[dict[str, Any]]:
    rows = []
    for nodes in sizes:
        analysis = analyse(load_model(_generate(folder, nodes)))
        for rule in budget_cases.RULES:
            progress.print(f"[dim]exact scale: {nodes} nodes, {rule}[/]")
            case = budget_cases.Case(f"gen-{nodes}", rule, "params")
            found = budget_cases.run_case(analysis, case, optimal=True, time_limit=time_limit)
            info = found["plan_budget"]
            rows.append(
                {
                    "nodes": analysis.num_positions,
                    "rule": rule,
                    "proven_optimal": info["optimal"],
                    "gap": info["gap"],
                    "solve_s": info["solver"]["seconds"],
                    "status": info["solver"]["status"],
                    "columns": info["solver"]["columns"],
                    "nonzeros": info["solver"]["nonzeros"],
                }
            )
    return rows


def objectives(models: list[str] | None, folder: Path, profile: str, progress: Console) -> list[dict[str, Any]]:
    """Simulated time of the time objective's plan against the bytes objective's, per case and copy mode."""
    from offloadctl.planning.make import scheduled_plan
    from offloadctl.simulation.profiles import load_profile
    from offloadctl.simulation.result import simulate

    prof = load_profile(profile)
    rows = []
    loaded: dict[str, Any] = {}
    for case in budget_cases.cases(models):
        if case.mode != "params":
            continue
        if case.model not in loaded:
            loaded.clear()
            loaded[case.model] = budget_cases.load(case.model, folder)
        analysis = loaded[case.model]
        budget = budget_cases.budget_for(analysis, case.rule)
        baseline = simulate(analysis, profile=prof).times.baseline
        for copies, key in (("inline", "serialized"), ("streams", "overlapped")):
            progress.print(f"[dim]objectives: {case.key}, copies {copies}[/]")
            found: dict[str, Any] = {}
            for objective in ("bytes", "time"):
                t0 = time.perf_counter()
                plan = scheduled_plan(
                    analysis,
                    PlanRequest.of_options(
                        budget=budget, params=True, objective=objective, copies=copies, profile=prof
                    ),
                )
                seconds = time.perf_counter() - t0
                found[objective] = (getattr(simulate(analysis, plan, profile=prof).times, key), seconds, plan)
            row = {
                "case": case.key,
                "nodes": analysis.num_positions,
                "copies": copies,
                "budget_bytes": budget,
                "baseline_s": baseline,
                "bytes": {
                    "time_s": found["bytes"][0],
                    "search_s": found["bytes"][1],
                    "bytes_moved": found["bytes"][2]["budget"]["bytes_moved"],
                },
                "time": {
                    "time_s": found["time"][0],
                    "search_s": found["time"][1],
                    "bytes_moved": found["time"][2]["budget"]["bytes_moved"],
                    "kept": found["time"][2]["budget"]["compared"]["kept"],
                },
            }
            row["never_slower"] = row["time"]["time_s"] <= row["bytes"]["time_s"] * (1 + 1e-12)
            row["shorter"] = 1 - row["time"]["time_s"] / row["bytes"]["time_s"]
            if copies == "streams":  # the same choice (bytes) placed for copies in line
                inline = scheduled_plan(
                    analysis,
                    PlanRequest.of_options(
                        budget=budget, params=True, objective="bytes", copies="inline", profile=prof
                    ),
                )
                row["longest_lead_s"] = simulate(analysis, inline, profile=prof).times.overlapped
            rows.append(row)
    return rows


def _bytes(n: Any) -> str:
    return "-" if n is None else f"{int(round(n)):,}"


def _pct(gap: Any) -> str:
    return "-" if gap is None else f"{100 * gap:.2f}%"


def _print(doc: dict[str, Any], console: Console) -> None:
    if doc["speed"]:
        table = Table(
            title=f"plan --budget (halfway) --params / plan --select-distance 100 --params (goal <= {GOAL:g})",
            title_justify="left",
        )
        for col in (
            "nodes",
            "offloads",
            "distance wall s",
            "budget wall s",
            "ratio wall",
            "distance cpu s",
            "budget cpu s",
            "ratio cpu",
        ):
            table.add_column(col, justify="right")
        for r in doc["speed"]:
            table.add_row(
                f"{r['nodes']:,}",
                f"{r['offloads']:,}",
                " ".join(f"{x:.1f}" for x in r["distance_wall_s"]),
                " ".join(f"{x:.1f}" for x in r["budget_wall_s"]),
                f"{r['ratio_wall']:.2f}",
                " ".join(f"{x:.1f}" for x in r["distance_cpu_s"]),
                " ".join(f"{x:.1f}" for x in r["budget_cpu_s"]),
                f"{r['ratio_cpu']:.2f}",
            )
        console.print(table)
    if doc["quality"]:
        _print_quality(doc, console)
    _print_more(doc, console)


def _print_quality(doc: dict[str, Any], console: Console) -> None:
    table = Table(
        title="quality against the old greedy (bench/budget_reference.json): bytes moved", title_justify="left"
    )
    for col in ("case", "budget", "old", "now", "proven bound", "gap", "old s", "now s", ""):
        table.add_column(col, justify="left" if col == "case" else "right")
    for r in doc["quality"]:
        old, now = r["reference"], r["now"]
        verdict = "ok" if r["fits_ok"] and r["bytes_ok"] else "WORSE"
        table.add_row(
            r["case"],
            _bytes(r["budget_bytes"]),
            _bytes(old["bytes_moved"]) if old["fits"] else "no fit",
            _bytes(now["bytes_moved"]) if now["fits"] else "no fit",
            _bytes(now["cost_bound"]),
            _pct(now["gap"]),
            f"{old['seconds']:.2f}",
            f"{now['seconds']:.2f}",
            verdict,
        )
    console.print(table)
    worse = [r["case"] for r in doc["quality"] if not (r["fits_ok"] and r["bytes_ok"])]
    console.print(
        f"quality: {len(doc['quality']) - len(worse)} of {len(doc['quality'])} cases fit whenever the old "
        f"search did and move no more bytes" + (f"; WORSE: {', '.join(worse)}" if worse else "")
    )


def _print_more(doc: dict[str, Any], console: Console) -> None:
    if doc["exact"]:
        table = Table(title="greedy against exact (--optimal, HiGHS): bytes moved", title_justify="left")
        for col in ("case", "nodes", "greedy", "greedy s", "exact", "proven", "gap", "solve s", "nonzeros"):
            table.add_column(col, justify="left" if col == "case" else "right")
        for r in doc["exact"]:
            table.add_row(
                r["case"],
                f"{r['nodes']:,}",
                _bytes(r["greedy_bytes"]),
                f"{r['greedy_s']:.2f}",
                _bytes(r["exact_bytes"]),
                "yes" if r["proven_optimal"] else r["status"],
                _pct(r["gap"]),
                f"{r['solve_s']:.2f}",
                f"{r['nonzeros']:,}",
            )
        console.print(table)
    if doc["objectives"]:
        table = Table(
            title=f"--objective time against --objective bytes at the same budget (--params, profile "
            f"{doc['profile']}): simulated time / baseline",
            title_justify="left",
        )
        for col in (
            "case",
            "copies",
            "bytes",
            "time",
            "time shorter",
            "kept",
            "search s bytes / time",
            "streams: longest lead",
            "",
        ):
            table.add_column(col, justify="left" if col in ("case", "copies", "kept") else "right")
        for r in doc["objectives"]:
            base = r["baseline_s"]
            lead = r.get("longest_lead_s")
            table.add_row(
                r["case"],
                r["copies"],
                f"{r['bytes']['time_s'] / base:.3f}x",
                f"{r['time']['time_s'] / base:.3f}x",
                f"{100 * r['shorter']:.1f}%",
                r["time"]["kept"],
                f"{r['bytes']['search_s']:.2f} / {r['time']['search_s']:.2f}",
                "-" if lead is None else f"{lead / base:.3f}x",
                "ok" if r["never_slower"] else "SLOWER",
            )
        console.print(table)
        shorter = [r["shorter"] for r in doc["objectives"]]
        console.print(
            f"objectives: the time objective is never slower in "
            f"{sum(r['never_slower'] for r in doc['objectives'])} of {len(shorter)} cases; faster in "
            f"{sum(x > 1e-9 for x in shorter)}, by {100 * statistics.median(shorter):.1f}% (median) and up to "
            f"{100 * max(shorter):.1f}%. streams, longest lead: the bytes plan placed for copies in line"
        )
    if doc["exact_scale"]:
        table = Table(title="how far the exact search scales (generated models, --params)", title_justify="left")
        for col in ("nodes", "budget", "proven optimal", "gap", "solve s", "columns", "nonzeros"):
            table.add_column(col, justify="right")
        for r in doc["exact_scale"]:
            table.add_row(
                f"{r['nodes']:,}",
                r["rule"],
                "yes" if r["proven_optimal"] else r["status"],
                _pct(r["gap"]),
                f"{r['solve_s']:.1f}",
                f"{r['columns']:,}",
                f"{r['nonzeros']:,}",
            )
        console.print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="10000,100000", help="node counts for the speed comparison")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each command per size")
    parser.add_argument("--quick", action="store_true", help="1k and 3k nodes, one run each")
    parser.add_argument("--models", default="", help="quality cases of these models only (comma-separated)")
    parser.add_argument("--no-speed", action="store_true", help="skip the speed comparison")
    parser.add_argument("--exact", action="store_true", help="also greedy against --optimal on every case with weights")
    parser.add_argument("--exact-scale", default="", help="node counts at which to try the exact search")
    parser.add_argument("--time-limit", type=float, default=60.0, help="seconds the exact search may take")
    parser.add_argument("--no-objectives", action="store_true", help="skip the time against bytes objective comparison")
    parser.add_argument("--no-quality", action="store_true", help="skip the comparison with the old search")
    parser.add_argument("--profile", default="ascend-910b", help="device profile of the objectives comparison")
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout")
    args = parser.parse_args(argv)
    console = Console(width=200)
    progress = Console(stderr=True)
    logging.getLogger("offloadctl").setLevel(logging.ERROR)
    sizes = [1000, 3000] if args.quick else [int(s) for s in args.sizes.split(",") if s]
    repeat = 1 if args.quick else args.repeat
    models = [m for m in args.models.split(",") if m] or None
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        doc = {
            "speed": [] if args.no_speed else speed(sizes, repeat, folder, progress),
            "quality": [] if args.no_quality else quality(models, folder, progress),
            "profile": args.profile,
            "objectives": [] if args.no_objectives else objectives(models, folder, args.profile, progress),
            "exact": exact(models, folder, args.time_limit, progress) if args.exact else [],
            "exact_scale": exact_scale(
                [int(s) for s in args.exact_scale.split(",") if s], folder, args.time_limit, progress
            ),
        }
    doc["quality_ok"] = all(r["fits_ok"] and r["bytes_ok"] for r in doc["quality"])
    doc["speed_ok"] = all(r["ratio_wall"] <= GOAL for r in doc["speed"])
    doc["objectives_ok"] = all(r["never_slower"] for r in doc["objectives"])
    if args.json:
        print(json.dumps(doc, indent=1))
    else:
        _print(doc, console)
    return 0 if doc["quality_ok"] and doc["objectives_ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
