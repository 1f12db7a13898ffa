"""What the commands print of a plan's figures (`offloadctl.simulation.estimate.Estimate`): the peak
before and after as it runs (`peak_text`), the estimated slowdown (`slowdown_text`, `print_estimate`),
what a plan does to the peak (`plan_effect`), and the warnings a plan's figures call for: a slowdown
over `offloadctl.cli.report.SLOWDOWN_WARNING`, streams that gain no time, order pins a device's order
breaks."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from offloadctl.cli.report import SLOWDOWN_WARNING
from offloadctl.cli.ui import out_console
from offloadctl.core.plantypes import Plan
from offloadctl.core.units import fmt_bytes
from offloadctl.simulation.costs import STREAMS_NOTE, copy_mode_label
from offloadctl.simulation.estimate import Estimate, Peaks

__all__ = [
    "BARELY",
    "peak_text",
    "plan_effect",
    "print_estimate",
    "slowdown_text",
    "warn_broken_pins",
    "warn_slowdown",
    "warn_streams_slower",
]

logger = logging.getLogger(__name__)


def peak_text(peak: Peaks) -> str:
    """``peak 1.20 MiB -> 0.90 MiB (-25.0%)`` of a plan's `offloadctl.simulation.estimate.Peaks`."""
    before, after = peak.before, peak.after
    change = f" ({100.0 * (after - before) / before:+.1f}%)" if before else ""
    planned = peak.planned_after
    if peak.device:
        run = f" as {peak.device} runs it; planned {fmt_bytes(peak.planned_before or 0)} -> {fmt_bytes(planned or 0)}"
    else:
        by = peak.run_by or "the DEFAULT walk"
        run = f" as {by} runs it; planned {fmt_bytes(planned)}" if planned not in (None, after) else ""
    return f"peak {fmt_bytes(before)} -> {fmt_bytes(after)}{change}{run}"


def slowdown_text(figures: Estimate) -> str | None:
    """``est. slowdown 1.12x (copies in line, profile ...)`` under the figures' copy mode (default inline)."""
    if not figures.slowdown:
        return None
    mode = figures.copy_mode or "inline"
    key = "overlapped" if mode == "streams" else "serialized"
    return f"est. slowdown {figures.slowdown[key]:.2f}x ({copy_mode_label(mode)}, profile {figures.profile})"


def warn_slowdown(figures: Estimate) -> None:
    """Warn when the estimated slowdown with copies in line is over `SLOWDOWN_WARNING`."""
    slow = figures.slowdown
    if slow and slow["serialized"] > SLOWDOWN_WARNING:
        logger.warning(
            "the estimated slowdown with copies in line (how onnxruntime runs them) is %.2fx, over %.1fx "
            "(profile %s; %.2fx if copies could overlap compute): fewer or larger-gap offloads cost less "
            "(a larger --select-distance or --min-bytes, or a --budget closer to the peak)",
            slow["serialized"],
            SLOWDOWN_WARNING,
            figures.profile,
            slow["overlapped"],
        )


def warn_streams_slower(figures: Estimate) -> None:
    """Warn when a plan made for copies on streams estimates no time gained over in line, as the executor
    runs its two streams: its events cost more than the overlap hides, so its copies run in line
    (`offloadctl.simulation.estimate.streams_declined`) and its figures are those in line."""
    declined = figures.streams_declined
    if declined and declined.get("peaks"):
        logger.warning(
            "with its copies on streams the rewrite would peak at %s against %s in line, as the executor runs the "
            "two streams (loads issued as their gates open live longer than in the in-line walk), so the copies "
            "are planned in line and its figures are those in line (apply --copies streams writes them on streams)",
            fmt_bytes(declined["peaks"]["streams"]),
            fmt_bytes(declined["peaks"]["inline"]),
        )
    elif declined:
        logger.warning(
            "with its copies on streams the plan estimated %.2fx against %.2fx in line (profile %s), as the "
            "executor runs the two streams: their events cost more than the overlap hides, so the copies are "
            "planned in line and its figures are those in line (apply --copies streams writes them on streams)",
            declined["streams"],
            declined["inline"],
            declined["profile"],
        )


#: why copies run early on a device under PRIORITY_BASED, and the fix
_APPENDED = (
    "onnxruntime appends the nodes it inserts (copies between host and device, Casts around float16 nodes the CPU "
    "runs in float32) after every node, PRIORITY_BASED holds back the nodes that wait for them, and every copy "
    "that is ready runs first; plan and run with --execution-order default (every host but Python runs it)"
)


