"""Running a model with onnxruntime (`run_model`, what `offloadctl run` does, as a library): a session
made as the rewrite asks (`offloadctl.running.sessions`), its inputs read or generated
(`offloadctl.running.inputs`), a profiled warm-up and timed runs, the order and outputs checked
(`offloadctl.running.checks`), memory measured (`offloadctl.running.allocator`), and the report.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import math
import os
import statistics
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, TypedDict

import numpy as np
import onnx

from offloadctl.analysis.order import EXECUTION_ORDERS
from offloadctl.core.errors import OffloadError
from offloadctl.loading.model import LoadedModel, load_model
from offloadctl.loading.placed import HostCast
from offloadctl.rewriting.metadata import (
    KEY_PINS,
    KEY_STREAMS,
    PinCheck,
    check_pins,
    metadata_json,
    planned_shapes,
)
from offloadctl.rewriting.streams import PARTITION_KEY, checked_streams, stream_order
from offloadctl.running.allocator import AllocatorFigure, measure_memory
from offloadctl.running.checks import (
    OrderCheck,
    OutputComparison,
    compare_order,
    compare_outputs,
    planned_order,
)
from offloadctl.running.growth import MemoryGrowth, measured_growth
from offloadctl.running.inputs import generate_inputs, input_specs, load_inputs, session_feeds
from offloadctl.running.pinned import PageLocked, hand_over, runtime_allocator, streamed_weights
from offloadctl.running.placement import (
    InsertedCopy,
    inserted_nodes,
    save_placed_graph,
)
from offloadctl.running.planned_run import original_level, other_order, other_shapes
from offloadctl.running.replay import RanNode, predicted_order, ran_nodes, ran_peak
from offloadctl.running.sessions import (
    _DEFAULT_ATOL,
    _DEFAULT_RTOL,
    LOAD_CONFIG_FROM_MODEL,
    LOAD_CONFIG_WARNING,
    ModelRefused,
    SessionConfig,
    _check_same_inputs,
    _has_memcpy_nodes,
    create_session,
    feeds_for,
    import_onnxruntime,
    required_settings,
    run_once,
    session_config,
    settings_warnings,
    timed_run,
)

__all__ = ["STREAMS_DEFECT_HINT", "RunReport", "run_model"]

#: The fix when a rewrite with a partition file changes its inputs or its results: onnxruntime's multi-stream
#: planner lets a node overwrite a buffer others still read (`offloadctl.rewriting.guards`).
STREAMS_DEFECT_HINT = (
    "with its partition file onnxruntime's multi-stream planner can let a node overwrite a buffer other nodes "
    "still read (docs/streams.md); apply the plan again with this offloadctl, whose guards prevent it, or with "
    "--copies inline"
)

logger = logging.getLogger(__name__)

# --------------------------------------------------------------------------------------------------
# The whole run


@dataclass
class RunReport:
    """What `run_model` measured; `to_json` is the `offloadctl run --json` document."""

    model: str
    device: str
    providers: list[str]
    opt_level: str
    session: dict[str, Any]
    inputs: dict[str, dict[str, Any]]
    latency_runs: list[float]
    order: OrderCheck
    outputs: dict[str, dict[str, Any]]
    compare_to: str | None = None
    comparison: dict[str, OutputComparison] | None = None
    rtol: float | None = None
    atol: float | None = None
    warnings: list[str] = field(default_factory=list)
    output_values: dict[str, Any] = field(default_factory=dict, repr=False)  # what the model returned
    # the original run twice on the same inputs: the outputs that differ between its own runs (and by
    # how much); an original that is not deterministic cannot tell whether the rewrite changed anything
    original_unstable: dict[str, OutputComparison] = field(default_factory=dict)
    execution_order: str = "priority"
    # what onnxruntime's allocators held for one run of a fresh session (None: not measured)
    measured_memory: list[AllocatorFigure] | None = None
    pins: PinCheck | None = None  # the model's order pins against the order that ran (None: no pins)
    # copies onnxruntime inserted itself (a non-CPU device only; None on the CPU provider), and the
    # original's, with --compare-to
    inserted: list[InsertedCopy] | None = None
    original_inserted: list[InsertedCopy] | None = None
    ran: list[str] = field(default_factory=list)  # node names in the order the profiled run ran them
    # the device peak of the model simulated in the order that ran (a non-CPU device: its order is not
    # quite either order replayed, since the provider's nodes and its CPU nodes run on streams of their own)
    ran_peak_bytes: int | None = None
    # a rewrite whose copies run on a stream of their own: its partition file (None: one stream)
    streams: dict[str, Any] | None = None
    # on CUDA and CANN, the streamed weights handed over from page-locked memory (or why not)
    page_locked: PageLocked = field(default_factory=PageLocked)
    # with --measure-memory and --compare-to, a rewrite's measured peak against the original's
    growth: MemoryGrowth | None = None

    @property
    def undone_copies(self) -> list[InsertedCopy]:
        """The inserted copies that read or feed the rewrite's own copies and pins: there the tensor
        goes straight back, and the plan is undone."""
        return [c for c in self.inserted or [] if c.of_rewrite]

    @property
    def latency_median(self) -> float:
        return statistics.median(self.latency_runs)

    @property
    def outputs_differ(self) -> list[str]:
        """Names of outputs beyond tolerance (empty without a comparison)."""
        return [n for n, c in (self.comparison or {}).items() if not c.within_tolerance]

    def to_json(self) -> dict[str, Any]:
        compared = self.comparison is not None
        return {
            "model": self.model,
            "device": self.device,
            "providers": self.providers,
            "opt_level": self.opt_level,
            "session": self.session,
            "inputs": self.inputs,
            "latency_s": {"median": self.latency_median, "runs": self.latency_runs, "warmup_runs": 1},
            "order": self.order.to_json(),
            "outputs": self.outputs,
            "compare_to": self.compare_to,
            "tolerance": {"rtol": self.rtol, "atol": self.atol} if compared else None,
            "comparison": _each_json(self.comparison),
            "original_deterministic": not self.original_unstable if compared else None,
            "original_unstable": _each_json(self.original_unstable),
            "execution_order": self.execution_order,
            "order_pins": _json(self.pins),
            "inserted_copies": _json_list(self.inserted),
            "original_inserted_copies": _json_list(self.original_inserted),
            "plan_undone_by": _json_list(self.undone_copies),
            "ran": self.ran,
            "ran_peak_bytes": self.ran_peak_bytes,
            "measured_memory": _json_list(self.measured_memory),
            "memory_growth": _json(self.growth),
            "copy_streams": self.streams,
            "page_locked_weights": self.page_locked.to_json() if self.page_locked.weights else None,
            "warnings": self.warnings,
        }


def _json(value: Any) -> Any:
    """``value.to_json()``, or None for None."""
    return None if value is None else value.to_json()


def _json_list(values: Sequence[Any] | None) -> list[Any] | None:
    return None if values is None else [v.to_json() for v in values]


def _each_json(values: Mapping[str, Any] | None) -> dict[str, Any] | None:
    return None if values is None else {name: v.to_json() for name, v in values.items()}


class ValueDoc(TypedDict):
    """An input or output's shape and element type in a ``--json`` document."""

    shape: list[int] | None
    dtype: str


