"""Time: what each node costs on a device profile, and the run time of a program with its copies.

Time model (needs a profile): a node the profile has measured (a measured profile, written by
``offloadctl profile``, holding a node of the same name, op type and input shapes; copy nodes are
never matched, so a rewritten model takes its original's times) takes its measured duration plus
the profile's ``node_overhead_s`` (what the executor spends per node beyond the kernel, less the
profiler's own cost inside each event; never below 0 in total). Any other node takes
``max(flops / peak_flops, bytes / mem_bandwidth) + kernel_launch_s``. FLOPs are counted for
MatMul/FusedMatMul/Gemm (2*M*N*K), Conv (2 * output elements * Cin/group * kernel size),
ConvTranspose (2 * input elements * Cout/group * kernel size) and attention ops (Attention,
MultiHeadAttention, GroupQueryAttention: 4*B*Sq*Skv*hidden, plus the QKV projection for
com.microsoft Attention); every other node is counted by the bytes it reads and
writes. A node onnxruntime fused away at the measured profile's optimization level costs nothing
(the fused node's time is attributed to the node that writes its output), and a model with copies
pays once what the profile measured ConstantFolding off to cost there (order pins and offloaded
weights need it off). Under a measured profile each node of the order pins (`Program.pin_nodes`)
moves no data and costs what one more trivial node added to a run there (its ``kernel_launch_s``);
a datasheet profile's kernel launch is the device's, not what a pin's CPU-side node costs, so there
pins cost nothing. A copy takes
``latency_s + bytes / bandwidth`` of its direction (in a measured profile the in-line cost of a
copy node, from the measured fit). Every figure includes the profile's
``run_overhead_s`` once (the fixed cost of a session run; 0 in datasheet profiles). Three figures:

- baseline: the nodes alone, no copies.
- serialized: copies run in line on the compute stream (onnxruntime today): baseline + every copy.
- overlapped: the copies on the one copy stream ``apply --copies streams`` writes (both directions
  share it: onnxruntime's page-locked host arena is not stream-aware), FIFO. A copy is issued when
  the compute stream reaches its place and starts when the copy stream is free (an H2D also waits
  for the D2H of its tensor); a node waits for the copies whose outputs it reads; at each offloaded
  buffer's release point the compute stream waits for that buffer's D2H (HyperOffload's release
  event, the fence apply writes). Each event node apply writes costs ``kernel_launch_s`` on its
  stream: the gate before each H2D and the one after each D2H on the copy stream, each fence on the
  compute stream. The run ends when the compute stream and the copy stream are done.

The same node table carries each measured node's kernel scratch; `scratched` gives the analysis that
counts it in every memory figure.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import onnx

from offloadctl.analysis.graph import Analysis, with_scratch
from offloadctl.loading.tensors import TensorInfo
from offloadctl.simulation.base import Base, base_of, step_ids
from offloadctl.simulation.profiles import DEFAULT_PROFILE, NodeTime, Profile, load_profile
from offloadctl.simulation.program import Program

__all__ = [
    "Costs",
    "TimeFigures",
    "scratched",
    "scratched_by_name",
    "node_costs",
    "node_flops",
    "node_seconds",
    "times",
]

ATTENTION_OPS = frozenset({"Attention", "MultiHeadAttention", "GroupQueryAttention"})
MATMUL_OPS = frozenset({"MatMul", "FusedMatMul"})
FLOP_OPS = MATMUL_OPS | ATTENTION_OPS | {"Gemm", "Conv", "ConvTranspose"}  # the ops counted by FLOPs
#: ops `node_costs` counts inline (a big transformer has tens of thousands of MatMuls): as `node_flops` counts them
_INLINE_FLOPS = MATMUL_OPS


# shape -> whether every dimension is a number (a big model has few distinct shapes)
_NUMERIC: dict[tuple[Any, ...], bool] = {}


def _dims(infos: Mapping[str, TensorInfo], name: str) -> tuple[int, ...] | None:
    info = infos.get(name) if name else None
    shape = info.shape if info is not None else None
    if shape is None:
        return None
    numeric = _NUMERIC.get(shape)
    if numeric is None:
        if len(_NUMERIC) > 100_000:
            _NUMERIC.clear()
        numeric = _NUMERIC[shape] = all(isinstance(d, int) for d in shape)
    return cast(tuple[int, ...], shape) if numeric else None


def node_flops(node: onnx.NodeProto, shape_of: Callable[[str], tuple[int, ...] | None]) -> int | None:
    """Floating-point operations of a compute-bound node; None for other ops or unknown shapes."""
    op = node.op_type
    if op not in FLOP_OPS:
        return None
    ins = list(node.input)
    out = shape_of(node.output[0]) if node.output else None

    def inp(i: int) -> tuple[int, ...] | None:
        return shape_of(ins[i]) if i < len(ins) and ins[i] else None

    if op in MATMUL_OPS:
        return _matmul_flops(inp(0), out)
    if op == "Gemm":
        a = inp(0)
        if a is None or out is None or len(a) != 2:
            return None
        trans = next((at.i for at in node.attribute if at.name == "transA"), 0)
        return 2 * math.prod(out) * (a[0] if trans else a[1])
    if op == "Conv":
        w = inp(1)
        if w is None or out is None or len(w) < 2:
            return None
        return 2 * math.prod(out) * math.prod(w[1:])
    if op == "ConvTranspose":
        x, w = inp(0), inp(1)
        if x is None or w is None or len(w) < 2:
            return None
        return 2 * math.prod(x) * math.prod(w[1:])
    if op in ATTENTION_OPS:
        return _attention_flops(node, inp)
    return None


def _matmul_flops(a: tuple[int, ...] | None, out: tuple[int, ...] | None) -> int | None:
    """A MatMul's FLOPs from its first input's shape and its output's (None: either unknown)."""
    if a is None or out is None or not a:
        return None
    return 2 * math.prod(out) * a[-1]


