"""Copies on a stream of their own, on a device: five setups of one generated fp16 model, and a race check
(run by ``bench/device_check.sh`` on a CUDA machine; ``--device cpu --small`` dry-runs it here).

The model is a chain of MatMul + Relu layers whose weights the plan streams in (``--params``), with long
skip connections whose activations the plan offloads (a copy to host and back). Its sizes make a
layer's weight copy take about as long as the layer's compute on an H100 (fp16, 8192 x 4096 rows by
4096 x 4096 weights: 64 MiB and ~0.27 TFLOP a layer). The setups, each timed taking turns with the others
(median of ``--repeat`` runs after one warm-up, PRIORITY_BASED, ``--opt-level disable``):

1. weights resident: the model as it is;
2. copies in line: ``apply`` (one stream);
3. streams, pageable weights: ``apply --copies streams`` with its partition file;
4. streams, page-locked weights: the same, the streamed weights handed over from ``cudaHostAlloc``
   buffers (`offloadctl.running.pinned.hand_over`);
5. streams, compute listed first: the partition file's two streams swapped, so the executor issues a copy
   only when compute waits for it.

For each: wall time, the device's peak (onnxruntime's arena, measured by arena limit at PRIORITY_BASED;
the page-locked setup shares setup 3's, its device memory being the same) and the largest difference of
the outputs from setup 1's. Wall time is the proof: in line about compute plus copies, overlapped about
the larger of the two.

The race check runs the streams rewrite ``--race-runs`` times with its fences and as often without them
(each fence node deleted: compute no longer waits for a copy to host before the arena may give the copied
buffer to another tensor) and counts the runs whose outputs differ from setup 1's.

Two more rewrites, each planned, written on streams and run by the command line in both orders
(``offloadctl run --compare-to``, which gives each session its own inputs, checks them unchanged and
compares the outputs):

- a fused graph: the transformer sample planned with ``--opt-level all`` for the device, against the
  original at that level (within tolerance);
- the in-place pattern of onnxruntime's multi-stream planner (a weight read through ``Unsqueeze`` by a
  ``Relu`` that may write in place, and read again after it), with negative inputs: bit-identical, or
  the guard `apply` writes does not hold on the device.

Run: ``python bench/streams_check.py [--device cuda] [--repeat 10] [--race-runs 20] [--small]``.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from offloadctl.analysis.graph import analyse
from offloadctl.core.errors import OffloadError
from offloadctl.loading.model import load_model
from offloadctl.planning.make import scheduled_plan
from offloadctl.planning.request import PlanRequest
from offloadctl.rewriting.rewrite import RewriteOptions, apply_plan
from offloadctl.rewriting.streams import PARTITION_KEY, streams_file, with_events
from offloadctl.rewriting.writing import write_model
from offloadctl.running.allocator import measure_memory
from offloadctl.running.pinned import HostAllocator, hand_over, runtime_allocator
from offloadctl.running.sessions import import_onnxruntime, required_settings, session_config
from offloadctl.running.timed import alternate

#: (rows, hidden, layers): the H100 sizes, and the dry run's
SIZES = {"full": (8192, 4096, 12), "small": (64, 128, 6)}


def chain_model(rows: int, hidden: int, layers: int, dtype: type = np.float16) -> onnx.ModelProto:
    """x [rows, hidden] through ``layers`` MatMul + Relu layers with weights w0..; the outputs of the
    first half of the layers are added back at the end (activations idle for the rest of the chain,
    each one copy to host whose buffer the fences guard). ``dtype``: float16, or
    float32 for the CPU provider, which has no float16 MatMul (it would cast around it with nodes of its
    own that no partition file lists)."""
    rng = np.random.default_rng(0)
    nodes, weights, last = [], [], "x"
    for i in range(layers):
        w = (rng.standard_normal((hidden, hidden)) / np.sqrt(hidden)).astype(dtype)
        weights.append(numpy_helper.from_array(w, f"w{i}"))
        nodes += [
            helper.make_node("MatMul", [last, f"w{i}"], [f"m{i}"], name=f"mm{i}"),
            helper.make_node("Relu", [f"m{i}"], [f"h{i}"], name=f"relu{i}"),
        ]
        last = f"h{i}"
    for i in range(layers // 2):
        out = "y" if i == layers // 2 - 1 else f"s{i}"
        nodes.append(helper.make_node("Add", [last, f"h{i}"], [out], name=f"skip{i}"))
        last = out
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    io = [helper.make_tensor_value_info(n, elem, [rows, hidden]) for n in ("x", "y")]
    graph = helper.make_graph(nodes, "streams_check", io[:1], io[1:], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _rewrites(model: Path, folder: Path) -> dict[str, Path]:
    """The model written in line, on streams, on streams with compute listed first, and on streams without
    its fences."""
    analysis = analyse(load_model(model))
    plan = scheduled_plan(analysis, PlanRequest.of_options(select_distance=2, params=True, prefetch_distance=2))
    inline = folder / "inline.onnx"
    write_model(apply_plan(plan, analysis), inline, source_dir=model.parent)
    paths = {"inline": inline}
    for name in ("streams", "compute_first", "no_fence"):
        proto = apply_plan(plan, analysis, options=RewriteOptions(copies="streams"))
        path = folder / f"{name}.onnx"
        layout = with_events(proto, streams_file(path).name)
        streams = [layout.copy_stream, layout.compute_stream]
        if name == "compute_first":
            streams.reverse()
        if name == "no_fence":
            fences = {n.name for n in proto.graph.node if n.name.startswith("offload/event/fence/")}
            kept = [n for n in proto.graph.node if n.name not in fences]
            del proto.graph.node[:]
            proto.graph.node.extend(kept)
            streams = [[n for n in s if n not in fences] for s in streams]
        write_model(proto, path, source_dir=model.parent)
        doc = {**layout.to_json(), "streams": streams}
        streams_file(path).write_text(json.dumps(doc))
        paths[name] = path
    return paths


def _config(path: Path, device: str, ort: Any, *, streams: bool) -> Any:
    settings = required_settings(onnx.load(str(path), load_external_data=False), path)
    options = {"do_copy_in_default_stream": "0"} if streams and device == "cuda" else None
    config = session_config(settings, device, opt_level="disable", ep_options=options, ort=ort)
    if streams:
        config.entries[PARTITION_KEY] = str(streams_file(path).resolve())
        config.sess_options.add_session_config_entry(PARTITION_KEY, config.entries[PARTITION_KEY])
    return config


def _libc_allocator() -> HostAllocator:
    """Host buffers from libc: the CPU dry run's stand-in for cudaHostAlloc (the same hand-over)."""
    libc = ctypes.CDLL(None)

    def alloc(nbytes: int) -> int:
        ptr = ctypes.c_void_p()
        if libc.posix_memalign(ctypes.byref(ptr), ctypes.c_size_t(4096), ctypes.c_size_t(nbytes)):
            raise OSError("posix_memalign failed")
        return int(ptr.value or 0)

    return HostAllocator("posix_memalign (libc)", alloc, lambda address: libc.free(ctypes.c_void_p(address)))