def _describe_value(value: Any) -> ValueDoc:
    if isinstance(value, np.ndarray):
        return {"shape": list(value.shape), "dtype": str(value.dtype)}
    return {"shape": None, "dtype": type(value).__name__}


def run_model(
    model: str,
    device: str,
    *,
    inputs: str | os.PathLike[str] | None = None,
    compare_to: str | None = None,
    ep_options: Mapping[str, str] | None = None,
    repeat: int = 5,
    opt_level: str = "all",
    rtol: float | None = None,
    atol: float | None = None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    dims: Mapping[str, int] | None = None,
    seed: int = 0,
    value_ranges: Mapping[str, tuple[float, float]] | None = None,
    order: str = "priority",
    memory: bool = False,
) -> RunReport:
    """Run ``model`` on ``device``: one profiled warm-up run, then ``repeat`` timed runs.

    Args:
        model, device: the model to run, and on ``ascend``, ``cpu``, ``cuda`` or ``webgpu``.
        inputs: every input, as an .npz file, a folder of .npy files or an onnx test-data folder
            (`load_inputs`); generated (`generate_inputs`) when None.
        compare_to: an original model to run with the same inputs and settings and compare.
        ep_options: provider options overriding the defaults (CANN and CUDA).
        repeat: timed runs after the warm-up (at least 1).
        opt_level: ``disable`` (the order exact, outputs bit-identical), ``basic``, ``extended``, ``all``.
        rtol, atol: tolerances for the comparison; default 1e-5 / 1e-6 with optimizations on,
            0 / 0 (bit equality) with ``disable``. Finite and >= 0.
        input_shapes, dims: pins for dynamic input dimensions (as for `load_model`): generated inputs
            take these sizes (an unpinned dynamic one is an error), given ones are checked against them.
        seed, value_ranges: the generated inputs' seed and ranges (`parse_value_ranges`).
        order: ``priority`` or ``default`` (what other hosts run); the profiled order is checked.
        memory: also measure what onnxruntime's allocators hold for one run of a fresh session
            (`offloadctl.running.allocator.measure_memory`), and the original's too with ``compare_to``.

    Returns the report, without raising when outputs differ or the order does not match (see
    `RunReport.outputs_differ`).

    Raises:
        OffloadError: bad files or inputs, no onnxruntime, the device not in use, a model it refuses.
    """
    _check_run_options(repeat, rtol, atol, memory=memory, device=device)
    warnings: list[str] = []
    loaded = load_model(model, **_shapes_to_run(model, input_shapes, dims, inputs), normalize=False)
    ort = import_onnxruntime(device)
    settings = required_settings(loaded.proto, model)
    config = session_config(settings, device, opt_level=opt_level, ep_options=ep_options, ort=ort, order=order)
    streams, locked = _session_extras(model, loaded.proto, config, device, order, ort)
    with contextlib.closing(locked):  # the buffers go back after the sessions that read them, or on a failure
        warnings += _setup_warnings(settings, config, device, ep_options, locked)
        feeds_all, source = _all_feeds(loaded.proto, model, inputs, seed, value_ranges, warnings)
        warnings += other_shapes(model, feeds_all)
        warnings += other_order(model, loaded, order)
        with _original_refused_too(compare_to, feeds_all, device, opt_level, ep_options, ort):
            timed = _timed_runs(model, config, device, ort, feeds_all, repeat, STREAMS_DEFECT_HINT if streams else None)
        checked, pins = _order_checks(loaded, timed, order, opt_level == "disable", device, warnings)
        feeds = session_feeds(loaded.proto, feeds_all)
        measured = measure_memory(config.spec(model, device), feeds, order=order, ort=ort) if memory else None
        against = _Against(compare_to, original_level(compare_to, settings, opt_level), ep_options, rtol, atol)
        compared = _compare_with(against, model, timed.outputs, feeds_all, device, ort, warnings)
        return RunReport(
            model=model,
            device=device,
            opt_level=opt_level,
            session=_session_doc(config, settings),
            inputs={n: {**_describe_value(a), "source": source} for n, a in feeds_all.items()},
            order=checked,
            compare_to=compare_to,
            warnings=warnings,
            execution_order=order,
            measured_memory=measured,
            pins=pins,
            growth=measured_growth(loaded, compare_to, config, device, feeds_all, measured, timed.ran, order, ort),
            streams=streams,
            page_locked=locked,
            **timed.report_fields(),
            **compared._asdict(),
        )


