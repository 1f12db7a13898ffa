"""What `offloadctl simulate` prints and records beside its verdict: the memory and time tables, the CPU
arena's figure (`cpu_doc`, with a streams rewrite's partition: `copy_streams`), and the warnings on
the profile it priced with.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rich.table import Table

from offloadctl.analysis.graph import Analysis
from offloadctl.cli.common import (
    print_points,
)
from offloadctl.cli.plot import plot_timeline
from offloadctl.cli.report import write_report
from offloadctl.cli.ui import out_console
from offloadctl.core.plantypes import Plan
from offloadctl.core.units import fmt_bytes
from offloadctl.rewriting.preview import CpuFigures, cpu_figures
from offloadctl.simulation.costs import STREAMS_NOTE
from offloadctl.simulation.ortcpu import MODELLED_RELEASE, replica_refusal
from offloadctl.simulation.points import PointResult
from offloadctl.simulation.profiles import Profile
from offloadctl.simulation.result import SimResult

__all__ = [
    "write_extras",
    "cpu_doc",
    "print_all",
    "print_cpu",
    "print_report",
    "warn_profile",
    "warn_undone_fusions",
]

logger = logging.getLogger(__name__)


def _where(at: dict) -> str:
    if at["step"] is None:
        return "-"
    return f"#{at['position']} {at['node']}"


def _pct(before: float, after: float) -> str:
    if not before:
        return ""
    return f"{100.0 * (after - before) / before:+.1f}%"


def print_report(result: SimResult, doc: dict) -> None:
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


def print_cpu(cpu: CpuFigures) -> None:
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
    if cpu.limit_bytes is not None:  # what run --measure-memory measures at this order
        text += (
            f"; the smallest arena limit it runs in, which run --measure-memory measures at priority: "
            f"{fmt_bytes(cpu.limit_bytes)}"
        )
    out_console().print(text)


def cpu_doc(
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


def warn_undone_fusions(plan: Plan | None, prof: Profile, profile: str) -> None:
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


def print_all(
    result: SimResult,
    doc: dict[str, Any],
    cpu: CpuFigures | None,
    refusal: str | None,
    dims: Mapping[str, int],
    points: list[PointResult],
) -> None:
    """The tables for a person: memory and time, the CPU arena (or why there is no figure), the shape points."""
    print_report(result, doc)
    if cpu is not None:
        print_cpu(cpu)
    else:
        logger.warning("no CPU arena peak: %s", refusal)
    print_points(dims, result, points)


def warn_profile(model: str, plan: Plan | None, result: SimResult, prof: Profile, profile: str) -> None:
    """Warn when a measured profile matches no node of the model, or the plan undoes its fusions."""
    if prof.measured is not None and result.times is not None and result.times.measured_nodes == 0:
        logger.warning(
            "profile %s was measured on %s: no node of %s matches its node times (name, op type and input "
            "shapes), so every node is estimated from FLOPs and bytes",
            profile,
            prof.measured.model_path,
            model,
        )
    warn_undone_fusions(plan, prof, profile)


def write_extras(result: SimResult, plan: Plan | None, plot: str | None, report: str | None) -> list[str | Path]:
    """Write the timeline plot (--plot) and the report (--report); the files written."""
    written: list[str | Path] = []
    if plot:
        plot_timeline(result, plot)
        written.append(plot)
    if report:
        written += write_report(report, result, plan, plot=plot)
    return written
