"""Where onnxruntime puts a model on a device: plugin execution providers and the copies it inserts.

This module owns two things every non-CPU run needs:

* **Plugin providers** (WebGPU, package ``onnxruntime-ep-webgpu``): onnxruntime loads them from a
  library at run time; they are not in ``get_available_providers()`` and are not named in
  ``providers=``. `add_plugin_provider` registers the library once per process and adds the
  provider's device to the session options (``add_provider_for_devices``).
* **Inserted copies**: a node on a device provider that reads a host tensor (any op but
  ``MemcpyFromHost``), or a host node that reads a device tensor, gets a copy that onnxruntime
  inserts itself (``Memcpy``, ``Memcpy_token_N``). A rewrite whose copy is answered by such an
  inserted copy is undone on that device: the tensor goes straight back. The graph onnxruntime runs
  is saved while the session is made (``optimized_model_filepath``) and `inserted_copies` reads the
  copies from it, with the tensor each one moves and whether it touches the rewrite's own nodes;
  `inserted_casts` reads the Casts the CPU provider's float16 fallback inserted.
* **The placement rule of CUDA and CANN**, replicated (`predicted_copies`): both call onnxruntime's
  ``GetCpuPreferredNodes``, which a CPU-only machine cannot run; the rewrite's pins are checked
  against it for every element type. `predicted_casts` replicates the Casts the CPU provider's
  float16 fallback inserts there (checked against those onnxruntime inserts on WebGPU).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict

import onnx

from offloadctl.core.errors import OffloadError
from offloadctl.core.onnxutil import ONNX_DOMAINS, PIN_ATTR, has_subgraphs
from offloadctl.loading.ortgraph import INSERTED_CAST_PREFIX
from offloadctl.loading.placed import CPU_INPUTS, CPU_OUTPUT_OPS, HostCast

__all__ = [
    "PLUGINS",
    "InsertedCopy",
    "add_plugin_provider",
    "plugin_available",
    "inserted_copies",
    "inserted_casts",
    "inserted_nodes",
    "save_placed_graph",
    "Kernels",
    "CUDA_KERNELS",
    "CANN_KERNELS",
    "predicted_copies",
    "predicted_placement",
    "predicted_casts",
    "CPU_FLOAT16",
]

#: plugin provider name -> (Python module that ships the library, library registration name, pip package)
PLUGINS: dict[str, tuple[str, str, str]] = {
    "WebGpuExecutionProvider": ("onnxruntime_ep_webgpu", "WebGPU", "onnxruntime-ep-webgpu"),
}

_registered: set[str] = set()

#: onnxruntime's own copy ops (domain ""), the ones it inserts and the ones a rewrite writes
MEMCPY_OPS = frozenset({"MemcpyToHost", "MemcpyFromHost"})


def _plugin_module(provider: str) -> Any:
    module, _, package = PLUGINS[provider]
    try:
        return __import__(module)
    except ImportError:
        raise OffloadError(
            f"{provider} needs the plugin package {package}, which is not installed",
            hint=f"pip install 'offloadctl[webgpu]' (or pip install {package} beside onnxruntime>=1.24.4)",
        ) from None


def _devices(ort: Any, provider: str) -> list[Any]:
    module = _plugin_module(provider)
    _, name, _ = PLUGINS[provider]
    if provider not in _registered:
        if not hasattr(ort, "register_execution_provider_library"):
            raise OffloadError(
                f"onnxruntime {ort.__version__} cannot load plugin providers such as {provider}",
                hint="pip install 'onnxruntime>=1.24.4'",
            )
        try:
            ort.register_execution_provider_library(name, module.get_library_path())
        except Exception as exc:  # noqa: BLE001 - onnxruntime raises its own types; report them as one message
            if "already registered" not in str(exc):
                raise OffloadError(
                    f"onnxruntime could not load the {provider} library: {str(exc).strip().splitlines()[0]}",
                    hint=f"reinstall {PLUGINS[provider][2]} for this onnxruntime ({ort.__version__})",
                ) from None
        _registered.add(provider)
    return [d for d in ort.get_ep_devices() if d.ep_name == provider]


def plugin_available(ort: Any, provider: str) -> bool:
    """Whether ``provider`` (a plugin) has a device here."""
    try:
        return bool(_devices(ort, provider))
    except OffloadError:
        return False


def add_plugin_provider(ort: Any, sess_options: Any, provider: str, options: dict[str, str]) -> None:
    """Register ``provider``'s library (once per process) and add its first device to ``sess_options``.

    Raises:
        OffloadError: the plugin package is missing, or it finds no device (on a machine without a GPU
            the WebGPU provider needs a software Vulkan driver and ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER=1).
    """
    devices = _devices(ort, provider)
    if not devices:
        software = os.environ.get("ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER") == "1"
        raise OffloadError(
            f"{provider} found no device on this machine",
            hint="install a GPU driver with Vulkan support"
            + ("" if software else ", or set ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER=1 to use a software Vulkan driver")
            + ", or use --device cpu",
        )
    sess_options.add_provider_for_devices(devices[:1], dict(options))


class InsertedCopyDoc(TypedDict):
    """An inserted copy in a ``--json`` document (`InsertedCopy.to_json`)."""

    node: str
    op: str
    tensor: str
    of_rewrite: bool


@dataclass(frozen=True)
class InsertedCopy:
    """A copy onnxruntime inserted: its node, its op, the tensor it moves, and whether it reads or
    feeds one of the rewrite's own copy or pin nodes (then the plan is undone there)."""

    node: str
    op: str
    tensor: str
    of_rewrite: bool

    def to_json(self) -> InsertedCopyDoc:
        return {"node": self.node, "op": self.op, "tensor": self.tensor, "of_rewrite": self.of_rewrite}


