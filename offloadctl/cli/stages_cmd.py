"""`offloadctl select | filter | prefetch | plan`: the planning stages, each writing a plan file."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click

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
    plan_figures,
    points_failure,
    print_estimate,
    print_plan_summary,
    print_points,
    slowdown_text,
    warn_broken_pins,
    warn_slowdown,
)
from offloadctl.cli.options import (
    ShapeOptions,
    SizesOptions,
    budget_options,
    execution_order_option,
    explain_option,
    filter_budget_options,
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
from offloadctl.cli.report import write_report
from offloadctl.cli.ui import out_console, steps
from offloadctl.contract.document import read_plan, write_plan
from offloadctl.core.bulk import paused_gc
from offloadctl.core.errors import OffloadError
from offloadctl.core.files import check_output_path
from offloadctl.core.plantypes import BudgetRecord, Plan
from offloadctl.core.units import fmt_bytes
from offloadctl.job import Job
from offloadctl.pipeline import PIPELINE, next_step_text, planned
from offloadctl.planning.advice import unreached_bodies, unreached_text, weak_plan_advice
from offloadctl.planning.budget.strategy import budget_filter
from offloadctl.planning.explain import explain_table
from offloadctl.planning.filter import filter_plan
from offloadctl.planning.passes import Planning
from offloadctl.planning.prefetch import prefetch
from offloadctl.planning.request import (
    BudgetPart,
    FilterPart,
    FilterRequest,
    PlanRequest,
    PrefetchPart,
    SelectPart,
    evolve,
)
from offloadctl.planning.select import select
from offloadctl.simulation.base import is_rewritten
from offloadctl.simulation.costs import copy_mode_label
from offloadctl.simulation.estimate import estimate_figures, recorded_estimate
from offloadctl.simulation.points import PointResult, at_points, parse_point, point_analysis
from offloadctl.simulation.result import SimResult, simulate

__all__ = ["COMMANDS"]

logger = logging.getLogger(__name__)


T = TypeVar("T")
S = TypeVar("S", SelectPart, PlanRequest)


def _objective_words(info: BudgetRecord, defaulted: bool | None) -> str:
    """``objective time, the default with a measured profile; copies in line`` for the search line."""
    objective = info["objective"]["objective"]
    words = f"objective {objective}"
    if defaulted:
        words += (
            ", the default with a measured profile" if objective == "time" else ", the default with a datasheet profile"
        )
    return f"{words}; {copy_mode_label(info.get('copies') or 'inline')}"


def _ms(seconds: float) -> str:
    """Milliseconds, or microseconds below 0.1 ms."""
    return f"{seconds * 1e3:.3f} ms" if seconds >= 1e-4 else f"{seconds * 1e6:.2f} us"


def _print_search(plan: Plan, defaulted: bool | None = None) -> None:
    """What the budget plan costs, the proven bound and the gap (or that it is optimal), and the objective
    used; with --max-slowdown, the budget it chose."""
    info = plan.get("budget")
    if info is None:
        return
    objective = info["objective"]
    head = f"budget search ({info['search']}, {_objective_words(info, defaulted)})"
    fmt: Callable[[float], str]
    if objective["unit"] == "bytes":
        fmt = fmt_bytes
        line = f"{head}: the plan moves {fmt(info['cost'])}"
    elif objective.get("copies") == "streams":
        fmt = _ms
        line = (
            f"{head}: the plan's copies leave an estimated {fmt(info['cost'])} not hidden by compute, each on its own "
            f"(profile {objective.get('profile')})"
        )
    else:
        fmt = _ms
        line = f"{head}: the plan's copies take {fmt(info['cost'])} in line (profile {objective.get('profile')})"
    if info["optimal"]:
        line += ", proven optimal"
    elif info["cost_bound"] is not None:
        source = "HiGHS" if info["bound_source"] == "solver" else "the steps furthest over the budget"
        line += f"; proven bound {fmt(info['cost_bound'])} ({source}): gap {100 * (info['gap'] or 0.0):.1f}%"
    elif objective.get("copies") == "streams":
        line += "; no bound: with copies on streams a copy's price depends on the compute around it"
    else:
        line += "; no bound proven (try --optimal)"
    solver = info.get("solver")
    if solver:
        line += f"; HiGHS: {solver['status']} in {solver['seconds']:.1f} s"
        if solver["answer"] != "accepted":
            line += f", {solver['answer']}"
    compared = info.get("compared")
    if compared:
        stall = compared["stall_s"]
        if compared["kept"] == "time":
            line += (
                f"; estimated stall {_ms(stall['time'])}, "
                f"against {_ms(stall['bytes'])} for the plan the bytes objective finds"
            )
        else:
            line += (
                f"; the plan the bytes objective finds stalls less ({_ms(stall['bytes'])} against "
                f"{_ms(stall['time'])}) and is kept"
            )
    console = out_console()
    console.print(line, soft_wrap=True)
    within = info.get("max_slowdown")
    if within:
        mode = copy_mode_label(within["copies"])
        if within["within"]:
            console.print(
                f"max slowdown {within['requested']:g}x ({mode}, profile {within['profile']}): budget "
                f"{fmt_bytes(within['budget_bytes'])}, the lowest peak of {within['budgets_tried']} budgets tried, "
                f"estimated {within['slowdown']:.3f}x the baseline ({_ms(within['time_s'])} against "
                f"{_ms(within['baseline_s'])}); peak {fmt_bytes(within['peak_before_bytes'])} -> "
                f"{fmt_bytes(within['peak_bytes'])}",
                soft_wrap=True,
            )
        else:
            console.print(
                f"max slowdown {within['requested']:g}x ({mode}, profile {within['profile']}): no cut in peak memory "
                f"stays within it ({within['budgets_tried']} budgets tried): the plan offloads nothing",
                soft_wrap=True,
            )


def _for_device(part: S, analysis: Analysis, device: str | None, as_json: bool) -> S:
    """``part`` with the nodes ``device`` runs on the host (`offloadctl.running.residency`)."""
    if device is None:
        return part
    from offloadctl.running.residency import host_nodes

    found = host_nodes(analysis, device)
    if not as_json:
        out_console().print(
            f"{len(found.nodes)} node(s) run on the host on {found.how}: their tensors are kept; onnxruntime copies "
            f"{len(found.copies)} tensor(s) between host and device there",
            soft_wrap=True,
        )
    if found.casts and not as_json:
        out_console().print(
            f"onnxruntime wraps float16 nodes the CPU has no float16 kernel for in {len(found.casts)} Cast(s) there",
            soft_wrap=True,
        )
    return evolve(part, host_nodes=found.nodes, host_copies=found.copies, host_casts=found.casts, host_device=found.how)


def _plan_job(plan: Plan, plan_path: str) -> Job:
    """The job of a selected plan the budget strategy filters: its model, by the plan's rule."""
    try:
        return Job.of_plan(plan_path, stages=("selected",), plan=plan)
    except OffloadError as exc:
        raise OffloadError(
            f"the budget strategy needs the model of plan file {plan_path}: {exc.message}",
            hint=exc.hint or "re-create the plan with offloadctl plan",
        ) from None