def _attention_flops(node: onnx.NodeProto, inp: Callable[[int], tuple[int, ...] | None]) -> int | None:
    q = inp(0)
    if q is None:
        return None
    if node.op_type == "Attention" and node.domain == "com.microsoft":
        w = inp(1)  # input (B, S, in_hidden), weights (in_hidden, 3 * hidden)
        if len(q) != 3 or w is None or len(w) != 2:
            return None
        b, s, in_hidden = q
        hidden = w[1] // 3
        return 2 * b * s * in_hidden * w[1] + 4 * b * s * s * hidden
    k = inp(1)
    if len(q) == 4:  # (B, heads, Sq, head_size)
        b, h, sq, d = q
        skv = k[2] if k is not None and len(k) == 4 else (k[1] if k is not None and len(k) == 3 else sq)
        hidden = h * d
    elif len(q) == 3:  # (B, Sq, hidden)
        b, sq, hidden = q
        skv = k[1] if k is not None and len(k) == 3 else (k[2] if k is not None and len(k) == 4 else sq)
    else:
        return None
    if node.op_type == "GroupQueryAttention":
        past = inp(3)
        if past is not None and len(past) == 4:
            skv += past[2]
    return 4 * b * sq * skv * hidden


@dataclass(frozen=True)
class Costs:
    """Seconds per node of the base, and how many came from the profile's measurements."""

    seconds: list[float]
    measured: int
    source: Any  # the MeasuredTimes used (held so that its id in the cache key stays its own)


def _measured_match(hit: NodeTime, node: onnx.NodeProto, shape_of: Callable[[str], tuple[int, ...] | None]) -> bool:
    """A measured node stands for ``node``: same op type and, where both are known, same input shapes."""
    if hit.op_type != node.op_type:
        return False
    if hit.input_shapes is None:
        return True
    ours = [shape_of(name) for name in node.input if name]
    if len(ours) != len(hit.input_shapes):
        return False
    return all(a is None or b is None or tuple(a) == tuple(b) for a, b in zip(ours, hit.input_shapes))


def _bytes_moved(base: Base) -> np.ndarray:
    """Bytes each node of the base reads and writes (a tensor read twice counts twice)."""
    sizes = np.asarray(base.sizes, dtype=np.int64)
    moved = np.zeros(base.n, dtype=np.int64)
    for per_step in (base.reads, base.writes):
        steps, ids = step_ids(per_step)
        np.add.at(moved, steps, sizes[ids])
    return moved


