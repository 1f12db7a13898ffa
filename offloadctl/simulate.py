"""The memory and time simulator: what a plan (or a rewritten model) does to peak device memory and run time.

This module owns the memory model, the time model and their report (`SimResult`). It reads an
`Analysis`, optionally a scheduled plan, and a device profile (`offloadctl.profiles`); it never
edits ONNX.

Program. The simulator walks a *program*: the steps the device runs, in onnxruntime's
PRIORITY_BASED order. Without a plan the steps are the model's nodes (positions 0..n-1). With a
plan, copies are steps too: for every position q, first the H2Ds placed ``h2d_before: q`` (in plan
order, then reload-group order), then node q, then the D2Hs placed ``d2h_after: q``; H2Ds placed
before ``num_positions`` run after the last node. A model that is already rewritten (it contains
``MemcpyToHost``/``MemcpyFromHost`` nodes) is walked in its own order, and its "before" is the same
model with the copies taken out (each copy output read as the tensor it copies). Copy steps carry
the position of the node they follow (D2H) or precede (H2D) so reports can name original nodes.

Memory rules (onnxruntime's, stated once in `offloadctl.timeline`; this module applies them to
steps that include copies):

- A tensor is allocated on the device when the step producing it runs and freed after its last
  reader; a graph output lives to the end; a graph input lives from the first step to its last
  reader (or the end if it is also an output); an output nobody reads is freed after its producer.
- Weights (initializers, Constant nodes) are resident for the whole run unless offloaded; a weight
  that no node reads and that is not a graph output takes no memory (onnxruntime drops it).
- Memory inside subgraphs: body weights are resident for the whole run; a node with bodies also
  holds their working set while it runs (an If its larger branch, a Loop/Scan one iteration).
- An offloaded activation T: its device buffer is freed only after its last device reader, its
  D2H (an extra reader) and the plan's release point (``release_after``) have all passed. Its host
  copy lives from the D2H to the last H2D reading it (the end, for a graph output). Each reload
  group's copy lives on the device from its H2D to the group's last use; the copy feeding an
  offloaded graph output lives from its H2D to the end.
- An offloaded weight lives on the host for the whole run; each reload group's device copy lives
  from its H2D to the group's last use.
- A rewritten model follows the same rules with the release point at the D2H (what onnxruntime
  does, and what a plan with release distance 0 asks for).

Accounting convention: the *working set* of step k is every tensor alive while step k runs: all
tensors allocated at a step <= k and freed at a step >= k, plus resident weights. A step's outputs
are allocated before its inputs are freed, so both count at step k. "Live in" of step k excludes
what step k allocates; "live out" excludes what step k frees. The peak is the largest working set;
ties go to the earliest step. Host memory is accounted the same way.

Not modelled: onnxruntime's buffer reuse inside an op (in-place kernels, Reshape/Squeeze aliases),
the arena's rounding and fragmentation, and kernel workspaces. An outer tensor a subgraph reads
counts as read by the parent node. Tensors whose size is unknown count as
0 bytes in every figure; `SimResult.unknown_tensors` lists them so the figures are never silently
low.

Lower bound (`offloadctl.timeline.step_bound`): the largest working set of a single node on its own
(its inputs, including the weights it reads, its outputs, the memory inside its subgraphs, the graph
inputs still to be read and the subgraph weights). The end of the run counts as one more such step
whose inputs are the graph outputs, which must all be on the device when the run returns. No plan
can go below it.

Time model (needs a profile): a node the profile has measured (a measured profile, written by
``offloadctl profile``, holding a node of the same name, op type and input shapes; copy nodes are
never matched, so a rewritten model takes its original's times) takes its measured duration plus
the profile's ``node_overhead_s`` (what the executor spends per node beyond the kernel, less the
profiler's own cost inside each event; never below 0 in total). Any other node takes
``max(flops / peak_flops, bytes / mem_bandwidth) + kernel_launch_s``. FLOPs are counted for
MatMul/FusedMatMul/Gemm (2*M*N*K), Conv (2 * output elements * Cin/group * kernel size),
ConvTranspose (2 * input elements * Cout/group * kernel size) and attention ops (Attention, MultiHeadAttention, GroupQueryAttention: 4*B*Sq*Skv*hidden, plus the
QKV projection for com.microsoft Attention); every other node is counted by the bytes it reads and
writes. A copy takes ``latency_s + bytes / bandwidth`` of its direction (in a measured profile the
in-line cost of a copy node, from the measured fit). Every figure includes the profile's
``run_overhead_s`` once (the fixed cost of a session run; 0 in datasheet profiles). Three figures:

- baseline: the nodes alone, no copies.
- serialized: copies run in line on the compute stream (onnxruntime today): baseline + every copy.
- overlapped: one copy stream per direction, FIFO. A copy is issued when the compute stream reaches
  its place and starts when its stream is free (an H2D also waits for the D2H of its tensor); a
  node waits for the copies whose outputs it reads; at each offloaded buffer's release point the
  compute stream waits for that buffer's D2H (HyperOffload's release event). The run ends when the
  compute stream and both copy streams are done.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import onnx

from offloadctl.analysis import Analysis
from offloadctl.errors import OffloadError
from offloadctl.plan import check_plan_model
from offloadctl.plancheck import check_plan_for_model
from offloadctl.profiles import DEFAULT_PROFILE, NodeTime, Profile, load_profile
from offloadctl.timeline import step_bound, subgraph_memory, sweep, weight_is_resident

__all__ = [
    "COPY_OPS",
    "lower_bound",
    "step_label",
    "MemoryTrace",
    "TimeFigures",
    "SimResult",
    "simulate",
    "peak_memory",
    "is_rewritten",
    "node_flops",
    "node_seconds",
    "plot_timeline",
]

D2H_OP = "MemcpyToHost"
H2D_OP = "MemcpyFromHost"
COPY_OPS = (D2H_OP, H2D_OP)
DEVICE, HOST = 0, 1
ATTENTION_OPS = frozenset({"Attention", "MultiHeadAttention", "GroupQueryAttention"})
MATMUL_OPS = frozenset({"MatMul", "FusedMatMul"})
CONVENTION = (
    "working set of a step = every tensor alive while it runs (outputs allocated before inputs are freed) "
    "+ resident weights; unknown-size tensors count as 0 bytes"
)


def _copy_kind(node: onnx.NodeProto) -> str | None:
    if node.domain in ("", "ai.onnx") and node.op_type in COPY_OPS:
        return "d2h" if node.op_type == D2H_OP else "h2d"
    return None


def is_rewritten(analysis: Analysis) -> bool:
    """True when the model already contains MemcpyToHost/MemcpyFromHost nodes."""
    return any(_copy_kind(n) is not None for n in analysis.nodes)


# --------------------------------------------------------------------------------------------- base


@dataclass
class _Base:
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
    use_positions: dict[int, set[int]]
    canon: Callable[[str], str]  # node input name -> the tensor it stands for
    infos: dict[str, Any]
    unknown_set: set[str] = field(default_factory=set)
    resident: list[bool] = field(default_factory=list)  # weights that occupy memory (read, or graph outputs)
    inner: list[int] = field(default_factory=list)  # per position: memory inside its subgraphs while it runs
    subgraph_weights: int = 0  # bytes of subgraph weights, resident for the whole run
    rewritten: bool = False  # the model contains copy nodes
    before: _Program | None = None
    costs: dict[str, Any] = field(default_factory=dict)  # time model: profile key -> _Costs


def _interner() -> tuple[list[str], dict[str, int], Callable[[str], int]]:
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


def _new_base(analysis: Analysis) -> _Base:
    copy_nodes = {p for p, node in enumerate(analysis.nodes) if _copy_kind(node) is not None}
    source: dict[str, str] = {}
    for p in copy_nodes:
        node = analysis.nodes[p]
        if len(node.input) != 1 or len(node.output) != 1 or not node.input[0] or not node.output[0]:
            raise OffloadError(
                f"copy node {analysis.node_names[p]!r} ({node.op_type}) in {analysis.loaded.path} must have one "
                "input and one output",
                hint="re-create the model with offloadctl apply",
            )
        source[node.output[0]] = node.input[0]

    def canon(name: str) -> str:
        seen = 0
        while name in source and seen <= len(source):
            name = source[name]
            seen += 1
        return name

    names, index, intern = _interner()

    def canonical(name: str) -> int:
        return intern(canon(name))

    tid = canonical if source else intern  # without copies every name stands for itself

    for name in analysis.graph_inputs:
        tid(name)
    for name in sorted(analysis.weights):
        tid(name)
    positions = [p for p in range(analysis.num_positions) if p not in copy_nodes]
    reads: list[list[int]] = []
    writes: list[list[int]] = []
    where = {p: k for k, p in enumerate(positions)}
    reads = [[] for _ in positions]
    for name, uses in analysis.uses.items():
        t = None
        for use in uses:
            k = where.get(use.position)
            if k is not None:
                if t is None:
                    t = tid(name)
                reads[k].append(t)
    for k, p in enumerate(positions):
        writes.append([tid(o) for o in analysis.nodes[p].output if o])
    for name in analysis.graph_outputs:
        tid(name)
    count = len(names)
    sizes = [0] * count
    unknown: list[str] = []
    for t, name in enumerate(names):
        info = analysis.infos.get(name)
        size = info.bytes if info is not None else None
        if size is None:
            unknown.append(name)
        else:
            sizes[t] = size
    weight = [False] * count
    for name in analysis.weights:
        weight[index[canon(name)]] = True
    graph_input = [False] * count
    for name in analysis.graph_inputs:
        graph_input[index[canon(name)]] = True
    graph_output = [False] * count
    for name in analysis.graph_outputs:
        graph_output[index[canon(name)]] = True
    use_positions: dict[int, set[int]] = {}
    for k, lst in enumerate(reads):
        for t in lst:
            use_positions.setdefault(t, set()).add(k)
    resident = [weight[t] and weight_is_resident(t in use_positions, graph_output[t]) for t in range(count)]
    sub = subgraph_memory(analysis)
    unknown += sub.unknown
    return _Base(
        n=len(positions),
        labels=[analysis.node_names[p] for p in positions],
        nodes=[analysis.nodes[p] for p in positions],
        names=names,
        index=index,
        sizes=sizes,
        unknown=unknown,
        weight=weight,
        graph_input=graph_input,
        graph_output=graph_output,
        reads=reads,
        writes=writes,
        use_positions=use_positions,
        canon=canon,
        infos=analysis.infos,
        unknown_set=set(unknown),
        resident=resident,
        inner=[sub.at(p) for p in positions],
        subgraph_weights=sub.weight_bytes,
        rewritten=bool(copy_nodes),
    )


_BASES: dict[int, tuple[weakref.ref, _Base]] = {}


def _base(analysis: Analysis) -> _Base:
    """The base of an analysis, computed once per Analysis object."""
    key = id(analysis)
    hit = _BASES.get(key)
    if hit is not None and hit[0]() is analysis:
        return hit[1]
    base = _new_base(analysis)
    _BASES[key] = (weakref.ref(analysis, lambda _ref, key=key: _BASES.pop(key, None)), base)
    return base


# ------------------------------------------------------------------------------------------ program


@dataclass
class _Program:
    """Steps in run order and the tensors they read and write (ids index the tensor arrays)."""

    kinds: list[str]  # "node" | "d2h" | "h2d"
    positions: list[int]  # node: its position; d2h: the position it follows; h2d: the one it precedes
    reads: list[list[int]]
    writes: list[list[int]]
    names: list[str]
    sizes: list[int]
    place: list[int]  # DEVICE or HOST
    resident: list[bool]  # alive for the whole run (weights)
    from_start: list[bool]  # graph inputs
    to_end: list[bool]  # graph outputs
    inner: list[int] = field(default_factory=list)  # per step: memory inside the node's subgraphs
    always: int = 0  # device bytes resident for the whole run besides the tensors (subgraph weights)
    hold: dict[int, int] = field(default_factory=dict)  # tensor -> step its buffer is kept through
    waits: list[tuple[int, int]] = field(default_factory=list)  # (after step, wait for copy step)
    step_labels: list[str] | None = None  # rewritten models: the node labels

    def label(self, base: _Base, s: int) -> str:
        """A readable name for step ``s``."""
        if self.step_labels is not None:
            return self.step_labels[s]
        kind, pos = self.kinds[s], self.positions[s]
        if kind == "node":
            return base.labels[pos]
        tensor = self.names[self.reads[s][0]] if kind == "d2h" else self.names[self.writes[s][0]]
        tensor = tensor.split("@", 1)[0]
        if kind == "d2h":
            return f"D2H({tensor}) after {base.labels[pos]}"
        return f"H2D({tensor}) " + (f"before {base.labels[pos]}" if pos < base.n else "at the end")


def _before_program(base: _Base) -> _Program:
    if base.before is None:
        base.before = _Program(
            kinds=["node"] * base.n,
            positions=list(range(base.n)),
            reads=base.reads,
            writes=base.writes,
            names=base.names,
            sizes=base.sizes,
            place=[DEVICE] * len(base.names),
            resident=base.resident,
            from_start=base.graph_input,
            to_end=base.graph_output,
            inner=base.inner,
            always=base.subgraph_weights,
        )
    return base.before


def _plan_error(plan_source: str, message: str) -> OffloadError:
    return OffloadError(
        f"{plan_source}: {message}",
        hint="re-create the plan for this model with offloadctl plan (or prefetch for the last stage)",
    )


def _plan_program(base: _Base, plan: dict[str, Any], source: str = "plan") -> _Program:
    """The program of the original model with the plan's copies inserted."""
    n = base.n
    if plan.get("stage") != "scheduled":
        raise OffloadError(
            f"{source} is at stage {plan.get('stage')!r}; simulating needs a scheduled plan",
            hint="run offloadctl prefetch on it (or offloadctl plan to do every stage)",
        )
    if plan["model"]["num_positions"] != n:
        raise _plan_error(source, f"it counts {plan['model']['num_positions']} positions, the model has {n}")
    names = list(base.names)
    sizes = list(base.sizes)
    place = [DEVICE] * len(names)
    resident = list(base.resident)
    from_start = list(base.graph_input)
    to_end = list(base.graph_output)
    pre: list[list[tuple[int, int]]] = [[] for _ in range(n + 1)]
    post: list[list[tuple[int, int]]] = [[] for _ in range(n)]
    remap: dict[int, dict[int, int]] = {}  # position -> {tensor: copy read there instead}
    releases: list[tuple[int, int, int]] = []  # (tensor, host copy, release position)

    def new_tensor(name: str, size: int, where: int, end: bool = False) -> int:
        names.append(name)
        sizes.append(size)
        place.append(where)
        resident.append(False)
        from_start.append(False)
        to_end.append(end)
        return len(names) - 1

    for off in plan["offloads"]:
        name = off["tensor"]
        t = base.index.get(name)
        if t is None:
            raise _plan_error(source, f"offloaded tensor {name!r} is not in the model")
        is_act = off["kind"] == "activation"
        if is_act == base.weight[t] or (is_act and base.graph_input[t]):
            raise _plan_error(source, f"tensor {name!r} is not a {off['kind']} of the model")
        planned = {u["position"] for u in off["device_uses"]}
        for g in off["reload_groups"]:
            planned |= {u["position"] for u in g["uses"]}
        if planned != base.use_positions.get(t, set()):
            raise _plan_error(source, f"the uses of {name!r} in the plan differ from the model's")
        size = int(off["bytes"]) if name in base.unknown_set else sizes[t]
        if is_act:
            d2h = off["d2h_after"]
            producer = off["producer"]["position"]
            if not producer <= d2h < n:
                raise _plan_error(source, f"the D2H of {name!r} (after {d2h}) runs before its producer ({producer})")
            if any(g["h2d_before"] is not None and g["h2d_before"] <= d2h for g in off["reload_groups"]):
                raise _plan_error(source, f"an H2D of {name!r} runs before its D2H (after position {d2h})")
            src = new_tensor(f"{name}@host", size, HOST)
            post[d2h].append((t, src))
            release = off["release_after"]
            releases.append((t, src, d2h if release is None else release))
        else:
            if off["device_uses"]:
                raise _plan_error(source, f"weight {name!r} is offloaded but some uses read it on the device")
            src = t
            place[t] = HOST
        for k, g in enumerate(off["reload_groups"]):
            h2d = g["h2d_before"]
            if h2d is None or not 0 <= h2d <= g["uses"][0]["position"]:
                raise _plan_error(source, f"reload group {k} of {name!r} has no valid h2d_before")
            dst = new_tensor(f"{name}@h2d{k}", size, DEVICE)
            pre[h2d].append((src, dst))
            for u in g["uses"]:
                remap.setdefault(u["position"], {})[t] = dst
        if is_act and off["graph_output"] and off["output_h2d_before"] is not None:
            to_end[t] = False
            dst = new_tensor(f"{name}@output", size, DEVICE, end=True)
            pre[off["output_h2d_before"]].append((src, dst))

    kinds: list[str] = []
    positions: list[int] = []
    reads: list[list[int]] = []
    writes: list[list[int]] = []
    node_step = [0] * n
    d2h_step: dict[int, int] = {}
    for q in range(n + 1):
        for src, dst in pre[q]:
            kinds.append("h2d")
            positions.append(q)
            reads.append([src])
            writes.append([dst])
        if q == n:
            break
        node_step[q] = len(kinds)
        kinds.append("node")
        positions.append(q)
        swap = remap.get(q)
        reads.append([swap.get(t, t) for t in base.reads[q]] if swap else base.reads[q])
        writes.append(base.writes[q])
        for src, dst in post[q]:
            d2h_step[src] = len(kinds)
            kinds.append("d2h")
            positions.append(q)
            reads.append([src])
            writes.append([dst])
    program = _Program(kinds, positions, reads, writes, names, sizes, place, resident, from_start, to_end)
    program.inner = [base.inner[p] if kind == "node" else 0 for kind, p in zip(kinds, positions)]
    program.always = base.subgraph_weights
    last = len(kinds) - 1
    for t, _src, release in releases:
        d = d2h_step[t]
        point = last if release >= n else max(node_step[release], d)
        program.hold[t] = point
        program.waits.append((point, d))
    return program


