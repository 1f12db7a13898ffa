"""Rewriting a model by a scheduled plan: the only code that edits ONNX.

`apply_plan` returns a new model in which every offload of the plan is encoded with onnxruntime's
own copy operators (`offloadctl.core.memcpy`); `offloadctl.rewriting.writing.write_model` writes it
atomically, next to the external data files it refers to. The source model is never modified.

Encoding:

- Activation: a ``MemcpyToHost`` (D2H) is added as an extra consumer of the tensor right after the
  node at ``d2h_after``. Each reload group gets one ``MemcpyFromHost`` (H2D) that reads the host copy,
  just before the node at ``h2d_before``; only that group's uses are rerouted to its output (by
  node position and input index; a use with input index null is a read inside an If/Loop/Scan
  body, renamed there as an outer-scope name). Device uses keep reading the original tensor, so
  onnxruntime's fusions still see it.
- Offloaded graph output: the output name must not change, so the producer's output gets a new
  name (the device uses and the D2H read it) and an H2D whose output is the original name runs
  before ``output_h2d_before`` (the end for plans made by `offloadctl prefetch`). Feeding the
  output from the host copy at the end, rather than from the device tensor, lets the device buffer
  be freed after its last device use instead of living until the run ends.
- Weight (initializer or Constant node): no D2H; one H2D per reload group reads the weight. A
  Constant-node weight first becomes an initializer. Each offloaded weight is also listed in
  ``graph.input`` so that constant folding cannot turn ``MemcpyFromHost(W)`` back into a device
  weight (the model's metadata also asks to disable ConstantFolding).

- Host and device (a plan made with ``plan --device``): the copies onnxruntime inserts between
  host and device memory there (``options.select.host_copies``) are written as ``across/{tensor}``,
  each right before the first node that reads the tensor on the other side. onnxruntime appends the
  copies it inserts after every node; under PRIORITY_BASED the nodes that wait for them are then held
  back while every node that is ready runs, a weight's H2D among them, and the plan is undone.

Node order: the file order is the planned order — Constant nodes first (they take no position),
then for each position p the H2Ds placed before p, node p, the D2Hs placed after p, then the H2Ds at
the end — re-sorted into onnxruntime's PRIORITY_BASED order (`offloadctl.analysis.graph.execution_order`),
so the file order is exactly the order onnxruntime runs. Copy nodes placed among backward nodes
(``__backwardpass``) carry that attribute too, so that the priority order keeps them there.

Every copy node carries the internal attribute ``__offload`` (its own name; onnx allows attributes
whose name starts with "__" on any operator). Without it onnxruntime's common subexpression
elimination merges the H2Ds of two reload groups of one tensor (same op, same input) into the
first one, which keeps the tensor on the device across the gap the plan offloads.

Names: copy nodes are ``offload{id}/d2h``, ``offload{id}/h2d{g}`` and ``offload{id}/h2d_out``; copy
outputs ``{tensor}__offload{id}_host`` and ``{tensor}__offload{id}_dev{g}`` (a renamed graph output:
``{tensor}__offload{id}_device``); a suffix is added on any clash. Unnamed or duplicate-named
nodes get the unique label the analysis gives them, so profiled node names match plan labels.

The model keeps its IR version and opset imports. Inputs whose dimensions were pinned at planning
time (``model.input_shapes`` of the plan) stay pinned: the plan's sizes hold for those shapes.
"""

from __future__ import annotations

import functools
import json
import logging
from collections import Counter, defaultdict
from collections.abc import Container
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from offloadctl._version import __version__
from offloadctl.analysis.graph import Analysis
from offloadctl.analysis.order import execution_order, priority_ranks, sorted_priority_order
from offloadctl.contract.check import check_plan_for_model
from offloadctl.contract.order_pins import (
    RESHAPE_OPS,
    d2h_pinnable,
    h2d_pinnable,
    host_positions,
    pin_layout,
    pin_rank,
)
from offloadctl.core.bulk import paused_gc
from offloadctl.core.errors import OffloadError
from offloadctl.core.memcpy import MEMCPY_FROM_HOST, MEMCPY_TO_HOST, register_schemas
from offloadctl.core.onnxutil import (
    BACKWARD_ATTR,
    PIN_ATTR,
    held_elsewhere,
    inferred_copy,
    is_backward,
    is_constant_node,
    iter_graphs,
    rename_outer,
    shape_only_copy,
    subgraphs,
)
from offloadctl.core.plantypes import Offload, Plan, Use
from offloadctl.loading.placed import HostPlacement, HostRecord, device_name, reads_host_memory, writes_host_memory
from offloadctl.loading.tensors import TensorInfo
from offloadctl.rewriting.metadata import (
    KEY_OFFLOADS,
    KEY_PINS,
    KEY_PLAN_SHA256,
    KEY_PLANNED_AT,
    KEY_SESSION,
    KEY_UNPINNED,
    KEY_VERSION,
    make_session_settings,
    plan_sha256,
    set_metadata,
)
from offloadctl.simulation.costs import COPY_MODES

