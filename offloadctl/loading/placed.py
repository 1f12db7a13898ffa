"""The graph onnxruntime runs when a device provider leaves some nodes to the CPU: the copies it
inserts between host and device memory.

A device provider (CUDA, CANN, WebGPU) runs on the CPU provider the nodes it has no kernel for, and
CUDA and CANN move there some whose inputs are all in host memory (`offloadctl.running.placement`).
onnxruntime's ``MemcpyTransformer`` (``transformer_memcpy.cc``) then inserts one copy per tensor
that crosses: a ``MemcpyFromHost`` for a tensor in host memory that a device node reads (made by a
host node, written to host memory by its kernel: ``Shape``, ``Size``, ``MemcpyToHost``; or a graph
input read on both sides), its device readers then reading the copy; a ``MemcpyToHost`` for a device
tensor a host node reads. The copies run on the device provider and are appended after every node:
graph inputs first, then the copies to the device in the order of their tensors' names, then those
to the host (its sets are ordered by name). Node indices decide both execution orders and the
executor's streams (`offloadctl.analysis.order.executor_order`), so the copies' places matter.

A rewrite for that device writes these copies itself where they are needed
(`offloadctl.rewriting.rewrite`): a tensor whose readers on the other side already read the graph's
own copy gets none here.

On the host, onnxruntime's ``InsertCastTransformer`` also wraps each float16 node the CPU has no
float16 kernel for (``Hardmax``, most of them) in Casts: a ``Cast`` to float32 of each float16 input,
and one of its float32 output back to float16 (``InsertedPrecisionFreeCast_{tensor}``). They are
appended after every node of the model too (before the copies), so under PRIORITY_BASED the nodes
waiting for them are held back as for the copies: a `Placement` names them.

`placed` builds that graph in memory from a `Placement`: the nodes that run on the host, the
tensors onnxruntime copies and the Casts it inserts, found by onnxruntime itself where the provider
runs here, or predicted. The nodes a rewrite adds for its order pins
run on the host when every tensor they read is in host memory, as on WebGPU, CUDA and CANN. The
graph is never written or run: the simulator reads it, so that figures count the order and the
memory of what onnxruntime runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple, TypedDict

import onnx

from offloadctl.core.memcpy import MEMCPY_FROM_HOST, MEMCPY_TO_HOST
from offloadctl.core.onnxutil import is_constant_node, is_pin
from offloadctl.loading.ortgraph import INSERTED_CAST_PREFIX, fresh_name

__all__ = [
    "CPU_INPUTS",
    "CPU_OUTPUT_OPS",
    "HostCast",
    "HostCastRecord",
    "HostRecord",
    "HostPlacement",
    "NO_HOST",
    "Placement",
    "device_name",
    "host_casts",
    "placed",
    "reads_host_memory",
    "writes_host_memory",
]

#: inputs a device kernel reads in host memory, by op (shape and index arguments)
CPU_INPUTS: dict[str, frozenset[int]] = {
    "Reshape": frozenset({1}),
    "Expand": frozenset({1}),
    "Tile": frozenset({1}),
    "Slice": frozenset({1, 2, 3, 4}),
    MEMCPY_FROM_HOST: frozenset({0}),
}
#: ops whose device kernel writes its output to host memory
CPU_OUTPUT_OPS = frozenset({"Shape", "Size", MEMCPY_TO_HOST})


def writes_host_memory(node: onnx.NodeProto, on_host: bool) -> bool:
    """Whether ``node``'s outputs are in host memory: it runs on the host, or its device kernel
    writes them there."""
    return on_host or node.op_type in CPU_OUTPUT_OPS


def reads_host_memory(node: onnx.NodeProto, index: int, on_host: bool) -> bool:
    """Whether ``node`` reads its input ``index`` in host memory: it runs on the host, or its device
    kernel takes that input there. A tensor read on the other side of where it is gets a copy."""
    return on_host or index in CPU_INPUTS.get(node.op_type, ())


class HostCastRecord(TypedDict):
    """A `HostCast` as a plan records it (``options.select.host_casts``)."""

    tensor: str
    readers: list[str] | None


class HostRecord(TypedDict, total=False):
    """A `HostPlacement` as a plan's ``options.select`` records it (the entries that hold something)."""

    host_nodes: list[str]
    host_device: str
    host_copies: list[str]
    host_casts: list[HostCastRecord]


class HostCast(NamedTuple):
    """A Cast onnxruntime inserts on the host around a float16 node the CPU has no float16 kernel for:
    of ``tensor`` to float32 for the host nodes ``readers`` (each named by its first output), or, with
    ``readers`` None, of the float32 output the host node that makes ``tensor`` then writes, back to
    ``tensor``. A plan records each as ``{"tensor": ..., "readers": [...] or null}``
    (``options.select.host_casts``)."""

    tensor: str
    readers: tuple[str, ...] | None

    def to_json(self) -> HostCastRecord:
        return {"tensor": self.tensor, "readers": None if self.readers is None else list(self.readers)}