def warn_broken_pins(peak: Peaks, order: str) -> None:
    """Warn when a plan made for a device (``plan --device``) has copies that, as that device runs its
    rewrite in ``order``, run on the wrong side of the node their order pin names, or under
    PRIORITY_BASED a peak over the planned one where no pin breaks (the target's pins hold no H2D)."""
    broken, checked = peak.pins_broken, peak.pins_checked
    device = peak.device or "the device"
    planned = peak.planned_after is not None
    where = (
        f"peak {fmt_bytes(peak.planned_after or 0)} planned, {fmt_bytes(peak.after)} as {device} runs it"
        if planned
        else f"as {device} runs it"
    )
    if broken and order == "priority":
        logger.warning(
            "as %s runs this rewrite under PRIORITY_BASED, %d of %d copies run on the wrong side of the node their "
            "order pin names (%s): %s, where the pins hold",
            device,
            broken,
            checked,
            where,
            _APPENDED,
        )
    elif broken:
        logger.warning(
            "as %s runs this rewrite, %d of %d copies run on the wrong side of the node their order pin names (%s)",
            device,
            broken,
            checked,
            where,
        )
    elif order == "priority" and peak.planned_after is not None and peak.after > 1.05 * peak.planned_after:
        logger.warning(
            "as %s runs this rewrite under PRIORITY_BASED its peak is %s, not the %s planned: %s",
            device,
            fmt_bytes(peak.after),
            fmt_bytes(peak.planned_after),
            _APPENDED,
        )


def plan_effect(
    peak: Peaks,
    plan: Plan | None = None,
    unreached: Sequence[Mapping[str, Any]] = (),
    *,
    bodies_bytes: int = 0,
) -> tuple[str | None, str | None]:
    """(words for the verdict, failure): a plan that leaves the peak where it was says so, and why when
    the reason is work inside If/Loop/Scan bodies (``bodies_bytes`` of the peak; they are not planned in:
    ``unreached``, the nodes whose bodies hold what no plan reaches: the largest is named); one that
    raises it fails."""
    before, after = peak.before, peak.after
    inside = _inside_bodies(after, bodies_bytes, plan, unreached)
    if after > before:
        walk = ""
        planned = peak.planned_after
        if planned is not None and planned <= before and not peak.device:
            walk = (
                ": its order pins keep more alive in the DEFAULT walk than the planned sequence does; next: apply it "
                "with --no-order-pins (the walk then runs each copy next to its reader), or run it under "
                "PRIORITY_BASED (a Python host)"
            )
        return None, f"the plan raises the peak: {peak_text(peak).removeprefix('peak ')}{inside}{walk}"
    if after == before:
        return "the plan does not lower the peak" + inside, None
    if before and (before - after) < BARELY * before:  # what it costs in time, for next to nothing
        return f"the plan barely lowers the peak ({fmt_bytes(before - after)}, under {BARELY:.0%})" + inside, None
    return None, None


#: a plan whose cut is under this share of the peak says so in its verdict, as one that cuts nothing does
BARELY = 0.01


def _inside_bodies(after: int, bodies: int, plan: Plan | None, unreached: Sequence[Mapping[str, Any]]) -> str:
    """Why a plan's peak (``after``, ``bodies`` of it inside If/Loop/Scan bodies) is out of its reach, when it
    is work inside those bodies: most of the peak there, tensors read only there, or the largest body no plan
    reaches; "" otherwise."""
    rejected: list[Any] = list(plan["rejected"]) if plan is not None else []
    only_inside = sum(1 for r in rejected if r.get("reason") == "subgraph-only")
    if after and bodies >= after / 2:
        inside = f": {fmt_bytes(bodies)} of it ({100.0 * bodies / after:.0f}%) is inside If/Loop/Scan bodies"
    elif only_inside:
        inside = f": {only_inside} tensor(s) are read only inside If/Loop/Scan bodies"
    elif unreached:
        b = unreached[0]
        inside = f": {b['op']} {b['node']!r} holds {fmt_bytes(b['weight_bytes'] + b['working_bytes'])} in its bodies"
    else:
        return ""
    return inside + ", which are not planned in"


def print_estimate(figures: Estimate, *, where: str = "", what: str = "simulated") -> None:
    """The peak change and, next to it, the estimated slowdown (plan, apply)."""
    before, after = figures.peak.before, figures.peak.after
    change = f"{100.0 * (after - before) / before:+.1f}%" if before else "+0.0%"
    line = f"{what} peak device memory: {fmt_bytes(before)} before -> {fmt_bytes(after)} after ({change}{where})"
    slow = figures.slowdown
    if slow:
        nodes = figures.time_nodes
        measured = (
            f", {nodes['measured']} of {nodes['total']} node times measured" if nodes and nodes["measured"] else ""
        )
        declined = figures.streams_declined
        streams = declined["streams"] if declined else slow["overlapped"]
        line += (
            f"; estimated time {slow['serialized']:.2f}x the baseline with copies in line, "
            f"{streams:.2f}x with copies on streams ({STREAMS_NOTE}; profile {figures.profile}{measured})"
        )
    out_console().print(line, soft_wrap=True)
