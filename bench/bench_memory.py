"""Fidelity of the memory model: the CPU figure simulated against onnxruntime's own, side by side.

For every model below, on onnxruntime's CPU execution provider at ``--opt-level disable`` (what
``offloadctl run`` verifies with):

* **measured**: onnxruntime's CPU arena, read through its C API (``AllocatorGetStats``): ``MaxInUse``
  after one run of a fresh session, in the DEFAULT order (the C API cannot set another), and ``InUse``
  once the session is made (the weights);
* **simulated**: ``simulate``'s ``cpu_peak_bytes`` for the same model in the same order: onnxruntime's
  allocation planner and BFC arena replayed (`offloadctl.simulation.ortcpu`), with the kernel scratch
  of each node from onnxruntime's node statistics (what ``offloadctl profile`` records);
* for the samples also the PRIORITY_BASED order, where the measured figure is the smallest arena limit
  the run fits in (Python, ``kSameAsRequested``) and the simulated one the arena's region total.

Models: the samples, original and rewritten by a distance plan (weights too) and by a budget plan
(60% of the CPU figure); generated transformer-like models (`gen_large.py`); and third-party models
that ship inside wheels: the onnx wheel's backend test models (real architectures whose weights are
made at run time), and, when pip can download them, the models in the rapidocr-onnxruntime,
silero-vad, nudenet and ddddocr wheels (``pip download --no-deps``, unpacked into ``bench/.cache``;
nothing is installed).

Each row prints simulated / measured; the goal is within 2% (0.98 to 1.02), and the script exits 1
when a row is outside it. Memory figures do not depend on machine load.

Run: ``python bench/bench_memory.py [--json] [--no-download]`` (``make bench`` runs it).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import onnx  # noqa: E402

from offloadctl.analysis.graph import analyse  # noqa: E402
from offloadctl.loading.model import load_model  # noqa: E402
from offloadctl.planning.make import scheduled_plan  # noqa: E402
from offloadctl.planning.request import PlanRequest  # noqa: E402
from offloadctl.rewriting.rewrite import apply_plan  # noqa: E402
from offloadctl.running.allocator import SessionSpec, measure_by_limit, measure_by_stats, node_scratch  # noqa: E402
from offloadctl.running.inputs import generate_inputs, input_specs  # noqa: E402
from offloadctl.simulation.arena import ArenaConfig  # noqa: E402
from offloadctl.simulation.ortcpu import cpu_peak, declared_shapes  # noqa: E402
from offloadctl.simulation.timing import count_scratch_by_name  # noqa: E402

from gen_large import LargeModelConfig, generate  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_models"
SAMPLE_NAMES = ["seed", "mlp", "training", "unet", "transformer"]
CACHE = Path(__file__).resolve().parent / ".cache"
GENERATED = {
    "gen-4x64": LargeModelConfig(layers=4, hidden=64, seq=32),
    "gen-8x128": LargeModelConfig(layers=8, hidden=128, seq=64, nodes_per_layer=20),
}
WHEEL_DATA = Path(onnx.__file__).parent / "backend" / "test" / "data"
#: Models inside downloadable wheels: (wheel, member, input shapes to run at).
DOWNLOADED = [
    ("rapidocr-onnxruntime==1.4.4", "ch_PP-OCRv4_det_infer.onnx", {"x": [1, 3, 320, 320]}),
    ("rapidocr-onnxruntime==1.4.4", "ch_PP-OCRv4_rec_infer.onnx", {"x": [1, 3, 48, 320]}),
    ("rapidocr-onnxruntime==1.4.4", "ch_ppocr_mobile_v2.0_cls_infer.onnx", {"x": [1, 3, 48, 192]}),
    ("silero-vad==6.2.3", "silero_vad_16k_sequence.onnx", {"input": [4, 576], "h": [1, 1, 128], "c": [1, 1, 128]}),
    ("silero-vad==6.2.3", "silero_vad_openvino_16k.onnx", {"input": [1, 576], "state": [2, 1, 128]}),
    ("silero-vad==6.2.3", "silero_vad_16k_op15.onnx", {"input": [1, 512], "state": [2, 1, 128]}),
    ("nudenet==3.4.2", "320n.onnx", {"images": [1, 3, 320, 320]}),  # a YOLOv8 detector
    # an OCR model of quantize_dynamic's making: its LSTM is a com.microsoft DynamicQuantizeLSTM
    ("ddddocr==1.6.1", "common_old.onnx", {"input1": [1, 1, 64, 256]}),
]
DISABLE = {"session.disable_prepacking": "1"}


@dataclass
class Case:
    label: str
    path: Path
    feeds: dict[str, np.ndarray]


#: Inputs a model needs at a given value (silero-vad's sample rate, a scalar of unknown rank there).
FIXED = {"sr": np.array(16000, dtype=np.int64)}


def _feeds(path: Path, shapes: dict[str, list[int]] | None = None) -> dict[str, np.ndarray]:
    npz = path.with_name(path.stem + ".inputs.npz")
    if npz.exists():
        return dict(np.load(npz))
    loaded = load_model(path, input_shapes=shapes or None, normalize=False)
    specs = [s for s in input_specs(loaded.proto) if s.name not in FIXED]
    feeds, _ = generate_inputs(specs, seed=0)
    for spec in input_specs(loaded.proto):
        if spec.name in FIXED:
            feeds[spec.name] = FIXED[spec.name]
    return feeds


def _simulated(case: Case, order: str, ort, config: ArenaConfig | None = None):
    pins = {k: list(v.shape) for k, v in case.feeds.items()}
    analysis = analyse(load_model(case.path, input_shapes=pins), order=order)
    count_scratch_by_name(analysis, node_scratch(case.path, case.feeds, ort=ort, order=order))
    shapes = declared_shapes(onnx.load(str(case.path), load_external_data=False))
    return cpu_peak(analysis, shapes=shapes, config=config)


def _sample_cases(folder: Path) -> list[Case]:
    cases = []
    for name in SAMPLE_NAMES:
        path = SAMPLES / f"{name}.onnx"
        feeds = _feeds(path)
        cases.append(Case(name, path, feeds))
        analysis = analyse(load_model(path))
        peak = cpu_peak(analysis).peak_bytes
        plans = {
            "distance": scheduled_plan(analysis, PlanRequest.of_options(select_distance=2, params=True)),
            "budget": scheduled_plan(analysis, PlanRequest.of_options(budget=int(peak * 0.6), params=True)),
        }
        for label, plan in plans.items():
            if not plan["offloads"]:
                continue
            out = folder / f"{name}.{label}.onnx"
            onnx.save(apply_plan(plan, analysis), str(out))
            cases.append(Case(f"{name} ({label} plan)", out, feeds))
    return cases


def _generated_cases(folder: Path) -> list[Case]:
    cases = []
    for label, config in GENERATED.items():
        path = folder / f"{label}.onnx"
        generate(path, config)
        cases.append(Case(label, path, _feeds(path)))
    return cases


def _wheel_cases() -> list[Case]:
    paths = sorted((WHEEL_DATA / "light").glob("light_*.onnx"))
    paths += [WHEEL_DATA / "pytorch-converted" / n / "model.onnx" for n in ("test_PixelShuffle", "test_Softmin")]
    return [Case(f"onnx wheel: {p.stem if p.name != 'model.onnx' else p.parent.name}", p, _feeds(p)) for p in paths]


def _downloaded_cases() -> list[Case]:
    cases = []
    CACHE.mkdir(exist_ok=True)
    for wheel, member, shapes in DOWNLOADED:
        target = CACHE / member
        if not target.exists():
            name = wheel.split("==")[0].replace("-", "_")
            found = sorted(CACHE.glob(f"{name}-*.whl"))
            if not found:
                done = subprocess.run(
                    [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(CACHE), wheel],
                    capture_output=True,
                    text=True,
                )
                found = sorted(CACHE.glob(f"{name}-*.whl"))
                if done.returncode != 0 or not found:
                    print(f"  (skipped {member}: pip could not download {wheel})")
                    continue
            with zipfile.ZipFile(found[0]) as archive:
                inner = next(n for n in archive.namelist() if n.endswith("/" + member))
                with archive.open(inner) as src, open(target, "wb") as dst:
                    shutil.copyfileobj(src, dst)
        cases.append(Case(f"{wheel.split('==')[0]}: {member}", target, _feeds(target, shapes)))
    return cases


def _row(case: Case, folder: Path, ort) -> dict:
    (measured,) = measure_by_stats(SessionSpec(str(case.path), "cpu", config_entries=DISABLE), case.feeds, ort=ort)
    simulated = _simulated(case, "default", ort)
    return {
        "model": case.label,
        "order": "default",
        "measured_bytes": measured.peak_bytes,
        "measured_weights": measured.in_use_after_creation,
        "simulated_bytes": simulated.peak_bytes,
        "simulated_weights": simulated.weight_bytes,
        "ratio": simulated.peak_bytes / measured.peak_bytes,
    }


def _priority_row(case: Case, folder: Path, ort) -> dict:
    spec = SessionSpec(str(case.path), "cpu", config_entries=DISABLE)
    measured = measure_by_limit(spec, case.feeds, ort=ort)
    simulated = _simulated(case, "priority", ort, ArenaConfig(extend_strategy="kSameAsRequested"))
    return {
        "model": case.label,
        "order": "priority",
        "measured_bytes": measured.peak_bytes,
        "measured_weights": measured.in_use_after_creation,
        "simulated_bytes": simulated.arena_bytes,
        "simulated_weights": simulated.weight_bytes,
        "ratio": simulated.arena_bytes / measured.peak_bytes,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--no-download", action="store_true", help="leave out the models of downloaded wheels")
    args = parser.parse_args(argv)
    import onnxruntime as ort

    rows = []
    with tempfile.TemporaryDirectory(prefix="offloadctl-bench-memory-") as tmp:
        folder = Path(tmp)
        samples = _sample_cases(folder)
        cases = samples + _generated_cases(folder) + _wheel_cases()
        if not args.no_download:
            cases += _downloaded_cases()
        for case in cases:
            rows.append(_row(case, folder, ort))
        for case in samples:
            if "plan)" not in case.label:
                rows.append(_priority_row(case, folder, ort))
    bad = [r for r in rows if not 0.98 <= r["ratio"] <= 1.02]
    if args.json:
        print(json.dumps({"onnxruntime": ort.__version__, "rows": rows, "outside_2pct": len(bad)}, indent=1))
    else:
        print(
            f"CPU arena peak, simulated / measured (onnxruntime {ort.__version__}, CPU provider, --opt-level disable)"
        )
        print(f"{'model':52s} {'order':8s} {'measured':>12s} {'simulated':>12s} {'ratio':>7s}  weights (meas / sim)")
        for r in rows:
            mark = "" if 0.98 <= r["ratio"] <= 1.02 else "  <-- outside 2%"
            print(
                f"{r['model'][:52]:52s} {r['order']:8s} {r['measured_bytes']:>12,d} {r['simulated_bytes']:>12,d} "
                f"{r['ratio']:7.4f}  {r['measured_weights']:,} / {r['simulated_weights']:,}{mark}"
            )
        ratios = [r["ratio"] for r in rows]
        exact = sum(1 for r in rows if r["measured_bytes"] == r["simulated_bytes"])
        print(
            f"{len(rows)} rows: ratio {min(ratios):.4f} to {max(ratios):.4f}; {exact} exact to the byte; "
            f"{len(bad)} outside 2%"
        )
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