def host_casts(recorded: Iterable[HostCast | Mapping[str, Any]]) -> tuple[HostCast, ...]:
    """`HostCast` entries, from entries or from a plan's ``{"tensor", "readers"}`` objects."""
    casts = []
    for entry in recorded:
        if isinstance(entry, HostCast):
            casts.append(entry)
        else:
            readers = entry["readers"]
            casts.append(HostCast(entry["tensor"], None if readers is None else tuple(readers)))
    return tuple(casts)


def device_name(host_device: str) -> str:
    """The device of a ``host_device`` record (``webgpu (measured)`` -> ``webgpu``); ``""`` for none."""
    return host_device.split(maxsplit=1)[0] if host_device else ""


@dataclass(frozen=True)
class HostPlacement:
    """Where the device a plan is made for (``plan --device``) runs the graph: the labels of the nodes
    it runs on the CPU (`Analysis.node_names`), the tensors onnxruntime copies between host and device
    memory, the Casts it inserts around float16 nodes the CPU has no float16 kernel for, and how all
    three were found (``device``: ``"webgpu (measured)"``; ``""`` for a plan made for no device).

    A plan records it in ``options.select`` as ``host_device``, ``host_nodes``, ``host_copies`` and
    ``host_casts`` (`record`, `of_record`)."""

    device: str = ""
    nodes: tuple[str, ...] = ()
    copies: tuple[str, ...] = ()
    casts: tuple[HostCast, ...] = ()

    def __post_init__(self) -> None:
        for name in ("nodes", "copies", "casts"):
            if not isinstance(getattr(self, name), tuple):
                raise TypeError(f"HostPlacement.{name} is a tuple, not {type(getattr(self, name)).__name__}")

    @property
    def name(self) -> str:
        """The device alone, without how its placement was found (``webgpu``); ``""`` for none."""
        return device_name(self.device)

    def record(self) -> HostRecord:
        """The entries a plan's ``options.select`` records, those that hold something."""
        record: HostRecord = {}
        if self.nodes:
            record["host_nodes"] = list(self.nodes)
        if self.device:
            record["host_device"] = self.device
        if self.copies:
            record["host_copies"] = list(self.copies)
        if self.casts:
            record["host_casts"] = [cast.to_json() for cast in self.casts]
        return record

    @classmethod
    def of_record(cls, select: Mapping[str, Any]) -> HostPlacement:
        """The placement a plan's ``options.select`` (or a rewrite's ``offloadctl.device``) records."""
        return cls(
            str(select.get("host_device") or ""),
            tuple(select.get("host_nodes") or ()),
            tuple(select.get("host_copies") or ()),
            host_casts(select.get("host_casts") or ()),
        )


#: the placement of a plan made for no device
NO_HOST = HostPlacement()


@dataclass(frozen=True)
class Placement:
    """Where a device provider runs a model: the nodes it runs on the host, each named by its first
    output (names survive a rewrite, node labels may not), the tensors onnxruntime copies between
    host and device memory, and the Casts it inserts on the host (`HostCast`)."""

    host: frozenset[str]
    copies: tuple[str, ...]
    casts: tuple[HostCast, ...] = ()


def placed(
    proto: onnx.ModelProto,
    placement: Placement,
    *,
    copy_names: Mapping[str, str] | None = None,
    pins_by_inputs: bool = True,
) -> tuple[onnx.ModelProto, frozenset[int]]:
    """(``proto`` with the copies ``placement`` names inserted as onnxruntime inserts them, the
    indices in its ``graph.node`` of the nodes that run on the host). ``copy_names`` names a copy by
    the tensor it copies (onnxruntime's own names, to read a profile); others are named ``Memcpy``,
    ``Memcpy_token_K``. With ``pins_by_inputs`` an order pin's node whose every input is in host
    memory runs on the host too (``placement.host`` does not name the rewrite's own nodes); without
    it, ``placement.host`` is the whole truth (a profiled run). ``proto`` is not changed."""
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    graph = out.graph
    host = (placement.host | _insert_casts(graph, placement)) if placement.casts else placement.host
    host_at = _host_nodes(graph, host, pins_by_inputs)
    in_host = _host_tensors(graph, host_at)
    inputs = [v.name for v in graph.input]
    taken_nodes = {n.name for n in graph.node}
    taken = {o for n in graph.node for o in n.output} | {*inputs, *(t.name for t in graph.initializer)}
    copied = set(placement.copies) & taken  # a tensor this graph does not have is not copied in it
    to_device = [n for n in inputs if n in copied] + sorted(n for n in copied - set(inputs) if n in in_host)
    to_host = sorted(n for n in copied if n not in in_host and n not in inputs)
    names = dict(copy_names or {})
    # tensors the graph copies itself (a rewrite writes onnxruntime's copies where they are needed)
    own = {node.input[0] for node in graph.node if node.op_type in (MEMCPY_FROM_HOST, MEMCPY_TO_HOST) and node.input}
    readers: dict[str, list[tuple[int, int]]] = {}
    for k, node in enumerate(graph.node):
        for i, name in enumerate(node.input):
            if name in copied:
                readers.setdefault(name, []).append((k, i))
    new_nodes = []
    for tensor in [*to_device, *to_host]:
        h2d = tensor in in_host or tensor in inputs
        copy = fresh_name(f"{tensor}_copied", taken)
        rewired = False
        for k, i in readers.get(tensor, ()):
            node = graph.node[k]
            if reads_host_memory(node, i, k in host_at) != h2d:  # a read on the other side
                node.input[i] = copy
                rewired = True
        if not rewired and tensor in own:  # its readers on the other side read the rewrite's own copy
            continue
        op = MEMCPY_FROM_HOST if h2d else MEMCPY_TO_HOST
        name = names.get(tensor) or fresh_name("Memcpy", taken_nodes)
        new_nodes.append(onnx.helper.make_node(op, [tensor], [copy], name=name))
    graph.node.extend(new_nodes)
    return out, frozenset(host_at)


