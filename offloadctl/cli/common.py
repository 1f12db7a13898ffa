"""Steps several commands share: load and analyse a model, summarise a plan."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from rich.table import Table

from offloadctl.analysis import Analysis, analyse
from offloadctl.cli.ui import fmt_bytes, out_console, steps
from offloadctl.errors import OffloadError
from offloadctl.model import load_model, parse_input_shapes

__all__ = ["load_and_analyse", "print_plan_summary", "check_unknown_sizes"]

logger = logging.getLogger(__name__)


def load_and_analyse(
    model: str,
    input_shape: Sequence[str] = (),
    *,
    show_progress: bool = True,
    shapes: dict[str, list[int]] | None = None,
    shapes_from: str = "--input-shape",
) -> Analysis:
    """Load MODEL (weights stay on disk), pin input shapes and analyse it, with progress on a terminal.

    The shapes are ``input_shape`` (``--input-shape`` strings), or ``shapes`` taken from
    ``shapes_from`` (e.g. a plan's model.input_shapes).
    """
    if shapes is None:
        shapes = parse_input_shapes(input_shape)
    with steps(show_progress, total=2) as step:
        step(f"loading {model}")
        loaded = load_model(model, input_shapes=shapes, input_shapes_from=shapes_from)
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


def check_unknown_sizes(analysis: Analysis, *, strict: bool) -> list[str]:
    """Say when memory figures rest on tensors of unknown size (they count as 0 bytes): a warning,
    or with ``strict`` an error. Returns the names."""
    unknown = analysis.unknown_sizes()
    if not unknown:
        return unknown
    shown = ", ".join(unknown[:8]) + (" …" if len(unknown) > 8 else "")
    path = analysis.loaded.path
    if strict:
        raise OffloadError(
            f"{len(unknown)} tensor(s) of {path} have an unknown size, and --strict refuses figures that count them "
            f"as 0 bytes: {shown}",
            hint="pin dynamic inputs with --input-shape NAME=D0,D1,... (or drop --strict to accept the figures)",
        )
    logger.warning(
        "%d tensor(s) of %s have an unknown size and count as 0 bytes in every memory figure, so the figures may "
        "be low: %s (pin dynamic inputs with --input-shape NAME=D0,D1,...; --strict makes this an error)",
        len(unknown), path, shown,
    )
    return unknown


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
