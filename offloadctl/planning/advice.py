"""Telling a user when a plan does not pay for itself, and why.

A plan can move many bytes and still leave the peak where it was: every reload lands next to its
copy out (the prefetch distance reaches back past the whole idle stretch), or the peak is a node's
own working set, which no offload can touch. `weak_plan_advice` recognises such a plan (it moves
bytes but cuts the peak by less than `WEAK_CUT`) and returns the message to show: what it costs,
what it saves, the reasons found, and what would help; `NextStep` is the better command a weak plan
gets (made by `offloadctl.pipeline.next_step`). `unreached_bodies` names the If/Loop/Scan
nodes whose bodies hold weights or a working set that no plan reaches (copies are planned in the
main graph only). Both read an analysis (and a scheduled plan) and change neither.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, TypedDict

from offloadctl.analysis.graph import Analysis
from offloadctl.analysis.timeline import subgraph_memory
from offloadctl.core.bulk import paused_gc
from offloadctl.core.onnxutil import subgraph_outer_names
from offloadctl.core.plantypes import Offload, Plan, ReloadGroup
from offloadctl.core.units import fmt_bytes
from offloadctl.planning.budget.build import bytes_moved
from offloadctl.simulation.memory import lower_bound, peak_memory
from offloadctl.simulation.result import SimResult

__all__ = ["WEAK_CUT", "NextStep", "unreached_bodies", "unreached_text", "weak_plan_advice"]

WEAK_CUT = 0.03  # a plan that moves bytes but cuts the peak by less than this fraction is reported


class NextStepDoc(TypedDict):
    """A weak plan's next step in the plan command's ``--json`` document (`NextStep.to_json`)."""

    command: str
    budget_bytes: int
    peak_bytes: dict[str, int | None]
    slowdown: float | None


@dataclass(frozen=True)
class NextStep:
    """A weak plan's next step: the budget plan at ``budget_bytes`` as a command to paste, and the peak
    and slowdown it gives (``peak_after`` and ``slowdown`` None where they were not made: run it to see)."""

    command: str
    budget_bytes: int
    peak_before: int
    peak_after: int | None
    slowdown: float | None

    def to_json(self) -> NextStepDoc:
        """As the plan command's ``--json`` document gives it (``next_step``)."""
        return {
            "command": self.command,
            "budget_bytes": self.budget_bytes,
            "peak_bytes": {"before": self.peak_before, "after": self.peak_after},
            "slowdown": self.slowdown,
        }

    def text(self) -> str:
        """The line that gives it."""
        before, after = self.peak_before, self.peak_after
        if after is None:
            return (
                f"this plan lowers the peak by under 5%; next: {self.command} (peak {fmt_bytes(before)} "
                f"-> at most {fmt_bytes(self.budget_bytes)}; run it for its figures)"
            )
        cut = 100.0 * (before - after) / before
        slow = f", est. slowdown {self.slowdown:.2f}x" if self.slowdown else ""
        return (
            f"this plan lowers the peak by under 5%; next: {self.command} "
            f"(peak {fmt_bytes(before)} -> {fmt_bytes(after)}, -{cut:.1f}%{slow})"
        )

    def with_command(self, command: str) -> NextStep:
        return dataclasses.replace(self, command=command)


def _idle_free(off: Offload, group: ReloadGroup) -> bool:
    """True when a reload group leaves the device for no step: its H2D runs no later than the use
    (or the producer) before its gap, so the copy is back as soon as it left."""
    first, h2d = group["uses"][0]["position"], group["h2d_before"]
    return h2d is not None and first - h2d >= group["gap"]


def _node_working_set(analysis: Analysis, position: int) -> int:
    """Bytes the node at ``position`` reads and writes (weights included)."""
    node = analysis.nodes[position]
    names = {n for n in node.input if n} | {n for n in node.output if n}
    if node.attribute:  # what its subgraphs read: the analysis lists each as a use without an input index
        names |= subgraph_outer_names(node)
    return sum((info.bytes or 0) for n in names if (info := analysis.infos.get(n)) is not None)


def _peaks(result: SimResult) -> tuple[int, int, int | None]:
    """Peak before, peak after and the position of the peak after, as `peak_memory` gives them."""
    step = result.after.peak_step
    return result.peak_before, result.peak_after, None if step is None else result.after.positions[step]


