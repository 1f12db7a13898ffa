"""Running a model with onnxruntime: session settings, inputs, timing, order check, comparison.

This module owns everything `offloadctl run` does, as a library:

* the session configuration an offloaded model needs (`session_config`): always
  ``ExecutionOrder.PRIORITY_BASED`` (the file order is the plan; the DEFAULT order would undo it),
  the optimizers the model's metadata asks to disable, and CANN provider options
  (``enable_cann_graph=0``, ``arena_extend_strategy=kSameAsRequested``) that the user may override;
* the settings record a rewritten model carries in its metadata (key ``offloadctl.session``) and
  the warnings for a session configuration that would not honour it (`check_session_settings`);
* a check that the requested device is really in use: onnxruntime silently falls back to the CPU
  when the Ascend toolkit or the CUDA libraries are missing;
* the order nodes actually ran in, read from onnxruntime's profiling events, against the planned
  order (the model file's node order, Constant nodes excluded);
* the inputs: read from an .npz file, a folder of .npy files or onnx's test-data layout
  (`load_inputs`), or generated from a seed and value ranges (`generate_inputs`), never with
  invented sizes (dynamic dimensions must be pinned); and the outputs saved (`save_outputs`);
* a comparison of every output against an original model run with the same inputs.

onnxruntime is an optional dependency and is imported only when a model is run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import math
import os
import re
import statistics
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import onnx

from offloadctl.analysis.graph import analyse
from offloadctl.analysis.order import EXECUTION_ORDERS, expected_run_order
from offloadctl.core.errors import OffloadError
from offloadctl.core.onnxutil import copy_kind
from offloadctl.loading.model import LoadedModel, load_model
from offloadctl.loading.placed import HostCast
from offloadctl.rewriting.metadata import (
    KEY_PINS,
    KEY_SESSION,
    KEY_STREAMS,
    PinCheck,
    check_pins,
    metadata_json,
    planned_shapes,
    session_settings,
)
from offloadctl.rewriting.streams import PARTITION_KEY, checked_streams, stream_order
from offloadctl.running.allocator import AllocatorFigure, SessionSpec, measure_memory
from offloadctl.running.growth import MemoryGrowth, memory_growth
from offloadctl.running.inputs import InputSpec, generate_inputs, input_specs, load_inputs
from offloadctl.running.pinned import PageLocked, hand_over, runtime_allocator, streamed_weights
from offloadctl.running.placement import (
    PLUGINS,
    InsertedCopy,
    add_plugin_provider,
    inserted_nodes,
    save_placed_graph,
)
from offloadctl.running.replay import RanNode, predicted_order, ran_nodes, ran_peak

__all__ = [
    "DEVICES",
    "OPT_LEVELS",
    "SESSION_METADATA_KEY",
    "CANN_DEFAULT_OPTIONS",
    "WEBGPU_DEFAULT_OPTIONS",
    "ModelRefused",
    "SessionConfig",
    "OrderCheck",
    "OutputComparison",
    "RunReport",
    "import_onnxruntime",
    "quiet_onnxruntime",
    "read_session_settings",
    "session_config",
    "settings_warnings",
    "check_session_settings",
    "parse_ep_options",
    "feeds_for",
    "required_settings",
    "run_once",
    "planned_order",
    "order_from_profile",
    "compare_order",
    "compare_outputs",
    "create_session",
    "run_model",
]

logger = logging.getLogger(__name__)

#: --device name -> onnxruntime execution provider.
DEVICES: dict[str, str] = {
    "ascend": "CANNExecutionProvider",
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "webgpu": "WebGpuExecutionProvider",
}

#: --opt-level name -> name of the onnxruntime GraphOptimizationLevel member.
OPT_LEVELS: dict[str, str] = {
    "disable": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "all": "ORT_ENABLE_ALL",
}

SESSION_METADATA_KEY = KEY_SESSION

#: CANN provider options `run` uses unless the model's metadata or --ep-option says otherwise.
#: With ``enable_cann_graph`` on (CANN's default) CANN compiles subgraphs and owns their memory,
#: and the copy nodes split the graph.
CANN_DEFAULT_OPTIONS: dict[str, str] = {"enable_cann_graph": "0", "arena_extend_strategy": "kSameAsRequested"}
#: WebGPU provider options `run` uses unless the model's metadata or --ep-option says otherwise. With
#: its default NHWC layout the provider replaces every Conv and pool with a new node (a new, higher
#: index): both execution orders follow node indices, so the planned order would not run.
WEBGPU_DEFAULT_OPTIONS: dict[str, str] = {"preferredLayout": "NCHW"}
_DEFAULT_OPTIONS = {"CANNExecutionProvider": CANN_DEFAULT_OPTIONS, "WebGpuExecutionProvider": WEBGPU_DEFAULT_OPTIONS}

# What each provider does when an option is not given (only the options the settings record uses).
_PROVIDER_DEFAULTS: dict[str, dict[str, str]] = {
    "CANNExecutionProvider": {"enable_cann_graph": "1", "arena_extend_strategy": "kNextPowerOfTwo"},
    "CUDAExecutionProvider": {"arena_extend_strategy": "kNextPowerOfTwo"},
    "WebGpuExecutionProvider": {"preferredLayout": "NHWC"},
}

# Keys of the settings record's per-provider sections.
_SECTION_PROVIDERS: dict[str, str] = {
    "cann": "CANNExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "cpu": "CPUExecutionProvider",
    "webgpu": "WebGpuExecutionProvider",
}

_EXTRAS = {"ascend": "cann", "cpu": "cpu", "cuda": "cuda", "webgpu": "webgpu"}

_DEVICE_FIX = {
    "ascend": (
        "the Ascend CANN toolkit could not be loaded",
        "install the Ascend CANN toolkit and source its set_env.sh "
        "(e.g. source /usr/local/Ascend/ascend-toolkit/set_env.sh), or use --device cpu",
    ),
    "cuda": (
        "the CUDA/cuDNN libraries could not be loaded",
        "install the CUDA and cuDNN versions your onnxruntime-gpu was built for and put them on "
        "LD_LIBRARY_PATH, or use --device cpu",
    ),
    "webgpu": (
        "the WebGPU provider found no usable adapter",
        "install a GPU driver with Vulkan support (on a machine without a GPU: a software Vulkan driver such as "
        "Mesa's lavapipe >= 23 and ORT_WEBGPU_EP_ALLOW_SOFTWARE_ADAPTER=1), or use --device cpu",
    ),
    "cpu": ("", "reinstall onnxruntime"),
}

#: An environment variable that makes onnxruntime replace the caller's session options (execution
#: order included) with the model's ``ort_config`` metadata.
LOAD_CONFIG_FROM_MODEL = "ORT_LOAD_CONFIG_FROM_MODEL"
LOAD_CONFIG_WARNING = (
    f"{LOAD_CONFIG_FROM_MODEL}=1 is set: onnxruntime replaces this session's options with the model's ort_config "
    "metadata, execution order included, so the order and the settings reported may not be the ones that ran; "
    f"unset {LOAD_CONFIG_FROM_MODEL}"
)

_DEFAULT_RTOL = 1e-5
_DEFAULT_ATOL = 1e-6


# --------------------------------------------------------------------------------------------------
# onnxruntime and session settings


def import_onnxruntime(device: str = "cpu") -> Any:
    """Import onnxruntime, or fail with the install command for ``device``.

    Raises:
        OffloadError: onnxruntime is not installed.
    """
    try:
        import onnxruntime
    except ImportError:
        extra = _EXTRAS.get(device, "cpu")
        raise OffloadError(
            "onnxruntime is not installed",
            hint=f"pip install 'offloadctl[{extra}]' (extras: cann for Ascend, cpu, cuda; install only one)",
        ) from None
    return onnxruntime


def quiet_onnxruntime(device: str = "cpu") -> None:
    """Keep onnxruntime's process-wide logger to fatal errors (info with -v): the command line
    reports its failures itself, as one message. Library callers keep their own setting."""
    import_onnxruntime(device).set_default_logger_severity(_ort_log_severity())


def _ort_log_severity() -> int:
    """onnxruntime's log level: 1 (info) with -v, else 4 (fatal only; errors are raised to us)."""
    return 1 if logging.getLogger().isEnabledFor(logging.INFO) else 4


