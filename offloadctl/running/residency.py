"""Which nodes a device provider runs on the host: what `plan --device` keeps off the plan.

A provider runs on the CPU every node it has no kernel for (WebGPU: ``Sum``, ``ConstantOfShape``,
most int64 arithmetic; onnxruntime-cann 1.24.4: all but 33 ops), and CUDA and CANN also move there
the nodes whose inputs are all host tensors. A tensor such a node makes is not on the device, and
one it reads is copied back to the host: offloading either adds copies, and on the WebGPU provider
such rewrites failed to load ("Duplicate definition") or to run (a MemcpyToHost of a host tensor).

`host_nodes` finds them from onnxruntime itself where the provider runs here (one profiled run on
the device, providers read from the profile, the copies and the float16 fallback's Casts onnxruntime
inserted read from the graph it saves), and predicts them for CUDA and CANN where it does not
(`offloadctl.running.placement.predicted_placement` and `predicted_casts`). The copies place the model on the device for
the figures a device plan quotes (`offloadctl.loading.placed`).
"""

from __future__ import annotations

import tempfile
from collections import Counter
from collections.abc import Collection
from pathlib import Path

from offloadctl.analysis.graph import Analysis
from offloadctl.core.errors import OffloadError
from offloadctl.loading.placed import HostCast, HostPlacement
from offloadctl.running.inputs import generate_inputs, input_specs
from offloadctl.running.placement import (
    CANN_KERNELS,
    CUDA_KERNELS,
    inserted_nodes,
    predicted_casts,
    predicted_placement,
    save_placed_graph,
)
from offloadctl.running.replay import RanNode, ran_nodes
from offloadctl.running.sessions import DEVICES, create_session, feeds_for, import_onnxruntime, run_once, session_config

__all__ = ["HOST_DEVICES", "host_nodes"]

#: --device for planning: the providers whose host nodes can be found
HOST_DEVICES = ("webgpu", "cuda", "ascend")
_PREDICTED = {"cuda": CUDA_KERNELS, "ascend": CANN_KERNELS}


def host_nodes(analysis: Analysis, device: str) -> HostPlacement:
    """Where ``device`` runs the graph: the nodes it runs on the CPU, the copies onnxruntime inserts
    there, the Casts around float16 nodes the CPU has no float16 kernel for, and how they were found.

    Measured with one profiled run on the device where its provider runs here (inputs generated at
    the analysis' shapes); predicted for CUDA and CANN otherwise.

    Raises:
        OffloadError: an unknown device, or WebGPU that does not run here.
    """
    if device not in HOST_DEVICES:
        raise OffloadError(f"unknown device {device!r} for planning", hint=f"use one of: {', '.join(HOST_DEVICES)}")
    try:
        nodes, copies, casts = _measured(analysis, device)
        return HostPlacement(f"{device} (measured)", nodes, copies, casts)
    except OffloadError:
        if device not in _PREDICTED:
            raise
    cpu, copied = predicted_placement(analysis.loaded.proto, _PREDICTED[device])
    graph = analysis.loaded.proto.graph
    at = {id(graph.node[i]): pos for pos, i in enumerate(analysis.file_index)}
    by_name = {node.name: node for node in graph.node}
    labels = {analysis.node_names[at[id(by_name[n])]] for n in cpu if n in by_name and id(by_name[n]) in at}
    how = f"{device} (predicted: its provider does not run here)"
    casts = casts_for(analysis, labels)
    return HostPlacement(how, tuple(sorted(labels)), tuple(dict.fromkeys(copied)), casts)


def casts_for(analysis: Analysis, host: Collection[str]) -> tuple[HostCast, ...]:
    """The Casts onnxruntime inserts around the float16 nodes among ``host`` (analysis labels) that the
    CPU provider has no float16 kernel for (`offloadctl.running.placement.predicted_casts`)."""
    labels = set(host)
    nodes = analysis.nodes
    on_host = {id(node) for node, label in zip(nodes, analysis.node_names) if label in labels}

    def elem_type(name: str) -> int | None:
        info = analysis.infos.get(name)
        return info.elem_type if info is not None else None

    return predicted_casts(analysis.loaded.proto, nodes, lambda node: id(node) in on_host, elem_type)


def _measured(analysis: Analysis, device: str) -> tuple[tuple[str, ...], tuple[str, ...], tuple[HostCast, ...]]:
    ort = import_onnxruntime(device)
    loaded = analysis.loaded
    config = session_config({}, device, opt_level="disable", ort=ort)
    feeds_all, _ = generate_inputs(input_specs(loaded.proto))
    with tempfile.TemporaryDirectory(prefix="offloadctl-placement-") as tmp:
        config.sess_options.enable_profiling = True
        config.sess_options.profile_file_prefix = str(Path(tmp) / "profile")
        placed = save_placed_graph(config.sess_options, tmp)
        session = create_session(loaded.path, config, device, ort=ort)
        run_once(session, feeds_for(session, feeds_all, str(loaded.path), "the inputs"), str(loaded.path), ort)
        ran = ran_nodes(session.end_profiling())
        del session
        # the Casts in the order onnxruntime added them: that of their indices in the profile
        inserted, casts = inserted_nodes(placed, loaded.proto, {n.name: n.index for n in ran})
    provider = DEVICES[device]
    on_host = [n for n in ran if n.provider not in (None, provider)]
    return _labels(analysis, on_host), tuple(dict.fromkeys(c.tensor for c in inserted)), casts


def _labels(analysis: Analysis, nodes: list[RanNode]) -> tuple[str, ...]:
    """The analysis labels of profiled ``nodes``: by name where the file names one node so, else by
    onnxruntime's node index (its place among the file's nodes, Constant nodes left out). The index
    alone named the wrong nodes: on a BERT export it was two places off from the name, so every
    ``Sqrt`` of the attention scale was taken for the node two before it."""
    graph = analysis.loaded.proto.graph
    position = {file_index: pos for pos, file_index in enumerate(analysis.file_index)}
    counts = Counter(node.name for node in graph.node)
    by_name = {node.name: i for i, node in enumerate(graph.node) if node.name and counts[node.name] == 1}
    numbered = [i for i, node in enumerate(graph.node) if node.op_type != "Constant"]
    found = set()
    for node in nodes:
        i = by_name.get(node.name)
        if i is None and node.index is not None and node.index < len(numbered):
            i = numbered[node.index]
        if i is not None and i in position:
            found.add(analysis.node_names[position[i]])
    return tuple(sorted(found))
