"""`offloadctl simulate`: peak device memory and estimated time of a model, with or without a plan."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from offloadctl.analysis.graph import Analysis
from offloadctl.cli.common import (
    check_report_paths,
    check_unknown_sizes,
    finish,
    gate_failure,
    low_figures_text,
    open_model,
    peak_text,
    plan_effect,
    points_failure,
    print_points,
    slowdown_text,
    warn_broken_pins,
)
from offloadctl.cli.options import (
    ShapeOptions,
    SizesOptions,
    execution_order_option,
    input_shape_option,
    json_option,
    max_peak_option,
    model_argument,
    profile_option,
    report_option,
    shape_point_option,
    sizes_option,
    strict_option,
)
from offloadctl.cli.plot import plot_timeline
from offloadctl.cli.report import write_report
from offloadctl.cli.ui import out_console
from offloadctl.contract.document import read_plan
from offloadctl.core.files import check_output_path
from offloadctl.core.plantypes import Plan
from offloadctl.core.units import fmt_bytes
from offloadctl.pipeline import as_run_figures
from offloadctl.planning.advice import weak_plan_advice
from offloadctl.planning.request import profile_for
from offloadctl.rewriting.preview import CpuFigures, cpu_figures
from offloadctl.rewriting.streams import checked_streams
from offloadctl.simulation.costs import STREAMS_NOTE
from offloadctl.simulation.estimate import estimate_figures
from offloadctl.simulation.ortcpu import MODELLED_RELEASE, replica_refusal
from offloadctl.simulation.points import PointResult, at_points, parse_point
from offloadctl.simulation.profiles import Profile, load_profile
from offloadctl.simulation.result import SimResult, simulate

__all__ = ["COMMANDS", "simulate_cmd"]

logger = logging.getLogger(__name__)


def _where(at: dict) -> str:
    if at["step"] is None:
        return "-"
    return f"#{at['position']} {at['node']}"


def _pct(before: float, after: float) -> str:
    if not before:
        return ""
    return f"{100.0 * (after - before) / before:+.1f}%"


def _print_report(result: SimResult, doc: dict) -> None:
    console = out_console()
    plan = f"  plan {result.plan_path}" if result.plan_path else ("  (already rewritten)" if result.rewritten else "")
    console.print(f"[bold]{result.model}[/]{plan}")
    mem = Table(title="device memory", show_edge=False)
    for col in ("", "before", "after", "change"):
        mem.add_column(col, justify="left" if not col or col == "change" else "right")
    peak = doc["peak_bytes"]
    mem.add_row("peak", fmt_bytes(peak["before"]), fmt_bytes(peak["after"]), _pct(peak["before"], peak["after"]))
    mem.add_row("peak at", _where(doc["peak_at"]["before"]), _where(doc["peak_at"]["after"]), "")
    weights = doc["resident_weight_bytes"]
    mem.add_row("resident weights", fmt_bytes(weights["before"]), fmt_bytes(weights["after"]), "")
    console.print(mem)
    lb = doc["lower_bound_at"]
    console.print(
        f"lower bound {fmt_bytes(doc['lower_bound_bytes'])} "
        f"(largest single-step working set, #{lb['position']} {lb['node']})"
    )
    moved, copies = doc["transfer_bytes"], doc["copies"]
    console.print(
        f"copies: {copies['d2h']} D2H moving {fmt_bytes(moved['d2h'])}, "
        f"{copies['h2d']} H2D moving {fmt_bytes(moved['h2d'])}; host peak {fmt_bytes(doc['host_peak_bytes'])}"
    )
    if result.times is not None and result.profile is not None:
        t = doc["time_s"]
        nodes = doc["time_nodes"]
        caption = (
            f"node times: {nodes['measured']} of {nodes['total']} measured, "
            f"{nodes['estimated']} estimated from FLOPs and bytes"
            if result.profile.measured is not None
            else f"node times: all {nodes['total']} estimated from FLOPs and bytes (no measurements in this profile)"
        )
        table = Table(title=f"estimated time, profile {result.profile.name}", caption=caption, show_edge=False)
        for col in ("", "time", "stall", "slowdown"):
            table.add_column(col, justify="left" if not col else "right")
        table.add_row("baseline (no copies)", f"{t['baseline'] * 1e3:.3f} ms", "", "1.00x")
        for key, label in (
            ("serialized", "copies in line (onnxruntime today)"),
            ("overlapped", f"copies on copy streams ({STREAMS_NOTE})"),
        ):
            table.add_row(
                label, f"{t[key] * 1e3:.3f} ms", f"{doc['stall_s'][key] * 1e3:.3f} ms", f"{doc['slowdown'][key]:.2f}x"
            )
        console.print(table)
        if result.profile.description:
            console.print(f"profile {result.profile.name}: {result.profile.description}", style="dim")


def _print_cpu(cpu: CpuFigures) -> None:
    after = cpu.after
    before = cpu.before
    text = (
        f"CPU arena peak ({cpu.execution_order} order, onnxruntime {MODELLED_RELEASE}'s planner and arena replayed; "
        "device and host in one memory): "
        + (f"{fmt_bytes(before.peak_bytes)} before -> " if before is not None and before is not after else "")
        + f"{fmt_bytes(after.peak_bytes)}"
        + (" after" if before is not None and before is not after else "")
        + f" (weights {fmt_bytes(after.weight_bytes)}"
        + (f", kernel scratch up to {fmt_bytes(after.scratch_bytes)}" if after.scratch_bytes else "")
        + ")"
    )
    out_console().print(text)


def _cpu(
    analysis: Analysis,
    plan: Plan | None,
    result: SimResult,
    prof: Profile,
    doc: dict,
    streams: list[list[str]] | None = None,
) -> tuple[CpuFigures | None, str | None]:
    """The CPU arena's figures (None, with the reason, for an onnxruntime the replica does not
    model), written into ``doc``; ``streams``, a streams rewrite's partition."""
    refusal = replica_refusal()
    cpu = None if refusal else cpu_figures(analysis, plan, rewritten=result.rewritten, profile=prof, streams=streams)
    doc["execution_order"] = analysis.order
    doc["cpu_peak_bytes"] = {
        "before": cpu.before.peak_bytes if cpu is not None and cpu.before else None,
        "after": cpu.after.peak_bytes if cpu is not None else None,
    }
    doc["cpu_replica"] = {"onnxruntime": MODELLED_RELEASE, "refused": refusal}
    doc["cpu_memory"] = cpu.to_json() if cpu is not None else None
    return cpu, refusal


