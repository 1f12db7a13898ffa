"""onnxruntime's multi-stream in-place defect, found in a graph (`in_place_hazards`) and guarded against
(`guard_in_place`).

With two or more non-empty logic streams on one device, onnxruntime's reuse planner
(``allocation_planner.cc``, ``OptimizeReusePlanForMultiStream``, 1.24 to 1.32 at least) lets a
``MayInplace`` kernel N (Relu, Cast, Softmax, ...) write its output into its input v when v has
exactly one reader. It walks the graph from the last nodes back, so it decides this before it
learns, at v's producer, that v is an alias (Identity, Reshape, Squeeze, Unsqueeze, Flatten,
ExpandDims) of a root buffer that other nodes still read. N then writes into the root: a later
reader of the root reads N's output; a root that is a graph input overwrites the caller's array; a
root that is a weight makes the second run wrong. The one-stream planner counts the root's readers
and is right. ``enable_mem_reuse=False`` does not turn it off.

A second reader of v makes the planner leave v alone. The guard is that reader: an ``Identity(v)``
event node named ``offload/event/guard/<N>``, written right before N on the compute stream. It
moves no data on any provider (onnxruntime gives its output v's buffer), reads no device tensor
on the host (CANN has no Shape kernel), and under PRIORITY_BASED runs right before N, so it keeps
nothing alive longer. Under DEFAULT the walk reaches a node nobody reads only at the end, so
`offloadctl.rewriting.streams` holds each guard with an order pin on a later node that does not
itself overwrite its input (on ascend, where no pin may read a device tensor, a guard stays a leaf).

Which kernels may overwrite an input comes from onnxruntime's kernel registrations (CPU, CUDA and
the contrib ops, 1.24/1.25): `MAY_OVERWRITE` is their union, every input counted. Which outputs
alias an input is `offloadctl.simulation.ortcpu.ALIAS_OPS`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import onnx
from onnx import helper

from offloadctl.core.onnxutil import BACKWARD_ATTR, ONNX_DOMAINS, is_backward, is_constant_node, subgraph_outer_names
from offloadctl.simulation.ortcpu import ALIAS_OPS, INPLACE_OPS

__all__ = [
    "GUARD_PREFIX",
    "MAY_OVERWRITE",
    "Hazard",
    "guard_in_place",
    "in_place_hazards",
    "insert_guards",
    "may_overwrite",
]

#: the names of the guards `offloadctl.rewriting.streams` writes start with this
GUARD_PREFIX = "offload/event/guard/"

#: (domain, op) of the kernels onnxruntime's CPU or CUDA provider registers with ``MayInplace``
#: (``core/providers/{cpu,cuda}``, ``contrib_ops/{cpu,cuda}``): the CPU replica's set and CUDA's own.
MAY_OVERWRITE: frozenset[tuple[str, str]] = frozenset(
    {
        *INPLACE_OPS,
        *(
            ("", op)
            for op in (
                "HardSwish",
                "Gelu",
                "ScatterND",
                "TensorScatter",
                "Normalizer",
                "Scaler",
                "STFT",
                "DFT",
            )
        ),
        *(
            ("com.microsoft", op)
            for op in (
                "Affine",
                "QuickGelu",
                "Gelu",
                "FastGelu",
                "BiasGelu",
                "Attention",
                "DecoderMaskedMultiHeadAttention",
                "DecoderMaskedSelfAttention",
                "GroupQueryAttention",
                "SparseAttention",
                "MoE",
                "QMoE",
                "ShardedMoE",
                "Trilu",
            )
        ),
        *(("ai.onnx.ml", op) for op in ("Normalizer", "Scaler", "TreeEnsembleRegressor", "TreeEnsembleClassifier")),
    }
)

#: readers that see a tensor's shape only, never its data
_SHAPE_ONLY = frozenset({"Shape", "Size"})


def _key(node: onnx.NodeProto) -> tuple[str, str]:
    return ("" if node.domain in ONNX_DOMAINS else node.domain, node.op_type)


def may_overwrite(node: onnx.NodeProto) -> bool:
    """Whether onnxruntime may run ``node`` in place over one of its inputs (any input: `MAY_OVERWRITE`)."""
    return _key(node) in MAY_OVERWRITE


def _aliased_input(node: onnx.NodeProto, output: int) -> int | None:
    """The input whose buffer ``node``'s output ``output`` is (an alias kernel), or None."""
    return next((i for i, o in ALIAS_OPS.get(_key(node), ()) if o == output and i < len(node.input)), None)


@dataclass(frozen=True)
class Hazard:
    """A node onnxruntime's multi-stream planner lets write into a buffer that others still read.

    ``node`` (its index ``index`` in the graph's node list) may overwrite ``value``, which only it reads
    and which is an alias of ``root``; ``because`` says who else needs the root's data."""

    node: str
    index: int
    value: str
    root: str
    because: str

    def describe(self) -> str:
        return f"{self.node} may overwrite {self.value} in place, an alias of {self.root} ({self.because})"


