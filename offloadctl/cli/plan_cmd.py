"""`offloadctl plan`: the plan made by the declared pipeline (`offloadctl.pipeline`) in one call, the
same document as chaining select, filter and prefetch, with the figures of what runs and its verdict."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from shlex import quote
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
    opt_level_option,
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
from offloadctl.core.errors import OffloadError
from offloadctl.core.files import check_output_path, restored_on_failure, written_through
from offloadctl.core.units import fmt_bytes
from offloadctl.job import Job
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
from offloadctl.rewriting.modes import planned_copy_mode
from offloadctl.running.optimize import OptimizedModel, optimized_model, optimized_outputs, optimized_path
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
@opt_level_option(
    "Plan the graph onnxruntime runs at this level: it is optimized for --device and written beside the plan "
    "(PLAN.optimized.onnx, the model to apply the plan to); the rewrite then runs at disable, its fusions kept."
)
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
    opt_level: str,
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
    # --opt-level writes the optimized graph beside the plan: a failure leaves neither it nor an earlier one lost
    with restored_on_failure(*_optimized_outputs(output, opt_level)), _as_asked(model, output, opt_level):
        opened = _Opened.of(model, output, opt_level, device, shapes, sizes, order, as_json)
        analysis, request, points = opened.prepare(
            output, request, device, report, strict, max_peak, shape_points, as_json
        )
        with steps(not as_json, total=len(PIPELINE) + 1) as step:  # its passes, and writing the plan
            done, checked = _plan_and_simulate(analysis, evolve(request, step=step), output, step, points, opened)
        done = opened.next_step_of_source(done, opt_level)
        written = opened.written(output, report, done)
        search = _print_plan(done, request, checked, explain, as_json)
        budget = request.budget_bytes if request.uses_budget else None
        failure = points_failure(checked, budget, "the budget") or points_failure(checked, max_peak, "--max-peak")
        _plan_verdict(done, written, as_json, max_peak, search, failure, budget=budget)


def _optimized_outputs(output: str, opt_level: str) -> list[Path]:
    """What ``plan --opt-level`` writes beside the plan (nothing at ``disable``)."""
    return list(optimized_outputs(output)) if opt_level != "disable" else []


@dataclasses.dataclass
class _Opened:
    """The model a plan is made for, opened (the plan command's model group): the model asked for, or at
    ``--opt-level`` the graph onnxruntime optimized from it, written beside the plan."""

    job: Job
    optimized: OptimizedModel | None

    @classmethod
    def of(
        cls,
        model: str,
        output: str,
        opt_level: str,
        device: str | None,
        shapes: ShapeOptions,
        sizes: SizesOptions,
        order: str | None,
        as_json: bool,
    ) -> _Opened:
        optimized = _optimized(model, output, opt_level, device) if opt_level != "disable" else None
        if optimized is not None and sizes.request() is None:  # shape inference knows no com.microsoft operator
            sizes = SizesOptions(sizes_from_run=True, inputs=None)
        planned = str(optimized.path) if optimized else model
        job = open_model(planned, shapes, sizes, show_progress=not as_json, order=order)
        job.guard("the plan", output)
        return cls(job, optimized)

    def prepare(
        self,
        output: str,
        request: PlanRequest,
        device: str | None,
        report: str | None,
        strict: bool,
        max_peak: int | None,
        shape_points: tuple[str, ...],
        as_json: bool,
    ) -> tuple[Analysis, PlanRequest, list[dict[str, int]]]:
        """The analysis the plan is made on (at the largest shape point on a budget), the request with what
        ``device`` runs on the host, and the shape points; refuses what the model cannot be planned with."""
        analysis = self.job.analysis
        if report is not None:
            check_report_paths(report, *self.job.reads, others=[("the plan", output)])
        check_unknown_sizes(analysis, strict=strict)
        request = for_device(request, analysis, device, as_json)
        if max_peak is not None or report is not None:
            hint = "check the rewritten model with offloadctl simulate MODEL --max-peak BYTES --report FILE.md"
            check_original(analysis, "--max-peak and --report", hint)
        points = [parse_point(p) for p in shape_points]
        if points and request.uses_budget:
            analysis, points = _largest_point(analysis, points, as_json)
        return analysis, request, points

    def next_step_of_source(self, done: Planning, level: str) -> Planning:
        """``done`` with a weak plan's next step planning the model asked for, not the optimized graph."""
        if self.optimized is None or done.next_step is None:
            return done
        return dataclasses.replace(done, next_step=_of_source(done.next_step, self.optimized, level))

    def written(self, output: str, report: str | None, done: Planning) -> list[str | Path]:
        """The files the command wrote: the plan, the optimized graph and its data, the report."""
        made = [self.optimized.path, *self.optimized.data_files] if self.optimized else []
        written: list[str | Path] = [output, *made]
        if report is not None and done.simulation is not None and done.plan is not None:
            written += write_report(report, done.simulation, done.plan)
        return written


def _print_plan(
    done: Planning, request: PlanRequest, checked: list[PointResult], explain: bool, as_json: bool
) -> dict[str, Any]:
    """The tables of what the plan offloads and how it was searched (not with --json), and the search's
    figures for the verdict's document."""
    plan, result, analysis = done.plan, done.simulation, done.analysis
    assert plan is not None
    defaulted = request.objective_defaulted if request.uses_budget else None
    if not as_json:
        print_plan_summary(plan)
        print_search(plan, defaulted)
        if explain:
            out_console().print(explain_table(plan, unreached_bodies(analysis)))
        if result is None:
            out_console().print("the model already contains copies: simulate the rewritten model to see its peak")
        elif checked:
            print_points(analysis.loaded.dims, result, checked)
    return {
        "objective": request.objective_name if request.uses_budget else None,
        "objective_default": defaulted,
        "copy_mode": planned_copy_mode(plan),  # streams that gain no time are planned in line
        "shape_points": [p.to_json() for p in checked],
    }


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
    opened: _Opened | None = None,
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
    if opened is not None and opened.optimized is not None:  # the plan's model is onnxruntime's optimized graph
        plan["model"]["optimized"] = opened.optimized.to_json()  # from what, at what level
    step(f"writing {output}")
    write_plan(output, plan)
    return done, checked


def _optimized(model: str, output: str, level: str, device: str | None) -> OptimizedModel:
    """``plan --opt-level``: the graph onnxruntime runs at ``level`` for ``device``, written beside the plan
    (`offloadctl.running.optimize`), which is then the model planned; says when another level was made."""
    if written_through(output):
        raise OffloadError(
            f"--opt-level writes the optimized graph beside the plan, and {output} is not a file",
            hint="give -o the path of a plan file, or plan without --opt-level",
        )
    out = optimized_path(output)
    for path in optimized_outputs(output):
        check_output_path(path, model)
    made = optimized_model(model, out, level, device)
    if made.why is not None:
        logger.warning("planned at --opt-level %s, not %s: %s", made.level, level, made.why)
    return made


@contextlib.contextmanager
def _as_asked(model: str, output: str, level: str) -> Iterator[None]:
    """A failure of ``plan --opt-level`` names the model asked for at its level, not the optimized graph,
    which the failure leaves unwritten."""
    try:
        yield
    except OffloadError as exc:
        if level != "disable":
            written = str(optimized_path(output))
            exc.restate(exc.message.replace(written, f"{model} (at --opt-level {level})"), exc.hint)
        raise


def _of_source(step: dict[str, Any], optimized: OptimizedModel, level: str) -> dict[str, Any]:
    """A weak plan's next step with the model asked for and ``--opt-level``, not the optimized graph."""
    command = step["command"].replace(quote(str(optimized.path)), f"{quote(optimized.source)} --opt-level {level}", 1)
    return {**step, "command": command}


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
