"""Measuring a device profile on the real device with onnxruntime (`offloadctl profile`).

This module owns the measurements behind a *measured* profile (format: ``schemas/profile.schema.json``,
loader: `offloadctl.simulation.profiles`). It runs sessions configured exactly as `offloadctl run` does
(`offloadctl.running.sessions.session_config` with ``--opt-level disable``: PRIORITY_BASED order, no graph
optimizations; `offloadctl.running.sessions.create_session` checks that the device's provider is really in
use) and measures:

* the model: its wall-clock latency without profiling (median of ``repeat`` runs after a warm-up),
  and every node's duration from onnxruntime's profiling (``<node>_kernel_time`` events), the median
  over ``repeat`` profiled runs, keyed by the name profiling gives the node, with its op type and
  input shapes;
* the executor: what kernel events do not cover. A run costs ``run_overhead_s`` (measured as the
  intercept of the latency of chains of 1 and 65 trivial nodes) plus, per node, its kernel time plus
  ``node_overhead_s`` (never below 0 in all), the offset that makes the nodes and the run's cost add
  up to the latency (`node_overhead_for`). On a CPU ``node_overhead_s`` is negative: onnxruntime's
  profiler spends more inside each event (thread-pool statistics, shape strings) than the executor
  spends between nodes; the figure corrects both.
* copies: the latency one more ``MemcpyToHost`` (D2H) or ``MemcpyFromHost`` (H2D) node adds to a
  run, without profiling (models with 1 and with many copies, runs interleaved), over a sweep of
  sizes (``SWEEP_BYTES``), fitted as ``latency_s + bytes / bandwidth`` (`fit_link`); this is the
  profile's top-level ``link``. The cache decides the cost of a small copy, so each direction is
  timed as a model uses it: a D2H reads the tensor its producer has just written (warm: the copies
  read one tensor again and again); an H2D reads a host tensor written long before (as cold as
  the model leaves it: the copies cycle through distinct weights, as many bytes as the model's
  simulated peak memory, the memory a run cycles through since freed buffers are reused; at most
  ``_COLD_BYTES_MAX``). A copy inside a model still costs otherwise (the cache holds the model's
  data, neighbours compete for memory bandwidth): two rewrites of the model, every weight and
  every activation offloaded, are timed against it, and the fits are scaled to what their copies
  added (`_copies_in_model`). On the CPU execution provider both copies are real memcpys;
* the roofline figures for nodes a profile has no time for: ``peak_flops`` from a 512x512x512
  float32 MatMul, ``mem_bandwidth`` from an Add of two 16 MiB tensors, ``kernel_launch_s`` as the
  latency one more trivial node adds to a run.

On CUDA and CANN, kernel events time the host side of each node (launches are asynchronous); the
latency and ``node_overhead_s`` still come from whole runs, which end when the device is done.
"""

from __future__ import annotations

import gc
import json
import logging
import os
import platform
import re
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from offloadctl._version import __version__
from offloadctl.analysis.graph import Analysis, analyse
from offloadctl.analysis.order import EXECUTION_ORDERS
from offloadctl.core.errors import OffloadError
from offloadctl.core.files import atomic_write_text
from offloadctl.core.plantypes import Plan
from offloadctl.loading.model import load_model
from offloadctl.planning.make import scheduled_plan
from offloadctl.rewriting.rewrite import apply_plan
from offloadctl.rewriting.writing import external_locations, write_model
from offloadctl.running.allocator import measure_memory, read_node_scratch
from offloadctl.running.fusions import attribute
from offloadctl.running.inputs import generate_inputs, input_specs, load_inputs
from offloadctl.running.sessions import (
    DEVICES,
    OPT_LEVELS,
    create_session,
    feeds_for,
    import_onnxruntime,
    required_settings,
    run_once,
    session_config,
)
from offloadctl.simulation.base import is_rewritten
from offloadctl.simulation.memory import peak_memory
from offloadctl.simulation.profiles import PROFILE_SCHEMA_VERSION, profile_from_dict, validate_profile

__all__ = [
    "DEFAULT_REPEAT",
    "SWEEP_BYTES",
    "LinkFit",
    "fit_link",
    "fit_range",
    "node_overhead_for",
    "alternate",
    "KernelEvent",
    "kernel_runs",
    "measure_profile",
    "write_profile",
]

logger = logging.getLogger(__name__)

DEFAULT_REPEAT = 20
#: Sizes of the copy sweep: 256 bytes to 64 MiB, x4 per step.
SWEEP_BYTES: tuple[int, ...] = tuple(256 * 4**k for k in range(10))
_KERNEL_SUFFIX = "_kernel_time"
_CHAIN_NODES = 64  # trivial nodes in the long calibration chain (the short one has 1)
_CHAIN_REPEAT = 200  # runs per chain: a run takes microseconds
_MATMUL_N = 512
_ADD_ELEMENTS = 1 << 22  # 16 MiB of float32 per operand
_CALIBRATION_REPEAT = 10
_MIN_SECONDS = 0.5  # fast models get more runs than --repeat, until this much time has passed
_MAX_ROUNDS_FACTOR = 20
_BLOCK_SECONDS = 0.05  # sessions timed side by side take turns in blocks this long
_SWEEP_BUDGET = 32 << 20  # bytes copied per run when timing copies of one size
_COPIES_MAX = 256  # copies per run at most (small sizes)
_COLD_BYTES_MAX = 64 << 20  # distinct H2D sources per run at most (memory, and the model file)
_SWEEP_SECONDS = 0.2  # each size is timed for at least this long
_FIT_LARGE = 64 << 10  # a copy fit reaches this size at least
_IN_MODEL_DATA_MAX = 512 << 20  # rewrites of a model with more external data are not timed
_SCALE_RANGE = (0.1, 10.0)  # a sweep fit scaled beyond this by the copies in the model is kept as it is
_IR_VERSION = 10
_OPSET = 17


# --------------------------------------------------------------------------------------------- fit


@dataclass(frozen=True)
class LinkFit:
    """``seconds = latency_s + bytes / bandwidth`` fitted to measured (bytes, seconds) points."""

    latency_s: float
    bandwidth: float
    max_relative_error: float

    def time(self, nbytes: int) -> float:
        return self.latency_s + nbytes / self.bandwidth