def _rewritten_program(analysis: Analysis, base: _Base) -> _Program:
    """The program of a rewritten model: its own nodes, copies included, in its own order."""
    kinds: list[str] = []
    positions: list[int] = []
    originals = 0
    for node in analysis.nodes:
        kind = _copy_kind(node) or "node"
        kinds.append(kind)
        if kind == "node":
            positions.append(originals)
            originals += 1
        else:
            positions.append(originals - 1 if kind == "d2h" else originals)
    names, index, tid = _interner()

    for name in analysis.graph_inputs:
        tid(name)
    for name in sorted(analysis.weights):
        tid(name)
    reads: list[list[int]] = [[] for _ in kinds]
    readers: dict[int, set[str]] = {}
    for name, uses in analysis.uses.items():
        t = tid(name)
        for use in uses:
            reads[use.position].append(t)
            readers.setdefault(t, set()).add(kinds[use.position])
    writes = [[tid(o) for o in node.output if o] for node in analysis.nodes]
    for name in analysis.graph_outputs:
        tid(name)
    count = len(names)
    sizes = [0] * count
    for t, name in enumerate(names):
        # a copy has the size of what it copies (apply writes value_info, but do not rely on it)
        size = base.sizes[base.index[base.canon(name)]] if base.canon(name) in base.index else None
        info = analysis.infos.get(name)
        own = info.bytes if info is not None else None
        sizes[t] = own if own is not None else (size or 0)
    weights = set(analysis.weights)
    place = [DEVICE] * count
    for s, kind in enumerate(kinds):
        if kind == "d2h":
            for t in writes[s]:
                place[t] = HOST
    for name in list(weights) + list(analysis.graph_inputs):
        t = index[name]
        if readers.get(t) == {"h2d"}:
            place[t] = HOST  # an offloaded weight (or input) only copies read
    outputs = set(analysis.graph_outputs)
    resident = [
        name in weights and weight_is_resident(index[name] in readers, name in outputs) for name in names
    ]
    from_start = [False] * count
    for name in analysis.graph_inputs:
        from_start[index[name]] = True
    to_end = [False] * count
    for name in analysis.graph_outputs:
        to_end[index[name]] = True
    sub = subgraph_memory(analysis)
    program = _Program(
        kinds, positions, reads, writes, names, sizes, place, resident, from_start, to_end,
        inner=[sub.at(s) for s in range(len(kinds))], always=sub.weight_bytes,
        step_labels=list(analysis.node_names),
    )
    last_node_read: dict[int, int] = {}
    producer_step: dict[int, int] = {}
    for s, kind in enumerate(kinds):
        for t in writes[s]:
            producer_step[t] = s
        if kind == "node":
            for t in reads[s]:
                last_node_read[t] = s
    for s, kind in enumerate(kinds):
        if kind == "d2h" and reads[s]:
            t = reads[s][0]
            program.waits.append((max(s, last_node_read.get(t, producer_step.get(t, s))), s))
    return program


