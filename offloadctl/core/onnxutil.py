"""Small ONNX helpers every module shares: which nodes are Constant, backward or copy nodes, and
walks over the subgraphs (If/Loop/Scan bodies) a node holds, and onnx's inference on a copy.

It depends on onnx alone (and `offloadctl.core.memcpy` for the copy operators' names), so the model
loader, onnxruntime's graph rewrites, the analysis, the timeline, the stages and the rewrite can all
use it without an import cycle. Functions take protos and never change them, except
`rename_outer`, which renames in place.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import onnx
from onnx import TensorProto

from offloadctl.core.memcpy import COPY_OPS, MEMCPY_TO_HOST

logger = logging.getLogger(__name__)

__all__ = [
    "BACKWARD_ATTR",
    "EVENT_PREFIX",
    "ONNX_DOMAINS",
    "PIN_ATTR",
    "copy_kind",
    "is_event",
    "is_pin",
    "pin_view_source",
    "defined_names",
    "has_subgraphs",
    "SHARED_WEIGHT_BYTES",
    "copy_fields",
    "data_unread_by_inference",
    "held_elsewhere",
    "inferred_copy",
    "shape_only_copy",
    "is_backward",
    "is_constant_node",
    "iter_graphs",
    "iter_tensor_protos",
    "named_subgraphs",
    "outer_names",
    "rename_outer",
    "subgraph_outer_names",
    "subgraphs",
]

#: The default domain under both of its spellings.
ONNX_DOMAINS = ("", "ai.onnx")
#: The attribute onnxruntime's training graphs put on backward nodes (odd value: backward).
BACKWARD_ATTR = "__backwardpass"

_GRAPH = onnx.AttributeProto.GRAPH
_GRAPHS = onnx.AttributeProto.GRAPHS


def is_constant_node(node: onnx.NodeProto) -> bool:
    """A Constant node: onnxruntime folds it into an initializer, so its output is a weight."""
    return node.op_type == "Constant" and node.domain in ONNX_DOMAINS


def is_backward(node: onnx.NodeProto) -> bool:
    """A node of the backward pass (``__backwardpass`` set to an odd value)."""
    return any(a.name == BACKWARD_ATTR and a.i % 2 == 1 for a in node.attribute)


#: The attribute `offloadctl apply` puts on the nodes of an order pin (a no-op view; see
#: `offloadctl.rewriting.rewrite`): 1 on the view (a Reshape to its input's own shape), 0 on the
#: Shape/Slice/Concat nodes that compute that shape.
PIN_ATTR = "__offload_pin"


#: The names of the event nodes `offloadctl apply --copies streams` writes start with this (see
#: `offloadctl.rewriting.streams`).
EVENT_PREFIX = "offload/event/"


def is_event(node: onnx.NodeProto) -> bool:
    """An event node of a rewrite whose copies run on a stream of their own: an ``Identity`` that only
    orders the streams (onnxruntime gives its output its input's buffer)."""
    return node.op_type == "Identity" and node.name.startswith(EVENT_PREFIX)


def is_pin(node: onnx.NodeProto) -> bool:
    """A node of an order pin: it moves no data and takes no place among the model's own nodes."""
    return bool(node.attribute) and any(a.name == PIN_ATTR for a in node.attribute)


def pin_view_source(node: onnx.NodeProto) -> str | None:
    """For a pin's view (its Reshape), the tensor it is a view of; None for any other node."""
    if node.op_type == "Reshape" and node.input and any(a.name == PIN_ATTR and a.i == 1 for a in node.attribute):
        return node.input[0]
    return None


def copy_kind(node: onnx.NodeProto) -> str | None:
    """``"d2h"`` for a MemcpyToHost node, ``"h2d"`` for a MemcpyFromHost node, None for any other."""
    if node.op_type in COPY_OPS and node.domain in ONNX_DOMAINS:
        return "d2h" if node.op_type == MEMCPY_TO_HOST else "h2d"
    return None


def subgraphs(node: onnx.NodeProto) -> Iterator[onnx.GraphProto]:
    """The graphs a node holds in its attributes (an If's branches, a Loop's or Scan's body)."""
    for attr in node.attribute:
        if attr.type == _GRAPH:
            yield attr.g
        elif attr.type == _GRAPHS:
            yield from attr.graphs


def named_subgraphs(node: onnx.NodeProto) -> list[tuple[str, onnx.GraphProto]]:
    """`subgraphs` with the attribute each comes from (``body``, or ``branches[1]`` in a list)."""
    found: list[tuple[str, onnx.GraphProto]] = []
    for attr in node.attribute:
        if attr.type == _GRAPH:
            found.append((attr.name, attr.g))
        elif attr.type == _GRAPHS:
            found.extend((f"{attr.name}[{i}]", g) for i, g in enumerate(attr.graphs))
    return found


def has_subgraphs(node: onnx.NodeProto) -> bool:
    """True when the node holds a graph in an attribute."""
    return bool(node.attribute) and any(a.type in (_GRAPH, _GRAPHS) for a in node.attribute)


def iter_graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """``graph`` and every subgraph (If/Loop/Scan bodies, at any depth)."""
    stack = [graph]
    while stack:
        g = stack.pop()
        yield g
        for node in g.node:
            if not node.attribute:  # most nodes of a big graph
                continue
            stack.extend(subgraphs(node))


def iter_tensor_protos(graph: onnx.GraphProto) -> Iterator[TensorProto]:
    """Every TensorProto that may hold data, in ``graph`` and its subgraphs: initializers, the
    values and indices of sparse initializers, and tensor attributes (Constant values, sparse ones
    included). Graphs come in the order of `iter_graphs`, each walked once."""
    stack = [graph]
    while stack:
        g = stack.pop()
        yield from g.initializer
        for sparse in g.sparse_initializer:
            yield sparse.values
            yield sparse.indices
        for node in g.node:
            if not node.attribute:  # most nodes of a big graph
                continue
            for attr in node.attribute:
                kind = attr.type
                if kind == onnx.AttributeProto.TENSOR:
                    yield attr.t
                elif kind == _GRAPH:
                    stack.append(attr.g)
                elif kind == _GRAPHS:
                    stack.extend(attr.graphs)
                elif kind == onnx.AttributeProto.TENSORS:
                    yield from attr.tensors
                elif kind == onnx.AttributeProto.SPARSE_TENSOR:
                    yield attr.sparse_tensor.values
                    yield attr.sparse_tensor.indices
                elif kind == onnx.AttributeProto.SPARSE_TENSORS:
                    for sparse in attr.sparse_tensors:
                        yield sparse.values
                        yield sparse.indices


def defined_names(graph: onnx.GraphProto) -> set[str]:
    """Names a graph defines itself: its inputs, initializers (sparse ones too) and node outputs."""
    defined = {v.name for v in graph.input} | {t.name for t in graph.initializer}
    defined |= {s.values.name for s in graph.sparse_initializer}
    for node in graph.node:
        defined.update(node.output)
    return defined


def outer_names(graph: onnx.GraphProto) -> set[str]:
    """Names a (sub)graph reads from enclosing scopes, its own subgraphs' included."""
    defined = {v.name for v in graph.input} | {t.name for t in graph.initializer}
    defined |= {s.values.name for s in graph.sparse_initializer}
    used: set[str] = set()
    for node in graph.node:
        used.update(n for n in node.input if n)
        used |= subgraph_outer_names(node)
        defined.update(node.output)
    used.update(o.name for o in graph.output)
    return used - defined


def subgraph_outer_names(node: onnx.NodeProto) -> set[str]:
    """Names a node's subgraphs (at any depth) read from scopes outside the node."""
    names: set[str] = set()
    if node.attribute:  # only a node with attributes can have subgraphs
        for graph in subgraphs(node):
            names |= outer_names(graph)
    return names


def rename_outer(graph: onnx.GraphProto, old: str, new: str) -> int:
    """Rename, in place, the reads of the outer-scope name ``old`` inside ``graph`` and its
    subgraphs to ``new``; return how many were renamed.

    A graph that defines its own ``old`` (`defined_names`) reads that one, not the outer tensor,
    and is left alone. Subgraph outputs and value_info entries of that name are renamed too (a
    subgraph's outputs are matched by position, so their names may change).
    """
    if old in defined_names(graph):
        return 0
    count = 0
    for node in graph.node:
        for k, name in enumerate(node.input):
            if name == old:
                node.input[k] = new
                count += 1
        for sub in subgraphs(node):
            count += rename_outer(sub, old, new)
    for value in list(graph.output) + list(graph.value_info):
        if value.name == old:
            value.name = new
            count += 1
    return count


def shape_only_copy(model: onnx.ModelProto, heavy: Callable[[onnx.TensorProto], bool]) -> onnx.ModelProto:
    """A copy of ``model`` whose main-graph weights ``heavy`` picks hold their name, type and dimensions but no
    data: what shape inference needs of them. The weights' bytes are never copied (onnx's inference
    serializes the model it is given and parses what it gives back: a model of 100 MB of weights would
    cost four copies of them)."""
    work = onnx.ModelProto()
    copy_fields(model, work, leave_out="graph")
    copy_fields(model.graph, work.graph, leave_out="initializer")
    for tensor in model.graph.initializer:
        if heavy(tensor):
            shaped = work.graph.initializer.add(name=tensor.name, data_type=tensor.data_type)
            shaped.dims.extend(tensor.dims)
        else:
            work.graph.initializer.append(tensor)
    return work


def copy_fields(source: Any, target: Any, *, leave_out: str) -> None:
    """Copy every field of the message ``source`` that is set into ``target``, but ``leave_out``."""
    for field, value in source.ListFields():
        if field.name == leave_out:
            continue
        if hasattr(value, "append"):  # a repeated field
            getattr(target, field.name).extend(value)
        elif field.message_type is not None:
            getattr(target, field.name).CopyFrom(value)
        else:
            setattr(target, field.name, value)


#: A weight this large is shared by a rewrite with its source rather than copied (`held_elsewhere`)
SHARED_WEIGHT_BYTES = 64 << 10


def held_elsewhere(tensor: onnx.TensorProto) -> bool:
    """A weight whose bytes a rewrite refers to in its source model instead of copying them: embedded in the
    file (not external data) and over `SHARED_WEIGHT_BYTES`."""
    return tensor.data_location != onnx.TensorProto.EXTERNAL and tensor.ByteSize() > SHARED_WEIGHT_BYTES


def data_unread_by_inference(tensor: onnx.TensorProto) -> bool:
    """Weight data inference without data propagation does not read: anything but small integer tensors."""
    small_int = tensor.data_type in (onnx.TensorProto.INT64, onnx.TensorProto.INT32) or len(tensor.raw_data) <= 4096
    return not small_int and tensor.data_location != onnx.TensorProto.EXTERNAL


def inferred_copy(model: onnx.ModelProto, edit: Callable[[onnx.ModelProto], None] | None = None) -> onnx.ModelProto:
    """A copy of ``model`` (``edit`` applied to it) with onnx's type and shape inference run over it,
    no data propagation; the copy as it is when onnx's inference fails. Weight data inference does
    not read (anything but small integer tensors: shapes, axes) is left out of the copy
    (`shape_only_copy`)."""
    work = shape_only_copy(model, data_unread_by_inference)
    if edit is not None:
        edit(work)
    try:
        return onnx.shape_inference.infer_shapes(work)
    except Exception as exc:  # noqa: BLE001 - onnx raises several types; the declared types are then all there is
        logger.debug("onnx shape inference failed (%s); using the declared types", exc)
        return work
