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
from pathlib import Path

import onnx

from offloadctl.core.errors import OffloadError
from offloadctl.loading.measured import MeasuredSizes, nodes_by_name, shapes_from_profile

__all__ = ["measure_sizes"]

logger = logging.getLogger(__name__)


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
    from offloadctl.running.sessions import (
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
    shapes_from_profile(events, nodes_by_name(onnx.load(path, load_external_data=False).graph), sizes)
    logger.info(
        "%s: one run on the CPU provider sized the outputs of %d of %d node runs",
        path,
        sizes.nodes_matched,
        sizes.nodes_ran,
    )
    return sizes