# ------------------------------------------------------------------------------------------- memory


def _intervals(program: _Program) -> tuple[list[int], list[tuple[int, int, int, int, bool, bool]]]:
    """Resident bytes per place, and (place, size, alloc, free, from_start, to_end) per other tensor."""
    steps = len(program.kinds)
    alloc = [-1] * len(program.names)
    last = [-1] * len(program.names)
    for s in range(steps):
        for t in program.writes[s]:
            alloc[t] = s
        for t in program.reads[s]:
            last[t] = s
    resident = [program.always, 0]
    spans = []
    hold = program.hold
    for t, size in enumerate(program.sizes):
        where = program.place[t]
        if program.resident[t]:
            resident[where] += size
            continue
        start = program.from_start[t]
        a = 0 if start else alloc[t]
        if a < 0 or steps == 0:
            continue
        end = program.to_end[t]
        f = steps - 1 if end else max(a, last[t], hold.get(t, -1))
        spans.append((where, size, a, f, start, end))
    return resident, spans


def _working_sets(program: _Program, where: int = DEVICE) -> list[int]:
    """Bytes alive during each step at ``where`` (DEVICE or HOST)."""
    resident, spans = _intervals(program)
    mine = [(a, f, size) for place, size, a, f, _, _ in spans if place == where]
    alive = sweep(len(program.kinds), [a for a, _, _ in mine], [f for _, f, _ in mine], [b for _, _, b in mine])
    alive += resident[where]
    if where == DEVICE and program.inner:
        alive += program.inner
    return alive.tolist()