def read_session_settings(model: str | os.PathLike[str] | onnx.ModelProto) -> dict[str, Any]:
    """The session settings a model asks for (metadata key ``offloadctl.session``), or ``{}``.

    Args:
        model: a path (read without external weight data) or a loaded proto.

    Raises:
        OffloadError: the file cannot be read, or the metadata entry is not a JSON object.
    """
    if isinstance(model, onnx.ModelProto):
        return _settings_of(model)
    try:
        return _settings_of(load_model(model, normalize=False).proto)
    except OffloadError as exc:
        if str(model) in exc.message:
            raise
        raise OffloadError(f"{model}: {exc.message}", hint=exc.hint) from None


def _settings_of(proto: onnx.ModelProto) -> dict[str, Any]:
    return session_settings(proto) or {}


def _has_memcpy_nodes(proto: onnx.ModelProto) -> bool:
    return any(copy_kind(n) is not None for n in proto.graph.node)


def required_settings(proto: onnx.ModelProto, where: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """The settings record, or the minimum a model with copy nodes but no record needs."""
    try:
        settings = _settings_of(proto)
    except OffloadError as exc:
        if where is None:
            raise
        raise OffloadError(f"{where}: {exc.message}", hint=exc.hint) from None
    if not settings and _has_memcpy_nodes(proto):
        settings = {"execution_order": EXECUTION_ORDERS["priority"]}
    return settings


def _provider_sections(settings: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    """Per-provider option sections of a settings record, keyed by provider name."""
    sections: dict[str, dict[str, str]] = {}
    for key, value in settings.items():
        provider = _SECTION_PROVIDERS.get(key) or (key if key.endswith("ExecutionProvider") else None)
        if provider is not None and isinstance(value, Mapping):
            sections[provider] = {str(k): _option_str(v) for k, v in value.items()}
    return sections


def _option_str(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)


def _same_option(a: str | None, b: str | None) -> bool:
    def norm(v: str | None) -> str | None:
        if v is None:
            return None
        s = str(v).strip().lower()
        return {"true": "1", "false": "0"}.get(s, s)

    return norm(a) == norm(b)


def parse_ep_options(specs: Sequence[str]) -> dict[str, str]:
    """Parse ``KEY=VALUE`` strings (as given to ``--ep-option``)."""
    options: dict[str, str] = {}
    for spec in specs:
        key, sep, value = spec.partition("=")
        if not sep or not key.strip():
            raise OffloadError(
                f"--ep-option {spec!r} is not KEY=VALUE", hint="for example --ep-option enable_cann_graph=0"
            )
        options[key.strip()] = value.strip()
    return options


class SessionConfig(NamedTuple):
    """What `onnxruntime.InferenceSession(path, sess_options, providers=providers, **kwargs)` needs,
    and the same settings spelled out (for sessions made through the C API)."""

    sess_options: Any
    providers: list[Any]
    kwargs: dict[str, Any]
    opt_level: str = "all"
    order: str = "priority"
    entries: dict[str, str] = {}  # session config entries set on sess_options
    plugin: bool = False  # a plugin provider (WebGPU): added to sess_options, not named in providers=

    def spec(self, model: str, device: str) -> SessionSpec:
        """The same session, as `offloadctl.running.allocator` makes it."""
        options: dict[str, str] = next((p[1] for p in self.providers if isinstance(p, tuple)), {})
        return SessionSpec(
            model,
            device,
            opt_level=self.opt_level,
            config_entries=dict(self.entries),
            disabled_optimizers=tuple(self.kwargs.get("disabled_optimizers", ())),
            provider_options=dict(options),
        )


def session_config(
    settings: Mapping[str, Any],
    device: str,
    *,
    opt_level: str = "all",
    ep_options: Mapping[str, str] | None = None,
    ort: Any = None,
    order: str = "priority",
) -> SessionConfig:
    """Build the session configuration for running a model on ``device``.

    Args:
        settings: the model's settings record (`read_session_settings`); ``{}`` for none.
        device: ``ascend``, ``cpu`` or ``cuda``.
        opt_level: ``disable``, ``basic``, ``extended`` or ``all``.
        order: ``priority`` (PRIORITY_BASED: the file order is the plan) or ``default`` (onnxruntime's
            DEFAULT order, what every host but Python runs).
        ep_options: provider options that override the defaults and the record (CANN and CUDA).
        ort: the onnxruntime module (imported if not given).

    Returns:
        sess_options with the order (``PRIORITY_BASED`` by default) and the optimization level; providers (the
        device's provider with its options, then the CPU provider); kwargs with
        ``disabled_optimizers`` from the record and ``enable_fallback=0`` so that a provider that
        fails to start raises instead of silently falling back to the CPU.
    """
    if device not in DEVICES:
        raise OffloadError(f"unknown device {device!r}", hint=f"use one of: {', '.join(DEVICES)}")
    if opt_level not in OPT_LEVELS:
        raise OffloadError(f"unknown optimization level {opt_level!r}", hint=f"use one of: {', '.join(OPT_LEVELS)}")
    if order not in EXECUTION_ORDERS:
        raise OffloadError(f"unknown execution order {order!r}", hint=f"use one of: {', '.join(EXECUTION_ORDERS)}")
    ort = ort or import_onnxruntime(device)
    so = ort.SessionOptions()
    so.execution_order = getattr(ort.ExecutionOrder, EXECUTION_ORDERS[order])
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, OPT_LEVELS[opt_level])
    entries: dict[str, str] = {}
    if opt_level == "disable":
        # Weight pre-packing is a kernel-level rewrite that graph optimizations do not govern:
        # onnxruntime pre-packs a constant MatMul weight but not one that arrives through
        # MemcpyFromHost, and the two paths may round differently in the last bit. Verifying a plan
        # compares like with like.
        entries["session.disable_prepacking"] = "1"
    for key, value in entries.items():
        so.add_session_config_entry(key, value)
    # onnxruntime logs to stderr itself: once per weight listed in graph.input (how offloaded weights
    # escape constant folding), and every failure it also raises, which reaches the user as one
    # clear message. Keep its log to fatal errors unless the user asked for detail (-v).
    so.log_severity_level = _ort_log_severity()
    provider = DEVICES[device]
    providers: list[Any]
    if provider == "CPUExecutionProvider":
        providers = ["CPUExecutionProvider"]
    else:
        options = dict(_DEFAULT_OPTIONS.get(provider, {}))
        options.update(_provider_sections(settings).get(provider, {}))
        options.update({k: _option_str(v) for k, v in (ep_options or {}).items()})
        providers = [(provider, options), "CPUExecutionProvider"]
    plugin = provider in PLUGINS
    if plugin:
        add_plugin_provider(ort, so, provider, providers[0][1])
    kwargs: dict[str, Any] = {"enable_fallback": 0}
    disabled = [str(x) for x in settings.get("disabled_optimizers") or []]
    if disabled:
        kwargs["disabled_optimizers"] = disabled
    return SessionConfig(so, providers, kwargs, opt_level, order, entries, plugin)


def _providers_as_mapping(provider_options: Any) -> dict[str, dict[str, str]]:
    """Accept {provider: options} or an InferenceSession-style providers list."""
    if provider_options is None:
        return {}
    result: dict[str, dict[str, str]] = {}
    if isinstance(provider_options, Mapping):
        for key, value in provider_options.items():
            name = _SECTION_PROVIDERS.get(key) or key
            result[name] = {str(k): _option_str(v) for k, v in (value or {}).items()}
        return result
    for entry in provider_options:
        if isinstance(entry, str):
            result[entry] = {}
        else:
            name, options = entry
            result[name] = {str(k): _option_str(v) for k, v in (options or {}).items()}
    return result


def settings_warnings(
    settings: Mapping[str, Any],
    sess_options: Any,
    disabled_optimizers: Sequence[str] | None,
    provider_options: Any,
) -> list[str]:
    """Warnings for a session configuration that does not honour a settings record.

    Args:
        settings: what the model asks for (`read_session_settings`).
        sess_options: an ``onnxruntime.SessionOptions`` (None: onnxruntime's defaults).
        disabled_optimizers: the ``disabled_optimizers`` passed to the session.
        provider_options: ``{provider or section name: {key: value}}``, or the ``providers`` list
            given to ``InferenceSession`` (names or (name, options) pairs).
    """
    warnings: list[str] = []
    order_name = EXECUTION_ORDERS["default"]  # onnxruntime's own default
    level_name = "ORT_ENABLE_ALL"
    if sess_options is not None:
        order_name = getattr(sess_options.execution_order, "name", str(sess_options.execution_order))
        level_name = getattr(sess_options.graph_optimization_level, "name", str(sess_options.graph_optimization_level))
    wanted_order = settings.get("execution_order")
    held = (
        settings.get("order_pins") and order_name.split(".")[-1] == EXECUTION_ORDERS["default"]
    )  # the pins hold the copies
    if wanted_order and not held and str(wanted_order).split(".")[-1] != order_name.split(".")[-1]:
        warnings.append(
            f"the model asks for execution_order={wanted_order} but the session uses {order_name}: "
            "the copy nodes will not run where the plan put them (set "
            "SessionOptions.execution_order = ExecutionOrder.PRIORITY_BASED)"
        )
    wanted_disabled = [str(x) for x in settings.get("disabled_optimizers") or []]
    if wanted_disabled and level_name.split(".")[-1] != "ORT_DISABLE_ALL":
        missing = [o for o in wanted_disabled if o not in set(disabled_optimizers or [])]
        if missing:
            warnings.append(
                f"the model asks to disable the optimizer(s) {', '.join(missing)} but the session keeps them: "
                "offloaded weights may be folded back onto the device (pass "
                f"disabled_optimizers={wanted_disabled!r} to InferenceSession)"
            )
    given = _providers_as_mapping(provider_options)
    for provider, wanted in _provider_sections(settings).items():
        if provider not in given:
            continue
        defaults = _PROVIDER_DEFAULTS.get(provider, {})
        for key, value in wanted.items():
            actual = given[provider].get(key, defaults.get(key))
            if not _same_option(actual, value):
                shown = "not set" if actual is None else f"{key}={actual}"
                if key not in given[provider] and actual is not None:
                    shown += " (the provider's default)"
                warnings.append(f"the model asks for {provider} option {key}={value} but the session has {shown}")
    return warnings


def check_session_settings(
    model_path: str | os.PathLike[str],
    sess_options: Any,
    disabled_optimizers: Sequence[str] | None,
    provider_options: Any,
) -> list[str]:
    """Warnings for running ``model_path`` with a user's own onnxruntime session configuration.

    The requirements come from the model's ``offloadctl.session`` metadata; a model that has copy
    nodes but no such record still needs ``PRIORITY_BASED`` order.

    Args:
        model_path: the (rewritten) model.
        sess_options: the ``onnxruntime.SessionOptions`` the user will pass (None: defaults).
        disabled_optimizers: the user's ``disabled_optimizers`` list.
        provider_options: ``{provider: options}`` or the ``providers`` list for InferenceSession.

    Returns:
        One message per setting that is not honoured; empty when all are.
    """
    proto = load_model(model_path, normalize=False).proto
    warnings = []
    settings = required_settings(proto, model_path)
    if not read_session_settings(proto) and _has_memcpy_nodes(proto):
        warnings.append(
            f"{model_path} has copy nodes but no {SESSION_METADATA_KEY!r} metadata: its required session "
            "settings are unknown beyond PRIORITY_BASED order"
        )
    return warnings + settings_warnings(settings, sess_options, disabled_optimizers, provider_options)


# --------------------------------------------------------------------------------------------------
# Execution order


def planned_order(proto: onnx.ModelProto, order: str = "priority") -> list[str]:
    """The order onnxruntime runs the model in with PRIORITY_BASED (or ``order="default"``: its
    DEFAULT order): node names, Constant nodes and nodes onnxruntime replaces or removes excluded
    (`offloadctl.analysis.order.expected_run_order`).

    For a model rewritten by `offloadctl apply` the PRIORITY_BASED order is its file order. Nodes
    without a name, or whose name is not unique, cannot be matched with profiling events and are
    left out.
    """
    return expected_run_order(proto, order)


def order_from_profile(profile_path: str | os.PathLike[str]) -> list[str]:
    """Node names in the order they ran, from an onnxruntime profiling file (one run)."""
    return [node.name for node in ran_nodes(profile_path)]


@dataclass
class OrderCheck:
    """How the order nodes ran compares with the planned order."""

    planned_count: int
    ran_count: int
    exact: bool  # True: every planned node must run, in order; False: relative order of survivors
    matches: bool
    first_differences: list[dict[str, Any]]
    missing: list[str]  # planned nodes that did not run (removed or fused by optimizations)

    def to_json(self) -> dict[str, Any]:
        return {
            "planned_count": self.planned_count,
            "ran_count": self.ran_count,
            "mode": "exact" if self.exact else "relative",
            "matches": self.matches,
            "verdict": "as planned" if self.matches else "differs from the plan",
            "first_differences": self.first_differences,
            "missing_count": len(self.missing),
            "missing": self.missing[:20],
        }


def compare_order(planned: Sequence[str], ran: Sequence[str], *, exact: bool, limit: int = 5) -> OrderCheck:
    """Compare the planned node order with the order that ran.

    Nodes that ran but were not planned (inserted by onnxruntime, unnamed, in subgraphs) are
    ignored. With ``exact`` every planned node must have run, in the planned order; otherwise
    only the relative order of planned nodes that still ran counts.
    """
    planned_set = set(planned)
    ran_planned = [n for n in ran if n in planned_set]
    ran_set = set(ran_planned)
    survivors = [n for n in planned if n in ran_set]
    missing = [n for n in planned if n not in ran_set]
    differences = []
    for i, (want, got) in enumerate(zip(survivors, ran_planned)):
        if want != got:
            differences.append({"index": i, "planned": want, "ran": got})
            if len(differences) >= limit:
                break
    matches = not differences and (not exact or not missing)
    return OrderCheck(len(planned), len(ran_planned), exact, matches, differences, missing)


# --------------------------------------------------------------------------------------------------
# Output comparison


@dataclass
class OutputComparison:
    """One output of the model against the same output of the original."""

    identical: bool
    max_abs: float | None
    max_rel: float | None
    within_tolerance: bool
    note: str | None = None

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "identical": self.identical,
            "max_abs": self.max_abs,
            "max_rel": self.max_rel,
            "within_tolerance": self.within_tolerance,
        }
        if self.note:
            doc["note"] = self.note
        return doc


