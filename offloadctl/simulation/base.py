"""The model as the simulator sees it: its original nodes, with tensors interned as integer ids.

`base_of` gives, once per `Analysis` object, the positions of the original nodes and, per position,
the tensor ids they read and write, with each tensor's size and role (weight, graph input, graph
output). A model already rewritten by apply keeps only its original nodes here: each copy's output
is read as the tensor it copies (`Base.canon`), so its "before" program is the model without
copies. Programs (`offloadctl.simulation.program`) and the time model are built on it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from offloadctl.analysis.graph import Analysis, derived
from offloadctl.analysis.timeline import subgraph_memory, weight_is_resident
from offloadctl.core.errors import OffloadError
from offloadctl.core.onnxutil import copy_kind, is_event, is_pin, pin_view_source
from offloadctl.loading.tensors import TensorInfo

__all__ = ["Base", "base_of", "canonical_names", "interner", "is_rewritten", "step_ids"]


def is_rewritten(analysis: Analysis) -> bool:
    """True when the model already contains MemcpyToHost/MemcpyFromHost nodes."""
    return any(copy_kind(n) is not None for n in analysis.nodes)


@dataclass
class Base:
    """The model as the original nodes see it: tensors as integer ids, reads and writes per position."""

    n: int
    labels: list[str]
    nodes: list[onnx.NodeProto]
    names: list[str]
    index: dict[str, int]
    sizes: list[int]  # unknown sizes count 0
    unknown: list[str]  # names of tensors with unknown size
    weight: list[bool]
    graph_input: list[bool]
    graph_output: list[bool]
    reads: list[list[int]]  # per position, one entry per input slot / subgraph read
    writes: list[list[int]]
    canon: Callable[[str], str]  # node input name -> the tensor it stands for
    infos: Mapping[str, TensorInfo]
    resident: list[bool] = field(default_factory=list)  # weights that occupy memory (read, or graph outputs)
    inner: list[int] = field(default_factory=list)  # per position: memory inside its subgraphs while it runs
    subgraph_weights: int = 0  # bytes of subgraph weights, resident for the whole run
    rewritten: bool = False  # the model contains copy nodes
    # what later stages build from the base once (`offloadctl.simulation.program.before_program`: "before")
    derived: dict[str, Any] = field(default_factory=dict)
    costs: dict[str, Any] = field(default_factory=dict)  # time model: profile key -> its node costs


def step_ids(per_step: Sequence[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """The (step, tensor id) pairs of per-step id lists (a base's or a program's reads or writes),
    as two arrays, step by step in list order."""
    lengths = np.fromiter(map(len, per_step), dtype=np.int64, count=len(per_step))
    ids = np.fromiter(itertools.chain.from_iterable(per_step), dtype=np.int64, count=int(lengths.sum()))
    return np.repeat(np.arange(len(per_step), dtype=np.int64), lengths), ids


def interner() -> tuple[list[str], dict[str, int], Callable[[str], int]]:
    """(names, index, intern): ``intern(name)`` gives each new name the next id, in first-seen order."""
    names: list[str] = []
    index: dict[str, int] = {}

    def intern(name: str) -> int:
        t = index.get(name)
        if t is None:
            t = index[name] = len(names)
            names.append(name)
        return t

    return names, index, intern


def _copy_sources(analysis: Analysis) -> tuple[set[int], dict[str, str]]:
    """The positions of the model's copy, order-pin and event nodes (none is one of the model's own), and
    what each copy's output copies (a pin's view, an event: what it stands for)."""
    nodes = analysis.nodes
    copy_nodes = {p for p, node in enumerate(nodes) if copy_kind(node) is not None or is_event(node)}
    copy_nodes.update(p for p in analysis.with_attributes() if is_pin(nodes[p]))
    source: dict[str, str] = {}
    for p in sorted(copy_nodes):
        node = analysis.nodes[p]
        if is_event(node):
            source[node.output[0]] = node.input[0]
            continue
        if is_pin(node):
            viewed = pin_view_source(node)
            if viewed is not None and node.output:
                source[node.output[0]] = viewed
            continue
        if len(node.input) != 1 or len(node.output) != 1 or not node.input[0] or not node.output[0]:
            raise OffloadError(
                f"copy node {analysis.node_names[p]!r} ({node.op_type}) in {analysis.loaded.path} must have one "
                "input and one output",
                hint="re-create the model with offloadctl apply",
            )
        source[node.output[0]] = node.input[0]
    return copy_nodes, source


def canonical_names(source: dict[str, str]) -> Callable[[str], str]:
    """``canon(name)``: the tensor a name stands for, following ``source`` (a name -> what it stands for:
    what a copy copies, what a view views) to its end."""

    def canon(name: str) -> str:
        seen = 0
        while name in source and seen <= len(source):
            name = source[name]
            seen += 1
        return name

    return canon


def plain_ids(analysis: Analysis) -> tuple[dict[str, int], list[list[int]], list[list[int]]]:
    """The tensor ids of a model without copies, and the ids each position reads and writes: the
    graph alone decides them, so they are made once per analysis (while onnx infers the sizes, for
    a command that opens a big model: `offloadctl.job.Job.of_model`). Read-only."""
    return derived(analysis, "simulation ids", _plain_ids)


def _plain_ids(analysis: Analysis) -> tuple[dict[str, int], list[list[int]], list[list[int]]]:
    """Ids of a model without copies: every name stands for itself; the analysis's uses and producers
    are read as they are."""
    index: dict[str, int] = {}
    reads: list[list[int]] = [[] for _ in range(analysis.num_positions)]
    writes: list[list[int]] = [[] for _ in range(analysis.num_positions)]
    new_id = index.setdefault
    for name in analysis.graph_inputs:
        new_id(name, len(index))
    for name in analysis.sorted_weights:
        new_id(name, len(index))
    for name, uses in analysis.uses.items():
        t = new_id(name, len(index))
        for use in uses:
            reads[use[0]].append(t)
    for name, p in analysis.producer.items():
        writes[p].append(new_id(name, len(index)))
    for name in analysis.graph_outputs:
        new_id(name, len(index))
    return index, reads, writes


def _copied_ids(
    analysis: Analysis,
    canon: Callable[[str], str],
    positions: list[int],
    index: dict[str, int],
    reads: list[list[int]],
    writes: list[list[int]],
) -> None:
    """Ids of a rewritten model's original nodes: a copy's output is the tensor it copies."""

    def tid(name: str) -> int:
        return index.setdefault(canon(name), len(index))

    for name in analysis.graph_inputs:
        tid(name)
    for name in analysis.sorted_weights:
        tid(name)
    where = {p: k for k, p in enumerate(positions)}
    for name, uses in analysis.uses.items():
        t = None
        for use in uses:
            k = where.get(use.position)
            if k is not None:
                if t is None:
                    t = tid(name)
                reads[k].append(t)
    for name, p in analysis.producer.items():
        k = where.get(p)
        if k is not None:
            writes[k].append(tid(name))
    for name in analysis.graph_outputs:
        tid(name)


def _flags(count: int, ids: dict[str, int], names: Iterable[str]) -> list[bool]:
    flags = [False] * count
    for name in names:
        flags[ids[name]] = True
    return flags


def _new_base(analysis: Analysis) -> Base:
    copy_nodes, source = _copy_sources(analysis)
    canon = canonical_names(source)
    # Ids in first-seen order: graph inputs, weights (sorted), what the nodes read, what they write,
    # graph outputs.
    positions = [p for p in range(analysis.num_positions) if p not in copy_nodes]
    canonical: dict[str, int]
    if not source:
        index, reads, writes = plain_ids(analysis)
        canonical = index
    else:
        index = {}
        reads = [[] for _ in positions]
        writes = [[] for _ in positions]
        _copied_ids(analysis, canon, positions, index, reads, writes)
        canonical = {
            name: index[canon(name)] for name in (*analysis.weights, *analysis.graph_inputs, *analysis.graph_outputs)
        }
    names = list(index)
    count = len(names)
    sizes, unknown = _sizes(analysis, names)
    weight = _flags(count, canonical, analysis.weights)
    graph_output = _flags(count, canonical, analysis.graph_outputs)
    read = {t for lst in reads for t in lst}
    sub = subgraph_memory(analysis)
    return Base(
        n=len(positions),
        labels=[analysis.node_names[p] for p in positions],
        nodes=[analysis.nodes[p] for p in positions],
        names=names,
        index=index,
        sizes=sizes,
        unknown=unknown + list(sub.unknown),
        weight=weight,
        graph_input=_flags(count, canonical, analysis.graph_inputs),
        graph_output=graph_output,
        reads=reads,
        writes=writes,
        canon=canon,
        infos=analysis.infos,
        resident=[weight[t] and weight_is_resident(t in read, graph_output[t]) for t in range(count)],
        inner=[sub.at(p) for p in positions],
        subgraph_weights=sub.weight_bytes,
        rewritten=bool(copy_nodes),
    )


def _sizes(analysis: Analysis, names: list[str]) -> tuple[list[int], list[str]]:
    """(each tensor's size, 0 when unknown; the names of those of unknown size)."""
    sizes = [0] * len(names)
    unknown: list[str] = []
    for t, name in enumerate(names):
        info = analysis.infos.get(name)
        size = info.bytes if info is not None else None
        if size is None:
            unknown.append(name)
        else:
            sizes[t] = size
    return sizes, unknown


_BASE = "simulation base"  # its key among what is derived from an analysis


def base_of(analysis: Analysis) -> Base:
    """The base of an analysis, computed once per Analysis object (one with other kernel scratch is another
    object: `offloadctl.analysis.graph.with_scratch`)."""
    return derived(analysis, _BASE, _new_base)
