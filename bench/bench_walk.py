"""What runs under each execution order, side by side: the peak a plan reports against the peak of the
written rewrite as onnxruntime walked it, and onnxruntime's own CPU arena against its replica.

For each model (the samples and third-party models that ship inside wheels) and each order, two plans:
``plan --params --select-distance 10`` and ``plan --params --budget B``, B halfway between the lower
bound and the peak. Each is applied with its order pins (what
``apply`` writes by default) and run on the CPU provider in that order with profiling. Printed per row:

- ``figure``: the peak after that ``plan`` reports (under DEFAULT: the written rewrite in the DEFAULT
  walk, pins and copies included);
- ``replayed``: the rewrite simulated in the order its profile shows (``ratio`` = figure / replayed);
- ``moved``: original nodes whose place among the original nodes differs from the original's walk;
- ``arena``: onnxruntime's CPU arena (C API ``MaxInUse``, DEFAULT only: the C API cannot set the
  order) for the original and the rewrite, the bytes the rewrite's copies write and whether they
  explain the growth (``run --measure-memory --compare-to``); ``replica``: offloadctl's replay of
  that arena (``simulate --plan`` under a profile ``offloadctl profile --device cpu`` measured, for
  the kernel scratch), and replica / arena for each.

Run: ``python bench/bench_walk.py [--json] [--quick] [--no-download]``. Wheels are downloaded with
``pip download --no-deps`` into ``bench/.cache`` (nothing is installed).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from bench_device import _wheel_model  # noqa: E402

from offloadctl.analysis.graph import analyse  # noqa: E402
from offloadctl.loading.model import load_model  # noqa: E402
from offloadctl.simulation.result import simulate  # noqa: E402

SAMPLES = ROOT / "sample_models"
#: (wheel, member, input shapes)
WHEELS = [
    ("rapidocr-onnxruntime==1.4.4", "ch_PP-OCRv4_det_infer.onnx", {"x": [1, 3, 640, 640]}),
    ("rapidocr-onnxruntime==1.4.4", "ch_PP-OCRv4_rec_infer.onnx", {"x": [1, 3, 48, 320]}),
    ("ddddocr==1.6.1", "common_det.onnx", {"images": [1, 3, 416, 416]}),
]
MIB = 1 << 20


def _cli(*args: str | Path) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "offloadctl", *map(str, args), "--json"], capture_output=True, text=True
    )
    try:
        doc = json.loads(done.stdout)
    except json.JSONDecodeError:
        return {"passed": False, "error": (done.stderr.strip().splitlines() or ["no output"])[-1]}
    return doc


def _ran(model: Path, pins: list[str], order: str) -> list[str]:
    """The node names in the order a CPU session ran them (``run --json``'s profiled ``ran``)."""
    return _cli("run", model, *pins, "--device", "cpu", "--execution-order", order, "--repeat", "1").get("ran", [])


def _replayed(rewrite: Path, shapes: dict, order: str, ran: list[str]) -> int:
    loaded = load_model(rewrite, input_shapes=shapes or None)
    index = {n.name: i for i, n in enumerate(loaded.proto.graph.node)}
    sequence = [index[name] for name in ran if name in index]
    return simulate(analyse(loaded, order=order, sequence=sequence), None, profile=None).peak_after


def _moved(original: list[str], ran: list[str]) -> int:
    names = set(original)
    kept = [n for n in ran if n in names]
    return sum(a != b for a, b in zip(original, kept))


def _growth(rewrite: Path, source: Path, pins: list[str]) -> dict:
    """`run --measure-memory --compare-to`: the two arenas (C API, DEFAULT) and what the copies explain."""
    doc = _cli(
        "run", rewrite, "--compare-to", source, "--device", "cpu", "--execution-order", "default",
        "--measure-memory", "--repeat", "1", *pins,
    )  # fmt: skip
    return doc.get("memory_growth") or {}


def _row(label: str, source: Path, shapes: dict, order: str, kind: str, folder: Path) -> dict:
    pins = [a for n, s in shapes.items() for a in ("--input-shape", f"{n}={','.join(map(str, s))}")]
    plan = folder / f"{kind}.{order}.plan.json"
    base = ["plan", source, *pins, "--execution-order", order, "--params", "-o", plan]
    made = _cli(*base, "--select-distance", "10")
    if kind == "budget" and "peak_bytes" in made:  # halfway between the lower bound and the peak
        budget = (made["lower_bound_bytes"] + made["peak_bytes"]["before"]) // 2
        made = _cli(*base, "--budget", str(budget))
    row: dict = {"model": label, "order": order, "plan": kind}
    if not plan.exists() or "peak_bytes" not in made:
        return {**row, "error": made.get("error", "plan failed")}
    row["passed"] = made["passed"]
    row["before"], row["figure"] = made["peak_bytes"]["before"], made["peak_bytes"]["after"]
    rewrite = folder / f"{kind}.{order}.offload.onnx"
    applied = _cli("apply", plan, "-o", rewrite)
    if not rewrite.exists():
        return {**row, "error": applied.get("error", "apply failed")}
    ran = _ran(rewrite, [], order)
    row["replayed"] = _replayed(rewrite, shapes, order, ran)
    row["moved"] = _moved(_ran(source, pins, order), ran)
    if order == "default":
        growth = _growth(rewrite, source, [])
        row["arena_before"], row["arena_after"] = growth.get("original_bytes"), growth.get("rewrite_bytes")
        row["copy_bytes"], row["explained"] = growth.get("copy_bytes"), growth.get("explained")
        measured = folder / "cpu.profile.json"  # the kernel scratch the arena holds (Conv's unfolded input)
        _cli("profile", source, *pins, "--device", "cpu", "--repeat", "2", "-o", measured)
        profile = ["--profile", measured] if measured.exists() else []
        simulated = _cli("simulate", source, *pins, "--plan", plan, "--execution-order", order, *profile)
        replica = simulated.get("cpu_peak_bytes") or {}
        row["replica_before"], row["replica_after"] = replica.get("before"), replica.get("after")
    return row


def _cases(download: bool, quick: bool) -> list[tuple[str, Path, dict]]:
    cases = [(name, SAMPLES / f"{name}.onnx", {}) for name in ["unet", "transformer", "training"]]
    cases.append(("bert", SAMPLES / "bert" / "model.onnx", {}))
    if quick or not download:
        return cases
    for wheel, member, shapes in WHEELS:
        path = _wheel_model(wheel, member)
        if path is not None:
            cases.append((member.removesuffix(".onnx"), path, shapes))
    return cases


def _fmt(value: int | None) -> str:
    return "-" if value is None else f"{value / MIB:8.2f}"


def _ratio(a: int | None, b: int | None) -> str:
    return "-" if not a or not b else f"{a / b:.3f}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--quick", action="store_true", help="the samples only")
    parser.add_argument("--no-download", action="store_true")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, path, shapes in _cases(not args.no_download, args.quick):
            for order in ("priority", "default"):
                for kind in ("distance", "budget"):
                    folder = Path(tmp) / f"{label}.{order}.{kind}".replace(" ", "_")
                    folder.mkdir()
                    rows.append(_row(label, path, shapes, order, kind, folder))
                    if not args.json:
                        _print(rows[-1])
    if args.json:
        print(json.dumps(rows, indent=1))
    return 0


def _print(r: dict) -> None:
    head = f"{r['model']:<28} {r['order']:<8} {r['plan']:<8}"
    if "error" in r:
        print(f"{head} {r['error']}")
        return
    verdict = "PASSED" if r["passed"] else "FAILED"
    text = (
        f"{head} {verdict} before {_fmt(r['before'])} figure {_fmt(r['figure'])} replayed {_fmt(r['replayed'])} "
        f"ratio {_ratio(r['figure'], r['replayed'])} moved {r['moved']}"
    )
    if "arena_after" in r:
        text += (
            f" | arena {_fmt(r['arena_before'])} -> {_fmt(r['arena_after'])} MiB (copies {_fmt(r['copy_bytes'])}, "
            f"{'explained' if r['explained'] else 'NOT explained'}), replica/arena "
            f"{_ratio(r['replica_before'], r['arena_before'])} {_ratio(r['replica_after'], r['arena_after'])}"
        )
    print(text, flush=True)


if __name__ == "__main__":
    sys.exit(main())
