"""`offloadctl inspect`: what a model holds and which tensors sit idle longest."""

from __future__ import annotations

from collections import Counter
from typing import Any, TypedDict

import click
from rich.table import Table

from offloadctl.analysis.graph import Analysis
from offloadctl.analysis.timeline import subgraph_memory, unknown_tensors
from offloadctl.cli.common import ModelArgs, finish, low_figures_text, model_group
from offloadctl.cli.options import (
    input_shape_option,
    json_option,
    model_argument,
    sizes_option,
)
from offloadctl.cli.ui import out_console
from offloadctl.core.units import fmt_bytes

__all__ = ["inspect", "inspect_report"]


class TensorRow(TypedDict):
    """A tensor in the inspect report: its name, element type, shape and bytes (None where unknown)."""

    name: str
    dtype: str
    shape: list[Any] | None
    bytes: int | None


def _tensor_row(analysis: Analysis, name: str) -> TensorRow:
    info = analysis.infos.get(name)
    return {
        "name": name,
        "dtype": info.dtype if info else "unknown",
        "shape": list(info.shape) if info and info.shape is not None else None,
        "bytes": info.bytes if info else None,
    }


def inspect_report(analysis: Analysis, *, top: int = 10) -> dict[str, Any]:
    """A JSON-ready summary of an analysed model."""
    proto = analysis.loaded.proto
    act_bytes = unknown = 0
    idle = []
    for name, prod in analysis.producer.items():
        info = analysis.infos.get(name)
        size = info.bytes if info else None
        if size is None:
            unknown += 1
        else:
            act_bytes += size
        uses = analysis.uses.get(name, [])
        if uses:
            points = [prod] + [u.position for u in uses]
            gap = max(b - a for a, b in zip(points, points[1:]))
            idle.append((gap, size or 0, name, prod, uses))
    weight_bytes = sum((analysis.infos[w].bytes or 0) for w in analysis.weights if w in analysis.infos)
    inner = subgraph_memory(analysis)
    unknown_names = unknown_tensors(analysis)
    idle.sort(key=lambda t: (-t[0], -t[1], t[2]))
    return {
        "model": {
            "path": str(analysis.loaded.path),
            "sha256": analysis.loaded.sha256,
            "ir_version": proto.ir_version,
            "opsets": {o.domain or "ai.onnx": o.version for o in proto.opset_import},
            "producer": f"{proto.producer_name} {proto.producer_version}".strip(),
        },
        "nodes": analysis.num_positions,
        "constant_nodes": len(analysis.constants),
        "topologically_sorted": analysis.topological,
        "file_in_run_order": analysis.was_sorted,
        "subgraph_nodes": sum(
            1
            for n in analysis.nodes
            if any(a.type in (5, 10) for a in n.attribute)  # GRAPH, GRAPHS
        ),
        "op_types": dict(Counter(n.op_type for n in analysis.nodes).most_common()),
        "inputs": [_tensor_row(analysis, n) for n in analysis.graph_inputs],
        "outputs": [_tensor_row(analysis, n) for n in analysis.graph_outputs],
        "activations": {"count": len(analysis.producer), "bytes": act_bytes, "unknown_size": unknown},
        "weights": {
            "count": len(analysis.weights) + inner.weight_count,
            "bytes": weight_bytes + inner.weight_bytes,
            "in_subgraphs": {"count": inner.weight_count, "bytes": inner.weight_bytes},
        },
        # every tensor whose size is unknown, as simulate and plan count them (inputs, weights, bodies too)
        "unknown_size": {"count": len(unknown_names), "tensors": unknown_names[:100]},
        "longest_idle": [
            {
                "tensor": name,
                "bytes": size if analysis.infos.get(name) and analysis.infos[name].bytes is not None else None,
                "producer": prod,
                "first_use": uses[0].position,
                "last_use": uses[-1].position,
                "max_gap": gap,
            }
            for gap, size, name, prod, uses in idle[:top]
        ],
    }


