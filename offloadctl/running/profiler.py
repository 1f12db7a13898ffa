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
  up to the latency (`offloadctl.running.fits.node_overhead_for`). On a CPU ``node_overhead_s`` is
  negative: onnxruntime's profiler spends more inside each event (thread-pool statistics, shape
  strings) than the executor spends between nodes; the figure corrects both.
* copies: the latency one more ``MemcpyToHost`` (D2H) or ``MemcpyFromHost`` (H2D) node adds to a
  run, without profiling (models with 1 and with many copies, runs interleaved), over a sweep of
  sizes (``SWEEP_BYTES``), fitted as ``latency_s + bytes / bandwidth``
  (`offloadctl.running.fits.fit_link`); this is the profile's top-level ``link``. A direction whose
  times noise left unfittable (more copies not slower) is timed once more, twice as long, before the
  profile is refused. The cache decides the cost of a small copy, so each direction is
  timed as a model uses it: a D2H reads the tensor its producer has just written (warm: the copies
  read one tensor again and again); an H2D reads a host tensor written long before (as cold as
  the model leaves it: the copies cycle through distinct weights, as many bytes as the model's
  simulated peak memory, the memory a run cycles through since freed buffers are reused; at most
  ``_COLD_BYTES_MAX``). A copy inside a model still costs otherwise (the cache holds the model's
  data, neighbours compete for memory bandwidth): two rewrites of the model, every weight and
  every activation offloaded, are timed against it, and the fits are scaled to what their copies
  added (`offloadctl.running.copies_in_model`). On the CPU execution provider both copies are real memcpys;
* the roofline figures for nodes a profile has no time for: ``peak_flops`` from a 512x512x512
  float32 MatMul, ``mem_bandwidth`` from an Add of two 16 MiB tensors, ``kernel_launch_s`` as the
  latency one more trivial node adds to a run.