def _argmax(values: Sequence[int]) -> int | None:
    best = None
    for s, v in enumerate(values):
        if best is None or v > values[best]:
            best = s
    return best


@dataclass(frozen=True)
class MemoryTrace:
    """Device and host bytes at every step of one program (see the module docstring)."""

    kinds: list[str]
    positions: list[int]
    labels: list[str]
    device: list[int]  # working set during each step
    device_in: list[int]  # alive when the step starts
    device_out: list[int]  # alive when the step ends
    host: list[int]  # host working set during each step
    resident_device: int  # weights resident on the device
    resident_host: int  # weights resident on the host

    @property
    def peak_step(self) -> int | None:
        return _argmax(self.device)

    @property
    def peak_bytes(self) -> int:
        s = self.peak_step
        return self.device[s] if s is not None else self.resident_device

    @property
    def host_peak_bytes(self) -> int:
        return max(self.host, default=self.resident_host)

    def at(self, step: int | None) -> dict[str, Any]:
        """Where a step is: step index, kind, position and a readable label."""
        if step is None:
            return {"step": None, "kind": None, "position": None, "node": None}
        return {"step": step, "kind": self.kinds[step], "position": self.positions[step], "node": self.labels[step]}


def _trace(program: _Program, base: _Base) -> MemoryTrace:
    resident, spans = _intervals(program)
    steps = len(program.kinds)
    diffs = [[0] * (steps + 1), [0] * (steps + 1)]
    alloc_at = [0] * steps
    free_at = [0] * steps
    for place, size, a, f, start, end in spans:
        diffs[place][a] += size
        diffs[place][f + 1] -= size
        if place == DEVICE:
            if not start:
                alloc_at[a] += size
            if not end:
                free_at[f] += size
    device, host = [], []
    run = list(resident)
    inner = program.inner or [0] * steps
    for s in range(steps):
        run[DEVICE] += diffs[DEVICE][s]
        run[HOST] += diffs[HOST][s]
        device.append(run[DEVICE] + inner[s])
        host.append(run[HOST])
    return MemoryTrace(
        kinds=list(program.kinds),
        positions=list(program.positions),
        labels=[program.label(base, s) for s in range(steps)],
        device=device,
        device_in=[device[s] - alloc_at[s] for s in range(steps)],
        device_out=[device[s] - free_at[s] for s in range(steps)],
        host=host,
        resident_device=resident[DEVICE],
        resident_host=resident[HOST],
    )


