"""What onnxruntime's allocators really held: measured memory, from onnxruntime itself.

Two routes, both real sessions:

* **Allocator statistics** (`measure_by_stats`), for the DEFAULT execution order. The wheels ship the
  plain C library beside the Python module (``onnxruntime/capi/libonnxruntime.so.<v>``, exporting
  ``OrtGetApiBase``). Through ctypes: ``CreateSession`` -> ``CreateAllocator(session, memory_info)`` ->
  ``AllocatorGetStats`` (onnxruntime >= 1.23) gives each arena's ``InUse`` and ``MaxInUse``. The
  statistics are cumulative, so every figure comes from a fresh session. The C API cannot set the
  execution order: such a session runs the DEFAULT order, as every host but Python does.
* **Arena limit** (`measure_by_limit`), at any order, from Python: the smallest arena under which a
  fresh session is created and runs once, found by bisection. On the CPU an environment arena
  (``create_and_register_allocator`` with ``OrtArenaCfg(max_mem, kSameAsRequested)``) that the session
  uses through ``session.use_env_allocators=1``; on CUDA ``gpu_mem_limit``, on CANN ``npu_mem_limit``.
  A limit that does not bind (a run that succeeds under 1 KiB) is refused, not reported.

Inputs are fed from the caller's memory, as onnxruntime's own hosts do: they are not in any arena.
"""

from __future__ import annotations

import csv
import ctypes
import glob
import logging
import os
import re
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

import numpy as np
import onnx

from offloadctl.core.errors import OffloadError
from offloadctl.running.inputs import own_copies

__all__ = [
    "AllocatorFigure",
    "SessionSpec",
    "capi_library",
    "measure_by_limit",
    "measure_by_stats",
    "measure_memory",
    "node_scratch",
    "read_node_scratch",
]

logger = logging.getLogger(__name__)

#: The oldest onnxruntime whose C API has AllocatorGetStats.
MIN_STATS_VERSION = (1, 23)

# OrtApi function-table indices (the table only grows; see onnxruntime_c_api.h).
_GET_ERROR_MESSAGE = 2
_CREATE_ENV = 3
_CREATE_SESSION = 7
_RUN = 9
_CREATE_SESSION_OPTIONS = 10
_SET_GRAPH_OPT_LEVEL = 23
_CREATE_TENSOR_WITH_DATA = 49
_CREATE_MEMORY_INFO = 68
_CREATE_CPU_MEMORY_INFO = 69
_RELEASE_ENV = 92
_RELEASE_STATUS = 93
_RELEASE_MEMORY_INFO = 94
_RELEASE_SESSION = 95
_RELEASE_VALUE = 96
_RELEASE_SESSION_OPTIONS = 100
_ADD_CONFIG_ENTRY = 130
_CREATE_ALLOCATOR = 131
_RELEASE_ALLOCATOR = 132
_APPEND_CUDA_V2 = 204
_CREATE_CUDA_OPTIONS = 205
_UPDATE_CUDA_OPTIONS = 206
_RELEASE_CUDA_OPTIONS = 208
_APPEND_CANN = 220
_CREATE_CANN_OPTIONS = 221
_UPDATE_CANN_OPTIONS = 222
_RELEASE_CANN_OPTIONS = 224
_GET_KEY_VALUE_PAIRS = 298
_RELEASE_KEY_VALUE_PAIRS = 300
_ALLOCATOR_GET_STATS = 319

_ARENA_ALLOCATOR = 1  # OrtArenaAllocator
_MEM_DEFAULT = 0  # OrtMemTypeDefault
_MEM_CPU_OUTPUT = -1  # OrtMemTypeCPUOutput: pinned host memory
_LOG_FATAL = 4
_OPT_LEVELS = {"disable": 0, "basic": 1, "extended": 2, "all": 99}

