"""Copies on a stream of their own: HyperOffload's event step (``AddEventNodes``) on onnxruntime's
multi-stream executor (``apply --copies streams``).

onnxruntime runs the logic streams a partition file names (session config entry
``session.node_partition_config_file``: ``{"type": "DeviceBasedPartitioner", "streams": [[names],
...], "devices": [...]}``, every node listed once under the name the session gives it). On CUDA and
CANN each logic stream gets a stream of its own, a Memcpy node copies on its node's stream, and a
value made on one stream and read on another becomes an event record there and a device-side wait
here. Within a stream nodes run in the session's topological order. With ORT_SEQUENTIAL one host
thread runs the first stream until it waits, then the next, and a value made resumes the stream that
waits for it at once.

`add_event_nodes` writes the events of a rewritten model (its copies in place in the file) as plain
``Identity`` nodes, zero-cost on every provider (CANN has no Shape kernel):

- a **gate** before each MemcpyFromHost, ``Identity(t)``, t an output of the last compute node
  before it in the file: on the copy stream it holds the copy until t is made, so each copy is
  issued at its planned point, not all at once;
- for each MemcpyToHost of a device tensor x, a **gate after it** on the copy stream,
  ``g = Identity(x)``, and a **fence** on the compute stream right after x's last reader there (of
  x or of an order pin's view of it), ``Identity(g)``: compute waits for the copy before x's buffer
  can go to another tensor (the device arena is freed by the host, and it knows which stream
  allocated a chunk, not which stream still reads it);
- a **guard**, ``Identity(v)``, before each node onnxruntime's multi-stream planner would otherwise
  let overwrite a buffer other nodes still read (`offloadctl.rewriting.guards`): a second reader of v.

`partition` lists the copy stream (copies and gates) first, then compute. The copy stream first
makes the executor issue each copy as soon as its gate opens; compute first would issue a copy only
when compute waits for it. The events hold only while onnxruntime keeps the Identity nodes: the
session must disable ``EliminateIdentity`` and ``CommonSubexpressionElimination`` besides
``ConstantFolding`` (`EVENT_OPTIMIZERS`), and the partition names the nodes as they are at
``--opt-level disable`` (fusions at higher levels rename them, and onnxruntime then falls back to one
stream or, on 1.24, refuses the session).
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

import numpy as np
import onnx
from onnx import helper, numpy_helper

from offloadctl.analysis.order import default_order, executor_order, expected_run_order
from offloadctl.core.errors import OffloadError
from offloadctl.core.onnxutil import (
    BACKWARD_ATTR,
    EVENT_PREFIX,
    PIN_ATTR,
    copy_kind,
    is_backward,
    is_event,
    is_pin,
    pin_view_source,
)
from offloadctl.loading.ortgraph import inlined_calls
from offloadctl.rewriting.guards import GUARD_PREFIX, in_place_hazards, insert_guards, may_overwrite
from offloadctl.rewriting.metadata import KEY_SESSION, KEY_STREAMS, metadata_json, session_settings, set_metadata

__all__ = [
    "EVENT_OPTIMIZERS",
    "PARTITION_KEY",
    "StreamLayout",
    "add_event_nodes",
    "checked_streams",
    "check_partition",
    "copy_stream_nodes",
    "partition",
    "release_loads",
    "stream_order",
    "streams_file",
    "with_events",
]

#: what a session of a rewrite with events disables (``;``-separated, as the session config key reads it)
EVENT_OPTIMIZERS = ("ConstantFolding", "EliminateIdentity", "CommonSubexpressionElimination")
#: the session config entry that names the partition file
PARTITION_KEY = "session.node_partition_config_file"
#: outputs a gate must not read: made on the host by every provider
_HOST_OUTPUT_OPS = frozenset({"Shape", "Size", "Constant"})


class PartitionConfig(TypedDict):
    """onnxruntime's partition file for two logic streams (``session.node_partition_config_file``)."""

    type: str
    streams: list[list[str]]
    devices: list[str]


@dataclass(frozen=True)
class StreamLayout:
    """The two logic streams of a rewrite with events, every node by the name the session gives it."""

    copy_stream: list[str]
    compute_stream: list[str]
    gates: int  # before MemcpyFromHost nodes
    fences: int  # MemcpyToHost copies the compute stream waits for
    guards: int = 0  # second readers that keep onnxruntime from overwriting a shared buffer (`guards`)
    in_line: list[str] = field(default_factory=list)  # copies to device no gate holds: on the compute stream

    def to_json(self) -> PartitionConfig:
        return {
            "type": "DeviceBasedPartitioner",
            "streams": [self.copy_stream, self.compute_stream],
            "devices": ["0", "0"],
        }