def _session_extras(
    model: str, proto: onnx.ModelProto, config: SessionConfig, device: str, order: str, ort: Any
) -> tuple[dict[str, Any] | None, PageLocked]:
    """What a rewrite adds to its session (``config``, in place): its partition file when its copies run
    on a stream of their own (`_copy_streams`), and its streamed weights from page-locked memory on
    CUDA and CANN (`_page_locked`)."""
    return _copy_streams(model, proto, config, order), _page_locked(model, proto, config, device, ort)


class ShapePins(TypedDict):
    """The pins a model is read with: `load_model`'s ``input_shapes`` and ``dims``."""

    input_shapes: Mapping[str, Sequence[int]] | None
    dims: Mapping[str, int] | None


def _shapes_to_run(
    model: str,
    input_shapes: Mapping[str, Sequence[int]] | None,
    dims: Mapping[str, int] | None,
    inputs: str | os.PathLike[str] | None,
) -> ShapePins:
    """The pins a model is read with (`load_model`'s ``input_shapes`` and ``dims``), as onnxruntime
    reads it: as given; for generated inputs without any, a rewrite's planned shapes
    (`offloadctl.rewriting.metadata.planned_shapes`)."""
    if not input_shapes and not dims and inputs is None:
        input_shapes, dims = planned_shapes(model)
    return {"input_shapes": input_shapes, "dims": dims}


