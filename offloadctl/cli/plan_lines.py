"""What the planning commands (`offloadctl select | filter | prefetch | plan`) print alike: the budget
search's line (`print_search`), the nodes a device runs on the host (`host_placement`), and a stage's
summary and verdict (`stage_end`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from offloadctl.analysis.graph import Analysis
from offloadctl.cli.common import (
    finish,
    plan_figures,
    print_plan_summary,
    print_points,
)
from offloadctl.cli.ui import out_console
from offloadctl.core.plantypes import BudgetRecord, Plan
from offloadctl.core.units import fmt_bytes
from offloadctl.loading.placed import NO_HOST, HostPlacement
from offloadctl.planning.advice import unreached_bodies
from offloadctl.planning.explain import explain_table
from offloadctl.planning.passes import Planning
from offloadctl.planning.request import PlanRequest
from offloadctl.rewriting.modes import planned_copy_mode
from offloadctl.simulation.costs import copy_mode_label
from offloadctl.simulation.points import PointResult

__all__ = ["host_placement", "print_search", "stage_end"]


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


def host_placement(analysis: Analysis, device: str | None, as_json: bool) -> HostPlacement:
    """Where ``device`` runs the graph (`offloadctl.running.residency`), said in a line; none without one."""
    if device is None:
        return NO_HOST
    from offloadctl.running.residency import host_nodes
    from offloadctl.running.sessions import quiet_onnxruntime

    quiet_onnxruntime(device)  # a provider that does not load here is reported as predicted, not logged
    found = host_nodes(analysis, device)
    if not as_json:
        out_console().print(
            f"{len(found.nodes)} node(s) run on the host on {found.device}: their tensors are kept; onnxruntime copies "
            f"{len(found.copies)} tensor(s) between host and device there",
            soft_wrap=True,
        )
    if found.casts and not as_json:
        out_console().print(
            f"onnxruntime wraps float16 nodes the CPU has no float16 kernel for in {len(found.casts)} Cast(s) there",
            soft_wrap=True,
        )
    return found


def stage_end(
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


def print_plan(
    done: Planning, request: PlanRequest, checked: list[PointResult], explain: bool, as_json: bool
) -> dict[str, Any]:
    """The tables of what the plan offloads and how it was searched (not with --json), and the search's
    figures for the verdict's document."""
    plan, result, analysis = done.plan, done.simulation, done.analysis
    assert plan is not None
    budget = request.budget
    defaulted = budget.objective_defaulted if budget.uses_budget else None
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
        "objective": budget.objective_name if budget.uses_budget else None,
        "objective_default": defaulted,
        "copy_mode": planned_copy_mode(plan),  # streams that gain no time are planned in line
        "shape_points": [p.to_json() for p in checked],
    }