class _Names:
    def __init__(self, graph: onnx.GraphProto) -> None:
        self.tensors = {o for n in graph.node for o in [*n.input, *n.output]} | {t.name for t in graph.initializer}
        self.tensors |= {v.name for v in [*graph.input, *graph.output, *graph.value_info]}
        self.nodes = {n.name for n in graph.node}

    def tensor(self, base: str) -> str:
        return _fresh(base, self.tensors)

    def node(self, base: str) -> str:
        return _fresh(base, self.nodes)

    def any(self, base: str) -> str:
        """A name neither a tensor nor a node has (for a node and its output alike)."""
        name = _fresh(base, self.tensors | self.nodes)
        self.tensors.add(name)
        self.nodes.add(name)
        return name


def _fresh(base: str, taken: set[str]) -> str:
    """``base``, or ``base_1``, ``base_2``, ... the first not in ``taken``, which it joins."""
    name, k = base, 1
    while name in taken:
        name, k = f"{base}_{k}", k + 1
    taken.add(name)
    return name


def _gate_source(node: onnx.NodeProto) -> str | None:
    """The output of a compute node a gate can read: a device tensor (not a copy's, a pin's or a
    Shape's, which live on the host)."""
    if copy_kind(node) is not None or is_pin(node) or is_event(node) or node.op_type in _HOST_OUTPUT_OPS:
        return None
    return next((o for o in node.output if o), None)


def add_event_nodes(model: onnx.ModelProto, order: str = "priority", target: str = "gpu") -> tuple[int, int, int]:
    """Add the gates and fences of every copy of a rewritten model (in place, in file order; see the
    module docstring), the guards against onnxruntime's multi-stream in-place defect
    (`offloadctl.rewriting.guards`), and name every node that has no name of its own. Returns (gates,
    fences, guards).

    For a rewrite made for the DEFAULT order every event must lie on the walk's paths: the walk
    reaches a node nobody reads (a leaf) only after the rest of the graph, where an event holds
    nothing and keeps the tensor it reads on the device to the end of the run. So a pinned H2D gets
    its gate inside its order pin (`_gate_pins`), and the other events are read by order pins of
    their own (`_hold_events`). On ``target`` ascend no pin may read a device tensor (its Shape
    would run on the CPU and copy the tensor): there an H2D's gate is left out and a fence stays a
    leaf, which holds under PRIORITY_BASED only."""
    graph = model.graph
    names = _Names(graph)
    nodes = list(graph.node)
    seen: set[str] = set()
    for k, node in enumerate(nodes):  # the partition lists nodes by name: every node gets its own
        if not node.name or node.name in seen:
            node.name = names.node(f"{node.op_type}_{k}")
        seen.add(node.name)
    readers = _last_readers(nodes)
    default = order == "default"
    in_pins = _pinned_h2ds(nodes) if default else set()
    fences_after: dict[int, list[onnx.NodeProto]] = {}
    out: list[onnx.NodeProto] = []
    gates = fences = 0
    last_source: str | None = None
    for k, node in enumerate(nodes):
        kind = copy_kind(node)
        held_here = not default or (node.output[0] not in in_pins and target != "ascend")
        if kind == "h2d" and last_source is not None and held_here:
            gate = names.tensor(f"{last_source}__event_gate")
            out.append(_identity(last_source, gate, names.node(f"{EVENT_PREFIX}gate/{node.name}"), like=node))
            gates += 1
        out.append(node)
        if kind == "d2h":
            x = node.input[0]
            copied = names.tensor(f"{x}__event_copied")
            out.append(_identity(x, copied, names.node(f"{EVENT_PREFIX}copied/{node.name}"), like=node))
            at = max(k, readers.get(x, k))
            fence_name = names.node(f"{EVENT_PREFIX}fence/{node.name}")
            fence = _identity(copied, names.tensor(f"{x}__event_fence"), fence_name, like=nodes[at])
            fences_after.setdefault(at, []).append(fence)
            fences += 1
        out.extend(fences_after.pop(k, []))
        source = _gate_source(node)
        if source is not None:
            last_source = source
    if default:
        out, added = _gate_pins(out, names)
        gates += added
    out, dropped, guards = _guard_and_hold(model, out, names, hold=default and target != "ascend")
    del graph.node[:]
    graph.node.extend(out)
    return gates - dropped, fences, guards


