"""Fusions kept (``plan --opt-level``, `offloadctl.running.optimize`): the plan is of the graph onnxruntime
optimizes for the plan's device, written beside the plan; apply rewrites that graph, on streams too, and the
rewrite runs at ``disable`` (its metadata says so, and `run` holds to it). Outputs are held to onnxruntime's own
graph bit for bit and to the original at the optimized level within tolerance."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from offloadctl.contract.document import read_plan
from offloadctl.core.errors import OffloadError
from offloadctl.running.optimize import CPU_ONLY, optimized_model, optimized_path
from offloadctl.running.sessions import read_session_settings

from conftest import LLAMA_DIMS, SAMPLES

TRANSFORMER = SAMPLES / "transformer.onnx"
BERT = SAMPLES / "bert" / "model.onnx"
UNET = SAMPLES / "unet.onnx"


def _ops(path: Path) -> set[tuple[str, str]]:
    return {(n.domain, n.op_type) for n in onnx.load(str(path), load_external_data=False).graph.node}


def _plan(run_cli, model: Path, plan: Path, *extra: str) -> dict:
    made = run_cli("plan", model, "-o", plan, "--params", *extra, "--json")
    assert made.exit_code == 0, made.stderr
    return json.loads(made.stdout)


def test_a_plan_at_all_is_of_the_fused_graph_and_its_streams_rewrite_runs_at_disable(run_cli, tmp_path):
    plan = tmp_path / "plan.json"
    _plan(run_cli, BERT, plan, "--budget", "75KiB", "--opt-level", "all", "--device", "cuda")
    fused = optimized_path(plan)
    assert fused == tmp_path / "plan.optimized.onnx" and fused.is_file()
    document = read_plan(plan)
    record = document["model"]["optimized"]
    assert record["opt_level"] == "all" and record["device"] == "cuda" and record["from"] == str(BERT)
    assert set(record["disabled_optimizers"]) == set(CPU_ONLY)
    assert document["model"]["path"] == str(fused) and document["model"]["sizes_from_run"] is not None
    ops = _ops(fused)
    assert ("com.microsoft", "SkipLayerNormalization") in ops  # fused: what CUDA has kernels for
    assert not {op for op in ops if op[1] in ("FusedGemm", "FusedConv") or op[0] == "com.microsoft.nchwc"}
    assert len(onnx.load(str(fused)).graph.node) < len(onnx.load(str(BERT)).graph.node)

    out = tmp_path / "bert.offload.onnx"
    applied = run_cli("apply", plan, "-o", out, "--copies", "streams", "--json")
    assert applied.exit_code == 0, applied.stderr
    assert json.loads(applied.stdout)["copy_mode"] == "streams"
    settings = read_session_settings(str(out))
    assert settings["graph_optimization_level"] == "ORT_DISABLE_ALL"
    assert settings["optimized"]["opt_level"] == "all" and settings["streams"]["partition_file"]

    same = run_cli("run", out, "--device", "cpu", "--compare-to", fused, "--json")
    assert same.exit_code == 0, same.stderr
    report = json.loads(same.stdout)
    assert all(c["identical"] for c in report["comparison"].values())  # onnxruntime's own graph, bit for bit
    assert report["copy_streams"]["streams"] == 2

    original = run_cli("run", out, "--device", "cpu", "--compare-to", BERT, "--json")
    assert original.exit_code == 0, original.stderr  # against the original at all: within tolerance
    assert not all(c["identical"] for c in json.loads(original.stdout)["comparison"].values())

    again = run_cli("run", out, "--device", "cpu", "--opt-level", "all")
    assert again.exit_code == 1
    assert "--opt-level all" in again.stderr and "run it with --opt-level disable" in again.stderr


def test_the_original_at_all_matches_the_in_line_rewrite_of_its_fused_graph(run_cli, tmp_path):
    plan = tmp_path / "plan.json"
    _plan(run_cli, TRANSFORMER, plan, "--budget", "700KiB", "--opt-level", "all")
    out = tmp_path / "t.offload.onnx"
    assert run_cli("apply", plan, "-o", out, "--copies", "inline").exit_code == 0
    feeds = dict(np.load(SAMPLES / "transformer.inputs.npz"))
    feeds = {k: -v if v.dtype.kind == "f" else v for k, v in feeds.items()}  # negative values too
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    expected = ort.InferenceSession(str(TRANSFORMER), so, providers=["CPUExecutionProvider"]).run(None, feeds)
    settings = read_session_settings(str(out))
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # as its metadata says
    so.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    session = ort.InferenceSession(
        str(out), so, providers=["CPUExecutionProvider"], disabled_optimizers=settings.get("disabled_optimizers", [])
    )
    for _ in range(2):  # a second run too
        got = session.run(None, feeds)
        for a, b in zip(got, expected):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    assert any(n.op_type == "MemcpyFromHost" for n in onnx.load(str(out)).graph.node)


def test_ascend_gets_basic_at_most_and_the_plan_says_so(run_cli, tmp_path):
    plan = tmp_path / "plan.json"
    made = run_cli("plan", TRANSFORMER, "-o", plan, "--params", "--budget=700KiB", "--opt-level=all", "--device=ascend")
    assert made.exit_code == 0, made.stderr
    assert "planned at --opt-level basic, not all" in made.stderr
    assert read_plan(plan)["model"]["optimized"]["opt_level"] == "basic"
    assert not {domain for domain, _ in _ops(optimized_path(plan)) if domain}  # standard operators only
    assert {domain for domain, _ in _ops(optimized_model(TRANSFORMER, tmp_path / "all.onnx", "all").path) if domain}


def test_the_cpu_graph_has_cpu_fusions_and_the_cuda_graph_has_none(tmp_path):
    cpu = optimized_model(UNET, tmp_path / "cpu.onnx", "all")
    cuda = optimized_model(UNET, tmp_path / "cuda.onnx", "all", "cuda")
    assert cpu.disabled == () and set(cuda.disabled) == set(CPU_ONLY)
    assert {domain for domain, _ in _ops(cpu.path)} & {"com.microsoft", "com.microsoft.nchwc"}
    assert not {domain for domain, _ in _ops(cuda.path) if domain}


def test_the_next_step_plans_the_model_asked_for_at_its_level(run_cli, tmp_path):
    done = _plan(run_cli, TRANSFORMER, tmp_path / "plan.json", "--opt-level", "all")
    command = done["next_step"]["command"]
    assert command.startswith(f"offloadctl plan {TRANSFORMER} --opt-level all ")
    assert "optimized" not in command and "--sizes-from-run" in command


def test_the_original_given_for_a_plan_of_its_fused_graph_names_the_file_to_pass(run_cli, tmp_path):
    plan = tmp_path / "plan.json"
    _plan(run_cli, TRANSFORMER, plan, "--budget", "700KiB", "--opt-level", "extended")
    done = run_cli("simulate", TRANSFORMER, "--plan", plan)
    assert done.exit_code == 1
    assert "--opt-level extended" in done.stderr and str(optimized_path(plan)) in done.stderr


def test_optimizing_refuses_disable_and_a_model_onnxruntime_refuses(tmp_path):
    with pytest.raises(OffloadError, match="cannot optimize at level 'disable'"):
        optimized_model(TRANSFORMER, tmp_path / "x.onnx", "disable")
    bad = tmp_path / "bad.onnx"
    model = onnx.load(str(TRANSFORMER))
    model.graph.node[0].op_type = "NoSuchOperator"
    onnx.save(model, str(bad))
    with pytest.raises(OffloadError, match="onnxruntime could not optimize") as caught:
        optimized_model(bad, tmp_path / "x.onnx", "all")
    assert caught.value.hint == "plan without --opt-level"
    assert not (tmp_path / "x.onnx").exists()  # nothing half-written


def test_a_failed_plan_leaves_no_optimized_graph_and_keeps_an_earlier_one(run_cli, tmp_path):
    plan = tmp_path / "plan.json"
    fused = optimized_path(plan)
    failed = run_cli("plan", TRANSFORMER, "-o", plan, "--params", "--budget", "1KiB", "--opt-level", "all")
    assert (
        failed.exit_code == 1
        and f"lower bound 160.00 KiB (163840 bytes) of {TRANSFORMER} (at --opt-level all)" in failed.stderr
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing of its own left behind

    _plan(run_cli, TRANSFORMER, plan, "--budget", "700KiB", "--opt-level", "all")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    again = run_cli("plan", TRANSFORMER, "-o", plan, "--params", "--budget", "1KiB", "--opt-level", "basic")
    assert again.exit_code == 1
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # the earlier plan still holds
    assert read_plan(plan)["model"]["path"] == str(fused)


def test_opt_level_with_a_plan_written_to_a_fifo_is_refused_before_any_work(run_cli, tmp_path):
    fifo = tmp_path / "plan.pipe"
    os.mkfifo(fifo)
    done = run_cli("plan", TRANSFORMER, "-o", fifo, "--opt-level", "all")
    assert done.exit_code == 1 and "is not a file" in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.pipe"]


def test_a_plan_of_a_genai_models_fused_graph_is_written_as_a_genai_folder_run_at_disable(run_cli, tmp_path):
    source = SAMPLES / "genai" / "llama-fp32"
    plan = tmp_path / "plan.json"
    _plan(run_cli, source / "model.onnx", plan, *LLAMA_DIMS, "--budget", "560KiB", "--opt-level", "all")
    out = tmp_path / "out"
    done = run_cli("apply", plan, "-o", out / "model.onnx")
    assert done.exit_code == 0, done.stderr
    # the source folder's tokenizer and config, not its weights file: the rewrite has its own
    assert sorted(p.name for p in out.iterdir()) == [
        "genai_config.json", "model.onnx", "plan.optimized.onnx.data", "tokenizer.json", "tokenizer_config.json",
    ]  # fmt: skip
    config = json.loads((out / "genai_config.json").read_text())
    assert config["model"]["decoder"]["filename"] == "model.onnx"
    assert config["model"]["decoder"]["session_options"]["graph_optimization_level"] == "ORT_DISABLE_ALL"
