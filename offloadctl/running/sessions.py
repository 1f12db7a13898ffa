"""onnxruntime sessions for a run: the build a device needs, the settings a rewrite asks for, and a
session made, checked to run on the device asked for, fed and run.

* the session configuration an offloaded model needs (`session_config`): the execution order it was
  planned for, the optimizers the model's metadata asks to disable, and provider options (CANN:
  ``enable_cann_graph=0``, ``arena_extend_strategy=kSameAsRequested``) the user may override;
* the settings record a rewritten model carries in its metadata (key ``offloadctl.session``) and
  the warnings for a session configuration that would not honour it (`check_session_settings`);
* a check that the requested device is really in use (`create_session`): onnxruntime silently
  falls back to the CPU when the Ascend toolkit or the CUDA libraries are missing.

onnxruntime is an optional dependency and is imported only when a model is run.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import onnx

from offloadctl.analysis.order import EXECUTION_ORDERS
from offloadctl.core.errors import OffloadError
from offloadctl.core.onnxutil import copy_kind
from offloadctl.loading.model import load_model
from offloadctl.rewriting.metadata import (
    KEY_SESSION,
    SessionSettings,
    session_settings,
)
from offloadctl.running.allocator import SessionSpec
from offloadctl.running.inputs import InputSpec, own_copies
from offloadctl.running.placement import (
    PLUGINS,
    add_plugin_provider,
)

__all__ = [
    "CANN_DEFAULT_OPTIONS",
    "DEVICES",
    "InputOverwritten",
    "ModelRefused",
    "OPT_LEVELS",
    "SESSION_METADATA_KEY",
    "SessionConfig",
    "WEBGPU_DEFAULT_OPTIONS",
    "check_inputs_kept",
    "check_session_settings",
    "create_session",
    "feeds_for",
    "import_onnxruntime",
    "parse_ep_options",
    "quiet_onnxruntime",
    "read_session_settings",
    "required_settings",
    "run_once",
    "session_config",
    "settings_warnings",
    "timed_run",
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


def read_session_settings(model: str | os.PathLike[str] | onnx.ModelProto) -> SessionSettings:
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


def _settings_of(proto: onnx.ModelProto) -> SessionSettings:
    return session_settings(proto) or {}


def _has_memcpy_nodes(proto: onnx.ModelProto) -> bool:
    return any(copy_kind(n) is not None for n in proto.graph.node)


def required_settings(proto: onnx.ModelProto, where: str | os.PathLike[str] | None = None) -> SessionSettings:
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
    optimized = settings.get("optimized")
    if opt_level != "disable" and isinstance(optimized, Mapping):
        raise OffloadError(
            f"this rewrite is of the graph onnxruntime made at --opt-level {optimized.get('opt_level')} (plan "
            f"--opt-level): its fusions are in the file, and at --opt-level {opt_level} onnxruntime would optimize "
            "it again and rename the nodes its copies and order name",
            hint="run it with --opt-level disable (the default): it runs with its fusions",
        )
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
        raise _load_refusal(exc, path, device, ort) from None
    in_use = list(session.get_providers())
    if not in_use or in_use[0] != provider:
        raise _device_error(device, f"in use: {', '.join(in_use) or 'none'}")
    return session


def _load_refusal(exc: BaseException, path: str, device: str, ort: Any) -> OffloadError:
    """The one clear error for a session onnxruntime would not make: what it said, and the fix."""
    text = str(exc)
    ir = _IR_RE.search(text)
    if ir:
        version, supported = ir.groups()
        return OffloadError(
            f"{path} has IR version {version}, newer than this onnxruntime ({ort.__version__}) supports "
            f"(at most {supported})",
            hint=f"re-export the model with IR version {supported} or lower, or set it and save a copy: "
            f"m = onnx.load({path!r}); m.ir_version = {supported}; onnx.save(m, 'model.ir{supported}.onnx')",
        )
    if device != "cpu" and re.search(r"create \w+ ExecutionProvider fail|Failed to load library", text):
        return _device_error(device, "creating the provider failed")
    inserted = _UNLISTED_RE.search(text)
    if inserted:
        return OffloadError(
            f"onnxruntime cannot load {path} with its partition file: it inserted node {inserted.group(1)!r}, "
            f"which the file does not list ({device} has no kernel of that type for some node, so onnxruntime "
            "casts around it, and copies on their own stream need every node listed)",
            hint="apply the plan with --copies inline, or run on a device with kernels of the model's element "
            "type (CUDA's for float16)",
        )
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    hint = "check the model with onnx.checker.check_model(onnx.load(path), full_check=True)"
    if device != "cpu" and re.search(r"Duplicate definition of name \(\S*__offload\d+_", first):
        hint = _HOST_RESIDENT_HINT
    return ModelRefused(f"onnxruntime cannot load {path}", first, hint=hint)


def run_once(
    session: Any, feeds: Mapping[str, np.ndarray], model: str, ort: Any, *, overwritten_hint: str | None = None
) -> dict[str, Any]:
    """One run of ``session`` on copies of ``feeds`` (so that no two runs, and no two models, share an
    array a run could write into): its outputs by name. A failed run is one clear error naming ``model``,
    and so is a run that changed an input array (`check_inputs_kept`; ``overwritten_hint``, the fix)."""
    fed = own_copies(feeds)
    outputs = _run(session, fed, model, ort)
    check_inputs_kept(fed, feeds, model, hint=overwritten_hint)
    return outputs


def timed_run(
    session: Any, feeds: Mapping[str, np.ndarray], model: str, ort: Any, *, overwritten_hint: str | None = None
) -> float:
    """`run_once`, timed: the seconds the run itself took (the inputs are copied before the clock starts
    and checked after it stops)."""
    fed = own_copies(feeds)
    start = time.perf_counter()
    _run(session, fed, model, ort)
    seconds = time.perf_counter() - start
    check_inputs_kept(fed, feeds, model, hint=overwritten_hint)
    return seconds


def check_inputs_kept(fed: Mapping[str, Any], feeds: Mapping[str, Any], model: str, *, hint: str | None = None) -> None:
    """Refuse a run that wrote into an input array it was given (``fed``, copies of ``feeds``), naming the
    input: a host that reuses its arrays, or hands the same one to another model, would read the change.

    Raises:
        InputOverwritten: naming the input and ``model``; ``hint`` is the fix (a generic one without it).
    """
    for name, value in fed.items():
        given = feeds.get(name)
        if not isinstance(value, np.ndarray) or not isinstance(given, np.ndarray) or value.dtype == object:
            continue
        if value.shape != given.shape or value.tobytes() != given.tobytes():
            raise InputOverwritten(
                f"running {model} changed its input {name!r}: onnxruntime wrote into the caller's array",
                hint=hint
                or "copy the inputs before each run in your own host; a rewrite with a partition file may hit "
                "onnxruntime's multi-stream in-place defect (docs/streams.md): apply the plan again",
            )


class InputOverwritten(OffloadError):
    """A run wrote into an array it was given as an input."""


def _run(session: Any, feeds: Mapping[str, Any], model: str, ort: Any) -> dict[str, Any]:
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
#: onnxruntime's refusal of a partition file that does not list a node it inserted itself (a Cast around a
#: node whose element type the provider has no kernel for: InsertCastTransformer)
_UNLISTED_RE = re.compile(r'Failed to find node "([^"]+)" in node-stream map')

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
