"""offloadctl: move idle tensors of an ONNX model to host memory and bring them back before use.

The library is usable without the command line. Its entry points, in pipeline order::

    import offloadctl

    model = offloadctl.load("model.onnx", input_shapes={"x": [1, 3, 224, 224]})
    analysis = offloadctl.analyse(model)
    plan = offloadctl.make_plan(analysis, budget="1.5GiB", params=True)
    result = offloadctl.simulate(analysis, plan)     # result.peak_before, result.peak_after, result.times
    offloadctl.apply(plan, analysis, "model.offload.onnx")
    report = offloadctl.run("model.offload.onnx", "cpu", compare_to="model.onnx")

Each is a thin name over the module that owns the work: `offloadctl.model.load_model`,
`offloadctl.analysis.analyse`, `offloadctl.stages.make_plan` (and the single stages `select`,
`filter_plan`, `prefetch` in `offloadctl.stages`), `offloadctl.apply.apply_plan` with
`offloadctl.apply.write_model`, `offloadctl.simulate.simulate` and `offloadctl.runner.run_model`.
User errors raise `OffloadError` (a message naming the file or tensor, and a hint).

Note: the functions ``offloadctl.apply`` and ``offloadctl.simulate`` shadow the modules of the
same name as attributes of the package; import from the modules by their full names
(``from offloadctl.simulate import plot_timeline``).
"""

from __future__ import annotations

__version__ = "0.1.0"

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# The modules are imported before the functions below take their names: a module imported later
# would be bound over the function of the same name.
import offloadctl.apply as _apply_module
import offloadctl.simulate as _simulate_module
from offloadctl.analysis import Analysis
from offloadctl.analysis import analyse as _analyse
from offloadctl.errors import OffloadError
from offloadctl.model import LoadedModel, load_model
from offloadctl.profiles import DEFAULT_PROFILE
from offloadctl.runner import RunReport, run_model
from offloadctl.simulate import SimResult
from offloadctl.stages import make_plan

__all__ = [
    "OffloadError",
    "__version__",
    "load",
    "analyse",
    "make_plan",
    "apply",
    "simulate",
    "run",
    "LoadedModel",
    "Analysis",
    "SimResult",
    "RunReport",
    "ApplyResult",
]

ApplyResult = _apply_module.ApplyResult


def load(
    path: str | os.PathLike[str],
    *,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    dims: Mapping[str, int] | None = None,
) -> LoadedModel:
    """Read an ONNX model for planning (weights stay on disk) and pin dynamic input dimensions.

    ``input_shapes`` pins every dimension of named inputs (``{"x": [1, 3, 224, 224]}``); ``dims``
    pins named dimensions wherever the inputs use them (``{"batch": 1}``). See
    `offloadctl.model.load_model`.
    """
    return load_model(path, input_shapes=input_shapes, dims=dims)


def analyse(model: LoadedModel | str | os.PathLike[str]) -> Analysis:
    """The read-only analysis every stage works from: execution order, uses, sizes.

    Accepts a `LoadedModel` or a path (loaded without pins).
    """
    if not isinstance(model, LoadedModel):
        model = load_model(model)
    return _analyse(model)


def apply(
    plan: dict[str, Any],
    analysis: Analysis,
    output: str | os.PathLike[str] | None = None,
    *,
    result: _apply_module.ApplyResult | None = None,
) -> Any:
    """Insert a scheduled plan's copies into its model.

    Returns the rewritten ``onnx.ModelProto``. With ``output`` the model is also written there
    atomically, its external data files copied beside it when it goes to another folder (see
    `offloadctl.apply.write_model`); the input model is never modified. ``result`` (an
    `ApplyResult`) is filled with what was inserted.
    """
    model = _apply_module.apply_plan(plan, analysis, result=result)
    if output is not None:
        source = Path(analysis.loaded.path).parent
        from offloadctl.files import check_output_path

        check_output_path(output, analysis.loaded.path)
        _apply_module.write_model(model, output, source_dir=source)
    return model


def simulate(analysis: Analysis, plan: dict[str, Any] | None = None, *, profile: Any = DEFAULT_PROFILE) -> SimResult:
    """Peak device memory before and after ``plan`` and its estimated time under a device profile.

    See `offloadctl.simulate.simulate`; ``profile`` is a bundled profile name, a profile file, a
    `offloadctl.profiles.Profile`, or None to skip the time estimate.
    """
    return _simulate_module.simulate(analysis, plan, profile=profile)


def run(model: str | os.PathLike[str], device: str = "cpu", **options: Any) -> RunReport:
    """Run a model with onnxruntime on ``device`` and check it (see `offloadctl.runner.run_model`:
    ``inputs``, ``compare_to``, ``repeat``, ``opt_level``, ``input_shapes``, ``dims``, ...)."""
    return run_model(str(model), device, **options)