def _lower_bound(base: _Base) -> tuple[int, int | None]:
    # Graph inputs are never offloaded: each one is on the device from the start to its last read,
    # so it counts in every step up to there, read by the step or not.
    is_input = [i and not w for i, w in zip(base.graph_input, base.weight)]
    inputs = [(base.sizes[t], max(base.use_positions[t])) for t, i in enumerate(is_input) if i and base.use_positions.get(t)]
    positions: list[int] = []
    tensors: list[int] = []
    for p in range(base.n):
        for t in base.reads[p] + base.writes[p]:
            if not is_input[t]:
                positions.append(p)
                tensors.append(t)
    end = sum(base.sizes[t] for t in range(len(base.names)) if base.graph_output[t])
    inner = {p: b for p, b in enumerate(base.inner) if b}
    return step_bound(base.n, positions, tensors, base.sizes, inputs, end, inner, base.subgraph_weights)


def lower_bound(analysis: Analysis) -> tuple[int, int | None]:
    """The largest single-step working set: (bytes, position), position num_positions = the end.

    A node's working set is the distinct tensors it reads (inputs, weights, outer-scope reads of
    its subgraphs) and writes, plus the graph inputs still to be read after it (they are never
    offloaded); the end of the run reads every graph output. No plan can bring the peak below it.
    None as position for a model without nodes or outputs.
    """
    return _lower_bound(_base(analysis))