def _finite_or_none(x: float) -> float | None:
    return float(x) if np.isfinite(x) else None


def _compare_one(got: Any, want: Any, rtol: float, atol: float) -> OutputComparison:
    if not isinstance(got, np.ndarray) or not isinstance(want, np.ndarray):
        same = _equal_values(got, want)
        return OutputComparison(same, None, None, same, None if same else "non-tensor outputs differ")
    if got.shape != want.shape:
        return OutputComparison(False, None, None, False, f"shape {list(got.shape)} vs {list(want.shape)}")
    if got.dtype != want.dtype:
        return OutputComparison(False, None, None, False, f"dtype {got.dtype} vs {want.dtype}")
    if got.dtype.kind in "OSUV":
        same = bool(np.array_equal(got, want))
        return OutputComparison(same, None, None, same)
    identical = got.tobytes() == want.tobytes()
    if identical:
        return OutputComparison(True, 0.0, 0.0, True)
    if got.size == 0:
        return OutputComparison(True, 0.0, 0.0, True)
    wide = np.complex128 if got.dtype.kind == "c" else np.float64
    a, b = got.astype(wide), want.astype(wide)
    both_nan = np.isnan(a) & np.isnan(b)
    same = (a == b) | both_nan
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.where(same, 0.0, np.abs(a - b))
        max_abs = float(np.max(diff))
        nonzero = np.abs(b) > 0
        rel = np.where(nonzero & ~same, diff / np.where(nonzero, np.abs(b), 1.0), 0.0)
        max_rel = float(np.max(rel))
        ok = bool(np.all(same | (diff <= atol + rtol * np.abs(b))))
    note = None if np.isfinite(max_abs) else "NaN or infinity where the original has a different value"
    return OutputComparison(False, _finite_or_none(max_abs), _finite_or_none(max_rel), ok, note)