def save_placed_graph(sess_options: Any, folder: str | os.PathLike[str]) -> Path:
    """Have the session being made save the graph it runs (weights to a side file) into ``folder``."""
    path = Path(folder) / "placed.onnx"
    sess_options.optimized_model_filepath = str(path)
    sess_options.add_session_config_entry("session.optimized_model_external_initializers_file_name", "placed.data")
    sess_options.add_session_config_entry("session.optimized_model_external_initializers_min_size_in_bytes", "1024")
    return path


def _rewrite_nodes(model: onnx.ModelProto) -> tuple[set[str], set[str]]:
    """The names of the nodes a rewrite wrote: (its copies and order pins, its copies)."""
    copies = {n.name for n in model.graph.node if n.op_type in MEMCPY_OPS}
    pins = {n.name for n in model.graph.node if any(a.name == PIN_ATTR for a in n.attribute)}
    return copies | pins, copies


def inserted_copies(placed: onnx.ModelProto, model: onnx.ModelProto) -> list[InsertedCopy]:
    """The Memcpy nodes of ``placed`` (the graph onnxruntime ran) that ``model`` does not have, in
    graph order. One belongs to the rewrite when it moves a tensor a rewrite node made, or feeds one of
    the rewrite's copies (a pin's view that reads a tensor copied anyway gets the copy the original
    node got)."""
    names = {n.name for n in model.graph.node}
    ours, copies = _rewrite_nodes(model)
    graph = placed.graph
    producer = {o: n for n in graph.node for o in n.output if o}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    found = []
    for node in graph.node:
        if node.op_type not in MEMCPY_OPS or node.name in names or not node.input:
            continue
        made = producer.get(node.input[0])
        fed = [r for o in node.output for r in readers.get(o, [])]
        mine = (made is not None and made.name in ours) or any(r.name in copies for r in fed)
        # a copy to the host writes the model's own tensor (its device producer writes a renamed one)
        moved = node.output[0] if node.op_type == "MemcpyToHost" and node.output else node.input[0]
        found.append(InsertedCopy(node.name, node.op_type, moved, mine))
    return found


