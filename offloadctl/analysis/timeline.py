"""The memory timeline: where each tensor lives on the device, step by step, and what that adds up to.

This module owns the memory rules once; the simulator, the prefetch stage and the budget strategy
all use them (and a property test checks that they agree with a naive recomputation).

Steps. Over the execution order, step p (0 <= p < n) is the node at position p and step n is the
end of the run, where every graph output must be on the device. A *span* ``(first, last)`` is the
inclusive range of steps a buffer occupies.

Where a tensor lives when nothing is offloaded (:func:`resident_spans`):

- a node output from its producer to its last reader (to the end if it is a graph output; only its
  producer's step if nobody reads it);
- a graph input from step 0 to its last reader (to the end if it is also a graph output);
- a weight (initializer or Constant node) for the whole run, if a node reads it or it is a graph
  output. onnxruntime drops an initializer that nothing reads when it creates the session (it says
  "Removing initializer ... It is not used by any node"), so such a weight takes no memory.

Where an offloaded tensor lives (:func:`offloaded_spans`):

- an activation keeps its device buffer from its producer to the *release point*: the last device
  use, or later when the plan holds it (:func:`release_point`: last device use + release distance,
  at most the last node);
- each reload group's copy lives from its H2D (:func:`h2d_position`: ``prefetch_distance`` before
  the group's first use, never before the D2H or, for a weight, before step 0) to the group's last
  use; an offloaded graph output's final copy lives from its H2D to the end;
- an offloaded weight lives only in its reload groups' copies.

Memory inside subgraphs (:func:`subgraph_memory`): the weights of If/Loop/Scan bodies (their
initializers and Constant nodes) are session state, resident for the whole run, and never
offloaded; the tensors a body makes live while its parent node runs, so the parent's step also
holds the body's own working set at its peak (an If the larger of its branches, a Loop or Scan the
peak of one iteration). Values a body reads from outside count as reads of the parent node, and its
outputs as the parent's outputs.

The working set of a step is the sum of the bytes of every span covering it, plus the weights and
subgraph memory above; its maximum is the peak (ties go to the earliest step). :class:`WorkingSet`
keeps it incrementally (add or remove a span, ask for the peak and where it is, or the largest
value over a range). The *lower bound* (:func:`lower_bound`) is the largest working set of a single
step on its own: what the node reads and writes (weights included), the graph inputs still to be
read (never offloaded), the subgraph memory at that step, and the subgraph weights; the end of the
run holds every graph output. No plan can go below it.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

from offloadctl.analysis.graph import Analysis, derived
from offloadctl.analysis.order import node_reads
from offloadctl.core.onnxutil import has_subgraphs, is_constant_node, named_subgraphs
from offloadctl.loading.symbolic import body_key

if TYPE_CHECKING:
    from offloadctl.core.plantypes import Offload, Plan

__all__ = [
    "Span",
    "h2d_low",
    "h2d_position",
    "release_point",
    "buffer_span",
    "buffer_spans",
    "resident_spans",
    "offloaded_spans",
    "entry_spans",
    "tensor_bytes",
    "memory_tensors",
    "unknown_tensors",
    "weight_is_resident",
    "SubgraphMemory",
    "subgraph_memory",
    "profile",
    "peak_of",
    "sweep",
    "step_bound",
    "lower_bound",
    "WorkingSet",
]

logger = logging.getLogger(__name__)

IntArray = Sequence[int] | np.ndarray  # positions or sizes, as a list or an array

Span = tuple[int, int]


# ------------------------------------------------------------------------------------------ rules


def h2d_low(kind: str, d2h_after: int | None) -> int:
    """The earliest position an H2D may run before: just after the D2H (activations) or 0 (weights)."""
    return d2h_after + 1 if kind == "activation" and d2h_after is not None else 0


def h2d_position(first_use: int, low: int, distance: int) -> int:
    """Where a reload group's H2D runs: ``distance`` positions before its first use, not before ``low``."""
    return max(low, first_use - distance)


def release_point(last_device_use: int, release_distance: int, num_positions: int) -> int:
    """The position after which an offloaded activation's device buffer may be reused."""
    return min(last_device_use + release_distance, max(num_positions - 1, 0))


