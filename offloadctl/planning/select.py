"""The select stage: which tensors sit idle long enough to offload (HyperOffload "distance").

For every activation, positions = [producer] + [each use] in execution order. Each gap between
consecutive entries larger than ``select_distance`` opens a reload group holding the use after the
gap and the uses that follow up to the next such gap. Uses before the first such gap keep reading
the device tensor. A weight (initializer or Constant node) stays on the host and is read through
one host-to-device copy per reload group; the first group starts at its first use, and it is
selected when it sits idle for more than ``select_distance`` positions before its first use, after
its last use, or between two uses. Every tensor not selected is listed with its reason.

Every reason is one `Rule` of `RULES`, stated once: its check gives one tensor's verdict (the first
rule that applies wins), and its screen marks, over all candidates at once, every tensor the check
could reject. The pass over a big model (`_Selector.consider_all`) chooses what no screen marks and
sends every other tensor through the checks, so a new reason is a new rule, screen and check together.
"""

from __future__ import annotations

import fnmatch
import itertools
import logging
import operator
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import onnx
from onnx import TensorProto

from offloadctl._version import __version__
from offloadctl.analysis.graph import Analysis, Use, derived
from offloadctl.contract.document import SCHEMA_VERSION
from offloadctl.core.bulk import paused_gc
from offloadctl.core.onnxutil import iter_graphs, subgraphs
from offloadctl.core.plantypes import (
    Kind,
    ModelInfo,
    Offload,
    Plan,
    Rejection,
    RejectionReason,
    ReloadGroup,
    offload,
    rejection,
    reload_group,
)
from offloadctl.core.plantypes import Use as PlanUse
from offloadctl.loading.tensors import TensorInfo
from offloadctl.planning.request import SelectPart, recorded, taking

__all__ = [
    "Chosen",
    "Selection",
    "select",
    "selected_plan",
    "selection_for",
    "split_reload_groups",
]

logger = logging.getLogger(__name__)

# Inputs that onnxruntime's kernels read from host memory (shapes, axes, indices of shape ops).
# Tensors read there are small and already host-side on every execution provider: copying them to
# the device would only add a copy back. (op type -> input indices)
HOST_INPUTS: dict[str, frozenset[int]] = {
    op: frozenset(idx)
    for op, idx in {
        "Reshape": (1,),
        "Expand": (1,),
        "Tile": (1,),
        "Slice": (1, 2, 3, 4),
        "Resize": (1, 2, 3),
        "Upsample": (1,),
        "ConstantOfShape": (0,),
        "Range": (0, 1, 2),
        "TopK": (1,),
        "Pad": (1, 2, 3),
        "Unsqueeze": (1,),
        "Squeeze": (1,),
        "Split": (1,),
        "OneHot": (1,),
        "CumSum": (1,),
        "ReduceSum": (1,),
        "ReduceMean": (1,),
        "ReduceMax": (1,),
        "ReduceMin": (1,),
        "ReduceProd": (1,),
        "ReduceL1": (1,),
        "ReduceL2": (1,),
        "ReduceLogSum": (1,),
        "ReduceLogSumExp": (1,),
        "ReduceSumSquare": (1,),
        "NonMaxSuppression": (2, 3, 4),
        # min and max: CUDA and WebGPU read them in host memory (a copied-in bound made PP-OCR's
        # rewrite define the H2D's output twice on WebGPU)
        "Clip": (1, 2),
        "Trilu": (1,),
        # com.microsoft: seqlens_k and total_sequence_length (the genai builder's Casts of the mask's
        # sums and width). On WebGPU a copy of the first failed to run (a host-to-host MemcpyToHost),
        # of the second made onnxruntime define the H2D's output twice
        "GroupQueryAttention": (5, 6),
    }.items()
}


def split_reload_groups(
    start: int, uses: list[Use], select_distance: int, *, first_group_at_start: bool = False
) -> tuple[list[Use], list[tuple[int, list[Use]]]]:
    """Split ``uses`` (sorted) by gaps larger than ``select_distance``.

    Args:
        start: position of the producer (activations) or of the run's start (weights: 0).
        uses: the tensor's uses in execution order.
        select_distance: a gap must be strictly larger to open a reload group.
        first_group_at_start: weights: the first use always opens a group.

    Returns:
        (device_uses, groups): the uses before the first qualifying gap, and each reload group as
        (gap before it, its uses).
    """
    device: list[Use] = []
    groups: list[tuple[int, list[Use]]] = []
    prev = start
    for k, use in enumerate(uses):
        gap = use.position - prev
        if (first_group_at_start and k == 0) or gap > select_distance:
            groups.append((gap, [use]))
        elif groups:
            groups[-1][1].append(use)
        else:
            device.append(use)
        prev = use.position
    return device, groups


#: Kernels whose weights onnxruntime packs into their own layout when the session is made, and the
#: inputs it packs. A weight that arrives through MemcpyFromHost is not constant and is not packed:
#: the kernel takes another path. For MatMulNBits that path changed the logits of an int4 builder
#: model at ORT_ENABLE_ALL (by 0.0039 on the tiny sample, 0.246 on a 1B model) and ran a 128-token
#: prefill 3.3x slower on the 1B; the quantized kernels below pack their weights the same way.
#: (fp32 MatMul/Gemm/Conv weights are packed too, but their unpacked path gives the same results
#: within allclose at a similar speed: they are offloaded.)
PREPACKED_WEIGHTS: dict[tuple[str, str], frozenset[int]] = {
    ("com.microsoft", "MatMulNBits"): frozenset({1, 2, 3}),
    ("com.microsoft", "QAttention"): frozenset({1}),
    ("com.microsoft", "DynamicQuantizeMatMul"): frozenset({1}),
    ("com.microsoft", "MatMulIntegerToFloat"): frozenset({1}),
    ("com.microsoft", "DynamicQuantizeLSTM"): frozenset({1, 2}),
    ("", "QLinearMatMul"): frozenset({3}),
    ("", "QLinearConv"): frozenset({3}),
    ("", "MatMulInteger"): frozenset({1}),
}