def _last_readers(nodes: list[onnx.NodeProto]) -> dict[str, int]:
    """Each tensor -> the index (in ``nodes``) of its last compute reader, or of its order pins' views'."""
    readers: dict[str, int] = {}
    views: dict[str, str] = {}  # an order pin's view -> the tensor it views (the same buffer)
    for k, node in enumerate(nodes):
        source = pin_view_source(node)
        if source:
            views[node.output[0]] = views.get(source, source)
        if copy_kind(node) is None:
            for name in node.input:
                readers[views.get(name, name)] = k
    return readers


def _guard_and_hold(
    model: onnx.ModelProto, nodes: list[onnx.NodeProto], names: _Names, *, hold: bool
) -> tuple[list[onnx.NodeProto], int, int]:
    """``nodes`` with a guard before every node onnxruntime's multi-stream planner may let overwrite a
    buffer others still read (`offloadctl.rewriting.guards`), and, with ``hold`` (DEFAULT, but on ascend),
    every event nobody reads held by an order pin (`_hold_events`). A pin's view is an alias too, so the
    views the holds add are checked again: their guards are held only by nodes that overwrite nothing,
    which adds no hazard, so the second round is the last. Returns the nodes, the gates left out and the
    guards added."""
    graph = model.graph
    zero = _zero_for_slices(model, names) if hold else None
    available = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    guards = dropped = 0
    held = False
    for _ in range(3):
        hazards = in_place_hazards(nodes, graph)
        if hazards:
            nodes = insert_guards(nodes, hazards, names.any)
            guards += len(hazards)
        if not hold or (held and not hazards):
            break
        nodes, left_out = _hold_events(nodes, names, zero, available)
        dropped += left_out
        held = True
    else:  # not expected (see above): what is left keeps a guard of its own, read by nobody
        hazards = in_place_hazards(nodes, graph)
        nodes = insert_guards(nodes, hazards, names.any)
        guards += len(hazards)
    if zero is not None and not any(zero in n.input for n in nodes):
        graph.initializer.pop()  # no pin needed it
    return nodes, dropped, guards


def _pinned_h2ds(nodes: list[onnx.NodeProto]) -> set[str]:
    """The outputs of the H2Ds an order pin's view reads."""
    made = {o: n for n in nodes for o in n.output if o}
    return {n.input[0] for n in nodes if pin_view_source(n) and copy_kind(made.get(n.input[0], _NONE)) == "h2d"}


def _gate_pins(nodes: list[onnx.NodeProto], names: _Names) -> tuple[list[onnx.NodeProto], int]:
    """``nodes`` with a gate in each H2D order pin: its ``Shape(o)`` reads ``Identity(o)`` on the copy
    stream instead. In the DEFAULT walk a gate before a copy in the file is a leaf, which the walk
    reaches only after the rest of the graph, so it holds nothing there. The pin's view reads the
    copy's output and a Concat that has the higher index (`offloadctl.rewriting.rewrite`), and the walk
    explores the higher index first: the gate then comes right before the copy on the copy stream and
    holds it until o is made, as the pin holds it in a one-stream walk. Returns the nodes and the
    number of gates added."""
    deps = _h2d_pin_shapes(nodes)
    out: list[onnx.NodeProto] = []
    for node in nodes:
        if node.output and node.output[0] in deps:
            source = node.input[0]
            gate = names.tensor(f"{source}__event_gate")
            out.append(_identity(source, gate, names.node(f"{EVENT_PREFIX}gate/{node.name}"), like=node))
            node.input[0] = gate
        out.append(node)
    return out, len(deps)


def _h2d_pin_shapes(nodes: list[onnx.NodeProto]) -> set[str]:
    """The outputs of the H2D order pins' ``Shape(o)`` nodes: those whose (sliced) empty shape joins the
    Concat of a view of an H2D's output, ``o`` an activation of the model's own."""
    made = {o: n for n in nodes for o in n.output if o}
    views = [n for n in nodes if pin_view_source(n) and copy_kind(made.get(n.input[0], _NONE)) == "h2d"]
    concats = [made[v.input[1]] for v in views if v.input[1] in made]
    shapes = (_pin_shape(made, empty) for concat in concats for empty in concat.input)
    return {node.output[0] for node in shapes if node is not None}


