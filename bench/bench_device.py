"""Rewrites on a real device provider, side by side: the copies onnxruntime inserts itself, and the
planned peak against the peak of the order that really ran.

For each model (the samples, their fp16 copies, and third-party models that ship inside wheels) and
each execution order: ``offloadctl plan --params --select-distance 10 --execution-order ORDER
--device webgpu`` (the tensors of the nodes WebGPU runs on the CPU kept),
then ``apply`` with order pins and with ``--no-order-pins``, each run on onnxruntime's WebGPU
provider in that order (``run --device webgpu --compare-to``, from the device environment that
``make test-device`` builds). Printed per row:

- ``extra pinned`` / ``extra bare``: the copies onnxruntime inserted next to the rewrite's own
  copies and pins (0 means the plan is not undone on the device);
- ``pins``: whether every pin held in the order that ran; ``ok``: outputs within tolerance;
- ``plan``: the peak ``plan`` reports (under DEFAULT: the rewrite replayed in the DEFAULT walk);
  ``ran``: the device peak of the rewritten model placed as onnxruntime placed it (the copies it
  inserted, the nodes it ran on the CPU) and simulated in the exact order its profile shows
  (``ratio`` = plan / ran; ``moved``: nodes whose place there differs from the order offloadctl
  predicts for the plan's rewrite on that device).

Run: ``python bench/bench_device.py [--json] [--no-download] [--quick]``, with OFFLOADCTL_DEVICE_VENV
naming the device environment (default ``.venv-device``; ``make .venv-device/.installed`` builds it).
Wheels are downloaded with ``pip download --no-deps`` into ``bench/.cache`` (nothing is installed).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import onnx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
from offloadctl.job import Job  # noqa: E402
from offloadctl.loading.placed import HostPlacement  # noqa: E402
from offloadctl.rewriting.preview import placement_of, rewritten_analysis  # noqa: E402

from models import early_host_node_model, to_fp16  # noqa: E402

CACHE = ROOT / "bench" / ".cache"
SAMPLES = ROOT / "sample_models"
WHEEL_DATA = Path(onnx.__file__).parent / "backend" / "test" / "data"
#: (wheel, member, input shapes)
WHEELS = [
    ("rapidocr-onnxruntime==1.4.4", "ch_PP-OCRv4_det_infer.onnx", {"x": [1, 3, 320, 320]}),
    ("rapidocr-onnxruntime==1.4.4", "ch_PP-OCRv4_rec_infer.onnx", {"x": [1, 3, 48, 320]}),
    ("rapidocr-onnxruntime==1.4.4", "ch_ppocr_mobile_v2.0_cls_infer.onnx", {"x": [1, 3, 48, 192]}),
    ("silero-vad==6.2.3", "silero_vad_16k_op15.onnx", {"input": [1, 512], "state": [2, 1, 128]}),
    ("nudenet==3.4.2", "320n.onnx", {"images": [1, 3, 320, 320]}),  # a YOLOv8 detector
    # an OCR model of quantize_dynamic's making: its LSTM is a com.microsoft DynamicQuantizeLSTM
    ("ddddocr==1.6.1", "common_old.onnx", {"input1": [1, 1, 64, 256]}),
]
LIGHT = ["squeezenet", "shufflenet", "resnet50"]


def _device_cli(*args: str | Path) -> subprocess.CompletedProcess:
    venv = Path(os.environ.get("OFFLOADCTL_DEVICE_VENV", ROOT / ".venv-device")).resolve()
    command = " ".join(f"'{a}'" for a in [venv / "bin" / "offloadctl", *args])
    env_file = venv / "vulkan" / "env"
    if env_file.exists():
        command = f". '{env_file}' && {command}"
    return subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=900)


def _cli(*args: str | Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "offloadctl", *map(str, args)], capture_output=True, text=True)


def _wheel_model(wheel: str, member: str) -> Path | None:
    CACHE.mkdir(parents=True, exist_ok=True)
    name = wheel.split("==")[0].replace("-", "_")
    found = sorted(CACHE.glob(f"{name}-*.whl"))
    if not found:
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(CACHE), wheel], capture_output=True
        )
        found = sorted(CACHE.glob(f"{name}-*.whl"))
        if done.returncode or not found:
            print(f"  (skipped {member}: pip could not download {wheel})", file=sys.stderr)
            return None
    out = CACHE / member
    if not out.exists():
        with zipfile.ZipFile(found[-1]) as z:
            entry = next(n for n in z.namelist() if n.endswith("/" + member))
            out.write_bytes(z.read(entry))
    return out


def _cases(folder: Path, download: bool, quick: bool) -> list[tuple[str, Path, list[str]]]:
    cases: list[tuple[str, Path, list[str]]] = []
    for name in ["seed", "mlp", "unet", "transformer", "training"]:
        cases.append((name, SAMPLES / f"{name}.onnx", []))
        half = folder / f"{name}.fp16.onnx"
        onnx.save(to_fp16(onnx.load(SAMPLES / f"{name}.onnx")), half)
        cases.append((f"{name} fp16", half, []))
    # a float16 node the CPU has no float16 kernel for, run there between the Casts onnxruntime appends
    early = folder / "early_host_node.fp16.onnx"
    onnx.save(to_fp16(early_host_node_model()), early)
    cases.append(("early host node fp16", early, []))
    if quick:
        return cases
    for light in LIGHT:
        path = WHEEL_DATA / "light" / f"light_{light}.onnx"
        if path.exists():
            cases.append((light, path, []))
    if download:
        for wheel, member, shapes in WHEELS:
            path = _wheel_model(wheel, member)
            if path is not None:
                pins = [a for n, s in shapes.items() for a in ("--input-shape", f"{n}={','.join(map(str, s))}")]
                cases.append((member.removesuffix(".onnx"), path, pins))
    return cases


def _moved(plan_path: Path, ran: list[str]) -> int:
    """Nodes whose place in the order that ran differs from the order offloadctl predicts for the plan's
    rewrite on the plan's device (placed with the plan's host nodes and copies, in the executor's order):
    the nodes both name, compared place by place."""
    job = Job.of_plan(plan_path, stages=("scheduled",))
    analysis, plan = job.analysis, job.plan
    assert plan is not None
    placement = placement_of(analysis, HostPlacement.of_record(plan["options"]["select"]))
    predicted = [n.name for n in rewritten_analysis(plan, analysis, placement).nodes if n.name]
    common = set(predicted) & set(ran)
    return sum(a != b for a, b in zip([n for n in predicted if n in common], [n for n in ran if n in common]))


def _row(label: str, source: Path, pins: list[str], order: str, folder: Path) -> dict:
    row: dict = {"model": label, "order": order}
    alone = _device_cli("run", source, *pins, "--device", "webgpu", "--execution-order", order, "--repeat", "1")
    if alone.returncode:
        reason = next((x for x in alone.stderr.splitlines() if x.startswith("error:")), "run failed")
        return {**row, "skipped": f"the original does not run on webgpu ({reason[:160]})"}
    plan = folder / f"{label}.{order}.plan.json".replace(" ", "_")
    made = _device_cli(
        "plan", source, *pins, "--params", "--select-distance", "10", "--execution-order", order, "--device", "webgpu",
        "-o", plan,
    )  # fmt: skip
    if not plan.exists():
        return {**row, "error": made.stderr.strip().splitlines()[-1] if made.stderr.strip() else "plan failed"}
    doc = json.loads(plan.read_text())
    peak = doc["summary"]["estimate"]["peak_bytes"]
    row["plan_peak"] = peak["after"]
    for kind, extra in (("pinned", []), ("bare", ["--no-order-pins"])):
        out = folder / f"{label}.{order}.{kind}.onnx".replace(" ", "_")
        applied = _cli("apply", plan, "-o", out, *extra)
        if applied.returncode:
            return {**row, "error": applied.stderr.strip().splitlines()[-1]}
        tolerance = ["--rtol", "1e-2", "--atol", "1e-2"] if "fp16" in label or "half" in label else []
        done = _device_cli(
            "run", out, "--device", "webgpu", "--execution-order", order, "--opt-level", "disable", "--json",
            "--repeat", "1", "--compare-to", source, *tolerance,
        )  # fmt: skip
        if not done.stdout.strip():
            row[f"extra_{kind}"] = None
            row["error"] = next((x for x in done.stderr.splitlines() if x.startswith("error:")), "run failed")
            continue
        report = json.loads(done.stdout)
        row[f"extra_{kind}"] = len(report["plan_undone_by"])
        if kind == "pinned":
            row["pins"] = None if report["order_pins"] is None else report["order_pins"]["holds"]
            row["ok"] = all(c["within_tolerance"] for c in (report["comparison"] or {}).values())
            row["ran_peak"] = report["ran_peak_bytes"]  # run simulates the order that ran
            row["ran_moved"] = _moved(plan, report["ran"])
    if row.get("ran_peak"):
        row["ratio"] = row["plan_peak"] / row["ran_peak"]
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--no-download", action="store_true", help="leave out the models of downloaded wheels")
    parser.add_argument("--quick", action="store_true", help="the samples and their fp16 copies only")
    args = parser.parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-device-") as tmp:
        for label, path, pins in _cases(Path(tmp), not args.no_download, args.quick):
            for order in ("priority", "default"):
                row = _row(label, path, pins, order, Path(tmp))
                rows.append(row)
                if not args.json:
                    _print_row(row)
    if args.json:
        print(json.dumps(rows, indent=1))
    bad = [r for r in rows if r.get("error") or r.get("extra_pinned") or r.get("ok") is False]
    return 1 if bad else 0


def _print_row(row: dict) -> None:
    if row.get("skipped"):
        print(f"{row['model']:32s} {row['order']:8s} skipped: {row['skipped']}", flush=True)
        return
    if row.get("error"):
        print(f"{row['model']:32s} {row['order']:8s} error: {row['error']}", flush=True)
        return
    ratio = f"{row['ratio']:.4f}" if row.get("ratio") else "-"
    print(
        f"{row['model']:32s} {row['order']:8s} extra pinned {row['extra_pinned']!s:>4s} "
        f"bare {row['extra_bare']!s:>4s}  "
        f"pins {row['pins']!s:5s} ok {row['ok']!s:5s} plan {row['plan_peak']:>11,d} ran {row['ran_peak']:>11,d} "
        f"ratio {ratio} (moved {row['ran_moved']})",
        flush=True,
    )


if __name__ == "__main__":
    raise SystemExit(main())