class _Graph:
    """Who makes and who reads each value of a graph's node list (subgraph reads count at their node)."""

    def __init__(self, nodes: Sequence[onnx.NodeProto], graph: onnx.GraphProto) -> None:
        self.nodes = nodes
        self.made: dict[str, tuple[int, int]] = {}
        self.readers: dict[str, list[int]] = {}
        for k, node in enumerate(nodes):
            for j, out in enumerate(node.output):
                if out:
                    self.made[out] = (k, j)
            reads = [*(i for i in node.input if i), *(sorted(subgraph_outer_names(node)) if node.attribute else [])]
            for name in dict.fromkeys(reads):
                self.readers.setdefault(name, []).append(k)
        self.outputs = {o.name for o in graph.output}
        self.inputs = {i.name for i in graph.input}
        self.weights = {t.name for t in graph.initializer} | {s.values.name for s in graph.sparse_initializer}
        self.weights |= {o for n in nodes if is_constant_node(n) for o in n.output}

    def alias_source(self, value: str) -> str | None:
        """The value whose buffer ``value`` is, when an alias kernel makes it; None otherwise."""
        if value not in self.made:
            return None
        k, j = self.made[value]
        node = self.nodes[k]
        if is_constant_node(node):
            return None
        i = _aliased_input(node, j)
        return node.input[i] if i is not None and node.input[i] else None

    def root(self, value: str) -> str:
        seen = {value}
        while (source := self.alias_source(value)) is not None and source not in seen:
            seen.add(source)
            value = source
        return value

    def tree(self, root: str) -> tuple[set[str], set[int]]:
        """The values that share ``root``'s buffer through alias kernels, and the alias nodes that make them."""
        values, edges, todo = {root}, set(), [root]
        while todo:
            value = todo.pop()
            for k in self.readers.get(value, ()):
                node = self.nodes[k]
                for j, out in enumerate(node.output):
                    i = _aliased_input(node, j)
                    if out and i is not None and node.input[i] == value:
                        edges.add(k)
                        if out not in values:
                            values.add(out)
                            todo.append(out)
        return values, edges

    def why(self, value: str, n: int) -> str | None:
        """Who else needs the data of the buffer ``value`` aliases when node ``n`` overwrites it; None
        when nobody does."""
        root = self.root(value)
        values, edges = self.tree(root)
        if root in self.inputs:
            return "a graph input: the caller's array"
        if root in self.weights:
            return "a weight: the next run reads it"
        shown = sorted(values & self.outputs)
        if shown:
            return f"graph output {shown[0]}"
        for v in sorted(values):
            for k in self.readers.get(v, ()):
                if k != n and k not in edges and self.nodes[k].op_type not in _SHAPE_ONLY:
                    return f"{self.nodes[k].name or self.nodes[k].op_type} reads it too"
        return None


def in_place_hazards(nodes: Sequence[onnx.NodeProto], graph: onnx.GraphProto) -> list[Hazard]:
    """Every node of ``nodes`` (the main graph's, as onnxruntime runs them) that onnxruntime's multi-stream
    planner may let write into a buffer other nodes still read (see the module), in the nodes' order.

    Conservative: every input of a `MAY_OVERWRITE` kernel counts, whatever its size or type."""
    g = _Graph(nodes, graph)
    hazards: list[Hazard] = []
    for n, node in enumerate(nodes):
        if not may_overwrite(node):
            continue
        for value in dict.fromkeys(i for i in node.input if i):
            if g.alias_source(value) is None or value in g.outputs or len(g.readers.get(value, ())) != 1:
                continue
            because = g.why(value, n)
            if because is not None:
                hazards.append(Hazard(node.name, n, value, g.root(value), because))
    return hazards


def insert_guards(
    nodes: Sequence[onnx.NodeProto], hazards: Iterable[Hazard], fresh: Callable[[str], str]
) -> list[onnx.NodeProto]:
    """``nodes`` with an ``Identity(v)`` guard right before each hazard's node for each value v it may
    overwrite: v's second reader, so that onnxruntime's planner leaves v alone. ``fresh(base)`` gives an
    unused name (for the guard's output and for its node), and a guard is of the backward pass where its
    node is (``__backwardpass``), as PRIORITY_BASED orders those last."""
    at: dict[int, list[str]] = {}
    for hazard in hazards:
        at.setdefault(hazard.index, []).append(hazard.value)
    out: list[onnx.NodeProto] = []
    for k, node in enumerate(nodes):
        for value in at.get(k, ()):
            guard = helper.make_node(
                "Identity", [value], [fresh(f"{value}__event_guard")], name=fresh(f"{GUARD_PREFIX}{node.name}")
            )
            if is_backward(node):
                guard.attribute.append(helper.make_attribute(BACKWARD_ATTR, 1))
            out.append(guard)
        out.append(node)
    return out


def guard_in_place(model: onnx.ModelProto) -> list[Hazard]:
    """Guard ``model`` (in place) against onnxruntime's multi-stream in-place defect: a guard before each
    hazard (`in_place_hazards`, `insert_guards`), read by nobody, which holds under PRIORITY_BASED
    (`offloadctl.rewriting.streams` also holds them under DEFAULT). For a model of your own that you run
    with a partition file of your own; list the guards in the stream of the node each guards. Returns
    the hazards guarded."""
    graph = model.graph
    hazards = in_place_hazards(list(graph.node), graph)
    if hazards:
        taken = {o for n in graph.node for o in n.output} | {n.name for n in graph.node}
        taken |= {i.name for i in graph.input} | {t.name for t in graph.initializer}

        def fresh(base: str) -> str:
            name, k = base, 1
            while name in taken:
                name, k = f"{base}_{k}", k + 1
            taken.add(name)
            return name

        guarded = insert_guards(list(graph.node), hazards, fresh)
        del graph.node[:]
        graph.node.extend(guarded)
    return hazards