def inserted_casts(
    placed: onnx.ModelProto, model: onnx.ModelProto, indices: Mapping[str, int | None] | None = None
) -> tuple[HostCast, ...]:
    """The Casts onnxruntime inserted in ``placed`` (the graph it ran) around float16 nodes the CPU
    provider has no float16 kernel for, as `HostCast` entries of ``model``'s tensors, in the order of
    their node indices where ``indices`` (node name -> onnxruntime's index, from a profile) has them
    (the order onnxruntime added them, which the executor's order follows), else in graph order:
    a Cast that writes one of ``model``'s tensors narrows the float32 output of the node that makes it;
    one that reads one widens it for the nodes that read the Cast (each named by its first output in
    ``model``)."""
    graph = model.graph
    known = {o for n in graph.node for o in n.output if o} | {v.name for v in graph.input}
    known |= {t.name for t in graph.initializer}
    names = {n.name for n in graph.node}
    casts = [
        n
        for n in placed.graph.node
        if n.op_type == "Cast" and n.name.startswith(INSERTED_CAST_PREFIX) and n.name not in names and n.input
    ]
    if indices:
        unknown = 1 << 30  # a Cast the profile does not show goes last

        def index(cast: onnx.NodeProto) -> int:
            found = indices.get(cast.name)
            return unknown if found is None else found

        casts.sort(key=index)
    first = {n.name: n.output[0] for n in graph.node if n.name and n.output}  # a node's first output in the model
    widened = {cast.output[0] for cast in casts if cast.output}
    readers: dict[str, set[str]] = {}  # a Cast's output -> the first outputs of the model's nodes that read it
    for node in placed.graph.node:
        for name in node.input:
            if name in widened and node.name in first:
                readers.setdefault(name, set()).add(first[node.name])
    found = []
    for cast in casts:
        source, made = cast.input[0], cast.output[0] if cast.output else ""
        if made in known:
            found.append(HostCast(made, None))
        elif source in known:
            found.append(HostCast(source, tuple(sorted(readers.get(made, ())))))
    return tuple(found)


def inserted_nodes(
    placed: str | os.PathLike[str], model: onnx.ModelProto, indices: Mapping[str, int | None] | None = None
) -> tuple[list[InsertedCopy], tuple[HostCast, ...]]:
    """What onnxruntime inserted into ``model``, read from the graph it saved at ``placed``
    (`save_placed_graph`): its copies (`inserted_copies`) and the float16 fallback's Casts
    (`inserted_casts`, ordered by ``indices``)."""
    graph = onnx.load(str(placed), load_external_data=False)
    return inserted_copies(graph, model), inserted_casts(graph, model, indices)


# --------------------------------------------------------------------------------------------------
# onnxruntime's placement, replicated for the providers this project cannot run here (CUDA, CANN)


@dataclass(frozen=True)
class Kernels:
    """What a provider's kernels declare, for the ops the placement rule needs: the ops it has no
    kernel for (``missing``: they run on the CPU provider; None: every op not in ``present``), the
    inputs each kernel takes in CPU memory, and the ops whose output is in CPU memory."""

    cpu_inputs: dict[str, frozenset[int]]
    cpu_outputs: frozenset[str]
    missing: frozenset[str] = frozenset()
    present: frozenset[str] | None = None

    def has(self, op: str) -> bool:
        return op in self.present if self.present is not None else op not in self.missing


#: onnxruntime's CUDA provider (its kernel registrations): no Optional ops
CUDA_KERNELS = Kernels(CPU_INPUTS, CPU_OUTPUT_OPS, missing=frozenset({"Optional", "OptionalHasElement"}))
#: onnxruntime-cann 1.24.4 (the kernels its provider library registers)
CANN_KERNELS = Kernels(
    CPU_INPUTS,
    CPU_OUTPUT_OPS,
    present=frozenset(
        "Abs Add AveragePool BatchNormalization Cast Ceil Conv Cos Div Dropout Erf Exp Flatten Floor Gemm "
        "GlobalAveragePool GlobalMaxPool Identity Log MatMul MaxPool MemcpyFromHost MemcpyToHost Mul Neg "
        "Reciprocal Relu Reshape Round Sin Sqrt Sub Transpose".split()
    ),
)
_HALF = frozenset({onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, 17, 18, 19, 20})  # fp16, bf16, fp8s