__all__ = [
    "ApplyResult",
    "RewriteOptions",
    "TARGETS",
    "apply_plan",
    "target_for",
]

logger = logging.getLogger(__name__)

_COPY_ATTR = "__offload"  # the copy's own name: keeps copies of one tensor distinct (see module docstring)

register_schemas()  # so onnx.checker accepts the models this module produces


@dataclass
class ApplyResult:
    """What `apply_plan` inserted (for summaries and tests)."""

    d2h: int = 0
    h2d: int = 0
    activations: int = 0
    parameters: int = 0
    reordered: int = 0  # nodes onnxruntime runs at another place than planned (Shape/Size first)
    copy_nodes: list[str] = field(default_factory=list)
    pins: int = 0  # no-op views added to hold copies in place (`RewriteOptions.order_pins`)
    unpinned: list[str] = field(default_factory=list)  # copies no pin could hold (and why)
    # the copies onnxruntime would insert between host and device on the plan's device, written in place
    across: int = 0
    # with copies on streams: the guards against onnxruntime's multi-stream in-place defect (`guards`)
    guards: list[str] = field(default_factory=list)
    copy_mode: str = "inline"  # how the copies were written (inline, or streams with a partition file)
    # with copies on streams: the loads written in line, on the compute stream (no gate holds them, or one
    # issued early would raise the peak above the rewrite in line: `offloadctl.rewriting.preview.loads_in_line`)
    in_line: list[str] = field(default_factory=list)
    # why copies asked on streams were written in line (None: written as asked)
    written_in_line: str | None = None


#: the providers a rewrite's order pins are built for (`RewriteOptions.target`)
TARGETS: dict[str, str] = {
    "gpu": "the CPU, CUDA and WebGPU providers: Shape of a device tensor writes its output to host memory",
    "ascend": "CANN: no Shape kernel, so a pin may read a device tensor only where its own node does",
}


def target_for(device: str) -> str:
    """The pins' target (`TARGETS`) for the device a plan was made for (``plan --device``)."""
    return "ascend" if device_name(device) == "ascend" else "gpu"


@dataclass(frozen=True)
class RewriteOptions:
    """How a plan is written into the model.

    Attributes:
        order_pins: add the no-op views that hold every copy where it was planned in any execution
            order (onnxruntime's DEFAULT order included: the only one hosts other than Python run).
            Without them only PRIORITY_BASED keeps the plan (``apply --no-order-pins``).
        pin_shapes: keep the input dimensions pinned at planning time in the rewritten model
            (``apply --pin-shapes``); by default the model keeps the source's symbolic dimensions.
        target: the providers the pins are built for (`TARGETS`, ``apply --target``): with
            ``ascend`` no pin node reads a device tensor (CANN runs Shape on the CPU, which would copy
            the whole tensor), so H2D copies, and D2H copies whose view needs Shape(t), go unpinned.
        copies: ``inline`` (on the compute stream) or ``streams`` (``apply --copies streams``: on a
            stream of their own, with the events and the partition file of
            `offloadctl.rewriting.streams`; the job adds them to the rewrite and writes the file).
        share_weights: leave the data of the source's large embedded weights out of the rewrite
            (`offloadctl.core.onnxutil.held_elsewhere`): the rewrite is written with
            `offloadctl.rewriting.writing.write_model` and ``weights_from`` the source, which takes them
            from there, so a model of 100 MB of weights is never copied in memory.
        streams_above_inline: with ``copies="streams"``, write the copies on streams even where the
            rewrite would then peak above the same plan in line (``apply --copies streams`` asked so);
            by default such a rewrite is written in line, and says why.
    """

    order_pins: bool = True
    pin_shapes: bool = False
    target: str = "gpu"
    copies: str = "inline"
    share_weights: bool = False
    streams_above_inline: bool = False

    def __post_init__(self) -> None:
        if self.target not in TARGETS:
            raise OffloadError(f"unknown target {self.target!r}", hint=f"use one of: {', '.join(TARGETS)}")
        if self.copies not in COPY_MODES:
            raise OffloadError(f"unknown copy mode {self.copies!r}", hint=f"use one of: {', '.join(COPY_MODES)}")


@paused_gc()
def apply_plan(
    plan: Plan,
    analysis: Analysis,
    *,
    result: ApplyResult | None = None,
    options: RewriteOptions | None = None,
) -> onnx.ModelProto:
    """Return a copy of the analysed model with the plan's copies inserted.

    Args:
        plan: a validated plan at stage "scheduled", made for this model.
        analysis: the analysis of the model (with the plan's input shapes).
        result: filled with counts of what was inserted, when given.
        options: order pins and shapes (`RewriteOptions`; its defaults when None).

    Raises:
        OffloadError: the plan does not fit the model (unknown tensor, other kind, other uses,
            positions beyond the model) or is not scheduled.
    """
    register_schemas()
    if plan.get("stage") != "scheduled":
        raise OffloadError(
            f"the plan is at stage {plan.get('stage')!r}; apply needs a scheduled plan",
            hint="run offloadctl prefetch on it first (or offloadctl plan to do every stage)",
        )
    check_plan_for_model(plan, analysis)
    rewriter = _Rewriter(plan, analysis, result if result is not None else ApplyResult(), options or RewriteOptions())
    return rewriter.run()


