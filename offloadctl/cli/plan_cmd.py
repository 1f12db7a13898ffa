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
    ModelArgs,
    check_report_paths,
    finish,
    gate_failure,
    limits_text,
    low_figures_text,
    model_group,
    plan_figures,
    points_failure,
)
from offloadctl.cli.figure_lines import (
    peak_text,
    plan_effect,
    print_estimate,
    slowdown_text,
    warn_broken_pins,
    warn_slowdown,
    warn_streams_slower,
)
from offloadctl.cli.options import (
    budget_options,
    execution_order_option,
    explain_option,
    filter_options,
    json_option,
    max_peak_option,
    model_argument,
    opt_level_option,
    output_option,
    plan_device_option,
    plan_request,
    prefetch_options,
    report_option,
    select_options,
    shape_point_option,
    sizes_option,
    strict_option,
)
from offloadctl.cli.plan_lines import print_plan
from offloadctl.cli.plan_model import PlanModel, as_asked, optimized_outputs_for
from offloadctl.cli.ui import steps
from offloadctl.contract.document import write_plan
from offloadctl.core.files import check_output_path, restored_on_failure
from offloadctl.pipeline import STEPS, planned, verdict_figures
from offloadctl.planning.advice import unreached_bodies, unreached_text, weak_plan_advice
from offloadctl.planning.passes import Planning
from offloadctl.planning.request import (
    PlanRequest,
    Progress,
)
from offloadctl.simulation.points import PointResult, at_points

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
@opt_level_option(
    "Plan the graph onnxruntime runs at this level: it is optimized for --device and written beside the plan "
    "(PLAN.optimized.onnx, the model to apply the plan to); the rewrite then runs at disable, its fusions kept."
)
@json_option
@plan_request
@model_group
def plan_cmd(
    model: ModelArgs,
    output: str,
    device: str | None,
    shape_points: tuple[str, ...],
    explain: bool,
    strict: bool,
    max_peak: int | None,
    report: str | None,
    opt_level: str,
    as_json: bool,
    request: PlanRequest,
) -> None:
    """select + filter + prefetch in one call; same document as chaining the three.

    Ends with the simulated peak before and after and the estimated slowdown (--profile, --copies);
    with --max-peak it exits 1 when the peak after the plan is above it (the plan is still written).
    --max-slowdown X, instead of --budget, finds the largest cut in peak memory whose estimated time
    stays within X times the baseline.
    """
    check_output_path(output, model.path)
    check_report_paths(report, model.path, others=[("the plan", output)])
    # --opt-level writes the optimized graph beside the plan: a failure leaves neither it nor an earlier one lost
    with restored_on_failure(*optimized_outputs_for(output, opt_level)), as_asked(model.path, output, opt_level):
        opened = PlanModel.of(model, output, opt_level, device, as_json)
        analysis, request, points = opened.prepare(
            output, request, device, report, strict, max_peak, shape_points, as_json
        )
        with steps(not as_json, total=STEPS + 1) as step:  # its passes and report, and writing the plan
            done, checked = _plan_and_simulate(analysis, request, output, step, points, opened)
        done = opened.next_step_of_source(done, opt_level)
        written = opened.written(output, report, done)
        search = print_plan(done, request, checked, explain, as_json)
        budget = request.budget.budget if request.budget.uses_budget else None
        failure = points_failure(checked, budget, "the budget") or points_failure(checked, max_peak, "--max-peak")
        _plan_verdict(done, written, as_json, max_peak, search, failure, budget=budget)


def _plan_and_simulate(
    analysis: Analysis,
    request: PlanRequest,
    output: str,
    step: Callable[..., None],
    points: list[dict[str, int]] | None = None,
    opened: PlanModel | None = None,
) -> tuple[Planning, list[PointResult]]:
    """Make the plan by the pipeline (`offloadctl.pipeline`: its figures recorded for apply to quote,
    and a weak plan's next step), simulate it at each shape point, and write it (a shape point that
    cannot be simulated is an error before anything is written)."""
    done = planned(analysis, request, Progress(step))
    plan, result = done.plan, done.simulation
    assert plan is not None
    checked = []
    if result is not None and points:
        step("simulating the shape points")
        checked = at_points(analysis, plan, points, profile=request.budget.device_profile)
    if opened is not None and opened.optimized is not None:  # the plan's model is onnxruntime's optimized graph
        plan["model"]["optimized"] = opened.optimized.to_json()  # from what, at what level
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
        logger.warning("%s", step.text())
    bodies = unreached_bodies(analysis)
    if (text := unreached_text(bodies)) is not None:
        logger.warning("%s", text)
    warn_slowdown(figures)
    warn_streams_slower(figures)
    warn_broken_pins(figures.peak, analysis.order)
    unknown = figures.unknown_size_tensors
    words, raised = plan_effect(figures.peak, plan, bodies, bodies_bytes=figures.bodies_at_peak_bytes)
    finish(
        "plan",
        model,
        [
            peak_text(figures.peak),
            limits_text(budget, max_peak),
            words,
            slowdown_text(figures),
            low_figures_text(unknown),
        ],
        written,
        as_json=as_json,
        failure=raised
        or gate_failure(max_peak, figures.peak.after, "peak after the plan", unknown=unknown)
        or point_failure,
        doc={
            "next_step": step.to_json() if step is not None else None,
            "unreached_bodies": bodies,
            "model": model,
            "plan": str(written[0]),
            **plan_figures(plan),
            **figures.to_json(),
            **search,
            "max_peak_bytes": max_peak,
            "budget_bytes": budget,
            "figures_low": bool(unknown),
            "peak_lowered": figures.peak.after < figures.peak.before,
        },
    )


COMMANDS = [plan_cmd]