#: the ops onnxruntime's CPU provider has a float16 kernel for (1.32.0: the kernels it registers with
#: tensor(float16) in a type constraint), each from the opset given (``:SINCE``, ``:SINCE-LAST``; 1 when
#: none), contrib ops as ``com.microsoft.OP``; every other op runs a float16 node in float32 between Casts
_CPU_FLOAT16 = """
Attention:23 BitCast:26 Cast:6 Celu:28 Clip:12 Compress:9 Concat:4 ConstantOfShape:9
DequantizeLinear:19 Dropout:7-11 DynamicSlice Expand:8 Flatten Gather GatherElements:11 GatherND:11
Identity If IsInf:20 IsNaN:9 LayerNormalization Loop Max:12 MemcpyFromHost MemcpyToHost Min:12
Mod:10 Optional:15 OptionalGetElement:15 OptionalHasElement:18 QuantizeLinear:19 RMSNormalization:23
RandomNormalLike RandomUniformLike Reshape ReverseSequence:10 RotaryEmbedding:23 Round:11 Scan:8
Scatter:9-10 ScatterElements:11 ScatterND:11 SequenceAt:11 SequenceConstruct:11 Shape Shrink:9
Sign:9 SimplifiedLayerNormalization Slice Split:2 SplitToSequence:11 Squeeze TensorScatter:24
Transpose Unsqueeze com.microsoft.BranchwiseRMSNorm com.microsoft.EngramGate
com.microsoft.ExpandDims com.microsoft.GatedAdd com.microsoft.GatedDeltaNet
com.microsoft.GatedRMSNorm com.microsoft.GatherBlockQuantized com.microsoft.GatherND
com.microsoft.GatherPacked com.microsoft.GroupQueryAttention com.microsoft.HyperConnectionPostMix
com.microsoft.HyperConnectionPreMix com.microsoft.Inverse com.microsoft.LinearAttentionGate
com.microsoft.MRotaryEmbedding com.microsoft.MatMulNBits com.microsoft.MoEGroupRouter
com.microsoft.QMoE com.microsoft.RotaryEmbedding com.microsoft.ScaledSiLU
com.microsoft.SkipLayerNormalization com.microsoft.SkipSimplifiedLayerNormalization
com.microsoft.SparseAttention com.microsoft.UnfoldTensor com.microsoft.VarlenCausalConvWithState
"""


def _cpu_float16() -> dict[tuple[str, str], tuple[int, int | None]]:
    table: dict[tuple[str, str], tuple[int, int | None]] = {}
    for entry in _CPU_FLOAT16.split():
        name, _, since = entry.partition(":")
        domain, _, op = name.rpartition(".")
        first, _, last = (since or "1").partition("-")
        table[(domain, op)] = (int(first), int(last) if last else None)
    return table


CPU_FLOAT16 = _cpu_float16()


def _cpu_has_float16(node: onnx.NodeProto, opsets: dict[str, int]) -> bool:
    """Whether the CPU provider runs ``node`` in float16 (its schema's version in the model's opset)."""
    domain = "" if node.domain in ("", "ai.onnx") else node.domain
    found = CPU_FLOAT16.get((domain, node.op_type))
    if found is None:
        return False
    version = opsets.get(domain, 1)
    try:
        version = onnx.defs.get_schema(node.op_type, version, domain).since_version
    except onnx.defs.SchemaError:
        pass  # a contrib op: onnx does not know it
    first, last = found
    return first <= version and (last is None or version <= last)