#: The arenas a session on each device may use: (allocator name, memory type, what it holds).
_ARENAS: dict[str, list[tuple[str, int, str]]] = {
    "cpu": [("Cpu", _MEM_DEFAULT, "cpu")],
    "cuda": [("Cuda", _MEM_DEFAULT, "cuda"), ("CudaPinned", _MEM_CPU_OUTPUT, "pinned host"), ("Cpu", 0, "cpu")],
    "ascend": [("Cann", _MEM_DEFAULT, "ascend"), ("CannPinned", _MEM_CPU_OUTPUT, "pinned host"), ("Cpu", 0, "cpu")],
}

_P = ctypes.c_void_p
_PP = ctypes.POINTER(ctypes.c_void_p)


class AllocatorDoc(TypedDict):
    """One allocator's figures in a ``--json`` document (`AllocatorFigure.to_json`)."""

    allocator: str
    device: str
    peak_bytes: int
    in_use_after_creation: int | None
    activation_bytes: int | None
    allocations: int | None
    method: str
    execution_order: str


@dataclass(frozen=True)
class AllocatorFigure:
    """One allocator's figures for one run of a fresh session."""

    allocator: str  # onnxruntime's name: Cpu, Cuda, CudaPinned, Cann, CannPinned
    device: str  # cpu, cuda, ascend or "pinned host"
    peak_bytes: int  # MaxInUse after one run, or the smallest arena limit the run fits
    in_use_after_creation: int | None  # after the session was made: the weights it placed there
    allocations: int | None  # NumAllocs after the run (None by arena limit)
    method: str  # "allocator-stats" or "arena-limit"
    execution_order: str  # "default" or "priority"

    def to_json(self) -> AllocatorDoc:
        return {
            "allocator": self.allocator,
            "device": self.device,
            "peak_bytes": self.peak_bytes,
            "in_use_after_creation": self.in_use_after_creation,
            "activation_bytes": (
                None if self.in_use_after_creation is None else self.peak_bytes - self.in_use_after_creation
            ),
            "allocations": self.allocations,
            "method": self.method,
            "execution_order": self.execution_order,
        }


@dataclass(frozen=True)
class SessionSpec:
    """The session to measure, independent of how it is made."""

    model: str
    device: str  # cpu, cuda, ascend
    opt_level: str = "disable"
    config_entries: Mapping[str, str] | None = None  # session config entries
    disabled_optimizers: Sequence[str] = ()
    provider_options: Mapping[str, str] | None = None  # for cuda / ascend


def measure_memory(
    spec: SessionSpec, feeds: Mapping[str, np.ndarray], *, order: str, ort: Any
) -> list[AllocatorFigure]:
    """Measure ``spec`` for one run on ``feeds``: by allocator statistics at the DEFAULT order, by arena
    limit at PRIORITY_BASED (the C API cannot set the order)."""
    if spec.device not in _ARENAS:
        raise OffloadError(
            f"onnxruntime's allocator statistics give no byte counts on {spec.device}",
            hint="measure memory on cpu, cuda or ascend",
        )
    if order == "default":
        return measure_by_stats(spec, feeds, ort=ort)
    if order == "priority":
        return [measure_by_limit(spec, feeds, ort=ort)]
    raise OffloadError(f"unknown execution order {order!r}", hint="use priority or default")


def read_node_scratch(path: str | os.PathLike[str]) -> dict[str, int]:
    """Kernel scratch by node name from onnxruntime's node memory statistics
    (``session.collect_node_memory_stats_to_file``: ``#name,input_sizes,initializers_sizes,
    total_dynamic_sizes,total_temp_allocations``, the name with a ``_<hash>`` suffix); {} when the
    file is missing or unreadable."""
    found: dict[str, int] = {}
    try:
        with open(path, newline="", encoding="utf-8") as handle:
            for row in csv.reader(handle):
                if len(row) < 5 or row[0].startswith("#"):
                    continue
                try:
                    temp = int(row[4])
                except ValueError:
                    continue
                name = re.sub(r"_\d+$", "", row[0].strip())
                found[name] = max(found.get(name, 0), temp)
    except OSError:
        return {}
    return found