def _session(path: Path, device: str, ort: Any, *, streams: bool, locked: bool = False) -> tuple[Any, Any]:
    config = _config(path, device, ort, streams=streams)
    held = None
    if locked:
        proto = onnx.load(str(path))
        allocator = _libc_allocator() if device == "cpu" else runtime_allocator(device)
        held = hand_over(proto, config.sess_options, allocator, ort=ort, base_dir=path.parent)
        print(f"  page-locked: {held.text()}", flush=True)
    session = ort.InferenceSession(str(path), config.sess_options, providers=config.providers, **config.kwargs)
    return session, held


def _peak(path: Path, device: str, feeds: dict, ort: Any, *, streams: bool) -> int | None:
    try:
        figures = measure_memory(
            _config(path, device, ort, streams=streams).spec(str(path), device), feeds, order="priority", ort=ort
        )
    except OffloadError as exc:
        print(f"  no device peak for {path.name}: {exc.message}", flush=True)
        return None
    return next((f.peak_bytes for f in figures if f.device == device), None)


def _diff(outputs: list[np.ndarray], reference: list[np.ndarray]) -> float:
    return max(float(np.max(np.abs(a.astype(np.float32) - b.astype(np.float32)))) for a, b in zip(outputs, reference))


#: the in-place pattern (tests/test_guards.py's Unsqueeze into Relu on a weight): ``a`` views ``w``, the
#: Relu may write into it, and ``w`` is read again after it
IN_PLACE = """<ir_version: 8, opset_import: ["" : 17]>
g (float[1,4,4] x) => (float[1,1,4,4] y)
<float[1,4,4] w = {-2.0,-1.7,-1.5,-1.2,-0.9,-0.6,-0.4,-0.1,0.1,0.4,0.6,0.9,1.2,1.5,1.7,2.0}, int64[1] ax = {0}> {
    e = Cos(x)
    a = Unsqueeze(w, ax)
    r0 = Relu(a)
    m = Add(r0, w)
    n = Mul(m, e)
    r1 = Sin(n)
    r2 = Sin(r1)
    r3 = Sin(r2)
    r4 = Sin(r3)
    r5 = Sin(r4)
    r6 = Sin(r5)
    y = Add(r6, e)
}"""


def _cli(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "offloadctl", *map(str, args)], capture_output=True, text=True)


def _verdict(done: subprocess.CompletedProcess) -> str:
    lines = (done.stdout + done.stderr).strip().splitlines()
    return next((line for line in reversed(lines) if line.startswith(("PASSED", "FAILED", "error"))), lines[-1:])