def predicted_casts(
    model: onnx.ModelProto,
    nodes: Sequence[onnx.NodeProto],
    on_host: Callable[[onnx.NodeProto], bool],
    elem_type: Callable[[str], int | None],
) -> tuple[HostCast, ...]:
    """The Casts onnxruntime's ``InsertCastTransformer`` inserts around host nodes that read float16
    and have no float16 CPU kernel (`CPU_FLOAT16`), in the order it adds them: ``nodes`` in execution
    order, ``on_host`` the test of a host node, ``elem_type`` a tensor's element type.

    Node by node, as onnxruntime does: one Cast to float32 per float16 input (shared by the nodes that
    read it), one back to float16 per float16 output. A host node with a float16 kernel between such
    nodes only (every float16 input made by one, every reader of its float16 outputs one) runs in
    float32 too. Then, as its ``RemoveDuplicateCastTransformer`` does, a Cast to float32 of a tensor a
    Cast back to float16 made goes (its readers read the float32 tensor; `HostCast` has them read the
    tensor), and that Cast back goes too when only such nodes read the tensor and it is no graph output.
    """
    fallback = _Float16Fallback(model, nodes, on_host, elem_type)
    wrapped = fallback.wrapped()
    widened: dict[str, list[str]] = {}  # tensor -> the first outputs of the nodes that read its Cast
    entries: list[tuple[str, bool]] = []  # (tensor, widened) in the order onnxruntime adds the Casts
    for node in nodes:
        if id(node) not in wrapped:
            continue
        for name in fallback.half(node.input):
            if name not in widened:
                widened[name] = []
                entries.append((name, True))
            widened[name].append(node.output[0])
        entries += [(o, False) for o in fallback.half(node.output)]
    narrowed = {tensor for tensor, wide in entries if not wide}
    found = []
    for tensor, wide in entries:
        if wide and tensor in narrowed:
            continue  # the pair undoes itself: the readers take the float32 tensor
        if not wide and fallback.only_wrapped_read(tensor, wrapped):
            continue  # only Casts read it: it goes with them
        found.append(HostCast(tensor, tuple(sorted(set(widened[tensor]))) if wide else None))
    return tuple(found)


class _Float16Fallback:
    """The nodes the CPU provider runs in float32 between Casts (`predicted_casts`)."""

    def __init__(
        self,
        model: onnx.ModelProto,
        nodes: Sequence[onnx.NodeProto],
        on_host: Callable[[onnx.NodeProto], bool],
        elem_type: Callable[[str], int | None],
    ) -> None:
        self.opsets = {("" if o.domain == "ai.onnx" else o.domain): o.version for o in model.opset_import}
        self.outputs = {v.name for v in model.graph.output}
        self.nodes, self.on_host, self.elem_type = nodes, on_host, elem_type
        self.made_by = {o: node for node in nodes for o in node.output if o}
        self.readers: dict[str, list[onnx.NodeProto]] = {}
        for node in nodes:
            for name in dict.fromkeys(node.input):
                if name:
                    self.readers.setdefault(name, []).append(node)

    def half(self, names: Sequence[str]) -> list[str]:
        """The float16 tensors of ``names``, each once, in order."""
        return [n for n in dict.fromkeys(names) if n and self.elem_type(n) == onnx.TensorProto.FLOAT16]

    def wrapped(self) -> set[int]:
        """The ids of the host nodes that run in float32: no float16 kernel, and those isolated between them."""
        cast = {
            id(node)
            for node in self.nodes
            if self.on_host(node)
            and not has_subgraphs(node)
            and self.half(node.input)
            and not _cpu_has_float16(node, self.opsets)
        }
        return cast | {id(node) for node in self.nodes if self._isolated(node, cast)}

    def _isolated(self, node: onnx.NodeProto, cast: set[int]) -> bool:
        """onnxruntime's ``IsIsolatedFp16NodeOnCpu``: a host node whose float16 inputs all come from
        nodes that run in float32 and whose float16 outputs only such nodes read."""
        if not self._may_be_isolated(node, cast):
            return False
        half_in, outs = self.half(node.input), self.half(node.output)
        if not half_in or not outs or not any(n in self.made_by for n in node.input if n):
            return False
        makers = [self.made_by[n] for n in half_in if n in self.made_by]  # weights and graph inputs: no edge
        readers = [r for o in outs for r in self.readers.get(o, ())]
        return all(id(m) in cast for m in makers) and all(id(r) in cast for r in readers)

    def _may_be_isolated(self, node: onnx.NodeProto, cast: set[int]) -> bool:
        """A host node not run in float32 already, without bodies, that makes no graph output."""
        return (
            self.on_host(node)
            and id(node) not in cast
            and not has_subgraphs(node)
            and not set(node.output) & self.outputs
        )

    def only_wrapped_read(self, tensor: str, wrapped: set[int]) -> bool:
        readers = self.readers.get(tensor, [])
        return bool(readers) and tensor not in self.outputs and all(id(r) in wrapped for r in readers)


