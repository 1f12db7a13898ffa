"""What onnxruntime changes in a graph before it runs it, whatever the optimization level.

onnxruntime's ``InferenceSession::TransformGraph`` always applies a few rewrites, even with
``ORT_DISABLE_ALL``; positions must count what really runs, so planning works on the model with
them already applied (`normalize`), and the rewritten model carries them: onnxruntime then finds
nothing left to change, and the file order is the order that runs. The rewrites, in onnxruntime's
order:

1. Ahead-of-time function inlining (model-local functions and the ONNX ops it runs as function
   bodies): `offloadctl.loading.inline`.
2. ``EnsureUniqueDQForNodeUnit`` (unless ``session.disable_quant_qdq`` is set): a DequantizeLinear
   whose output feeds more than one node input gets one copy per extra input; an output that is
   also a graph output or read inside a subgraph keeps the original and every node input gets a
   copy. onnxruntime appends the copies (``{name}/duplicated``) after every other node, so under
   PRIORITY_BASED they run late; `normalize` places each copy just before its reader instead.
3. ``RemoveDuplicateCastTransformer`` (part of ``InsertCastTransformer``): a Cast whose readers
   are all Casts is removed unless it loses precision in a way a reader would expose, and a pair
   of Casts that undo each other (float -> double -> float) is removed. `normalize` repeats it
   until nothing changes, so that onnxruntime's own single pass finds nothing on the result.

Not applied here, because they depend on the execution provider rather than the graph: the Cast
nodes the CPU provider inserts around float16 ops it has no float16 kernel for, and the copies
onnxruntime inserts between providers when some nodes fall back to the CPU. A plan for a device
counts both where they run (`offloadctl.loading.placed`).

`expected_run_order` predicts, for a model as it stands, the names of the nodes onnxruntime runs
with PRIORITY_BASED in the order it runs them (new nodes appended after every other node, as
onnxruntime does): `offloadctl run` compares it with the order profiling reports.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import onnx
from onnx import TensorProto

from offloadctl.core.onnxutil import rename_outer, subgraph_outer_names, subgraphs
from offloadctl.loading.inline import expand_inlined_functions, inlined_calls

__all__ = [
    "Normalized",
    "normalize",
    "unique_dequantize",
    "remove_duplicate_casts",
    "inlined_calls",
    "expand_inlined_functions",
    "fresh_name",
    "INSERTED_CAST_PREFIX",
]

logger = logging.getLogger(__name__)

_DQ_DOMAINS = ("", "ai.onnx", "com.microsoft")
#: the name onnxruntime's InsertCastTransformer gives the Casts it inserts (then their tensor's name)
INSERTED_CAST_PREFIX = "InsertedPrecisionFreeCast_"


@dataclass(frozen=True)
class Normalized:
    """What `normalize` changed."""

    inlined: list[str]  # op types of the calls replaced by their bodies
    dequantize_copies: int
    casts_removed: int

    @property
    def changed(self) -> bool:
        return bool(self.inlined or self.dequantize_copies or self.casts_removed)


def normalize(proto: onnx.ModelProto) -> Normalized:
    """Apply, in place, the rewrites onnxruntime always applies (see the module docstring)."""
    calls = inlined_calls(proto)
    inlined = sorted({n.op_type for n in calls}) if expand_inlined_functions(proto, calls) else []
    ops = _ops_everywhere(proto.graph)  # most models need neither pass: one look at the op types
    copies = unique_dequantize(proto.graph, place="before_reader") if "DequantizeLinear" in ops else 0
    removed = 0
    while "Cast" in ops:
        step = remove_duplicate_casts(proto)
        removed += step
        if not step:
            break
    return Normalized(inlined, copies, removed)


# ------------------------------------------------------------------------------------------ graphs


# Standard ops with graph attributes; nodes of other domains may have them too.
_CONTROL_FLOW = frozenset({"If", "Loop", "Scan", "SequenceMap"})
_STANDARD_DOMAINS = frozenset({"", "ai.onnx", "ai.onnx.ml"})


def _op_types(graph: onnx.GraphProto) -> list[tuple[str, str]]:
    """(op type, domain) of each node of ``graph``, read in one pass."""
    return [(n.op_type, n.domain) for n in graph.node]


def _holder_indices(graph: onnx.GraphProto, op_types: list[tuple[str, str]] | None = None) -> list[int]:
    """Indices of the nodes of ``graph`` that may hold subgraphs (big graphs: no attribute is read
    for the rest); ``op_types``: `_op_types` of the graph, when the caller has them."""
    return [
        i
        for i, (op, domain) in enumerate(op_types if op_types is not None else _op_types(graph))
        if op in _CONTROL_FLOW or domain not in _STANDARD_DOMAINS
    ]


def _holders(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """The nodes of ``graph`` that may hold subgraphs."""
    return [graph.node[i] for i in _holder_indices(graph)]


def _ops_everywhere(graph: onnx.GraphProto) -> set[str]:
    """Op types of ``graph`` and its subgraphs."""
    op_types = _op_types(graph)
    ops = {op for op, _ in op_types}
    for i in _holder_indices(graph, op_types):
        for sub in subgraphs(graph.node[i]):
            ops |= _ops_everywhere(sub)
    return ops


# ---------------------------------------------------------------------------- unique DequantizeLinear


def _is_dq(node: onnx.NodeProto) -> bool:
    return node.op_type == "DequantizeLinear" and node.domain in _DQ_DOMAINS


def unique_dequantize(graph: onnx.GraphProto, *, place: str = "before_reader") -> int:
    """onnxruntime's EnsureUniqueDQForNodeUnit on ``graph`` and its subgraphs, in place.

    ``place``: "before_reader" puts each copy just before the node that reads it; "end" appends
    the copies after every other node, as onnxruntime does. Returns how many copies were made.
    """
    made = 0
    for node in _holders(graph):  # subgraphs first, as onnxruntime recurses before handling a node
        for sub in subgraphs(node):
            made += unique_dequantize(sub, place=place)
    if not any(_is_dq(n) for n in graph.node):
        return made
    outputs = {o.name for o in graph.output}
    readers: dict[str, list[tuple[int, int]]] = {}  # tensor -> (node index, input slot), by node index
    for i, node in enumerate(graph.node):
        for k, name in enumerate(node.input):
            if name:
                readers.setdefault(name, []).append((i, k))
    holders = [(n, subgraph_outer_names(n)) for n in _holders(graph)]
    implicit: set[str] = set().union(*(names for _, names in holders))
    names = {n.name for n in graph.node if n.name}
    before: dict[int, list[onnx.NodeProto]] = {}
    appended: list[onnx.NodeProto] = []
    taken_values = {o for n in graph.node for o in n.output} | {v.name for v in graph.input}
    for node in list(graph.node):
        if not _is_dq(node) or not node.output or not node.output[0]:
            continue
        out = node.output[0]
        edges = readers.get(out, [])  # edges to explicit inputs, in onnxruntime's edge order
        subgraph_reader = sum(out in names for _, names in holders) if out in implicit else 0
        produces_output = out in outputs
        total = len(edges) + subgraph_reader
        if total == 0 or (total == 1 and not produces_output):
            continue
        reuse = not subgraph_reader and not produces_output
        for i, k in edges[1:] if reuse else edges:
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            copy.name = fresh_name(f"{node.name}/duplicated", names)
            copy.output[0] = fresh_name(f"{out}/duplicated", taken_values)
            graph.node[i].input[k] = copy.output[0]
            (appended if place == "end" else before.setdefault(i, [])).append(copy)
            made += 1
    if before or appended:
        ordered: list[onnx.NodeProto] = []
        for i, node in enumerate(graph.node):
            ordered.extend(before.get(i, ()))
            ordered.append(node)
        ordered.extend(appended)
        kept = [onnx.NodeProto() for _ in ordered]
        for dst, src in zip(kept, ordered):
            dst.CopyFrom(src)
        del graph.node[:]
        graph.node.extend(kept)
    return made


def fresh_name(base: str, taken: set[str]) -> str:
    """A name not in ``taken`` (added to it): ``base``, else ``base_token_K`` as onnxruntime names them."""
    name, k = base, 0
    while name in taken:
        name = f"{base}_token_{k}"
        k += 1
    taken.add(name)
    return name


# ------------------------------------------------------------------------------------- duplicate casts

_GROUPS = {
    "bool": "bool",
    **dict.fromkeys(("int8", "int16", "int32", "int64"), "int"),
    **dict.fromkeys(("uint8", "uint16", "uint32", "uint64"), "uint"),
    **dict.fromkeys(("bfloat16", "float16", "float", "double"), "float"),
}
_BITS = {
    "bool": 1,
    "int8": 8,
    "uint8": 8,
    "int16": 16,
    "uint16": 16,
    "bfloat16": 16,
    "float16": 16,
    "int32": 32,
    "uint32": 32,
    "float": 32,
    "int64": 64,
    "uint64": 64,
    "double": 64,
}


def _type_name(elem: int | None) -> str | None:
    if not elem:
        return None
    try:
        return TensorProto.DataType.Name(elem).lower()
    except ValueError:
        return None


def _unsafe(src: int | None, dst: int | None, name: str) -> bool:
    """onnxruntime's ``UnsafeCast``: a cast that may lose information (unknown types count as unsafe)."""
    s, d = _type_name(src), _type_name(dst)
    gs, gd = _GROUPS.get(s or ""), _GROUPS.get(d or "")
    if gs is None or gd is None:
        return True
    if gs not in ("bool", "uint") and gd == "uint":
        return True
    if gs == "float" and gd != "float":
        return True
    bs, bd = _BITS[s], _BITS[d]  # type: ignore[index]
    if gs == "uint" and gd == "int":
        return bd <= bs
    if gs in ("int", "uint") and gd == "float":
        return bd <= bs
    if {s, d} == {"float16", "bfloat16"}:
        return True
    return bs > bd and not name.startswith(INSERTED_CAST_PREFIX)