def _stage_end(
    command: str,
    subject: str,
    plan: Plan,
    output: str,
    as_json: bool,
    explain: bool = False,
    defaulted: bool | None = None,
) -> None:
    """Summary (or JSON document) and verdict of a stage command that writes one plan."""
    figures = plan_figures(plan)
    if not as_json:
        print_plan_summary(plan)
        _print_search(plan, defaulted)
        if explain:
            out_console().print(explain_table(plan))
    off = figures["offloads"]
    noun = "candidate(s)" if plan["stage"] == "selected" else "offload(s)"
    finish(
        command,
        subject,
        [f"{off['count']} {noun}, {fmt_bytes(off['bytes'])}"],
        [output],
        as_json=as_json,
        doc={"model": plan["model"]["path"], **figures},
    )


@click.command("select")
@model_argument
@output_option("the selected plan (stage 'selected')")
@select_options
@sizes_option
@execution_order_option
@plan_device_option
@json_option
def select_cmd(
    model: str,
    output: str,
    selecting: SelectPart,
    shapes: ShapeOptions,
    sizes: SizesOptions,
    order: str | None,
    device: str | None,
    as_json: bool,
) -> None:
    """Find tensors idle for more than --select-distance positions (stage 'selected')."""
    check_output_path(output, model)
    job = open_model(model, shapes, sizes, show_progress=not as_json, order=order)
    job.guard("the plan", output)
    analysis = job.analysis
    selecting = _for_device(selecting, analysis, device, as_json)
    with steps(not as_json) as step:
        step("selecting")
        plan = select.run(analysis, selecting)
    write_plan(output, plan)
    _stage_end("select", model, plan, output, as_json)