@paused_gc()
def weak_plan_advice(analysis: Analysis, plan: Plan, *, result: SimResult | None = None) -> str | None:
    """The warning for a scheduled plan that moves bytes but barely lowers the peak, else None.

    ``result`` is the simulation of this plan on this analysis when the caller has it (the figures
    are then read from it instead of simulated again).
    """
    moved = bytes_moved(plan)
    if not plan["offloads"] or moved == 0:
        return None
    if result is not None:
        before, after, at = _peaks(result)
    else:
        before, _ = peak_memory(analysis)
        after, at = peak_memory(analysis, plan)
    if before <= 0 or (before - after) >= WEAK_CUT * before:
        return None
    cut = 100.0 * (before - after) / before
    lines = [
        f"this plan moves {fmt_bytes(moved)} per run but lowers the simulated peak by only "
        f"{fmt_bytes(max(before - after, 0))} ({cut:.1f}%)"
    ]
    groups = [(off, g) for off in plan["offloads"] for g in off["reload_groups"]]
    idle_free = [(off, g) for off, g in groups if _idle_free(off, g)]
    distances = sorted({d for o in plan["offloads"] if (d := o["prefetch_distance"]) is not None})
    prefetch = (plan["options"].get("prefetch") or {}).get("prefetch_distance")
    if idle_free:
        lines.append(
            f"- {len(idle_free)} of {len(groups)} reloads are copied back before the tensor's idle stretch even starts "
            f"(prefetch distance {prefetch if prefetch is not None else distances}): "
            "those tensors never leave the device"
        )
    if at is not None and at < analysis.num_positions:
        own = _node_working_set(analysis, at)
        if own >= (1 - WEAK_CUT) * after:
            lines.append(
                f"- the peak is at node {analysis.node_names[at]!r}, whose own inputs, outputs and weights make up "
                f"{fmt_bytes(own)} of it: no offload can lower that step"
            )
        elif not idle_free:
            lines.append(f"- the peak is at node {analysis.node_names[at]!r}; the offloaded tensors are not idle there")
    bound = result.lower_bound_bytes if result is not None else lower_bound(analysis)[0]
    hints = []
    if idle_free:
        hints.append("a smaller --prefetch-distance (or a larger --select-distance)")
    hints.append(f"--budget BYTES, which offloads what the peak step holds (lower bound {fmt_bytes(bound)})")
    if not plan["options"].get("select", {}).get("params"):
        hints.append("--params, to let weights move too")
    lines.append("- try " + "; or ".join(hints))
    return "\n".join(lines)


def unreached_bodies(analysis: Analysis) -> list[dict[str, Any]]:
    """Each If/Loop/Scan node whose bodies hold weights (resident the whole run) or a working set
    (while it runs), largest first: what no plan reaches, since copies are planned in the main graph."""
    memory = subgraph_memory(analysis)
    found = []
    for p in sorted(set(memory.body_weights) | set(memory.bodies)):
        weights, count = memory.body_weights.get(p, (0, 0))
        found.append(
            {
                "node": analysis.node_names[p],
                "op": analysis.nodes[p].op_type,
                "position": p,
                "weight_bytes": weights,
                "weights": count,
                "working_bytes": memory.bodies.get(p, 0),
            }
        )
    return sorted(found, key=lambda b: -(b["weight_bytes"] + b["working_bytes"]))


def unreached_text(bodies: list[dict[str, Any]]) -> str | None:
    """The line that names what the bodies hold (None when they hold nothing)."""
    if not bodies:
        return None
    parts = [
        f"{b['op']} {b['node']!r} {fmt_bytes(b['weight_bytes'])} in {b['weights']} weight(s)"
        + (f" and up to {fmt_bytes(b['working_bytes'])} while it runs" if b["working_bytes"] else "")
        for b in bodies[:3]
    ]
    more = f" and {len(bodies) - 3} more" if len(bodies) > 3 else ""
    return (
        "no plan reaches what If/Loop/Scan bodies hold (offloadctl plans copies in the main graph): "
        + "; ".join(parts)
        + more
    )