def predicted_copies(model: onnx.ModelProto, kernels: Kernels) -> list[str]:
    """The tensors onnxruntime would copy itself when it runs ``model`` (topologically sorted) on a
    provider that calls ``GetCpuPreferredNodes`` (CUDA, CANN), by `predicted_placement`."""
    return predicted_placement(model, kernels)[1]


def predicted_placement(model: onnx.ModelProto, kernels: Kernels) -> tuple[list[str], list[str]]:
    """(the nodes that run on the CPU, the tensors onnxruntime copies itself) when ``model``
    (topologically sorted) runs on a provider that calls ``GetCpuPreferredNodes`` (CUDA, CANN): a
    node the provider has no kernel for runs on the CPU. The fallback walk starts at the outputs a
    provider kernel leaves in CPU memory: a node that reads one of the tensors it reached, and whose
    every input is such a tensor (not one its kernel takes in CPU memory), an initializer of at most 100
    elements or a graph input, none of them fp16, bf16 or fp8, moves to the CPU, and its outputs are
    reached; a node without a provider kernel that reads a reached tensor passes the walk on. A Constant
    node is an initializer (onnxruntime makes it one when it loads the graph). Then a device node that
    reads a CPU tensor where its kernel does not take it in CPU memory, or a CPU node that reads a
    device tensor, gets a copy. (``GetCpuPreferredNodes``, onnxruntime 1.25:
    core/framework/fallback_cpu_capability.cc; checked against the placement WebGPU measures, which
    calls it too.)"""
    walk = _Walk.of(model.graph, kernels)
    cpu_nodes: list[str] = []
    copies: list[str] = []
    for index, node in enumerate(model.graph.node):
        if index in walk.constants:
            continue
        cpu = walk.on_the_cpu(node)
        copies += _copied(node, cpu, walk.taken(node), walk.on_cpu, walk.anywhere, walk.small)
        if cpu:
            cpu_nodes.append(node.name)
        walk.made(node, cpu)
    return cpu_nodes, copies


@dataclass
class _Walk:
    """The state of `predicted_placement`'s walk over the graph: what is where so far."""

    kernels: Kernels
    types: dict[str, int]  # element types the file declares
    small: set[str]  # initializers of at most 100 elements (Constant nodes' values too)
    anywhere: set[str]  # graph inputs and initializers: placed where they are read
    inputs: set[str]  # the graph inputs proper
    constants: dict[int, int]  # file index of each Constant node -> its value's elements
    on_cpu: set[str] = field(default_factory=set)  # tensors in CPU memory
    # the CPU tensors the fallback walk has reached: the outputs a provider kernel leaves in CPU memory, and
    # those of the nodes it moved to the CPU or reached that have no provider kernel (GetCpuPreferredNodes)
    reached: set[str] = field(default_factory=set)

    @classmethod
    def of(cls, graph: onnx.GraphProto, kernels: Kernels) -> _Walk:
        types = {v.name: v.type.tensor_type.elem_type for v in [*graph.input, *graph.output, *graph.value_info]}
        types.update({t.name: t.data_type for t in graph.initializer})
        small = {t.name for t in graph.initializer if _elements(t) <= 100}
        anywhere = {v.name for v in graph.input} | {t.name for t in graph.initializer}
        inputs = {v.name for v in graph.input} - {t.name for t in graph.initializer}
        constants = _constant_nodes(graph)
        for i, elements in constants.items():  # each an initializer of its own
            out = graph.node[i].output[0]
            anywhere.add(out)
            value = next((a.t for a in graph.node[i].attribute if a.name == "value"), None)
            if value is not None:
                types.setdefault(out, value.data_type)
            if elements <= 100:
                small.add(out)
        return cls(kernels, types, small, anywhere, inputs, constants, on_cpu=set(small))

    def taken(self, node: onnx.NodeProto) -> frozenset[int]:
        """The inputs the provider's kernel for ``node`` reads in CPU memory."""
        return self.kernels.cpu_inputs.get(node.op_type, frozenset())

    def on_the_cpu(self, node: onnx.NodeProto) -> bool:
        """Whether ``node`` runs on the CPU: no provider kernel, or moved there by the walk."""
        walked = any(i in self.reached for i in node.input if i)  # a candidate of the walk
        if not self.kernels.has(node.op_type):
            if walked:  # passes the walk on
                self.reached.update(o for o in node.output if o)
            return True
        if not walked or node.op_type in MEMCPY_OPS:
            return False
        allowed, taken = self.small | self.inputs, self.taken(node)
        moved = all(_cpu_input(n, k, taken, allowed, self.reached, self.types) for k, n in enumerate(node.input))
        if moved:
            self.reached.update(o for o in node.output if o)
        return moved

    def made(self, node: onnx.NodeProto, cpu: bool) -> None:
        """Record where ``node``'s outputs are: in CPU memory when it ran there or its kernel writes there."""
        if cpu or node.op_type in self.kernels.cpu_outputs:
            self.on_cpu.update(o for o in node.output if o)
        if not cpu and node.op_type in self.kernels.cpu_outputs:
            self.reached.update(o for o in node.output if o)