# ---------------------------------------------------------------------------------------------
# Names


class _ModelNames:
    """Every tensor name of the model, subgraphs included, asked one name at a time (new names must
    clash with none): the analysis's maps answer for the main graph's nodes and weights, a set
    holds the few others (graph inputs and outputs, value_info, sparse weights, subgraphs)."""

    def __init__(self, analysis: Analysis, nodes: list[onnx.NodeProto]) -> None:
        graph = analysis.loaded.proto.graph
        self._maps = (analysis.producer, analysis.uses, analysis.weights)
        names = set(analysis.graph_inputs) | set(analysis.graph_outputs)
        names.update(v.name for v in graph.value_info)
        names.update(v.name for v in graph.input)
        names.update(s.values.name for s in graph.sparse_initializer)
        for node in nodes:
            if node.attribute:
                for sub in subgraphs(node):
                    for g in iter_graphs(sub):
                        names.update(v.name for v in g.input)
                        names.update(v.name for v in g.output)
                        names.update(v.name for v in g.value_info)
                        names.update(t.name for t in g.initializer)
                        names.update(s.values.name for s in g.sparse_initializer)
                        for inner in g.node:
                            names.update(inner.input)
                            names.update(inner.output)
        names.discard("")
        self._others = names

    def __contains__(self, name: object) -> bool:
        return name in self._others or any(name in names for names in self._maps)


class _Names:
    """Hands out names that clash with nothing in the model (``taken``) and with each other."""

    def __init__(self, taken: Container[str]) -> None:
        self.taken = taken
        self.given: set[str] = set()

    def new(self, base: str) -> str:
        name, k = base, 1
        while name in self.given or name in self.taken:
            name = f"{base}_{k}"
            k += 1
        self.given.add(name)
        return name


def _int_attr(name: str, value: int) -> onnx.AttributeProto:
    """An int attribute, as ``helper.make_attribute`` makes it (without its type checks: the copies and
    pins of a big plan are tens of thousands of nodes)."""
    return onnx.AttributeProto(name=name, type=onnx.AttributeProto.INT, i=value)


def _string_attr(name: str, value: str) -> onnx.AttributeProto:
    """A string attribute, as ``helper.make_attribute`` makes it."""
    return onnx.AttributeProto(name=name, type=onnx.AttributeProto.STRING, s=value.encode("utf-8"))


def _value_info(name: str, info: TensorInfo) -> onnx.ValueInfoProto:
    """``helper.make_tensor_value_info`` of the tensor's type, its type built once per distinct type."""
    return onnx.ValueInfoProto(name=name, type=_tensor_type(info.elem_type or TensorProto.UNDEFINED, info.shape))


@functools.lru_cache(maxsize=4096)
def _tensor_type(elem_type: int, shape: tuple[int | str | None, ...] | None) -> onnx.TypeProto:
    """The type `_value_info` gives (shared: protobuf copies it into each value_info)."""
    return helper.make_tensor_type_proto(elem_type, None if shape is None else list(shape))


# Constant attributes holding a number or a list: the field that holds it and the numpy type.
_CONSTANT_NUMBERS = {
    "value_float": ("f", np.float32),
    "value_floats": ("floats", np.float32),
    "value_int": ("i", np.int64),
    "value_ints": ("ints", np.int64),
}


def _constant_to_initializer(node: onnx.NodeProto) -> TensorProto:
    """The tensor a Constant node produces, as an initializer named like its output."""
    for attr in node.attribute:
        if attr.name == "value" and attr.type == onnx.AttributeProto.TENSOR:
            tensor = TensorProto()
            tensor.CopyFrom(attr.t)
            break
        if attr.name in _CONSTANT_NUMBERS:
            field, dtype = _CONSTANT_NUMBERS[attr.name]
            value = getattr(attr, field)
            tensor = numpy_helper.from_array(np.array(value if field in ("f", "i") else list(value), dtype=dtype))
            break
    else:
        raise OffloadError(
            f"Constant node {node.name or node.output[0]!r} holds a sparse or string value, which cannot be offloaded",
            hint=f"remove tensor {node.output[0]!r} from the plan",
        )
    tensor.name = node.output[0]
    return tensor


# ---------------------------------------------------------------------------------------------
# The rewrite