def _pin_shape(made: dict[str, onnx.NodeProto], empty: str) -> onnx.NodeProto | None:
    """The pin's ``Shape(o)`` node an empty shape ``empty`` comes from (through its Slice), ``o`` an
    activation of the model's own; None for anything else."""
    node = made.get(empty, _NONE)
    while is_pin(node) and node.op_type == "Slice":
        node = made.get(node.input[0], _NONE)
    if is_pin(node) and node.op_type == "Shape" and not is_pin(made.get(node.input[0], _NONE)):
        return node
    return None


_NONE = onnx.NodeProto()


def _zero_for_slices(model: onnx.ModelProto, names: _Names) -> str | None:
    """Below opset 15, where Shape has no start and end, an int64 ``[0]`` initializer for the pins' empty
    slices (added to ``model``); None from opset 15 on."""
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    if opset >= 15:
        return None
    zero = names.tensor("offload_fence_zero")
    model.graph.initializer.append(numpy_helper.from_array(np.zeros(1, np.int64), zero))
    return zero


def _hold_events(
    nodes: list[onnx.NodeProto], names: _Names, zero: str | None, available: set[str]
) -> tuple[list[onnx.NodeProto], int]:
    """``nodes`` with every event that nobody reads (a gate before an H2D, a fence) read by an order pin,
    so that the DEFAULT walk meets it in place; returns the nodes and the number of gates left out.

    The pin is a view on one input t of a node the event must come before, the input the node reads
    from the node latest in the file (which the walk explores first anyway): the node reads
    ``Reshape(t, Concat(Shape(t), empty, ...))``, each ``empty`` an event's empty shape
    (`offloadctl.rewriting.rewrite` builds its pins so; one view per node, a view of a view being
    what onnxruntime's fusions merge wrongly). A gate is held by the first node that reads its H2D's
    output, so the copy stream meets the gate right before the copy and the copy waits for the
    gate's tensor; a fence by the next node in the file after it, so that compute waits for the copy
    to host there. The node must read an activation, and the walk must run it after the event's own
    input is made (a file need not be in a topological order: an earlier node may lead to it). A
    gate no node can hold is left out (a leaf would hold nothing); a fence stays a leaf, which the
    walk reaches at the end of the run, keeping its tensor to then."""
    walk = _Walk(nodes, available)
    holds: dict[int, list[str]] = {}  # node index -> the events its view waits for
    joins: dict[int, list[str]] = {}  # an order pin's Concat -> the events its view waits for as well
    dropped: set[int] = set()
    for k, node in enumerate(nodes):
        if not is_event(node) or node.output[0] in walk.readers:  # (held already)
            continue
        if node.name.startswith(f"{EVENT_PREFIX}gate/"):
            target = walk.gate_target(k)
            if target is None:
                dropped.add(k)
            else:
                holds.setdefault(target, []).append(node.output[0])
        elif node.name.startswith(f"{EVENT_PREFIX}fence/"):
            target = walk.fence_target(k)
            if target is not None:
                holds.setdefault(target, []).append(node.output[0])
        elif node.name.startswith(GUARD_PREFIX):
            found = walk.guard_target(k)
            if found is not None:
                (joins if found[1] else holds).setdefault(found[0], []).append(node.output[0])
    out: list[onnx.NodeProto] = []
    for k, node in enumerate(nodes):
        if k in dropped:
            continue
        if k in holds:
            i = walk.activation_input(k)
            assert i is not None  # chosen so
            out.extend(_event_pin(node, i, holds[k], names, zero))
        if k in joins:  # an order pin's Concat: its view waits for these events too
            out.extend(_event_empties(node, joins[k], names, zero))
        out.append(node)
    return out, len(dropped)


