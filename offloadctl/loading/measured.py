"""Sizes one run measured: what onnxruntime's profiler says each node wrote, read back by name.

`offloadctl.running.sizes.measure_sizes` makes the run (``--sizes-from-run``); this module holds what it
reads and how: the sizes themselves (`MeasuredSizes`, which `offloadctl.loading.tensors.TensorInfos`
takes over inferred ones), the node names onnxruntime's profiler uses, and the parsing of its events.
Nothing here runs onnxruntime.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from offloadctl.core.onnxutil import iter_graphs, subgraphs

__all__ = ["MeasuredSizes", "nodes_by_name", "ort_type", "shapes_from_profile"]

# onnxruntime's names for element types in profiling events, where numpy's differ
_ORT_TYPES = {
    "float": onnx.TensorProto.FLOAT,
    "double": onnx.TensorProto.DOUBLE,
    "float16": onnx.TensorProto.FLOAT16,
    "bfloat16": onnx.TensorProto.BFLOAT16,
    "bool": onnx.TensorProto.BOOL,
    "string": onnx.TensorProto.STRING,
}


def ort_type(name: str) -> int | None:
    """The onnx element type of onnxruntime's type name (``float``, ``int64``, ...), None if unknown."""
    if name in _ORT_TYPES:
        return _ORT_TYPES[name]
    try:
        return int(onnx.helper.np_dtype_to_tensor_dtype(np.dtype(name)))
    except (TypeError, ValueError, KeyError):
        return None


@dataclass
class MeasuredSizes:
    """Element type and shape of every tensor one run produced or was fed, by name."""

    shapes: dict[str, tuple[int, tuple[int, ...]]] = field(default_factory=dict)
    inputs: str | None = None  # the inputs file, or None for generated inputs
    nodes_matched: int = 0
    nodes_ran: int = 0

    def get(self, name: str) -> tuple[int, tuple[int, ...]] | None:
        return self.shapes.get(name)


def nodes_by_name(graph: onnx.GraphProto) -> dict[str, onnx.NodeProto]:
    """Every node of the file by the name onnxruntime's profiler gives it, in bodies too: its own, or
    for a node without one ``OpType_INDEX`` (its index in its graph, as onnxruntime names it). Names
    that are not unique are left out."""
    found: dict[str, onnx.NodeProto | None] = {}

    def walk(g: onnx.GraphProto) -> None:
        for index, node in enumerate(g.node):
            name = node.name or f"{node.op_type}_{index}"
            found[name] = None if name in found else node
            for sub in subgraphs(node):
                for inner in iter_graphs(sub):
                    walk(inner)

    walk(graph)
    return {name: node for name, node in found.items() if node is not None}


def shapes_from_profile(events: Iterable[Any], nodes: Mapping[str, onnx.NodeProto], sizes: MeasuredSizes) -> None:
    suffix = "_kernel_time"
    matched: set[str] = set()
    for event in events:
        if not isinstance(event, dict) or event.get("cat") != "Node":
            continue
        name = str(event.get("name", ""))
        if not name.endswith(suffix):
            continue
        sizes.nodes_ran += 1
        node = nodes.get(name[: -len(suffix)])
        shapes = (event.get("args") or {}).get("output_type_shape")
        if node is None or not isinstance(shapes, list):
            continue
        outputs = [o for o in node.output if o]
        if len(shapes) != len(outputs):
            continue
        matched.add(node.name)
        for out, entry in zip(outputs, shapes):
            if not isinstance(entry, dict) or len(entry) != 1:
                continue
            ((type_name, dims),) = entry.items()
            elem = ort_type(str(type_name))
            if elem is None or not isinstance(dims, list) or not all(isinstance(d, int) and d >= 0 for d in dims):
                continue
            shape = tuple(dims)
            old = sizes.shapes.get(out)
            if old is None or int(np.prod(shape)) > int(np.prod(old[1])):
                sizes.shapes[out] = (elem, shape)
    sizes.nodes_matched = len(matched)