def node_scratch(
    model: str | os.PathLike[str], feeds: Mapping[str, np.ndarray], *, ort: Any, order: str = "default"
) -> dict[str, int]:
    """Kernel scratch by node name from one run on the CPU provider at ``--opt-level disable``
    (prepacking off), with onnxruntime's node statistics (`read_node_scratch`): what ``offloadctl
    profile`` records, for a model at hand without a profile."""
    with tempfile.TemporaryDirectory(prefix="offloadctl-stats-") as tmp:
        stats = os.path.join(tmp, "stats.csv")
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        so.execution_order = ort.ExecutionOrder.DEFAULT if order == "default" else ort.ExecutionOrder.PRIORITY_BASED
        so.log_severity_level = _LOG_FATAL
        so.add_session_config_entry("session.collect_node_memory_stats_to_file", stats)
        so.add_session_config_entry("session.disable_prepacking", "1")
        session = ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"])
        session.run(None, own_copies(feeds))
        del session  # the statistics are written when the session ends
        return read_node_scratch(stats)


# --------------------------------------------------------------------------------------------------
# The C library


def capi_library(ort: Any) -> str:
    """The path of the C library that ships with the ``ort`` module, or a clear error."""
    version = tuple(int(x) for x in re.findall(r"\d+", ort.__version__)[:2])
    if version < MIN_STATS_VERSION:
        raise OffloadError(
            f"onnxruntime {ort.__version__} has no allocator statistics (AllocatorGetStats came in 1.23)",
            hint="install onnxruntime 1.23 or newer, or measure at --execution-order priority (arena limit)",
        )
    folder = os.path.join(os.path.dirname(ort.__file__), "capi")
    found = sorted(
        glob.glob(os.path.join(folder, "libonnxruntime.so*")) + glob.glob(os.path.join(folder, "onnxruntime.dll"))
    )
    found += sorted(glob.glob(os.path.join(folder, "libonnxruntime*.dylib")))
    if not found:
        raise OffloadError(
            f"onnxruntime's C library is not in {folder}",
            hint="reinstall the onnxruntime wheel (it ships libonnxruntime beside the Python module), or measure "
            "at --execution-order priority",
        )
    return found[0]


class _ApiBase(ctypes.Structure):
    _fields_ = [
        ("GetApi", ctypes.CFUNCTYPE(_P, ctypes.c_uint32)),
        ("GetVersionString", ctypes.CFUNCTYPE(ctypes.c_char_p)),
    ]


class _CApi:
    """onnxruntime's OrtApi table, called through ctypes; every failed call is an OffloadError."""

    def __init__(self, path: str, version: str) -> None:
        try:
            lib = ctypes.CDLL(path)
            lib.OrtGetApiBase.restype = _P
        except (OSError, AttributeError) as exc:
            raise OffloadError(
                f"cannot load onnxruntime's C library {path}: {exc}", hint="reinstall the onnxruntime wheel"
            ) from None
        self._lib = lib  # keep it loaded
        base = _ApiBase.from_address(lib.OrtGetApiBase())
        minor = int(re.findall(r"\d+", version)[1])
        table = base.GetApi(minor)
        if not table:
            raise OffloadError(f"onnxruntime's C library {path} does not offer API version {minor}")
        self._table = (_P * (_ALLOCATOR_GET_STATS + 1)).from_address(table)
        self._error = self.fn(_GET_ERROR_MESSAGE, ctypes.c_char_p, _P)
        self._release_status = self.fn(_RELEASE_STATUS, None, _P)

    def fn(self, index: int, restype: Any, *argtypes: Any) -> Callable[..., Any]:
        pointer = self._table[index]
        if not pointer:
            raise _CallFailed(f"OrtApi entry {index}", "missing from this onnxruntime build")
        return ctypes.CFUNCTYPE(restype, *argtypes)(pointer)

    def call(self, index: int, *args: Any, argtypes: Sequence[Any], what: str) -> None:
        status = self.fn(index, _P, *argtypes)(*args)
        if status:
            message = (self._error(status) or b"").decode(errors="replace")
            self._release_status(status)
            raise _CallFailed(what, message)

    def release(self, index: int, handle: Any) -> None:
        if handle:
            self.fn(index, None, _P)(handle)