class _Rewriter:
    def __init__(self, plan: Plan, analysis: Analysis, result: ApplyResult, options: RewriteOptions) -> None:
        self.plan = plan
        self.analysis = analysis
        self.result = result
        self.options = options
        self.sources: dict[str, str] = {}  # value_info written here -> the tensor whose type it has
        self.constraints: list[dict[str, str]] = []  # {"copy": name, "before"|"after": original node}
        source = analysis.loaded.proto
        if options.share_weights:  # large weights stay the source's: the writer takes them from there
            self.model = shape_only_copy(source, held_elsewhere)
        else:
            self.model = onnx.ModelProto()
            self.model.CopyFrom(source)
        self.graph = self.model.graph
        # The copy's own nodes, edited in place; the graph's node list is rebuilt from them at the
        # end (protobuf keeps these references valid after they are removed from the list).
        self.file_nodes = list(self.graph.node)
        self.pos_nodes = [self.file_nodes[i] for i in analysis.file_index]
        self.constant_files = [i for i, n in enumerate(self.file_nodes) if is_constant_node(n)]
        self.tensors = _Names(_ModelNames(analysis, self.pos_nodes))
        self.before: dict[int, list[onnx.NodeProto]] = defaultdict(list)
        self.after: dict[int, list[onnx.NodeProto]] = defaultdict(list)
        self.value_infos: list[onnx.ValueInfoProto] = []
        self.converted: set[int] = set()  # file indices of Constant nodes turned into initializers
        self.graph_input_names = {v.name for v in self.graph.input}
        self.graph_output_names = {v.name for v in self.graph.output}
        self.reroutes: dict[str, list[Use]] = {}  # an H2D's device output -> the uses that read it
        self.h2d_pins: list[tuple[onnx.NodeProto, onnx.NodeProto]] = []  # (an H2D, the Concat of its view)
        self.renamed: dict[str, int] = {}  # a new name of an original node's output -> its position
        self.across: set[str] = set()  # the copies onnxruntime would insert, written here (no pin holds them)
        self._name_nodes()

    def _name_nodes(self) -> None:
        """Give unnamed and duplicate-named nodes unique names; positions get the analysis labels."""
        names = [node.name for node in self.file_nodes]
        counts = Counter(names)
        self.nodes = _Names({name for name, c in counts.items() if c == 1 and name})
        for pos, i in enumerate(self.analysis.file_index):
            if not names[i] or counts[names[i]] > 1:
                self.pos_nodes[pos].name = self.nodes.new(self.analysis.node_names[pos])
        for i in self.constant_files:
            node = self.file_nodes[i]
            if not names[i] or counts[names[i]] > 1:
                node.name = self.nodes.new(f"{node.name or node.op_type}#{i}")

    def _copy_node(self, op: str, src: str, dst: str, name: str, beside: int) -> onnx.NodeProto:
        name = self.nodes.new(name)
        attributes = [_string_attr(_COPY_ATTR, name)]
        n = self.analysis.num_positions
        if n and self.analysis.backward and is_backward(self.pos_nodes[min(beside, n - 1)]):
            attributes.append(_int_attr(BACKWARD_ATTR, 1))
        node = onnx.NodeProto(op_type=op, input=[src], output=[dst], name=name, attribute=attributes)
        self.result.copy_nodes.append(node.name)
        return node

    def _typed(self, name: str, tensor: str, info: TensorInfo) -> None:
        """Write ``name``'s value_info: the type of ``tensor`` (onnx infers no type for a copy)."""
        self.value_infos.append(_value_info(name, info))
        self.sources[name] = tensor

    def _reroute(self, use: Use, old: str, new: str) -> None:
        node = self.pos_nodes[use["position"]]
        index = use["input_index"]
        if index is None:
            if (
                sum(rename_outer(g, old, new) for g in subgraphs(node)) == 0
            ):  # pragma: no cover - the plan check rules this out
                raise AssertionError(f"node {node.name!r} has no subgraph read of {old!r}")
            return
        if node.input[index] != old:  # pragma: no cover - the plan check rules this out
            raise AssertionError(f"node {node.name!r} input {index} is {node.input[index]!r}, not {old!r}")
        node.input[index] = new

    def _offload_activation(self, off: Offload, info: TensorInfo) -> None:
        tensor, oid, d2h_after = off["tensor"], off["id"], off["d2h_after"]
        assert off["producer"] is not None and d2h_after is not None  # checked when the plan was read
        source = tensor
        if off["graph_output"] and off["output_h2d_before"] is not None:
            source = self.tensors.new(f"{tensor}__offload{oid}_device")
            producer = self.pos_nodes[off["producer"]["position"]]
            for k, name in enumerate(producer.output):
                if name == tensor:
                    producer.output[k] = source
            self.renamed[source] = off["producer"]["position"]
            for use in off["device_uses"]:
                self._reroute(use, tensor, source)
            for vi in self.graph.value_info:
                if vi.name == tensor:
                    vi.name = source
            self._typed(source, tensor, info)
        host = self.tensors.new(f"{tensor}__offload{oid}_host")
        d2h = self._copy_node(MEMCPY_TO_HOST, source, host, f"offload{oid}/d2h", d2h_after)
        self.after[d2h_after].append(d2h)
        self._typed(host, tensor, info)
        self.result.d2h += 1
        self._reload_groups(off, info, host)
        if off["graph_output"] and off["output_h2d_before"] is not None:
            at = off["output_h2d_before"]
            self.before[at].append(self._copy_node(MEMCPY_FROM_HOST, host, tensor, f"offload{oid}/h2d_out", at))
            self.result.h2d += 1

    def _offload_parameter(self, off: Offload, info: TensorInfo) -> None:
        tensor = off["tensor"]
        if tensor in self.analysis.constants:
            index = self.analysis.constants[tensor]
            self.graph.initializer.append(_constant_to_initializer(self.file_nodes[index]))
            self.converted.add(index)
        if tensor not in self.graph_input_names:
            self.graph.input.append(_value_info(tensor, info))
            self.graph_input_names.add(tensor)
        self._reload_groups(off, info, tensor)

    def _reload_groups(self, off: Offload, info: TensorInfo, feed: str) -> None:
        tensor, oid = off["tensor"], off["id"]
        for g, group in enumerate(off["reload_groups"]):
            out = self.tensors.new(f"{tensor}__offload{oid}_dev{g}")
            at = group["h2d_before"]
            assert at is not None  # a scheduled plan has every H2D position
            self.before[at].append(self._copy_node(MEMCPY_FROM_HOST, feed, out, f"offload{oid}/h2d{g}", at))
            self._typed(out, tensor, info)
            self.result.h2d += 1
            for use in group["uses"]:
                self._reroute(use, tensor, out)
            self.reroutes[out] = list(group["uses"])

    def _copy_across(self) -> None:
        """Write the copies onnxruntime inserts between host and device memory on the plan's device
        (``options.select.host_copies``, found with ``plan --device``), each right before the first node
        that reads its tensor on the other side, those nodes reading the copy. onnxruntime appends the
        copies it inserts after every node, so that under PRIORITY_BASED the nodes that wait for one are
        held back while every node that is ready runs, every H2D of a weight among them: the plan undone.
        Written here, no copy is inserted and each runs where it is needed. A tensor read across inside
        an If/Loop/Scan body, or offloaded (forced), is left to onnxruntime."""
        select = self.plan["options"].get("select", {})
        copies = set(select.get("host_copies") or ())
        if not copies:
            return
        analysis = self.analysis
        host = host_positions(analysis, select.get("host_nodes", ()))
        copies -= {off["tensor"] for off in self.plan["offloads"]}
        inputs, nodes = set(analysis.graph_inputs), analysis.nodes
        for tensor in sorted(copies):
            made_by = analysis.producer.get(tensor)
            if made_by is None and tensor not in inputs:
                continue  # a weight: onnxruntime places it beside the nodes that read it
            in_host = made_by is None or writes_host_memory(nodes[made_by], made_by in host)
            reads = [(u.position, u.input_index) for u in analysis.uses.get(tensor, [])]
            if any(k is None for _, k in reads):
                continue
            across = [
                (p, k) for p, k in reads if k is not None and reads_host_memory(nodes[p], k, p in host) != in_host
            ]
            info = analysis.infos.get(tensor)
            if not across or info is None:
                continue
            first = across[0][0]
            side = "device" if in_host else "host"
            out = self.tensors.new(f"{tensor}__to_{side}")
            op = MEMCPY_FROM_HOST if in_host else MEMCPY_TO_HOST
            copy = self._copy_node(op, tensor, out, f"across/{tensor}", first)
            self.before[first].append(copy)
            self.across.add(copy.name)
            self._typed(out, tensor, info)
            for p, k in across:
                self.pos_nodes[p].input[k] = out
            self.result.across += 1

    def run(self) -> onnx.ModelProto:
        analysis = self.analysis
        for off in self.plan["offloads"]:
            info = analysis.infos[off["tensor"]]
            if off["kind"] == "activation":
                self._offload_activation(off, info)
                self.result.activations += 1
            else:
                self._offload_parameter(off, info)
                self.result.parameters += 1
        self._copy_across()

        n = analysis.num_positions
        if self.options.order_pins:
            _Pins(self).add()
        # the DEFAULT walk picks inputs by node index: a plan made for it keeps the original nodes'
        # relative file order (their indices), each copy beside the node it is planned at
        sequence = range(n) if analysis.order != "default" else sorted(range(n), key=analysis.file_index.__getitem__)
        planned: list[onnx.NodeProto] = []
        at = [0] * n  # where each position's node is in planned
        for p in sequence:
            planned += self.before.get(p, [])
            at[p] = len(planned)
            planned.append(self.pos_nodes[p])
            planned += self.after.get(p, [])
        planned += self.before.get(n, [])
        constants = [self.file_nodes[i] for i in self.constant_files if i not in self.converted]

        graph = self.graph
        if analysis.order == "default":
            del graph.node[:]
            graph.node.extend(constants + _after_their_copies(planned, self.h2d_pins))
            return self._finish()
        # The planned order is topological by construction; without a backward node (so without a
        # backward copy) onnxruntime's priority order is the file order with each Shape/Size (an order
        # pin's, the model's own) run as soon as it is ready. With one, Kahn's algorithm gives it.
        order = list(range(len(planned))) if analysis.plain_priority and not self.result.pins else None
        if not order and not analysis.backward:  # then no copy or pin is a backward node either
            ranks = priority_ranks(planned, forward_only=True)
            order = sorted_priority_order(planned, ranks, self._producers(planned, at))
        if order is None:
            available = {v.name for v in graph.input} | {t.name for t in graph.initializer}
            available |= {s.values.name for s in graph.sparse_initializer}
            available |= {o for node in constants for o in node.output if o}
            order, _ = execution_order(planned, available)
        self.result.reordered = sum(1 for k, i in enumerate(order) if k != i)
        if self.result.reordered:
            logger.info(
                "onnxruntime runs %d node(s) at another place than planned (Shape/Size run as soon as ready); "
                "the file follows onnxruntime's order",
                self.result.reordered,
            )
        del graph.node[:]
        graph.node.extend(constants + _after_their_copies([planned[i] for i in order], self.h2d_pins))
        return self._finish()

    def _producers(self, planned: list[onnx.NodeProto], at: list[int]) -> dict[str, int]:
        """The index in ``planned`` of the node that makes each tensor: the analysis's producers
        (at their positions' places ``at``), the outputs renamed here, then the nodes added here
        (the only other outputs), without reading every node's outputs again."""
        producer = {name: at[p] for name, p in self.analysis.producer.items()}
        for name, p in self.renamed.items():
            producer[name] = at[p]
        originals = set(at)
        for i, node in enumerate(planned):
            if i not in originals:
                for out in node.output:
                    if out:
                        producer[out] = i
        return producer

    def _finish(self) -> onnx.ModelProto:
        """Type the new tensors, give back the symbolic types and write the metadata."""
        analysis, graph = self.analysis, self.graph
        graph.value_info.extend(self.value_infos)
        loaded = analysis.loaded
        if loaded.declared_types and not self.options.pin_shapes:
            _restore_symbolic_types(self.model, loaded.declared_types, self.sources)

        weights = any(off["kind"] == "parameter" for off in self.plan["offloads"])
        settings = make_session_settings(
            weights_offloaded=weights, pinned=bool(self.result.pins), optimized=self.plan["model"].get("optimized")
        )
        if self.result.pins:
            settings["pins_for"] = self.options.target
        values = {
            KEY_VERSION: __version__,
            KEY_PLAN_SHA256: plan_sha256(self.plan),
            KEY_OFFLOADS: str(len(self.plan["offloads"])),
            KEY_SESSION: json.dumps(settings, sort_keys=False),
            KEY_PLANNED_AT: json.dumps(
                {
                    "input_shapes": loaded.input_shapes,
                    "dims": loaded.dims,
                    "execution_order": analysis.order,
                    **_device_record(self.plan),
                }
            ),
        }
        if self.constraints:
            values[KEY_PINS] = json.dumps(self.constraints, separators=(",", ":"))
        if self.result.unpinned:
            values[KEY_UNPINNED] = json.dumps(self.result.unpinned, separators=(",", ":"))
        set_metadata(self.model, values)
        return self.model