def _warn_undone_fusions(plan: Plan | None, prof: Profile, profile: str) -> None:
    """Warn when ``plan`` offloads tensors the measured profile's fusions take in: their copies undo the
    fusions, which the estimate (priced on the fused model) does not see."""
    measured = prof.measured
    if plan is None or measured is None:
        return
    undone = sorted({o["tensor"] for o in plan["offloads"]} & measured.fused)
    if undone:
        logger.warning(
            "the plan offloads %d tensor(s) that onnxruntime's fusions take in at the profile's --opt-level %s "
            "(first: %s): their copies undo those fusions, which the estimate does not price; plan again with "
            "--profile %s to keep them",
            len(undone),
            measured.opt_level,
            undone[0],
            profile,
        )


@click.command("simulate")
@model_argument
@click.option("--plan", "plan_path", type=click.Path(path_type=str), help="A scheduled plan for MODEL.")
@profile_option
@input_shape_option
@sizes_option
@execution_order_option
@shape_point_option
@strict_option
@max_peak_option
@report_option
@json_option
@click.option(
    "--plot", type=click.Path(path_type=str), metavar="FILE.png|FILE.svg", help="Write the memory timeline plot."
)
@click.option(
    "--timeline-limit",
    type=click.IntRange(min=0),
    default=10_000,
    show_default=True,
    help="Leave the per-step timeline out of --json when the run has more steps than this.",
)
def simulate_cmd(
    model: str,
    plan_path: str | None,
    profile: str | None,
    shapes: ShapeOptions,
    sizes: SizesOptions,
    order: str | None,
    shape_points: tuple[str, ...],
    strict: bool,
    max_peak: int | None,
    report: str | None,
    as_json: bool,
    plot: str | None,
    timeline_limit: int,
) -> None:
    """Peak device memory before and after a plan, where it occurs, bytes moved, and estimated time.

    MODEL is an original model (with or without --plan) or a model already rewritten by apply.
    Memory follows onnxruntime's rules in its PRIORITY_BASED order (or --execution-order default);
    time comes from the device profile's roofline and link figures (estimates, not measurements).
    With --max-peak it exits 1 when the peak (after the plan, or of the model as it is) is above it.

    \b
    Also the CPU arena's peak (cpu_peak_bytes in --json): everything one run of onnxruntime's CPU
    provider allocates, host copies included, as its allocation planner and arena place it; a
    measured profile's kernel scratch counts in every figure.
    """
    plan = read_plan(plan_path, stages=("scheduled",)) if plan_path else None
    device = plan["options"].get("select", {}).get("host_device", "").split(" ")[0] if plan else ""
    profile = profile_for(profile, device or None)  # a plan made for a device: that device's by default
    prof = load_profile(profile)
    if plot:
        check_output_path(plot, model, plan_path)
    check_report_paths(report, model, plan_path, plot=plot)  # with --plot the report links to that image
    job = open_model(model, shapes, sizes, plan=plan, plan_path=plan_path, show_progress=not as_json, order=order)
    analysis = job.analysis
    check_unknown_sizes(analysis, strict=strict)
    if plot:
        job.guard("the plot", plot)
    check_report_paths(report, *job.reads, plot=plot)
    result = simulate(analysis, plan, profile=prof, plan_source=f"plan file {plan_path}")
    result = dataclasses.replace(result, plan_path=plan_path)
    doc = result.to_json(timeline_limit=timeline_limit)
    streams = _copy_streams(model, analysis, doc)
    points = at_points(analysis, plan, [parse_point(p) for p in shape_points], profile=prof)
    doc["shape_points"] = [p.to_json() for p in points]
    cpu, refusal = _cpu(analysis, plan, result, prof, doc, streams)
    _warn_profile(model, plan, result, prof, profile)
    written = _write_extras(result, plan, plot, report)
    if plan is not None and not result.rewritten and (warning := weak_plan_advice(analysis, plan, result=result)):
        logger.warning("%s", warning)
    if not as_json:
        _print_all(result, doc, cpu, refusal, analysis.loaded.dims, points)
    unknown = len(result.unknown_tensors)
    parts, failure = _verdict(result, plan, analysis, doc, max_peak, points)
    subject = model + (f" with plan {plan_path}" if plan_path else "")
    if as_json:
        doc["max_peak_bytes"] = max_peak
        doc["figures_low"] = bool(unknown)
    finish("simulate", subject, parts, written, as_json=as_json, doc=doc, failure=failure)