def _insert_casts(graph: onnx.GraphProto, placement: Placement) -> frozenset[str]:
    """Append ``placement.casts`` to ``graph`` as onnxruntime inserts them (after every node, in the
    order given) and rewire the nodes they wrap; the first outputs of the host nodes that changed
    theirs and of the Casts (they run on the host). A node that reads a copy of the tensor (a
    rewrite's copy across, or its reload) gets the Cast of the copy it reads, as onnxruntime would
    insert it in the rewrite."""
    taken = {o for n in graph.node for o in n.output} | {v.name for v in graph.input}
    taken |= {t.name for t in graph.initializer}
    taken_nodes = {n.name for n in graph.node}
    by_first = {node.output[0]: node for node in graph.node if node.output and node.output[0]}
    maker = {o: node for node in graph.node for o in node.output if o}

    def origin(name: str) -> str:
        seen = 0
        while (node := maker.get(name)) is not None and node.op_type in (MEMCPY_FROM_HOST, MEMCPY_TO_HOST):
            name, seen = node.input[0], seen + 1
            if seen > len(maker):  # a cycle of copies: not a graph onnxruntime runs
                break
        return name

    on_host: set[str] = set()
    casts = []

    def cast(source: str, out: str, to: int, of: str) -> None:  # named as onnxruntime names it: after ``of``
        name = fresh_name(f"{INSERTED_CAST_PREFIX}{of}", taken_nodes)
        casts.append(onnx.helper.make_node("Cast", [source], [out], name=name, to=to))
        on_host.add(out)

    for tensor, readers in placement.casts:
        if tensor not in taken:  # a tensor this graph does not have
            continue
        if readers is None:  # the host node that makes the tensor writes it in float32, the Cast narrows it
            node = maker.get(tensor)
            if node is None:
                continue
            wide = fresh_name(f"{INSERTED_CAST_PREFIX}{tensor}", taken)
            node.output[:] = [wide if out == tensor else out for out in node.output]
            on_host.add(node.output[0])
            cast(wide, tensor, onnx.TensorProto.FLOAT16, tensor)
            continue
        widened: dict[str, str] = {}  # what a reader reads (the tensor or a copy of it) -> its float32 Cast
        for reader in readers:
            wrapped = by_first.get(reader)
            if wrapped is None:
                continue
            for k, name in enumerate(wrapped.input):
                if name and origin(name) == tensor:
                    if name not in widened:
                        widened[name] = fresh_name(f"{INSERTED_CAST_PREFIX}{name}", taken)
                        cast(name, widened[name], onnx.TensorProto.FLOAT, name)
                    wrapped.input[k] = widened[name]
    graph.node.extend(casts)
    return frozenset(on_host)


def _host_nodes(graph: onnx.GraphProto, host: frozenset[str], pins_by_inputs: bool) -> set[int]:
    """Indices of the nodes on the host: those ``host`` names, and (``pins_by_inputs``) a rewrite's
    order-pin nodes whose every input is in host memory (a pin may read another pin's output, and a
    file need not be in topological order: repeated until nothing changes)."""
    nodes = graph.node
    at = {k for k, node in enumerate(nodes) if node.output and node.output[0] in host}
    if not pins_by_inputs:
        return at
    in_host = _host_tensors(graph, at) | {t.name for t in graph.initializer}
    in_host |= {o for node in nodes if is_constant_node(node) for o in node.output}
    pins = [k for k, node in enumerate(nodes) if is_pin(node) and node.input and k not in at]
    changed = True
    while changed:
        changed = False
        for k in pins:
            if k not in at and all(i in in_host for i in nodes[k].input if i):
                at.add(k)
                in_host.update(o for o in nodes[k].output if o)
                changed = True
    return at


def _host_tensors(graph: onnx.GraphProto, host_at: Iterable[int]) -> set[str]:
    """Tensors in host memory: what host nodes make and what kernels write to host memory."""
    on_host = set(host_at)
    return {o for k, node in enumerate(graph.node) if writes_host_memory(node, k in on_host) for o in node.output if o}
