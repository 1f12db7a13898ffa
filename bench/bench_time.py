"""Fidelity of the time model on CPU: simulated against measured, side by side in one run.

For every sample model (with its ``.inputs.npz``) and a few generated transformer-like models
(`gen_large.py`, small sizes, generated inputs), on onnxruntime's CPU execution provider:

1. ``offloadctl profile`` measures the model (node times, executor overheads, copy fit) at the
   benchmark's ``--opt-level`` (``disable`` unless given);
2. a plan with weights and activations (``--params --select-distance 10``) is made with that
   profile (above ``disable`` it keeps what onnxruntime's fusions take in) and applied;
3. the original and the rewritten model are timed without profiling, side by side (taking turns
   in short blocks, so both see the same machine load), with the settings ``offloadctl run`` uses
   (PRIORITY_BASED, ``--opt-level``);
4. the simulator estimates the original's baseline and the rewritten model's time with copies in
   line (onnxruntime today), under the measured profile and under the datasheet ``cpu`` profile.

The models: the samples, generated transformer-like models, and (unless --quick) third-party models that
ship inside wheels (OCR detection and classification from rapidocr-onnxruntime, silero-vad), downloaded
by bench/bench_memory.py and pinned to one shape.

Each row prints simulated / measured for both figures and both profiles, and the estimated slowdown
(rewritten over original, simulated) over the slowdown timed side by side; the goal for the measured
profile is 0.85 to 1.15. Under a measured profile the simulated baseline is the profile's own median
latency, so the first figure compares two timings of one model taken minutes apart; the slowdown
compares timings taken side by side, and is the figure `plan` prints. On the CPU provider
MemcpyToHost/MemcpyFromHost are real memcpys, so the second figure checks the copy model. Timings
taken while other work runs are noise: compare ratios from one run, and re-run on a quiet machine
for figures to publish.

Run: ``python bench/bench_time.py [--repeat N] [--quick] [--json]`` (``make bench`` runs it).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import onnx  # noqa: E402

from offloadctl.analysis.graph import analyse  # noqa: E402
from offloadctl.core.errors import OffloadError  # noqa: E402
from offloadctl.loading.model import load_model  # noqa: E402
from offloadctl.planning.make import scheduled_plan  # noqa: E402
from offloadctl.planning.request import PlanRequest  # noqa: E402
from offloadctl.rewriting.rewrite import apply_plan  # noqa: E402
from offloadctl.rewriting.writing import write_model  # noqa: E402
from offloadctl.running.inputs import generate_inputs, input_specs, load_inputs  # noqa: E402
from offloadctl.running.profiler import measure_profile  # noqa: E402
from offloadctl.running.sessions import create_session, feeds_for, import_onnxruntime, required_settings, session_config
from offloadctl.running.timed import alternate  # noqa: E402
from offloadctl.simulation.profiles import load_profile, write_profile  # noqa: E402
from offloadctl.simulation.result import simulate  # noqa: E402

from gen_large import LargeModelConfig, generate  # noqa: E402

__all__ = ["main"]

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_models"
SAMPLE_NAMES = ("seed", "mlp", "unet", "transformer", "training")
GENERATED = {
    "gen-4x64": LargeModelConfig(layers=4, hidden=64, seq=16),
    "gen-8x256": LargeModelConfig(layers=8, hidden=256, seq=64),
}
PLAN = {"select_distance": 10, "params": True}
GOAL = 0.15
OPT_LEVEL = ["disable"]  # the level the side-by-side timings run at (--opt-level)


def _session(path: str, ort, threads: int):
    settings = required_settings(load_model(path).proto, path)
    config = session_config(settings, "cpu", opt_level=OPT_LEVEL[0], ort=ort)
    config.sess_options.intra_op_num_threads = threads
    return create_session(path, config, "cpu", ort=ort)


def _latencies(
    paths: list[str], feeds: dict, repeat: int, ort, threads: int, *, min_seconds: float = 2.0
) -> list[float]:
    """Median wall-clock latency of each model, timed side by side (`offloadctl.running.timed.alternate`)."""
    calls = []
    for path in paths:
        session = _session(path, ort, threads)
        inputs = feeds_for(session, feeds, path, "the inputs")
        calls.append(lambda s=session, f=inputs: _timed(s, f))
    return [statistics.median(t) for t in alternate(calls, repeat, min_seconds=min_seconds)]


def _timed(session, feeds) -> float:
    start = time.perf_counter()
    session.run(None, feeds)
    return time.perf_counter() - start


#: Third-party models that ship inside wheels (bench/bench_memory.py downloads them), pinned to one shape.
THIRD_PARTY = {
    "ocr-det": ("ch_PP-OCRv4_det_infer.onnx", {"x": [1, 3, 320, 320]}),
    "ocr-cls": ("ch_ppocr_mobile_v2.0_cls_infer.onnx", {"x": [1, 3, 48, 192]}),
    "silero-vad": ("silero_vad_openvino_16k.onnx", {"input": [1, 576], "state": [2, 1, 128]}),
}


def _third_party(folder: Path) -> list[tuple[str, str, str | None]]:
    """The wheel models, each saved with its inputs pinned (so every size is known) and its inputs."""
    try:
        from bench_memory import _downloaded_cases
    except ImportError:  # pragma: no cover - bench_memory sits beside this script
        return []
    cached = {case.path.name: case for case in _downloaded_cases()}
    found = []
    for label, (member, shapes) in THIRD_PARTY.items():
        case = cached.get(member)
        if case is None:
            continue
        pinned = load_model(case.path, input_shapes=shapes, normalize=False).proto
        path = folder / f"{label}.onnx"
        onnx.save(pinned, str(path))
        inputs = folder / f"{label}.inputs.npz"
        np.savez(inputs, **generate_inputs(input_specs(pinned), seed=0)[0])
        found.append((label, str(path), str(inputs)))
    return found


def _extra(folder: Path, paths: list[str], dims: dict[str, int]) -> list[tuple[str, str, str | None]]:
    """Models given with --model (an exporter's language model, say), their dimensions pinned by --dim."""
    found = []
    for k, given in enumerate(paths):
        label = Path(given).stem if Path(given).stem != "model" else Path(given).parent.name or f"model{k}"
        pinned = load_model(given, dims=dims, normalize=False).proto
        onnx.external_data_helper.load_external_data_for_model(pinned, str(Path(given).parent))  # saved below
        path = folder / f"extra{k}-{label}.onnx"
        onnx.save(pinned, str(path), save_as_external_data=True, location=path.name + ".data")
        inputs = folder / f"extra{k}-{label}.inputs.npz"
        np.savez(inputs, **generate_inputs(input_specs(pinned), seed=0)[0])
        found.append((label, str(path), str(inputs)))
    return found


def _models(folder: Path, quick: bool) -> list[tuple[str, str, str | None]]:
    """(label, model path, inputs .npz or None) for every benchmark model."""
    models = [(name, str(SAMPLES / f"{name}.onnx"), str(SAMPLES / f"{name}.inputs.npz")) for name in SAMPLE_NAMES]
    for label, config in GENERATED.items():
        if quick and label != "gen-4x64":
            continue
        path = folder / f"{label}.onnx"
        generate(path, config)
        models.append((label, str(path), None))
    if not quick:
        models += _third_party(folder)
    return models


def _row(label: str, model: str, inputs: str | None, folder: Path, repeat: int, ort, threads: int) -> dict:
    measured_path = folder / f"{label}.profile.json"
    doc = measure_profile(model, "cpu", inputs=inputs, repeat=repeat, threads=threads, opt_level=OPT_LEVEL[0])
    write_profile(measured_path, doc)
    measured = load_profile(str(measured_path))
    datasheet = load_profile("cpu")

    analysis = analyse(load_model(model))
    # made with the measured profile: above --opt-level disable it keeps what onnxruntime's fusions take in
    plan = scheduled_plan(analysis, PlanRequest.of_options(profile=measured, **PLAN))
    rewritten_path = folder / f"{label}.offload.onnx"
    write_model(apply_plan(plan, analysis), rewritten_path, source_dir=Path(model).parent)
    rewritten = analyse(load_model(rewritten_path))

    specs = input_specs(analysis.loaded.proto)
    feeds = load_inputs(inputs, specs, model) if inputs else generate_inputs(specs)[0]
    latency, latency_rewritten = _latencies([model, str(rewritten_path)], feeds, max(repeat, 50), ort, threads)

    row: dict = {
        "model": label,
        "nodes": analysis.num_positions,
        "copies": sum(1 for n in rewritten.nodes if n.op_type in ("MemcpyToHost", "MemcpyFromHost")),
        "measured_s": {"baseline": latency, "inline": latency_rewritten},
        "profiles": {},
    }
    for name, profile in (("measured", measured), ("cpu", datasheet)):
        base = simulate(analysis, profile=profile).times
        inline = simulate(rewritten, profile=profile).times
        row["profiles"][name] = {
            "baseline_s": base.baseline,
            "inline_s": inline.serialized,
            "measured_nodes": inline.measured_nodes,
            "copies_s": inline.serialized - inline.baseline,
            "ratio": {
                "baseline": base.baseline / latency,
                "inline": inline.serialized / latency_rewritten,
                "copies": (inline.serialized - inline.baseline) / (latency_rewritten - latency)
                if latency_rewritten > latency and inline.serialized > inline.baseline
                else None,
                # the slowdown `plan` prints against the slowdown timed side by side: free of the
                # machine's drift between the profile and these timings
                "slowdown": (inline.serialized / base.baseline) / (latency_rewritten / latency),
            },
        }
    return row


def _within(ratio: float) -> bool:
    return abs(ratio - 1.0) <= GOAL


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--repeat", type=int, default=30, help="profiled runs per measurement (timed runs: at least 50)"
    )
    parser.add_argument("--quick", action="store_true", help="the samples and the smallest generated model only")
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="intra-op threads of every session (0: onnxruntime's default; 1 keeps a busy machine's noise down)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    parser.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="PATH",
        help="also measure this model (repeatable), e.g. an exporter's language model; pin its dimensions with --dim",
    )
    parser.add_argument("--dim", action="append", default=[], metavar="NAME=VALUE", help="a dimension of --model")
    parser.add_argument("--only-extra", action="store_true", help="measure the --model models only")
    parser.add_argument(
        "--opt-level",
        choices=["disable", "basic", "extended", "all"],
        default="disable",
        help="onnxruntime's optimizations for the profile and the side-by-side timings: 'all' checks the estimate "
        "where fusions and prepacked weights change what a rewrite costs",
    )
    args = parser.parse_args(argv)
    OPT_LEVEL[0] = args.opt_level
    ort = import_onnxruntime("cpu")
    rows: list[dict] = []
    failed: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="offloadctl-bench-time-") as tmp:
        folder = Path(tmp)
        dims = {k: int(v) for k, v in (d.split("=", 1) for d in args.dim)}
        models = [] if args.only_extra else _models(folder, args.quick)
        for label, model, inputs in models + _extra(folder, args.model, dims):
            try:
                rows.append(_row(label, model, inputs, folder, args.repeat, ort, args.threads))
            except OffloadError as exc:  # a measurement the machine's noise spoiled: say so, go on
                failed.append({"model": label, "error": exc.message})
                print(f"{label}: {exc.message}", file=sys.stderr)
                continue
            if not args.json:
                print(f"measured {label}", file=sys.stderr)
    ratios = [r["profiles"]["measured"]["ratio"][k] for r in rows for k in ("baseline", "inline")]
    doc = {
        "device": "cpu",
        "onnxruntime": ort.__version__,
        "plan": PLAN,
        "intra_op_num_threads": args.threads,
        "goal": f"measured-profile ratios within 1 +/- {GOAL}",
        "within_goal": not failed and all(_within(r) for r in ratios),
        "slowdown_within_goal": not failed
        and all(_within(r["profiles"]["measured"]["ratio"]["slowdown"]) for r in rows),
        "rows": rows,
        "failed": failed,
    }
    if args.json:
        print(json.dumps(doc, indent=1))
        return 0
    from rich.console import Console
    from rich.table import Table

    threads = f"{args.threads} intra-op thread(s)" if args.threads else "default intra-op threads"
    table = Table(title=f"simulated / measured time on CPU, {threads} (1.00 = exact)", show_edge=False)
    for col in (
        "model",
        "nodes",
        "copies",
        "measured base",
        "measured inline",
        "measured profile: base",
        "inline",
        "(copies)",
        "slowdown",
        "datasheet cpu: base",
        "inline ",
        "slowdown ",
    ):
        table.add_column(col, justify="left" if col == "model" else "right")
    for r in rows:
        m, c = r["profiles"]["measured"]["ratio"], r["profiles"]["cpu"]["ratio"]

        def mark(x: float) -> str:
            return f"{x:.2f}" if _within(x) else f"[bold red]{x:.2f}[/]"

        table.add_row(
            r["model"],
            str(r["nodes"]),
            str(r["copies"]),
            f"{r['measured_s']['baseline'] * 1e3:.3f} ms",
            f"{r['measured_s']['inline'] * 1e3:.3f} ms",
            mark(m["baseline"]),
            mark(m["inline"]),
            "-" if m["copies"] is None else f"{m['copies']:.2f}",
            mark(m["slowdown"]),
            f"{c['baseline']:.2f}",
            f"{c['inline']:.2f}",
            f"{c['slowdown']:.2f}",
        )
    console = Console(width=None if sys.stdout.isatty() else 132)
    console.print(table)
    console.print(
        "(copies): the time copies add, simulated / measured (the rewritten model's latency minus the original's); "
        "slowdown: the estimated slowdown (rewritten / original, simulated) / the slowdown timed side by side"
    )
    console.print(
        f"measured-profile ratios within ±{GOAL:.0%}: times {'yes' if doc['within_goal'] else 'no'}, "
        f"slowdowns {'yes' if doc['slowdown_within_goal'] else 'no'} "
        "(timings on a busy machine are noise: re-run on a quiet one)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
