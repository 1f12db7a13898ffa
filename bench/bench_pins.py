"""What order pins cost on the CPU: a rewrite with pins against the same rewrite without, side by side.

For the samples and the third-party wheel models of `bench_time.py`, a plan with weights and
activations (``--params --select-distance 10``) is applied twice, with order pins (what ``apply``
writes) and without (``--no-order-pins``). The original and both rewrites are timed taking turns
in one process, PRIORITY_BASED, at ``--opt-level disable`` and at ``all`` (ConstantFolding off, as
the rewrites ask); the outputs of both rewrites are checked against the original's (bit-identical
at disable, allclose at all). Each row prints pinned / bare and both over the original.

Run: ``python bench/bench_pins.py [--rounds N]`` (``make bench`` runs it). Timings taken while other
work runs are noise.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from bench_time import PLAN, SAMPLES, _third_party  # noqa: E402

from offloadctl.analysis.graph import analyse  # noqa: E402
from offloadctl.loading.model import load_model  # noqa: E402
from offloadctl.planning.make import scheduled_plan  # noqa: E402
from offloadctl.planning.request import PlanRequest  # noqa: E402
from offloadctl.rewriting.rewrite import RewriteOptions, apply_plan  # noqa: E402
from offloadctl.rewriting.writing import write_model  # noqa: E402

LEVELS = {"disable": "ORT_DISABLE_ALL", "all": "ORT_ENABLE_ALL"}


def _session(path: Path, level: str, ort):
    so = ort.SessionOptions()
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, LEVELS[level])
    so.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    so.log_severity_level = 4
    if level == "disable":
        so.add_session_config_entry("session.disable_prepacking", "1")
    providers = ["CPUExecutionProvider"]
    return ort.InferenceSession(str(path), so, providers=providers, disabled_optimizers=["ConstantFolding"])


def _row(label: str, model: Path, feeds: dict, folder: Path, level: str, rounds: int, ort) -> str:
    analysis = analyse(load_model(model))
    plan = scheduled_plan(analysis, PlanRequest.of_options(**PLAN))
    paths = [model]
    for pins in (True, False):
        out = folder / f"{label}.{'pinned' if pins else 'bare'}.onnx"
        write_model(apply_plan(plan, analysis, options=RewriteOptions(order_pins=pins)), out, source_dir=model.parent)
        paths.append(out)
    sessions = [_session(p, level, ort) for p in paths]
    outputs = [s.run(None, feeds) for s in sessions]
    same = all(
        np.array_equal(a, b) if level == "disable" else np.allclose(a, b, rtol=1e-4, atol=1e-5)
        for got in outputs[1:]
        for a, b in zip(outputs[0], got)
    )
    times: list[list[float]] = [[] for _ in sessions]
    for _ in range(rounds):
        for k, s in enumerate(sessions):
            start = time.perf_counter()
            s.run(None, feeds)
            times[k].append(time.perf_counter() - start)
    base, pinned, bare = (statistics.median(t) for t in times)
    return (
        f"{label:14s} {level:8s} {base * 1e3:9.3f} ms  pinned/bare {pinned / bare:5.2f}  "
        f"pinned/original {pinned / base:5.2f}  bare/original {bare / base:5.2f}  outputs {'ok' if same else 'DIFFER'}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40, help="timed runs of each model, taking turns")
    args = parser.parse_args(argv)
    import onnxruntime as ort

    with tempfile.TemporaryDirectory(prefix="offloadctl-bench-pins-") as tmp:
        folder = Path(tmp)
        models = [(n, SAMPLES / f"{n}.onnx", SAMPLES / f"{n}.inputs.npz") for n in ("unet", "transformer", "training")]
        models += [(label, Path(p), Path(i)) for label, p, i in _third_party(folder) if i]
        print(f"order pins on the CPU (onnxruntime {ort.__version__}), medians of {args.rounds} runs taken in turns")
        for level in LEVELS:
            for label, model, inputs in models:
                print(_row(label, model, dict(np.load(inputs)), folder, level, args.rounds, ort))
    return 0


if __name__ == "__main__":
    sys.exit(main())