class _CallFailed(Exception):
    def __init__(self, what: str, message: str) -> None:
        super().__init__(f"{what}: {message}")
        self.what = what
        self.message = message


def _tensor_type(array: np.ndarray, name: str) -> int:
    if array.dtype.kind in "OUS":
        raise OffloadError(
            f"input {name!r} is a string tensor, which the allocator measurement cannot feed",
            hint="measure at --execution-order priority (arena limit) instead",
        )
    return int(onnx.helper.np_dtype_to_tensor_dtype(array.dtype))


class _StatsSession:
    """One C API session with its allocators; `close` releases everything."""

    def __init__(self, api: _CApi, spec: SessionSpec) -> None:
        self.api = api
        self.spec = spec
        self.handles: list[tuple[int, Any]] = []  # (release index, handle), released in reverse
        self.env = self._out(
            _CREATE_ENV, _RELEASE_ENV, "CreateEnv", (ctypes.c_int, ctypes.c_char_p), _LOG_FATAL, b"offloadctl"
        )
        self.options = self._out(_CREATE_SESSION_OPTIONS, _RELEASE_SESSION_OPTIONS, "CreateSessionOptions", ())
        self._configure()
        self.session = self._out(
            _CREATE_SESSION,
            _RELEASE_SESSION,
            f"CreateSession({spec.model})",
            (_P, ctypes.c_char_p, _P),
            self.env,
            os.fsencode(spec.model),
            self.options,
        )
        self.cpu_info = self._out(
            _CREATE_CPU_MEMORY_INFO,
            _RELEASE_MEMORY_INFO,
            "CreateCpuMemoryInfo",
            (ctypes.c_int, ctypes.c_int),
            _ARENA_ALLOCATOR,
            _MEM_DEFAULT,
        )
        self.allocators: list[tuple[str, str, Any]] = []
        for name, mem_type, where in _ARENAS[spec.device]:
            info = self._out(
                _CREATE_MEMORY_INFO,
                _RELEASE_MEMORY_INFO,
                "CreateMemoryInfo",
                (ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_int),
                name.encode(),
                _ARENA_ALLOCATOR,
                0,
                mem_type,
            )
            try:
                alloc = self._out(
                    _CREATE_ALLOCATOR, _RELEASE_ALLOCATOR, "CreateAllocator", (_P, _P), self.session, info
                )
            except _CallFailed as exc:
                logger.debug("no %s allocator in this session: %s", name, exc.message)
                continue
            self.allocators.append((name, where, alloc))

    def _out(self, index: int, release: int, what: str, argtypes: Sequence[Any], *args: Any) -> Any:
        handle = _P()
        self.api.call(index, *args, ctypes.byref(handle), argtypes=(*argtypes, _PP), what=what)
        self.handles.append((release, handle))
        return handle

    def _configure(self) -> None:
        spec, api = self.spec, self.api
        api.call(
            _SET_GRAPH_OPT_LEVEL,
            self.options,
            _OPT_LEVELS[spec.opt_level],
            argtypes=(_P, ctypes.c_int),
            what="SetSessionGraphOptimizationLevel",
        )
        entries = dict(spec.config_entries or {})
        if spec.disabled_optimizers:
            entries["optimization.disable_specified_optimizers"] = ";".join(spec.disabled_optimizers)
        for key, value in entries.items():
            api.call(
                _ADD_CONFIG_ENTRY,
                self.options,
                key.encode(),
                str(value).encode(),
                argtypes=(_P, ctypes.c_char_p, ctypes.c_char_p),
                what=f"AddSessionConfigEntry({key})",
            )
        if spec.device == "cuda":
            self._provider(_CREATE_CUDA_OPTIONS, _UPDATE_CUDA_OPTIONS, _RELEASE_CUDA_OPTIONS, _APPEND_CUDA_V2, "CUDA")
        elif spec.device == "ascend":
            self._provider(_CREATE_CANN_OPTIONS, _UPDATE_CANN_OPTIONS, _RELEASE_CANN_OPTIONS, _APPEND_CANN, "CANN")

    def _provider(self, create: int, update: int, release: int, append: int, name: str) -> None:
        options = self._out(create, release, f"Create{name}ProviderOptions", ())
        pairs = dict(self.spec.provider_options or {})
        keys = (ctypes.c_char_p * len(pairs))(*[k.encode() for k in pairs])
        values = (ctypes.c_char_p * len(pairs))(*[str(v).encode() for v in pairs.values()])
        self.api.call(
            update,
            options,
            keys,
            values,
            len(pairs),
            argtypes=(_P, _P, _P, ctypes.c_size_t),
            what=f"Update{name}ProviderOptions",
        )
        self.api.call(
            append, self.options, options, argtypes=(_P, _P), what=f"SessionOptionsAppendExecutionProvider_{name}"
        )

    def stats(self, alloc: Any) -> dict[str, int]:
        api = self.api
        kv = _P()
        api.call(_ALLOCATOR_GET_STATS, alloc, ctypes.byref(kv), argtypes=(_P, _PP), what="AllocatorGetStats")
        keys = ctypes.POINTER(ctypes.c_char_p)()
        values = ctypes.POINTER(ctypes.c_char_p)()
        count = ctypes.c_size_t()
        get = api.fn(_GET_KEY_VALUE_PAIRS, None, _P, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)
        get(kv, ctypes.byref(keys), ctypes.byref(values), ctypes.byref(count))
        found = {}
        for i in range(count.value):
            try:
                found[keys[i].decode()] = int(values[i].decode())
            except ValueError:
                continue
        api.release(_RELEASE_KEY_VALUE_PAIRS, kv)
        return found

    def run(self, feeds: Mapping[str, np.ndarray], outputs: Sequence[str]) -> None:
        api = self.api
        keep = []
        values = (_P * len(feeds))()
        try:
            for k, (name, array) in enumerate(feeds.items()):
                array = np.ascontiguousarray(array)
                keep.append(array)
                shape = (ctypes.c_int64 * array.ndim)(*array.shape)
                value = _P()
                api.call(
                    _CREATE_TENSOR_WITH_DATA,
                    self.cpu_info,
                    array.ctypes.data_as(_P),
                    array.nbytes,
                    shape,
                    array.ndim,
                    _tensor_type(array, name),
                    ctypes.byref(value),
                    argtypes=(_P, _P, ctypes.c_size_t, _P, ctypes.c_size_t, ctypes.c_int, _PP),
                    what=f"CreateTensorWithDataAsOrtValue({name})",
                )
                values[k] = value
            names = (ctypes.c_char_p * len(feeds))(*[n.encode() for n in feeds])
            out_names = (ctypes.c_char_p * len(outputs))(*[n.encode() for n in outputs])
            out_values = (_P * len(outputs))()
            try:
                api.call(
                    _RUN,
                    self.session,
                    None,
                    names,
                    values,
                    len(feeds),
                    out_names,
                    len(outputs),
                    out_values,
                    argtypes=(_P, _P, _P, _P, ctypes.c_size_t, _P, ctypes.c_size_t, _P),
                    what="Run",
                )
            finally:
                for v in out_values:
                    api.release(_RELEASE_VALUE, v)
        finally:
            for v in values:
                api.release(_RELEASE_VALUE, v)
            del keep

    def close(self) -> None:
        for release, handle in reversed(self.handles):
            self.api.release(release, handle)
        self.handles.clear()


