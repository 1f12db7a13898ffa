"""The device check's measurements (run by ``bench/device_check.sh`` on a CUDA machine).

For each sample, original and rewritten by a distance plan (weights too, order pins on):

* memory: the activations the CUDA arena held (``MaxInUse`` for one run of a fresh session less
  ``InUse`` once it was made, read through onnxruntime's C API, in the DEFAULT order), against the
  simulated device peak less resident weights, same model, same order (the device figure counts
  tensor bytes: no arena rounding, no planner reuse);
* time: the rewritten model against the original, timed side by side (taking turns, PRIORITY_BASED,
  ``--opt-level disable``), against the slowdown estimated under a profile measured on this GPU;
  on CUDA also with ``do_copy_in_default_stream=0`` (copies on streams of their own, the mode the
  estimate "copies on streams" assumes);
* placement: for the model and its fp16 copy, planned for the device (``plan --device``: the nodes
  it runs on the CPU and the copies onnxruntime inserts, measured there), in the DEFAULT order: the
  copies onnxruntime inserted next to the rewrite's (``run``'s ``plan_undone_by``), whether every order
  pin held, whether the order that ran is the one predicted for the placed graph (copies and both
  providers' streams), and the plan's device peak over the peak of the order that ran.

It prints one row per model; nothing is asserted. ``--device cpu`` (or ``webgpu``) runs the same
code on that provider (a dry run of the script where no GPU is).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from offloadctl.analysis.graph import analyse
from offloadctl.loading.model import load_model
from offloadctl.pipeline import planned_document
from offloadctl.planning.make import scheduled_plan
from offloadctl.planning.request import PlanRequest, SelectPart
from offloadctl.rewriting.rewrite import apply_plan
from offloadctl.rewriting.writing import write_model
from offloadctl.running.allocator import measure_memory
from offloadctl.running.profiler import measure_profile
from offloadctl.running.residency import host_nodes
from offloadctl.running.runner import run_model
from offloadctl.running.sessions import create_session, import_onnxruntime, required_settings, session_config
from offloadctl.simulation.profiles import profile_from_dict
from offloadctl.simulation.result import simulate

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from models import to_fp16  # noqa: E402

SAMPLES = ["unet", "transformer", "training", "mlp"]
STREAMS = {"cuda": {"do_copy_in_default_stream": "0"}, "ascend": {"do_copy_in_default_stream": "0"}}


def _arena_activations(model: Path, feeds: dict, device: str, ort) -> int | None:
    if device == "webgpu":
        return None  # its allocator reports no byte counts
    config = session_config(required_settings(load_model(model).proto), device, opt_level="disable", ort=ort)
    figures = measure_memory(config.spec(str(model), device), feeds, order="default", ort=ort)
    return next(f.peak_bytes - (f.in_use_after_creation or 0) for f in figures if f.device == device)


def _timed(models: list[Path], feeds: dict, device: str, ort, rounds: int = 30, ep_options=None) -> list[float]:
    sessions = []
    for model in models:
        settings = required_settings(load_model(model).proto)
        config = session_config(settings, device, opt_level="disable", ort=ort, ep_options=ep_options)
        sessions.append(create_session(model, config, device, ort=ort))
    times: list[list[float]] = [[] for _ in models]
    for s in sessions:
        s.run(None, feeds)
    for _ in range(rounds):
        for k, s in enumerate(sessions):
            start = time.perf_counter()
            s.run(None, feeds)
            times[k].append(time.perf_counter() - start)
    return [statistics.median(t) for t in times]


def _half(model: Path, folder: Path) -> Path:
    import onnx

    out = folder / f"{model.stem}.fp16.onnx"
    onnx.save(to_fp16(onnx.load(model)), out)
    return out


def _placement(model: Path, folder: Path, device: str) -> str:
    """A device plan's rewrite run in the DEFAULT order: the copies onnxruntime inserted next to the
    rewrite's, whether the pins held, whether the order is the predicted one, plan / ran peak."""
    analysis = analyse(load_model(model), order="default")
    found = host_nodes(analysis, device)
    plan = planned_document(
        analysis,
        PlanRequest(select=SelectPart(select_distance=2, params=True, host=found)),
    )
    out = folder / f"{model.stem}.placed.onnx"
    write_model(apply_plan(plan, analysis), out, source_dir=model.parent)
    report = run_model(str(out), device, compare_to=str(model), repeat=1, opt_level="disable", order="default")
    planned = plan["summary"]["estimate"]["peak_bytes"]["after"]
    ratio = f"{planned / report.ran_peak_bytes:.4f}" if report.ran_peak_bytes else "-"
    return (
        f"{len(found.nodes)} node(s) on the host ({found.how}), {len(found.copies)} copied; "
        f"{len(report.undone_copies)} copy(ies) inserted next to the rewrite's, pins held: "
        f"{None if report.pins is None else report.pins.holds}, order as predicted: {report.order.matches}, "
        f"plan / ran peak {ratio}"
    )


def main(argv: list[str]) -> int:
    device = argv[argv.index("--device") + 1] if "--device" in argv else "cuda"
    ort = import_onnxruntime(device)
    print(f"onnxruntime {ort.__version__}, providers {ort.get_available_providers()}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for name in SAMPLES:
            model = ROOT / "sample_models" / f"{name}.onnx"
            inputs = ROOT / "sample_models" / f"{name}.inputs.npz"
            feeds = dict(np.load(inputs))
            doc = measure_profile(str(model), device, inputs=str(inputs), repeat=5)
            profile = profile_from_dict(doc, origin=f"measured for {name}")
            analysis = analyse(load_model(model), order="default")
            plan = scheduled_plan(analysis, PlanRequest.of_options(select_distance=2, params=True, profile=profile))
            out = folder / f"{name}.offload.onnx"
            write_model(apply_plan(plan, analysis), out, source_dir=model.parent)
            rewritten = analyse(load_model(out), order="default")
            base, after = _timed([model, out], feeds, device, ort)
            if device in STREAMS:
                base_s, after_s = _timed([model, out], feeds, device, ort, ep_options=STREAMS[device])
                print(f"{name}: copies on their own streams {after_s / base_s:.2f}x (in line {after / base:.2f}x)")
            for precision, source in (("fp32", model), ("fp16", _half(model, folder))):
                print(f"{name} {precision}: {_placement(source, folder, device)}")
            estimate = simulate(analysis, plan, profile=profile)
            original = simulate(analysis, None, profile=None)
            offloaded = simulate(rewritten, None, profile=None)
            for label, path, sim in (
                (name, model, original.peak_before - original.before.resident_device),
                (f"{name} rewritten", out, offloaded.peak_after - offloaded.after.resident_device),
            ):
                rows.append((label, _arena_activations(path, feeds, device, ort), sim, None))
            rows[-1] = (*rows[-1][:3], (after / base, estimate.times.slowdown["serialized"]))
    head = f"{'model':24s} {'arena (activations)':>20s} {'simulated':>12s} {'ratio':>6s}"
    print(head + "   slowdown measured / estimated")
    for label, measured, simulated, slow in rows:
        ratio = simulated / measured if measured else float("nan")
        measured = measured or 0
        extra = f"   {slow[0]:.2f}x / {slow[1]:.2f}x = {slow[1] / slow[0]:.2f}" if slow else ""
        print(f"{label:24s} {measured:>20,d} {simulated:>12,d} {ratio:6.3f}{extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
