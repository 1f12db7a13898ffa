"""`offloadctl select | filter | prefetch | plan`: the planning stages, each writing a plan file."""

from __future__ import annotations

import logging
from pathlib import Path

import click

from offloadctl.advice import weak_plan_advice
from offloadctl.analysis import Analysis, analyse
from offloadctl.cli.common import (
    check_report_paths,
    check_unknown_sizes,
    finish,
    gate_failure,
    load_and_analyse,
    peak_text,
    plan_figures,
    plan_pins,
    print_estimate,
    print_plan_summary,
    slowdown_text,
    warn_slowdown,
)
from offloadctl.cli.options import (
    budget_options,
    filter_options,
    json_option,
    max_peak_option,
    model_argument,
    output_option,
    prefetch_options,
    profile_option,
    report_option,
    select_options,
    strict_option,
)
from offloadctl.cli.ui import fmt_bytes, out_console, steps
from offloadctl.errors import OffloadError
from offloadctl.estimate import estimate_figures, record_estimate
from offloadctl.explain import explain_table
from offloadctl.files import check_output_path
from offloadctl.model import load_model
from offloadctl.plan import check_plan_model, read_plan, write_plan
from offloadctl.profiles import load_profile
from offloadctl.report import write_report
from offloadctl.simulate import is_rewritten, simulate
from offloadctl.stages import DEFAULT_PREFETCH_DISTANCE, DEFAULT_RELEASE_DISTANCE, filter_plan, make_plan, prefetch, select
from offloadctl.stages.budget import budget_filter

__all__ = ["COMMANDS"]

logger = logging.getLogger(__name__)


def _use_budget(
    strategy: str | None, budget: int | None, stream_weights: bool, objective: str = "bytes", optimal: bool = False
) -> bool:
    """Resolve --strategy/--budget/--stream-weights/--objective/--optimal; bad combinations are usage errors."""
    if strategy == "distance" and (budget is not None or stream_weights):
        raise click.UsageError("--budget and --stream-weights need the budget strategy, not --strategy distance")
    if strategy == "budget" and budget is None and not stream_weights:
        raise click.UsageError("--strategy budget needs --budget BYTES (or --stream-weights)")
    if optimal and budget is None:
        raise click.UsageError("--optimal needs --budget BYTES (it finds the cheapest plan that fits the budget)")
    use = strategy == "budget" or budget is not None or stream_weights
    if objective != "bytes" and not use:
        raise click.UsageError("--objective is the budget strategy's: give --budget BYTES (or --stream-weights)")
    return use


def _print_search(plan: dict) -> None:
    """One line: what the budget plan costs, the proven bound and the gap (or that it is optimal)."""
    info = plan.get("budget") or {}
    if info.get("cost") is None:
        return
    objective = info["objective"]
    if objective["unit"] == "bytes":
        fmt = fmt_bytes
        line = f"budget search ({info['search']}): the plan moves {fmt(info['cost'])}"
    else:
        fmt = lambda v: f"{v * 1e3:.3f} ms"  # noqa: E731
        line = (
            f"budget search ({info['search']}): the plan's copies take {fmt(info['cost'])} in line "
            f"(profile {objective.get('profile')})"
        )
    if info["optimal"]:
        line += ", proven optimal"
    elif info["cost_bound"] is not None:
        source = "HiGHS" if info["bound_source"] == "solver" else "the steps furthest over the budget"
        line += f"; proven bound {fmt(info['cost_bound'])} ({source}): gap {100 * info['gap']:.1f}%"
    else:
        line += "; no bound proven (try --optimal)"
    solver = info.get("solver")
    if solver:
        line += f"; HiGHS: {solver['status']} in {solver['seconds']:.1f} s"
        if solver["answer"] != "accepted":
            line += f", {solver['answer']}"
    out_console().print(line)


