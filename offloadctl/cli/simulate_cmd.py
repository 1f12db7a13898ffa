"""`offloadctl simulate`: peak device memory and estimated time of a model, with or without a plan."""

from __future__ import annotations

import logging
from typing import Any

import click

from offloadctl.analysis.graph import Analysis
from offloadctl.cli.common import (
    ModelArgs,
    finish,
    gate_failure,
    limits_text,
    low_figures_text,
    model_group,
    points_failure,
)
from offloadctl.cli.figure_lines import peak_text, plan_effect, slowdown_text, warn_broken_pins
from offloadctl.cli.options import (
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
from offloadctl.cli.simulate_lines import cpu_doc, print_all, warn_profile, write_extras
from offloadctl.cli.simulate_model import Simulated, opened
from offloadctl.contract.document import read_plan
from offloadctl.core.plantypes import Plan
from offloadctl.core.units import fmt_bytes
from offloadctl.loading.placed import HostPlacement
from offloadctl.rewriting.figures import as_run_figures
from offloadctl.simulation.estimate import Estimate, estimate_figures
from offloadctl.simulation.points import PointResult, at_points, parse_point
from offloadctl.simulation.result import SimResult

__all__ = ["COMMANDS", "simulate_cmd"]

logger = logging.getLogger(__name__)


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
@model_group
def simulate_cmd(
    model: ModelArgs,
    plan_path: str | None,
    profile: str | None,
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
    job = opened(model, plan, plan_path, plot, report, strict, as_json)
    run = Simulated.of(job, model.path, plan, plan_path, profile, timeline_limit)
    points = at_points(job.analysis, plan, [parse_point(p) for p in shape_points], profile=run.profile)
    run.doc["shape_points"] = [p.to_json() for p in points]
    cpu, refusal = cpu_doc(job.analysis, plan, run.result, run.profile, run.doc, run.streams)
    warn_profile(model.path, plan, run.result, run.profile, run.profile_name)
    written = write_extras(run.result, plan, plot, report)
    run.advise(job.analysis, plan)
    if not as_json:
        print_all(run.result, run.doc, cpu, refusal, job.analysis.loaded.dims, points)
    parts, failure = _verdict(run.result, plan, job.analysis, run.doc, max_peak, points, run.copies(plan))
    run.as_device_runs(parts, plan)
    if as_json:
        run.doc["max_peak_bytes"] = max_peak
        run.doc["figures_low"] = bool(run.result.unknown_tensors)
    subject = model.path + (f" with plan {plan_path}" if plan_path else "")
    finish("simulate", subject, parts, written, as_json=as_json, doc=run.doc, failure=failure)


def _verdict(
    result: SimResult,
    plan: Plan | None,
    analysis: Analysis,
    doc: dict[str, Any],
    max_peak: int | None,
    points: list[PointResult],
    copies: str,
) -> tuple[list[str | None], str | None]:
    """The verdict's parts and its failure (a peak over --max-peak, at the model's shape or a point); the
    figures of what runs, with its copies run as ``copies`` says, go into ``doc``."""
    planned = plan is not None or result.rewritten
    unknown = len(result.unknown_tensors)
    figures = _run_figures(result, plan, analysis, copies)
    if plan is not None and figures.peak.planned_after is not None:
        doc["peak_bytes"] = figures.peak.to_json()
    if plan is not None:
        warn_broken_pins(figures.peak, analysis.order)
    after = figures.peak.after
    failure = gate_failure(max_peak, after, "peak after the plan" if planned else "peak", unknown=unknown)
    failure = failure or points_failure(points, max_peak, "--max-peak")
    parts: list[str | None] = [f"peak {fmt_bytes(result.peak_before)}"]
    if planned:
        parts = [
            peak_text(figures.peak),
            plan_effect(figures.peak, plan, bodies_bytes=figures.bodies_at_peak_bytes)[0] if plan is not None else None,
            slowdown_text(figures),
        ]
        if plan is not None and after > result.peak_before:
            parts[1] = "the plan raises the peak"
    parts += [limits_text(max_peak=max_peak), low_figures_text(unknown)]
    return parts, failure


def _run_figures(result: SimResult, plan: Plan | None, analysis: Analysis, copies: str) -> Estimate:
    """The figures of the verdict: with a plan, those of what runs (`offloadctl.rewriting.figures.as_run_figures`)."""
    figures = estimate_figures(result, copies)
    if plan is None or result.rewritten:
        return figures
    host = HostPlacement.of_record(plan["options"].get("select", {}))
    return as_run_figures(plan, analysis, figures, host=host, copies=copies)


COMMANDS = [simulate_cmd]