def measure_by_stats(spec: SessionSpec, feeds: Mapping[str, np.ndarray], *, ort: Any) -> list[AllocatorFigure]:
    """Each arena's figures for one run of a fresh C API session (DEFAULT order).

    Raises:
        OffloadError: onnxruntime older than 1.23, its C library missing, a session or run that
            fails, or a device arena that reports no statistics.
    """
    api = _CApi(capi_library(ort), ort.__version__)
    outputs = [o.name for o in onnx.load(spec.model, load_external_data=False).graph.output]
    try:
        session = _StatsSession(api, spec)
    except _CallFailed as exc:
        raise _failed(spec, exc) from None
    try:
        before = {name: session.stats(alloc) for name, _, alloc in session.allocators}
        session.run(own_copies(feeds), outputs)
        figures = []
        for name, where, alloc in session.allocators:
            after = session.stats(alloc)
            if "MaxInUse" not in after:
                if where == spec.device or spec.device == "cpu":
                    raise OffloadError(
                        f"onnxruntime's {name} allocator reports no statistics (it is not an arena)",
                        hint="measure with the provider's default arena, or at --execution-order priority "
                        "(arena limit)",
                    )
                continue
            figures.append(
                AllocatorFigure(
                    allocator=name,
                    device=where,
                    peak_bytes=after["MaxInUse"],
                    in_use_after_creation=before[name].get("InUse", 0),
                    allocations=after.get("NumAllocs"),
                    method="allocator-stats",
                    execution_order="default",
                )
            )
    except _CallFailed as exc:
        raise _failed(spec, exc) from None
    finally:
        session.close()
    if not any(f.device == spec.device for f in figures):
        raise OffloadError(
            f"onnxruntime made no {spec.device} arena for {spec.model}",
            hint="check that the provider is really in use (offloadctl run without --measure-memory says)",
        )
    return figures