class _Walk:
    """The nodes of a rewrite with events, with where the DEFAULT walk runs each (its rank) and who reads
    what: where an event's pin can go."""

    def __init__(self, nodes: list[onnx.NodeProto], available: set[str]) -> None:
        self.nodes = nodes
        self.made = {o: k for k, n in enumerate(nodes) for o in n.output if o}
        self.rank = [0] * len(nodes)
        for r, k in enumerate(default_order(nodes, available)):
            self.rank[k] = r
        self.readers: dict[str, list[int]] = {}
        for k, node in enumerate(nodes):
            for t in node.input:
                self.readers.setdefault(t, []).append(k)

    def activation_input(self, k: int) -> int | None:
        """The input of node ``k`` a view can stand in for: an activation, the one made latest in the file."""
        made, nodes = self.made, self.nodes
        inputs = [(made[t], i) for i, t in enumerate(nodes[k].input) if t in made and _is_compute(nodes[made[t]])]
        return max(inputs)[1] if inputs else None

    def _holds(self, k: int, source: str) -> bool:
        """Node ``k`` can hold an event that reads ``source``: a compute node with an activation input, run
        by the walk after ``source`` is made (so that it cannot lead to it)."""
        return self._after(k, source) and self.activation_input(k) is not None

    def _after(self, k: int, source: str) -> bool:
        """Node ``k`` is a compute node the walk runs after ``source`` is made."""
        made_at = self.rank[self.made[source]] if source in self.made else -1
        return _is_compute(self.nodes[k]) and self.rank[k] > made_at

    def joinable_concat(self, k: int, event: int, source: str) -> int | None:
        """For a node ``k`` that reads an order pin's view of an activation (and no activation itself), the
        pin's Concat that event ``event`` (which reads ``source``) can join: the view then waits for the
        event too, with no view of a view. It must come after the event in the file and must not lead to
        ``source`` (a cycle)."""
        for t in self.nodes[k].input:
            view = self.nodes[self.made[t]] if t in self.made else _NONE
            concat = self.made.get(view.input[1], -1) if pin_view_source(view) and len(view.input) > 1 else -1
            if concat > event and self.nodes[concat].op_type == "Concat" and not self._leads_to(concat, source):
                return concat
        return None

    def _leads_to(self, k: int, value: str) -> bool:
        """Whether ``value`` is made from node ``k``'s output, at any distance."""
        seen, todo = set(), [value]
        while todo:
            name = todo.pop()
            j = self.made.get(name)
            if j is None or j in seen:
                continue
            if j == k:
                return True
            seen.add(j)
            todo.extend(self.nodes[j].input)
        return False

    def gate_target(self, k: int) -> int | None:
        """The node that holds gate ``k``: the first that reads its copy's output (the gate is written right
        before its copy)."""
        copy = self.nodes[k + 1]
        source = self.nodes[k].input[0]
        return next((j for j in self.readers.get(copy.output[0], []) if self._holds(j, source)), None)

    def fence_target(self, k: int) -> int | None:
        """The node that holds fence ``k``: the next in the file after it (the fence reads Identity(x))."""
        x = self.nodes[self.made[self.nodes[k].input[0]]].input[0]
        return next((j for j in range(k + 1, len(self.nodes)) if self._holds(j, x)), None)

    def guard_target(self, k: int) -> tuple[int, bool] | None:
        """The node that holds guard ``k`` (it reads v), and whether through its pin's Concat
        (`joinable_concat`): the next in the file after it that overwrites none of its inputs in place, so
        that its view needs no guard of its own (`offloadctl.rewriting.guards`)."""
        v = self.nodes[k].input[0]
        for j in range(k + 1, len(self.nodes)):
            if not self._after(j, v) or may_overwrite(self.nodes[j]):
                continue
            if self.activation_input(j) is not None:
                return j, False
            concat = self.joinable_concat(j, k, v)
            if concat is not None:
                return concat, True
        return None


def _is_compute(node: onnx.NodeProto) -> bool:
    """A node of the model's own that makes a device tensor: not a copy, an event, a pin or a host op."""
    return _gate_source(node) is not None


def _event_pin(
    node: onnx.NodeProto, k: int, events: list[str], names: _Names, zero: str | None
) -> list[onnx.NodeProto]:
    """The pin nodes that make ``node`` read its input ``k`` through a view that waits for the event
    outputs ``events`` (``node.input[k]`` is rewired to the view)."""
    tensor = node.input[k]
    pins = _PinNodes(f"offload/pin/events@{node.name}", tensor, names, like=node)
    empties = pins.empties(events, zero)
    joined = pins.add("Concat", [pins.add("Shape", [tensor], "view_shape"), *empties], "events_concat", axis=0)
    node.input[k] = pins.add("Reshape", [tensor, joined], "events_view")
    return pins.nodes


