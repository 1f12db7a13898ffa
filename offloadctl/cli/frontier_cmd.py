"""`offloadctl frontier`: peak device memory against estimated time, budget by budget, for both copy modes."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from offloadctl.cli.common import ModelArgs, check_unknown_sizes, finish, model_group
from offloadctl.cli.options import (
    input_shape_option,
    json_option,
    model_argument,
    objective_option,
    profile_option,
    sizes_option,
    usage,
)
from offloadctl.cli.plot import plot_frontier
from offloadctl.cli.ui import out_console, steps
from offloadctl.core.errors import OffloadError
from offloadctl.core.files import check_output_path
from offloadctl.core.plantypes import Plan
from offloadctl.core.units import fmt_bytes
from offloadctl.planning.request import PlanRequest, profile_for
from offloadctl.planning.tradeoff import DEFAULT_POINTS, Point, Tradeoff, dominated, point_of
from offloadctl.simulation.base import is_rewritten
from offloadctl.simulation.costs import COPY_MODES, STREAMS_NOTE, copy_mode_label
from offloadctl.simulation.profiles import load_profile
from offloadctl.simulation.result import SimResult

__all__ = ["COMMANDS", "frontier_cmd"]

_TITLES = {
    "inline": "copies in line (what onnxruntime runs today)",
    "streams": f"copies on streams ({STREAMS_NOTE})",
}


def _pct(before: int, after: int) -> str:
    return f"{100.0 * (after - before) / before:+.1f}%" if before else ""


def _table(mode: str, points: list[Point], peak: int, profile: str) -> Table:
    table = Table(title=f"{_TITLES[mode]}, profile {profile}", show_edge=False)
    for col in ("budget", "peak", "change", "est. time", "slowdown", "moved", "copies", ""):
        table.add_column(col, justify="right" if col else "left")
    for p, worse in zip(points, dominated(points)):
        table.add_row(
            fmt_bytes(p.budget_bytes) if p.budget_bytes is not None else "-",
            fmt_bytes(p.peak_bytes),
            _pct(peak, p.peak_bytes),
            f"{p.time_s * 1e3:.3f} ms",
            f"{p.slowdown:.3f}x",
            fmt_bytes(p.bytes_moved),
            str(p.copy_count),
            "dominated" if worse else "",
        )
    return table


def _print_frontier(
    model: str,
    trade: Tradeoff,
    frontier: dict[str, list[Point]],
    default: dict[str, Point],
    modes: tuple[str, ...],
    params: bool,
) -> None:
    console = out_console()
    prof = trade.profile
    console.print(
        f"[bold]{model}[/]: peak {fmt_bytes(trade.peak_bytes)} without offload, lower bound "
        f"{fmt_bytes(trade.lower_bound_bytes)}; baseline {trade.baseline_s * 1e3:.3f} ms (profile {prof.name}); "
        f"budget plans with objective {trade.objective}" + (" and --params" if params else ""),
        soft_wrap=True,
    )
    for mode in modes:
        console.print(_table(mode, frontier[mode], trade.peak_bytes, prof.name))
    if any(any(dominated(frontier[mode])) for mode in modes):
        console.print("dominated: a plan with a lower peak is as fast (a lower budget's plan fits a higher budget too)")
    d = next(iter(default.values()))
    times = ", ".join(f"{default[m].slowdown:.3f}x {copy_mode_label(m).split(',')[0]}" for m in modes)
    console.print(
        f"HyperOffload default plan (offloadctl plan MODEL): {d.offloads} offload(s), peak "
        f"{fmt_bytes(d.peak_bytes)} ({_pct(trade.peak_bytes, d.peak_bytes)}), estimated {times}",
        soft_wrap=True,
    )


def _verdict(
    model: str,
    profile: str,
    params: bool,
    trade: Tradeoff,
    frontier: dict[str, list[Point]],
    modes: Sequence[str],
    default_plan: Plan,
    default_result: SimResult,
    default: dict[str, Point],
) -> tuple[list[str], dict[str, Any]]:
    """The verdict's parts (each mode's lowest peak) and the --json document."""
    parts = []
    for mode in modes:
        pts = frontier[mode]
        if pts:
            low = min(pts, key=lambda p: (p.peak_bytes, p.time_s))
            parts.append(f"{copy_mode_label(mode)}: lowest peak {fmt_bytes(low.peak_bytes)} at {low.slowdown:.2f}x")
    doc = {
        "model": model,
        "profile": profile,
        "objective": trade.objective,
        "params": params,
        "peak_bytes": trade.peak_bytes,
        "lower_bound_bytes": trade.lower_bound_bytes,
        "baseline_s": trade.baseline_s,
        "modes": {
            mode: {
                "label": _TITLES[mode],
                "points": [
                    {**p.to_json(), "dominated": worse} for p, worse in zip(frontier[mode], dominated(frontier[mode]))
                ],
            }
            for mode in modes
        },
        "default_plan": {
            "command": "offloadctl plan MODEL",
            "offloads": len(default_plan["offloads"]),
            "peak_bytes": default_result.peak_after,
            "bytes_moved": sum(default_result.transfer_bytes.values()),
            "time_s": {mode: default[mode].time_s for mode in modes},
            "slowdown": {mode: default[mode].slowdown for mode in modes},
        },
    }
    return parts, doc


@click.command("frontier")
@model_argument
@profile_option
@objective_option
@click.option(
    "--params/--no-params",
    default=False,
    show_default=True,
    help="Consider weights too (without it, weights join only where activations alone cannot reach a budget).",
)
@click.option(
    "--copies",
    type=click.Choice([*COPY_MODES, "both"]),
    default="both",
    show_default=True,
    help=f"Which copy modes to sweep: inline (onnxruntime today), streams ({STREAMS_NOTE}), or both.",
)
@click.option(
    "--points",
    type=click.IntRange(min=2, max=200),
    default=DEFAULT_POINTS,
    show_default=True,
    help="Budgets from the peak down to the lower bound, evenly spaced.",
)
@input_shape_option
@sizes_option
@click.option("--plot", type=click.Path(path_type=str), metavar="FILE.png|FILE.svg", help="Draw the frontier.")
@json_option
@model_group
def frontier_cmd(
    model: ModelArgs,
    profile: str | None,
    objective: str | None,
    params: bool,
    copies: str,
    points: int,
    plot: str | None,
    as_json: bool,
) -> None:
    """Peak device memory against estimated time, from the peak down to the lower bound.

    Runs the budget strategy at --points budgets and times each plan with the simulator under each
    copy mode; the HyperOffload default plan (offloadctl plan MODEL, no options) is one more point.
    Estimates from the device profile (--profile), not measurements.
    """
    prof = load_profile(profile_for(profile, None))
    if plot:
        check_output_path(plot, model.path)
    job = model.open(show_progress=not as_json)
    analysis = job.analysis
    if is_rewritten(analysis):
        raise OffloadError(
            f"{model.path} already contains copies: the frontier needs the original model",
            hint="run offloadctl frontier on the model before offloadctl apply",
        )
    if plot:
        job.guard("the plot", plot)
    check_unknown_sizes(analysis, strict=False)
    modes = COPY_MODES if copies == "both" else (copies,)
    with steps(not as_json) as step:
        step("preparing the budget search")
        request = usage(PlanRequest.of_options, strategy="frontier", profile=prof, objective=objective, params=params)
        trade = Tradeoff(analysis, request)
        frontier = trade.frontier(modes, points, step=step)
        step("the HyperOffload default plan")
        default_plan, default_result = trade.default_plan()
    default = {mode: point_of(default_result, default_plan, mode) for mode in modes}
    written: list[str | Path] = []
    if plot:
        plot_frontier(
            frontier,
            plot,
            peak_bytes=trade.peak_bytes,
            lower_bound_bytes=trade.lower_bound_bytes,
            default=default,
            title=(
                f"{Path(model.path).name}: peak memory against estimated time (profile {prof.name}, objective "
                f"{trade.objective}{', --params' if params else ''})"
            ),
        )
        written.append(plot)
    if not as_json:
        _print_frontier(model.path, trade, frontier, default, modes, params)
    parts, doc = _verdict(model.path, prof.name, params, trade, frontier, modes, default_plan, default_result, default)
    finish("frontier", model.path, parts, written, as_json=as_json, doc=doc)


COMMANDS = [frontier_cmd]
