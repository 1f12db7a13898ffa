"""Sizes read from one run: the exact route when shape inference leaves sizes unknown.

Shape inference (onnx's, then onnxruntime's symbolic one) can still leave a size unknown: a
data-dependent shape (NonZero, a mask's sum), an op neither knows. When the user has inputs, or
the model's inputs can be generated at pinned shapes, one run on onnxruntime's CPU provider tells
every size exactly: its profiler records the shape of every node's outputs (``output_type_shape``),
for the nodes inside If/Loop/Scan bodies too. The run uses no graph optimizations (so nodes keep
their names) and holds no intermediate tensor longer than the model does: peak host memory is one
run of the model. It is an option (``--sizes-from-run``, or ``--inputs FILE``), never automatic:
a run of a large model takes time and host memory a user should choose to spend.

Nodes are matched by name; a node without a unique name keeps its inferred sizes. A node run
several times (a Loop body) gets its largest outputs.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from offloadctl.analysis.graph import Analysis, analyse
from offloadctl.core.errors import OffloadError
from offloadctl.core.onnxutil import iter_graphs, subgraphs
from offloadctl.loading.model import LoadedModel

__all__ = ["MeasuredSizes", "analysed", "measure_sizes", "ort_type"]

logger = logging.getLogger(__name__)

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


def _nodes_by_name(graph: onnx.GraphProto) -> dict[str, onnx.NodeProto]:
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


def _shapes_from_profile(events: Iterable[Any], nodes: Mapping[str, onnx.NodeProto], sizes: MeasuredSizes) -> None:
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


def measure_sizes(
    model_path: str | os.PathLike[str],
    proto: onnx.ModelProto,
    *,
    inputs: str | os.PathLike[str] | None = None,
    seed: int = 0,
) -> MeasuredSizes:
    """Run the model once on onnxruntime's CPU provider and read every tensor's size.

    Args:
        model_path: the model file onnxruntime loads (its external data beside it).
        proto: the model as loaded for planning, with the input pins that generated inputs take.
        inputs: an inputs file or folder (`offloadctl.running.inputs.load_inputs`); None generates them
            (`offloadctl.running.inputs.generate_inputs`, seeded with ``seed``) at the pinned shapes.

    Raises:
        OffloadError: onnxruntime is missing, an input cannot be read or generated (a dynamic
            dimension not pinned), or the run fails.
    """
    from offloadctl.running.inputs import generate_inputs, input_specs, load_inputs
    from offloadctl.running.runner import (
        create_session,
        feeds_for,
        import_onnxruntime,
        required_settings,
        run_once,
        session_config,
    )

    ort = import_onnxruntime("cpu")
    path = str(model_path)
    specs = input_specs(proto)
    if inputs is not None:
        feeds = load_inputs(inputs, specs, path)
    else:
        try:
            feeds, _ = generate_inputs(specs, seed=seed)
        except OffloadError as exc:
            raise OffloadError(
                f"--sizes-from-run: {exc.message}",
                hint=(exc.hint or "") + "; or give the inputs to run with: --inputs FILE.npz",
            ) from None
    config = session_config(required_settings(proto, path), "cpu", opt_level="disable", ort=ort)
    sizes = MeasuredSizes(inputs=None if inputs is None else str(inputs))
    for spec in specs:
        value = feeds.get(spec.name)
        if value is not None and spec.elem_type is not None:
            sizes.shapes[spec.name] = (spec.elem_type, tuple(int(d) for d in value.shape))
    with tempfile.TemporaryDirectory(prefix="offloadctl-sizes-") as tmp:
        config.sess_options.enable_profiling = True
        config.sess_options.profile_file_prefix = os.path.join(tmp, "sizes")
        session = create_session(path, config, "cpu", ort=ort)
        run_once(session, feeds_for(session, feeds, path, "the inputs"), path, ort)
        profile = session.end_profiling()
        del session
        with open(Path(profile), encoding="utf-8") as f:
            events = json.load(f)
    # names as onnxruntime gives them follow the file's own node list (the planning proto has lost nodes)
    _shapes_from_profile(events, _nodes_by_name(onnx.load(path, load_external_data=False).graph), sizes)
    logger.info(
        "%s: one run on the CPU provider sized the outputs of %d of %d node runs",
        path,
        sizes.nodes_matched,
        sizes.nodes_ran,
    )
    return sizes


def analysed(loaded: LoadedModel, *, order: str = "priority") -> Analysis:
    """The analysis of a loaded model in ``order`` (`offloadctl.analysis.graph.analyse`), its sizes
    read from one run when the model asks for that (``loaded.sizes_from_run``, from
    ``--sizes-from-run`` or a plan made with it)."""
    analysis = analyse(loaded, order=order)
    run = loaded.sizes_from_run
    if run is not None:
        analysis.infos.use_measured(measure_sizes(loaded.path, loaded.proto, inputs=run["inputs"], seed=run["seed"]))
    return analysis