def _failed(spec: SessionSpec, exc: _CallFailed) -> OffloadError:
    first = exc.message.strip().splitlines()[0] if exc.message.strip() else exc.what
    return OffloadError(
        f"measuring {spec.model}: onnxruntime failed in {exc.what}: {first}",
        hint="check that the model runs (offloadctl run) and that the inputs are right",
    )


# --------------------------------------------------------------------------------------------------
# Arena limit, by bisection


def measure_by_limit(
    spec: SessionSpec,
    feeds: Mapping[str, np.ndarray],
    *,
    ort: Any,
    order: str = "priority",
    resolution: float = 1e-3,
) -> AllocatorFigure:
    """The smallest arena (within ``resolution`` of it, at least 256 bytes) under which a fresh
    Python session on ``spec.device`` is created and runs once.

    The weights a session places in its arena (``Reserve``) are not checked against the limit, and
    once they pass it the arena's remaining room wraps around to unlimited: a limit below the
    weights "fits" anything. So the weights are read first, from a session made through the C API
    (placing weights does not depend on the order), and the search starts there.

    Raises:
        OffloadError: as `measure_by_stats`; or no limit up to 1 TiB fits.
    """
    reserved = _created(spec, ort)
    probe = _Probe(spec, feeds, ort, order)
    probe.check_runs()
    peak = (
        reserved if probe(reserved, run=True) else _smallest(lambda limit: probe(limit, run=True), reserved, resolution)
    )
    return AllocatorFigure(
        allocator=_ARENAS[spec.device][0][0],
        device=spec.device,
        peak_bytes=peak,
        in_use_after_creation=reserved,
        allocations=None,
        method="arena-limit",
        execution_order=order,
    )