def step_label(analysis: Analysis, position: int | None) -> str | None:
    """The node label at a position; the end of the run for ``num_positions``."""
    if position is None:
        return None
    if position >= analysis.num_positions:
        return "end of run (graph outputs)"
    return analysis.node_names[position]


def _program_for(analysis: Analysis, plan: dict[str, Any] | None, source: str) -> tuple[_Base, _Program]:
    base = _base(analysis)
    if base.rewritten:
        if plan is not None:
            raise OffloadError(
                f"{analysis.loaded.path} already contains MemcpyToHost/MemcpyFromHost copies; it cannot take a plan",
                hint="simulate the rewritten model on its own, or the original model with the plan",
            )
        return base, _rewritten_program(analysis, base)
    if plan is not None:
        check_plan_model(plan, analysis.loaded.sha256, analysis.loaded.path)
        if plan.get("stage") == "scheduled":
            check_plan_for_model(plan, analysis)  # what apply accepts, and nothing else
    if plan is None or not plan["offloads"]:
        if plan is not None:
            _plan_program(base, plan, source)  # checks stage and positions
        return base, _before_program(base)
    return base, _plan_program(base, plan, source)


def peak_memory(analysis: Analysis, plan: dict[str, Any] | None = None) -> tuple[int, int | None]:
    """Peak device bytes of the model with ``plan`` (None: without one), and where it occurs.

    Cheap enough to call in a loop: O(nodes + uses + copies) per call; the per-model part is
    computed once per `Analysis` object.

    Returns:
        (peak bytes, position): the position of the node at the peak, or for a copy step the
        position it is anchored to (D2H: the node it follows; H2D: the node it precedes, or
        num_positions at the end); None for a model without nodes.
    """
    _, program = _program_for(analysis, plan, "plan")
    device = _working_sets(program)
    s = _argmax(device)
    if s is None:
        return _intervals(program)[0][DEVICE], None
    return device[s], program.positions[s]


# --------------------------------------------------------------------------------------------- time


def _dims(infos: dict[str, Any], name: str) -> tuple[int, ...] | None:
    info = infos.get(name) if name else None
    if info is None or info.shape is None or not all(isinstance(d, int) for d in info.shape):
        return None
    return tuple(info.shape)


def node_flops(node: onnx.NodeProto, shape_of: Callable[[str], tuple[int, ...] | None]) -> int | None:
    """Floating-point operations of a compute-bound node; None for other ops or unknown shapes."""
    op = node.op_type
    ins = list(node.input)
    out = shape_of(node.output[0]) if node.output else None

    def inp(i: int) -> tuple[int, ...] | None:
        return shape_of(ins[i]) if i < len(ins) and ins[i] else None

    if op in MATMUL_OPS:
        a = inp(0)
        if a is None or out is None or not a:
            return None
        return 2 * math.prod(out) * a[-1]
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
class _Costs:
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


def _node_costs(base: _Base, profile: Profile) -> _Costs:
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
    costs = []
    count = 0
    for p, node in enumerate(base.nodes):
        hit = table.get(node.name) if node.name else None
        if hit is not None and _measured_match(hit, node, shape_of):
            costs.append(max(hit.seconds + offset, 0.0))
            count += 1
            continue
        moved = sum(base.sizes[t] for t in base.reads[p]) + sum(base.sizes[t] for t in base.writes[p])
        flops = node_flops(node, shape_of)
        seconds = moved / profile.mem_bandwidth
        if flops:
            first = next((i for i in node.input if i), "")
            info = infos.get(first) or infos.get(base.canon(first))
            dtype = info.dtype if info is not None else "default"
            seconds = max(seconds, flops / profile.flops_for(dtype))
        costs.append(seconds + profile.kernel_launch_s)
    result = _Costs(costs, count, measured)
    base.costs[key] = result
    return result


def node_seconds(analysis: Analysis, profile: Profile | str = DEFAULT_PROFILE) -> list[float]:
    """Seconds of each node of the model without its copies, in execution order, as the time model prices them.

    The budget strategy uses them to see how much compute can hide a copy on a separate stream.
    """
    prof = load_profile(profile) if isinstance(profile, str) else profile
    return list(_node_costs(_base(analysis), prof).seconds)


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
        ratio = (lambda t: t / self.baseline if self.baseline > 0 else 1.0)
        return {"serialized": ratio(self.serialized), "overlapped": ratio(self.overlapped)}


def _times(program: _Program, costs: _Costs, profile: Profile) -> TimeFigures:
    links = {"h2d": profile.h2d, "d2h": profile.d2h}
    steps = len(program.kinds)
    waits: dict[int, list[int]] = {}
    for after, copy in program.waits:
        waits.setdefault(after, []).append(copy)
    copy_of: dict[int, int] = {}  # tensor -> the copy step that wrote it
    end = [0.0] * steps
    compute = 0.0
    stream_free = {"h2d": 0.0, "d2h": 0.0}
    baseline = serialized = 0.0
    node_seconds = costs.seconds
    for s in range(steps):
        kind = program.kinds[s]
        ready = max((end[copy_of[t]] for t in program.reads[s] if t in copy_of), default=0.0)
        if kind == "node":
            cost = node_seconds[program.positions[s]]
            baseline += cost
            serialized += cost
            compute = max(compute, ready) + cost
            end[s] = compute
        else:
            cost = links[kind].time(program.sizes[program.reads[s][0]])
            serialized += cost
            end[s] = max(compute, stream_free[kind], ready) + cost
            stream_free[kind] = end[s]
            for t in program.writes[s]:
                copy_of[t] = s
        for copy in waits.get(s, ()):
            compute = max(compute, end[copy])
    overlapped = max([compute, *stream_free.values()])
    fixed = profile.run_overhead_s
    return TimeFigures(
        baseline=baseline + fixed,
        serialized=serialized + fixed,
        overlapped=overlapped + fixed,
        nodes=len(node_seconds),
        measured_nodes=costs.measured,
    )


