"""What copies on a stream of their own cost on the CPU: a rewrite with events and a partition file
against the same rewrite with its copies in line, side by side.

For the samples and the third-party wheel models of `bench_time.py`, a plan with weights and
activations (``--params --select-distance 10``) is written twice, ``apply --copies inline`` and
``apply --copies streams``, and the original and both rewrites are timed taking turns in one
process (PRIORITY_BASED, or DEFAULT with ``--execution-order default``, the order the plan is made
for too; ``--opt-level disable``, the optimizers each rewrite asks to disable). The
CPU provider runs the two logic streams on one thread, so this measures what the gates, fences and
the executor's barriers add, not overlap, which shows on a device alone. Outputs are checked
bit-identical to the original's. Each row prints streams / inline and both over the original.

Run: ``python bench/bench_streams.py [--rounds N] [--execution-order default]`` (``make bench`` runs
it). Timings taken while other work runs are noise.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import onnx  # noqa: E402
from bench_time import PLAN, SAMPLES, _third_party, _timed  # noqa: E402

from offloadctl.analysis.graph import analyse  # noqa: E402
from offloadctl.analysis.order import EXECUTION_ORDERS  # noqa: E402
from offloadctl.cli.ui import foreign_stdout_aside  # noqa: E402
from offloadctl.loading.model import load_model  # noqa: E402
from offloadctl.planning.make import scheduled_plan  # noqa: E402
from offloadctl.planning.request import PlanRequest  # noqa: E402
from offloadctl.rewriting.metadata import session_settings  # noqa: E402
from offloadctl.rewriting.rewrite import RewriteOptions, apply_plan  # noqa: E402
from offloadctl.rewriting.streams import PARTITION_KEY, streams_file, with_events  # noqa: E402
from offloadctl.rewriting.writing import write_model  # noqa: E402
from offloadctl.running.timed import alternate  # noqa: E402


def _session(path: Path, ort, order: str, partition: Path | None = None):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.execution_order = getattr(ort.ExecutionOrder, EXECUTION_ORDERS[order])
    so.log_severity_level = 4
    so.add_session_config_entry("session.disable_prepacking", "1")
    disabled = ["ConstantFolding"]
    if partition is not None:
        so.add_session_config_entry(PARTITION_KEY, str(partition))
        proto = onnx.load(str(path), load_external_data=False)
        disabled = list((session_settings(proto) or {}).get("disabled_optimizers", disabled))
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"], disabled_optimizers=disabled)


def _row(label: str, model: Path, feeds: dict, folder: Path, rounds: int, ort, order: str) -> str:
    analysis = analyse(load_model(model), order=order)
    plan = scheduled_plan(analysis, PlanRequest.of_options(**PLAN))
    inline, streams = folder / f"{label}.inline.onnx", folder / f"{label}.streams.onnx"
    write_model(apply_plan(plan, analysis, options=RewriteOptions()), inline, source_dir=model.parent)
    proto = apply_plan(plan, analysis, options=RewriteOptions())
    partition = streams_file(streams)
    layout = with_events(proto, partition.name, order)
    write_model(proto, streams, source_dir=model.parent)
    partition.write_text(json.dumps(layout.to_json()))
    with foreign_stdout_aside():  # onnxruntime's notes on buffers two streams share
        sessions = [_session(model, ort, order), _session(inline, ort, order), _session(streams, ort, order, partition)]
    outputs = [s.run(None, feeds) for s in sessions]
    same = all(np.array_equal(a, b) for got in outputs[1:] for a, b in zip(outputs[0], got))
    calls = [lambda s=s: _timed(s, feeds) for s in sessions]
    base, in_line, on_streams = (statistics.median(t) for t in alternate(calls, rounds, min_seconds=0.0))
    return (
        f"{label:14s} {base * 1e3:9.3f} ms  streams/inline {on_streams / in_line:5.2f}  "
        f"inline/original {in_line / base:5.2f}  streams/original {on_streams / base:5.2f}  "
        f"events {layout.gates + layout.fences:4d}  outputs {'ok' if same else 'DIFFER'}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40, help="timed runs of each model, taking turns")
    parser.add_argument("--execution-order", choices=sorted(EXECUTION_ORDERS), default="priority")
    args = parser.parse_args(argv)
    import onnxruntime as ort

    with tempfile.TemporaryDirectory(prefix="offloadctl-bench-streams-") as tmp:
        folder = Path(tmp)
        models = [(n, SAMPLES / f"{n}.onnx", SAMPLES / f"{n}.inputs.npz") for n in ("unet", "transformer", "training")]
        models += [(label, Path(p), Path(i)) for label, p, i in _third_party(folder) if i]
        order = args.execution_order
        print(
            f"copies on their own stream on the CPU (onnxruntime {ort.__version__}), {order.upper()} order, "
            f"medians of {args.rounds} runs"
        )
        for label, model, inputs in models:
            print(_row(label, model, dict(np.load(inputs)), folder, args.rounds, ort, order), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
