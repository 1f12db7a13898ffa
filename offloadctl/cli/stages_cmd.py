"""`offloadctl select | filter | prefetch`: the planning stages one by one, each writing a plan file."""

from __future__ import annotations

import dataclasses
import logging

import click

from offloadctl.cli.common import ModelArgs, model_group
from offloadctl.cli.options import (
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
from offloadctl.cli.plan_lines import host_placement, stage_end
from offloadctl.cli.ui import steps
from offloadctl.contract.document import read_plan, write_plan
from offloadctl.core.errors import OffloadError
from offloadctl.core.files import check_output_path
from offloadctl.core.plantypes import Plan
from offloadctl.job import Job
from offloadctl.planning.budget.strategy import budget_filter
from offloadctl.planning.filter import filter_plan
from offloadctl.planning.prefetch import prefetch
from offloadctl.planning.request import (
    BudgetPart,
    FilterPart,
    FilterRequest,
    PrefetchPart,
    Progress,
    SelectPart,
)
from offloadctl.planning.select import select

__all__ = ["COMMANDS"]

logger = logging.getLogger(__name__)


def _plan_job(plan: Plan, plan_path: str) -> Job:
    """The job of a selected plan the budget strategy filters: its model, by the plan's rule."""
    try:
        return Job.of_plan(plan_path, stages=("selected",), plan=plan)
    except OffloadError as exc:
        raise OffloadError(
            f"the budget strategy needs the model of plan file {plan_path}: {exc.message}",
            hint=exc.hint or "re-create the plan with offloadctl plan",
        ) from None


@click.command("select")
@model_argument
@output_option("the selected plan (stage 'selected')")
@select_options
@sizes_option
@execution_order_option
@plan_device_option
@json_option
@model_group
def select_cmd(
    model: ModelArgs,
    output: str,
    selecting: SelectPart,
    device: str | None,
    as_json: bool,
) -> None:
    """Find tensors idle for more than --select-distance positions (stage 'selected')."""
    check_output_path(output, model.path)
    job = model.open(show_progress=not as_json)
    job.guard("the plan", output)
    analysis = job.analysis
    selecting = dataclasses.replace(selecting, host=host_placement(analysis, device, as_json))
    with steps(not as_json) as step:
        step("selecting")
        plan = select(analysis, selecting)
    write_plan(output, plan)
    stage_end("select", model.path, plan, output, as_json)


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
    request = FilterRequest(filter=filtering, budget=budgeting)
    selected_plan = read_plan(selected, stages=("selected",))
    if budgeting.uses_budget:
        job = _plan_job(selected_plan, selected)
        job.guard("the plan", output)
        with steps(not as_json) as step:
            plan = budget_filter(selected_plan, job.analysis, request, Progress(step))
    else:
        if budgeting.copies != "inline":
            logger.warning(
                "--copies is the budget strategy's: without --budget the filter keeps the first --select-num"
            )
        plan = filter_plan(selected_plan, filtering)
    write_plan(output, plan)
    stage_end("filter", selected, plan, output, as_json, explain, budgeting.objective_defaulted or None)


@click.command("prefetch")
@click.argument("filtered", type=click.Path(path_type=str))
@output_option("the scheduled plan (stage 'scheduled')")
@prefetch_options
@json_option
def prefetch_cmd(filtered: str, output: str, prefetching: PrefetchPart, as_json: bool) -> None:
    """Place each host-to-device copy --prefetch-distance positions early (stage 'scheduled')."""
    check_output_path(output, filtered)
    plan = prefetch(read_plan(filtered, stages=("filtered",)), prefetching)
    write_plan(output, plan)
    stage_end("prefetch", filtered, plan, output, as_json)


COMMANDS = [select_cmd, filter_cmd, prefetch_cmd]
