"""`offloadctl select | filter | prefetch`: the planning stages one by one, each writing a plan file (and
the helpers `offloadctl plan`, `offloadctl.cli.plan_cmd`, shares with them)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TypeVar

import click

from offloadctl.analysis.graph import Analysis
from offloadctl.cli.common import (
    finish,
    open_model,
    plan_figures,
    print_plan_summary,
)
from offloadctl.cli.options import (
    ShapeOptions,
    SizesOptions,
    execution_order_option,
    explain_option,
    filter_budget_options,
    filter_options,
    json_option,
    model_argument,
    output_option,
    plan_device_option,
    prefetch_options,
    select_options,
    sizes_option,
)
from offloadctl.cli.ui import out_console, steps
from offloadctl.contract.document import read_plan, write_plan
from offloadctl.core.errors import OffloadError
from offloadctl.core.files import check_output_path
from offloadctl.core.plantypes import BudgetRecord, Plan
from offloadctl.core.units import fmt_bytes
from offloadctl.job import Job
from offloadctl.planning.budget.strategy import budget_filter
from offloadctl.planning.explain import explain_table
from offloadctl.planning.filter import filter_plan
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
from offloadctl.simulation.costs import copy_mode_label

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


def print_search(plan: Plan, defaulted: bool | None = None) -> None:
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


def for_device(part: S, analysis: Analysis, device: str | None, as_json: bool) -> S:
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
        print_search(plan, defaulted)
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
    selecting = for_device(selecting, analysis, device, as_json)
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


COMMANDS = [select_cmd, filter_cmd, prefetch_cmd]
