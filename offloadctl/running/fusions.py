"""What onnxruntime's graph optimizer made of a model at one level: the model's tensors that are gone
(a fusion or a folded constant took them in) and, for each node time profiled on the optimized
model, the original node it belongs to.

A profile measured above ``--opt-level disable`` times the nodes onnxruntime runs, which are not the
model's own: a ``Gemm`` stands for a MatMul and an Add, an NCHWc chain for several Convs. Each
optimized node's time goes to one original node, so that the original's node times still add up to
the optimized run and a rewrite of the original can be priced with them:

1. an original node of the same name (a node the optimizer kept, or a fused node named after one);
2. else the original producer of one of its outputs (a fused node writes the name its group's last
   node wrote);
3. else the first such producer downstream (``ReorderInput`` -> NCHWc ``Conv`` -> ``ReorderOutput``:
   the chain's time goes to the Conv whose output ``ReorderOutput`` writes).

Original nodes that the optimized graph lacks and that got no time are listed as not run (they cost
nothing). The "fused" tensors are what a plan made for that level must not offload: the original's
node outputs and weights the optimized graph lacks (a D2H copy would read them, which undoes the
rewrite that took them in), and the weights an optimized node reads that is not an original node as
it was (an NCHWc Conv reads its bias, a fused node its weights: through MemcpyFromHost they are no
longer constants, which those rewrites need).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import onnx

from offloadctl.analysis.graph import Analysis
from offloadctl.core.onnxutil import subgraph_outer_names

__all__ = ["Fusions", "attribute"]


@dataclass(frozen=True)
class Fusions:
    """The optimized model read against the original one.

    Attributes:
        fused: the original's node outputs the optimized graph lacks, in execution order, then
            the weights it lacks or a rewritten node reads, sorted.
        nodes: the profile's node table keyed by the original's node names (see the module docstring).
        unattributed_s: the time of optimized nodes no original node could take (none in practice).
    """

    fused: list[str]
    nodes: dict[str, dict[str, Any]]
    unattributed_s: float


def _present(graph: onnx.GraphProto) -> set[str]:
    names = {i.name for i in graph.input} | {i.name for i in graph.initializer} | {o.name for o in graph.output}
    names |= {s.values.name for s in graph.sparse_initializer}
    for node in graph.node:
        names.update(node.input)
        names.update(node.output)
        if node.attribute:
            names |= subgraph_outer_names(node)
    names.discard("")
    return names


def _input_shapes(analysis: Analysis, position: int) -> list[list[int] | None]:
    shapes: list[list[int] | None] = []
    for name in analysis.nodes[position].input:
        if not name:
            continue
        info = analysis.infos.get(name)
        known = info is not None and info.shape is not None and all(isinstance(d, int) for d in info.shape)
        shapes.append(info.int_shape() if known and info is not None else None)
    return shapes


class _Targets:
    """The original position each optimized node's time goes to."""

    def __init__(self, analysis: Analysis, graph: onnx.GraphProto) -> None:
        self.analysis = analysis
        self.by_name = {node.name: p for p, node in enumerate(analysis.nodes) if node.name}
        self.nodes = {node.name: node for node in graph.node if node.name}
        self.readers: dict[str, list[onnx.NodeProto]] = {}
        for node in graph.node:
            for name in node.input:
                if name:
                    self.readers.setdefault(name, []).append(node)

    def kept(self, node: onnx.NodeProto) -> bool:
        """Whether an optimized node is an original node as it was (name, op type and domain)."""
        p = self.by_name.get(node.name) if node.name else None
        if p is None:
            return False
        original = self.analysis.nodes[p]
        return original.op_type == node.op_type and (original.domain or "") == (node.domain or "")

    def _writer(self, node: onnx.NodeProto) -> int | None:
        producer = self.analysis.producer
        return next((producer[o] for o in node.output if o in producer), None)

    def of(self, name: str) -> int | None:
        node = self.nodes.get(name)
        if name in self.by_name:
            return self.by_name[name]
        if node is None:
            return None
        found = self._writer(node)
        if found is not None:
            return found
        seen = {id(node)}
        queue = deque([node])
        while queue:
            for out in queue.popleft().output:
                for reader in self.readers.get(out, ()):
                    if id(reader) in seen:
                        continue
                    seen.add(id(reader))
                    found = self._writer(reader)
                    if found is not None:
                        return found
                    queue.append(reader)
        return None


def attribute(analysis: Analysis, optimized: onnx.ModelProto, measured: dict[str, dict[str, Any]]) -> Fusions:
    """Read the optimized model against ``analysis`` (the original's) and give each measured node's
    time (``measured``: name -> {op_type, seconds, input_shapes, scratch_bytes}, as profiling named the
    optimized nodes) to an original node."""
    graph = optimized.graph
    present = _present(graph)
    targets = _Targets(analysis, graph)
    fused = [t for t in analysis.producer if t not in present]
    fused += [
        w
        for w in analysis.sorted_weights
        if w in analysis.uses and (w not in present or any(not targets.kept(r) for r in targets.readers.get(w, ())))
    ]
    seconds: dict[int, float] = {}
    scratch: dict[int, int] = {}
    unattributed = 0.0
    for name, entry in measured.items():
        p = targets.of(name)
        if p is None:
            unattributed += float(entry["seconds"])
            continue
        seconds[p] = seconds.get(p, 0.0) + float(entry["seconds"])
        if entry.get("scratch_bytes"):
            scratch[p] = max(scratch.get(p, 0), int(entry["scratch_bytes"]))
    nodes: dict[str, dict[str, Any]] = {}
    for p, node in enumerate(analysis.nodes):
        if not node.name:
            continue
        if p in seconds:
            entry = {"op_type": node.op_type, "seconds": seconds[p]}
            shapes = _input_shapes(analysis, p)
            if all(s is not None for s in shapes):
                entry["input_shapes"] = shapes
            if p in scratch:
                entry["scratch_bytes"] = scratch[p]
            nodes[node.name] = entry
        elif node.name not in targets.nodes:
            nodes[node.name] = {"op_type": node.op_type, "seconds": 0.0, "ran": False}
    return Fusions(fused, nodes, unattributed)