def _event_empties(concat: onnx.NodeProto, events: list[str], names: _Names, zero: str | None) -> list[onnx.NodeProto]:
    """The pin nodes that make an order pin's ``concat`` wait for the event outputs ``events`` too: an empty
    shape of each, appended to its inputs (the view it shapes keeps its shape)."""
    pins = _PinNodes(concat.name, concat.output[0], names, like=concat)
    concat.input.extend(pins.empties(events, zero))
    return pins.nodes


class _PinNodes:
    """The nodes of one order pin, named after ``label`` and ``base``, of the backward pass where ``like`` is."""

    def __init__(self, label: str, base: str, names: _Names, *, like: onnx.NodeProto) -> None:
        self.label, self.base, self.names, self.backward = label, base, names, is_backward(like)
        self.nodes: list[onnx.NodeProto] = []

    def add(self, op: str, inputs: list[str], what: str, **attrs: int) -> str:
        names = self.names
        pin = helper.make_node(
            op, inputs, [names.tensor(f"{self.base}__{what}")], name=names.node(f"{self.label}/{what}")
        )
        pin.attribute.extend(helper.make_attribute(key, attrs[key]) for key in sorted(attrs))
        pin.attribute.append(helper.make_attribute(PIN_ATTR, 1 if op == "Reshape" else 0))
        if self.backward:
            pin.attribute.append(helper.make_attribute(BACKWARD_ATTR, 1))
        self.nodes.append(pin)
        return pin.output[0]

    def empties(self, events: list[str], zero: str | None) -> list[str]:
        """An empty int64 shape made from each event's output: what a Concat joins to wait for it."""
        if zero is None:
            return [self.add("Shape", [event], "event_dep", start=0, end=0) for event in events]
        # Shape has no start and end before opset 15: an empty slice of the whole shape
        return [
            self.add("Slice", [self.add("Shape", [event], "event_shape"), zero, zero], "event_dep") for event in events
        ]


def _identity(source: str, out: str, name: str, *, like: onnx.NodeProto) -> onnx.NodeProto:
    """An event node: ``Identity(source)``, of the backward pass where ``like`` is (PRIORITY_BASED runs
    a training graph's forward nodes first, and each stream keeps that order)."""
    node = helper.make_node("Identity", [source], [out], name=name)
    if is_backward(like):
        node.attribute.append(helper.make_attribute(BACKWARD_ATTR, 1))
    return node


def partition(model: onnx.ModelProto, order: str = "priority") -> StreamLayout:
    """The two logic streams of a rewrite with events: the copies and the gates on the copy stream,
    listed first, every other node on the compute stream, by the names the session gives them
    (`offloadctl.analysis.order.expected_run_order`: the nodes onnxruntime removes are not listed)."""
    if inlined_calls(model):
        raise OffloadError(
            "copies on their own stream need every node listed by the name the session gives it, and onnxruntime "
            "names the nodes of the local functions it inlines itself",
            hint="inline the model's functions first (onnx.inliner.inline_local_functions), or apply with "
            "--copies inline",
        )
    on_copy_stream = copy_stream_nodes(model)
    names = expected_run_order(model, order)
    copy_stream = [n for n in names if n in on_copy_stream]
    compute = [n for n in names if n not in on_copy_stream]
    gates = sum(n.startswith(f"{EVENT_PREFIX}gate/") for n in copy_stream)
    fences = sum(n.startswith(f"{EVENT_PREFIX}fence/") for n in compute)
    guards = sum(n.startswith(GUARD_PREFIX) for n in compute)
    in_line = [n.name for n in model.graph.node if copy_kind(n) == "h2d" and n.name not in on_copy_stream]
    return StreamLayout(copy_stream, compute, gates, fences, guards, in_line)


def stream_order(model: onnx.ModelProto, order: str = "priority") -> list[str]:
    """The order onnxruntime's executor runs a rewrite with events in on one host thread: the copy
    stream first, each stream in the session's order, a stream that waits for a value of the other
    resumed as soon as it is made (`offloadctl.analysis.order.executor_order`)."""
    names = expected_run_order(model, order)
    at = {name: k for k, name in enumerate(names)}
    nodes = {n.name: n for n in model.graph.node if n.name in at}
    made = {o: at[n.name] for n in nodes.values() for o in n.output if o}
    preds = [{made[i] for i in nodes[name].input if i in made} for name in names]
    on_copy_stream = copy_stream_nodes(model)
    on_copy = [name in on_copy_stream for name in names]
    ran = executor_order(list(range(len(names))), preds, on_copy, first=True)
    return [names[k] for k in ran]


