"""What the guards against onnxruntime's multi-stream in-place defect cost (`offloadctl.rewriting.guards`).

Per model and order, ``plan --params --select-distance 10 --copies streams`` is written twice by
``apply``: as it is (with its guards) and with the guards left out. Printed side by side:

- ``guards`` and the nodes they add (an ``Identity`` each, and under DEFAULT the order pin that holds it);
- the device peak ``simulate REWRITE`` quotes (the order the two-stream executor runs) and its CPU arena
  replica, with and without the guards;
- the guarded rewrite on the CPU provider with its partition file: onnxruntime's own arena peak (C API
  ``MaxInUse``, ``run --measure-memory``) and whether the outputs are bit-identical to the original's.

Run: ``python bench/bench_guards.py [--quick] [--no-download]`` (wheels via ``pip download --no-deps`` into
``bench/.cache``; nothing is installed).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from unittest import mock

import onnx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from bench_device import _wheel_model  # noqa: E402
from bench_streams_memory import LLAMA_DIMS, WHEELS  # noqa: E402
from bench_walk import _cli  # noqa: E402

from offloadctl.job import Job  # noqa: E402
from offloadctl.rewriting.guards import GUARD_PREFIX  # noqa: E402
from offloadctl.rewriting.rewrite import RewriteOptions  # noqa: E402

SAMPLES = ROOT / "sample_models"
KIB = 1 << 10


def _write(plan: Path, out: Path, guarded: bool) -> None:
    job = Job.of_plan(plan, stages=("scheduled",))
    options = RewriteOptions(copies="streams")
    if guarded:
        job.write_rewrite(out, options=options)
    else:
        with mock.patch("offloadctl.rewriting.streams.in_place_hazards", lambda nodes, graph: []):
            job.write_rewrite(out, options=options)


def _figures(rewrite: Path, pins: list[str], order: str) -> tuple[int | None, int | None]:
    done = _cli("simulate", rewrite, "--execution-order", order, *pins)
    return (done.get("peak_bytes") or {}).get("after"), (done.get("cpu_peak_bytes") or {}).get("after")


def _row(label: str, source: Path, pins: list[str], order: str, folder: Path) -> str:
    plan = folder / f"{order}.plan.json"
    made = _cli("plan", source, *pins, "--params", "--select-distance", "10", "--copies", "streams",
                "--execution-order", order, "-o", plan)  # fmt: skip
    if not plan.exists():
        return f"{label:<28} {order:<8} {made.get('error', 'plan failed')}"
    guarded, bare = folder / f"{order}.guarded.onnx", folder / f"{order}.bare.onnx"
    _write(plan, guarded, True)
    _write(plan, bare, False)
    with_guards, without = (
        onnx.load(str(guarded), load_external_data=False),
        onnx.load(str(bare), load_external_data=False),
    )
    guards = sum(n.name.startswith(GUARD_PREFIX) for n in with_guards.graph.node)
    added = len(with_guards.graph.node) - len(without.graph.node)
    device, replica = _figures(guarded, pins, order)
    device0, replica0 = _figures(bare, pins, order)
    ran = _cli("run", guarded, "--device", "cpu", "--execution-order", order, "--compare-to", source,
               "--measure-memory", "--repeat", "1", *pins)  # fmt: skip
    arena = next((m.get("peak_bytes") for m in ran.get("measured_memory") or [] if m.get("device") == "cpu"), None)
    same = bool(ran.get("comparison")) and all(c.get("identical") for c in ran["comparison"].values())

    def kib(value: int | None) -> str:
        return "-" if value is None else f"{value / KIB:9.1f}"

    return (
        f"{label:<28} {order:<8} guards {guards:2d} (+{added:2d} nodes of {len(without.graph.node):5d}) | "
        f"device peak {kib(device)} vs {kib(device0)} KiB without | CPU replica {kib(replica)} vs {kib(replica0)} "
        f"KiB | onnxruntime's arena {kib(arena)} KiB | outputs {'identical' if same else ran.get('error', 'DIFFER')}"
    )


def _cases(download: bool, quick: bool) -> list[tuple[str, Path, list[str]]]:
    cases = [(n, SAMPLES / f"{n}.onnx", []) for n in ("mlp", "unet", "transformer", "training")]
    cases.append(("bert", SAMPLES / "bert" / "model.onnx", []))
    llama = SAMPLES / "genai" / "llama-fp32" / "model.onnx"
    if llama.exists():
        cases.append(
            ("llama (genai builder)", llama, [a for d, v in LLAMA_DIMS.items() for a in ("--dim", f"{d}={v}")])
        )
    if quick or not download:
        return cases
    for wheel, member, shapes in [*WHEELS, ("silero-vad==6.2.3", "silero_vad_openvino_16k.onnx", {})]:
        path = _wheel_model(wheel, member)
        if path is not None:
            pins = [a for n, s in shapes.items() for a in ("--input-shape", f"{n}={','.join(map(str, s))}")]
            cases.append((member.removesuffix(".onnx"), path, pins))
    return cases


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the samples only")
    parser.add_argument("--no-download", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        for label, path, pins in _cases(not args.no_download, args.quick):
            for order in ("priority", "default"):
                folder = Path(tmp) / label.replace(" ", "_").replace("(", "").replace(")", "")
                folder.mkdir(exist_ok=True)
                print(_row(label, path, pins, order, folder), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
