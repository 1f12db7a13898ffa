"""`offloadctl select | filter | prefetch | plan`: the planning stages, each writing a plan file."""

from __future__ import annotations

import click

from offloadctl.cli.common import load_and_analyse, print_plan_summary
from offloadctl.cli.options import filter_options, model_argument, output_option, prefetch_options, select_options
from offloadctl.files import check_output_path
from offloadctl.plan import read_plan, write_plan
from offloadctl.stages import filter_plan, prefetch, select

__all__ = ["COMMANDS"]


def _select(model: str, input_shape, select_distance, activations, params, force, never) -> dict:
    analysis = load_and_analyse(model, input_shape)
    return select(
        analysis,
        select_distance=select_distance,
        activations=activations,
        params=params,
        force=force,
        never=never,
    )


@click.command("select")
@model_argument
@output_option("the selected plan (stage 'selected')")
@select_options
def select_cmd(model, output, select_distance, activations, params, force, never, input_shape):
    """Find tensors idle for more than --select-distance positions (stage 'selected')."""
    check_output_path(output, model)
    plan = _select(model, input_shape, select_distance, activations, params, force, never)
    write_plan(output, plan)
    print_plan_summary(plan, output)


@click.command("filter")
@click.argument("selected", type=click.Path(path_type=str))
@output_option("the filtered plan (stage 'filtered')")
@filter_options
def filter_cmd(selected, output, select_num, min_bytes):
    """Keep the first --select-num candidates in first-use order (stage 'filtered')."""
    check_output_path(output, selected)
    plan = filter_plan(read_plan(selected, stages=("selected",)), select_num=select_num, min_bytes=min_bytes)
    write_plan(output, plan)
    print_plan_summary(plan, output)


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
@prefetch_options
def plan_cmd(
    model, output, select_distance, activations, params, force, never, input_shape,
    select_num, min_bytes, prefetch_distance, release_distance,
):
    """select + filter + prefetch in one call; same document as chaining the three."""
    check_output_path(output, model)
    selected = _select(model, input_shape, select_distance, activations, params, force, never)
    filtered = filter_plan(selected, select_num=select_num, min_bytes=min_bytes)
    plan = prefetch(filtered, prefetch_distance=prefetch_distance, release_distance=release_distance)
    write_plan(output, plan)
    print_plan_summary(plan, output)


COMMANDS = [select_cmd, filter_cmd, prefetch_cmd, plan_cmd]