def _extras(device: str, folder: Path) -> None:
    """The fused graph and the in-place pattern, planned, written on streams and run in both orders."""
    samples = Path(__file__).resolve().parent.parent / "sample_models"
    pattern = folder / "in_place.onnx"
    onnx.save(onnx.parser.parse_model(IN_PLACE), str(pattern))
    np.savez(folder / "in_place.npz", x=np.random.default_rng(7).uniform(-2.0, 0.5, (1, 4, 4)).astype(np.float32))
    on = () if device == "cpu" else ("--device", device)
    cases = [
        ("fused graph", samples / "transformer.onnx", samples / "transformer.inputs.npz",
         ("--params", "--select-distance", "10", "--opt-level", "all", *on)),
        ("in-place pattern", pattern, folder / "in_place.npz",
         ("--select-distance", "1", "--prefetch-distance", "0", "--profile", "cpu")),
    ]  # fmt: skip
    for label, source, inputs, options in cases:
        for order in ("priority", "default"):
            plan, out = folder / f"{source.stem}.{order}.json", folder / f"{source.stem}.{order}.offload.onnx"
            made = _cli("plan", source, *options, "--copies", "streams", "--execution-order", order, "-o", plan)
            applied = _cli("apply", plan, "-o", out, "--copies", "streams") if made.returncode == 0 else made
            ran = _cli("run", out, "--device", device, "--execution-order", order, "--compare-to", source,
                       "--inputs", inputs) if applied.returncode == 0 else applied  # fmt: skip
            print(f"{label} ({order}): {_verdict(ran)}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--repeat", type=int, default=10, help="timed runs of each setup, taking turns")
    parser.add_argument("--race-runs", type=int, default=20)
    parser.add_argument("--small", action="store_true", help="the dry run's sizes")
    args = parser.parse_args(argv)
    ort = import_onnxruntime(args.device)
    rows, hidden, layers = SIZES["small" if args.small else "full"]
    with tempfile.TemporaryDirectory(prefix="offloadctl-streams-check-") as tmp:
        folder = Path(tmp)
        model = folder / "chain.onnx"
        dtype = np.float32 if args.device == "cpu" else np.float16
        onnx.save(chain_model(rows, hidden, layers, dtype), str(model))
        paths = _rewrites(model, folder)
        feeds = {"x": np.random.default_rng(1).standard_normal((rows, hidden)).astype(dtype)}
        setups = [
            ("weights resident", model, False, False),
            ("copies in line", paths["inline"], False, False),
            ("streams, pageable", paths["streams"], True, False),
            ("streams, page-locked", paths["streams"], True, True),
            ("streams, compute first", paths["compute_first"], True, False),
        ]
        print(
            f"streams check on {args.device} (onnxruntime {ort.__version__}): {layers} layers of "
            f"[{rows}, {hidden}] x [{hidden}, {hidden}] {np.dtype(dtype).name}, medians of {args.repeat} runs",
            flush=True,
        )
        sessions = []
        for label, path, streams, locked in setups:
            session, held = _session(path, args.device, ort, streams=streams, locked=locked)
            sessions.append((label, path, streams, session, held))
        reference = sessions[0][3].run(None, feeds)

        def timed(session: Any) -> float:
            start = time.perf_counter()
            session.run(None, feeds)
            return time.perf_counter() - start

        times = alternate([lambda s=s[3]: timed(s) for s in sessions], args.repeat, min_seconds=0.0)
        base = statistics.median(times[0])
        peaks: dict[str, int | None] = {}
        for (label, path, streams, session, _), runs in zip(sessions, times):
            wall = statistics.median(runs)
            key = str(path)
            if key not in peaks:
                peaks[key] = _peak(path, args.device, feeds, ort, streams=streams)
            peak = peaks[key]
            shown = "-" if peak is None else f"{peak / 2**20:9.1f} MiB"
            diff = _diff(session.run(None, feeds), reference)
            print(
                f"{label:24s} wall {wall * 1e3:9.3f} ms  x{wall / base:5.2f}  peak {shown}  max diff {diff:.3g}",
                flush=True,
            )
        held = [s[4] for s in sessions]
        del sessions  # the sessions first, then the page-locked buffers they read
        for record in held:
            if record is not None:
                record.close()
        wrong = {}
        for name in ("streams", "no_fence"):
            session, _ = _session(paths[name], args.device, ort, streams=True)
            wrong[name] = sum(_diff(session.run(None, feeds), reference) != 0 for _ in range(args.race_runs))
        print(
            f"race check: {wrong['no_fence']} of {args.race_runs} runs wrong without the fences, "
            f"{wrong['streams']} of {args.race_runs} with them",
            flush=True,
        )
        _extras(args.device, folder)
    return 0


if __name__ == "__main__":
    sys.exit(main())
