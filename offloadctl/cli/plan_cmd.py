"""`offloadctl plan`: the plan made by the declared pipeline (`offloadctl.pipeline`) in one call, the
same document as chaining select, filter and prefetch, with the figures of what runs and its verdict."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from offloadctl.analysis.graph import Analysis
from offloadctl.cli.common import (
    check_original,
    check_report_paths,
    check_unknown_sizes,
    finish,
    gate_failure,
    limits_text,
    low_figures_text,
    open_model,
    peak_text,
    plan_effect,
    plan_figures,
    points_failure,
    print_estimate,
    print_plan_summary,
    print_points,
    slowdown_text,
    warn_broken_pins,
    warn_slowdown,
    warn_streams_slower,
)
from offloadctl.cli.options import (
    ShapeOptions,
    SizesOptions,
    budget_options,
    execution_order_option,
    explain_option,
    filter_options,
    json_option,
    max_peak_option,
    model_argument,
    output_option,
    plan_device_option,
    prefetch_options,
    report_option,
    select_options,
    shape_point_option,
    sizes_option,
    strict_option,
)
from offloadctl.cli.plan_lines import for_device, print_search
from offloadctl.cli.report import write_report
from offloadctl.cli.ui import out_console, steps
from offloadctl.contract.document import write_plan
from offloadctl.core.files import check_output_path
from offloadctl.core.units import fmt_bytes
from offloadctl.pipeline import PIPELINE, next_step_text, planned, verdict_figures
from offloadctl.planning.advice import unreached_bodies, unreached_text, weak_plan_advice
from offloadctl.planning.explain import explain_table
from offloadctl.planning.passes import Planning
from offloadctl.planning.request import (
    BudgetPart,
    FilterPart,
    PlanRequest,
    PrefetchPart,
    SelectPart,
    evolve,
)
from offloadctl.simulation.points import PointResult, at_points, largest_point, parse_point

__all__ = ["COMMANDS"]

logger = logging.getLogger(__name__)


@click.command("plan")
@model_argument
@output_option("the scheduled plan")
@select_options
@sizes_option
@execution_order_option
@plan_device_option
@shape_point_option
@filter_options
@budget_options
@explain_option
@prefetch_options
@strict_option
@max_peak_option
@report_option
@json_option
def plan_cmd(
    model: str,
    output: str,
    selecting: SelectPart,
    shapes: ShapeOptions,
    sizes: SizesOptions,
    order: str | None,
    device: str | None,
    shape_points: tuple[str, ...],
    filtering: FilterPart,
    budgeting: BudgetPart,
    explain: bool,
    prefetching: PrefetchPart,
    strict: bool,
    max_peak: int | None,
    report: str | None,
    as_json: bool,
) -> None:
    """select + filter + prefetch in one call; same document as chaining the three.

    Ends with the simulated peak before and after and the estimated slowdown (--profile, --copies);
    with --max-peak it exits 1 when the peak after the plan is above it (the plan is still written).
    --max-slowdown X, instead of --budget, finds the largest cut in peak memory whose estimated time
    stays within X times the baseline.
    """
    check_output_path(output, model)
    check_report_paths(report, model, others=[("the plan", output)])
    request = PlanRequest.of(selecting, filtering, budgeting.for_device(device), prefetching)
    job = open_model(model, shapes, sizes, show_progress=not as_json, order=order)
    job.guard("the plan", output)
    analysis = job.analysis
    if report is not None:
        check_report_paths(report, *job.reads, others=[("the plan", output)])
    check_unknown_sizes(analysis, strict=strict)
    request = for_device(request, analysis, device, as_json)
    if max_peak is not None or report is not None:
        hint = "check the rewritten model with offloadctl simulate MODEL --max-peak BYTES --report FILE.md"
        check_original(analysis, "--max-peak and --report", hint)
    points = [parse_point(p) for p in shape_points]
    if points and request.uses_budget:
        analysis, points = _largest_point(analysis, points, as_json)
    with steps(not as_json, total=len(PIPELINE) + 1) as step:  # its passes, and writing the plan
        done, checked = _plan_and_simulate(analysis, evolve(request, step=step), output, step, points)
    plan, result = done.plan, done.simulation
    assert plan is not None
    written: list[str | Path] = [output]
    if report is not None and result is not None:
        written += write_report(report, result, plan)
    defaulted = request.objective_defaulted if request.uses_budget else None
    bodies = unreached_bodies(analysis)
    if not as_json:
        print_plan_summary(plan)
        print_search(plan, defaulted)
        if explain:
            out_console().print(explain_table(plan, bodies))
        if result is None:
            out_console().print("the model already contains copies: simulate the rewritten model to see its peak")
    search = {
        "objective": request.objective_name if request.uses_budget else None,
        "objective_default": defaulted,
        "copy_mode": request.copies,
        "shape_points": [p.to_json() for p in checked],
    }
    if checked and not as_json and result is not None:
        print_points(analysis.loaded.dims, result, checked)
    budget = request.budget_bytes if request.uses_budget else None
    failure = points_failure(checked, budget, "the budget") or points_failure(checked, max_peak, "--max-peak")
    _plan_verdict(done, written, as_json, max_peak, search, failure, budget=budget)


def _largest_point(
    analysis: Analysis, points: list[dict[str, int]], as_json: bool
) -> tuple[Analysis, list[dict[str, int]]]:
    """`offloadctl.simulation.points.largest_point`, saying so when the plan is made at another point."""
    analysis, points, worst = largest_point(analysis, points)
    if worst is not None and not as_json:
        dims = ", ".join(f"{d}={v}" for d, v in worst.dims.items())
        out_console().print(f"planning at the largest shape point, {dims} (peak {fmt_bytes(worst.result.peak_before)})")
    return analysis, points


def _plan_and_simulate(
    analysis: Analysis,
    request: PlanRequest,
    output: str,
    step: Callable[..., None],
    points: list[dict[str, int]] | None = None,
) -> tuple[Planning, list[PointResult]]:
    """Make the plan by the pipeline (`offloadctl.pipeline`: its figures recorded for apply to quote,
    and a weak plan's next step), simulate it at each shape point, and write it (a shape point that
    cannot be simulated is an error before anything is written)."""
    done = planned(analysis, request)
    plan, result = done.plan, done.simulation
    assert plan is not None
    checked = []
    if result is not None and points:
        step("simulating the shape points")
        checked = at_points(analysis, plan, points, profile=request.device_profile)
    step(f"writing {output}")
    write_plan(output, plan)
    return done, checked


def _plan_verdict(
    done: Planning,
    written: list[str | Path],
    as_json: bool,
    max_peak: int | None,
    search: dict[str, Any],
    point_failure: str | None = None,
    *,
    budget: int | None = None,
) -> None:
    """The plan command's last lines: the estimate, the advice on a weak plan (its next step,
    `offloadctl.pipeline.next_step`), and the verdict (``point_failure``: a shape point over the
    budget or --max-peak; the budget and --max-peak quoted in the bytes they were read as)."""
    analysis, plan, result, step = done.analysis, done.plan, done.simulation, done.next_step
    assert plan is not None
    model = str(analysis.loaded.path)
    if result is None:
        doc = {"model": model, "plan": written[0], **plan_figures(plan), **search}
        finish("plan", model, [], written, as_json=as_json, doc=doc)
        return
    figures = verdict_figures(done)
    if not as_json:
        at = result.after.at(result.after.peak_step)
        where = f", at #{at['position']} {at['node']}" if at["step"] is not None and at["kind"] == "node" else ""
        print_estimate(figures, where=where)
    warning = weak_plan_advice(analysis, plan, result=result)
    if warning:
        logger.warning("%s", warning)
    if step is not None:
        logger.warning("%s", next_step_text(step))
    bodies = unreached_bodies(analysis)
    if (text := unreached_text(bodies)) is not None:
        logger.warning("%s", text)
    warn_slowdown(figures)
    warn_streams_slower(figures)
    warn_broken_pins(figures, analysis.order)
    unknown = figures["unknown_size_tensors"]
    words, raised = plan_effect(figures, plan, bodies)
    finish(
        "plan",
        model,
        [peak_text(figures), limits_text(budget, max_peak), words, slowdown_text(figures), low_figures_text(unknown)],
        written,
        as_json=as_json,
        failure=raised
        or gate_failure(max_peak, figures["peak_bytes"]["after"], "peak after the plan", unknown=unknown)
        or point_failure,
        doc={
            "next_step": step,
            "unreached_bodies": bodies,
            "model": model,
            "plan": str(written[0]),
            **plan_figures(plan),
            **figures,
            **search,
            "max_peak_bytes": max_peak,
            "budget_bytes": budget,
            "figures_low": bool(unknown),
            "peak_lowered": figures["peak_bytes"]["after"] < figures["peak_bytes"]["before"],
        },
    )


COMMANDS = [plan_cmd]
