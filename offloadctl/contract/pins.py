"""Where a plan's order pins go: the one rule the rewrite builds them by and the simulator counts them by.

onnxruntime's DEFAULT order (every host but Python) emits a node once its inputs are emitted and
ignores the file order: unheld, a ``MemcpyToHost`` runs right before its ``MemcpyFromHost``, next to
the consumer, and the tensor stays on the device the whole time. A data dependency holds a copy in
place, through a view that changes nothing (`offloadctl.rewriting.rewrite` builds it):
``view = Reshape(t, Concat(Shape(t), Shape(dep, start=0, end=0)))`` (the second Shape is empty).

- The D2Hs after position p: the next original node that reads an activation (p + 1 when it does;
  never a Reshape, Squeeze, Unsqueeze or Flatten, which onnxruntime fuses with a Reshape before them)
  reads it through a view whose ``dep`` are those D2Hs' host copies, so each D2H runs no later than
  planned.
- The H2Ds before position q: each reads its host tensor through a view whose ``dep`` is an
  activation the last node before q that makes one (q - 1 when it does) makes, so it runs no
  earlier than planned.

Views sit on floating-point activations only (a view of a weight would hide it from prepacking and
constant folding; integer tensors are mostly shapes being computed, which onnxruntime's Reshape
fusions rewrite), never on a (De)QuantizeLinear output (onnxruntime fuses those with their one
reader) nor on an If/Loop/Scan output (onnxruntime inlines a constant If's branch and renames it),
nor on a tensor the plan keeps for onnxruntime's fusions (``options.select.fused``, from a profile
measured above ``--opt-level disable``): a pin reading it would undo the fusion as a copy would.

Every pin edge goes forward in the planned sequence, and the planned sequence is a topological
order of the model, so a pin never makes a cycle. ``Shape(x, start, end)`` needs opset 15; opsets
10 to 14 take ``Slice(Shape(x), [0], [0])`` (one more node per dependency); below 10 nothing is
pinned.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import onnx

from offloadctl.analysis.graph import Analysis
from offloadctl.contract.types import Plan
from offloadctl.core.onnxutil import has_subgraphs

__all__ = ["PinLayout", "pin_layout", "viewable"]


@dataclass(frozen=True)
class PinLayout:
    """The pins of one plan."""

    d2h: dict[int, int] = field(default_factory=dict)  # D2H position p -> the position whose node is held
    h2d: dict[int, int] = field(default_factory=dict)  # H2D position q -> the position whose output it waits for
    nodes: int = 0  # nodes the pins add
    unpinned: list[str] = field(default_factory=list)  # copies no pin holds, and why
    slice_form: bool = False  # opsets 10 to 14: Slice(Shape(x), [0], [0])
    avoid: frozenset[str] = frozenset()  # tensors no pin reads: what the plan keeps for fusions


def _opset(analysis: Analysis) -> int:
    return next((o.version for o in analysis.loaded.proto.opset_import if o.domain in ("", "ai.onnx")), 0)


_QDQ = frozenset({"DequantizeLinear", "QuantizeLinear"})
# floating-point data: an integer tensor is often a shape being computed (Gather of a Shape, then
# Unsqueeze and Concat), which onnxruntime's Reshape fusions rewrite at ORT_ENABLE_ALL; a view there
# once broke a model's loading ("Attempting to get index by a name which does not exist")
_DATA_TYPES = frozenset(
    {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE}
)


def viewable(analysis: Analysis, name: str, avoid: frozenset[str] = frozenset()) -> bool:
    """A tensor a pin can view or wait for: a floating-point activation (a view of a weight would hide
    it from prepacking and constant folding; an integer tensor is often a shape being computed), not
    a (De)QuantizeLinear output (onnxruntime fuses those with their one reader) and not an
    If/Loop/Scan output; nor one in ``avoid`` (a tensor that onnxruntime's fusions take in at the
    level the plan was made for: a pin reading it would undo the fusion, as a copy would)."""
    if name in avoid:
        return False
    info = analysis.infos.get(name) if name else None
    if info is None or not info.copyable or info.elem_type not in _DATA_TYPES:
        return False
    producer = analysis.producer.get(name)
    if producer is None:
        return False
    node = analysis.nodes[producer]
    # an If/Loop/Scan output: onnxruntime may inline the body (a constant If's branch) and rename its
    # outputs, and at ORT_ENABLE_ALL a Reshape fusion after it then looked for the view's old input name
    return node.op_type not in _QDQ and not has_subgraphs(node)


#: Ops onnxruntime fuses with a Reshape before them (FuseContiguousReshapes): a view feeding one
#: was merged into a new Reshape that named an input that no longer existed, at ORT_ENABLE_ALL.
_RESHAPES = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Flatten"})


def _holdable(analysis: Analysis, position: int, avoid: frozenset[str]) -> bool:
    """Whether the node at ``position`` can read one of its inputs through a pin's view."""
    node = analysis.nodes[position]
    return node.op_type not in _RESHAPES and any(viewable(analysis, name, avoid) for name in node.input)


def pin_layout(plan: Plan, analysis: Analysis) -> PinLayout:
    """The order pins `offloadctl apply` adds for ``plan`` (a scheduled plan for ``analysis``)."""
    d2hs: dict[int, int] = {}  # position -> D2H copies after it
    h2ds: dict[int, int] = {}  # position -> H2D copies before it
    for off in plan["offloads"]:
        if off["kind"] == "activation" and off["d2h_after"] is not None:
            d2hs[off["d2h_after"]] = d2hs.get(off["d2h_after"], 0) + 1
        for group in off["reload_groups"]:
            if group["h2d_before"] is not None:
                h2ds[group["h2d_before"]] = h2ds.get(group["h2d_before"], 0) + 1
        at = off.get("output_h2d_before")
        if off.get("graph_output") and at is not None:
            h2ds[at] = h2ds.get(at, 0) + 1
    opset = _opset(analysis)
    if not d2hs and not h2ds:
        return PinLayout()
    avoid = frozenset(plan["options"].get("select", {}).get("fused", ()))
    if opset < 10:
        return PinLayout(unpinned=[f"every copy: the model's opset {opset} is below 10"])
    per_dep = 2 if opset < 15 else 1  # Shape(x, 0, 0), or Slice(Shape(x), [0], [0])
    nodes = 0
    unpinned: list[str] = []
    held: dict[int, int] = {}
    n = analysis.num_positions
    for p, count in sorted(d2hs.items()):
        target = next((t for t in range(p + 1, n) if _holdable(analysis, t, avoid)), None)
        if target is None:
            if p + 1 < n:
                unpinned.append(f"{count} D2H copy(ies) after position {p}: no later node reads a tensor")
            continue
        held[p] = target
        nodes += 3 + per_dep * count  # Shape(t), Concat, Reshape, and one empty shape per host copy
    waits: dict[int, int] = {}
    for q, count in sorted(h2ds.items()):
        if q == 0:
            continue
        source = next(
            (
                s
                for s in range(q - 1, -1, -1)
                if any(viewable(analysis, name, avoid) for name in analysis.nodes[s].output)
            ),
            None,
        )
        if source is None:
            unpinned.append(f"{count} H2D copy(ies) before position {q}: no earlier node makes a tensor")
            continue
        waits[q] = source
        nodes += per_dep + 3 * count  # one empty shape of the output, then Shape, Concat, Reshape per copy
    return PinLayout(held, waits, nodes, unpinned, slice_form=opset < 15, avoid=avoid)