def node_costs(base: Base, profile: Profile) -> Costs:
    """Seconds of each node of the base on ``profile`` (measured where the profile has the node),
    computed once per profile."""
    measured = profile.measured
    key = f"{profile!r}@{id(measured)}"
    cached = base.costs.get(key)
    if cached is not None:
        return cached
    infos = base.infos

    def shape_of(name: str) -> tuple[int, ...] | None:
        return _dims(infos, name) or _dims(infos, base.canon(name))

    table = measured.nodes if measured is not None else {}
    offset = measured.node_overhead_s if measured is not None else 0.0
    bandwidth, launch = profile.mem_bandwidth, profile.kernel_launch_s
    nodes = base.nodes
    # every node at the speed of memory first: the bytes it reads and writes, as array operations
    moved = _bytes_moved(base) / bandwidth
    costs: list[float] = (moved + launch).tolist()
    count = 0
    # then the nodes that count by FLOPs, and those the profile measured
    looked_at = [p for p, node in enumerate(nodes) if node.op_type in FLOP_OPS]
    if table:
        looked_at = sorted({*looked_at, *(p for p, node in enumerate(nodes) if node.name in table)})
    peak: dict[int | None, float] = {}  # element type -> FLOP/s
    memory = moved.tolist()
    for p in looked_at:
        node = nodes[p]
        hit = table.get(node.name) if table and node.name else None
        if hit is not None and _measured_match(hit, node, shape_of):
            costs[p] = max(hit.seconds + offset, 0.0) if hit.ran else 0.0
            count += 1
            continue
        ins = node.input
        if node.op_type in _INLINE_FLOPS:  # `node_flops` of the commonest op, without its general lookups
            first = ins[0] if ins else ""
            a = shape_of(first) if first else None
            out = shape_of(node.output[0]) if node.output else None
            flops = _matmul_flops(a, out)
        else:
            flops = node_flops(node, shape_of)
            first = next((i for i in ins if i), "")
        if flops:
            info = infos.get(first) or infos.get(base.canon(first))
            elem = info.elem_type if info is not None else None
            rate = peak.get(elem)
            if rate is None:
                rate = peak[elem] = profile.flops_for(info.dtype if info is not None else "default")
            costs[p] = max(memory[p], flops / rate) + launch
    result = Costs(costs, count, measured)
    base.costs[key] = result
    return result


def node_seconds(analysis: Analysis, profile: Profile | str = DEFAULT_PROFILE) -> list[float]:
    """Seconds of each node of the model without its copies, in execution order, as the time model prices them.

    The budget strategy uses them to see how much compute can hide a copy on a separate stream.
    """
    prof = load_profile(profile) if isinstance(profile, str) else profile
    return list(node_costs(base_of(analysis), prof).seconds)


@dataclass(frozen=True)
class TimeFigures:
    """Estimated run time in seconds under the profile (see the module docstring).

    ``nodes`` counts the model's nodes and ``measured_nodes`` those whose time the profile measured
    (the others are estimated from FLOPs and bytes).
    """

    baseline: float
    serialized: float
    overlapped: float
    nodes: int = 0
    measured_nodes: int = 0

    @property
    def stall(self) -> dict[str, float]:
        return {"serialized": self.serialized - self.baseline, "overlapped": self.overlapped - self.baseline}

    @property
    def slowdown(self) -> dict[str, float]:
        def ratio(t: float) -> float:
            return t / self.baseline if self.baseline > 0 else 1.0

        return {"serialized": ratio(self.serialized), "overlapped": ratio(self.overlapped)}


