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
  against it for every element type.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx

from offloadctl.core.errors import OffloadError
from offloadctl.core.onnxutil import PIN_ATTR
from offloadctl.loading.ortgraph import INSERTED_CAST_PREFIX
from offloadctl.loading.placed import CPU_INPUTS, CPU_OUTPUT_OPS, HostCast

__all__ = [
    "PLUGINS",
    "InsertedCopy",
    "add_plugin_provider",
    "plugin_available",
    "inserted_copies",
    "inserted_casts",
    "save_placed_graph",
    "Kernels",
    "CUDA_KERNELS",
    "CANN_KERNELS",
    "predicted_copies",
    "predicted_placement",
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


@dataclass(frozen=True)
class InsertedCopy:
    """A copy onnxruntime inserted: its node, its op, the tensor it moves, and whether it reads or
    feeds one of the rewrite's own copy or pin nodes (then the plan is undone there)."""

    node: str
    op: str
    tensor: str
    of_rewrite: bool

    def to_json(self) -> dict[str, Any]:
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


def inserted_casts(placed: onnx.ModelProto, model: onnx.ModelProto) -> tuple[HostCast, ...]:
    """The Casts onnxruntime inserted in ``placed`` (the graph it ran) around float16 nodes the CPU
    provider has no float16 kernel for, as `HostCast` entries of ``model``'s tensors, in graph order:
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
    narrowed = {c.input[0]: c.output[0] for c in casts if c.output and c.output[0] in known}  # float32 -> tensor
    found = []
    for cast in casts:
        source, made = cast.input[0], cast.output[0] if cast.output else ""
        if made in known:
            found.append(HostCast(made, None))
        elif source in known:
            readers = [n for n in placed.graph.node if made in n.input and n.name in names and n.output]
            firsts = sorted({narrowed.get(n.output[0], n.output[0]) for n in readers})
            found.append(HostCast(source, tuple(firsts)))
    return tuple(found)


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


def predicted_copies(model: onnx.ModelProto, kernels: Kernels) -> list[str]:
    """The tensors onnxruntime would copy itself when it runs ``model`` (topologically sorted) on a
    provider that calls ``GetCpuPreferredNodes`` (CUDA, CANN), by `predicted_placement`."""
    return predicted_placement(model, kernels)[1]


def predicted_placement(model: onnx.ModelProto, kernels: Kernels) -> tuple[list[str], list[str]]:
    """(the nodes that run on the CPU, the tensors onnxruntime copies itself) when ``model``
    (topologically sorted) runs on a provider that calls ``GetCpuPreferredNodes`` (CUDA, CANN): a
    node the provider has no kernel for runs on the CPU; a node whose every input is a CPU tensor (a
    CPU node's output, a kernel output in CPU memory, an initializer of at most 100 elements, a graph
    input; one at least made on the CPU), none of them fp16, bf16 or fp8, moves to the CPU too; then
    a device node that reads a CPU tensor where its kernel does not take it in CPU memory, or a CPU
    node that reads a device tensor, gets a copy."""
    graph = model.graph
    types = {v.name: v.type.tensor_type.elem_type for v in [*graph.input, *graph.output, *graph.value_info]}
    types.update({t.name: t.data_type for t in graph.initializer})
    small = {t.name for t in graph.initializer if _elements(t) <= 100}
    anywhere = {v.name for v in graph.input} | {t.name for t in graph.initializer}
    on_cpu: set[str] = set(small)  # tensors in CPU memory
    made_on_cpu: set[str] = set()  # of those, the outputs of CPU nodes and of CPU-output kernels
    cpu_nodes: list[str] = []
    copies: list[str] = []
    for node in graph.node:
        taken = kernels.cpu_inputs.get(node.op_type, frozenset())
        cpu = not kernels.has(node.op_type)
        if not cpu and node.op_type not in MEMCPY_OPS:
            counted = [i for k, i in enumerate(node.input) if i and k not in taken]
            # the walk starts at CPU tensors: a node none of whose inputs a CPU node made is never tried
            cpu = any(i in made_on_cpu for i in counted) and all(
                (i in on_cpu or i in anywhere) and types.get(i) not in _HALF for i in counted
            )
        for k, name in enumerate(node.input):
            if not name or name in anywhere:
                continue
            if cpu and name not in on_cpu:
                copies.append(name)
            elif not cpu and name in on_cpu and k not in taken and name not in small:
                copies.append(name)
        if cpu:
            cpu_nodes.append(node.name)
        if cpu or node.op_type in kernels.cpu_outputs:
            on_cpu.update(o for o in node.output if o)
            made_on_cpu.update(o for o in node.output if o)
    return cpu_nodes, copies


def _elements(t: onnx.TensorProto) -> int:
    count = 1
    for d in t.dims:
        count *= d
    return count
