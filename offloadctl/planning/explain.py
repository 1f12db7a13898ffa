"""Explanations of a plan: every candidate tensor, whether it is offloaded, and why.

`explain_rows` turns a plan into plain rows (usable without the CLI); `explain_table` renders them
as a rich table, which ``offloadctl filter|plan --explain`` prints after writing the plan. Chosen
entries are explained by the strategy (HyperOffload's gap rule, ``--force``, or the budget
strategy's reason recorded in ``plan["budget"]["chosen"]``); rejected ones carry the reason and
detail the stage recorded in ``plan["rejected"]``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rich.table import Table

from offloadctl.core.plantypes import Offload, Plan
from offloadctl.core.units import fmt_bytes
from offloadctl.planning.uses import weight_idle_end

__all__ = ["explain_rows", "explain_table"]


def _idle(off: Offload, plan: Plan) -> int:
    """The longest stretch a tensor sits idle (the select stage's rule): between its producer (a
    weight: the start of the run) and its uses, and for a weight after its last use to the end."""
    uses = sorted(
        [u["position"] for u in off["device_uses"]] + [u["position"] for g in off["reload_groups"] for u in g["uses"]]
    )
    start = off["d2h_after"] if off["kind"] == "activation" else 0
    assert start is not None  # a valid plan's activation has its D2H position
    points = [start, *uses]
    if off["kind"] == "parameter":
        points.append(int(weight_idle_end(plan["model"]["num_positions"], points[-1])))
    return max((b - a for a, b in zip(points, points[1:])), default=0)


def explain_rows(plan: Plan) -> list[dict[str, Any]]:
    """One row per candidate: tensor, kind, bytes, reload groups, max gap, status, reason, detail.

    Chosen tensors come first (in plan order), then rejected ones (largest first).
    """
    rows: list[dict[str, Any]] = []
    record = plan.get("budget")
    chosen_why: dict[str, str] = record["chosen"] if record is not None else {}
    select_opts = plan["options"].get("select", {})
    distance = select_opts.get("select_distance")
    for off in plan["offloads"]:
        gaps = [g["gap"] for g in off["reload_groups"]]
        if off.get("forced"):
            reason, detail = "forced", "matches a --force pattern"
        elif off["tensor"] in chosen_why:
            reason, detail = "budget", chosen_why[off["tensor"]]
        else:
            reason, detail = "gap", f"largest idle stretch {_idle(off, plan)} > select distance {distance}"
        if off["prefetch_distance"] is not None:
            detail += f"; prefetch distance {off['prefetch_distance']}"
        rows.append(
            {
                "tensor": off["tensor"],
                "kind": off["kind"],
                "bytes": off["bytes"],
                "reload_groups": len(off["reload_groups"]),
                "max_gap": max(gaps) if gaps else None,
                "status": "offloaded",
                "reason": reason,
                "detail": detail,
            }
        )
    rejected = sorted(plan["rejected"], key=lambda r: (-(r["bytes"] or 0), r["tensor"]))
    for r in rejected:
        rows.append(
            {
                "tensor": r["tensor"],
                "kind": r["kind"],
                "bytes": r["bytes"],
                "reload_groups": 0,
                "max_gap": r.get("max_gap"),
                "status": "rejected",
                "reason": r["reason"],
                "detail": f"{r['stage']}: {r['detail']}",
            }
        )
    return rows


def explain_table(plan: Plan, bodies: Sequence[Mapping[str, Any]] = ()) -> Table:
    """A rich table of :func:`explain_rows`, titled with the strategy and, for a budget, its figures;
    then one row per If/Loop/Scan node whose bodies hold what no plan reaches
    (`offloadctl.planning.advice.unreached_bodies`)."""
    title = f"candidates ({plan['strategy']} strategy, stage {plan['stage']})"
    budget = plan.get("budget")
    if budget:
        req = budget.get("requested_bytes")
        title += (
            f": budget {fmt_bytes(req) if req is not None else 'none'}, predicted peak "
            f"{fmt_bytes(budget.get('predicted_peak_bytes'))}, "
            f"lower bound {fmt_bytes(budget.get('lower_bound_bytes'))}, moved {fmt_bytes(budget.get('bytes_moved'))}"
        )
    table = Table(title=title, show_edge=False)
    table.add_column("tensor", overflow="fold")
    table.add_column("kind")
    table.add_column("bytes", justify="right")
    table.add_column("groups", justify="right")
    table.add_column("max gap", justify="right")
    table.add_column("status")
    table.add_column("why", overflow="fold")
    for row in explain_rows(plan):
        style = "green" if row["status"] == "offloaded" else None
        table.add_row(
            row["tensor"],
            row["kind"],
            fmt_bytes(row["bytes"]),
            str(row["reload_groups"]) if row["reload_groups"] else "",
            "" if row["max_gap"] is None else str(row["max_gap"]),
            row["status"],
            f"{row['reason']}: {row['detail']}",
            style=style,
        )
    for body in bodies:
        held = [f"{body['weights']} weight(s) resident the whole run"] if body["weights"] else []
        if body["working_bytes"]:
            held.append(f"up to {fmt_bytes(body['working_bytes'])} while it runs")
        table.add_row(
            f"{body['op']} {body['node']!r} (its bodies)",
            "control flow",
            fmt_bytes(body["weight_bytes"] + body["working_bytes"]),
            "",
            "",
            "not reached",
            "inside-bodies: " + ", ".join(held) + "; copies are planned in the main graph only",
            style="yellow",
        )
    return table
