"""What onnxruntime's CPU arena holds for one run of a fresh session: its allocation planner and its
BFC arena, replayed (the figure `simulate` reports as ``cpu_peak_bytes``).

This is the peak of everything a session allocates when device and host are one memory, as on the
CPU provider: weights as onnxruntime places them, activations, graph outputs, host copies and kernel
scratch. It is what ``AllocatorGetStats`` reports as ``MaxInUse`` (`offloadctl.running.allocator`).
The device peaks of `offloadctl.simulation.memory` keep their meaning (bytes on the device, no
arena); this figure explains where onnxruntime's own figure differs from them:

* **Weights** (``SaveInitializedTensors``). Every initializer and Constant-node tensor of non-zero
  size is placed in one ``Reserve`` of the sum of their sizes, each rounded up to 256 bytes; a
  tensor of at most 127 bytes stored in the model file is reserved a second time on its own, at
  its exact size.
* **The allocation planner** (``allocation_planner.cc``, one stream, no parallel execution). Use
  counts: +1 per graph input, initializer, graph output, node input, subgraph read and node output.
  For each node in order and each of its outputs:

  - a graph output gets its own buffer, held to the end (``kAllocateOutput``);
  - an output that must alias an input (Reshape, Squeeze, Unsqueeze, Flatten, Identity,
    ExpandDims, Optional, OptionalGetElement, BatchNormalization's running statistics) shares it;
  - an output that may overwrite an input (the elementwise activations, Clip, Softmax, LogSoftmax,
    Cast, Shrink, Trilu, Scatter, ScatterElements) shares it when that input is used for the last
    time and has the same size in the graph's declared shapes;
  - an output that some node reads takes a freed buffer of the same element size and declared
    shape (the most recently freed first; never a scalar);
  - any other output is allocated.

  Then each input (and subgraph read, and output) gives back one use; a buffer at zero uses is
  freed for reuse. At run time a buffer is released after the last node that reads any value
  sharing it; one nobody reads is held to the end.
* **Kernel scratch**: bytes a kernel allocates while it runs and frees before it returns (Conv's
  unfolded input, say), as a measured profile records them per node.
* **The arena** (`offloadctl.simulation.arena`): 256-byte rounding, best fit, splitting and
  regions; ``MaxInUse`` counts the chunks handed out.

Feeds are the caller's memory and do not count. Shapes "the same in the graph's declared shapes"
are onnx's inferred shapes of the model as written (symbolic dimensions compare by name), which
is what the planner sees (a dimension onnx names ``unk__N`` is one onnxruntime leaves unnamed, and
unnamed dimensions never match); sizes at run time are the analysis's. Not modelled: prepacked weights
(off at ``--opt-level disable``), the memory-pattern buffer of a second run, subgraph frames other
than as one block while their node runs.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

import onnx

from offloadctl.analysis.graph import Analysis
from offloadctl.analysis.timeline import subgraph_memory
from offloadctl.core.onnxutil import ONNX_DOMAINS, inferred_copy, subgraph_outer_names
from offloadctl.simulation.arena import Arena, ArenaConfig

__all__ = [
    "MODELLED_RELEASE",
    "installed_onnxruntime",
    "replica_refusal",
    "CpuPeak",
    "cpu_peak",
    "declared_shapes",
    "ALIAS_OPS",
    "INPLACE_OPS",
]

#: The onnxruntime whose CPU arena this replays (onnxruntime-cann 1.24.4, what `make install` puts in):
#: checked against its allocator statistics (bench/bench_memory.py). onnxruntime 1.32 keeps weights
#: outside the arena (a GPT-2 measured 5.28 MB where this gives 32.65 MiB), so a figure for another
#: release would be wrong: `replica_refusal` says so instead.
MODELLED_RELEASE = "1.24"


def installed_onnxruntime() -> str | None:
    """The version of the onnxruntime package installed here (any build), or None."""
    from importlib import metadata

    for name in ("onnxruntime-cann", "onnxruntime", "onnxruntime-gpu", "onnxruntime-openvino"):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def replica_refusal(version: str | None = None) -> str | None:
    """Why no CPU arena figure is given for the onnxruntime installed here (``version``; looked up
    when None), or None when the replica models it (or none is installed: the figure then names the
    release it models)."""
    version = installed_onnxruntime() if version is None else version
    if version is None or ".".join(version.split(".")[:2]) == MODELLED_RELEASE:
        return None
    return (
        f"the CPU arena replica models onnxruntime {MODELLED_RELEASE}, and onnxruntime {version} is installed "
        "(it places weights otherwise): install onnxruntime-cann 1.24.4 (pip install 'offloadctl[cann]') "
        "for this figure"
    )


logger = logging.getLogger(__name__)

#: op -> (input, output) pairs whose output is the input's buffer (kernel ``Alias``).
ALIAS_OPS: dict[tuple[str, str], tuple[tuple[int, int], ...]] = {
    ("", "Reshape"): ((0, 0),),
    ("", "Squeeze"): ((0, 0),),
    ("", "Unsqueeze"): ((0, 0),),
    ("", "Flatten"): ((0, 0),),
    ("", "Identity"): ((0, 0),),
    ("", "Optional"): ((0, 0),),
    ("", "OptionalGetElement"): ((0, 0),),
    ("", "BatchNormalization"): ((3, 1), (4, 2)),
    ("com.microsoft", "ExpandDims"): ((0, 0),),
}

#: op -> (input, output) pairs whose output may overwrite the input (kernel ``MayInplace``).
INPLACE_OPS: dict[tuple[str, str], tuple[tuple[int, int], ...]] = {
    **{
        ("", op): ((0, 0),)
        for op in (
            "Elu",
            "HardSigmoid",
            "LeakyRelu",
            "Relu",
            "Selu",
            "Sigmoid",
            "Softplus",
            "Softsign",
            "Tanh",
            "Celu",
            "ThresholdedRelu",
            "Clip",
            "Softmax",
            "LogSoftmax",
            "Cast",
            "Shrink",
            "Trilu",
            "Scatter",
            "ScatterElements",
        )
    },
    **{("com.microsoft", op): ((0, 0),) for op in ("ParametricSoftplus", "ScaledTanh", "ThresholdedRelu")},
    ("com.microsoft", "FusedConv"): ((3, 0),),
    ("com.microsoft", "NchwcConv"): ((3, 0),),
}

#: Types Softmax and LogSoftmax overwrite in place (float only), and Relu.
_INPLACE_TYPES: dict[str, frozenset[int]] = {
    "Softmax": frozenset({onnx.TensorProto.FLOAT}),
    "LogSoftmax": frozenset({onnx.TensorProto.FLOAT}),
}

_SMALL_WEIGHT = 127  # bytes; onnxruntime's kSmallTensorExternalDataThreshold
_WEIGHT_ALIGN = 256

Shape = tuple[int | str | None, ...]


@dataclass(frozen=True)
class CpuPeak:
    """The CPU arena's figures for one run (`cpu_peak`)."""

    peak_bytes: int  # MaxInUse: weights and the largest set of chunks in use at once
    arena_bytes: int  # TotalAllocated: regions the arena took from the system, and the weights
    weight_bytes: int  # in use once the session is made (Reserve)
    peak_node: str | None  # the node running at the peak (None: weights alone)
    scratch_bytes: int  # the largest kernel scratch counted at one node
    unknown_tensors: int  # activations of unknown size, counted as 0 bytes
    allocations: int

    @property
    def activation_bytes(self) -> int:
        return self.peak_bytes - self.weight_bytes

    def to_json(self) -> dict[str, object]:
        return {
            "peak_bytes": self.peak_bytes,
            "arena_bytes": self.arena_bytes,
            "weight_bytes": self.weight_bytes,
            "activation_bytes": self.activation_bytes,
            "peak_node": self.peak_node,
            "scratch_bytes": self.scratch_bytes,
            "unknown_tensors": self.unknown_tensors,
            "allocations": self.allocations,
        }