# ------------------------------------------------------------------------------------------- result


@dataclass(frozen=True)
class SimResult:
    """What the simulator found; `to_json` gives the document `offloadctl simulate --json` prints."""

    model: str
    rewritten: bool
    plan_path: str | None
    before: MemoryTrace
    after: MemoryTrace
    lower_bound_bytes: int
    lower_bound_position: int | None
    lower_bound_node: str | None
    transfer_bytes: dict[str, int]
    copies: dict[str, int]
    unknown_tensors: list[str]
    profile: Profile | None
    times: TimeFigures | None

    @property
    def peak_before(self) -> int:
        return self.before.peak_bytes

    @property
    def peak_after(self) -> int:
        return self.after.peak_bytes

    def timeline(self) -> list[dict[str, Any]]:
        """One row per step of the "after" program, with the unplanned working set at node steps."""
        rows = []
        after = self.after
        for s in range(len(after.kinds)):
            pos = after.positions[s]
            rows.append(
                {
                    "step": s,
                    "kind": after.kinds[s],
                    "position": pos,
                    "node": after.labels[s],
                    "before": self.before.device[pos] if after.kinds[s] == "node" else None,
                    "after": after.device[s],
                    "host": after.host[s],
                }
            )
        return rows

    def to_json(self, *, timeline_limit: int | None = 10_000) -> dict[str, Any]:
        steps = len(self.after.kinds)
        doc: dict[str, Any] = {
            "model": self.model,
            "rewritten": self.rewritten,
            "plan": self.plan_path,
            "convention": CONVENTION,
            "peak_bytes": {
                "before": self.peak_before,
                "after": self.peak_after,
                "saved": self.peak_before - self.peak_after,
            },
            "peak_at": {"before": self.before.at(self.before.peak_step), "after": self.after.at(self.after.peak_step)},
            "lower_bound_bytes": self.lower_bound_bytes,
            "lower_bound_at": {"position": self.lower_bound_position, "node": self.lower_bound_node},
            "resident_weight_bytes": {"before": self.before.resident_device, "after": self.after.resident_device},
            "transfer_bytes": dict(self.transfer_bytes),
            "copies": dict(self.copies),
            "host_peak_bytes": self.after.host_peak_bytes,
            "unknown_size": {
                "count": len(self.unknown_tensors),
                "counted_as_bytes": 0,
                "tensors": self.unknown_tensors[:100],
            },
            "profile": self.profile.to_json() if self.profile is not None else None,
            "time_s": None,
            "time_nodes": None,
            "stall_s": None,
            "slowdown": None,
        }
        if self.times is not None:
            t = self.times
            doc["time_s"] = {"baseline": t.baseline, "serialized": t.serialized, "overlapped": t.overlapped}
            doc["time_nodes"] = {
                "total": t.nodes,
                "measured": t.measured_nodes,
                "estimated": t.nodes - t.measured_nodes,
            }
            doc["stall_s"] = t.stall
            doc["slowdown"] = t.slowdown
        if timeline_limit is None or steps <= timeline_limit:
            doc["timeline"] = self.timeline()
        else:
            doc["timeline"] = None
            doc["timeline_omitted"] = f"{steps} steps > limit {timeline_limit} (raise it with --timeline-limit)"
        return doc


def simulate(
    analysis: Analysis,
    plan: dict[str, Any] | None = None,
    *,
    profile: Profile | str | None = DEFAULT_PROFILE,
    plan_source: str = "plan",
) -> SimResult:
    """Simulate memory (and time, with a profile) of a model, with a scheduled plan or without one.

    Args:
        analysis: the analysed model: an original model, or one already rewritten by apply.
        plan: a scheduled plan for this model (None: no plan). Not allowed for a rewritten model.
        profile: a `Profile`, a bundled profile name or a profile file; None skips the time model.
        plan_source: how to name the plan in error messages (e.g. its file).

    Raises:
        OffloadError: the plan is not scheduled, belongs to another model, or contradicts it.
    """
    prof = load_profile(profile) if isinstance(profile, str) else profile
    base, program = _program_for(analysis, plan, plan_source)
    before_program = _before_program(base)
    before = _trace(before_program, base)
    after = before if program is before_program else _trace(program, base)
    moved = {"d2h": 0, "h2d": 0}
    copies = {"d2h": 0, "h2d": 0}
    for s, kind in enumerate(program.kinds):
        if kind != "node":
            copies[kind] += 1
            moved[kind] += program.sizes[program.reads[s][0]]
    bound, at = _lower_bound(base)
    times = None
    if prof is not None:
        times = _times(program, _node_costs(base, prof), prof)
    return SimResult(
        model=str(analysis.loaded.path),
        rewritten=base.rewritten,
        plan_path=None,
        before=before,
        after=after,
        lower_bound_bytes=bound,
        lower_bound_position=at,
        lower_bound_node=(base.labels[at] if at < base.n else "end of run (graph outputs)") if at is not None else None,
        transfer_bytes=moved,
        copies=copies,
        unknown_tensors=list(base.unknown),
        profile=prof,
        times=times,
    )