def _created(spec: SessionSpec, ort: Any) -> int:
    """Bytes the device arena holds once a session for ``spec`` is made (C API, ``TotalAllocated``)."""
    api = _CApi(capi_library(ort), ort.__version__)
    try:
        session = _StatsSession(api, spec)
    except _CallFailed as exc:
        raise _failed(spec, exc) from None
    try:
        for _name, where, alloc in session.allocators:
            if where == spec.device:
                stats = session.stats(alloc)
                return stats.get("TotalAllocated", stats.get("InUse", 0))
    except _CallFailed as exc:
        raise _failed(spec, exc) from None
    finally:
        session.close()
    raise OffloadError(
        f"onnxruntime made no {spec.device} arena for {spec.model}",
        hint="check that the provider is really in use (offloadctl run without --measure-memory says)",
    )


def _smallest(fits: Callable[[int], bool], low: int, resolution: float) -> int:
    """The smallest limit above ``low`` (which does not fit) that fits."""
    step = max(1 << 20, low)
    high = low + step
    while not fits(high):
        low, step = high, step * 2
        high = low + step
        if high > 1 << 40:
            raise OffloadError("no arena limit up to 1 TiB lets the model run", hint="check that it runs at all")
    while high - low > max(256, int(high * resolution)):
        mid = (low + high) // 2
        if fits(mid):
            high = mid
        else:
            low = mid
    return high


class _Probe:
    """Create (and run) a fresh session under an arena limit: True if it fits."""

    def __init__(self, spec: SessionSpec, feeds: Mapping[str, np.ndarray], ort: Any, order: str) -> None:
        self.spec, self.feeds, self.ort, self.order = spec, feeds, ort, order

    def check_runs(self) -> None:
        """Run once with no limit (0): a model that fails then is reported as it is, not bisected."""
        try:
            self._session(0, run=True)
        except Exception as exc:  # noqa: BLE001
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise OffloadError(
                f"measuring {self.spec.model}: onnxruntime failed: {first}",
                hint="check that the model runs (offloadctl run) and that the inputs are right",
            ) from None

    def __call__(self, limit: int, *, run: bool) -> bool:
        try:
            self._session(limit, run=run)
        except Exception as exc:  # noqa: BLE001 - onnxruntime raises several types for "out of memory"
            logger.debug("limit %d: %s", limit, str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            return False
        return True

    def _session(self, limit: int, *, run: bool) -> None:
        ort, spec = self.ort, self.spec
        so = ort.SessionOptions()
        so.log_severity_level = _LOG_FATAL
        so.graph_optimization_level = getattr(
            ort.GraphOptimizationLevel,
            {
                "disable": "ORT_DISABLE_ALL",
                "basic": "ORT_ENABLE_BASIC",
                "extended": "ORT_ENABLE_EXTENDED",
                "all": "ORT_ENABLE_ALL",
            }[spec.opt_level],
        )
        so.execution_order = (
            ort.ExecutionOrder.PRIORITY_BASED if self.order == "priority" else ort.ExecutionOrder.DEFAULT
        )
        for key, value in (spec.config_entries or {}).items():
            so.add_session_config_entry(key, str(value))
        options = dict(spec.provider_options or {})
        if spec.device == "cpu":
            info = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
            ort.create_and_register_allocator(info, ort.OrtArenaCfg(limit, 1, -1, -1))  # 1: kSameAsRequested
            so.add_session_config_entry("session.use_env_allocators", "1")
            providers: list[Any] = ["CPUExecutionProvider"]
        else:
            key = "gpu_mem_limit" if spec.device == "cuda" else "npu_mem_limit"
            options.update({key: str(limit), "arena_extend_strategy": "kSameAsRequested"})
            provider = "CUDAExecutionProvider" if spec.device == "cuda" else "CANNExecutionProvider"
            providers = [(provider, options), "CPUExecutionProvider"]
        kwargs = {"disabled_optimizers": list(spec.disabled_optimizers)} if spec.disabled_optimizers else {}
        session = ort.InferenceSession(spec.model, so, providers=providers, **kwargs)
        if run:
            session.run(None, own_copies(self.feeds))