def _page_locked(model: str, proto: onnx.ModelProto, config: SessionConfig, device: str, ort: Any) -> PageLocked:
    """On CUDA and CANN, the weights a rewrite streams in, handed to the session (``config``, in
    place) from page-locked buffers so that their copies can overlap compute
    (`offloadctl.running.pinned`); nothing elsewhere, where the copies run in line."""
    if device not in ("cuda", "ascend") or not streamed_weights(proto):
        return PageLocked()
    return hand_over(proto, config.sess_options, runtime_allocator(device), ort=ort, base_dir=Path(model).parent)


def _copy_streams(model: str, proto: onnx.ModelProto, config: SessionConfig, order: str) -> dict[str, Any] | None:
    """For a rewrite whose copies run on a stream of their own (``apply --copies streams``): check the
    partition file its metadata names against the model (`offloadctl.rewriting.streams.checked_streams`)
    and set it on the session (``config``, in place); what the report says of it. None for any other model."""
    checked = checked_streams(model, proto, order)
    if checked is None:
        return None
    path, streams = checked
    if config.opt_level != "disable":
        raise OffloadError(
            f"{model} runs its copies on a stream of their own, and its partition file names the nodes as they are "
            f"without graph optimizations; at --opt-level {config.opt_level} onnxruntime fuses and renames them",
            hint="run it with --opt-level disable (the default)",
        )
    config.entries[PARTITION_KEY] = path
    config.sess_options.add_session_config_entry(PARTITION_KEY, path)
    return {"partition_file": path, "streams": len(streams), "copy_stream_nodes": len(streams[0])}


def _order_checks(
    loaded: Any, timed: _Timed, order: str, exact: bool, device: str, warnings: list[str]
) -> tuple[OrderCheck, PinCheck | None]:
    """The order that ran against the one predicted, the pins against it, and on a device the peak
    of the order that ran (into ``timed``)."""
    # on a device, the order its executor runs the two providers' streams in, the copies it inserted included
    # (with optimizations on, the graph that runs is not the file's: the order of the file's nodes is checked)
    on_device = device != "cpu" and exact and timed.nodes
    inserted = timed.inserted or []
    expected = predicted_order(loaded, order, timed.nodes, inserted, timed.casts) if on_device else None
    if expected is None and KEY_STREAMS in {p.key for p in loaded.proto.metadata_props}:
        expected = stream_order(loaded.proto, order)  # copies on a stream of their own
    checked = compare_order(expected or planned_order(loaded.proto, order), timed.ran, exact=exact)
    if not checked.matches:
        warnings.append(_order_warning(checked, order))
    if device != "cpu":  # the device peak as it ran: placed as onnxruntime placed it, in the profiled order
        timed.ran_peak = ran_peak(loaded, order, timed.nodes, inserted, timed.casts)
    return checked, _pin_check(loaded.proto, timed.ran, order, warnings)


def _tolerances(opt_level: str, rtol: float | None, atol: float | None) -> tuple[float, float]:
    """The comparison's tolerances: those given, else bit equality at ``disable`` and 1e-5 / 1e-6 above it."""
    exact = opt_level == "disable"
    return (
        (0.0 if exact else _DEFAULT_RTOL) if rtol is None else rtol,
        (0.0 if exact else _DEFAULT_ATOL) if atol is None else atol,
    )


