"""Budget strategy against the distance heuristic on the sample models, side by side.

For every sample model and a range of budgets between the lower bound and the original peak, one
rich table row gives: the peak before, the distance heuristic's peak with default-ish options
(select distance 10, prefetch distance 3, weights on), the cheapest distance-strategy options found
by searching select distance x params x prefetch distance that reach the budget, the budget
strategy's peak, the lower bound, the bytes each moves, and the estimated slowdown (the
simulator's time model, serialized copies / overlapped copies, on the Ascend 910B profile).

Run: ``python bench/bench_budget.py [--profile NAME]`` (``make bench`` runs it).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from offloadctl.analysis import analyse
from offloadctl.errors import OffloadError
from offloadctl.model import load_model
from offloadctl.simulate import peak_memory, simulate
from offloadctl.stages import make_plan, prefetch, select
from offloadctl.stages.budget import budget_filter, bytes_moved, lower_bound

__all__ = ["main"]

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_models"
FRACTIONS = (0.1, 0.25, 0.5, 0.75, 0.9)  # budget = lower bound + f * (peak - lower bound)
DEFAULTISH = {"select_distance": 10, "prefetch_distance": 3, "params": True}


def _kib(n: int | None) -> str:
    return "-" if n is None else f"{n / 1024:.1f}"


def _slow(analysis, plan, profile: str) -> str:
    times = simulate(analysis, plan, profile=profile).times
    if times is None:
        return "-"
    s = times.slowdown
    return f"{s['serialized']:.2f}/{s['overlapped']:.2f}"


def _distance_space(analysis) -> list[tuple[dict, dict, int, int]]:
    """(options, plan, peak, bytes moved) for a grid of distance-strategy options."""
    n = analysis.num_positions
    distances = sorted({0, 1, 2, 3, 5, 8, 10, 15, 20, 30, 50, 100} | {max(n // k, 0) for k in (2, 3, 4)})
    out = []
    for params in (False, True):
        for sd in distances:
            for pd in (0, 3):
                opts = {"select_distance": sd, "prefetch_distance": pd, "params": params}
                plan = make_plan(analysis, **opts)
                out.append((opts, plan, peak_memory(analysis, plan)[0], bytes_moved(plan)))
    return out


def _fmt_opts(opts: dict) -> str:
    return f"sd={opts['select_distance']} pd={opts['prefetch_distance']}{' +w' if opts['params'] else ''}"


def bench_model(name: str, profile: str, console: Console) -> None:
    analysis = analyse(load_model(SAMPLES / f"{name}.onnx"))
    before = peak_memory(analysis)[0]
    lb, _ = lower_bound(analysis)
    defaultish = make_plan(analysis, **DEFAULTISH)
    d_peak, d_moved = peak_memory(analysis, defaultish)[0], bytes_moved(defaultish)
    space = _distance_space(analysis)
    table = Table(
        title=f"{name}: peak before {_kib(before)} KiB, lower bound {_kib(lb)} KiB; distance default-ish "
        f"({_fmt_opts(DEFAULTISH)}): peak {_kib(d_peak)} KiB, moved {_kib(d_moved)} KiB, "
        f"slowdown {_slow(analysis, defaultish, profile)}",
        title_justify="left",
    )
    for col in ("budget KiB", "distance search: options", "peak", "moved", "slowdown",
                "budget strategy: peak", "moved", "slowdown", "time s"):
        table.add_column(col, justify="right" if col not in ("distance search: options",) else "left")
    for f in FRACTIONS:
        budget = int(lb + f * (before - lb))
        fits = [item for item in space if item[2] <= budget]
        if fits:
            opts, plan, peak, moved = min(fits, key=lambda item: (item[3], item[2]))
            dist = (_fmt_opts(opts), _kib(peak), _kib(moved), _slow(analysis, plan, profile))
        else:
            best = min(space, key=lambda item: item[2])
            dist = (f"none fits (best {_kib(best[2])})", "-", "-", "-")
        t0 = time.perf_counter()
        try:
            # same candidates as the distance search: activations and weights
            filtered = budget_filter(select(analysis, params=True), analysis, budget_bytes=budget, prefetch_distance=3)
            plan = prefetch(filtered, prefetch_distance=3)
            elapsed = time.perf_counter() - t0
            ours = (_kib(peak_memory(analysis, plan)[0]), _kib(bytes_moved(plan)), _slow(analysis, plan, profile))
        except OffloadError as exc:
            elapsed = time.perf_counter() - t0
            reach = str(exc).split("best peak reachable is ")[-1].split(" ")[0]
            ours = (f"infeasible ({_kib(int(reach)) if reach.isdigit() else '?'})", "-", "-")
        table.add_row(_kib(budget), *dist, *ours, f"{elapsed:.2f}")
    console.print(table)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="ascend-910b", help="device profile for the time model")
    parser.add_argument("models", nargs="*", default=["seed", "unet", "transformer", "training", "mlp"])
    args = parser.parse_args(argv)
    console = Console(width=200)
    console.print(
        "budget = lower bound + f x (peak before - lower bound); moved = bytes copied per run (D2H + H2D); "
        "slowdown = estimated run time / baseline, serialized copies / overlapped copies"
    )
    import logging

    logging.getLogger("offloadctl").setLevel(logging.ERROR)
    for name in args.models:
        bench_model(name, args.profile, console)
    return 0


if __name__ == "__main__":
    sys.exit(main())
