"""Fusions kept (``plan --opt-level all``): what a rewrite of the optimized graph costs on the CPU, side by side.

For a GPT-2-style stack of self-attention blocks (the transformer sample), a BERT exported by torch (the BERT
sample) and a Llama exported by onnxruntime-genai's builder (``sample_models/genai/llama-fp32``), on onnxruntime's
CPU execution provider:

1. ``offloadctl plan MODEL --params --budget B --opt-level all`` (B about three quarters of the peak)
   plans the graph onnxruntime runs at ``all`` and ``offloadctl apply`` rewrites it (the copy mode the plan chose);
2. the same plan is made without ``--opt-level`` and applied (the graph as exported, run at ``disable``);
3. four sessions take turns in short blocks, with the settings ``offloadctl run`` uses (PRIORITY_BASED, each
   rewrite's recorded session settings and partition file): the original at ``ORT_ENABLE_ALL``, the original at
   ``ORT_DISABLE_ALL``, the fused rewrite at ``ORT_DISABLE_ALL`` (what its metadata asks), the same plan applied
   with ``--copies streams`` (its partition file set) and the plain rewrite at ``ORT_DISABLE_ALL``.

Each row prints the two rewrites' median time over the original's at ``all`` (what a user served before
offloading), with the nodes each graph has, and checks outputs: both fused rewrites allclose to the original at
``all``, the plain rewrite bit-identical to the original at ``disable``. Timings taken while other work runs
are noise: compare the ratios of one run, on a quiet machine.

Run: ``python bench/bench_fusions.py [--repeat N] [--json]`` (``make bench`` runs it).
"""

from __future__ import annotations

import argparse
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

from offloadctl.cli.ui import foreign_stdout_aside
from offloadctl.loading.model import load_model
from offloadctl.rewriting.streams import PARTITION_KEY, checked_streams
from offloadctl.running.inputs import generate_inputs, input_specs, load_inputs
from offloadctl.running.sessions import create_session, feeds_for, import_onnxruntime, required_settings, session_config
from offloadctl.running.timed import alternate

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_models"
OFFLOADCTL = [sys.executable, "-m", "offloadctl"]
GENAI_DIMS = ["batch_size=1", "sequence_length=16", "past_sequence_length=256", "total_sequence_length=256"]

#: name, model, the pins and budget planned at (about three quarters of the peak), the inputs (None: generated)
MODELS: list[tuple[str, Path, list[str], Path | None]] = [
    (
        "gpt2-style (transformer sample)",
        SAMPLES / "transformer.onnx",
        ["--budget", "700KiB"],
        SAMPLES / "transformer.inputs.npz",
    ),
    ("bert (torch export)", SAMPLES / "bert" / "model.onnx", ["--budget", "75KiB"], None),
    (
        "llama (genai builder)",
        SAMPLES / "genai" / "llama-fp32" / "model.onnx",
        [*(flag for dim in [*GENAI_DIMS, "kv_cache_dim=16"] for flag in ("--dim", dim)), "--budget", "560KiB"],
        None,
    ),
]


def _offloadctl(*args: str) -> dict[str, Any]:
    done = subprocess.run([*OFFLOADCTL, *args, "--json"], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"offloadctl {' '.join(args)} failed:\n{done.stderr}")
    return json.loads(done.stdout)


def _plan(model: Path, pins: list[str], folder: Path, name: str, opt_level: str | None) -> Path:
    plan = folder / f"{name}.plan.json"
    extra = ["--opt-level", opt_level] if opt_level else []
    _offloadctl("plan", str(model), *pins, "--params", *extra, "-o", str(plan))
    return plan


def _apply(plan: Path, name: str, *copies: str) -> tuple[Path, str]:
    out = plan.with_name(f"{name}.offload.onnx")
    applied = _offloadctl("apply", str(plan), "-o", str(out), *copies)
    return out, str(applied["copy_mode"])


def _session(path: Path, level: str, ort: Any) -> Any:
    proto = onnx.load(str(path), load_external_data=False)
    config = session_config(required_settings(proto, path), "cpu", opt_level=level, ort=ort, order="priority")
    checked = checked_streams(str(path), proto, "priority")
    if checked is not None:  # as offloadctl run sets it: the partition file the metadata names
        config.sess_options.add_session_config_entry(PARTITION_KEY, checked[0])
    return create_session(str(path), config, "cpu", ort=ort)