def declared_shapes(proto: onnx.ModelProto) -> dict[str, tuple[int, Shape | None]]:
    """(element type, shape) of every value as the allocation planner sees it: onnx's inference of
    the model as written; a dimension is its value, its name, or None.

    Without onnx's data propagation: onnxruntime's passes on only shape values it knows as numbers,
    so a Reshape to a shape computed from symbolic dimensions has unknown dimensions there, and
    with onnx's propagation the planner would be credited with reuse it does not find. (A shape
    computed from numbers alone, as ConstantOfShape of the Shape of a static tensor, is known to
    onnxruntime and not here: a few small tensors, at most 256 bytes each.)"""
    graph = inferred_copy(proto).graph
    found: dict[str, tuple[int, Shape | None]] = {}
    for vi in [*graph.input, *graph.value_info, *graph.output]:
        tt = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
        if tt is None:
            continue
        shape: Shape | None = None
        if tt.HasField("shape"):
            shape = tuple(d.dim_value if d.HasField("dim_value") else _named(d.dim_param) for d in tt.shape.dim)
        found[vi.name] = (tt.elem_type, shape)
    for init in graph.initializer:
        found[init.name] = (init.data_type, tuple(init.dims))
    return found


def _named(param: str) -> str | None:
    """A symbolic dimension as onnxruntime's graph has it: onnx's inference names the dimensions it
    cannot relate to any other ``unk__N``; onnxruntime leaves them unnamed, and unnamed never match."""
    return None if not param or param.startswith("unk__") else param