def _plan_analysis(plan: dict, plan_path: str) -> Analysis:
    """Re-load the model a plan was made for (same input pins) and check it is the same file.

    The model is looked for at the path the plan records, then beside the plan file.
    """
    source = f"plan file {plan_path}"
    path = plan["model"]["path"]
    beside = Path(plan_path).parent / Path(path).name
    if not Path(path).exists() and beside.is_file():
        path = str(beside)
    try:
        loaded = load_model(path, **plan_pins(plan), input_shapes_from=f"model.input_shapes of {source}")
    except OffloadError as exc:
        raise OffloadError(
            f"the budget strategy needs the model of {source}, {path}: {exc.message}",
            hint="run the command from the directory the plan was made in, or re-create the plan with offloadctl plan",
        ) from None
    check_plan_model(plan, loaded.sha256, path)
    return analyse(loaded)


def _stage_end(command: str, subject: str, plan: dict, output: str, as_json: bool, explain: bool = False) -> None:
    """Summary (or JSON document) and verdict of a stage command that writes one plan."""
    figures = plan_figures(plan)
    if not as_json:
        print_plan_summary(plan)
        _print_search(plan)
        if explain:
            out_console().print(explain_table(plan))
    off = figures["offloads"]
    noun = "candidate(s)" if plan["stage"] == "selected" else "offload(s)"
    finish(
        command, subject, [f"{off['count']} {noun}, {fmt_bytes(off['bytes'])}"], [output],
        as_json=as_json, doc={"model": plan["model"]["path"], **figures},
    )


@click.command("select")
@model_argument
@output_option("the selected plan (stage 'selected')")
@select_options
@json_option
def select_cmd(model, output, select_distance, activations, params, force, never, input_shape, dim, as_json):
    """Find tensors idle for more than --select-distance positions (stage 'selected')."""
    check_output_path(output, model)
    analysis = load_and_analyse(model, input_shape, dim, show_progress=not as_json)
    check_output_path(output, *analysis.loaded.files)
    with steps(not as_json) as step:
        step("selecting")
        plan = select(
            analysis, select_distance=select_distance, activations=activations, params=params, force=force, never=never
        )
    write_plan(output, plan)
    _stage_end("select", model, plan, output, as_json)


@click.command("filter")
@click.argument("selected", type=click.Path(path_type=str))
@output_option("the filtered plan (stage 'filtered')")
@filter_options
@budget_options
@profile_option
@json_option
def filter_cmd(
    selected, output, select_num, min_bytes, strategy, budget, stream_weights, stream_depth, explain,
    objective, optimal, time_limit, profile, as_json,
):
    """Keep the first --select-num candidates in first-use order (stage 'filtered').

    With --budget (budget strategy) it instead chooses what to offload so the simulated peak fits,
    assuming the default prefetch distance (each offload gets its own, smaller one if needed).
    """
    check_output_path(output, selected)
    use_budget = _use_budget(strategy, budget, stream_weights, objective, optimal)
    selected_plan = read_plan(selected, stages=("selected",))
    if use_budget:
        analysis = _plan_analysis(selected_plan, selected)
        check_output_path(output, selected, *analysis.loaded.files)
        with steps(not as_json) as step:
            plan = budget_filter(
                selected_plan, analysis, budget_bytes=budget,
                prefetch_distance=DEFAULT_PREFETCH_DISTANCE, release_distance=DEFAULT_RELEASE_DISTANCE,
                select_num=select_num, min_bytes=min_bytes, stream_weights=stream_weights, stream_depth=stream_depth,
                report=step, objective=objective, profile=load_profile(profile) if objective == "time" else None,
                optimal=optimal, time_limit=time_limit,
            )
    else:
        plan = filter_plan(selected_plan, select_num=select_num, min_bytes=min_bytes)
    write_plan(output, plan)
    _stage_end("filter", selected, plan, output, as_json, explain)