def times(program: Program, costs: Costs, profile: Profile) -> TimeFigures:
    links = {"h2d": profile.h2d, "d2h": profile.d2h}
    steps = len(program.kinds)
    waits: dict[int, list[int]] = {}
    for after, copy in program.waits:
        waits.setdefault(after, []).append(copy)
    copy_of: dict[int, int] = {}  # tensor -> the copy step that wrote it
    copy_steps = [s for s, kind in enumerate(program.kinds) if kind != "node"]
    # the tensors copies write: a step that reads none of them waits for no copy
    copied = {t for s in copy_steps for t in program.writes[s]}
    # the steps that wait for a copy or are one; the nodes between them only add their time, in order
    reading = (s for s, reads in enumerate(program.reads) if not copied.isdisjoint(reads)) if copied else ()
    busy = sorted({*copy_steps, *waits, *reading})
    end = [0.0] * steps
    compute = 0.0
    copy_free = 0.0  # when the copy stream is free
    event = profile.kernel_launch_s  # one event node (gate or fence) of `offloadctl.rewriting.streams`
    baseline = serialized = 0.0
    node_seconds = costs.seconds
    done = 0  # the steps before this one are counted
    for s in [*busy, steps]:
        for cost in map(node_seconds.__getitem__, program.positions[done:s]):
            baseline += cost
            serialized += cost
            compute += cost
        if s == steps:
            break
        done = s + 1
        kind = program.kinds[s]
        reads = program.reads[s]
        ready = 0.0
        if copied and not copied.isdisjoint(reads):
            ready = max((end[copy_of[t]] for t in reads if t in copy_of), default=0.0)
        if kind == "node":
            cost = node_seconds[program.positions[s]]
            baseline += cost
            serialized += cost
            compute = max(compute, ready) + cost
            end[s] = compute
        else:
            cost = links[kind].time(program.sizes[program.reads[s][0]])
            serialized += cost
            end[s] = max(compute, copy_free, ready) + event + cost  # after its gate on the copy stream
            copy_free = end[s]
            for t in program.writes[s]:
                copy_of[t] = s
        for copy in waits.get(s, ()):
            compute = max(compute, end[copy]) + event  # the fence: compute waits for the D2H
    # a model with copies runs without ConstantFolding (order pins and offloaded weights need it off):
    # what that costs the model, when a profile measured above --opt-level disable says
    unfolded = profile.measured.unfolded_s if profile.measured is not None and len(copy_of) else 0.0
    # the order pins' nodes (Shape, Concat, Reshape, Optional...) move no data and run on the compute
    # stream: each costs what one more trivial node adds to a run where the profile measured that
    if profile.measured is not None:
        unfolded += program.pin_nodes * profile.kernel_launch_s
    overlapped = max(compute + unfolded, copy_free)
    fixed = profile.run_overhead_s
    return TimeFigures(
        baseline=baseline + fixed,
        serialized=serialized + unfolded + fixed,
        overlapped=overlapped + fixed,
        nodes=len(node_seconds),
        measured_nodes=costs.measured,
    )


def scratched(analysis: Analysis, profile: Profile | str | None) -> Analysis:
    """``analysis`` counting the kernel scratch a measured profile records (`NodeTime.scratch_bytes`) in
    every memory figure (`offloadctl.analysis.graph.with_scratch`): each node the profile measured (same
    name, op type and input shapes) holds its scratch while it runs. Without a measured profile, the
    analysis without scratch."""
    prof = load_profile(profile) if isinstance(profile, str) else profile
    measured = prof.measured if prof is not None else None
    found: dict[int, int] = {}
    if measured is not None:
        infos = analysis.infos

        def shape_of(name: str) -> tuple[int, ...] | None:
            return _dims(infos, name)

        for p, node in enumerate(analysis.nodes):
            hit = measured.nodes.get(_profiled_name(analysis, p))
            if hit is not None and hit.scratch_bytes and _measured_match(hit, node, shape_of):
                found[p] = hit.scratch_bytes
    return with_scratch(analysis, found)


def scratched_by_name(analysis: Analysis, scratch: Mapping[str, int]) -> Analysis:
    """`scratched` from kernel scratch by node name (as onnxruntime names nodes:
    `offloadctl.running.allocator.node_scratch`), for a model measured without a profile."""
    found = {
        p: scratch[name] for p in range(analysis.num_positions) if scratch.get(name := _profiled_name(analysis, p))
    }
    return with_scratch(analysis, found)


def _profiled_name(analysis: Analysis, position: int) -> str:
    """A node's name as onnxruntime's profiling and statistics name it (OpType_INDEX when unnamed)."""
    node = analysis.nodes[position]
    return node.name or f"{node.op_type}_{analysis.file_index[position]}"