@click.command("filter")
@click.argument("selected", type=click.Path(path_type=str))
@output_option("the filtered plan (stage 'filtered')")
@filter_options
@filter_budget_options
@explain_option
@json_option
def filter_cmd(
    selected: str,
    output: str,
    filtering: FilterPart,
    budgeting: BudgetPart,
    explain: bool,
    as_json: bool,
) -> None:
    """Keep the first --select-num candidates in first-use order (stage 'filtered').

    With --budget (budget strategy) it instead chooses what to offload so the simulated peak fits,
    assuming the default prefetch distance (each offload gets its own, smaller one if needed).
    """
    check_output_path(output, selected)
    request = FilterRequest.of(filtering, budgeting, PrefetchPart())
    selected_plan = read_plan(selected, stages=("selected",))
    if request.uses_budget:
        job = _plan_job(selected_plan, selected)
        job.guard("the plan", output)
        with steps(not as_json) as step:
            plan = budget_filter.run(selected_plan, job.analysis, evolve(request, step=step))
    else:
        if budgeting.copies != "inline":
            logger.warning(
                "--copies is the budget strategy's: without --budget the filter keeps the first --select-num"
            )
        plan = filter_plan.run(selected_plan, filtering)
    write_plan(output, plan)
    _stage_end("filter", selected, plan, output, as_json, explain, request.objective_defaulted or None)


@click.command("prefetch")
@click.argument("filtered", type=click.Path(path_type=str))
@output_option("the scheduled plan (stage 'scheduled')")
@prefetch_options
@json_option
def prefetch_cmd(filtered: str, output: str, prefetching: PrefetchPart, as_json: bool) -> None:
    """Place each host-to-device copy --prefetch-distance positions early (stage 'scheduled')."""
    check_output_path(output, filtered)
    plan = prefetch.run(read_plan(filtered, stages=("filtered",)), prefetching)
    write_plan(output, plan)
    _stage_end("prefetch", filtered, plan, output, as_json)


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
    request = _for_device(request, analysis, device, as_json)
    if (max_peak is not None or report is not None) and is_rewritten(analysis):
        raise OffloadError(
            f"{model} already contains copies: --max-peak and --report need the original model",
            hint="check the rewritten model with offloadctl simulate MODEL --max-peak BYTES --report FILE.md",
        )
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
        _print_search(plan, defaulted)
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
    _plan_verdict(analysis, plan, result, request, written, as_json, max_peak, search, failure, done.next_step)


def _largest_point(
    analysis: Analysis, points: list[dict[str, int]], as_json: bool
) -> tuple[Analysis, list[dict[str, int]]]:
    """The analysis at the shape point with the largest peak (the one given or one of ``points``),
    and the points left to check: a budget plan made at the largest fits the smaller ones too,
    which the plan command then checks."""
    base = simulate(analysis, None, profile=None).peak_before
    found = at_points(analysis, None, points, profile=None)
    k = max(range(len(found)), key=lambda i: found[i].result.peak_before)
    worst = found[k]
    if worst.result.peak_before <= base:
        return analysis, points
    if not as_json:
        dims = ", ".join(f"{d}={v}" for d, v in worst.dims.items())
        out_console().print(f"planning at the largest shape point, {dims} (peak {fmt_bytes(worst.result.peak_before)})")
    return point_analysis(analysis, points[k]), [dict(analysis.loaded.dims), *points[:k], *points[k + 1 :]]


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
    analysis: Analysis,
    plan: Plan,
    result: SimResult | None,
    request: PlanRequest,
    written: list[str | Path],
    as_json: bool,
    max_peak: int | None,
    search: dict[str, Any],
    point_failure: str | None = None,
    step: dict[str, Any] | None = None,
) -> None:
    """The plan command's last lines: the estimate, the advice on a weak plan (``step``: its next
    step, `offloadctl.pipeline.next_step`), and the verdict (``point_failure``: a shape point over the
    budget or --max-peak)."""
    model = str(analysis.loaded.path)
    if result is None:
        doc = {"model": model, "plan": written[0], **plan_figures(plan), **search}
        finish("plan", model, [], written, as_json=as_json, doc=doc)
        return
    figures = recorded_estimate(plan) or estimate_figures(result, request.copies)
    if not as_json:
        at = result.after.at(result.after.peak_step)
        where = f", at #{at['position']} {at['node']}" if at["step"] is not None and at["kind"] == "node" else ""
        print_estimate(figures, where=where)
    with paused_gc():
        warning = weak_plan_advice(analysis, plan, result=result)
    if warning:
        logger.warning("%s", warning)
    if step is not None:
        logger.warning("%s", next_step_text(step))
    bodies = unreached_bodies(analysis)
    if (text := unreached_text(bodies)) is not None:
        logger.warning("%s", text)
    warn_slowdown(figures)
    warn_broken_pins(figures, analysis.order)
    unknown = figures["unknown_size_tensors"]
    words, raised = plan_effect(figures, plan, bodies)
    finish(
        "plan",
        model,
        [peak_text(figures), words, slowdown_text(figures), low_figures_text(unknown)],
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
            "figures_low": bool(unknown),
            "peak_lowered": figures["peak_bytes"]["after"] < figures["peak_bytes"]["before"],
        },
    )


COMMANDS = [select_cmd, filter_cmd, prefetch_cmd, plan_cmd]