def copy_stream_nodes(model: onnx.ModelProto) -> set[str]:
    """The nodes of a rewrite with events that go on the copy stream: every copy to host (its input holds it
    until it is made), every copy to device a gate holds (`_held_loads`), and the gates. A copy to device no
    gate holds (a weight's before any compute node, one the DEFAULT walk offers no pin) stays on the compute
    stream, in line: on the copy stream nothing would keep it from running ahead of its plan, the whole
    load alive from the start of the run."""
    nodes = list(model.graph.node)
    held = _held_loads(nodes)
    events = (f"{EVENT_PREFIX}gate/", f"{EVENT_PREFIX}copied/")
    return {n.name for n in nodes if copy_kind(n) == "d2h" or n.name in held or n.name.startswith(events)}


def _held_loads(nodes: list[onnx.NodeProto]) -> set[str]:
    """The copies to device a gate holds (`_gates_of_loads`)."""
    return {load for loads in _gates_of_loads(nodes).values() for load in loads}


def _gates_of_loads(nodes: list[onnx.NodeProto]) -> dict[str, set[str]]:
    """Each gate, and the copies to device it holds: the copy it is written right before (``gate/<copy>``), or
    those whose order pin it is inside (its Shape reads the gate, its Concat shapes the view of the copy's
    output)."""
    made = {o: n for n in nodes for o in n.output if o}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in nodes:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    loads = {n.name for n in nodes if copy_kind(n) == "h2d"}
    held: dict[str, set[str]] = {}
    for gate in nodes:
        if not gate.name.startswith(f"{EVENT_PREFIX}gate/"):
            continue
        target = gate.name.removeprefix(f"{EVENT_PREFIX}gate/")
        found = held.setdefault(gate.name, set())
        if target in loads:
            found.add(target)
            continue
        for shape in readers.get(gate.output[0], ()):  # a pin's gate: Shape -> (Slice) -> Concat -> view
            for view in _views_of(shape, readers):
                source = made.get(view.input[0], _NONE)
                if copy_kind(source) == "h2d":
                    found.add(source.name)
    return held


def release_loads(model: onnx.ModelProto, loads: Collection[str]) -> int:
    """Take the gates of the copies to device ``loads`` out of ``model`` (in place): whatever read a gate
    reads its tensor instead, so the order pins keep their place in the walk, and each of those copies, no
    gate holding it, runs on the compute stream, in line (`copy_stream_nodes`). Returns the gates taken out."""
    wanted = set(loads)
    nodes = list(model.graph.node)
    gates = {g for g, held in _gates_of_loads(nodes).items() if held & wanted}
    by_name = {n.name: n for n in nodes}
    renamed = {by_name[g].output[0]: by_name[g].input[0] for g in gates}
    for node in nodes:
        for k, name in enumerate(node.input):
            if name in renamed:
                node.input[k] = renamed[name]
    kept = [n for n in nodes if n.name not in gates]
    del model.graph.node[:]
    model.graph.node.extend(kept)
    return len(gates)


def _views_of(node: onnx.NodeProto, readers: dict[str, list[onnx.NodeProto]]) -> list[onnx.NodeProto]:
    """The pin views a pin's empty shape (from ``node``, through its Slice and Concat) shapes."""
    found, todo = [], [node]
    while todo:
        current = todo.pop()
        for reader in readers.get(current.output[0], ()) if current.output else ():
            if pin_view_source(reader) is not None and reader.input[1] == current.output[0]:
                found.append(reader)
            elif is_pin(reader) and reader.op_type in ("Slice", "Concat"):
                todo.append(reader)
    return found