On CUDA and CANN, kernel events time the host side of each node (launches are asynchronous); the
latency and ``node_overhead_s`` still come from whole runs, which end when the device is done.
"""

from __future__ import annotations

import gc
import logging
import os
import platform
import re
import statistics
import subprocess
import tempfile
from collections.abc import Callable, Mapping, Sequence
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
from offloadctl.loading.model import load_model
from offloadctl.running.allocator import AllocatorDoc, measure_memory, read_node_scratch
from offloadctl.running.copies_in_model import copies_in_model
from offloadctl.running.fits import LinkFit, fit_link, fit_range, node_overhead_for
from offloadctl.running.fusions import attribute
from offloadctl.running.inputs import generate_inputs, input_specs, load_inputs
from offloadctl.running.kernels import KernelEvent, node_medians
from offloadctl.running.sessions import DEVICES, OPT_LEVELS, required_settings, session_config
from offloadctl.running.timed import Device, alternate_runners
from offloadctl.simulation.memory import peak_memory
from offloadctl.simulation.profiles import PROFILE_SCHEMA_VERSION, profile_from_dict, validate_profile

__all__ = ["DEFAULT_REPEAT", "SWEEP_BYTES", "measure_profile"]

logger = logging.getLogger(__name__)

DEFAULT_REPEAT = 20
#: Sizes of the copy sweep: 256 bytes to 64 MiB, x4 per step.
SWEEP_BYTES: tuple[int, ...] = tuple(256 * 4**k for k in range(10))
_CHAIN_NODES = 64  # trivial nodes in the long calibration chain (the short one has 1)
_CHAIN_REPEAT = 200  # runs per chain: a run takes microseconds
_MATMUL_N = 512
_ADD_ELEMENTS = 1 << 22  # 16 MiB of float32 per operand
_CALIBRATION_REPEAT = 10
_SWEEP_BUDGET = 32 << 20  # bytes copied per run when timing copies of one size
_COPIES_MAX = 256  # copies per run at most (small sizes)
_COLD_BYTES_MAX = 64 << 20  # distinct H2D sources per run at most (memory, and the model file)
_SWEEP_SECONDS = 0.2  # each size is timed for at least this long
_SWEEP_TRIES = 2  # a direction whose times noise made unfittable is timed once more, twice as long
_IR_VERSION = 10
_OPSET = 17


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
    dev: Device,
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
    latency, _ = alternate_runners([plain, profiled], repeat)
    runs = profiled.kernels()
    providers = list(plain.session.get_providers())
    del plain, profiled
    gc.collect()
    kernel_sum = statistics.median(sum(e.seconds for e in run) for run in runs) if runs else 0.0
    nodes_ran = round(statistics.median(len(run) for run in runs)) if runs else 0
    nodes = node_medians(runs)
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


def _time_executor(dev: Device, folder: Path) -> _Executor:
    one = {"t0": np.ones(1, np.float32)}
    chains = [
        dev.runner(_save(_chain_model(k), folder, f"chain{k}.onnx"), one, profiled=False) for k in (1, _CHAIN_NODES + 1)
    ]
    short, long = (statistics.median(t) for t in alternate_runners(chains, _CHAIN_REPEAT))
    del chains
    per_trivial = max((long - short) / _CHAIN_NODES, 0.0)
    return _Executor(short, long, per_trivial, max(short - per_trivial, 0.0))


def _time_copies(dev: Device, folder: Path, analysis: Analysis, sweep: Sequence[int], repeat: int) -> _Sweep:
    tensor_bytes = _tensor_bytes(analysis)
    footprint = peak_memory(analysis)[0]  # the memory a run cycles through (freed buffers are reused)
    sizes = sorted(set(sweep))
    fitted = fit_range([_elements(size) * 4 for size in sizes], tensor_bytes)
    sizes = [size for size in sizes if fitted[0] <= _elements(size) * 4 <= fitted[1]]
    result = _Sweep(sizes, fitted, {}, {}, {}, footprint)
    rng = np.random.default_rng(0)
    for direction in ("d2h", "h2d"):
        for attempt in range(_SWEEP_TRIES):  # noise can hide what small copies cost: again, for twice as long
            points, doc = _sweep(dev, folder, direction, sizes, footprint, repeat, _SWEEP_SECONDS * 2**attempt, rng)
            result.points[direction], result.doc[direction] = points, doc
            try:
                result.fits[direction] = _fit(dev, direction, points, fitted)
                break
            except OffloadError:
                if attempt == _SWEEP_TRIES - 1:
                    raise
                logger.info("timing %s copies again: the machine's noise hid what they cost", direction.upper())
    return result


def _sweep(
    dev: Device,
    folder: Path,
    direction: str,
    sizes: Sequence[int],
    footprint: int,
    repeat: int,
    min_seconds: float,
    rng: np.random.Generator,
) -> tuple[list[tuple[int, float]], list[dict[str, Any]]]:
    """The seconds one more copy of each size adds to a run, in one direction: (bytes, seconds) points
    and their records."""
    points, doc = [], []
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
        few, many = (statistics.median(t) for t in alternate_runners(runners, repeat, min_seconds=min_seconds))
        del runners, feeds_copy
        seconds = max(many - few, 0.0) / (copies - 1)
        points.append((_elements(size) * 4, seconds))
        doc.append(
            {
                "bytes": _elements(size) * 4,
                "copies": copies,
                "sources": 1 if direction == "d2h" else sources,
                "seconds": seconds,
            }
        )
    return points, doc


def _fit(dev: Device, direction: str, points: list[tuple[int, float]], fitted: tuple[int, int]) -> LinkFit:
    """The copy fit over the points in the fitted range; refused when noise hid what a copy costs."""
    chosen = [(b, t) for b, t in points if fitted[0] <= b <= fitted[1]]
    lost = [b for b, t in chosen if t <= 0]
    if lost:
        raise OffloadError(
            f"timing {direction.upper()} copies of {lost[0]} bytes on {dev.device}: the machine's noise exceeded "
            "what the copies cost (a run with more copies was not slower)",
            hint="measure on a quiet machine, or raise --repeat",
        )
    return fit_link(chosen)


def _time_roofline(dev: Device, folder: Path) -> dict[str, dict[str, Any]]:
    roof = _roofline_model()
    roof_runner = dev.runner(_save(roof, folder, "roofline.onnx"), _random_feeds(roof), profiled=True)
    alternate_runners([roof_runner], _CALIBRATION_REPEAT, min_seconds=0.0)
    times = node_medians(roof_runner.kernels())
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
        dev = Device(device, ep_options, folder, threads)
        step(f"timing and profiling {model}")
        times = _time_model(dev, model, feeds, settings, repeat, analysis, opt_level)
        step("timing the executor (chains of trivial nodes)")
        executor = _time_executor(dev, folder)
        step("timing copies over a sweep of sizes")
        copies = _time_copies(dev, folder, analysis, sweep, repeat)
        step("timing copies in the model (every weight, then every activation offloaded)")
        scale, in_model = copies_in_model(
            dev, analysis, model, feeds, settings, copies.fits, repeat, folder, times.opt_level, times.fused
        )
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
    dev: Device, model: str, feeds: Mapping[str, np.ndarray], settings: Mapping[str, Any]
) -> list[AllocatorDoc] | None:
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
    dev: Device


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
