"""offloadctl: move idle tensors of an ONNX model to host memory and bring them back before use.

The library is usable without the command line. Its entry points, in pipeline order::

    import offloadctl

    model = offloadctl.load("model.onnx", input_shapes={"x": [1, 3, 224, 224]})
    analysis = offloadctl.analyse(model)
    plan = offloadctl.make_plan(analysis, budget="1.5GiB", params=True)
    result = offloadctl.simulate(analysis, plan)     # result.peak_before, result.peak_after, result.times
    offloadctl.apply(plan, analysis, "model.offload.onnx")
    report = offloadctl.run("model.offload.onnx", "cpu", compare_to="model.onnx")

Each is a thin name over the module that owns the work, one subpackage per stage of the pipeline:
`offloadctl.loading.model.load_model`, `offloadctl.analysis.graph.analyse`,
`offloadctl.pipeline.make_plan` (the plan document ``offloadctl plan`` writes, its figures included,
made by the declared pipeline of passes there; the planner's plan alone is
`offloadctl.planning.make.scheduled_plan`, and the single stages are
`offloadctl.planning.select`, `~.filter` and `~.prefetch`),
`offloadctl.rewriting.rewrite.apply_plan` with `offloadctl.rewriting.writing.write_model`,
`offloadctl.simulation.result.simulate`
and `offloadctl.running.runner.run_model`.
User errors raise `OffloadError` (a message naming the file or tensor, and a hint).

Importing the package is light (the modules load on first use), so that the command line can turn
an interrupt during start-up into one line.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from offloadctl._version import __version__
from offloadctl.core.errors import OffloadError
from offloadctl.core.plantypes import Plan

if TYPE_CHECKING:
    from offloadctl.analysis.graph import Analysis
    from offloadctl.loading.model import LoadedModel
    from offloadctl.pipeline import make_plan
    from offloadctl.planning.request import PlanRequest
    from offloadctl.rewriting.rewrite import ApplyResult
    from offloadctl.running.runner import RunReport
    from offloadctl.simulation.result import SimResult

__all__ = [
    "OffloadError",
    "__version__",
    "load",
    "analyse",
    "make_plan",
    "PlanRequest",
    "apply",
    "simulate",
    "run",
    "LoadedModel",
    "Analysis",
    "SimResult",
    "RunReport",
    "ApplyResult",
]

# names whose modules load on first use (so that importing the package stays light)
_LAZY = {
    "make_plan": "offloadctl.pipeline",
    "PlanRequest": "offloadctl.planning.request",
    "LoadedModel": "offloadctl.loading.model",
    "Analysis": "offloadctl.analysis.graph",
    "SimResult": "offloadctl.simulation.result",
    "RunReport": "offloadctl.running.runner",
    "ApplyResult": "offloadctl.rewriting.rewrite",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'offloadctl' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


def load(
    path: str | os.PathLike[str],
    *,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    dims: Mapping[str, int] | None = None,
) -> LoadedModel:
    """Read an ONNX model for planning (weights stay on disk) and pin dynamic input dimensions.

    ``input_shapes`` pins every dimension of named inputs (``{"x": [1, 3, 224, 224]}``); ``dims``
    pins named dimensions wherever the inputs use them (``{"batch": 1}``). See
    `offloadctl.loading.model.load_model`.
    """
    from offloadctl.loading.model import load_model

    return load_model(path, input_shapes=input_shapes, dims=dims)


def analyse(model: LoadedModel | str | os.PathLike[str]) -> Analysis:
    """The read-only analysis every stage works from: execution order, uses, sizes.

    Accepts a `LoadedModel` or a path (loaded without pins).
    """
    from offloadctl.job import analysed
    from offloadctl.loading.model import LoadedModel, load_model

    if not isinstance(model, LoadedModel):
        model = load_model(model)
    return analysed(model)


def apply(
    plan: Plan,
    analysis: Analysis,
    output: str | os.PathLike[str] | None = None,
    *,
    result: ApplyResult | None = None,
) -> Any:
    """Insert a scheduled plan's copies into its model.

    Returns the rewritten ``onnx.ModelProto``. With ``output`` the model is also written there
    atomically, its external data files copied beside it when it goes to another folder (see
    `offloadctl.rewriting.writing.write_model`); no file the model or plan reads is ever overwritten.
    ``result`` (an `ApplyResult`) is filled with what was inserted.
    """
    from offloadctl.job import Job
    from offloadctl.rewriting.rewrite import apply_plan

    _check_plan(plan, analysis, "apply")
    if output is None:
        return apply_plan(plan, analysis, result=result)
    job = Job(analysis).with_plan(plan)
    model, _ = job.write_rewrite(output, result=result)
    return model


def simulate(analysis: Analysis, plan: Plan | None = None, *, profile: Any = "ascend-910b") -> SimResult:
    """Peak device memory before and after ``plan`` and its estimated time under a device profile.

    See `offloadctl.simulation.result.simulate`; ``profile`` is a bundled profile name (the default is
    `offloadctl.simulation.profiles.DEFAULT_PROFILE`), a profile file, a
    `offloadctl.simulation.profiles.Profile`, or None to skip the time estimate.
    """
    from offloadctl.simulation.result import simulate as _simulate

    if plan is not None:
        _check_plan(plan, analysis, "simulate")
    return _simulate(analysis, plan, profile=profile)


def _check_plan(plan: Plan, analysis: Analysis, step: str) -> None:
    """What the commands check of a plan file, for a plan handed over in memory: its schema and rules,
    its stage, and that it was made for this model."""
    from offloadctl.contract.document import check_plan_model, require_stage, validate_plan

    validate_plan(plan, source="the plan")
    require_stage(plan, "scheduled", step)
    check_plan_model(plan, analysis.loaded.sha256, analysis.loaded.path)


def run(model: str | os.PathLike[str], device: str = "cpu", **options: Any) -> RunReport:
    """Run a model with onnxruntime on ``device`` and check it (see `offloadctl.running.runner.run_model`:
    ``inputs``, ``compare_to``, ``repeat``, ``opt_level``, ``input_shapes``, ``dims``, ...)."""
    from offloadctl.running.runner import run_model

    return run_model(str(model), device, **options)