def check_partition(
    path: str | os.PathLike[str], model: onnx.ModelProto, where: str, order: str = "priority"
) -> list[list[str]]:
    """The streams of a partition file that fits ``model`` (``where``, its path); refused when it is
    missing, not the JSON `partition` writes, has an empty stream, or names a node the session does
    not have or leaves one out. onnxruntime 1.32 would log a warning and silently run one stream; an
    empty stream crashes it.

    Raises:
        OffloadError: naming the file, what is wrong, and the fix.
    """
    fix = f"write the rewrite again with offloadctl apply --copies streams (it writes {Path(path).name} beside it)"
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise OffloadError(f"{where} names the partition file {path}, which does not exist", hint=fix) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise OffloadError(f"the partition file {path} cannot be read as JSON ({exc})", hint=fix) from None
    streams = doc.get("streams") if isinstance(doc, dict) else None
    if not isinstance(streams, list) or not streams or not all(isinstance(s, list) and s for s in streams):
        raise OffloadError(
            f"the partition file {path} has no streams, or an empty one (onnxruntime crashes on it)", hint=fix
        )
    listed = [str(n) for s in streams for n in s]
    misfits = _misfits(listed, expected_run_order(model, order))
    if misfits:
        raise OffloadError(f"the partition file {path} does not fit {where}: " + "; ".join(misfits), hint=fix)
    return [[str(n) for n in stream] for stream in streams]


def _misfits(listed: list[str], session: list[str]) -> list[str]:
    """What is wrong with a partition listing ``listed`` for a session that has the nodes ``session``."""
    missing = sorted(set(session) - set(listed))
    unknown = sorted(set(listed) - set(session))
    twice = len(listed) - len(set(listed))
    parts = []
    if missing:
        parts.append(f"{len(missing)} node(s) of the model are not in it (first: {', '.join(missing[:3])})")
    if unknown:
        parts.append(f"{len(unknown)} node(s) it names are not in the model (first: {', '.join(unknown[:3])})")
    if twice:
        parts.append(f"{twice} node(s) are listed twice")
    return parts


def checked_streams(
    path: str | os.PathLike[str], model: onnx.ModelProto, order: str = "priority"
) -> tuple[str, list[list[str]]] | None:
    """For a rewrite whose copies run on a stream of their own (its ``offloadctl.streams`` metadata),
    the path of its partition file and its streams, checked against it (`check_partition`: a check a
    CI job can run without onnxruntime, through ``offloadctl simulate REWRITE``); None for any other
    model."""
    recorded = metadata_json(model, KEY_STREAMS)
    if not isinstance(recorded, dict) or not isinstance(recorded.get("partition_file"), str):
        return None
    partition_path = Path(path).resolve().parent / recorded["partition_file"]
    return str(partition_path), check_partition(partition_path, model, str(path), order)


def streams_file(model_path: str | os.PathLike[str]) -> Path:
    """The partition file `offloadctl apply --copies streams` writes beside ``model_path``:
    ``model.offload.onnx`` -> ``model.offload.streams.json``."""
    path = Path(model_path)
    return path.with_name(f"{path.stem}.streams.json")


def with_events(
    model: onnx.ModelProto,
    partition_file: str,
    order: str = "priority",
    target: str = "gpu",
    *,
    in_line: Collection[str] = (),
) -> StreamLayout:
    """Add the events to a rewritten model (`add_event_nodes`) and record in its metadata what a session
    needs to run them: ``offloadctl.streams`` (the partition file, relative to the model, and the
    session config entries), and in ``offloadctl.session`` the optimizers to disable and the file.
    ``in_line``: copies to device to leave without a gate, on the compute stream (`release_loads`: those
    whose early issue would raise the peak above the rewrite in line, `offloadctl.rewriting.preview`).
    Returns the partition to write to ``partition_file`` beside the model."""
    add_event_nodes(model, order, target)
    if in_line:
        release_loads(model, in_line)
    layout = partition(model, order)
    settings = session_settings(model) or {}
    disabled = list(dict.fromkeys([*settings.get("disabled_optimizers", []), *EVENT_OPTIMIZERS]))
    settings["disabled_optimizers"] = disabled
    settings["streams"] = {"partition_file": partition_file}
    record = {
        "partition_file": partition_file,
        "streams": 2,
        "copy_stream_nodes": len(layout.copy_stream),
        "gates": layout.gates,
        "fences": layout.fences,
        "guards": layout.guards,
        "copies_in_line": layout.in_line,
        "session_config": {
            PARTITION_KEY: partition_file,
            "optimization.disable_specified_optimizers": ";".join(disabled),
        },
    }
    set_metadata(model, {KEY_SESSION: json.dumps(settings), KEY_STREAMS: json.dumps(record)})
    return layout
