"""`offloadctl select | filter | prefetch | plan`: the planning stages, each writing a plan file."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import click

from offloadctl.analysis.graph import Analysis
from offloadctl.cli.common import (
    check_report_paths,
    check_unknown_sizes,
    finish,
    gate_failure,
    load_and_analyse,
    low_figures_text,
    peak_text,
    plan_effect,
    plan_figures,
    plan_pins,
    print_estimate,
    print_plan_summary,
    slowdown_text,
    warn_slowdown,
)
from offloadctl.cli.options import (
    BudgetOptions,
    FilterOptions,
    PrefetchOptions,
    SelectOptions,
    ShapeOptions,
    SizesOptions,
    budget_options,
    copies_option,
    filter_options,
    json_option,
    max_peak_option,
    max_slowdown_option,
    model_argument,
    objective_option,
    output_option,
    prefetch_options,
    profile_option,
    report_option,
    select_options,
    sizes_option,
    strict_option,
)
from offloadctl.cli.report import write_report
from offloadctl.cli.ui import out_console, steps
from offloadctl.contract.document import check_plan_model, read_plan, write_plan
from offloadctl.contract.types import Plan
from offloadctl.core.bulk import paused_gc
from offloadctl.core.errors import OffloadError
from offloadctl.core.files import check_output_path
from offloadctl.core.units import fmt_bytes
from offloadctl.loading.model import load_model
from offloadctl.planning.advice import weak_plan_advice
from offloadctl.planning.budget.strategy import budget_filter
from offloadctl.planning.explain import explain_table
from offloadctl.planning.filter import filter_plan
from offloadctl.planning.planners import make_plan
from offloadctl.planning.prefetch import DEFAULT_PREFETCH_DISTANCE, DEFAULT_RELEASE_DISTANCE, prefetch
from offloadctl.planning.select import select
from offloadctl.running.sizes import analysed
from offloadctl.simulation.base import is_rewritten
from offloadctl.simulation.costs import copy_mode_label, default_objective
from offloadctl.simulation.estimate import estimate_figures, record_estimate
from offloadctl.simulation.profiles import Profile, load_profile
from offloadctl.simulation.result import simulate

__all__ = ["COMMANDS"]

logger = logging.getLogger(__name__)


def _use_budget(budgeting: BudgetOptions, objective: str | None = None, max_slowdown: float | None = None) -> bool:
    """Resolve --strategy/--budget/--stream-weights/--objective/--optimal/--max-slowdown; bad combinations
    are usage errors."""
    strategy, budget, stream_weights, optimal = (
        budgeting.strategy,
        budgeting.budget,
        budgeting.stream_weights,
        budgeting.optimal,
    )
    if max_slowdown is not None:
        if budget is not None:
            raise click.UsageError("--max-slowdown and --budget are alternatives: give one of them")
        if stream_weights:
            raise click.UsageError("--max-slowdown chooses what to offload itself: drop --stream-weights")
        if strategy == "distance":
            raise click.UsageError("--max-slowdown needs the budget strategy, not --strategy distance")
        if optimal:
            raise click.UsageError(
                "--optimal needs --budget BYTES; --max-slowdown searches many budgets with the greedy"
            )
        return True
    if strategy == "distance" and (budget is not None or stream_weights):
        raise click.UsageError("--budget and --stream-weights need the budget strategy, not --strategy distance")
    if strategy == "budget" and budget is None and not stream_weights:
        raise click.UsageError("--strategy budget needs --budget BYTES (or --stream-weights, or --max-slowdown X)")
    if optimal and budget is None:
        raise click.UsageError("--optimal needs --budget BYTES (it finds the cheapest plan that fits the budget)")
    use = strategy == "budget" or budget is not None or stream_weights
    if objective is not None and not use:
        raise click.UsageError(
            "--objective is the budget strategy's: give --budget BYTES (or --stream-weights, --max-slowdown)"
        )
    return use


def _objective(objective: str | None, profile: Profile, copies: str, optimal: bool) -> tuple[str, bool]:
    """(the objective, True when it is the default for the profile); --optimal with a cost that is not
    linear (time with copies on streams) is a usage error."""
    defaulted = objective is None
    chosen = objective if objective is not None else default_objective(profile)
    if optimal and chosen == "time" and copies == "streams":
        because = " (the default with a measured profile)" if defaulted else ""
        raise click.UsageError(
            f"--optimal supports only the linear objectives: bytes, or time with copies in line. With --copies streams "
            f"the time objective{because} prices each copy by the compute around it, which the exact program cannot "
            "state: drop --optimal, or give --objective bytes or --copies inline"
        )
    return chosen, defaulted


def _objective_words(info: dict, defaulted: bool | None) -> str:
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
    info = plan.get("budget") or {}
    if info.get("cost") is None:
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
        line += f"; proven bound {fmt(info['cost_bound'])} ({source}): gap {100 * info['gap']:.1f}%"
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


def _plan_analysis(plan: Plan, plan_path: str) -> Analysis:
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
    return analysed(loaded)


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
@json_option
def select_cmd(
    model: str, output: str, selecting: SelectOptions, shapes: ShapeOptions, sizes: SizesOptions, as_json: bool
) -> None:
    """Find tensors idle for more than --select-distance positions (stage 'selected')."""
    check_output_path(output, model)
    analysis = load_and_analyse(model, shapes.input_shape, shapes.dim, show_progress=not as_json, sizes=sizes.request())
    check_output_path(output, *analysis.loaded.files)
    with steps(not as_json) as step:
        step("selecting")
        plan = select(
            analysis,
            **selecting.keywords(),
        )
    write_plan(output, plan)
    _stage_end("select", model, plan, output, as_json)


@click.command("filter")
@click.argument("selected", type=click.Path(path_type=str))
@output_option("the filtered plan (stage 'filtered')")
@filter_options
@budget_options
@objective_option
@copies_option
@profile_option
@json_option
def filter_cmd(
    selected: str,
    output: str,
    filtering: FilterOptions,
    budgeting: BudgetOptions,
    objective: str | None,
    copies: str,
    profile: str,
    as_json: bool,
) -> None:
    """Keep the first --select-num candidates in first-use order (stage 'filtered').

    With --budget (budget strategy) it instead chooses what to offload so the simulated peak fits,
    assuming the default prefetch distance (each offload gets its own, smaller one if needed).
    """
    check_output_path(output, selected)
    use_budget = _use_budget(budgeting, objective)
    defaulted = None
    if use_budget:
        prof = load_profile(profile)
        objective, defaulted = _objective(objective, prof, copies, budgeting.optimal)
    selected_plan = read_plan(selected, stages=("selected",))
    if use_budget:
        analysis = _plan_analysis(selected_plan, selected)
        check_output_path(output, selected, *analysis.loaded.files)
        assert objective is not None  # resolved with the profile above
        with steps(not as_json) as step:
            plan = budget_filter(
                selected_plan,
                analysis,
                budget_bytes=budgeting.budget,
                prefetch_distance=DEFAULT_PREFETCH_DISTANCE,
                release_distance=DEFAULT_RELEASE_DISTANCE,
                **filtering.keywords(),
                stream_weights=budgeting.stream_weights,
                stream_depth=budgeting.stream_depth,
                report=step,
                objective=objective,
                profile=prof,
                copies=copies,
                optimal=budgeting.optimal,
                time_limit=budgeting.time_limit,
            )
    else:
        if copies != "inline":
            logger.warning(
                "--copies is the budget strategy's: without --budget the filter keeps the first --select-num"
            )
        plan = filter_plan(selected_plan, **filtering.keywords())
    write_plan(output, plan)
    _stage_end("filter", selected, plan, output, as_json, budgeting.explain, defaulted)


@click.command("prefetch")
@click.argument("filtered", type=click.Path(path_type=str))
@output_option("the scheduled plan (stage 'scheduled')")
@prefetch_options
@json_option
def prefetch_cmd(filtered: str, output: str, prefetching: PrefetchOptions, as_json: bool) -> None:
    """Place each host-to-device copy --prefetch-distance positions early (stage 'scheduled')."""
    check_output_path(output, filtered)
    plan = prefetch(
        read_plan(filtered, stages=("filtered",)),
        **prefetching.keywords(),
    )
    write_plan(output, plan)
    _stage_end("prefetch", filtered, plan, output, as_json)


@click.command("plan")
@model_argument
@output_option("the scheduled plan")
@select_options
@sizes_option
@filter_options
@budget_options
@max_slowdown_option
@objective_option
@copies_option
@prefetch_options
@strict_option
@profile_option
@max_peak_option
@report_option
@json_option
def plan_cmd(
    model: str,
    output: str,
    selecting: SelectOptions,
    shapes: ShapeOptions,
    sizes: SizesOptions,
    filtering: FilterOptions,
    budgeting: BudgetOptions,
    max_slowdown: float | None,
    objective: str | None,
    copies: str,
    prefetching: PrefetchOptions,
    strict: bool,
    profile: str,
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
    use_budget = _use_budget(budgeting, objective, max_slowdown)
    prof = load_profile(profile)
    defaulted = None
    if use_budget:
        objective, defaulted = _objective(objective, prof, copies, budgeting.optimal)
    analysis = load_and_analyse(model, shapes.input_shape, shapes.dim, show_progress=not as_json, sizes=sizes.request())
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
            analysis,
            **selecting.keywords(),
            **filtering.keywords(),
            **prefetching.keywords(),
            strategy="budget" if use_budget else "distance",
            budget=budgeting.budget,
            stream_weights=budgeting.stream_weights,
            stream_depth=budgeting.stream_depth,
            step=step,
            objective=objective,
            profile=prof,
            optimal=budgeting.optimal,
            time_limit=budgeting.time_limit,
            copies=copies,
            max_slowdown=max_slowdown,
        )
        step("simulating peak memory and time")
        with paused_gc():
            result = None if is_rewritten(analysis) else simulate(analysis, plan, profile=prof)
            warning = None if result is None else weak_plan_advice(analysis, plan, result=result)
        figures = None if result is None else estimate_figures(result, copies)
        if figures is not None:
            record_estimate(plan, figures)  # apply quotes it instead of simulating again
        step(f"writing {output}")
        write_plan(output, plan)
    written: list[str | Path] = [output]
    if report is not None and result is not None:
        written += write_report(report, result, plan)
    if not as_json:
        print_plan_summary(plan)
        _print_search(plan, defaulted)
        if budgeting.explain:
            out_console().print(explain_table(plan))
        if result is None:
            out_console().print("the model already contains copies: simulate the rewritten model to see its peak")
    search = {"objective": objective if use_budget else None, "objective_default": defaulted, "copy_mode": copies}
    if result is None or figures is None:
        finish(
            "plan",
            model,
            [],
            written,
            as_json=as_json,
            doc={"model": model, "plan": output, **plan_figures(plan), **search},
        )
        return
    if not as_json:
        at = result.after.at(result.after.peak_step)
        where = f", at #{at['position']} {at['node']}" if at["step"] is not None and at["kind"] == "node" else ""
        print_estimate(figures, where=where)
    if warning:
        logger.warning("%s", warning)
    warn_slowdown(figures)
    unknown = figures["unknown_size_tensors"]
    words, raised = plan_effect(figures)
    finish(
        "plan",
        model,
        [peak_text(figures), words, slowdown_text(figures), low_figures_text(unknown)],
        written,
        as_json=as_json,
        failure=raised or gate_failure(max_peak, result.peak_after, "peak after the plan", unknown=unknown),
        doc={
            "model": model,
            "plan": output,
            **plan_figures(plan),
            **figures,
            **search,
            "max_peak_bytes": max_peak,
            "figures_low": bool(unknown),
            "peak_lowered": figures["peak_bytes"]["after"] < figures["peak_bytes"]["before"],
        },
    )


COMMANDS = [select_cmd, filter_cmd, prefetch_cmd, plan_cmd]