def fit_link(points: Sequence[tuple[int, float]]) -> LinkFit:
    """Least-squares fit of ``latency + bytes / bandwidth`` on the relative error of each point.

    Weighting by 1/seconds lets the small copies decide the latency and the large ones the
    bandwidth (plain least squares would let the largest copy decide both). A negative latency is
    refitted as 0.

    Raises:
        OffloadError: fewer than two distinct sizes, or times that do not grow with size.
    """
    pts = [(float(b), float(t)) for b, t in points if t > 0]
    if len({b for b, _ in pts}) < 2:
        raise OffloadError(
            f"cannot fit a copy cost to {len(pts)} point(s): need times for at least two sizes",
            hint="time copies of at least two different sizes",
        )
    x = np.array([b for b, _ in pts])
    t = np.array([s for _, s in pts])
    w = 1.0 / t
    design = np.stack([np.ones_like(x), x], axis=1) * w[:, None]
    (latency, per_byte), *_ = np.linalg.lstsq(design, t * w, rcond=None)
    if latency < 0:
        latency = 0.0
        per_byte = float(np.sum(w * w * x * t) / np.sum(w * w * x * x))
    if per_byte <= 0:
        raise OffloadError(
            "measured copy times do not grow with the number of bytes copied: no bandwidth can be fitted",
            hint="measure again on a quiet machine (other work may have disturbed the timings)",
        )
    predicted = latency + per_byte * x
    return LinkFit(float(latency), float(1.0 / per_byte), float(np.max(np.abs(predicted - t) / t)))


def node_overhead_for(durations: Sequence[float], total: float) -> float:
    """The offset d such that ``sum(max(t + d, 0) for t in durations) == total``.

    A node's simulated time is its duration in profiling plus this offset, never below 0; the
    offset makes the nodes add up to the latency measured without profiling (``total``: the latency
    less the run's fixed cost). It is negative when the profiler's cost inside each event exceeds
    the executor's between nodes. With no time left (``total <= 0``) every node takes 0.
    """
    if not durations:
        return 0.0
    if total <= 0:
        return -max(durations)

    def covered(offset: float) -> float:
        return sum(max(t + offset, 0.0) for t in durations)

    low, high = -max(durations), max(total, 0.0)  # covered(low) = 0 <= total <= covered(high)
    for _ in range(200):
        mid = (low + high) / 2
        if covered(mid) < total:
            low = mid
        else:
            high = mid
    return (low + high) / 2


# ---------------------------------------------------------------------------------------- profiling


@dataclass(frozen=True)
class KernelEvent:
    """One node's kernel event of one run."""

    name: str
    op_type: str
    seconds: float
    input_shapes: tuple[tuple[int, ...], ...]


def _shapes(arg: Any) -> tuple[tuple[int, ...], ...]:
    shapes = []
    for entry in arg or []:
        dims: Iterable[Any] = next(iter(entry.values()), []) if isinstance(entry, dict) else []
        shapes.append(tuple(int(d) for d in dims))
    return tuple(shapes)


def kernel_runs(profile_path: str | os.PathLike[str], *, skip: int = 1) -> list[list[KernelEvent]]:
    """The top-level kernel events of each run in an onnxruntime profiling file, in run order.

    Events nested inside another node's event (nodes of an If/Loop/Scan body, run by their parent)
    are left out: the parent's duration covers them. The first ``skip`` runs (warm-up) are dropped.
    """
    with open(profile_path, encoding="utf-8") as f:
        events = json.load(f)
    runs = sorted(
        (e for e in events if isinstance(e, dict) and e.get("cat") == "Session" and e.get("name") == "model_run"),
        key=lambda e: e.get("ts", 0),
    )
    nodes = sorted(
        (
            e
            for e in events
            if isinstance(e, dict) and e.get("cat") == "Node" and str(e.get("name", "")).endswith(_KERNEL_SUFFIX)
        ),
        key=lambda e: (e.get("ts", 0), -e.get("dur", 0)),
    )
    result: list[list[KernelEvent]] = []
    k = 0
    for run in runs:
        start, end = run.get("ts", 0), run.get("ts", 0) + run.get("dur", 0)
        while k < len(nodes) and nodes[k].get("ts", 0) < start:
            k += 1
        first = k
        while k < len(nodes) and nodes[k].get("ts", 0) <= end:
            k += 1
        result.append(_top_level(nodes[first:k]))
    return result[skip:]


def _top_level(events: list[dict[str, Any]]) -> list[KernelEvent]:
    """The kernel events of one run (in start order) that no other event covers."""
    top: list[KernelEvent] = []
    covered = -1
    for e in events:
        ts, dur = e.get("ts", 0), e.get("dur", 0)
        if ts < covered:
            continue  # inside the previous top-level event
        covered = ts + dur
        args = e.get("args") or {}
        name = e["name"][: -len(_KERNEL_SUFFIX)]
        top.append(KernelEvent(name, str(args.get("op_name", "")), dur * 1e-6, _shapes(args.get("input_type_shape"))))
    return top


def _node_medians(runs: list[list[KernelEvent]]) -> dict[str, dict[str, Any]]:
    """Node name -> {op_type, seconds (median over runs), input_shapes}, in the order nodes ran."""
    times: dict[str, list[float]] = {}
    first: dict[str, KernelEvent] = {}
    for run in runs:
        for e in run:
            times.setdefault(e.name, []).append(e.seconds)
            first.setdefault(e.name, e)
    return {
        name: {
            "op_type": first[name].op_type or "unknown",
            "seconds": statistics.median(values),
            "input_shapes": [list(s) for s in first[name].input_shapes],
        }
        for name, values in times.items()
    }


# ------------------------------------------------------------------------------------------ sessions