@click.command("prefetch")
@click.argument("filtered", type=click.Path(path_type=str))
@output_option("the scheduled plan (stage 'scheduled')")
@prefetch_options
@json_option
def prefetch_cmd(filtered, output, prefetch_distance, release_distance, as_json):
    """Place each host-to-device copy --prefetch-distance positions early (stage 'scheduled')."""
    check_output_path(output, filtered)
    plan = prefetch(
        read_plan(filtered, stages=("filtered",)),
        prefetch_distance=prefetch_distance,
        release_distance=release_distance,
    )
    write_plan(output, plan)
    _stage_end("prefetch", filtered, plan, output, as_json)


@click.command("plan")
@model_argument
@output_option("the scheduled plan")
@select_options
@filter_options
@budget_options
@prefetch_options
@strict_option
@profile_option
@max_peak_option
@report_option
@json_option
def plan_cmd(
    model, output, select_distance, activations, params, force, never, input_shape, dim,
    select_num, min_bytes, strategy, budget, stream_weights, stream_depth, explain,
    objective, optimal, time_limit, prefetch_distance, release_distance, strict, profile, max_peak, report, as_json,
):
    """select + filter + prefetch in one call; same document as chaining the three.

    Ends with the simulated peak before and after and the estimated slowdown (--profile); with
    --max-peak it exits 1 when the peak after the plan is above it (the plan is still written).
    """
    check_output_path(output, model)
    check_report_paths(report, model, others=[("the plan", output)])
    use_budget = _use_budget(strategy, budget, stream_weights, objective, optimal)
    prof = load_profile(profile)
    analysis = load_and_analyse(model, input_shape, dim, show_progress=not as_json)
    check_output_path(output, *analysis.loaded.files)
    if report is not None:
        check_report_paths(report, *analysis.loaded.files, others=[("the plan", output)])
    check_unknown_sizes(analysis, strict=strict)
    if (max_peak is not None or report is not None) and is_rewritten(analysis):
        raise OffloadError(
            f"{model} already contains copies: --max-peak and --report need the original model",
            hint="check the rewritten model with offloadctl simulate MODEL --max-peak BYTES --report FILE.md",
        )
    with steps(not as_json, total=5) as step:
        plan = make_plan(
            analysis, select_distance=select_distance, activations=activations, params=params, force=force,
            never=never, select_num=select_num, min_bytes=min_bytes, prefetch_distance=prefetch_distance,
            release_distance=release_distance, strategy="budget" if use_budget else "distance", budget=budget,
            stream_weights=stream_weights, stream_depth=stream_depth, step=step, objective=objective,
            profile=prof, optimal=optimal, time_limit=time_limit,
        )
        step("simulating peak memory and time")
        result = None if is_rewritten(analysis) else simulate(analysis, plan, profile=prof)
        warning = None if result is None else weak_plan_advice(analysis, plan)
        figures = None if result is None else estimate_figures(result)
        if figures is not None:
            record_estimate(plan, figures)  # apply quotes it instead of simulating again
        step(f"writing {output}")
        write_plan(output, plan)
    written: list[str | Path] = [output]
    if report is not None and result is not None:
        written += write_report(report, result, plan)
    if not as_json:
        print_plan_summary(plan)
        _print_search(plan)
        if explain:
            out_console().print(explain_table(plan))
        if result is None:
            out_console().print("the model already contains copies: simulate the rewritten model to see its peak")
    if result is None or figures is None:
        finish("plan", model, [], written, as_json=as_json, doc={"model": model, "plan": output, **plan_figures(plan)})
        return
    if not as_json:
        at = result.after.at(result.after.peak_step)
        where = f", at #{at['position']} {at['node']}" if at["step"] is not None and at["kind"] == "node" else ""
        print_estimate(figures, where=where)
    if warning:
        logger.warning("%s", warning)
    warn_slowdown(figures)
    finish(
        "plan", model, [peak_text(figures), slowdown_text(figures)], written, as_json=as_json,
        failure=gate_failure(max_peak, result.peak_after, "peak after the plan"),
        doc={"model": model, "plan": output, **plan_figures(plan), **figures, "max_peak_bytes": max_peak},
    )


COMMANDS = [select_cmd, filter_cmd, prefetch_cmd, plan_cmd]