@click.command("inspect")
@model_argument
@input_shape_option
@sizes_option
@click.option("--top", type=click.IntRange(min=0), default=10, show_default=True, help="How many idle tensors to list.")
@json_option
@model_group
def inspect(model: ModelArgs, top: int, as_json: bool) -> None:
    """Nodes, tensors, bytes of activations and weights, and the longest-idle tensors."""
    analysis = model.open(show_progress=not as_json).analysis
    report = inspect_report(analysis, top=top)
    acts, weights = report["activations"], report["weights"]
    verdict = [
        f"{report['nodes']} nodes",
        f"activations {fmt_bytes(acts['bytes'])}",
        f"weights {fmt_bytes(weights['bytes'])}",
        low_figures_text(report["unknown_size"]["count"]),
    ]
    if not as_json:
        _print_inspect(report)
    finish("inspect", model.path, verdict, [], as_json=as_json, doc=report if as_json else None)


def _counts_line(report: dict[str, Any]) -> str:
    """The nodes in execution order, and what the file's order says of the run's."""
    line = f"{report['nodes']} nodes in execution order ({report['constant_nodes']} Constant nodes folded into weights"
    if not report["topologically_sorted"]:
        line += "; the file is not topologically sorted"
    elif not report["file_in_run_order"]:
        line += "; onnxruntime runs some nodes earlier than the file has them (Shape/Size first)"
    return line + ")"


def _sizes_line(report: dict[str, Any]) -> str:
    """The activations' and weights' counts and bytes."""
    acts, weights = report["activations"], report["weights"]
    line = (
        f"activations: {acts['count']} tensors, {fmt_bytes(acts['bytes'])} ({acts['unknown_size']} of unknown size)   "
        f"weights: {weights['count']} tensors, {fmt_bytes(weights['bytes'])}"
    )
    inner = weights["in_subgraphs"]
    if inner["count"]:
        line += f" ({inner['count']} tensors, {fmt_bytes(inner['bytes'])} inside If/Loop/Scan bodies)"
    return line


def _print_inspect(report: dict[str, Any]) -> None:
    """The report for a person: the model, its counts and sizes, inputs and outputs, ops, idle tensors."""
    console = out_console()
    m = report["model"]
    console.print(f"[bold]{m['path']}[/]  IR {m['ir_version']}  opsets {m['opsets']}  sha256 {m['sha256'][:12]}…")
    console.print(_counts_line(report))
    console.print(_sizes_line(report))
    unknown = report["unknown_size"]["count"]
    if unknown != report["activations"]["unknown_size"]:  # graph inputs and tensors inside bodies too
        console.print(
            f"unknown size: {unknown} tensors in all (activations, graph inputs and inside If/Loop/Scan bodies, "
            "as simulate and plan count them) count as 0 bytes"
        )
    io = Table(title="inputs and outputs", show_edge=False)
    for col in ("", "name", "dtype", "shape", "bytes"):
        io.add_column(col)
    for label, rows in (("in", report["inputs"]), ("out", report["outputs"])):
        for r in rows:
            io.add_row(label, r["name"], r["dtype"], str(r["shape"]), fmt_bytes(r["bytes"]))
    console.print(io)
    ops = ", ".join(f"{k} {v}" for k, v in list(report["op_types"].items())[:12])
    console.print(f"ops: {ops}")
    if report["longest_idle"]:
        idle = Table(title="longest-idle activations", show_edge=False)
        for col in ("tensor", "bytes", "producer", "first use", "last use", "max gap"):
            idle.add_column(col, justify="right" if col != "tensor" else "left")
        for r in report["longest_idle"]:
            idle.add_row(
                r["tensor"],
                fmt_bytes(r["bytes"]),
                str(r["producer"]),
                str(r["first_use"]),
                str(r["last_use"]),
                str(r["max_gap"]),
            )
        console.print(idle)