# --------------------------------------------------------------------------------------------- plot


def plot_timeline(result: SimResult, path: str, *, title: str | None = None) -> None:
    """Write the device memory timeline before and after as PNG or SVG (needs matplotlib).

    Raises:
        OffloadError: matplotlib is missing or the file type is not .png/.svg.
    """
    from pathlib import Path

    from offloadctl.files import atomic_write

    out = Path(path)
    fmt = out.suffix.lower().lstrip(".")
    if fmt not in ("png", "svg"):
        raise OffloadError(f"plot file {out} must end in .png or .svg", hint="for example --plot memory.png")
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise OffloadError(
            "--plot needs matplotlib, which is not installed", hint="pip install 'offloadctl[plot]'"
        ) from None

    before, after = result.before, result.after
    scale, unit = _plot_unit(max(before.peak_bytes, after.peak_bytes, 1))
    fig = Figure(figsize=(11, 5.2), dpi=110, layout="constrained")
    ax = fig.add_subplot()
    n = len(before.kinds)
    # copies sit between nodes: a D2H after p at p+0.5, H2Ds before q just before q (spread in the gap)
    xs_after = _after_x(after)
    ax.step(range(n), [b / scale for b in before.device], where="mid", color="#888888", lw=1.6, label="before (no plan)")
    ax.fill_between(range(n), [b / scale for b in before.device], step="mid", color="#bbbbbb", alpha=0.35)
    if after is not before:
        ax.step(xs_after, [b / scale for b in after.device], where="mid", color="#1f77b4", lw=1.8, label="after (with plan)")
    ax.axhline(result.lower_bound_bytes / scale, color="#d62728", ls="--", lw=1, label="lower bound (largest single step)")
    for trace, xs, color, name in ((before, list(range(n)), "#555555", "before"), (after, xs_after, "#1f77b4", "after")):
        s = trace.peak_step
        if s is None or (name == "after" and after is before):
            continue
        ax.plot([xs[s]], [trace.device[s] / scale], "o", color=color, ms=6, zorder=5)
        right = xs[s] > 0.6 * n
        ax.annotate(
            f"{name} peak {trace.device[s] / scale:.2f} {unit}\nat #{trace.positions[s]} {trace.labels[s]}",
            (xs[s], trace.device[s] / scale),
            textcoords="offset points",
            xytext=(-8 if right else 8, 8),
            ha="right" if right else "left",
            fontsize=8,
            color=color,
        )
    h2d = [x for x, k in zip(xs_after, after.kinds) if k == "h2d"]
    d2h = [x for x, k in zip(xs_after, after.kinds) if k == "d2h"]
    if d2h:
        ax.plot(d2h, [0] * len(d2h), "v", color="#ff7f0e", ms=5, clip_on=False, label=f"D2H copies ({len(d2h)})")
    if h2d:
        ax.plot(h2d, [0] * len(h2d), "^", color="#2ca02c", ms=5, clip_on=False, label=f"H2D copies ({len(h2d)})")
    ax.set_xlabel("position in execution order (node)")
    ax.set_ylabel(f"device working set ({unit})")
    top = max(before.peak_bytes, after.peak_bytes, result.lower_bound_bytes) / scale
    ax.set_ylim(0, top * 1.18 if top > 0 else 1)
    ax.set_xlim(-0.5, max(n - 0.5, 0.5))
    ax.grid(True, alpha=0.3)
    saved = before.peak_bytes - after.peak_bytes
    pct = 100.0 * saved / before.peak_bytes if before.peak_bytes else 0.0
    ax.set_title(
        title
        or f"{Path(result.model).name}: peak {before.peak_bytes / scale:.2f} -> {after.peak_bytes / scale:.2f} {unit} "
        f"({pct:.0f}% less)",
        fontsize=11,
    )
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=5, fontsize=8, frameon=False)
    atomic_write(out, lambda tmp: fig.savefig(tmp, format=fmt))


def _plot_unit(peak: int) -> tuple[float, str]:
    for scale, unit in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if peak >= 2 * scale:
            return float(scale), unit
    return 1.0, "B"


def _after_x(trace: MemoryTrace) -> list[float]:
    """x coordinate of each step: nodes at their position, copies in the gaps next to them."""
    xs: list[float] = []
    steps = len(trace.kinds)
    s = 0
    while s < steps:
        kind, pos = trace.kinds[s], trace.positions[s]
        if kind == "node":
            xs.append(float(pos))
            s += 1
            continue
        # a run of copies in the same gap: spread them over (gap start, gap end)
        run = s
        while run < steps and trace.kinds[run] != "node":
            run += 1
        gap_end = float(trace.positions[run]) if run < steps else float(pos) + 0.5
        gap_start = gap_end - 1.0 if run < steps else float(pos) - 0.5
        count = run - s
        for k in range(count):
            xs.append(gap_start + (k + 1) / (count + 1))
        s = run
    return xs
