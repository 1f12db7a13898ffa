"""Steps several commands share: load and analyse a model, summarise a plan."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from rich.table import Table

from offloadctl.analysis import Analysis, analyse
from offloadctl.cli.ui import fmt_bytes, out_console, steps
from offloadctl.model import load_model, parse_input_shapes

__all__ = ["load_and_analyse", "print_plan_summary"]

logger = logging.getLogger(__name__)


def load_and_analyse(model: str, input_shape: Sequence[str] = (), *, show_progress: bool = True) -> Analysis:
    """Load MODEL (weights stay on disk), pin input shapes and analyse it, with progress on a terminal."""
    shapes = parse_input_shapes(input_shape)
    with steps(show_progress, total=2) as step:
        step(f"loading {model}")
        loaded = load_model(model, input_shapes=shapes)
        step(f"analysing {model}")
        analysis = analyse(loaded)
    dynamic = [
        name
        for name in analysis.graph_inputs
        if (info := analysis.infos.get(name)) is not None and info.copyable and info.bytes is None
    ]
    if dynamic:
        logger.warning(
            "inputs with unknown dimensions: %s; tensors whose size depends on them are not offloaded "
            "(pin them with --input-shape NAME=D0,D1,...)",
            ", ".join(dynamic),
        )
    return analysis


def print_plan_summary(plan: dict, output: str) -> None:
    """One short table of what a plan offloads, then where it was written."""
    offloads = plan["offloads"]
    console = out_console()
    acts = [o for o in offloads if o["kind"] == "activation"]
    params = [o for o in offloads if o["kind"] == "parameter"]
    table = Table(title=f"plan ({plan['stage']})", show_edge=False)
    table.add_column("kind")
    table.add_column("offloaded", justify="right")
    table.add_column("bytes", justify="right")
    table.add_column("H2D copies", justify="right")
    for label, group in (("activation", acts), ("parameter", params)):
        table.add_row(
            label,
            str(len(group)),
            fmt_bytes(sum(o["bytes"] for o in group)),
            str(sum(len(o["reload_groups"]) + (o["output_h2d_before"] is not None) for o in group)),
        )
    console.print(table)
    reasons: dict[str, int] = {}
    for r in plan["rejected"]:
        reasons[r["reason"]] = reasons.get(r["reason"], 0) + 1
    if reasons:
        console.print("not offloaded: " + ", ".join(f"{v} {k}" for k, v in sorted(reasons.items())))
    console.print(f"wrote {output}")