def buffer_span(first: int, last_read: int, end: int, *, to_end: bool = False, hold: int = -1) -> Span:
    """Steps a device buffer occupies: from ``first`` (its producer; 0 for a graph input) to its last
    reader, or to the step a plan holds it through (``hold``) if that is later; to ``end`` for a graph
    output (``to_end``). Never less than its first step: an output nobody reads is freed after its
    producer."""
    return (first, end if to_end else max(first, last_read, hold))


def buffer_spans(
    first: np.ndarray, last_read: np.ndarray, end: int, *, to_end: np.ndarray, hold: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """`buffer_span` of many buffers at once: (first steps, last steps) as arrays (``hold``: -1 where
    nothing holds a buffer)."""
    last = np.maximum(first, last_read)
    if hold is not None:
        last = np.maximum(last, hold)
    return first, np.where(to_end, end, last)


def weight_is_resident(used: bool, graph_output: bool) -> bool:
    """A weight occupies the device when a node reads it or it is a graph output (onnxruntime drops the rest)."""
    return used or graph_output


def tensor_bytes(analysis: Analysis, name: str) -> int:
    """A main-graph tensor's size; unknown sizes count 0 (the simulator lists them)."""
    info = analysis.infos.get(name)
    return (info.bytes or 0) if info is not None else 0


def resident_spans(analysis: Analysis, name: str) -> list[Span]:
    """Steps a main-graph tensor occupies when it is not offloaded (see the module docstring)."""
    n = analysis.num_positions
    uses = analysis.uses.get(name)
    is_output = name in analysis.graph_outputs
    if name in analysis.producer:
        start = analysis.producer[name]
    elif name in analysis.weights:
        return [(0, n)] if weight_is_resident(bool(uses), is_output) else []
    else:  # a graph input
        start = 0
    return [buffer_span(start, uses[-1].position if uses else start, n, to_end=is_output)]


def offloaded_spans(
    *,
    activation: bool,
    producer: int,
    last_device_use: int | None,
    release_after: int | None,
    groups: Iterable[Span],
    output_h2d: int | None,
    num_positions: int,
) -> list[Span]:
    """Steps an offloaded tensor occupies on the device.

    Args:
        activation: an activation (it has a device buffer until its release point) or a weight.
        producer: the producer's position (activations).
        last_device_use: the last use that reads the device buffer (None: only the producer).
        release_after: the release point (None: the last device use).
        groups: (H2D position, last use) of each reload group.
        output_h2d: where the copy feeding an offloaded graph output runs (None: no such copy).
        num_positions: n, the number of nodes.
    """
    spans: list[Span] = []
    if activation:
        last = producer if last_device_use is None else last_device_use
        spans.append(buffer_span(producer, last, num_positions, hold=-1 if release_after is None else release_after))
    spans.extend(groups)
    if output_h2d is not None:
        spans.append((output_h2d, num_positions))
    return spans


def entry_spans(entry: Offload, num_positions: int, *, prefetch_distance: int, release_distance: int = 0) -> list[Span]:
    """Steps a plan entry's tensor occupies; positions a stage has not filled in yet (``h2d_before``,
    ``release_after`` null) are placed as the prefetch stage will place them."""
    activation = entry["kind"] == "activation"
    distance = entry["prefetch_distance"] if entry["prefetch_distance"] is not None else prefetch_distance
    low = h2d_low(entry["kind"], entry["d2h_after"])
    groups = []
    for group in entry["reload_groups"]:
        h2d = group["h2d_before"]
        if h2d is None:
            h2d = h2d_position(group["uses"][0]["position"], low, distance)
        groups.append((h2d, group["uses"][-1]["position"]))
    producer = last_device = release = 0
    if activation:
        assert entry["producer"] is not None and entry["d2h_after"] is not None  # so is every valid activation's
        producer = entry["producer"]["position"]
        last_device = entry["device_uses"][-1]["position"] if entry["device_uses"] else entry["d2h_after"]
        planned_release = entry["release_after"]
        if planned_release is None:
            release = release_point(last_device, release_distance, num_positions)
        else:
            release = planned_release
    return offloaded_spans(
        activation=activation,
        producer=producer,
        last_device_use=last_device,
        release_after=release,
        groups=groups,
        output_h2d=entry["output_h2d_before"] if entry.get("graph_output") else None,
        num_positions=num_positions,
    )


def memory_tensors(analysis: Analysis) -> list[str]:
    """Every main-graph tensor the timeline accounts for: graph inputs, node outputs, weights."""
    names = list(analysis.graph_inputs) + list(analysis.producer) + list(analysis.sorted_weights)
    return list(dict.fromkeys(names))


# ------------------------------------------------------------------------------ memory in subgraphs


@dataclass(frozen=True)
class SubgraphMemory:
    """Memory that lives inside If/Loop/Scan bodies (see the module docstring)."""

    weight_count: int = 0
    weight_bytes: int = 0  # resident for the whole run
    # position -> what the node holds while it runs besides its inputs and outputs: its bodies' working
    # set and its kernel scratch (`Analysis.scratch`)
    inner: dict[int, int] = field(default_factory=dict)
    unknown: tuple[str, ...] = ()  # body tensors whose size is unknown (counted as 0)
    bodies: dict[int, int] = field(default_factory=dict)  # position -> its bodies' working set alone
    # position -> (bytes, count) of the weights its bodies hold (resident for the whole run)
    body_weights: dict[int, tuple[int, int]] = field(default_factory=dict)

    def at(self, position: int) -> int:
        return self.inner.get(position, 0)


def _type_bytes(type_proto: onnx.TypeProto) -> int | None:
    if not type_proto.HasField("tensor_type"):
        return None
    t = type_proto.tensor_type
    if not t.elem_type or not t.HasField("shape"):
        return None
    dims = []
    for d in t.shape.dim:
        if not d.HasField("dim_value"):
            return None
        dims.append(d.dim_value)
    return _bytes_of(t.elem_type, dims)


def _bytes_of(elem_type: int, dims: Sequence[int]) -> int | None:
    try:
        itemsize = onnx.helper.tensor_dtype_to_np_dtype(elem_type).itemsize
    except (KeyError, TypeError, ValueError):
        return None
    count = math.prod(dims)
    if elem_type in (onnx.TensorProto.INT4, onnx.TensorProto.UINT4):
        return (count + 1) // 2
    return count * itemsize


def _weight_bytes(graph: onnx.GraphProto) -> tuple[int, int, set[str]]:
    """(count, bytes, names) of a body's own weights: initializers, sparse initializers, Constant nodes."""
    count = total = 0
    names: set[str] = set()
    for init in graph.initializer:
        count += 1
        total += _bytes_of(init.data_type, init.dims) or 0
        names.add(init.name)
    for sparse in graph.sparse_initializer:
        count += 1
        total += _bytes_of(sparse.values.data_type, sparse.dims) or 0
        names.add(sparse.values.name)
    for node in graph.node:
        if is_constant_node(node) and node.output:
            count += 1
            names.add(node.output[0])
            total += sum(map(_constant_bytes, node.attribute))
    return count, total, names


def _constant_bytes(attr: onnx.AttributeProto) -> int:
    """The bytes of a Constant node's value attribute (0 for its other attributes)."""
    if attr.name == "value" and attr.type == onnx.AttributeProto.TENSOR:
        return _bytes_of(attr.t.data_type, attr.t.dims) or 0
    if attr.name in ("value_floats", "value_ints"):
        return 4 * len(attr.floats) if attr.name == "value_floats" else 8 * len(attr.ints)
    if attr.name in ("value_float", "value_int"):
        return 4 if attr.name == "value_float" else 8
    return 0


class _BodyWalker:
    """Weights and peak working set of bodies, recursively. ``measured`` sizes (one run) win over the
    inferred types of body tensors."""

    def __init__(
        self, measured: Any = None, fallback: Mapping[tuple[str, ...], Mapping[str, onnx.TypeProto]] | None = None
    ) -> None:
        self.measured = measured
        self.fallback = fallback or {}  # types by body (`offloadctl.loading.symbolic.body_key`)
        self.weight_count = 0
        self.weight_bytes = 0
        self.unknown: list[str] = []

    def node_inner(self, node: onnx.NodeProto, label: str, path: tuple[str, ...] = ()) -> int:
        """Working set of a node's bodies while it runs: the largest one (an If runs one branch)."""
        peaks = []
        for name, g in named_subgraphs(node):
            peaks.append(self.body_peak(g, f"{label}/{name}", body_key(path, node, name)))
        return max(peaks, default=0)

    def body_peak(self, graph: onnx.GraphProto, label: str, key: tuple[str, ...] = ()) -> int:
        """The body's working set at its largest: its own tensors alive from where they are made (an
        input: from the start) to their last read, and at a node with bodies of its own, theirs."""
        count, total, weights = _weight_bytes(graph)
        self.weight_count += count
        self.weight_bytes += total
        nodes = [node for node in graph.node if not is_constant_node(node)]
        sizes = self._body_sizes(graph, nodes, weights, label, key)
        if not nodes:
            return sum(sizes[i.name] for i in graph.input if i.name in sizes)
        live = _body_live(graph, nodes, sizes)
        for k, node in enumerate(nodes):
            if has_subgraphs(node):
                live[k] += self.node_inner(node, f"{label}/{node.name or node.op_type}", key)
        return int(live.max())

    def _body_sizes(
        self, graph: onnx.GraphProto, nodes: list[onnx.NodeProto], weights: set[str], label: str, key: tuple[str, ...]
    ) -> dict[str, int]:
        """The size of each of the body's own tensors (its inputs and what its nodes make, less its outputs
        and weights), in the body's own order so that the unknown ones (counted as 0, and listed) are
        listed the same way on every run: measured, else from the types the body declares or the
        fallback's."""
        types = self._body_types(graph, key)
        outputs = {o.name for o in graph.output}
        named = dict.fromkeys([*(i.name for i in graph.input), *(o for node in nodes for o in node.output if o)])
        sizes: dict[str, int] = {}
        for name in (n for n in named if n not in outputs and n not in weights):
            size = self._size(name, types.get(name))
            if size is None:
                self.unknown.append(f"{label}/{name}")
            sizes[name] = size or 0
        return sizes

    def _body_types(self, graph: onnx.GraphProto, key: tuple[str, ...]) -> dict[str, onnx.TypeProto]:
        """The types the body declares, with the fallback's where a declared one gives no size."""
        types = {vi.name: vi.type for vi in (*graph.value_info, *graph.input, *graph.output)}
        for name, typed in self.fallback.get(key, {}).items():
            if _type_bytes(typed) is not None and (name not in types or _type_bytes(types[name]) is None):
                types[name] = typed
        return types

    def _size(self, name: str, typed: onnx.TypeProto | None) -> int | None:
        """A body tensor's size: measured, else from its type (None: unknown)."""
        found = self.measured.get(name) if self.measured is not None else None
        if found is not None:
            return _bytes_of(found[0], found[1])
        return _type_bytes(typed) if typed is not None else None


def _body_live(graph: onnx.GraphProto, nodes: list[onnx.NodeProto], sizes: Mapping[str, int]) -> np.ndarray:
    """Bytes of the body's own tensors alive at each of its nodes."""
    last_read: dict[str, int] = {}
    for k, node in enumerate(nodes):
        for name in node_reads(node):
            if name in sizes:
                last_read[name] = k
    inputs = {i.name for i in graph.input}
    produced_at = {o: k for k, node in enumerate(nodes) for o in node.output if o}
    spans = []
    for name, size in sizes.items():
        if size:
            start = 0 if name in inputs else produced_at[name]
            spans.append((start, max(start, last_read.get(name, start)), size))
    return sweep(len(nodes), [s for s, _, _ in spans], [e for _, e, _ in spans], [b for _, _, b in spans])


def _inferred_nodes(analysis: Analysis) -> list[onnx.NodeProto]:
    """The main-graph nodes at each position, from a shape-inferred copy (body tensors typed)."""
    proto = analysis.loaded.proto
    try:
        inferred = onnx.shape_inference.infer_shapes(proto, check_type=False, strict_mode=False, data_prop=True)
        file_nodes = inferred.graph.node
        if len(file_nodes) != len(proto.graph.node):  # pragma: no cover - inference keeps the nodes
            raise ValueError("node count changed")
    except Exception as exc:  # inference is best effort, as for the main graph
        logger.warning(
            "shape inference of subgraphs failed on %s (%s); their sizes come from the file", analysis.loaded.path, exc
        )
        file_nodes = proto.graph.node
    return [file_nodes[i] for i in analysis.file_index]


def _compute_subgraph_memory(analysis: Analysis) -> SubgraphMemory:
    positions = [p for p in analysis.with_attributes() if has_subgraphs(analysis.nodes[p])]
    scratch = {p: b for p, b in analysis.scratch.items() if b > 0}
    if not positions:
        return SubgraphMemory(inner=scratch) if scratch else SubgraphMemory()
    nodes = _inferred_nodes(analysis)
    first = _BodyWalker(analysis.infos.measured)
    for p in positions:
        first.node_inner(nodes[p], analysis.node_names[p])
    # what onnx's inference left unknown inside bodies, onnxruntime's may know
    walker = _BodyWalker(analysis.infos.measured, analysis.infos.body_types() if first.unknown else None)
    inner: dict[int, int] = dict(scratch)
    bodies: dict[int, int] = {}
    held: dict[int, tuple[int, int]] = {}
    for p in positions:
        weights, count = walker.weight_bytes, walker.weight_count
        size = walker.node_inner(nodes[p], analysis.node_names[p])
        if size:
            inner[p] = inner.get(p, 0) + size
            bodies[p] = size
        if walker.weight_count > count:
            held[p] = (walker.weight_bytes - weights, walker.weight_count - count)
    return SubgraphMemory(walker.weight_count, walker.weight_bytes, inner, tuple(walker.unknown), bodies, held)


def subgraph_memory(analysis: Analysis) -> SubgraphMemory:
    """Memory inside the model's subgraphs, computed once per Analysis object."""
    return derived(analysis, "subgraphs", _compute_subgraph_memory)


def unknown_tensors(analysis: Analysis) -> list[str]:
    """Every tensor whose size is unknown, so that memory figures count it as 0 bytes: the main
    graph's (`Analysis.unknown_sizes`), then those inside If/Loop/Scan bodies (``node/branch/name``).
    inspect, simulate and plan count these same tensors."""
    return [*analysis.unknown_sizes(), *subgraph_memory(analysis).unknown]


# ------------------------------------------------------------------------------ working set


def sweep(steps: int, starts: IntArray, ends: IntArray, sizes: IntArray) -> np.ndarray:
    """Bytes alive at each of ``steps`` steps for spans (starts[i], ends[i]) of sizes[i] bytes."""
    diff = np.zeros(steps + 1, dtype=np.int64)
    if len(sizes):
        s = np.asarray(starts, dtype=np.int64)
        e = np.asarray(ends, dtype=np.int64)
        b = np.asarray(sizes, dtype=np.int64)
        np.add.at(diff, s, b)
        np.add.at(diff, e + 1, -b)
    return np.cumsum(diff[:steps])


def _resident_profile(analysis: Analysis) -> np.ndarray:
    """Bytes at each step with nothing offloaded: every tensor's `resident_spans` of its
    `tensor_bytes`, written out in one loop (a big model has hundreds of thousands)."""
    n = analysis.num_positions
    starts: list[int] = []
    ends: list[int] = []
    sizes: list[int] = []
    info_of, uses_of, producer_of = analysis.infos.get, analysis.uses.get, analysis.producer.get
    weights, outputs = analysis.weights, set(analysis.graph_outputs)
    for name in memory_tensors(analysis):
        info = info_of(name)
        b = info.bytes if info is not None else None
        if not b:
            continue
        uses = uses_of(name)
        is_output = name in outputs
        start = producer_of(name)
        if start is None and name in weights:
            if weight_is_resident(bool(uses), is_output):
                starts.append(0)
                ends.append(n)
                sizes.append(b)
            continue
        if start is None:  # a graph input
            start = 0
        s, e = buffer_span(start, uses[-1][0] if uses else start, n, to_end=is_output)
        starts.append(s)
        ends.append(e)
        sizes.append(b)
    mem = sweep(n + 1, starts, ends, sizes)
    sub = subgraph_memory(analysis)
    mem += sub.weight_bytes
    for p, extra in sub.inner.items():
        mem[p] += extra
    mem.flags.writeable = False
    return mem


def profile(
    analysis: Analysis,
    plan: Plan | None = None,
    *,
    prefetch_distance: int,
    release_distance: int = 0,
) -> np.ndarray:
    """Device bytes at each step 0..n under ``plan`` (None: nothing offloaded), as a new array.

    Positions a later stage fills in (``h2d_before``, ``release_after``) are placed as that stage
    would with ``prefetch_distance`` (or each offload's own) and ``release_distance``.
    """
    resident = derived(analysis, "resident profile", _resident_profile)
    if not plan or not plan["offloads"]:
        return resident.copy()
    n = analysis.num_positions
    starts: list[int] = []
    ends: list[int] = []
    sizes: list[int] = []
    for off in plan["offloads"]:
        b = tensor_bytes(analysis, off["tensor"])
        if not b:
            continue
        for spans, sign in (
            (resident_spans(analysis, off["tensor"]), -b),
            (entry_spans(off, n, prefetch_distance=prefetch_distance, release_distance=release_distance), b),
        ):
            for s, e in spans:
                starts.append(s)
                ends.append(e)
                sizes.append(sign)
    return resident + sweep(n + 1, starts, ends, sizes)


def peak_of(values: np.ndarray) -> tuple[int, int]:
    """(largest value, first step where it occurs)."""
    pos = int(np.argmax(values))
    return int(values[pos]), pos


def step_bound(
    steps: int,
    positions: IntArray,
    tensors: IntArray,
    sizes: Sequence[int],
    graph_input: Sequence[bool],
    graph_output: Sequence[bool],
    inner: dict[int, int] | None = None,
    always: int = 0,
) -> tuple[int, int | None]:
    """The lower bound over steps described by integer tensor ids (shared by the simulator and
    :func:`lower_bound`).

    Args:
        steps: number of node steps.
        positions, tensors: pairs (step, tensor id): the step reads or writes the tensor (a pair
            may repeat).
        sizes: bytes of each tensor id.
        graph_input: per tensor id, whether it is a graph input. Inputs are never offloaded: each
            one is on the device from the start to its last read, so it counts in every step up
            to there, read by the step or not.
        graph_output: per tensor id, whether it is a graph output: all of them are on the device
            at the end of the run, one more step.
        inner: step -> memory inside its subgraphs.
        always: bytes resident at every step that no plan can move (subgraph weights).
    """
    size = np.asarray(sizes, dtype=np.int64)
    end_bytes = int(size[np.asarray(graph_output, dtype=bool)].sum()) if len(size) else 0
    if not steps:
        return (end_bytes + always, 0) if end_bytes else (0, None)
    values = np.full(steps, always, dtype=np.int64)
    if len(positions):
        pos = np.asarray(positions, dtype=np.int64)
        tid = np.asarray(tensors, dtype=np.int64)
        is_input = np.asarray(graph_input, dtype=bool)[tid]
        if is_input.any():
            last = np.full(len(size), -1, dtype=np.int64)
            np.maximum.at(last, tid[is_input], pos[is_input])
            read = np.flatnonzero(last >= 0)
            values += sweep(steps, np.zeros(len(read), dtype=np.int64), last[read], size[read])
            pos, tid = pos[~is_input], tid[~is_input]
        if len(pos):
            width = int(tid.max()) + 1
            pairs = np.unique(pos * width + tid)
            values += np.bincount(pairs // width, weights=size[pairs % width], minlength=steps).astype(np.int64)
    for p, extra in (inner or {}).items():
        values[p] += extra
    at = int(np.argmax(values))
    best = int(values[at])
    if end_bytes + always > best:  # the end of the run, as one more step
        return end_bytes + always, steps
    return best, at


def _lower_bound(analysis: Analysis) -> tuple[int, int | None]:
    """`lower_bound` from the analysis's uses and producers: tensor ids in one dict, the (step,
    tensor) pairs as arrays (a big model has hundreds of thousands of each)."""
    names = dict.fromkeys(analysis.uses)  # tensors read first, in this order: their ids are 0, 1, ...
    read_counts = [len(uses) for uses in analysis.uses.values()]
    made = [(name, p) for name, p in analysis.producer.items() if name]  # every node output
    names.update(dict.fromkeys(name for name, _ in made))
    names.update(dict.fromkeys(analysis.graph_outputs))
    ids = {name: t for t, name in enumerate(names)}
    sizes = [tensor_bytes(analysis, name) for name in ids]
    positions = np.fromiter(
        itertools.chain((u[0] for uses in analysis.uses.values() for u in uses), (p for _, p in made)), dtype=np.int64
    )
    tensors = np.concatenate(
        [
            np.repeat(np.arange(len(read_counts), dtype=np.int64), read_counts),
            np.fromiter((ids[name] for name, _ in made), dtype=np.int64, count=len(made)),
        ]
    )
    graph_input = [False] * len(sizes)
    for name in analysis.graph_inputs:
        if name in ids:
            graph_input[ids[name]] = True
    graph_output = [False] * len(sizes)
    for name in analysis.graph_outputs:
        graph_output[ids[name]] = True
    sub = subgraph_memory(analysis)
    return step_bound(
        analysis.num_positions, positions, tensors, sizes, graph_input, graph_output, sub.inner, sub.weight_bytes
    )


def lower_bound(analysis: Analysis) -> tuple[int, int | None]:
    """The largest single-step working set: (bytes, position); position n is the end of the run.

    None as position for a model without nodes or outputs.
    """
    return derived(analysis, "lower bound", _lower_bound)


class WorkingSet:
    """Bytes alive at each step, kept incrementally: add or remove a span, ask for the peak.

    Steps are cut into blocks of about sqrt(steps); a span's whole blocks take a lazy addition, its
    partial blocks are updated in place. Every operation costs O(sqrt(steps)) numpy work.
    """

    _FLOOR = -(1 << 62)  # padding past the last step: never the maximum

    def __init__(self, values: np.ndarray, *, block: int | None = None) -> None:
        values = np.asarray(values, dtype=np.int64)
        self.size = len(values)
        k = block or max(16, math.isqrt(max(self.size, 1)))
        blocks = max(1, -(-self.size // k))
        padded = np.full(blocks * k, self._FLOOR, dtype=np.int64)
        padded[: self.size] = values
        self._k = k
        self._v = padded.reshape(blocks, k)
        self._lazy = np.zeros(blocks, dtype=np.int64)
        self._bmax = self._v.max(axis=1)

    def add(self, first: int, last: int, delta: int) -> None:
        """Add ``delta`` bytes at steps first..last (inclusive); nothing when last < first."""
        if last < first or not delta:
            return
        k = self._k
        bf, bl = first // k, last // k
        if bf == bl:
            self._v[bf, first % k : last % k + 1] += delta
            self._bmax[bf] = self._v[bf].max()
            return
        self._v[bf, first % k :] += delta
        self._bmax[bf] = self._v[bf].max()
        self._v[bl, : last % k + 1] += delta
        self._bmax[bl] = self._v[bl].max()
        if bl > bf + 1:
            self._lazy[bf + 1 : bl] += delta

    def add_many(self, firsts: Sequence[int], lasts: Sequence[int], deltas: Sequence[int]) -> None:
        """Add deltas[i] bytes at steps firsts[i]..lasts[i] for every i (empty ranges ignored)."""
        if len(deltas) <= len(self._lazy):
            for first, last, delta in zip(firsts, lasts, deltas):
                self.add(int(first), int(last), int(delta))
            return
        f = np.asarray(firsts, dtype=np.int64)
        l = np.asarray(lasts, dtype=np.int64)  # noqa: E741
        keep = f <= l
        values = self.values() + sweep(self.size, f[keep], l[keep], np.asarray(deltas, dtype=np.int64)[keep])
        self._v.ravel()[: self.size] = values
        self._lazy[:] = 0
        self._bmax = self._v.max(axis=1)

    def peak(self) -> tuple[int, int]:
        """(largest value, first step where it occurs)."""
        totals = self._bmax + self._lazy
        b = int(np.argmax(totals))
        i = int(np.argmax(self._v[b]))
        return int(totals[b]), b * self._k + i

    def max(self, first: int, last: int) -> int:
        """Largest value over steps first..last (inclusive, last >= first)."""
        k = self._k
        bf, bl = first // k, last // k
        if bf == bl:
            return int(self._v[bf, first % k : last % k + 1].max() + self._lazy[bf])
        best = max(
            int(self._v[bf, first % k :].max() + self._lazy[bf]),
            int(self._v[bl, : last % k + 1].max() + self._lazy[bl]),
        )
        if bl > bf + 1:
            best = max(best, int((self._bmax[bf + 1 : bl] + self._lazy[bf + 1 : bl]).max()))
        return best

    def window(self, first: int, last: int) -> np.ndarray:
        """Values at steps first..last (inclusive), as a new array."""
        if last < first:
            return np.zeros(0, dtype=np.int64)
        k = self._k
        bf, bl = first // k, last // k
        rows = self._v[bf : bl + 1] + self._lazy[bf : bl + 1, None]
        return rows.ravel()[first - bf * k : last - bf * k + 1]

    def values(self) -> np.ndarray:
        """Every step's value, as a new array."""
        return (self._v + self._lazy[:, None]).ravel()[: self.size]
