"""onnx's shape inference of a loaded model: the model as it should see it, the types it gives, and
the same run in a child process while the caller goes on (`start_inference`).

`offloadctl.loading.tensors` turns the types into each tensor's size; `load_model` starts the child
as soon as the graph is final, when its caller will look sizes up.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from functools import cache

import onnx

from offloadctl.core.ahead import Ahead
from offloadctl.core.bulk import paused_gc
from offloadctl.core.memcpy import COPY_OPS
from offloadctl.core.onnxutil import pin_view_source, shape_only_copy

__all__ = ["AHEAD_MIN_NODES", "inference_proto", "inferred_types", "start_inference", "types_by_name"]


def inference_proto(
    proto: onnx.ModelProto,
    node_order: Sequence[int] | None = None,
    producers: Mapping[str, int | str] | None = None,
    *,
    in_place: bool = False,
) -> onnx.ModelProto:
    """``proto`` as shape inference should see it (``proto`` itself when nothing changes):

    - nodes in a topological order (``node_order``: file indices; onnx's shape inference walks the
      file order and stops at a node whose input comes later);
    - without the file's declared types for outputs of nodes onnx can infer: onnx's inference
      keeps a declared type over the one it infers and propagates it, so one stale or duplicate
      ``value_info`` entry would give wrong sizes to every tensor computed from it. Declared
      types stay for outputs of ops onnx does not know (custom domains), and serve as a fallback.

    ``producers`` (tensor name -> file index of the node making it), when the caller knows it,
    spares a walk over the nodes. ``in_place``: change ``proto`` itself rather than a copy (a
    process's own copy of the model, as the child of `start_inference` has).
    """
    graph = proto.graph
    declared = {vi.name for vi in graph.value_info} | {o.name for o in graph.output}
    inferable = _inferable_outputs(graph, declared, producers)
    stale_values = any(vi.name in inferable for vi in graph.value_info)
    stale_outputs = any(o.name in inferable and o.type.tensor_type.HasField("shape") for o in graph.output)
    heavy = any(_heavy(t) for t in graph.initializer)
    if node_order is None and not stale_values and not stale_outputs and not heavy:
        return proto
    if in_place and node_order is None:
        work = proto
        for tensor in graph.initializer:
            if _heavy(tensor):
                _clear_data(tensor)
    else:
        work = shape_only_copy(proto, _heavy)
    if node_order is not None:
        del work.graph.node[:]
        work.graph.node.extend(proto.graph.node[i] for i in node_order)
    if stale_values:
        kept = [vi for vi in graph.value_info if vi.name not in inferable]
        del work.graph.value_info[:]
        work.graph.value_info.extend(kept)
    for out in work.graph.output:
        if out.name in inferable and out.type.HasField("tensor_type"):
            out.type.tensor_type.ClearField("shape")
    return work


#: Weights with more elements than this go to shape inference without their data: it needs their type and
#: dimensions, and the values only of the small ones (shapes, axes, indices) data propagation reads.
SHAPE_ONLY_ABOVE = 4096


def _clear_data(tensor: onnx.TensorProto) -> None:
    for field in ("raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data", "string_data"):
        tensor.ClearField(field)


def _heavy(tensor: onnx.TensorProto) -> bool:
    count = 1
    for d in tensor.dims:
        count *= d
    return count > SHAPE_ONLY_ABOVE and tensor.data_location != onnx.TensorProto.EXTERNAL


def inferred_types(proto: onnx.ModelProto) -> dict[str, list[bytes]]:
    """onnx's shape inference (with data propagation) over the whole graph of ``proto``, as
    serialized TypeProtos by tensor name: bytes, so that the inferred model is not kept alive.

    Raises:
        Exception: whatever onnx's inference raises.
    """
    inferred = onnx.shape_inference.infer_shapes(proto, check_type=False, strict_mode=False, data_prop=True)
    graph = inferred.graph
    return types_by_name((graph.value_info, graph.input, graph.output))


#: Graphs with fewer nodes infer their shapes in milliseconds: no child process is worth starting.
AHEAD_MIN_NODES = 20_000


def _ahead_types(proto: onnx.ModelProto) -> dict[str, list[bytes]]:
    with paused_gc():
        return inferred_types(inference_proto(proto, in_place=True))  # the child's own copy of the model


def start_inference(proto: onnx.ModelProto) -> Ahead[dict[str, list[bytes]]] | None:
    """Start onnx's shape inference of ``proto``, in its file's node order, in a child process
    (`offloadctl.core.ahead`), for the caller to go on meanwhile (check the model's files, analyse
    it) and hand it to `offloadctl.loading.tensors.tensor_infos`; None for a small graph or where no
    child can be forked (inference then runs when a size is first looked up). The model must not
    change while it runs."""
    if len(proto.graph.node) < AHEAD_MIN_NODES:
        return None
    return Ahead.start(_ahead_types, proto)


_INFERRED_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml", "ai.onnx.preview.training"})


@cache
def _has_inference(op_type: str, domain: str) -> bool:
    """True when onnx's shape inference computes this op's outputs (an op of an onnx domain it
    knows; the copy ops registered by offloadctl have no inference function)."""
    if domain not in _INFERRED_DOMAINS or op_type in COPY_OPS:
        return False
    try:
        return onnx.defs.has(op_type, "" if domain == "ai.onnx" else domain)
    except Exception:  # noqa: BLE001 - an odd domain name: not inferable
        return False


def _inferred_by_onnx(node: onnx.NodeProto) -> bool:
    """True when onnx's shape inference computes this node's outputs: an op it knows, but not an order
    pin's view, whose shape comes from a Concat of computed shapes inference cannot follow (the
    rewrite declares the view's type: its source's)."""
    return _has_inference(node.op_type, node.domain) and pin_view_source(node) is None


def _inferable_outputs(
    graph: onnx.GraphProto, names: set[str], producers: Mapping[str, int | str] | None = None
) -> set[str]:
    """Those of ``names`` that are outputs of main-graph nodes whose types onnx's shape inference
    computes itself. ``producers`` maps a tensor to the file index of the node producing it (other
    values: no node produces it), when the caller knows it; otherwise the nodes are looked at from
    the last one (graph outputs are made at the end) until every name is found."""
    names = names - {""}
    if not names:
        return set()
    nodes = graph.node
    found = set()
    if producers is not None:
        for name in names:
            index = producers.get(name)
            if type(index) is int and _inferred_by_onnx(nodes[index]):
                found.add(name)
        return found
    left = set(names)
    for node in reversed(nodes):
        made = left.intersection(node.output)
        if made:
            if _inferred_by_onnx(node):
                found |= made
            left -= made
            if not left:
                break
    return found


def types_by_name(groups: Iterable[Iterable[onnx.ValueInfoProto]]) -> dict[str, list[bytes]]:
    """Each name's serialized TypeProtos, in the order ``groups`` list them."""
    found: dict[str, list[bytes]] = {}
    for values in groups:
        for vi in values:
            entry = found.get(vi.name)
            if entry is None:
                found[vi.name] = [vi.type.SerializeToString()]
            else:
                entry.append(vi.type.SerializeToString())
    return found