def _same_shape(a: Shape | None, b: Shape | None) -> bool:
    if a is None or b is None or len(a) != len(b):
        return False
    return all(x is not None and x == y for x, y in zip(a, b))


_ITEMSIZE: dict[int, int] = {}


def _itemsize(elem_type: int) -> int:
    if elem_type not in _ITEMSIZE:
        try:
            _ITEMSIZE[elem_type] = onnx.helper.tensor_dtype_to_np_dtype(elem_type).itemsize
        except (KeyError, TypeError, ValueError):
            _ITEMSIZE[elem_type] = 0
    return _ITEMSIZE[elem_type]


class _Planner:
    """onnxruntime's single-stream reuse plan over the analysis's order."""

    def __init__(self, analysis: Analysis, shapes: Mapping[str, tuple[int, Shape | None]]) -> None:
        self.analysis = analysis
        self.shapes = shapes
        self.nodes = analysis.nodes
        self.implicit = [sorted(subgraph_outer_names(n)) if n.attribute else [] for n in self.nodes]
        self.graph_outputs = set(analysis.graph_outputs)
        self.count: dict[str, int] = {}
        self.buffer: dict[str, str] = {}
        self.kind: dict[str, str] = {}  # "allocate", "output", "reuse", "nontensor"
        self.freelist: list[str] = []  # most recently freed last
        self.consumed: set[str] = set()

    def _same_size(self, a: str, b: str) -> bool:
        sa, sb = self.shapes.get(a), self.shapes.get(b)
        if sa is None or sb is None:
            return False
        if sa[0] == onnx.TensorProto.STRING or sb[0] == onnx.TensorProto.STRING:
            return False
        return _itemsize(sa[0]) == _itemsize(sb[0]) and _same_shape(sa[1], sb[1])

    def _use(self, name: str, n: int = 1) -> None:
        self.count[name] = self.count.get(name, 0) + n

    def plan(self) -> None:
        self._count_uses()
        for node, implicit in zip(self.nodes, self.implicit):
            for k, out in enumerate(node.output):
                if out:
                    self._plan_output(node, k, out)
            for name in [*[i for i in node.input if i], *implicit, *[o for o in node.output if o]]:
                self._release(name)

    def _count_uses(self) -> None:
        """Use counts: one per graph input, weight, graph output, node input, subgraph read and node output."""
        a = self.analysis
        for name in [*a.graph_inputs, *a.weights, *a.graph_outputs]:
            self._use(name)
        for node, implicit in zip(self.nodes, self.implicit):
            for name in [*filter(None, node.input), *implicit]:
                self._use(name)
                self.consumed.add(name)
            for name in filter(None, node.output):
                self._use(name)

    def root(self, name: str) -> str:
        return self.buffer.get(name, name)

    def _release(self, name: str) -> None:
        root = self.root(name)
        self.count[root] -= 1
        if self.count[root] == 0:
            self.freelist.append(root)

    def _reuse(self, reused: str, out: str) -> None:
        root = self.root(reused)
        self.buffer[out] = root
        self.count[root] += self.count.get(out, 0)
        self.kind[out] = "reuse"

    def _plan_output(self, node: onnx.NodeProto, k: int, out: str) -> None:
        if out in self.graph_outputs:
            self.kind[out] = "output"
            return
        key = (node.domain if node.domain not in ONNX_DOMAINS else "", node.op_type)
        for i, o in ALIAS_OPS.get(key, ()):
            if o == k and i < len(node.input) and node.input[i]:
                self._reuse(node.input[i], out)
                return
        for i, o in INPLACE_OPS.get(key, ()):
            if o == k and i < len(node.input) and self._overwritable(node, node.input[i], out):
                self._reuse(node.input[i], out)
                return
        info = self.analysis.infos.get(out)
        if info is not None and info.type_kind is not None:
            self.kind[out] = "nontensor"
            return
        if out in self.consumed and self._from_freelist(out):
            return
        self.kind[out] = "allocate"

    def _overwritable(self, node: onnx.NodeProto, name: str, out: str) -> bool:
        """Whether ``out`` may overwrite input ``name`` (``MayInplace``): its last use, of a type the kernel
        overwrites, and the same declared size."""
        if not name:
            return False
        types = _INPLACE_TYPES.get(node.op_type)
        if types is not None and self.shapes.get(name, (0, None))[0] not in types:
            return False
        return self.count.get(self.root(name)) == 1 and self._same_size(name, out)

    def _from_freelist(self, out: str) -> bool:
        want = self.shapes.get(out)
        if want is None or want[1] is None or len(want[1]) == 0:
            return False
        for k in range(len(self.freelist) - 1, -1, -1):
            cand = self.freelist[k]
            if self._same_size(cand, out):
                del self.freelist[k]
                self._reuse(cand, out)
                return True
        return False