def _constant_nodes(graph: onnx.GraphProto) -> dict[int, int]:
    """The file index of each Constant node, and its value's elements: onnxruntime turns every Constant node
    into an initializer when it loads the graph, so no node runs it."""
    found = {}
    for i, node in enumerate(graph.node):
        if node.op_type == "Constant" and node.domain in ONNX_DOMAINS and node.output:
            found[i] = _constant_elements(node)
    return found


def _copied(
    node: onnx.NodeProto, cpu: bool, taken: frozenset[int], on_cpu: set[str], anywhere: set[str], small: set[str]
) -> list[str]:
    """The inputs of ``node`` onnxruntime copies: a device tensor a CPU node reads, a CPU tensor a device
    node reads where its kernel does not take it in CPU memory, a device tensor it reads where its kernel
    does (initializers and graph inputs are placed where they are read)."""
    copied = []
    for k, name in enumerate(node.input):
        if not name or name in anywhere:
            continue
        if cpu and name not in on_cpu:
            copied.append(name)
        elif not cpu and name in on_cpu and k not in taken and name not in small:
            copied.append(name)
        elif not cpu and name not in on_cpu and k in taken:  # a device tensor its kernel reads in CPU memory
            copied.append(name)
    return copied


def _cpu_input(
    name: str, slot: int, taken: frozenset[int], anywhere: set[str], reached: set[str], types: Mapping[str, int]
) -> bool:
    """Whether input ``slot`` (``name``) lets the fallback walk move its node to the CPU, as
    ``GetCpuPreferredNodes`` checks it: never a float16, bfloat16 or fp8 one; a small initializer or a
    graph input always; else a CPU tensor the walk reached, unless the provider's kernel takes that input
    in CPU memory."""
    if not name:
        return True
    if types.get(name) in _HALF:
        return False
    if name in anywhere:
        return True
    return name in reached and slot not in taken


def _constant_elements(node: onnx.NodeProto) -> int:
    """How many elements a Constant node's value holds (its ``value`` tensor's, or a list's length)."""
    for attr in node.attribute:
        if attr.name == "value":
            return _elements(attr.t)
        if attr.name in ("value_floats", "value_ints", "value_strings"):
            return len(attr.floats) + len(attr.ints) + len(attr.strings)
        if attr.name == "sparse_value":
            return _elements(onnx.TensorProto(dims=attr.sparse_tensor.dims))
    return 1  # value_float, value_int, value_string


def _elements(t: onnx.TensorProto) -> int:
    count = 1
    for d in t.dims:
        count *= d
    return count