class _Device:
    """Sessions on one device, configured as `offloadctl run --opt-level disable` configures them."""

    def __init__(self, device: str, ep_options: Mapping[str, str] | None, folder: Path, threads: int = 0) -> None:
        self.device = device
        self.ort = import_onnxruntime(device)
        self.ep_options = dict(ep_options or {})
        self.folder = folder
        self.threads = threads
        self.profiles = 0

    def runner(
        self,
        path: str,
        feeds: Mapping[str, np.ndarray],
        settings: Mapping[str, Any] | None = None,
        *,
        profiled: bool,
        node_stats: Path | None = None,
        opt_level: str = "disable",
        optimized: Path | None = None,
    ) -> _Runner:
        config = session_config(
            settings or {}, self.device, opt_level=opt_level, ep_options=self.ep_options, ort=self.ort
        )
        config.sess_options.intra_op_num_threads = self.threads
        if optimized is not None:  # the graph onnxruntime runs, saved as it creates the session
            config.sess_options.optimized_model_filepath = str(optimized)
            config.sess_options.add_session_config_entry(
                "session.optimized_model_external_initializers_file_name", optimized.name + ".data"
            )
        if node_stats is not None:  # kernel scratch per node, written when the session ends
            config.sess_options.add_session_config_entry("session.collect_node_memory_stats_to_file", str(node_stats))
        if profiled:
            self.profiles += 1
            config.sess_options.enable_profiling = True
            config.sess_options.profile_file_prefix = str(self.folder / f"profile{self.profiles}")
        session = create_session(path, config, self.device, ort=self.ort)
        return _Runner(session, feeds_for(session, feeds, path, "the inputs"), path, self.ort)


class _Runner:
    """One session with its feeds: ``run()`` runs it once and returns the wall-clock seconds."""

    def __init__(self, session: Any, feeds: dict[str, np.ndarray], path: str, ort: Any) -> None:
        self.session, self.feeds, self.path, self.ort = session, feeds, path, ort

    def run(self) -> float:
        start = time.perf_counter()
        run_once(self.session, self.feeds, self.path, self.ort)
        return time.perf_counter() - start

    def kernels(self) -> list[list[KernelEvent]]:
        """Kernel events of every run but the first (the warm-up), from the session's profiling file."""
        profile_file = self.session.end_profiling()
        if not profile_file:  # pragma: no cover - onnxruntime always writes one when asked
            raise OffloadError(
                f"onnxruntime wrote no profile for {self.path}", hint="check the onnxruntime installation"
            )
        return kernel_runs(profile_file)


def alternate(
    calls: Sequence[Callable[[], float]],
    repeat: int,
    *,
    min_seconds: float | None = None,
    block_seconds: float | None = None,
) -> list[list[float]]:
    """Time several sessions side by side: each call runs one session once and returns its seconds.

    After one warm-up run each, the sessions take turns in blocks of about ``block_seconds``, so
    that all see the same machine load, until each has ``repeat`` timed
    runs and ``min_seconds`` have passed (fast models get more runs, at most
    ``_MAX_ROUNDS_FACTOR * repeat``). Blocks, not single runs: a session's thread pool spins for a
    while after its run, and would slow the next session's run if turns were run by run; the first
    run of each block (after another session's block) is not timed.

    Returns:
        The seconds of every timed run, per session.
    """
    min_seconds = _MIN_SECONDS if min_seconds is None else min_seconds
    block_seconds = _BLOCK_SECONDS if block_seconds is None else block_seconds
    warm = [call() for call in calls]
    limit = _MAX_ROUNDS_FACTOR * repeat
    blocks = [max(1, min(limit, int(block_seconds / max(t, 1e-9)))) for t in warm]
    times: list[list[float]] = [[] for _ in calls]
    start = time.perf_counter()
    while any(len(t) < repeat for t in times) or (
        time.perf_counter() - start < min_seconds and all(len(t) < limit for t in times)
    ):
        for k, call in enumerate(calls):
            if len(calls) > 1:
                call()
            for _ in range(blocks[k]):
                times[k].append(call())
    return times


def _alternate(runners: Sequence[_Runner], repeat: int, *, min_seconds: float | None = None) -> list[list[float]]:
    return alternate([r.run for r in runners], repeat, min_seconds=min_seconds)


def _save(model: onnx.ModelProto, folder: Path, name: str) -> str:
    path = folder / name
    onnx.save(model, str(path))
    return str(path)


def _model(nodes, inputs, outputs, initializers=()) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "calibration", inputs, outputs, initializer=list(initializers))
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", _OPSET)], producer_name="offloadctl-profile"
    )
    model.ir_version = _IR_VERSION
    return model


def _float(name: str, shape: Sequence[int]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, list(shape))


def _chain_model(length: int) -> onnx.ModelProto:
    nodes = [helper.make_node("Relu", [f"t{i}"], [f"t{i + 1}"], name=f"relu{i}") for i in range(length)]
    return _model(nodes, [_float("t0", [1])], [_float(f"t{length}", [1])])


def _copies_model(direction: str, size: int, copies: int, sources: int = 1) -> onnx.ModelProto:
    """``copies`` copy nodes of ``size`` bytes in one direction, their outputs unread.

    ``d2h``: every copy reads the input ``x`` (after the first, from the cache: the warm tensor a
    D2H copies right after its producer wrote it). ``h2d``: copy k reads weight ``w{k % sources}``,
    so between two reads of a weight the other ``sources - 1`` are read: a source is as cold as a
    host copy that waited while the model cycled through that much memory (weights, not inputs:
    onnxruntime's cost of feeding an input grows with the number of inputs). A Relu on ``x`` gives
    the model its output.
    """
    n = _elements(size)
    if direction == "d2h":
        nodes = [helper.make_node("MemcpyToHost", ["x"], [f"c{k}"], name=f"d2h{k}") for k in range(copies)]
        weights = []
    else:
        sources = max(1, min(sources, copies))
        nodes = [
            helper.make_node("MemcpyFromHost", [f"w{k % sources}"], [f"c{k}"], name=f"h2d{k}") for k in range(copies)
        ]
        fill = np.arange(n, dtype=np.float32)
        weights = [numpy_helper.from_array(fill, f"w{k}") for k in range(sources)]
    nodes.append(helper.make_node("Relu", ["t"], ["y"], name="out"))
    return _model(nodes, [_float("x", [n]), _float("t", [1])], [_float("y", [1])], weights)


def _tensor_bytes(analysis: Any) -> list[int]:
    """Sizes of the tensors of known size in a run: weights, inputs, activations."""
    names = set(analysis.weights) | set(analysis.graph_inputs) | set(analysis.producer)
    sizes = []
    for name in names:
        info = analysis.infos.get(name)
        if info is not None and info.bytes:
            sizes.append(info.bytes)
    return sizes