def _packing_nodes(analysis: Analysis) -> dict[int, frozenset[int]]:
    """Position -> the inputs its node packs (`PREPACKED_WEIGHTS`), for the nodes that pack any."""
    ops = {op for _, op in PREPACKED_WEIGHTS}
    found = {}
    for p, node in enumerate(analysis.nodes):
        if node.op_type in ops:
            domain = "" if node.domain in ("", "ai.onnx") else node.domain
            packed = PREPACKED_WEIGHTS.get((domain, node.op_type))
            if packed is not None:
                found[p] = packed
    return found


def _prepacked_use(analysis: Analysis, uses: list[Use], packing: dict[int, frozenset[int]]) -> str | None:
    """Why a weight should stay resident: a kernel packs it (``packing``: `_packing_nodes`); None otherwise."""
    for use in uses:
        packed = packing.get(use[0])
        if packed is not None and use.input_index in packed:
            node = analysis.nodes[use.position]
            return (
                f"input {use.input_index} of {node.op_type} {use.node!r}, which onnxruntime packs when the session is "
                "made; copied in, it is not packed and the kernel takes another path (other results, slower)"
                + _FORCE_ADVICE
            )
    return None


def _reads_on_host(
    analysis: Analysis, use: Use, name: str | None = None, cache: dict[int, frozenset[str]] | None = None
) -> bool:
    """True when ``use`` reads at an input onnxruntime keeps in host memory.

    A read inside a subgraph (``input_index`` None) counts when the body reads ``name`` at such an
    input (an If branch's Unsqueeze axes, a Loop body's Reshape shape).
    """
    node = analysis.nodes[use.position]
    if use.input_index is not None:
        return use.input_index in HOST_INPUTS.get(node.op_type, frozenset())
    if name is None or cache is None:
        return False
    reads = cache.get(use.position)
    if reads is None:
        reads = cache[use.position] = _subgraph_host_reads(node)
    return name in reads


def _subgraph_host_reads(node: onnx.NodeProto) -> frozenset[str]:
    """Names a node's subgraphs (at any depth) read at inputs onnxruntime keeps in host memory."""
    found: set[str] = set()
    for body in subgraphs(node):
        for graph in iter_graphs(body):
            for inner in graph.node:
                for k in HOST_INPUTS.get(inner.op_type, ()):
                    if k < len(inner.input) and inner.input[k]:
                        found.add(inner.input[k])
    return frozenset(found)


#: Reasons a tensor is where the device provider cannot use a copy of it: onnxruntime keeps it in host
#: memory, so a copy from the host is copied straight back (or, on WebGPU, the rewrite does not load)
_HOST_REASONS = frozenset({"host-input", "host-resident"})

#: How a rejection's detail ends where --force would override it (left out of the warning for a forced one)
_FORCE_ADVICE = "; --force it to offload it anyway"

# Element types of shape arithmetic (Shape's output, Gather/Concat/Unsqueeze of dimensions).
_SHAPE_TYPES = frozenset({TensorProto.INT64, TensorProto.INT32})
#: Integer and bool tensors at most this large are not offloaded: index, mask and shape arithmetic
#: (token type ids, sequence lengths), kept on the host by providers without kernels for them.
SMALL_INDEX_BYTES = 4096
_INDEX_TYPES = frozenset(
    {
        TensorProto.INT64,
        TensorProto.INT32,
        TensorProto.INT16,
        TensorProto.INT8,
        TensorProto.UINT64,
        TensorProto.UINT32,
        TensorProto.UINT16,
        TensorProto.UINT8,
        TensorProto.BOOL,
    }
)


def _shape_feeders(analysis: Analysis, cache: dict[int, frozenset[str]]) -> dict[str, Use]:
    """Integer tensors that only feed shape computations, each with one host read it ends in.

    An integer tensor whose every read is by a node all of whose outputs end, directly or through
    more such nodes, at inputs onnxruntime keeps in host memory (a Concat of dimensions that becomes
    an Expand's shape, a Gather index on a Shape output). onnxruntime places these small shape
    computations on the host; copying their inputs to the device only adds copies back and hides
    the shape values from shape inference. Computed in reverse execution order, so a node's outputs
    are decided before its inputs.
    """
    outputs = set(analysis.graph_outputs)
    ends: dict[str, Use] = {}  # tensor -> a host read it (eventually) feeds

    def end_of(name: str) -> Use | None:
        if name in outputs:
            return None
        info = analysis.infos.get(name)
        if info is None or info.elem_type not in _SHAPE_TYPES:
            return None
        uses = analysis.uses.get(name)
        if not uses:
            return None
        found: Use | None = None
        for use in uses:
            if _reads_on_host(analysis, use, name, cache):
                found = found or use
                continue
            if use.input_index is None:
                return None
            node_outputs = [o for o in analysis.nodes[use.position].output if o]
            if not node_outputs or any(o not in ends for o in node_outputs):
                return None
            found = found or ends[node_outputs[0]]
        return found

    for position in range(analysis.num_positions - 1, -1, -1):
        for name in analysis.nodes[position].output:
            if name:
                end = end_of(name)
                if end is not None:
                    ends[name] = end
    for name in analysis.weights:
        end = end_of(name)
        if end is not None:
            ends[name] = end
    return ends


def _matches(name: str, patterns: Iterable[str]) -> bool:
    if not patterns:  # the usual case, for every tensor of a big graph
        return False
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def _sort_key(use: Use) -> tuple[int, int]:
    """`Use.sort_key`, without the property call (once per candidate of a big graph)."""
    index = use[1]
    return (use[0], index if index is not None else 1 << 30)