def _feeds(model: Path, inputs: Path | None, pins: list[str]) -> dict[str, np.ndarray]:
    """The inputs given, or generated at the pins (as ``offloadctl run`` generates them)."""
    dims = {k: int(v) for k, v in (flag.split("=") for flag in pins if "=" in flag and "KiB" not in flag)}
    specs = input_specs(load_model(str(model), dims=dims, normalize=False).proto)
    if inputs is not None:
        return dict(load_inputs(str(inputs), specs, str(model)))
    feeds, _ = generate_inputs(specs)
    return feeds


def _timed(session: Any, feeds: dict[str, np.ndarray]) -> float:
    start = time.perf_counter()
    session.run(None, feeds)
    return time.perf_counter() - start


def _nodes(path: Path) -> int:
    return len(onnx.load(str(path), load_external_data=False).graph.node)


def measure(name: str, model: Path, pins: list[str], inputs: Path | None, repeat: int) -> dict[str, Any]:
    """One model's row: both rewrites timed against the original at ``all``, outputs checked."""
    ort = import_onnxruntime("cpu")
    with tempfile.TemporaryDirectory(prefix="bench-fusions-") as tmp:
        folder = Path(tmp)
        fused_plan = _plan(model, pins, folder, "fused", "all")
        fused, fused_mode = _apply(fused_plan, "fused")
        streams, _ = _apply(fused_plan, "streams", "--copies", "streams")
        plain, plain_mode = _apply(_plan(model, pins, folder, "plain", None), "plain")
        feeds_all = _feeds(model, inputs, pins)
        paths = [model, model, fused, streams, plain]
        levels = ["all", "disable", "disable", "disable", "disable"]
        with foreign_stdout_aside():  # onnxruntime's "X reused by Y as input" lines of the streams session
            sessions = [_session(p, level, ort) for p, level in zip(paths, levels)]
            feeds = [feeds_for(s, feeds_all, str(p), "the inputs") for s, p in zip(sessions, paths)]
            outputs = [s.run(None, f) for s, f in zip(sessions, feeds)]
        fused_close = all(
            np.allclose(a, b, rtol=1e-5, atol=1e-5) for k in (2, 3) for a, b in zip(outputs[k], outputs[0])
        )
        plain_identical = all(np.array_equal(a, b) for a, b in zip(outputs[4], outputs[1]))
        calls = [lambda s=s, f=f: _timed(s, f) for s, f in zip(sessions, feeds)]
        with foreign_stdout_aside():
            medians = [statistics.median(t) for t in alternate(calls, repeat)]
        nodes = {"original": _nodes(model), "fused": _nodes(fused), "plain": _nodes(plain)}
    base = medians[0]
    return {
        "model": name,
        "nodes": nodes,
        "copies": {"fused": fused_mode, "plain": plain_mode},
        "original_disable_over_all": medians[1] / base,
        "fused_over_all": medians[2] / base,
        "fused_streams_over_all": medians[3] / base,
        "plain_over_all": medians[4] / base,
        "fused_allclose_to_all": fused_close,
        "plain_identical_to_disable": plain_identical,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = [measure(*m, repeat=args.repeat) for m in MODELS]
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(
            f"{'model':32} {'nodes orig/fused/plain':>22} {'orig@disable':>12} {'fused':>7} {'streams':>8} "
            f"{'plain':>7}  checks"
        )
        for r in rows:
            n = r["nodes"]
            checks = f"fused allclose={r['fused_allclose_to_all']} plain identical={r['plain_identical_to_disable']}"
            print(
                f"{r['model']:32} {n['original']:>10}/{n['fused']}/{n['plain']:<7} "
                f"{r['original_disable_over_all']:>11.2f}x {r['fused_over_all']:>6.2f}x "
                f"{r['fused_streams_over_all']:>7.2f}x {r['plain_over_all']:>6.2f}x  "
                f"{checks} (copies {r['copies']['fused']}/{r['copies']['plain']})"
            )
        print("times are each session's median over the original's at ORT_ENABLE_ALL, timed side by side")
    if not all(r["fused_allclose_to_all"] and r["plain_identical_to_disable"] for r in rows):
        raise SystemExit("a rewrite's outputs differ from its original's")


if __name__ == "__main__":
    main()