def _copy_streams(model: str, analysis: Analysis, doc: dict[str, Any]) -> list[list[str]] | None:
    """A streams rewrite's partition, checked (`offloadctl.rewriting.streams.checked_streams`), its file
    recorded in ``doc``; None for any other model."""
    checked = checked_streams(model, analysis.loaded.proto, analysis.order)
    doc["copy_streams"] = checked[0] if checked is not None else None
    return checked[1] if checked is not None else None


def _write_extras(result: SimResult, plan: Plan | None, plot: str | None, report: str | None) -> list[str | Path]:
    """Write the timeline plot (--plot) and the report (--report); the files written."""
    written: list[str | Path] = []
    if plot:
        plot_timeline(result, plot)
        written.append(plot)
    if report:
        written += write_report(report, result, plan, plot=plot)
    return written


def _print_all(
    result: SimResult,
    doc: dict[str, Any],
    cpu: CpuFigures | None,
    refusal: str | None,
    dims: Mapping[str, int],
    points: list[PointResult],
) -> None:
    """The tables for a person: memory and time, the CPU arena (or why there is no figure), the shape points."""
    _print_report(result, doc)
    if cpu is not None:
        _print_cpu(cpu)
    else:
        logger.warning("no CPU arena peak: %s", refusal)
    print_points(dims, result, points)


def _warn_profile(model: str, plan: Plan | None, result: SimResult, prof: Profile, profile: str) -> None:
    """Warn when a measured profile matches no node of the model, or the plan undoes its fusions."""
    if prof.measured is not None and result.times is not None and result.times.measured_nodes == 0:
        logger.warning(
            "profile %s was measured on %s: no node of %s matches its node times (name, op type and input "
            "shapes), so every node is estimated from FLOPs and bytes",
            profile,
            prof.measured.model_path,
            model,
        )
    _warn_undone_fusions(plan, prof, profile)


def _verdict(
    result: SimResult,
    plan: Plan | None,
    analysis: Analysis,
    doc: dict[str, Any],
    max_peak: int | None,
    points: list[PointResult],
) -> tuple[list[str | None], str | None]:
    """The verdict's parts and its failure (a peak over --max-peak, at the model's shape or a point); the
    figures of what runs go into ``doc``."""
    planned = plan is not None or result.rewritten
    unknown = len(result.unknown_tensors)
    figures = _run_figures(result, plan, analysis)
    if plan is not None and "planned_after" in figures["peak_bytes"]:
        doc["peak_bytes"] = figures["peak_bytes"]
    if plan is not None:
        warn_broken_pins(figures, analysis.order)
    after = figures["peak_bytes"]["after"]
    failure = gate_failure(max_peak, after, "peak after the plan" if planned else "peak", unknown=unknown)
    failure = failure or points_failure(points, max_peak, "--max-peak")
    parts: list[str | None] = [f"peak {fmt_bytes(result.peak_before)}"]
    if planned:
        parts = [
            peak_text(figures),
            plan_effect(figures, plan)[0] if plan is not None else None,
            slowdown_text(figures),
        ]
        if plan is not None and after > result.peak_before:
            parts[1] = "the plan raises the peak"
    parts.append(low_figures_text(unknown))
    return parts, failure


def _run_figures(result: SimResult, plan: Plan | None, analysis: Analysis) -> dict[str, Any]:
    """The figures of the verdict: with a plan, those of what runs (`offloadctl.pipeline.as_run_figures`)."""
    figures = estimate_figures(result)
    if plan is None or result.rewritten:
        return figures
    select = plan["options"].get("select", {})
    return as_run_figures(
        plan,
        analysis,
        figures,
        host_device=select.get("host_device", ""),
        host_nodes=select.get("host_nodes", ()),
        host_copies=select.get("host_copies", ()),
        host_casts=select.get("host_casts", ()),
    )


COMMANDS = [simulate_cmd]