def _pin_check(proto: onnx.ModelProto, ran: Sequence[str], order: str, warnings: list[str]) -> PinCheck | None:
    """The model's order pins against the order that ran; a warning when they do not hold, or when a
    rewritten model without pins runs in the DEFAULT order (its copies then run where onnxruntime
    puts them, not where they were planned)."""
    constraints = metadata_json(proto, KEY_PINS)
    if not isinstance(constraints, list):
        if order == "default" and _has_memcpy_nodes(proto):
            warnings.append(
                "this rewritten model has no order pins: in the DEFAULT order its copies run where onnxruntime puts "
                "them, not where they were planned (rewrite it without --no-order-pins)"
            )
        return None
    pins = check_pins([c for c in constraints if isinstance(c, dict)], ran, order)
    if not pins.holds:
        first = pins.violated[0]
        side = "before" if "before" in first else "after"
        cause = (
            "; where onnxruntime appends nodes of its own (copies between host and device, Casts around a float16 "
            "node no provider runs in float16), PRIORITY_BASED runs every copy that is ready before the nodes that "
            "wait for them: plan with --device, or plan and run with --execution-order default"
            if order == "priority"
            else ""
        )
        warnings.append(
            f"{len(pins.violated)} copy(ies) ran on the wrong side of their pinned node (first: {first['copy']!r} "
            f"should run {side} {first[side]!r}); check that ConstantFolding is disabled{cause}"
        )
    return pins


def _all_feeds(
    proto: onnx.ModelProto,
    model: str,
    inputs: str | os.PathLike[str] | None,
    seed: int,
    value_ranges: Mapping[str, tuple[float, float]] | None,
    warnings: list[str],
) -> tuple[dict[str, np.ndarray], str]:
    """Every input, from the file given or generated, and where they came from."""
    specs = input_specs(proto)
    if inputs is not None:
        return load_inputs(inputs, specs, model), "file"
    feeds, input_warnings = generate_inputs(specs, seed=seed, value_ranges=value_ranges)
    warnings += input_warnings
    return feeds, "generated"


def _unstable_warning(compare_to: str, unstable: Mapping[str, OutputComparison]) -> list[str]:
    if not unstable:
        return []
    return [f"{compare_to} is not deterministic on these inputs: {', '.join(unstable)} differ between two of its runs"]


def _setup_warnings(
    settings: Mapping[str, Any],
    config: SessionConfig,
    device: str,
    ep_options: Mapping[str, str] | None,
    locked: PageLocked | None = None,
) -> list[str]:
    """What in the session set-up may keep the run from being the one planned (``locked``: streamed
    weights that could not be page-locked)."""
    warnings = [locked.refused] if locked is not None and locked.refused else []
    if ep_options and device == "cpu":
        warnings.append("--ep-option is ignored with --device cpu (the CPU provider takes no such options)")
    warnings += settings_warnings(
        settings, config.sess_options, config.kwargs.get("disabled_optimizers"), config.providers
    )
    if os.environ.get(LOAD_CONFIG_FROM_MODEL) == "1":
        warnings.append(LOAD_CONFIG_WARNING)
    return warnings


def _session_doc(config: SessionConfig, settings: Mapping[str, Any]) -> dict[str, Any]:
    """The session a run used, for its report."""
    return {
        "execution_order": EXECUTION_ORDERS[config.order],
        "disabled_optimizers": list(config.kwargs.get("disabled_optimizers", [])),
        "provider_options": {p[0]: p[1] for p in config.providers if isinstance(p, tuple)},
        "model_settings": settings,
    }


def _check_run_options(
    repeat: int, rtol: float | None, atol: float | None, *, memory: bool = False, device: str = "cpu"
) -> None:
    if memory and device == "webgpu":
        raise OffloadError(
            "--measure-memory: the WebGPU provider's allocator reports no byte counts",
            hint="measure on --device cpu (the CPU replica) or on cuda/ascend; placement and inserted copies are "
            "still checked on webgpu",
        )
    if repeat < 1:
        raise OffloadError(f"repeat must be at least 1, not {repeat}")
    for name, value in (("rtol", rtol), ("atol", atol)):
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise OffloadError(
                f"--{name} {value} is not a tolerance", hint=f"give a finite number >= 0, e.g. --{name} 1e-5"
            )