def fit_range(sweep: Sequence[int], tensor_bytes: Sequence[int]) -> tuple[int, int]:
    """The sweep sizes a copy fit uses: from the largest one at or below the model's smallest tensor to
    the smallest one at or above its largest (or ``_FIT_LARGE``), widened to at least three sizes
    (the whole sweep for a model without sizes).

    The cost of a copy per byte falls as copies outgrow the caches, so no one line fits 4 KiB and
    64 MiB; a profile's fit is made for the sizes its model can copy.
    """
    grid = sorted(set(sweep))
    if not tensor_bytes:
        return grid[0], grid[-1]
    # up to _FIT_LARGE at least: below it every copy costs about its latency, and noise decides the slope
    small, large = min(tensor_bytes), max(max(tensor_bytes), _FIT_LARGE)
    lo = max((g for g in grid if g <= small), default=grid[0])
    hi = min((g for g in grid if g >= large), default=grid[-1])
    inside = [g for g in grid if lo <= g <= hi]
    while len(inside) < min(3, len(grid)):  # at least three sizes: a line through two is at noise's mercy
        first, last = grid.index(inside[0]), grid.index(inside[-1])
        inside = grid[first : last + 2] if last + 1 < len(grid) else grid[max(first - 1, 0) : last + 1]
    return inside[0], inside[-1]