def _is_cast(node: onnx.NodeProto) -> bool:
    return node.op_type == "Cast" and node.domain in ("", "ai.onnx") and len(node.input) == 1 and len(node.output) == 1


def _has_cast_chain(graph: onnx.GraphProto) -> bool:
    casts = [n for n, op in zip(graph.node, (n.op_type for n in graph.node)) if op == "Cast" and _is_cast(n)]
    outputs = {n.output[0] for n in casts}
    if any(n.input[0] in outputs for n in casts):
        return True
    return any(_has_cast_chain(sub) for n in _holders(graph) for sub in subgraphs(n))


def _elem_types(proto: onnx.ModelProto) -> dict[str, int]:
    """Element type of every tensor name in the model and its subgraphs (from onnx's inference)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(proto, check_type=False, strict_mode=False)
    except Exception:  # noqa: BLE001 - best effort: what the file declares
        inferred = proto
    types: dict[str, int] = {}

    def collect(graph: onnx.GraphProto) -> None:
        for value in list(graph.input) + list(graph.output) + list(graph.value_info):
            if value.type.HasField("tensor_type") and value.type.tensor_type.elem_type:
                types.setdefault(value.name, value.type.tensor_type.elem_type)
        for init in graph.initializer:
            types[init.name] = init.data_type
        for node in graph.node:
            if _is_cast(node):
                to = next((a.i for a in node.attribute if a.name == "to"), 0)
                if to:
                    types[node.output[0]] = to
            for sub in subgraphs(node):
                collect(sub)

    collect(inferred.graph)
    return types


def remove_duplicate_casts(proto: onnx.ModelProto, types: dict[str, int] | None = None) -> int:
    """One pass of onnxruntime's RemoveDuplicateCastTransformer over the model, in place.

    Returns how many Cast nodes were removed. ``types`` maps tensor names to element types
    (computed with onnx's shape inference when not given, and only when the model has a Cast
    that reads a Cast).
    """
    if not _has_cast_chain(proto.graph):
        return 0
    if types is None:
        types = _elem_types(proto)
    return _remove_casts_in(proto.graph, types)


def _remove_casts_in(graph: onnx.GraphProto, types: dict[str, int]) -> int:
    return _CastRemover(graph, types).run()


class _CastRemover:
    """onnxruntime's cast removal over one graph (and, recursively, its bodies)."""

    def __init__(self, graph: onnx.GraphProto, types: dict[str, int]) -> None:
        self.graph = graph
        self.types = types
        self.outputs = {o.name for o in graph.output}
        self.nodes = list(graph.node)
        self.removed: set[int] = set()
        self.holders = set(_holder_indices(graph))
        # tensor -> (node index, input slot; -1 = a read inside a subgraph)
        self.readers: dict[str, list[tuple[int, int]]] = {}
        for i, node in enumerate(self.nodes):
            for k, name in enumerate(node.input):
                if name:
                    self.readers.setdefault(name, []).append((i, k))
            if i in self.holders:
                for name in subgraph_outer_names(node):
                    self.readers.setdefault(name, []).append((i, -1))

    def rewire(self, old: str, new: str) -> None:
        """Every reader of ``old`` reads ``new`` (explicit inputs, and outer-scope reads of subgraphs)."""
        for i, k in self.readers.pop(old, []):
            if i in self.removed:
                continue
            if k >= 0:
                self.nodes[i].input[k] = new
            else:
                for sub in subgraphs(self.nodes[i]):
                    rename_outer(sub, old, new)
            self.readers.setdefault(new, []).append((i, k))

    def _children(self, node: onnx.NodeProto) -> tuple[list[tuple[int, int]], list[int], list[int]] | None:
        """(readers of the Cast's output, reading Casts that undo it, other reading Casts), or None when a
        reading Cast cannot be judged (a lossy pair onnxruntime leaves alone)."""
        types = self.types
        src, dst = types.get(node.input[0]), types.get(node.output[0])
        loss = _unsafe(src, dst, node.name)
        children = [(j, k) for j, k in self.readers.get(node.output[0], []) if j not in self.removed]
        drop: list[int] = []
        keep: list[int] = []
        for j, k in children:
            child = self.nodes[j]
            if k < 0 or not _is_cast(child):
                continue
            s1, d1 = types.get(child.input[0]), types.get(child.output[0])
            if loss and _unsafe(d1, s1, child.name):
                return None
            if child.output[0] not in self.outputs and src == d1 and s1 == dst and src is not None:
                drop.append(j)
            else:
                keep.append(j)
        return children, drop, keep

    def run(self) -> int:
        count = 0
        for i, node in enumerate(self.nodes):
            if i in self.removed:
                continue
            if not _is_cast(node):
                if i in self.holders:
                    count += sum(_remove_casts_in(sub, self.types) for sub in subgraphs(node))
                continue
            judged = self._children(node)
            if judged is None:
                continue
            children, drop, keep = judged
            src_name, out = node.input[0], node.output[0]
            for j in drop:
                self.removed.add(j)
                self.rewire(self.nodes[j].output[0], src_name)
                count += 1
            if children and len(drop) + len(keep) == len(children) and out not in self.outputs:
                self.removed.add(i)
                self.rewire(out, src_name)
                count += 1
        if self.removed:
            self._drop_removed()
        return count

    def _drop_removed(self) -> None:
        """Write the graph's nodes again without the removed ones."""
        kept = [onnx.NodeProto() for i in range(len(self.nodes)) if i not in self.removed]
        for dst_node, src_node in zip(kept, (n for i, n in enumerate(self.nodes) if i not in self.removed)):
            dst_node.CopyFrom(src_node)
        del self.graph.node[:]
        self.graph.node.extend(kept)
