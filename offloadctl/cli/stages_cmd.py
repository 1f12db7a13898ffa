"""`offloadctl select | filter | prefetch | plan`: the planning stages, each writing a plan file."""

from __future__ import annotations

import logging
from pathlib import Path

import click

from offloadctl.cli.common import check_unknown_sizes, load_and_analyse, print_plan_summary
from offloadctl.analysis import Analysis, analyse
from offloadctl.cli.options import (
    budget_options,
    filter_options,
    model_argument,
    output_option,
    prefetch_options,
    select_options,
    strict_option,
)
from offloadctl.cli.simulate_cmd import print_peak_change
from offloadctl.cli.ui import out_console, steps
from offloadctl.errors import OffloadError
from offloadctl.advice import weak_plan_advice
from offloadctl.explain import explain_table
from offloadctl.files import check_output_path
from offloadctl.model import load_model
from offloadctl.plan import check_plan_model, read_plan, write_plan
from offloadctl.stages import DEFAULT_PREFETCH_DISTANCE, DEFAULT_RELEASE_DISTANCE, filter_plan, prefetch, select
from offloadctl.stages.budget import budget_filter, check_budget

__all__ = ["COMMANDS"]

logger = logging.getLogger(__name__)


def _analyse_and_select(
    model: str, input_shape, select_distance, activations, params, force, never
) -> tuple[Analysis, dict]:
    analysis = load_and_analyse(model, input_shape)
    with steps() as step:
        step("selecting")
        plan = select(
            analysis,
            select_distance=select_distance,
            activations=activations,
            params=params,
            force=force,
            never=never,
        )
    return analysis, plan


def _use_budget(strategy: str | None, budget: int | None, stream_weights: bool) -> bool:
    """Resolve --strategy/--budget/--stream-weights; bad combinations are usage errors."""
    if strategy == "distance" and (budget is not None or stream_weights):
        raise click.UsageError("--budget and --stream-weights need the budget strategy, not --strategy distance")
    if strategy == "budget" and budget is None and not stream_weights:
        raise click.UsageError("--strategy budget needs --budget BYTES (or --stream-weights)")
    return strategy == "budget" or budget is not None or stream_weights


def _plan_analysis(plan: dict, plan_path: str) -> Analysis:
    """Re-load the model a plan was made for (same input shapes) and check it is the same file.

    The model is looked for at the path the plan records, then beside the plan file.
    """
    source = f"plan file {plan_path}"
    path = plan["model"]["path"]
    beside = Path(plan_path).parent / Path(path).name
    if not Path(path).exists() and beside.is_file():
        path = str(beside)
    try:
        loaded = load_model(path, input_shapes=plan["model"]["input_shapes"], input_shapes_from=f"model.input_shapes of {source}")
    except OffloadError as exc:
        raise OffloadError(
            f"the budget strategy needs the model of {source}, {path}: {exc.message}",
            hint="run the command from the directory the plan was made in, or re-create the plan with offloadctl plan",
        ) from None
    check_plan_model(plan, loaded.sha256, path)
    return analyse(loaded)


@click.command("select")
@model_argument
@output_option("the selected plan (stage 'selected')")
@select_options
def select_cmd(model, output, select_distance, activations, params, force, never, input_shape):
    """Find tensors idle for more than --select-distance positions (stage 'selected')."""
    check_output_path(output, model)
    analysis, plan = _analyse_and_select(model, input_shape, select_distance, activations, params, force, never)
    check_output_path(output, *analysis.loaded.files)
    write_plan(output, plan)
    print_plan_summary(plan, output)


@click.command("filter")
@click.argument("selected", type=click.Path(path_type=str))
@output_option("the filtered plan (stage 'filtered')")
@filter_options
@budget_options
def filter_cmd(selected, output, select_num, min_bytes, strategy, budget, stream_weights, stream_depth, explain):
    """Keep the first --select-num candidates in first-use order (stage 'filtered').

    With --budget (budget strategy) it instead chooses what to offload so the simulated peak fits,
    assuming the default prefetch distance (each offload gets its own, smaller one if needed).
    """
    check_output_path(output, selected)
    use_budget = _use_budget(strategy, budget, stream_weights)
    selected_plan = read_plan(selected, stages=("selected",))
    if use_budget:
        analysis = _plan_analysis(selected_plan, selected)
        check_output_path(output, selected, *analysis.loaded.files)
        with steps() as step:
            plan = budget_filter(
                selected_plan, analysis, budget_bytes=budget,
                prefetch_distance=DEFAULT_PREFETCH_DISTANCE, release_distance=DEFAULT_RELEASE_DISTANCE,
                select_num=select_num, min_bytes=min_bytes, stream_weights=stream_weights, stream_depth=stream_depth,
                report=step,
            )
    else:
        plan = filter_plan(selected_plan, select_num=select_num, min_bytes=min_bytes)
    write_plan(output, plan)
    print_plan_summary(plan, output)
    if explain:
        out_console().print(explain_table(plan))


@click.command("prefetch")
@click.argument("filtered", type=click.Path(path_type=str))
@output_option("the scheduled plan (stage 'scheduled')")
@prefetch_options
def prefetch_cmd(filtered, output, prefetch_distance, release_distance):
    """Place each host-to-device copy --prefetch-distance positions early (stage 'scheduled')."""
    check_output_path(output, filtered)
    plan = prefetch(
        read_plan(filtered, stages=("filtered",)),
        prefetch_distance=prefetch_distance,
        release_distance=release_distance,
    )
    write_plan(output, plan)
    print_plan_summary(plan, output)


@click.command("plan")
@model_argument
@output_option("the scheduled plan")
@select_options
@filter_options
@budget_options
@prefetch_options
@strict_option
def plan_cmd(
    model, output, select_distance, activations, params, force, never, input_shape,
    select_num, min_bytes, strategy, budget, stream_weights, stream_depth, explain,
    prefetch_distance, release_distance, strict,
):
    """select + filter + prefetch in one call; same document as chaining the three."""
    check_output_path(output, model)
    use_budget = _use_budget(strategy, budget, stream_weights)
    analysis, selected = _analyse_and_select(model, input_shape, select_distance, activations, params, force, never)
    check_output_path(output, *analysis.loaded.files)
    check_unknown_sizes(analysis, strict=strict)
    with steps(total=3) as step:
        if use_budget:
            step("fitting the budget")
            filtered = budget_filter(
                selected, analysis, budget_bytes=budget, prefetch_distance=prefetch_distance,
                release_distance=release_distance, select_num=select_num, min_bytes=min_bytes,
                stream_weights=stream_weights, stream_depth=stream_depth,
                report=lambda text: step(text, new=False),
            )
        else:
            step("filtering")
            filtered = filter_plan(selected, select_num=select_num, min_bytes=min_bytes)
        step("scheduling")
        plan = prefetch(filtered, prefetch_distance=prefetch_distance, release_distance=release_distance)
        if use_budget:
            check_budget(analysis, plan)
        step(f"writing {output}")
        write_plan(output, plan)
    print_plan_summary(plan, output)
    if explain:
        out_console().print(explain_table(plan))
    with steps() as step:
        step("simulating peak memory")
        print_peak_change(analysis, plan)
        warning = weak_plan_advice(analysis, plan)
    if warning:
        logger.warning("%s", warning)


COMMANDS = [select_cmd, filter_cmd, prefetch_cmd, plan_cmd]
