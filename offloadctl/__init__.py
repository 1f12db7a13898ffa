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
made by the declared pipeline of passes, `offloadctl.planning.passes.PIPELINE`, and the report after
it; the planner's plan alone is `offloadctl.planning.make.scheduled_plan`, and the single stages are
`offloadctl.planning.select`, `~.filter` and `~.prefetch`),
`offloadctl.rewriting.rewrite.apply_plan` with `offloadctl.rewriting.writing.write_model`,
`offloadctl.simulation.result.simulate`
and `offloadctl.running.runner.run_model`.
User errors raise `OffloadError` (a message naming the file or tensor, and a hint).

Importing the package is light (the modules load on first use), so that the command line can turn
an interrupt during start-up into one line.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from offloadctl._version import __version__
from offloadctl.core.errors import OffloadError, UnknownOption
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

    found = getattr(importlib.import_module(module), name)
    if name == "make_plan":  # its errors in keywords, not flags
        found = _in_python_terms(found, takes=_request_keywords)
    return found


R = TypeVar("R")


def _request_keywords() -> list[str]:
    from offloadctl.planning.request import option_fields

    return [f.name for f in option_fields()] + ["progress"]


def _in_python_terms(
    function: Callable[..., R], *, takes: Callable[[], Sequence[str]] | None = None
) -> Callable[..., R]:
    """``function`` with its user errors said in the Python API's terms (`offloadctl.core.terms`): keywords
    where the library wrote the command line's options, and a keyword it does not take refused as
    `offloadctl.core.errors.UnknownOption`, naming the close ones (``takes`` gives those it takes)."""

    @functools.wraps(function)
    def call(*args: Any, **kwargs: Any) -> R:
        try:
            return function(*args, **kwargs)
        except OffloadError as exc:
            from offloadctl.core.terms import in_python_terms

            flags = _flag_options()
            hint = None if exc.hint is None else in_python_terms(exc.hint, flags)
            exc.restate(in_python_terms(exc.message, flags), hint)
            raise
        except TypeError as exc:
            unknown = re.search(r"unexpected keyword argument '([^']+)'", str(exc))
            if unknown is None or unknown[1] not in kwargs:  # not the caller's keyword: a bug, as it is
                raise
            raise _unknown_option(function.__name__, unknown[1], takes() if takes else _keywords(function)) from None

    return call


def _keywords(function: Callable[..., Any]) -> list[str]:
    """The keywords ``function`` takes."""
    import inspect

    kinds = (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [name for name, p in inspect.signature(function).parameters.items() if p.kind in kinds]


def _unknown_option(name: str, keyword: str, takes: Sequence[str]) -> UnknownOption:
    import difflib

    close = difflib.get_close_matches(keyword, takes, n=3)
    hint = f"did you mean {' or '.join(close)}?" if close else None
    if takes:
        hint = (hint + " " if hint else "") + f"{name} takes: {', '.join(takes)}"
    return UnknownOption(f"{name}() got an unknown keyword {keyword!r}", hint=hint)


def _flag_options() -> set[str]:
    """The command line's options that take no value (``--params``, ``--optimal``): True in Python."""
    from offloadctl.planning.request import option_fields

    flags = {"strict", "pin-shapes", "sizes-from-run", "measure-memory", "explain"}
    return flags | {f.name.replace("_", "-") for f in option_fields() if f.metadata.get("kind") in ("switch", "flag")}


@_in_python_terms
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


@_in_python_terms
def analyse(model: LoadedModel | str | os.PathLike[str]) -> Analysis:
    """The read-only analysis every stage works from: execution order, uses, sizes.

    Accepts a `LoadedModel` or a path (loaded without pins).
    """
    from offloadctl.job import analysed
    from offloadctl.loading.model import LoadedModel, load_model

    if not isinstance(model, LoadedModel):
        model = load_model(model)
    return analysed(model)


@_in_python_terms
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
    from offloadctl.rewriting.writing import fill_shared_weights, shared_weights

    _check_plan(plan, analysis, "apply")
    if output is None:
        return apply_plan(plan, analysis, result=result)
    job = Job(analysis).with_plan(plan)
    model, _ = job.write_rewrite(output, result=result)
    fill_shared_weights(model, shared_weights(model, analysis.loaded.proto))  # the rewrite as written, whole
    return model


@_in_python_terms
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


def _run_keywords() -> list[str]:
    import inspect

    from offloadctl.running.runner import run_model

    return [name for name, p in inspect.signature(run_model).parameters.items() if p.kind == p.KEYWORD_ONLY]


@functools.partial(_in_python_terms, takes=_run_keywords)
def run(model: str | os.PathLike[str], device: str = "cpu", **options: Any) -> RunReport:
    """Run a model with onnxruntime on ``device`` and check it (see `offloadctl.running.runner.run_model`:
    ``inputs``, ``compare_to``, ``repeat``, ``opt_level``, ``input_shapes``, ``dims``, ...)."""
    from offloadctl.running.runner import run_model

    return run_model(str(model), device, **options)