def _weight_bytes(analysis: Analysis, read: set[str]) -> tuple[int, list[int]]:
    """(the one Reserve holding every weight some node reads, the small weights reserved again on
    their own); onnxruntime drops weights nobody reads."""
    external = {t.name for t in analysis.loaded.proto.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL}
    sizes = []
    small = []
    keep = read | set(analysis.graph_outputs)
    for name in sorted(analysis.weights & keep):
        info = analysis.infos.get(name)
        if info is not None and info.bytes:
            sizes.append(info.bytes)
            if info.bytes <= _SMALL_WEIGHT and name not in external:
                small.append(info.bytes)
    block = sum(-(-s // _WEIGHT_ALIGN) * _WEIGHT_ALIGN for s in sizes)
    return block, small


def cpu_peak(
    analysis: Analysis,
    *,
    shapes: Mapping[str, tuple[int, Shape | None]] | None = None,
    config: ArenaConfig | None = None,
) -> CpuPeak:
    """Replay one run of a fresh CPU session over ``analysis`` (in its execution order). The kernel
    scratch counted is the analysis's (`offloadctl.simulation.timing.scratched`).

    Args:
        analysis: the model as it will run (a rewritten model for a plan's "after").
        shapes: `declared_shapes` of the model as written (computed from the analysis's proto
            when not given; pass those of the unpinned file for a model analysed with pins).
        config: the arena's settings (onnxruntime's defaults).
    """
    if shapes is None:
        shapes = declared_shapes(analysis.loaded.proto)
    planner = _Planner(analysis, shapes)
    planner.plan()
    return replay(analysis, planner, range(len(planner.nodes)), config)


class ReusePlan(Protocol):
    """An allocation planner's decisions, as `replay` reads them."""

    @property
    def kind(self) -> Mapping[str, str]:
        """node output -> "allocate", "output" (a graph output, held to the end), "reuse" or "nontensor"."""

    @property
    def consumed(self) -> set[str]:
        """Every value some node reads (onnxruntime drops weights nobody reads)."""

    def root(self, name: str) -> str:
        """The value whose buffer ``name`` is (itself unless it shares another's)."""


def _frees(plan: ReusePlan, reads: list[list[str]]) -> list[list[str]]:
    """For each step (``reads``: what its node reads), the buffers freed after it: those whose last
    reader, of any value sharing them, it is."""
    last_reader: dict[str, int] = {}
    for step, names in enumerate(reads):
        for name in names:
            if name:
                root = plan.root(name)
                if plan.kind.get(root) == "allocate":
                    last_reader[root] = step
    frees: list[list[str]] = [[] for _ in reads]
    for root, step in last_reader.items():
        frees[step].append(root)
    return frees


def replay(analysis: Analysis, plan: ReusePlan, ran: Iterable[int], config: ArenaConfig | None = None) -> CpuPeak:
    """The arena through one run of ``plan`` with the nodes run in the order ``ran`` (positions of
    ``analysis``): each allocated output is allocated when its node runs, each buffer freed after
    the last node to read any value that shares it has run; one nobody reads is held to the end."""
    nodes = analysis.nodes
    ran = list(ran)
    implicit = [sorted(subgraph_outer_names(n)) if n.attribute else [] for n in nodes]
    arena = Arena(config)
    block, small = _weight_bytes(analysis, plan.consumed)
    arena.reserve(block)
    for s in small:
        arena.reserve(s)
    weights = arena.in_use
    frees = _frees(plan, [[*nodes[pos].input, *implicit[pos]] for pos in ran])
    inner = subgraph_memory(analysis)
    chunks: dict[str, object] = {}
    unknown = 0
    top_scratch = 0
    peak_pos: int | None = None
    peak = arena.max_in_use
    for step, pos in enumerate(ran):
        for out in nodes[pos].output:
            if out and plan.kind.get(out) in ("allocate", "output"):
                info = analysis.infos.get(out)
                size = info.bytes if info is not None else None
                if size is None:
                    unknown += 1
                    size = 0
                chunks[out] = arena.alloc(size)
        temp = inner.at(pos)  # the node's scratch and its bodies' working set
        top_scratch = max(top_scratch, analysis.scratch.get(pos, 0))
        if temp:
            arena.free(arena.alloc(temp))
        if arena.max_in_use > peak:
            peak, peak_pos = arena.max_in_use, pos
        for root in frees[step]:
            arena.free(chunks.pop(root, None))  # type: ignore[arg-type]
    return CpuPeak(
        peak_bytes=arena.max_in_use,
        arena_bytes=arena.region_bytes + arena.reserved,
        weight_bytes=weights,
        peak_node=None if peak_pos is None else analysis.node_names[peak_pos],
        scratch_bytes=top_scratch,
        unknown_tensors=unknown,
        allocations=arena.allocations,
    )
