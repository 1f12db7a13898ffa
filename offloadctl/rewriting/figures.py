"""The figures of what runs: a plan's peaks and time as the rewrite ``apply`` writes runs, on the device
the plan was made for, in the executor's order (`as_run_figures`). The report after the plan's
pipeline (`offloadctl.pipeline.with_figures`) records them in the plan; `simulate` quotes them for a
plan it is given."""

from __future__ import annotations

from collections.abc import Callable

from offloadctl.analysis.graph import Analysis
from offloadctl.core.bulk import paused_gc
from offloadctl.core.plantypes import Plan
from offloadctl.core.units import fmt_bytes
from offloadctl.loading.placed import NO_HOST, HostPlacement
from offloadctl.planning.budget.strategy import BudgetUnreachable
from offloadctl.planning.request import NO_PROGRESS, PlanRequest, Progress, runs_copy_streams
from offloadctl.rewriting.preview import device_result, placement_of, run_order_result, streams_run_result
from offloadctl.rewriting.rewrite import target_for
from offloadctl.simulation.estimate import (
    Estimate,
    estimate_figures,
    with_device_peaks,
    with_run_order_peak,
    with_run_time,
)
from offloadctl.simulation.profiles import Profile
from offloadctl.simulation.result import SimResult

__all__ = ["as_run_figures", "as_the_device_runs", "device_figures", "run_order_figures"]


def run_order_figures(
    plan: Plan,
    analysis: Analysis,
    result: SimResult,
    request: PlanRequest,
    copies: str | None = None,
    progress: Progress = NO_PROGRESS,
) -> Estimate:
    """The plan's figures (`as_run_figures` of the simulation's, for the request's device), its copies run
    as ``copies`` says (the request's mode by default)."""
    copies = copies or request.copies
    return as_run_figures(
        plan,
        analysis,
        estimate_figures(result, copies),
        host=request.select.host,
        report=progress.report,
        copies=copies,
        profile=request.budget.device_profile,
    )


def as_run_figures(
    plan: Plan,
    analysis: Analysis,
    figures: Estimate,
    *,
    host: HostPlacement = NO_HOST,
    report: Callable[[str], None] | None = None,
    copies: str = "inline",
    profile: Profile | None = None,
) -> Estimate:
    """``figures`` (`estimate_figures` of the plan's simulation) with the peaks of what runs: for a plan
    made for a device (``plan --device``: ``host``, the nodes it runs on the host and the copies
    and Casts onnxruntime inserts there), the model's and the rewrite's as that device runs them, in either order
    (`device_figures`); else with ``copies`` on streams the peak after of the rewrite as
    ``apply --copies streams`` writes it, in the order the executor runs its two streams (the copy stream
    runs ahead of compute until a gate stops it), in either order; else under the DEFAULT order the peak
    after of the rewrite as the walk over it runs (`offloadctl.rewriting.preview`: pins and copies reorder
    it), not of the planned sequence. PRIORITY_BASED on one stream runs the planned sequence itself.

    With ``copies`` on streams the time is the replay's too, on ``profile`` (`with_run_time`): the loads
    ``apply`` keeps in line and the copies a gate holds cost what they cost as the executor runs them."""
    if host.device:
        return device_figures(plan, analysis, figures, host, copies, profile=profile)
    if not plan["offloads"]:
        return figures
    if copies == "streams":
        if report is not None:
            report("replaying the rewrite as onnxruntime's executor runs its two streams")
        with paused_gc():
            replayed = streams_run_result(plan, analysis, profile=profile)
        return with_run_time(with_run_order_peak(figures, replayed, analysis.order, streams=True), replayed)
    if analysis.order != "default":
        return figures
    if report is not None:
        report("replaying the rewrite in onnxruntime's DEFAULT order")
    with paused_gc():
        replayed = run_order_result(plan, analysis)
    return with_run_order_peak(figures, replayed, analysis.order)


def device_figures(
    plan: Plan,
    analysis: Analysis,
    figures: Estimate,
    host: HostPlacement,
    copies: str = "inline",
    *,
    profile: Profile | None = None,
) -> Estimate:
    """``figures`` with the peaks of the model and of ``plan``'s rewrite as the device the plan was made
    for runs them (``plan --device``: ``host``, the nodes it runs on the host, the tensors onnxruntime
    copies there and the Casts it inserts), in the order its
    executor runs the two providers' streams in (`offloadctl.rewriting.preview.device_result`); with
    ``copies`` on streams, the rewrite as ``apply --copies streams`` writes it, its copy stream run
    ahead of compute until a gate stops it (`offloadctl.rewriting.preview.streams_run_result`), and then
    its time as it runs there on ``profile`` too (`with_run_time`: the copies onnxruntime inserts count,
    in the streams figure and in the in-line one it is compared with)."""
    device = host.name
    placement = placement_of(analysis, host)
    target = target_for(device)  # the pins `apply --target` writes for it
    with paused_gc():
        before, _ = device_result(None, analysis, placement, target=target, profile=profile)
        if not plan["offloads"]:
            after, pins = before, None
        elif copies == "streams" and runs_copy_streams(device):
            after, pins = streams_run_result(plan, analysis, target=target, placement=placement, profile=profile), None
        else:
            after, pins = device_result(plan, analysis, placement, target=target, profile=profile)
    checked = None if pins is None else (pins.checked, len(pins.violated))
    streams = copies == "streams" and runs_copy_streams(device) and bool(plan["offloads"])
    figures = with_device_peaks(figures, before, after, device, analysis.order, checked, streams=copies == "streams")
    return with_run_time(figures, after) if streams else figures


def as_the_device_runs(exc: BudgetUnreachable, analysis: Analysis, request: PlanRequest) -> BudgetUnreachable:
    """``exc`` for a plan made for a device (``plan --device``), saying what its figures count: a budget
    counts every node on the device, while the device runs some on the host, whose tensors are not in
    its memory, so the model's peak as the device runs it is another figure."""
    host = request.select.host
    device = host.name
    placement = placement_of(analysis, host)
    with paused_gc():
        as_run, _ = device_result(None, analysis, placement, target=target_for(device))
    return BudgetUnreachable(
        f"{exc.message}. A budget counts every node on the device; {device} runs {len(host.nodes)} of "
        f"them on the host, whose tensors it keeps in host memory, so the model as {device} runs it peaks at "
        f"{fmt_bytes(as_run.peak_after)}",
        hint=exc.hint,
        reachable=exc.reachable,
    )