class _UseArrays(NamedTuple):
    """The uses of a list of tensors as flat arrays, tensor after tensor (each tensor's in execution order)."""

    counts: np.ndarray  # uses per tensor
    offsets: np.ndarray  # where each tensor's uses start in the flat arrays
    positions: np.ndarray  # each use's position
    indices: np.ndarray  # each use's input index; -1 for a read inside a subgraph

    @classmethod
    def of(cls, lists: list[list[Use]]) -> _UseArrays:
        counts = np.fromiter(map(len, lists), dtype=np.int64, count=len(lists))
        flat = list(itertools.chain.from_iterable(lists))
        positions = np.fromiter(map(operator.itemgetter(0), flat), dtype=np.int64, count=len(flat))
        indices = np.fromiter(
            (-1 if i is None else i for i in map(operator.itemgetter(1), flat)), dtype=np.int64, count=len(flat)
        )
        return cls(counts, np.cumsum(counts) - counts, positions, indices)

    def steps(self, starts: np.ndarray) -> np.ndarray:
        """The distance from each use back to the one before it, or for a tensor's first use back to
        its start (``starts``: one per tensor)."""
        has = self.counts > 0
        before = np.empty_like(self.positions)
        before[1:] = self.positions[:-1]
        before[self.offsets[has]] = starts[has]
        return self.positions - before

    def last(self) -> np.ndarray:
        """The position of each tensor's last use (-1: none)."""
        found = np.full(len(self.counts), -1, dtype=np.int64)
        has = self.counts > 0
        found[has] = self.positions[self.offsets[has] + self.counts[has] - 1]
        return found

    def max_gaps(self, steps: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """`_max_gap` of each tensor (``steps``: `steps`; ``ends``: its end, or -1 for none); 0 for a
        tensor without uses."""
        has = self.counts > 0
        gaps = np.zeros(len(self.counts), dtype=np.int64)
        if has.any():
            gaps[has] = np.maximum.reduceat(steps, self.offsets[has])
        tail = np.where(ends >= 0, ends - self.last(), 0)
        return np.maximum(np.maximum(gaps, tail), 0) * has

    def any(self, flags: np.ndarray) -> np.ndarray:
        """For each tensor, whether the flag of any of its uses is set (``flags``: one per use)."""
        found = np.zeros(len(self.counts), dtype=bool)
        has = self.counts > 0
        if has.any():
            found[has] = np.logical_or.reduceat(flags, self.offsets[has])
        return found


def _input_bits(n: int, table: dict[int, frozenset[int]]) -> np.ndarray:
    """Per position, the input indices ``table`` gives it, as bits (indices above 62 are never listed)."""
    bits = np.zeros(n, dtype=np.int64)
    for position, indices in table.items():
        bits[position] = sum(1 << i for i in indices if i < 63)
    return bits


def _max_gap(start: int, uses: list[Use], end: int | None = None) -> int:
    """The largest distance between consecutive entries of [start] + use positions (+ [end])."""
    best = 0
    prev = start
    for use in uses:
        position = use[0]
        if position - prev > best:
            best = position - prev
        prev = position
    if end is not None and end - prev > best:
        best = end - prev
    return best


class _Selector:
    """The select stage over one analysis: each candidate's verdict, one check per method, in the
    order the reasons are listed (the first that applies wins)."""

    def __init__(self, analysis: Analysis, options: SelectPart) -> None:
        self.analysis = analysis
        self.options = options
        self.n = analysis.num_positions
        self.outputs = analysis.graph_output_set
        # (first-use key, candidate number) of each verdict: sorting by it keeps candidates of one key in
        # the order they were considered
        self.chosen: list[tuple[tuple[tuple[int, int], int], Chosen]] = []  # entries: `entry`, `chosen_entry`
        self.rejected: list[tuple[tuple[tuple[int, int], int], Rejection]] = []
        self.index: dict[str, int] = {}  # candidate -> its number
        self.gaps: dict[str, int] = {}  # candidate read by some node -> its longest idle stretch
        self.forced: set[str] = set()  # candidates that match a --force pattern
        # forced candidates that would stay for a host read (reason host-input or host-resident) -> why
        self.forced_on_host: dict[str, str] = {}
        self._feeders: dict[str, Use] | None = None  # computed on the first candidate that needs it
        self.subgraph_only: set[str] = set()  # candidates read only inside subgraphs (`consider_all`'s)
        # `consider_all`'s candidates' uses, and the step back from each (`_UseArrays.steps`)
        self.use_steps: tuple[_UseArrays, np.ndarray] | None = None
        self._short_details: dict[tuple[int, int], str] = {}  # (max gap, distance) -> the short-gaps detail
        self.host_reads: dict[int, frozenset[str]] = {}  # position -> names its subgraphs read on the host
        # position -> the inputs its node reads in host memory, for the nodes that have any
        self.host_inputs = {
            p: HOST_INPUTS[op] for p, op in enumerate(node.op_type for node in analysis.nodes) if op in HOST_INPUTS
        }
        self.packing = _packing_nodes(analysis)  # position -> the inputs its node packs, for those that pack any
        self.fused = frozenset(options.fused)
        self.host_nodes = frozenset(options.host_nodes)
        self.host_device = options.host_device

    def reject(
        self,
        name: str,
        kind: Kind,
        uses: list[Use],
        reason: RejectionReason,
        detail: str,
        max_gap: int | None = None,
        info: TensorInfo | None = None,
    ) -> None:
        """List ``name`` as rejected (``info``: its size's source when the caller has it)."""
        first = _sort_key(uses[0]) if uses else (self.n, 0)
        if info is None:
            info = self.analysis.infos.get(name)
        size = info.bytes if info is not None else None
        key = (first, self.index.setdefault(name, len(self.index)))
        self.rejected.append((key, rejection(name, kind, size, "select", reason, detail, max_gap)))

    def shape_feeders(self) -> dict[str, Use]:
        if self._feeders is None:
            self._feeders = _shape_feeders(self.analysis, self.host_reads)
        return self._feeders

    def consider(self, name: str, kind: Kind) -> None:
        """Offload ``name`` or reject it with the first reason of `RULES` that applies."""
        analysis, options = self.analysis, self.options
        uses = analysis.uses.get(name) or []
        is_act = kind == "activation"
        start = analysis.producer[name] if is_act else 0
        max_gap = 0
        if uses:
            max_gap = self.gaps[name] = _max_gap(start, uses, None if is_act else max(self.n - 1, uses[-1][0]))
        forced = bool(options.force) and _matches(name, options.force)
        if forced:
            self.forced.add(name)
        case = _Case(name, kind, uses, forced, max_gap)
        verdict, info = self._verdict(case)
        if verdict is not None:
            self.reject(name, kind, uses, *verdict, max_gap if uses else None, info)
            return
        assert info is not None  # a rule rejects a tensor without one
        if forced:  # offloaded though a host read would have kept it: the selection warns
            kept, _ = self._verdict(case._replace(forced=False, info=info), tensor_only=True)
            if kept is not None and kept[0] in _HOST_REASONS:
                self.forced_on_host[name] = kept[1].removesuffix(_FORCE_ADVICE)
        key = (_sort_key(uses[0]), self.index.setdefault(name, len(self.index)))
        # Chosen(...) without the NamedTuple's Python-level __new__ (a big model chooses hundreds of thousands)
        self.chosen.append((key, tuple.__new__(Chosen, (name, kind, start, forced, info))))

    def _verdict(
        self, case: _Case, *, tensor_only: bool = False
    ) -> tuple[tuple[RejectionReason, str] | None, TensorInfo | None]:
        """(the verdict of the first rule of `RULES` that applies, or None; the tensor's info, looked up
        once the rules that need none have passed). ``tensor_only``: the rules that read the tensor alone."""
        info = case.info
        for rule in RULES:
            if rule.reads_tensor:
                if info is None:
                    info = self.analysis.infos.get(case.name)
                    case = case._replace(info=info)
            elif tensor_only:
                continue
            verdict = rule.check(self, case)
            if verdict is not None:
                return verdict, info
        return None, info

    def consider_all(self, activations: list[str], weights: list[str], arrays: _UseArrays | None = None) -> None:
        """`consider` each of ``activations`` and then of ``weights``, in that order, as one pass.

        What a big model's candidates have in common is decided for all of them at once, from the same
        `RULES`: each rule's ``may_apply`` marks every candidate its check could reject, and a candidate
        no rule marks (and that matches no --force pattern) is chosen as `consider` would choose it;
        every other goes through `consider`, whose checks give the reason. The records are those
        `consider` makes. ``arrays``: the candidates' uses as arrays (`candidate_uses`), when the caller
        has them.
        """
        analysis, options = self.analysis, self.options
        names = [*activations, *weights]
        acts = len(activations)
        self.index.update(zip(names, range(len(self.index), len(self.index) + len(names))))
        if arrays is None:
            arrays = _UseArrays.of([analysis.uses.get(name) or [] for name in names])
        has = arrays.counts > 0
        starts = np.zeros(len(names), dtype=np.int64)
        starts[:acts] = np.fromiter(map(analysis.producer.__getitem__, activations), dtype=np.int64, count=acts)
        ends = np.full(len(names), -1, dtype=np.int64)  # a weight idles from its last use to the end of the run
        ends[acts:] = np.maximum(self.n - 1, arrays.last()[acts:])
        steps = arrays.steps(starts)
        gaps = arrays.max_gaps(steps, ends)
        self.use_steps = (arrays, steps)
        # every candidate looked up in order, as `consider` looks each up (a size it refuses is refused first)
        screen = _Screen(names, acts, has, gaps, list(map(analysis.infos.get, names)), arrays)
        plain = np.ones(len(names), dtype=bool)
        for rule in RULES:
            plain &= ~rule.may_apply(self, screen)
        plain &= ~_where(screen, options.force)  # a forced candidate is judged by the rules one by one
        self.gaps.update(zip(itertools.compress(names, has), gaps[has].tolist()))
        self.subgraph_only.update(itertools.compress(names, has & ~arrays.any(arrays.indices >= 0)))
        # (first-use key, candidate number) of each, as `consider` keys it (`_sort_key` of its first use)
        first = arrays.offsets[plain]
        indices = arrays.indices[first]
        keys = zip(
            zip(arrays.positions[first].tolist(), np.where(indices < 0, 1 << 30, indices).tolist()),
            itertools.compress(map(self.index.__getitem__, names), plain),
        )
        kinds = itertools.chain(itertools.repeat("activation", acts), itertools.repeat("parameter"))
        fields = itertools.compress(zip(names, kinds, starts.tolist(), itertools.repeat(False), screen.infos), plain)
        # Chosen(...) without the NamedTuple's Python-level __new__ (a big model chooses hundreds of thousands)
        self.chosen += zip(keys, map(tuple.__new__, itertools.repeat(Chosen), fields))
        for k in np.flatnonzero(~plain).tolist():
            self.consider(names[k], "activation" if k < acts else "parameter")

    def host_read_uses(self, screen: _Screen) -> np.ndarray:
        """For each candidate, whether a node reads it at an input kept in host memory, or inside a subgraph."""
        arrays = screen.arrays
        at_host = arrays.indices < 0  # inside a subgraph: its body decides
        if self.host_inputs:
            bits = _input_bits(self.n, self.host_inputs)[arrays.positions]
            at_host |= ((bits >> np.clip(arrays.indices, 0, 63)) & 1).astype(bool) & (arrays.indices >= 0)
        return arrays.any(at_host)

    def packed_uses(self, screen: _Screen) -> np.ndarray:
        """For each candidate, whether a node that prepacks an input reads it there."""
        arrays = screen.arrays
        if not self.packing:
            return np.zeros(len(screen.names), dtype=bool)
        bits = _input_bits(self.n, self.packing)[arrays.positions]
        packed = ((bits >> np.clip(arrays.indices, 0, 63)) & 1).astype(bool) & (arrays.indices >= 0)
        return arrays.any(packed)

    def gap_verdict(self, uses: list[Use], max_gap: int, distance: int) -> tuple[RejectionReason, str]:
        """Why a tensor whose longest idle stretch is ``max_gap`` (at most ``distance``) is not offloaded."""
        for use in uses:
            if use[1] is not None:
                break
        else:  # every read is inside a subgraph
            holders = sorted({f"{self.analysis.nodes[u.position].op_type} {u.node!r}" for u in uses})
            return (
                "subgraph-only",
                f"read only inside the bodies of {', '.join(holders[:3])}: in the main graph, where copies are "
                "planned, a body is one position, so the tensor never idles there; offloadctl does not plan inside "
                "If/Loop/Scan bodies",
            )
        return "short-gaps", self.short_detail(max_gap, distance)

    def short_detail(self, max_gap: int, distance: int) -> str:
        """The short-gaps detail of a tensor whose longest idle stretch is ``max_gap`` (worded once: a
        big model has a few distinct gaps over a hundred thousand tensors)."""
        detail = self._short_details.get((max_gap, distance))
        if detail is None:
            detail = self._short_details[max_gap, distance] = (
                f"largest idle stretch {max_gap} <= select distance {distance}"
            )
        return detail

    def _resident_reason(self, name: str, kind: Kind, uses: list[Use]) -> str | None:
        """Why a tensor stays where it is on the plan's device: a node the device runs on the CPU
        makes or reads it (then it is not on the device, or a copy from the host would be copied again;
        on WebGPU such rewrites failed to load or to run)."""
        if not self.host_nodes:
            return None
        analysis = self.analysis
        labels = analysis.node_names
        at = [analysis.producer[name]] if kind == "activation" else []
        at += [u.position for u in uses]
        where = next((p for p in at if labels[p] in self.host_nodes), None)
        if where is None:
            return None
        verb = "made" if kind == "activation" and where == at[0] else "read"
        op = analysis.nodes[where].op_type
        return f"{verb} on the host by {op} {labels[where]!r}: onnxruntime runs it on the CPU on {self.host_device}"

    def _host_reason(self, name: str, uses: list[Use], elem_type: int | None) -> str | None:
        analysis = self.analysis
        host_inputs = self.host_inputs
        host_use = None
        for use in uses:  # `_reads_on_host`, with the node's host inputs from the table
            index = use[1]
            if index is None:
                if _reads_on_host(analysis, use, name, self.host_reads):
                    host_use = use
                    break
            elif host_inputs and index in host_inputs.get(use[0], ()):
                host_use = use
                break
        if host_use is not None:
            op = analysis.nodes[host_use.position].op_type
            where = (
                f"read as input {host_use.input_index} of {op} {host_use.node!r}"
                if host_use.input_index is not None
                else f"read inside a subgraph of {op} {host_use.node!r} at an input"
            )
            return f"{where}, which onnxruntime keeps in host memory"
        if elem_type not in _SHAPE_TYPES:  # only integer tensors feed shape computations
            return None
        end = self.shape_feeders().get(name)
        if end is None:
            return None
        op = analysis.nodes[end.position].op_type
        return (
            f"feeds only shape computations ending at input {end.input_index} of {op} {end.node!r}, "
            "which onnxruntime keeps in host memory"
        )


class _Case(NamedTuple):
    """One candidate as a rule's check sees it (``info`` looked up once the rules that need none pass)."""

    name: str
    kind: Kind
    uses: list[Use]
    forced: bool
    max_gap: int
    info: TensorInfo | None = None


class _Screen(NamedTuple):
    """Every candidate at once, as `_Selector.consider_all` knows them, for the rules' ``may_apply``:
    the first ``acts`` are activations, the rest weights."""

    names: list[str]
    acts: int
    has: np.ndarray  # read by some node
    gaps: np.ndarray  # the longest idle stretch
    infos: list[TensorInfo | None]
    arrays: _UseArrays

    def each(self, predicate: Callable[[str], bool]) -> np.ndarray:
        return np.fromiter(map(predicate, self.names), dtype=bool, count=len(self.names))

    def each_info(self, predicate: Callable[[TensorInfo | None], bool]) -> np.ndarray:
        return np.fromiter(map(predicate, self.infos), dtype=bool, count=len(self.infos))

    def weights(self) -> np.ndarray:
        found = np.zeros(len(self.names), dtype=bool)
        found[self.acts :] = True
        return found


_Verdict = tuple[RejectionReason, str] | None


@dataclass(frozen=True)
class Rule:
    """One reason the select stage keeps a tensor on the device, stated once: ``check`` gives one
    candidate's verdict by it; ``may_apply`` marks, for all candidates at once, every candidate the
    check could reject (a superset: those are checked one by one, the others chosen outright);
    ``reads_tensor``: the check reads the tensor's type and size, looked up only once the rules before
    it have passed. The first rule of `RULES` whose check gives a verdict wins."""

    name: str
    check: Callable[[_Selector, _Case], _Verdict]
    may_apply: Callable[[_Selector, _Screen], np.ndarray]
    reads_tensor: bool = False


def _unused(sel: _Selector, c: _Case) -> _Verdict:
    if c.uses:
        return None
    return "unused", "no node reads it" + (" (graph output only)" if c.name in sel.outputs else "")


def _disabled(sel: _Selector, c: _Case) -> _Verdict:
    is_act = c.kind == "activation"
    if (sel.options.activations if is_act else sel.options.params) or c.forced:
        return None
    return "disabled", f"{c.kind} offload is switched off (--{'activations' if is_act else 'params'})"


def _switched_off(sel: _Selector, screen: _Screen) -> np.ndarray:
    return np.where(screen.weights(), not sel.options.params, not sel.options.activations)


def _never(sel: _Selector, c: _Case) -> _Verdict:
    return ("never", "matches a --never pattern") if _matches(c.name, sel.options.never) else None


def _short(sel: _Selector, c: _Case) -> _Verdict:
    # checked before size and placement: no idle stretch qualifies, whatever else holds
    if c.forced or c.max_gap > sel.options.select_distance:
        return None
    return sel.gap_verdict(c.uses, c.max_gap, sel.options.select_distance)


def _sparse(sel: _Selector, c: _Case) -> _Verdict:
    if c.name not in sel.analysis.sparse_weights:
        return None
    return (
        "not-copyable",
        "a sparse weight (onnxruntime makes it dense when it loads the model); offloadctl copies dense tensors only",
    )


def _not_copyable(sel: _Selector, c: _Case) -> _Verdict:
    info = c.info
    if info is None or info.copyable:
        return None
    if info.bytes is None:
        return "not-copyable", info.why_unknown()
    return (
        "not-copyable",
        f"type {info.dtype} cannot be copied by onnxruntime's MemcpyToHost/MemcpyFromHost on every provider",
    )


def _unknown_size(sel: _Selector, c: _Case) -> _Verdict:
    if c.info is not None and c.info.bytes is not None:
        return None
    why = c.info.why_unknown() if c.info is not None else "shape inference could not find its type"
    return "unknown-size", f"size unknown: {why}; pin dynamic inputs with --input-shape NAME=D0,D1,..."


def _host_input(sel: _Selector, c: _Case) -> _Verdict:
    assert c.info is not None  # the rules before it reject a tensor without one
    host = None if c.forced else sel._host_reason(c.name, c.uses, c.info.elem_type)
    return None if host is None else ("host-input", host)


def _small_index(sel: _Selector, c: _Case) -> _Verdict:
    info = c.info
    assert info is not None and info.bytes is not None
    if c.forced or not _is_small_index(info):
        return None
    return (
        "host-input",
        f"a small {info.dtype} tensor ({info.bytes} B): index and shape arithmetic, which device providers run on "
        "the CPU where they have no kernel for it, so its copy from the host is copied again (on WebGPU such a "
        "rewrite did not load)" + _FORCE_ADVICE,
    )


def _is_small_index(info: TensorInfo | None) -> bool:
    return info is not None and info.elem_type in _INDEX_TYPES and (info.bytes or 0) <= SMALL_INDEX_BYTES


def _prepacked(sel: _Selector, c: _Case) -> _Verdict:
    if c.forced or c.kind == "activation" or not sel.packing:
        return None
    packed = _prepacked_use(sel.analysis, c.uses, sel.packing)
    return None if packed is None else ("prepacked", packed)


def _host_resident(sel: _Selector, c: _Case) -> _Verdict:
    if c.forced or not sel.host_nodes:
        return None
    resident = sel._resident_reason(c.name, c.kind, c.uses)
    return None if resident is None else ("host-resident", resident)


def _fused(sel: _Selector, c: _Case) -> _Verdict:
    if c.forced or c.name not in sel.fused:
        return None
    return (
        "fused",
        "onnxruntime's graph optimizations at the level of the measured profile take it into a fused node or a "
        "folded constant; a copy would read it and undo that rewrite",
    )


def _output_weight(sel: _Selector, c: _Case) -> _Verdict:
    if c.kind == "activation" or c.name not in sel.outputs:
        return None
    return "graph-output-weight", "a weight that is also a graph output stays on the device"


def _none(screen: _Screen) -> np.ndarray:
    return np.zeros(len(screen.names), dtype=bool)


def _where(screen: _Screen, patterns: Iterable[str]) -> np.ndarray:
    """The candidates whose name matches one of ``patterns``."""
    return screen.each(lambda name: _matches(name, patterns)) if patterns else _none(screen)


#: Every reason a tensor stays, in the order they are checked.
RULES: tuple[Rule, ...] = (
    Rule("unused", _unused, lambda sel, s: ~s.has),
    Rule("disabled", _disabled, _switched_off),
    Rule("never", _never, lambda sel, s: _where(s, sel.options.never)),
    Rule("short gaps", _short, lambda sel, s: s.gaps <= sel.options.select_distance),
    Rule("sparse", _sparse, lambda sel, s: s.each(sel.analysis.sparse_weights.__contains__), reads_tensor=True),
    Rule("not copyable", _not_copyable, lambda sel, s: s.each_info(lambda i: i is None or not i.copyable), True),
    Rule("unknown size", _unknown_size, lambda sel, s: s.each_info(lambda i: i is None or i.bytes is None), True),
    Rule(
        "read on the host",
        _host_input,
        lambda sel, s: sel.host_read_uses(s) | s.each_info(lambda i: i is not None and i.elem_type in _SHAPE_TYPES),
        True,
    ),
    Rule("small index", _small_index, lambda sel, s: s.each_info(_is_small_index), True),
    Rule("prepacked", _prepacked, lambda sel, s: sel.packed_uses(s) & s.weights(), True),
    Rule(
        "host resident",
        _host_resident,
        lambda sel, s: np.full(len(s.names), bool(sel.host_nodes)),
        True,
    ),
    Rule("fused", _fused, lambda sel, s: s.each(sel.fused.__contains__) if sel.fused else _none(s), True),
    Rule("output weight", _output_weight, lambda sel, s: s.each(sel.outputs.__contains__) & s.weights(), True),
)


def _entry(analysis: Analysis, chosen: Chosen, distance: int) -> Offload:
    """The ``offloads`` entry of a chosen tensor: its uses split into reload groups at select distance ``distance``."""
    device, groups = _reload_split(analysis, chosen, distance)
    return chosen_entry(
        analysis,
        chosen,
        device_uses=[u.to_json() for u in device],
        reload_groups=[reload_group([u.to_json() for u in g], gap) for gap, g in groups],
    )


class Chosen(NamedTuple):
    """A tensor the select stage offloads, as `Selection` keeps it: its ``offloads`` entry is built
    only when a plan lists it (`chosen_entry`), since a big model has hundreds of thousands."""

    tensor: str
    kind: Kind
    start: int  # its producer's position (an activation), or 0
    forced: bool  # matched a --force pattern
    info: TensorInfo  # its type, shape and size (known: the select stage rejects a tensor without them)

    @property
    def size(self) -> int:
        """Its bytes, the ``bytes`` of its entry."""
        size = self.info.bytes
        assert size is not None  # checked by _by_tensor
        return size


def chosen_entry(
    analysis: Analysis,
    chosen: Chosen,
    *,
    device_uses: list[PlanUse] | None = None,
    reload_groups: list[ReloadGroup] | None = None,
    prefetch_distance: int | None = None,
) -> Offload:
    """The ``offloads`` entry of a chosen tensor, with the given uses and reload groups (none by
    default) and prefetch distance."""
    info, start = chosen.info, chosen.start
    is_act = chosen.kind == "activation"
    output = is_act and chosen.tensor in analysis.graph_output_set
    return offload(
        tensor=chosen.tensor,
        kind=chosen.kind,
        dtype=info.dtype,
        shape=info.int_shape(),
        size=chosen.size,
        producer={"position": start, "node": analysis.node_names[start]} if is_act else None,
        device_uses=device_uses if device_uses is not None else [],
        reload_groups=reload_groups if reload_groups is not None else [],
        graph_output=output,
        output_h2d_before=analysis.num_positions if output else None,
        prefetch_distance=prefetch_distance,
        forced=chosen.forced,
    )


_Key = tuple[tuple[int, int], int]  # a record's place in plan order: (its first use, its candidate number)

#: reasons the select stage gives before it looks at idle stretches: no select distance changes them
_BEFORE_GAPS = frozenset({"unused", "disabled", "never"})


class Selection:
    """One pass of the select stage over an analysis, at select distance 0, for plans with weights and
    without, and at any select distance (`at_distance`).

    The budget planner needs both (it adds weights when activations alone cannot fit a budget):
    the tensors are looked at once, and `plan` assembles either plan; ``plan(weights=False)`` is
    what ``select`` gives with ``params=False``, except that its offloads list no device uses and
    no reload groups, and they are not numbered: the budget planner lays out and numbers each one it
    takes itself, from the analysis's uses (`offloadctl.planning.budget.candidates.plan_entry`). A
    big model has hundreds of thousands, so the planner reads them as `Chosen` records (`chosen`),
    the rejections (`rejected`) and a plan without either (`header`), and no entry is built for a
    tensor it does not take. `select` reads the same pass at its own distance: a longer distance
    only rejects more tensors, for their short idle stretches (`selection_for` keeps one pass per
    analysis and options, so a weak plan's next step selects no tensor again).
    """

    def __init__(self, analysis: Analysis, options: SelectPart) -> None:
        self.options = options
        self.analysis = analysis
        self._selector = _Selector(analysis, SelectPart.of(options, params=True, select_distance=0))
        self._parts: dict[bool, tuple[list[tuple[_Key, Chosen]], list[tuple[_Key, Rejection]]]] = {}
        self._lists: dict[bool, tuple[list[Chosen], list[Rejection]]] = {}
        self._plans: dict[bool, Plan] = {}
        self._gap_columns: dict[bool, tuple[np.ndarray, np.ndarray]] = {}
        activations, weights, arrays = candidate_uses(analysis)
        analysis.infos.convert([*activations, *weights])  # every candidate is looked up below
        self._selector.consider_all(activations, weights, arrays)
        on_host = self._selector.forced_on_host
        if on_host:
            shown = "; ".join(f"{name!r}: {why}" for name, why in list(on_host.items())[:3])
            logger.warning(
                "%d --force'd tensor(s) are read where onnxruntime keeps them in host memory, and are offloaded "
                "anyway: %s%s. On a device provider (CUDA, CANN, WebGPU) onnxruntime copies such a tensor straight "
                "back, or cannot load the rewrite; on the CPU provider the rewrite runs. Narrow --force (or add "
                "--never) to keep them",
                len(on_host),
                shown,
                " …" if len(on_host) > 3 else "",
            )

    def plan(self, *, weights: bool) -> Plan:
        """The selected plan, weights considered or not (forced ones are always); built once each, and
        shared: the stages after select copy what they change (`offloadctl.contract.document.record_stage`)."""
        made = self._plans.get(weights)
        if made is None:
            chosen, rejected = self._split(weights)
            made = self._plans[weights] = {
                **self.header(weights=weights),
                "offloads": [chosen_entry(self.analysis, c) for c in chosen],  # not numbered (id 0)
                "rejected": list(rejected),
            }
        return made

    def header(self, *, weights: bool) -> Plan:
        """`plan` with empty ``offloads`` and ``rejected`` lists (its model, options and history)."""
        return _selected(self.analysis, SelectPart.of(self.options, params=weights, select_distance=0))

    def chosen(self, *, weights: bool) -> list[Chosen]:
        """The tensors `plan` lists as offloads, in its order."""
        return self._split(weights)[0]

    def rejected(self, *, weights: bool) -> list[Rejection]:
        """`plan`'s ``rejected`` list (do not change it: it is shared)."""
        return self._split(weights)[1]

    def at_distance(self, distance: int, *, weights: bool) -> tuple[list[Chosen], list[Rejection]]:
        """(chosen, rejected) at select distance ``distance``, in plan order: what `plan` lists, less
        the tensors whose longest idle stretch is at most ``distance`` (unless forced), which are
        rejected for it instead (the rejections are shared with `plan`'s where they are the same)."""
        if distance == 0:
            return self._split(weights)
        selector = self._selector
        gaps, forced, uses_of = selector.gaps, selector.forced, self.analysis.uses

        def short(name: str, kind: Kind, size: int | None, max_gap: int) -> Rejection:
            if name in selector.subgraph_only:
                reason, detail = selector.gap_verdict(uses_of[name], max_gap, distance)
            else:
                reason, detail = "short-gaps", selector.short_detail(max_gap, distance)
            return rejection(name, kind, size, "select", reason, detail, max_gap)

        keyed_chosen, keyed_rejected = self._keyed(weights)
        records = self._split(weights)[0]
        record_gaps, record_forced = self._columns(weights)
        keep = record_forced | (record_gaps > distance)
        chosen = list(itertools.compress(records, keep))
        moved = [
            (key, short(c.tensor, c.kind, c.info.bytes, gap))
            for (key, c), gap in itertools.compress(zip(keyed_chosen, record_gaps.tolist()), ~keep)
        ]
        rejected: list[tuple[_Key, Rejection]] = []
        for key, entry in keyed_rejected:
            name = entry["tensor"]
            if entry["reason"] not in _BEFORE_GAPS and gaps[name] <= distance and name not in forced:
                entry = short(name, entry["kind"], entry["bytes"], gaps[name])  # noqa: PLW2901 - rejected at this distance
            rejected.append((key, entry))
        if moved:
            rejected += moved
            rejected.sort(key=operator.itemgetter(0))
        return chosen, [entry for _, entry in rejected]

    @property
    def numbers(self) -> dict[str, int]:
        """Each candidate's number: its place among the candidates, activations first (do not change it)."""
        return self._selector.index

    def reload_gaps(self, distance: int) -> np.ndarray:
        """By candidate number (`numbers`): the largest gap before a reload group of its `select` entry
        at select distance ``distance``, for a tensor with uses. That is its largest step longer than
        the distance, or with none its first step (a weight's first group, a forced tensor's only
        group: a first step that opens a group without being longer is never the largest)."""
        arrays, steps = self._selector.use_steps or (_UseArrays.of([]), np.zeros(0, dtype=np.int64))
        has = arrays.counts > 0
        largest = np.full(len(arrays.counts), -1, dtype=np.int64)
        if has.any():
            largest[has] = np.maximum.reduceat(np.where(steps > distance, steps, -1), arrays.offsets[has])
        none = has & (largest < 0)
        largest[none] = steps[arrays.offsets[none]]
        return largest

    def _columns(self, weights: bool) -> tuple[np.ndarray, np.ndarray]:
        """The longest idle stretch of each of `chosen`'s records, and whether it is forced, as arrays;
        made once each."""
        made = self._gap_columns.get(weights)
        if made is None:
            records = self._split(weights)[0]
            gaps = self._selector.gaps
            made = self._gap_columns[weights] = (
                np.fromiter((gaps[c.tensor] for c in records), dtype=np.int64, count=len(records)),
                np.fromiter((c.forced for c in records), dtype=bool, count=len(records)),
            )
        return made

    def unread_outputs(self) -> list[Rejection]:
        """The graph outputs no node reads (rejected as unused activations), in `plan` order, which is
        the same with weights and without."""
        outputs = self.analysis.graph_output_set
        found = [
            (key, entry)
            for key, entry in self._selector.rejected
            if entry["reason"] == "unused" and entry["kind"] == "activation" and entry["tensor"] in outputs
        ]
        found.sort(key=lambda item: item[0])
        return [entry for _, entry in found]

    def _split(self, weights: bool) -> tuple[list[Chosen], list[Rejection]]:
        """(chosen, rejected) of the plan with or without weights, in plan order; made once each."""
        made = self._lists.get(weights)
        if made is None:
            chosen, rejected = self._keyed(weights)
            made = self._lists[weights] = ([c for _, c in chosen], [entry for _, entry in rejected])
        return made

    def _keyed(self, weights: bool) -> tuple[list[tuple[_Key, Chosen]], list[tuple[_Key, Rejection]]]:
        """`_split`'s lists with each record's plan-order key; made once each."""
        made = self._parts.get(weights)
        if made is not None:
            return made
        selector = self._selector
        chosen, rejected = list(selector.chosen), list(selector.rejected)
        if not weights:
            disabled = {c.tensor for _, c in chosen if c.kind == "parameter" and not c.forced} | {
                entry["tensor"]
                for _, entry in rejected
                if entry["kind"] == "parameter"
                and entry["reason"] != "unused"
                and not _matches(entry["tensor"], self.options.force)
            }
            chosen = [(key, c) for key, c in chosen if c.tensor not in disabled]
            rejected = [(key, e) for key, e in rejected if e["tensor"] not in disabled]
            for name in sorted(disabled):
                self._disable(name, rejected)
        chosen.sort(key=lambda item: item[0])
        rejected.sort(key=lambda item: item[0])
        made = self._parts[weights] = (chosen, rejected)
        return made

    def _disable(self, name: str, rejected: list[tuple[_Key, Rejection]]) -> None:
        uses = self.analysis.uses[name]
        info = self.analysis.infos.get(name)
        max_gap = _max_gap(0, uses, max(self.analysis.num_positions - 1, uses[-1].position))
        size = info.bytes if info is not None else None
        why = "parameter offload is switched off (--params)"
        key = (uses[0].sort_key, self._selector.index[name])
        rejected.append((key, rejection(name, "parameter", size, "select", "disabled", why, max_gap)))


def candidate_uses(analysis: Analysis) -> tuple[list[str], list[str], _UseArrays]:
    """The select stage's candidates, every activation and then every weight some node reads, and
    their uses as arrays: the graph alone decides them, so they are made once per analysis (while
    onnx infers the sizes, for a command that opens a big model: `offloadctl.job.Job.of_model`)."""
    return derived(analysis, "select candidates", _candidate_uses)


def _candidate_uses(analysis: Analysis) -> tuple[list[str], list[str], _UseArrays]:
    activations = list(analysis.producer)
    weights = [t for t in analysis.sorted_weights if t in analysis.uses]
    uses = analysis.uses
    return activations, weights, _UseArrays.of([uses.get(name) or [] for name in (*activations, *weights)])


def selection_for(analysis: Analysis, options: SelectPart) -> Selection:
    """The `Selection` of ``analysis`` with ``options`` (their select distance and ``params`` aside):
    made once per analysis and options, and shared by the stages that select with them."""
    key = SelectPart.of(options, params=True, select_distance=0)
    made: dict[SelectPart, Selection] = derived(analysis, "selections", lambda _analysis: {})
    found = made.get(key)
    if found is None:
        found = made[key] = Selection(analysis, key)
    return found


@taking(SelectPart)
@paused_gc()
def select(analysis: Analysis, options: SelectPart) -> Plan:
    """Build a plan at stage "selected" from an analysed model (``options``: `SelectPart`, or its
    fields as keywords: ``select(analysis, select_distance=1)``)."""
    chosen, rejected = selection_for(analysis, options).at_distance(options.select_distance, weights=options.params)
    return selected_plan(analysis, options, enumerate(chosen), rejected)


def selected_plan(
    analysis: Analysis, options: SelectPart, chosen: Iterable[tuple[int, Chosen]], rejected: list[Rejection]
) -> Plan:
    """The "selected" plan listing the given chosen tensors, each with its number (``id``) among the
    tensors `select` chooses, and the rejections (shared, in a list of the plan's own)."""
    distance = options.select_distance
    offloads = []
    for i, c in chosen:
        entry = _entry(analysis, c, distance)
        entry["id"] = i
        offloads.append(entry)
    return {**_selected(analysis, options), "offloads": offloads, "rejected": list(rejected)}


def _reload_split(analysis: Analysis, chosen: Chosen, distance: int) -> tuple[list[Use], list[tuple[int, list[Use]]]]:
    """`split_reload_groups` of a chosen tensor at select distance ``distance``: (device uses, groups)."""
    uses, start = analysis.uses[chosen.tensor], chosen.start
    device, groups = split_reload_groups(start, uses, distance, first_group_at_start=chosen.kind != "activation")
    if not groups:  # only a forced tensor gets here: one group holding every use
        device, groups = ([], [(uses[0].position - start, list(uses))])
    return device, groups


def _selected(analysis: Analysis, options: SelectPart) -> Plan:
    """A plan at stage "selected" made with ``options``, its ``offloads`` and ``rejected`` lists empty."""
    recorded_options = recorded(SelectPart, options)
    return {
        "schema_version": SCHEMA_VERSION,
        "stage": "selected",
        "tool": {"name": "offloadctl", "version": __version__},
        "model": _model_info(analysis),
        "strategy": "distance",
        "options": {"select": recorded_options},
        "history": [{"stage": "selected", "tool_version": __version__, "options": recorded_options}],
        "offloads": [],
        "rejected": [],
    }


def _model_info(analysis: Analysis) -> ModelInfo:
    """What the plan records of its model: file, hash, positions, and how its sizes were found."""
    loaded = analysis.loaded
    model: ModelInfo = {
        "path": str(loaded.path),
        "sha256": loaded.sha256,
        "num_positions": analysis.num_positions,
        "input_shapes": loaded.input_shapes,
    }
    if loaded.dims:
        model["dims"] = dict(loaded.dims)
    if loaded.sizes_from_run is not None:
        model["sizes_from_run"] = {**loaded.sizes_from_run}
    if analysis.order != "priority":
        model["execution_order"] = analysis.order
    return model