def _equal_arrays(a: Any, b: Any) -> bool:
    """Two arrays of the same shape, type and bytes (strings and objects compared as values)."""
    if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)) or a.shape != b.shape or a.dtype != b.dtype:
        return False
    return a.tobytes() == b.tobytes() if a.dtype.kind not in "OSUV" else bool(np.array_equal(a, b))


def _equal_values(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return _equal_arrays(a, b)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_equal_values(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal_values(a[k], b[k]) for k in a)
    return bool(a == b)


def compare_outputs(
    got: Mapping[str, Any], want: Mapping[str, Any], *, rtol: float, atol: float
) -> dict[str, OutputComparison]:
    """Compare every output in ``got`` with the output of the same name in ``want``.

    ``rtol = atol = 0`` demands bit equality. An output that the original lacks differs.
    """
    result = {}
    for name, value in got.items():
        if name not in want:
            result[name] = OutputComparison(False, None, None, False, "the original has no output of this name")
        else:
            result[name] = _compare_one(value, want[name], rtol, atol)
    return result


# --------------------------------------------------------------------------------------------------
# Sessions


def _ort_errors(ort: Any) -> tuple[type[BaseException], ...]:
    errors: list[type[BaseException]] = [RuntimeError, ValueError]
    state = getattr(getattr(ort, "capi", None), "onnxruntime_pybind11_state", None)
    for name in dir(state) if state is not None else ():
        obj = getattr(state, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            errors.append(obj)
    return tuple(errors)


_IR_RE = re.compile(r"Unsupported model IR version: (\d+), max supported IR version: (\d+)")


def _device_error(device: str, detail: str) -> OffloadError:
    provider = DEVICES[device]
    cause, fix = _DEVICE_FIX[device]
    return OffloadError(f"--device {device}: onnxruntime is not using {provider} ({detail}); {cause}", hint=fix)


class ModelRefused(OffloadError):
    """onnxruntime would not load or run a model: ``message`` says which and ``detail`` is
    onnxruntime's own first line."""

    def __init__(self, what: str, detail: str, *, hint: str | None = None) -> None:
        super().__init__(f"{what}: {detail}", hint=hint)
        self.detail = detail


def create_session(model_path: str | os.PathLike[str], config: SessionConfig, device: str, *, ort: Any = None) -> Any:
    """Create an InferenceSession and make sure it really runs on ``device``.

    Raises:
        OffloadError: the device's provider is missing from this onnxruntime build, could not be
            started, or onnxruntime fell back to another provider; or onnxruntime refuses the model
            (with a specific message for an IR version newer than it supports).
    """
    ort = ort or import_onnxruntime(device)
    provider = DEVICES[device]
    available = list(ort.get_available_providers())
    if provider not in available and not config.plugin:
        extra = _EXTRAS[device]
        raise OffloadError(
            f"--device {device}: {provider} is not available in this onnxruntime build "
            f"(available: {', '.join(available)})",
            hint=f"install the onnxruntime build for {device}: pip install 'offloadctl[{extra}]' "
            "(one onnxruntime package at a time), or use --device cpu",
        )
    path = str(model_path)
    try:
        providers = None if config.plugin else config.providers
        session = ort.InferenceSession(path, config.sess_options, providers=providers, **config.kwargs)
    except _ort_errors(ort) as exc:
        text = str(exc)
        ir = _IR_RE.search(text)
        if ir:
            version, supported = ir.groups()
            raise OffloadError(
                f"{path} has IR version {version}, newer than this onnxruntime ({ort.__version__}) supports "
                f"(at most {supported})",
                hint=f"re-export the model with IR version {supported} or lower, or set it and save a copy: "
                f"m = onnx.load({path!r}); m.ir_version = {supported}; onnx.save(m, 'model.ir{supported}.onnx')",
            ) from None
        if device != "cpu" and re.search(r"create \w+ ExecutionProvider fail|Failed to load library", text):
            raise _device_error(device, "creating the provider failed") from None
        first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
        hint = "check the model with onnx.checker.check_model(onnx.load(path), full_check=True)"
        if device != "cpu" and re.search(r"Duplicate definition of name \(\S*__offload\d+_", first):
            hint = _HOST_RESIDENT_HINT
        raise ModelRefused(f"onnxruntime cannot load {path}", first, hint=hint) from None
    in_use = list(session.get_providers())
    if not in_use or in_use[0] != provider:
        raise _device_error(device, f"in use: {', '.join(in_use) or 'none'}")
    return session


def run_once(session: Any, feeds: Mapping[str, np.ndarray], model: str, ort: Any) -> dict[str, Any]:
    """One run of ``session``: its outputs by name; a failed run is one clear error naming ``model``."""
    names = [o.name for o in session.get_outputs()]
    try:
        values = session.run(names, dict(feeds))
    except _ort_errors(ort) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        hint = "check the inputs (give real ones with --inputs FILE.npz)"
        if "no data transfer registered" in first and "Memcpy" in first:
            hint = _HOST_RESIDENT_HINT
        raise ModelRefused(f"onnxruntime failed running {model}", first, hint=hint) from None
    return dict(zip(names, values))


#: What to do when a rewrite copies a tensor its device keeps on the host
_HOST_RESIDENT_HINT = (
    "the rewrite copies a tensor that this device keeps on the host (a node it runs on the CPU makes or reads it): "
    "plan again with --device DEVICE, which keeps those tensors, and leave them out of --force (the plan warned "
    "of each forced one)"
)


def _check_same_inputs(specs: Sequence[InputSpec], feeds: Mapping[str, np.ndarray], original: str, model: str) -> None:
    """Refuse a comparison between models whose inputs differ in dtype or fixed dimensions."""
    for spec in specs:
        value = feeds.get(spec.name)
        if value is None:
            continue  # reported by feeds_for
        fixed = [d if isinstance(d, int) else None for d in spec.shape] if spec.shape is not None else None
        wrong_type = spec.dtype is not None and value.dtype != spec.dtype
        wrong_shape = fixed is not None and (
            value.ndim != len(fixed) or any(d is not None and d != a for d, a in zip(fixed, value.shape))
        )
        if wrong_type or wrong_shape:
            raise OffloadError(
                f"--compare-to {original} expects input {spec.name!r} as {spec.describe()}, but the inputs for {model} "
                f"are {value.dtype}{list(value.shape)}",
                hint="compare a rewritten model with the model its plan was made from",
            )


def feeds_for(session: Any, inputs: Mapping[str, np.ndarray], model: str, source: str) -> dict[str, np.ndarray]:
    """The feeds ``session`` takes, picked from ``inputs`` (named by ``source``); a missing one is a clear error."""
    feeds = {}
    for arg in session.get_inputs():
        if arg.name not in inputs:
            raise OffloadError(
                f"{model} needs input {arg.name!r}, which {source} does not take",
                hint="compare models with the same inputs",
            )
        feeds[arg.name] = inputs[arg.name]
    return feeds


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


def _describe_value(value: Any) -> dict[str, Any]:
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
    warnings += _setup_warnings(settings, config, device, ep_options, locked)
    feeds_all, source = _all_feeds(loaded.proto, model, inputs, seed, value_ranges, warnings)
    with _original_refused_too(compare_to, feeds_all, device, opt_level, ep_options, ort):
        timed = _timed_runs(model, config, device, ort, feeds_all, repeat)
    checked, pins = _order_checks(loaded, timed, order, opt_level == "disable", device, warnings)
    feeds = _session_feeds(loaded.proto, feeds_all)
    measured = measure_memory(config.spec(model, device), feeds, order=order, ort=ort) if memory else None
    compared = _compare_with(
        compare_to, model, timed.outputs, feeds_all, device, opt_level, ep_options, ort, rtol, atol, warnings
    )
    report = RunReport(
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
        growth=_growth(loaded, compare_to, config, device, feeds_all, measured, timed.ran, order, ort),
        streams=streams,
        page_locked=locked,
        **timed.report_fields(),
        **compared._asdict(),
    )
    locked.close()  # the sessions that read the buffers are gone
    return report


def _session_extras(
    model: str, proto: onnx.ModelProto, config: SessionConfig, device: str, order: str, ort: Any
) -> tuple[dict[str, Any] | None, PageLocked]:
    """What a rewrite adds to its session (``config``, in place): its partition file when its copies run
    on a stream of their own (`_copy_streams`), and its streamed weights from page-locked memory on
    CUDA and CANN (`_page_locked`)."""
    return _copy_streams(model, proto, config, order), _page_locked(model, proto, config, device, ort)


def _shapes_to_run(
    model: str,
    input_shapes: Mapping[str, Sequence[int]] | None,
    dims: Mapping[str, int] | None,
    inputs: str | os.PathLike[str] | None,
) -> dict[str, Any]:
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


def _growth(
    loaded: LoadedModel,
    compare_to: str | None,
    config: SessionConfig,
    device: str,
    feeds_all: Mapping[str, np.ndarray],
    measured: list[AllocatorFigure] | None,
    ran: list[str],
    order: str,
    ort: Any,
) -> MemoryGrowth | None:
    """A rewrite's measured peak on ``device`` against its original's, ``compare_to``, measured in a
    session made the same way (`offloadctl.running.growth`); None without both, for a model without
    copies, or when no figure is of that device."""
    if not measured or compare_to is None or not _has_memcpy_nodes(loaded.proto):
        return None
    mine = next((f for f in measured if f.device == device), None)
    if mine is None:
        return None
    original = onnx.load(compare_to, load_external_data=False)
    spec = config.spec(compare_to, device)  # the same session, less the rewrite's partition file
    spec = dataclasses.replace(
        spec, config_entries={k: v for k, v in (spec.config_entries or {}).items() if k != PARTITION_KEY}
    )
    figures = measure_memory(spec, _session_feeds(original, feeds_all), order=order, ort=ort)
    theirs = next((f for f in figures if f.device == device), None)
    if theirs is None:
        return None
    rewrite = analyse(loaded, order=order)
    return memory_growth(theirs.peak_bytes, mine.peak_bytes, rewrite, expected_run_order(original, order), ran)


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


def _session_feeds(proto: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The feeds a session of ``proto`` takes: its graph inputs that are not weights with defaults."""
    weights = {t.name for t in proto.graph.initializer}
    return {i.name: feeds[i.name] for i in proto.graph.input if i.name in feeds and i.name not in weights}


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
    model: str, config: SessionConfig, device: str, ort: Any, feeds_all: Mapping[str, np.ndarray], repeat: int
) -> _Timed:
    """One profiled warm-up run and ``repeat`` timed runs; the session is gone when this returns, so
    that a model to compare with can run next without both being held at once."""
    with tempfile.TemporaryDirectory(prefix="offloadctl-profile-") as tmp:
        config.sess_options.enable_profiling = True
        config.sess_options.profile_file_prefix = os.path.join(tmp, "profile")
        placed = save_placed_graph(config.sess_options, tmp) if device != "cpu" else None
        session = create_session(model, config, device, ort=ort)
        providers = list(session.get_providers())
        feeds = feeds_for(session, feeds_all, model, "the inputs")
        outputs = run_once(session, feeds, model, ort)  # warm-up, profiled
        profile = session.end_profiling()
        nodes = ran_nodes(profile) if profile else []
        inserted, casts = _inserted(placed, model, nodes)
    runs = []
    for _ in range(repeat):
        start = time.perf_counter()
        run_once(session, feeds, model, ort)
        runs.append(time.perf_counter() - start)
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


def _compare_with(
    compare_to: str | None,
    model: str,
    outputs: Mapping[str, Any],
    feeds_all: Mapping[str, np.ndarray],
    device: str,
    opt_level: str,
    ep_options: Mapping[str, str] | None,
    ort: Any,
    rtol: float | None,
    atol: float | None,
    warnings: list[str],
) -> _Compared:
    """Run the original twice with the same inputs and settings: (each output of the model against
    the original's first run, the outputs in which the original's two runs differ, the copies
    onnxruntime inserted into the original on a non-CPU device), with the tolerances (`_tolerances`);
    no comparison without ``compare_to``. A warning on outputs the original itself does not repeat
    goes to ``warnings``."""
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