@dataclass
class _Timed:
    providers: list[str]
    outputs: dict[str, Any]
    nodes: list[RanNode]  # the nodes in the order they ran (profiled warm-up), with their providers
    runs: list[float]
    inserted: list[InsertedCopy] | None = None  # copies onnxruntime inserted (a non-CPU device)
    ran_peak: int | None = None  # the device peak simulated in the order that ran (a non-CPU device)
    casts: tuple[HostCast, ...] = ()  # the float16 fallback's Casts onnxruntime inserted (a non-CPU device)

    @property
    def ran(self) -> list[str]:
        """Node names in the order they ran."""
        return [n.name for n in self.nodes]

    def report_fields(self) -> dict[str, Any]:
        """What `RunReport` holds of the timed runs."""
        return {
            "providers": self.providers,
            "latency_runs": self.runs,
            "outputs": {n: _describe_value(v) for n, v in self.outputs.items()},
            "output_values": self.outputs,
            "inserted": self.inserted,
            "ran": self.ran,
            "ran_peak_bytes": self.ran_peak,
        }


def _timed_runs(
    model: str,
    config: SessionConfig,
    device: str,
    ort: Any,
    feeds_all: Mapping[str, np.ndarray],
    repeat: int,
    hint: str | None = None,
) -> _Timed:
    """One profiled warm-up run and ``repeat`` timed runs, each on its own copy of the inputs (one that
    changes them fails, ``hint`` its fix); the session is gone when this returns, so that a model to
    compare with can run next without both being held at once."""
    with tempfile.TemporaryDirectory(prefix="offloadctl-profile-") as tmp:
        config.sess_options.enable_profiling = True
        config.sess_options.profile_file_prefix = os.path.join(tmp, "profile")
        placed = save_placed_graph(config.sess_options, tmp) if device != "cpu" else None
        session = create_session(model, config, device, ort=ort)
        providers = list(session.get_providers())
        feeds = feeds_for(session, feeds_all, model, "the inputs")
        outputs = run_once(session, feeds, model, ort, overwritten_hint=hint)  # warm-up, profiled
        profile = session.end_profiling()
        nodes = ran_nodes(profile) if profile else []
        inserted, casts = _inserted(placed, model, nodes)
    runs = [timed_run(session, feeds, model, ort, overwritten_hint=hint) for _ in range(repeat)]
    del session, feeds
    gc.collect()
    return _Timed(providers, outputs, nodes, runs, inserted, casts=casts)


def _inserted(
    placed: os.PathLike[str] | None, model: str, ran: Sequence[RanNode] = ()
) -> tuple[list[InsertedCopy] | None, tuple[HostCast, ...]]:
    """The copies onnxruntime inserted into ``model`` and the Casts around the float16 nodes it runs in
    float32 on the CPU (in the order of their indices in the profile of the run, ``ran``), read from
    the graph it saved at ``placed``; (None, ()) where it saved none."""
    if placed is None or not os.path.exists(placed):
        return None, ()
    return inserted_nodes(placed, onnx.load(str(model), load_external_data=False), {n.name: n.index for n in ran})


@contextlib.contextmanager
def _original_refused_too(
    compare_to: str | None,
    feeds_all: Mapping[str, np.ndarray],
    device: str,
    opt_level: str,
    ep_options: Mapping[str, str] | None,
    ort: Any,
) -> Iterator[None]:
    """Raise what the block raises; when onnxruntime would not load or run the model and refuses the
    original of ``compare_to`` the same way, say so: then the rewrite is not the cause."""
    try:
        yield
    except ModelRefused as refused:
        if compare_to is None:
            raise
        _, config = _original_config(compare_to, device, opt_level, ep_options, ort)
        try:
            session = create_session(compare_to, config, device, ort=ort)
            run_once(session, feeds_for(session, feeds_all, compare_to, compare_to), compare_to, ort)
        except OffloadError as also:  # any other failure of the original leaves the rewrite's own message
            if isinstance(also, ModelRefused):
                raise OffloadError(
                    f"{refused.message} (onnxruntime refuses the original {compare_to} too, so the rewrite is not "
                    f"the cause: {also.detail})",
                    hint=f"run models that onnxruntime runs on --device {device} (re-export the original at an "
                    "opset and with operators it implements)",
                ) from None
        raise