def _device_record(plan: Plan) -> dict[str, HostRecord]:
    """What a plan made for a device (``plan --device``) knows of it, for the rewrite's
    ``offloadctl.planned_at``: the device and how, the nodes it runs on the host, the tensors onnxruntime
    copies there and the Casts it inserts (`simulate REWRITE` counts the rewrite as that device runs it).
    Empty for any other plan."""
    host = HostPlacement.of_record(plan["options"].get("select", {}))
    if not host.device:
        return {}
    return {"device": {"host_device": host.device, **host.record()}}  # the device first, as rewrites record it


class _Pins:
    """Builds the order pins of `offloadctl.contract.order_pins.pin_layout` (where they go, why a pin never
    makes a cycle and never has a device node read a host tensor, is said there): for the D2Hs after
    p, the node and input ``layout.d2h[p]`` names reads that input through
    ``Reshape(t, Concat(zeros, Shape(OptionalHasElement(Optional(host))), ...))``; each H2D before q
    gets ``Reshape(dev, Concat(zeros, Shape(o, start=0, end=0)))`` on its device output, which its
    uses then read, o the output ``layout.h2d[q]`` names. Every pin node carries ``__offload_pin``
    (1 on the view)."""

    def __init__(self, rewriter: _Rewriter) -> None:
        self.rw = rewriter
        self.layout = pin_layout(rewriter.plan, rewriter.analysis)
        self.pending: list[onnx.NodeProto] = []
        self.zeros: dict[int, str] = {}  # rank -> an int64 initializer of that many zeros
        self.backward = False  # the pin being built holds a backward node or copy
        self.d2h_concats: dict[str, onnx.NodeProto] = {}  # a D2H view -> the Concat its empties join

    def add(self) -> None:
        rw, layout = self.rw, self.layout
        rw.result.unpinned += layout.unpinned
        ascend = rw.options.target == "ascend"
        # H2Ds first: a node held for a D2H may read a reloaded tensor, and then views the H2D's view
        for q, (source, j) in layout.h2d.items():
            if ascend:
                count = sum(c.op_type == MEMCPY_FROM_HOST for c in rw.before[q])
                rw.result.unpinned.append(
                    f"{count} H2D copy(ies) before position {q}: on ascend a pin would run Shape of a device "
                    "tensor on the CPU (CANN has no Shape kernel) and copy it"
                )
                continue
            self._hold_h2d(q, source, j)
        for p, (target, k) in layout.d2h.items():
            tensor = rw.pos_nodes[target].input[k]
            if ascend and pin_rank(rw.analysis, rw.sources.get(tensor, tensor)) is None:
                rw.result.unpinned.append(
                    f"{len(rw.after[p])} D2H copy(ies) after position {p}: the held tensor's rank is unknown, and on "
                    "ascend its Shape would be a copy"
                )
                continue
            copies = [c for c in rw.after[p] if d2h_pinnable(rw.analysis, rw.sources.get(c.input[0], c.input[0]))]
            if copies:  # the others are counted as unpinned by the layout
                self._hold_d2h(copies, target, k)

    def _node(self, op: str, inputs: list[str], label: str, **attrs: int) -> str:
        rw = self.rw
        out = rw.tensors.new(f"{inputs[0]}__{label.replace('/', '_')}")
        attributes = [_int_attr(key, attrs[key]) for key in sorted(attrs)]  # as helper.make_node orders them
        attributes.append(_int_attr(PIN_ATTR, 1 if op == "Reshape" else 0))
        if self.backward:  # onnxruntime's priority order runs a training graph's backward nodes apart
            attributes.append(_int_attr(BACKWARD_ATTR, 1))
        name = rw.nodes.new(f"offload/pin/{label}")
        self.pending.append(onnx.NodeProto(op_type=op, input=inputs, output=[out], name=name, attribute=attributes))
        return out

    def _empty_shape(self, tensor: str, label: str) -> str:
        """An empty int64 tensor that depends on ``tensor`` (a device activation)."""
        if not self.layout.slice_form:
            return self._node("Shape", [tensor], f"{label}/dep", start=0, end=0)
        shape = self._node("Shape", [tensor], f"{label}/dep_shape")
        zero = self.rw.tensors.new(f"{label.replace('/', '_')}__zero")
        self.rw.graph.initializer.append(numpy_helper.from_array(np.zeros(1, np.int64), zero))
        return self._node("Slice", [shape, zero, zero], f"{label}/dep")

    def _host_empty(self, host: str, label: str) -> str:
        """An empty int64 tensor that depends on the host tensor ``host``, computed on the CPU alone:
        Optional and OptionalHasElement have no device kernels, and the Shape of their bool scalar
        reads a CPU tensor that is neither fp16 nor bf16."""
        wrapped = self._node("Optional", [host], f"{label}/optional")
        present = self._node("OptionalHasElement", [wrapped], f"{label}/present")
        return self._node("Shape", [present], f"{label}/dep")

    def _zeros(self, rank: int) -> str:
        if rank not in self.zeros:
            name = self.rw.tensors.new(f"offload_pin_zeros{rank}")
            self.rw.graph.initializer.append(numpy_helper.from_array(np.zeros(rank, np.int64), name))
            self.zeros[rank] = name
        return self.zeros[rank]

    def _view(self, tensor: str, empties: list[str], label: str, out: str | None = None) -> str:
        """``tensor`` through a no-op view that depends on ``empties`` (named ``out`` if given)."""
        rw = self.rw
        source = rw.sources.get(tensor, tensor)
        rank = pin_rank(rw.analysis, source)
        shape = self._zeros(rank) if rank is not None else self._node("Shape", [tensor], f"{label}/shape")
        joined = self._node("Concat", [shape, *empties], f"{label}/concat", axis=0)
        self.concat = self.pending[-1]
        view = self._node("Reshape", [tensor, joined], f"{label}/view")
        if out is not None:
            self.pending[-1].output[0] = view = out
        info = rw.analysis.infos.get(source)
        if info is not None and out is None:
            rw._typed(view, source, info)
        rw.result.pins += 1
        return view

    def _hold_d2h(self, copies: list[onnx.NodeProto], target: int, k: int) -> None:
        rw = self.rw
        node = rw.pos_nodes[target]
        label = f"d2h@{target}"
        self.pending = []
        self.backward = rw.analysis.backward and is_backward(node)
        empties = [self._host_empty(c.output[0], f"{label}/{c.name}") for c in copies]
        concat = self.d2h_concats.get(node.input[k])
        if concat is not None:
            # the node already reads a view for earlier D2Hs: that view waits for these too (a view of
            # a view is a Reshape after a Reshape, which onnxruntime's fusions merge wrongly)
            concat.input.extend(empties)
            at = next(i for i, n in enumerate(rw.before[target]) if n is concat)
            rw.before[target][at:at] = self.pending
        else:
            view = self._view(node.input[k], empties, label)
            node.input[k] = view
            self.d2h_concats[view] = self.concat
            rw.before[target].extend(self.pending)
        rw.constraints += [{"copy": c.name, "before": node.name} for c in copies]

    def _hold_h2d(self, q: int, source: int, j: int) -> None:
        """Each H2D before q: its uses (or the graph output it feeds) read a view of its device output
        that waits for output j of the node at ``source`` (before q, or in the DEFAULT walk of a forward
        graph after it: `offloadctl.contract.order_pins.waits_ahead`); the pin's nodes follow the copies and
        that node in the file."""
        rw = self.rw
        node = rw.pos_nodes[source]
        self.pending = []
        self.backward = rw.analysis.backward and is_backward(node)
        empty = self._empty_shape(node.output[j], f"h2d@{q}")
        for copy in [c for c in rw.before[q] if c.op_type == MEMCPY_FROM_HOST and c.name not in rw.across]:
            self.backward = rw.analysis.backward and is_backward(copy)
            tensor = rw.sources.get(copy.output[0], copy.output[0])
            dev = copy.output[0]
            uses = rw.reroutes.get(dev, [])
            if not h2d_pinnable(rw.analysis, tensor) or any(
                rw.analysis.nodes[u["position"]].op_type in RESHAPE_OPS for u in uses
            ):
                continue  # counted as unpinned by the layout
            if dev in rw.graph_output_names:  # an H2D that feeds a graph output: the view takes its name
                copy.output[0] = rw.tensors.new(f"{dev}__pinned")
                rw._typed(copy.output[0], tensor, rw.analysis.infos[tensor])
                self._view(copy.output[0], [empty], f"h2d@{q}/{copy.name}", out=dev)
            else:
                view = self._view(dev, [empty], f"h2d@{q}/{copy.name}")
                for use in uses:
                    rw._reroute(use, dev, view)
            pin = {"copy": copy.name, "after": node.name}
            rw.constraints.append(pin if source < q else {**pin, "order": "default"})
            rw.h2d_pins.append((copy, self.concat))
        rw.before[max(q, source + 1)].extend(self.pending)  # after the copies and the node waited for