def _elements(size: int) -> int:
    return max(1, size // 4)


def _roofline_model() -> onnx.ModelProto:
    n, m = _MATMUL_N, _ADD_ELEMENTS
    nodes = [
        helper.make_node("MatMul", ["a", "b"], ["c"], name="matmul"),
        helper.make_node("Add", ["x", "y"], ["z"], name="add"),
    ]
    return _model(
        nodes,
        [_float("a", [n, n]), _float("b", [n, n]), _float("x", [m]), _float("y", [m])],
        [_float("c", [n, n]), _float("z", [m])],
    )


def _random_feeds(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    feeds, _ = generate_inputs(input_specs(model))
    return feeds


# ------------------------------------------------------------------------------------------- device


def _device_name(device: str, ep_options: Mapping[str, str]) -> str:
    """The device's name, best effort; 'unknown' when it cannot be read."""
    index = str(ep_options.get("device_id", "0"))
    try:
        if device == "cpu":
            with open("/proc/cpuinfo", encoding="utf-8") as f:
                for line in f:
                    if line.lower().startswith("model name"):
                        return line.split(":", 1)[1].strip()
            return platform.processor() or platform.machine() or "unknown"
        if device == "cuda":
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", "-i", index],
                capture_output=True,
                text=True,
                timeout=10,
                check=True,
            )
            return out.stdout.strip() or "unknown"
        if device == "ascend":
            out = subprocess.run(["npu-smi", "info"], capture_output=True, text=True, timeout=10, check=True)
            for line in out.stdout.splitlines():
                row = re.match(r"^\|\s*(\d+)\s+(\S+)\s+\|", line)
                if row and row.group(1) == index:
                    return row.group(2)
    except (OSError, subprocess.SubprocessError, ValueError):
        pass
    return "unknown"


# ------------------------------------------------------------------------------- copies in the model


def _unfolding(settings: Mapping[str, Any]) -> dict[str, Any]:
    """``settings`` with onnxruntime's ConstantFolding off, as every rewrite with pins or offloaded weights runs."""
    return {**settings, "disabled_optimizers": [*settings.get("disabled_optimizers", []), "ConstantFolding"]}


def _unfolded(
    dev: _Device, model: str, feeds: Mapping[str, np.ndarray], settings: Mapping[str, Any], repeat: int, level: str
) -> float:
    """What a run of ``model`` at ``level`` takes longer with ConstantFolding off (timed side by side)."""
    runners = [
        dev.runner(model, feeds, settings, profiled=False, opt_level=level),
        dev.runner(model, feeds, _unfolding(settings), profiled=False, opt_level=level),
    ]
    on, off = (statistics.median(t) for t in _alternate(runners, repeat, min_seconds=3 * _MIN_SECONDS))
    return max(off - on, 0.0)


def _offload_everything(analysis: Any, *, activations: bool, fused: Sequence[str] = ()) -> Plan:
    """A plan that offloads every activation (or every weight) it can, reloaded for each use at the
    default prefetch distance (where a plan's reloads usually run: early, the copy then waits);
    ``fused``: what the optimizer takes in at the profile's level, kept as plans made with the
    profile keep it."""
    every = len(analysis.producer) + len(analysis.weights) + 1
    return scheduled_plan(
        analysis,
        select_distance=0,
        activations=activations,
        params=not activations,
        select_num=every,
        fused=tuple(fused),
    )


def _plan_copies(plan: Plan) -> dict[str, list[int]]:
    """Bytes of every copy a plan makes, per direction."""
    copies: dict[str, list[int]] = {"d2h": [], "h2d": []}
    for off in plan["offloads"]:
        if off["kind"] == "activation":
            copies["d2h"].append(off["bytes"])
        copies["h2d"] += [off["bytes"]] * (len(off["reload_groups"]) + (off["output_h2d_before"] is not None))
    return copies


def _external_bytes(model: str, proto: onnx.ModelProto) -> int:
    folder = Path(model).parent
    return sum((folder / name).stat().st_size for name in external_locations(proto) if (folder / name).is_file())


def _scaled(
    direction: str,
    plan: Plan,
    added: float,
    unfolded: float,
    fits: dict[str, LinkFit],
    scale: dict[str, float],
    model: str,
) -> dict[str, Any]:
    """The record of one rewrite's copies timed inside the model (``added``: the seconds it adds over the
    model, ``unfolded`` of them what running without ConstantFolding costs), setting
    ``scale[direction]`` when the factor over the sweep's fit is plausible (`_SCALE_RANGE`)."""
    copies = _plan_copies(plan)
    others = sum(fits["h2d"].time(b) * scale["h2d"] for b in copies["h2d"]) if direction == "d2h" else 0.0
    predicted = sum(fits[direction].time(b) for b in copies[direction])
    cost = added - others - unfolded
    factor = cost / predicted if predicted > 0 else 0.0
    entry: dict[str, Any] = {
        "copies": len(copies[direction]),
        "bytes": sum(copies[direction]),
        "rewrite_copies": sum(len(v) for v in copies.values()),
        "added_s": added,
        "sweep_fit_s": predicted + others,
        "scale": None,
    }
    if _SCALE_RANGE[0] <= factor <= _SCALE_RANGE[1]:
        scale[direction] = factor
        entry["scale"] = factor
    else:
        logger.warning(
            "timing %s copies inside %s: they added %.1f us against %.1f us predicted by the sweep; "
            "the sweep's fit is kept (measure on a quiet machine)",
            direction.upper(),
            model,
            cost * 1e6,
            predicted * 1e6,
        )
    return entry


def _copies_in_model(
    dev: _Device,
    analysis: Any,
    model: str,
    feeds: Mapping[str, np.ndarray],
    settings: Mapping[str, Any],
    fits: dict[str, LinkFit],
    repeat: int,
    folder: Path,
    times: _ModelTimes,
) -> tuple[dict[str, float], dict[str, Any]]:
    """Scale the sweep's fits to what copies cost inside the model; returns (scale per direction, record).

    Two rewrites of the model are timed against it side by side: every weight offloaded (H2D only),
    and every activation offloaded (a D2H after its producer, an H2D before each use). The time
    each adds, over what the sweep's fits predict for its copies, scales the fits: the H2D fit from
    the first, then the D2H fit from the second (its H2Ds counted with the scaled H2D fit). A copy
    in a model is not a copy in a loop of copies: the cache holds other things, and the copy's
    neighbours compete for memory bandwidth.

    The rewrites run at the optimization level of the model's timed runs (``times``), keeping what
    that level's fusions take in: above ``disable`` what a rewrite adds there besides its copies (its
    order pins' nodes, the constants no longer folded, kernels whose weights arrive by copy and are
    not prepacked) is priced into the copies too.
    """
    scale = {"d2h": 1.0, "h2d": 1.0}
    record: dict[str, Any] = {"d2h": None, "h2d": None}
    if is_rewritten(analysis):
        record["note"] = "the model already contains copies: the sweep's fits are used as measured"
        return scale, record
    if _external_bytes(model, analysis.loaded.proto) > _IN_MODEL_DATA_MAX:
        record["note"] = (
            f"the model's external data exceed {_IN_MODEL_DATA_MAX >> 20} MiB: not copied to time rewrites of it; "
            "the sweep's fits are used as measured"
        )
        if times.opt_level != "disable":  # the model alone, with ConstantFolding off and on
            record["unfolded_s"] = _unfolded(dev, model, feeds, settings, repeat, times.opt_level)
        return scale, record
    plans = {
        "h2d": _offload_everything(analysis, activations=False, fused=times.fused),
        "d2h": _offload_everything(analysis, activations=True, fused=times.fused),
    }
    paths = {}
    for direction, plan in plans.items():
        if not plan["offloads"]:
            continue
        path = folder / f"everything_{direction}.onnx"
        write_model(apply_plan(plan, analysis), path, source_dir=Path(model).parent)
        paths[direction] = str(path)
    if not paths:
        record["note"] = "nothing in the model can be offloaded: the sweep's fits are used as measured"
        return scale, record
    level = times.opt_level
    runners = [dev.runner(model, feeds, settings, profiled=False, opt_level=level)]
    for written in paths.values():
        settings_written = required_settings(load_model(written).proto, written)
        runners.append(dev.runner(written, feeds, settings_written, profiled=False, opt_level=level))
    if level != "disable":  # the rewrites run without ConstantFolding: what that costs the model itself
        runners.append(dev.runner(model, feeds, _unfolding(settings), profiled=False, opt_level=level))
    # the difference of two latencies is what counts: time them three times as long as the model alone
    medians = [statistics.median(t) for t in _alternate(runners, repeat, min_seconds=3 * _MIN_SECONDS)]
    del runners
    base = medians[0]
    added = dict(zip(paths, medians[1 : 1 + len(paths)]))
    unfolded = max(medians[-1] - base, 0.0) if level != "disable" else 0.0
    record["latency_s"] = base
    if level != "disable":
        record["unfolded_s"] = unfolded
    for direction in ("h2d", "d2h"):  # H2D first: the D2H rewrite's H2Ds are priced with its scale
        if direction in added:
            record[direction] = _scaled(
                direction, plans[direction], added[direction] - base, unfolded, fits, scale, model
            )
    return scale, record


# ---------------------------------------------------------------------------------------- measuring


def _fit_doc(fit: LinkFit, points: list[tuple[int, float]], fitted: tuple[int, int]) -> dict[str, Any]:
    return {
        "latency_s": fit.latency_s,
        "bandwidth": fit.bandwidth,
        "max_relative_error": fit.max_relative_error,
        "fitted_bytes": [int(fitted[0]), int(fitted[1])],
        "points": [[int(b), float(t)] for b, t in points],
    }


@dataclass
class _ModelTimes:
    """The model's own figures: latency without profiling, kernel events, the providers in use."""

    latency: list[float]
    runs: list[list[KernelEvent]]
    providers: list[str]
    nodes: dict[str, dict[str, Any]]
    kernel_sum: float
    nodes_ran: int
    opt_level: str = "disable"  # the graph optimization level of the runs
    fused: list[str] = field(default_factory=list)  # the original's tensors that level's graph lacks


@dataclass
class _Executor:
    """Chains of trivial nodes: the fixed cost of a run and of a kernel."""

    short: float
    long: float
    per_trivial: float
    run_overhead: float


@dataclass
class _Sweep:
    """Copy times over a sweep of sizes, and their fits."""

    sizes: list[int]
    fitted: tuple[int, int]
    fits: dict[str, LinkFit]
    points: dict[str, list[tuple[int, float]]]
    doc: dict[str, list[dict[str, Any]]]
    footprint: int = 0  # the memory a run of the model cycles through (H2D copies read that cold)


def _check_profile_options(
    device: str, repeat: int, threads: int, sweep: Sequence[int], inputs: Any, shapes: bool
) -> None:
    if device not in DEVICES:
        raise OffloadError(f"unknown device {device!r}", hint=f"use one of: {', '.join(DEVICES)}")
    if repeat < 1:
        raise OffloadError(f"repeat must be at least 1, not {repeat}", hint="for example --repeat 20")
    if threads < 0:
        raise OffloadError(
            f"threads must be 0 (onnxruntime's default) or more, not {threads}", hint="for example --threads 1"
        )
    if len(set(sweep)) < 2 or any(s < 4 for s in sweep):
        raise OffloadError(
            f"the copy sweep {list(sweep)} needs at least two distinct sizes of 4 bytes or more",
            hint="give sizes in bytes, for example (4096, 65536, 1048576)",
        )
    if inputs is not None and shapes:
        raise OffloadError(
            "give either an inputs file or input shapes, not both", hint="the inputs file fixes the shapes"
        )


def _time_model(
    dev: _Device,
    model: str,
    feeds: dict[str, Any],
    settings: Mapping[str, Any],
    repeat: int,
    analysis: Analysis,
    opt_level: str = "disable",
) -> _ModelTimes:
    stats = dev.folder / "node_stats.csv"
    optimized = dev.folder / "optimized.onnx" if opt_level != "disable" else None
    try:
        plain = dev.runner(model, feeds, settings, profiled=False, opt_level=opt_level, optimized=optimized)
    except OffloadError as exc:
        if optimized is None:
            raise
        raise OffloadError(
            f"profiling at --opt-level {opt_level} needs the graph onnxruntime runs, and onnxruntime could not "
            f"save it for {model}: {exc.message}",
            hint="profile at --opt-level disable (with CANN graph mode, onnxruntime cannot save a compiled graph)",
        ) from exc
    profiled = dev.runner(model, feeds, settings, profiled=True, node_stats=stats, opt_level=opt_level)
    latency, _ = _alternate([plain, profiled], repeat)
    runs = profiled.kernels()
    providers = list(plain.session.get_providers())
    del plain, profiled
    gc.collect()
    kernel_sum = statistics.median(sum(e.seconds for e in run) for run in runs) if runs else 0.0
    nodes_ran = round(statistics.median(len(run) for run in runs)) if runs else 0
    nodes = _node_medians(runs)
    for name, scratch in read_node_scratch(stats).items():
        if scratch and name in nodes:
            nodes[name]["scratch_bytes"] = scratch
    if optimized is None:
        return _ModelTimes(latency, runs, providers, nodes, kernel_sum, nodes_ran)
    fusions = attribute(analysis, onnx.load(str(optimized), load_external_data=False), nodes)
    if fusions.unattributed_s:
        logger.warning(
            "%.1f us of the optimized model's node times belong to no node of %s; the estimates leave them out",
            fusions.unattributed_s * 1e6,
            model,
        )
    return _ModelTimes(latency, runs, providers, fusions.nodes, kernel_sum, nodes_ran, opt_level, fusions.fused)


def _time_executor(dev: _Device, folder: Path) -> _Executor:
    one = {"t0": np.ones(1, np.float32)}
    chains = [
        dev.runner(_save(_chain_model(k), folder, f"chain{k}.onnx"), one, profiled=False) for k in (1, _CHAIN_NODES + 1)
    ]
    short, long = (statistics.median(t) for t in _alternate(chains, _CHAIN_REPEAT))
    del chains
    per_trivial = max((long - short) / _CHAIN_NODES, 0.0)
    return _Executor(short, long, per_trivial, max(short - per_trivial, 0.0))


def _time_copies(dev: _Device, folder: Path, analysis: Analysis, sweep: Sequence[int], repeat: int) -> _Sweep:
    tensor_bytes = _tensor_bytes(analysis)
    footprint = peak_memory(analysis)[0]  # the memory a run cycles through (freed buffers are reused)
    sizes = sorted(set(sweep))
    fitted = fit_range([_elements(size) * 4 for size in sizes], tensor_bytes)
    sizes = [size for size in sizes if fitted[0] <= _elements(size) * 4 <= fitted[1]]
    result = _Sweep(sizes, fitted, {}, {}, {}, footprint)
    rng = np.random.default_rng(0)
    for direction in ("d2h", "h2d"):
        result.points[direction], result.doc[direction] = [], []
        for size in sizes:
            copies = max(2, min(_COPIES_MAX, _SWEEP_BUDGET // size))
            sources = max(1, min(copies, min(footprint, _COLD_BYTES_MAX) // size))
            feeds_copy = {"x": rng.standard_normal(_elements(size)).astype(np.float32), "t": np.ones(1, np.float32)}
            runners = [
                dev.runner(
                    _save(_copies_model(direction, size, k, sources), folder, f"{direction}{size}x{k}.onnx"),
                    feeds_copy,
                    profiled=False,
                )
                for k in (1, copies)
            ]
            few, many = (statistics.median(t) for t in _alternate(runners, repeat, min_seconds=_SWEEP_SECONDS))
            del runners, feeds_copy
            seconds = max(many - few, 0.0) / (copies - 1)
            result.points[direction].append((_elements(size) * 4, seconds))
            result.doc[direction].append(
                {
                    "bytes": _elements(size) * 4,
                    "copies": copies,
                    "sources": 1 if direction == "d2h" else sources,
                    "seconds": seconds,
                }
            )
        chosen = [(b, t) for b, t in result.points[direction] if fitted[0] <= b <= fitted[1]]
        lost = [b for b, t in chosen if t <= 0]
        if lost:
            raise OffloadError(
                f"timing {direction.upper()} copies of {lost[0]} bytes on {dev.device}: the machine's noise exceeded "
                "what the copies cost (a run with more copies was not slower)",
                hint="measure on a quiet machine, or raise --repeat",
            )
        result.fits[direction] = fit_link(chosen)
    return result


def _time_roofline(dev: _Device, folder: Path) -> dict[str, dict[str, Any]]:
    roof = _roofline_model()
    roof_runner = dev.runner(_save(roof, folder, "roofline.onnx"), _random_feeds(roof), profiled=True)
    _alternate([roof_runner], _CALIBRATION_REPEAT, min_seconds=0.0)
    times = _node_medians(roof_runner.kernels())
    del roof_runner
    return times


def measure_profile(
    model: str,
    device: str,
    *,
    inputs: str | os.PathLike[str] | None = None,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    dims: Mapping[str, int] | None = None,
    repeat: int = DEFAULT_REPEAT,
    ep_options: Mapping[str, str] | None = None,
    sweep: Sequence[int] | None = None,
    threads: int = 0,
    report: Callable[[str], None] | None = None,
    opt_level: str = "disable",
) -> dict[str, Any]:
    """Measure ``model`` and the copy costs on ``device``; return the profile document.

    Args:
        model: the ONNX model whose nodes are timed (an original or a rewritten one).
        device: ``cpu``, ``cuda`` or ``ascend``.
        inputs: an .npz file with every input; generated from ``default_rng(0)`` when None.
        input_shapes, dims: pins for dynamic input dimensions when inputs are generated (as for
            `offloadctl.loading.model.load_model`).
        repeat: runs per measurement after one warm-up run (medians are taken over them).
        ep_options: provider options (CUDA and CANN), as for `offloadctl run`.
        sweep: the copy sizes in bytes (at least two distinct ones); None: ``SWEEP_BYTES``.
        threads: onnxruntime's intra-op threads for every session (0: its default, one per
            physical core). The profile describes sessions with this setting.
        report: called with the name of each step as it starts.
        opt_level: onnxruntime's graph optimization level of the model's timed runs (``disable``,
            ``basic``, ``extended``, ``all``): the level the model will be served at. Above
            ``disable`` the optimized nodes' times are attributed to the original's nodes and the
            tensors the optimizer took in are recorded (`offloadctl.running.fusions`).

    Returns:
        The profile, valid against ``schemas/profile.schema.json`` (checked).

    Raises:
        OffloadError: bad model or inputs, onnxruntime missing, the device not really in use, or
            copy times that cannot be fitted.
    """
    sweep = SWEEP_BYTES if sweep is None else tuple(sweep)
    _check_profile_options(device, repeat, threads, sweep, inputs, bool(input_shapes or dims))
    if opt_level not in OPT_LEVELS:
        raise OffloadError(f"unknown optimization level {opt_level!r}", hint=f"use one of: {', '.join(OPT_LEVELS)}")
    step = report or (lambda text: None)
    ep_options = dict(ep_options or {})
    loaded = load_model(model, input_shapes=input_shapes, dims=dims)
    analysis = analyse(loaded)
    settings = required_settings(loaded.proto, model)
    specs = input_specs(loaded.proto)
    if inputs is not None:
        feeds, source = load_inputs(inputs, specs, model), "file"
    else:
        feeds, warnings = generate_inputs(specs)
        for warning in warnings:
            logger.warning("%s", warning)
        source = "generated"
    with tempfile.TemporaryDirectory(prefix="offloadctl-profile-") as tmp:
        folder = Path(tmp)
        dev = _Device(device, ep_options, folder, threads)
        step(f"timing and profiling {model}")
        times = _time_model(dev, model, feeds, settings, repeat, analysis, opt_level)
        step("timing the executor (chains of trivial nodes)")
        executor = _time_executor(dev, folder)
        step("timing copies over a sweep of sizes")
        copies = _time_copies(dev, folder, analysis, sweep, repeat)
        step("timing copies in the model (every weight, then every activation offloaded)")
        scale, in_model = _copies_in_model(dev, analysis, model, feeds, settings, copies.fits, repeat, folder, times)
        step("timing a MatMul and an Add (roofline figures)")
        roof_times = _time_roofline(dev, folder)
    step("measuring memory (onnxruntime's allocator statistics, one run)")
    memory = _measured_memory(dev, model, feeds, settings)
    context = _ProfileContext(model, device, ep_options, threads, repeat, settings, loaded.sha256, analysis, dev)
    doc = _profile_doc(context, times, executor, copies, scale, in_model, roof_times, feeds, source)
    doc["measured"]["memory"] = memory
    validate_profile(doc, origin=f"measured for {model}")
    profile_from_dict(doc, origin=f"measured for {model}")  # the loader accepts what was written
    return doc


def _measured_memory(
    dev: _Device, model: str, feeds: Mapping[str, np.ndarray], settings: Mapping[str, Any]
) -> list[dict[str, Any]] | None:
    """What onnxruntime's allocators held for one run of a fresh session (DEFAULT order, statistics);
    None, with a warning, where this onnxruntime cannot say."""
    if dev.device == "webgpu":
        logger.warning("the profile records no measured memory: the WebGPU provider's allocator reports no byte counts")
        return None
    config = session_config(settings, dev.device, opt_level="disable", ep_options=dev.ep_options, ort=dev.ort)
    try:
        figures = measure_memory(config.spec(model, dev.device), feeds, order="default", ort=dev.ort)
    except OffloadError as exc:
        logger.warning("the profile records no measured memory: %s", exc.message)
        return None
    return [figure.to_json() for figure in figures]


@dataclass
class _ProfileContext:
    """What a profile describes: the model, the device and the session settings."""

    model: str
    device: str
    ep_options: dict[str, str]
    threads: int
    repeat: int
    settings: Mapping[str, Any]
    sha256: str
    analysis: Analysis
    dev: _Device


def _profile_doc(
    ctx: _ProfileContext,
    times: _ModelTimes,
    executor: _Executor,
    copies: _Sweep,
    scale: dict[str, float],
    in_model: dict[str, Any],
    roof_times: dict[str, dict[str, Any]],
    feeds: Mapping[str, Any],
    source: str,
) -> dict[str, Any]:
    """The profile document (``schemas/profile.schema.json``) of what was measured."""
    latency_median = statistics.median(times.latency)
    # a run of the model costs at least the run's fixed cost: on a noisy machine the one-node chain can
    # time slower than a tiny model; the fixed cost is then capped so that the parts add up to the latency
    run_overhead = min(executor.run_overhead, latency_median)
    node_overhead = node_overhead_for(
        [e["seconds"] for e in times.nodes.values() if e.get("ran", True)], latency_median - run_overhead
    )
    matmul_flops = 2 * _MATMUL_N**3
    add_bytes = 3 * 4 * _ADD_ELEMENTS
    peak = matmul_flops / max(roof_times["matmul"]["seconds"], 1e-9)
    provider = DEVICES[ctx.device]
    device_name = _device_name(ctx.device, ctx.ep_options)
    ort_version = ctx.dev.ort.__version__
    fits = copies.fits
    link = {d: {"bandwidth": fits[d].bandwidth / scale[d], "latency_s": fits[d].latency_s * scale[d]} for d in fits}
    name = Path(ctx.model).name
    return {
        "schema_version": PROFILE_SCHEMA_VERSION,
        "name": f"measured {ctx.device}: {name}",
        "description": (
            f"Measured by offloadctl profile on {device_name} ({provider}, onnxruntime {ort_version}) "
            f"with {name}; node times are used for models with the same nodes."
        ),
        "peak_flops": {"float32": peak, "default": peak},
        "mem_bandwidth": add_bytes / max(roof_times["add"]["seconds"], 1e-9),
        "kernel_launch_s": executor.per_trivial,
        "run_overhead_s": run_overhead,
        "link": link,
        "source": _profile_sources(name, len(times.runs), copies),
        "measured": {
            "tool": {"name": "offloadctl", "version": __version__},
            "device": _device_doc(ctx, times, device_name),
            "session": {
                "execution_order": EXECUTION_ORDERS["priority"],
                "opt_level": times.opt_level,
                "intra_op_num_threads": ctx.threads,
                "provider_options": ctx.ep_options,
                "disabled_optimizers": [str(x) for x in ctx.settings.get("disabled_optimizers") or []],
            },
            "repeat": ctx.repeat,
            "model": {
                "path": str(ctx.model),
                "sha256": ctx.sha256,
                "nodes": ctx.analysis.num_positions,
                "inputs": {
                    n: {"dtype": str(a.dtype), "shape": [int(d) for d in a.shape], "source": source}
                    for n, a in feeds.items()
                },
            },
            "latency_s": {"median": latency_median, "runs": times.latency},
            "kernel_sum_s": times.kernel_sum,
            "executor": {
                "run_overhead_s": run_overhead,
                "node_overhead_s": node_overhead,
                "nodes_ran": times.nodes_ran,
                "source": "chosen so that run_overhead_s plus every node's time (its median duration plus "
                "node_overhead_s, never below 0) is latency_s.median: the executor's time between kernels minus the "
                "profiler's own time inside each kernel event",
            },
            "fused": times.fused,
            "nodes": times.nodes,
            "link": {d: _fit_doc(fits[d], copies.points[d], copies.fitted) for d in ("d2h", "h2d")},
            "copy_sweep": copies.doc,
            "copies_in_model": in_model,
            "calibration": _calibration_doc(executor, roof_times),
        },
    }


def _device_doc(ctx: _ProfileContext, times: _ModelTimes, device_name: str) -> dict[str, Any]:
    """What the profile was measured on: the device, the providers in use, onnxruntime, the host."""
    return {
        "device": ctx.device,
        "provider": times.providers[0] if times.providers else DEVICES[ctx.device],
        "providers": times.providers,
        "onnxruntime": ctx.dev.ort.__version__,
        "name": device_name,
        "host": {"platform": platform.platform(), "cpu_count": os.cpu_count() or 0},
    }


def _calibration_doc(executor: _Executor, roof_times: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The calibration runs: the trivial chain (the executor's overheads), a MatMul and an Add (the roofs)."""
    return {
        "trivial_chain": {
            "nodes": [1, _CHAIN_NODES + 1],
            "latency_s": [executor.short, executor.long],
            "runs": _CHAIN_REPEAT,
        },
        "matmul": {"n": _MATMUL_N, "seconds": roof_times["matmul"]["seconds"], "flops": 2 * _MATMUL_N**3},
        "add": {"bytes": 3 * 4 * _ADD_ELEMENTS, "seconds": roof_times["add"]["seconds"]},
    }


def _profile_sources(name: str, runs: int, copies: _Sweep) -> dict[str, str]:
    """Where each figure of a measured profile comes from."""
    sizes = copies.sizes
    footprint = copies.footprint
    return {
        "peak_flops": f"measured: a {_MATMUL_N}x{_MATMUL_N}x{_MATMUL_N} float32 MatMul, median of "
        f"{_CALIBRATION_REPEAT} profiled runs (2*N^3 FLOP / duration); other types use the same figure",
        "mem_bandwidth": f"measured: an Add of two {4 * _ADD_ELEMENTS >> 20} MiB float32 tensors, median of "
        f"{_CALIBRATION_REPEAT} profiled runs (3 tensors' bytes / duration)",
        "kernel_launch_s": f"measured: latency of a chain of {_CHAIN_NODES + 1} Relu nodes on one float minus that "
        f"of 1, per node (medians of {_CHAIN_REPEAT} runs without profiling)",
        "run_overhead_s": "measured: latency of a one-node run minus kernel_launch_s",
        "link": f"measured: the latency one more copy node adds to a run, without profiling, over {len(sizes)} "
        f"sizes ({sizes[0]} to {sizes[-1]} bytes; models with 1 and many copies, medians of runs taking turns), "
        "fitted as latency + bytes / bandwidth over the sizes of the model's tensors (measured.link). D2H "
        "copies read a warm tensor (as right after its producer); H2D copies read tensors as cold as the model "
        f"leaves them (between two reads of one, the others are read: {min(footprint, _COLD_BYTES_MAX)} bytes, "
        "the model's simulated peak memory); then scaled to what the copies of two rewrites of the model "
        "(every weight, every activation offloaded) added to its latency (measured.copies_in_model)",
        "nodes": f"measured: onnxruntime profiling of {name}, median of {runs} runs per node "
        "(measured.nodes), plus measured.executor.node_overhead_s per node",
    }


def write_profile(path: str | os.PathLike[str], doc: Mapping[str, Any]) -> None:
    """Validate a profile document and write it atomically.

    Indented JSON, except that each node of ``measured.nodes`` and each list of numbers (the runs,
    the sweep's points) takes one line: a big model has one entry per node.
    """
    validate_profile(doc, origin="being written")
    compact: dict[str, str] = {}

    def slot(value: Any) -> str:
        key = f"\u0000{len(compact)}"
        compact[key] = json.dumps(value)
        return key

    def shrink(value: Any, nodes: bool = False) -> Any:
        if isinstance(value, dict):
            if nodes:
                return {k: slot(v) for k, v in value.items()}
            return {k: shrink(v, nodes=k == "nodes" and isinstance(v, dict)) for k, v in value.items()}
        if isinstance(value, list):
            if all(isinstance(v, (int, float)) or isinstance(v, list) for v in value) and value:
                return slot(value)
            return [shrink(v) for v in value]
        return value

    text = json.dumps(shrink(dict(doc)), indent=1)
    for key, value in compact.items():
        text = text.replace(json.dumps(key), value, 1)
    atomic_write_text(path, text + "\n")