def _original_config(
    compare_to: str, device: str, opt_level: str, ep_options: Mapping[str, str] | None, ort: Any
) -> tuple[LoadedModel, SessionConfig]:
    """The original of a comparison, and the session settings it is run with: its own required ones."""
    original = load_model(compare_to, normalize=False)
    settings = required_settings(original.proto, compare_to)
    return original, session_config(settings, device, opt_level=opt_level, ep_options=ep_options, ort=ort)


class _Against(NamedTuple):
    """What ``run --compare-to`` compares against: the original (None: nothing), the optimization level it
    runs at (`offloadctl.running.planned_run.original_level`), its provider options, and the tolerances asked for."""

    path: str | None
    opt_level: str
    ep_options: Mapping[str, str] | None
    rtol: float | None
    atol: float | None


def _compare_with(
    against: _Against,
    model: str,
    outputs: Mapping[str, Any],
    feeds_all: Mapping[str, np.ndarray],
    device: str,
    ort: Any,
    warnings: list[str],
) -> _Compared:
    """Run the original twice with the same inputs and settings: (each output of the model against
    the original's first run, the outputs in which the original's two runs differ, the copies
    onnxruntime inserted into the original on a non-CPU device), with the tolerances (`_tolerances`);
    no comparison without an original. A warning on outputs the original itself does not repeat
    goes to ``warnings``."""
    compare_to, opt_level, ep_options, rtol, atol = against
    if compare_to is None:
        return _Compared(None, {}, None, rtol, atol)
    rtol, atol = _tolerances(opt_level, rtol, atol)
    original, config = _original_config(compare_to, device, opt_level, ep_options, ort)
    _check_same_inputs(input_specs(original.proto), feeds_all, compare_to, model)
    with tempfile.TemporaryDirectory(prefix="offloadctl-placed-") as tmp:
        placed = save_placed_graph(config.sess_options, tmp) if device != "cpu" else None
        session = create_session(compare_to, config, device, ort=ort)
        inserted, _ = _inserted(placed, compare_to)
    feeds = feeds_for(session, feeds_all, compare_to, model)
    expected = run_once(session, feeds, compare_to, ort)
    again = run_once(session, feeds, compare_to, ort)
    del session, feeds
    unstable = {n: c for n, c in compare_outputs(again, expected, rtol=0.0, atol=0.0).items() if not c.identical}
    comparison = compare_outputs(dict(outputs), expected, rtol=rtol, atol=atol)
    for name in expected:
        if name not in outputs:
            comparison[name] = OutputComparison(False, None, None, False, f"{model} has no output of this name")
    warnings += _unstable_warning(compare_to, unstable)
    return _Compared(comparison, unstable, inserted, rtol, atol)


class _Compared(NamedTuple):
    """The comparison with the original and its tolerances, as `RunReport` holds them (without
    ``--compare-to``: no comparison, the tolerances as given)."""

    comparison: dict[str, OutputComparison] | None
    original_unstable: dict[str, OutputComparison]
    original_inserted: list[InsertedCopy] | None
    rtol: float | None
    atol: float | None


def _order_warning(order: OrderCheck, kind: str = "priority") -> str:
    parts = []
    if order.first_differences:
        d = order.first_differences[0]
        parts.append(f"at step {d['index']} the plan has {d['planned']!r} but {d['ran']!r} ran")
    if order.exact and order.missing:
        parts.append(f"{len(order.missing)} planned node(s) did not run (first: {order.missing[0]!r})")
    where = "the planned (file) order" if kind == "priority" else "the DEFAULT order predicted for it"
    return f"nodes did not run in {where}: " + "; ".join(parts)