def _after_their_copies(nodes: list[onnx.NodeProto], pairs: list[tuple[onnx.NodeProto, onnx.NodeProto]]) -> list:
    """``nodes`` with each H2D pin's Concat moved right after its H2D where it came before it: the
    DEFAULT walk explores a view's inputs highest index first, so the Concat (and the node it waits
    for) must have the higher index. The Concat reads only a constant and an earlier node's empty
    shape, and only the view (after the H2D) reads it, so the order stays topological."""
    if not pairs:
        return nodes
    at = {id(n): k for k, n in enumerate(nodes)}
    late = {id(concat): copy for copy, concat in pairs if at[id(concat)] < at[id(copy)]}
    if not late:
        return nodes
    follows: dict[int, list[onnx.NodeProto]] = defaultdict(list)
    for copy, concat in pairs:
        if id(concat) in late:
            follows[id(copy)].append(concat)
    moved: list[onnx.NodeProto] = []
    for node in nodes:
        if id(node) not in late:
            moved.append(node)
            moved += follows.get(id(node), [])
    return moved


def _restore_symbolic_types(model: onnx.ModelProto, declared: dict[str, bytes], sources: dict[str, str]) -> None:
    """Give graph inputs, outputs and value_info back the types the source declared before its
    pins, and type the value_info written here (copies, views) like their tensors in the model as
    declared (onnx's inference of it; a dimension onnx cannot name stays unnamed)."""
    graph = model.graph
    for vi in [*graph.input, *graph.output, *graph.value_info]:
        if vi.name in declared:
            vi.type.ParseFromString(declared[vi.name])
    ours = set(sources)

    def declared_only(work: onnx.ModelProto) -> None:  # infer the rest from the declared inputs
        kept = [vi for vi in work.graph.value_info if vi.name not in ours and vi.name in declared]
        del work.graph.value_info[:]
        work.graph.value_info.extend(kept)

    inferred = inferred_copy(model, declared_only)
    types = {vi.name: vi.type for vi in [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]}
    for vi in graph.value_info:
        if vi.name not in ours:
            continue
        found = types.get(sources[vi.name])
        if found is None:
            vi.type.tensor_type.ClearField("shape")
            continue
        vi.type.CopyFrom(found)
        for dim in vi.type.tensor_type.shape.dim:
            if dim.HasField("dim_param") and dim.dim_param.startswith("unk__"):
                dim.ClearField("dim_param")
