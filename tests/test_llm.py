"""Language models as users deploy them: dynamic shapes kept, shape points, onnxruntime-genai folders,
int4 weights that stay packed, dimensions that are sums of others. The model is the tiny builder
export kept in sample_models/genai (sample_models/make_genai.py)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import onnx
import pytest

from offloadctl.analysis.graph import analyse
from offloadctl.core.errors import OffloadError
from offloadctl.loading.model import load_model
from offloadctl.planning.make import scheduled_plan
from offloadctl.planning.request import PlanRequest
from offloadctl.rewriting.genai import genai_folder

from conftest import LLAMA_DIMS, SAMPLES

GENAI = SAMPLES / "genai"
FP32 = GENAI / "llama-fp32"
INT4 = GENAI / "llama-int4"
# prefill of 16 tokens into a shared 256-token KV buffer (past_present_share_buffer)
DIMS = LLAMA_DIMS


def _declared(path: Path) -> dict[str, list]:
    model = onnx.load(str(path), load_external_data=False)
    return {v.name: [d.dim_value or d.dim_param for d in v.type.tensor_type.shape.dim] for v in model.graph.input}


def test_genai_apply_writes_a_complete_folder_that_keeps_dynamic_shapes(run_cli, tmp_path):
    plan = tmp_path / "plan.json"
    res = run_cli("plan", FP32 / "model.onnx", *DIMS, "--budget", "650KiB", "--params", "-o", plan)
    assert res.exit_code == 0, res.stderr
    out = tmp_path / "out"
    out.mkdir()
    res = run_cli("apply", plan, "-o", out / "model.onnx", "--json")
    assert res.exit_code == 0, res.stderr
    written = {Path(p).name for p in res.json()["files_written"]}
    assert written == {"model.onnx", "model.onnx.data", "tokenizer.json", "tokenizer_config.json", "genai_config.json"}
    config = json.loads((out / "genai_config.json").read_text())
    decoder = config["model"]["decoder"]
    assert decoder["filename"] == "model.onnx"
    assert decoder["session_options"]["optimization.disable_specified_optimizers"] == "ConstantFolding"
    assert decoder["session_options"]["log_id"] == "onnxruntime-genai"  # the folder's own options kept
    source = json.loads((FP32 / "genai_config.json").read_text())
    assert config["search"] == source["search"]
    # dynamic, as onnxruntime-genai feeds it (offloaded weights join the inputs, to escape constant folding)
    declared = _declared(FP32 / "model.onnx")
    assert {k: v for k, v in _declared(out / "model.onnx").items() if k in declared} == declared
    assert (out / "tokenizer.json").read_bytes() == (FP32 / "tokenizer.json").read_bytes()


def test_genai_options_merge_with_the_folders_own(run_cli, tmp_path):
    folder = tmp_path / "src"
    shutil.copytree(FP32, folder)
    config = json.loads((folder / "genai_config.json").read_text())
    config["model"]["decoder"]["session_options"]["optimization.disable_specified_optimizers"] = "NchwcTransformer"
    (folder / "genai_config.json").write_text(json.dumps(config))
    os.chmod(folder / "tokenizer.json", 0o600)
    plan = tmp_path / "plan.json"
    assert run_cli("plan", folder / "model.onnx", *DIMS, "--budget", "650KiB", "--params", "-o", plan).exit_code == 0
    out = tmp_path / "out"
    out.mkdir()
    assert run_cli("apply", plan, "-o", out / "model.onnx").exit_code == 0
    options = json.loads((out / "genai_config.json").read_text())["model"]["decoder"]["session_options"]
    assert options["optimization.disable_specified_optimizers"] == "NchwcTransformer;ConstantFolding"
    assert (out / "tokenizer.json").stat().st_mode & 0o777 == 0o600  # modes kept


def test_genai_output_in_its_own_folder_is_refused(run_cli, tmp_path):
    folder = tmp_path / "src"
    shutil.copytree(FP32, folder)
    plan = tmp_path / "plan.json"
    assert run_cli("plan", folder / "model.onnx", *DIMS, "--budget", "650KiB", "--params", "-o", plan).exit_code == 0
    before = (folder / "genai_config.json").read_bytes()
    res = run_cli("apply", plan, "-o", folder / "model.offload.onnx")
    assert res.exit_code == 1
    assert "genai_config.json would be overwritten" in res.stderr and "Traceback" not in res.stderr
    assert not (folder / "model.offload.onnx").exists()
    assert (folder / "genai_config.json").read_bytes() == before


def test_genai_apply_makes_its_output_folder_and_removes_it_when_it_fails(run_cli, tmp_path):
    plan = tmp_path / "plan.json"
    assert run_cli("plan", FP32 / "model.onnx", *DIMS, "--budget", "650KiB", "--params", "-o", plan).exit_code == 0
    res = run_cli("apply", plan, "-o", tmp_path / "out" / "model.onnx")  # OUT does not exist yet: a genai folder
    assert res.exit_code == 0, res.stderr
    assert (tmp_path / "out" / "genai_config.json").is_file()
    # one level only, and a failing apply leaves no folder behind
    res = run_cli("apply", plan, "-o", tmp_path / "a" / "b" / "model.onnx")
    assert res.exit_code == 1 and "mkdir -p" in res.stderr
    assert not (tmp_path / "a").exists()
    folder = tmp_path / "src"
    shutil.copytree(FP32, folder)
    plan = tmp_path / "src.plan.json"
    assert run_cli("plan", folder / "model.onnx", *DIMS, "--budget", "650KiB", "--params", "-o", plan).exit_code == 0
    with open(folder / "model.onnx", "ab") as f:  # the model changes after planning: apply refuses the plan
        f.write(b"\x00")
    res = run_cli("apply", plan, "-o", tmp_path / "new" / "model.onnx")
    assert res.exit_code == 1 and "Traceback" not in res.stderr
    assert not (tmp_path / "new").exists()


@pytest.mark.parametrize("name", ["../model.onnx", "/etc/passwd", "sub/../../x.onnx"])
def test_genai_names_outside_the_folder_are_refused(tmp_path, name):
    folder = tmp_path / "src"
    shutil.copytree(FP32, folder)
    config = json.loads((folder / "genai_config.json").read_text())
    config["model"]["vision"] = {"filename": name}
    (folder / "genai_config.json").write_text(json.dumps(config))
    with pytest.raises(OffloadError, match="not a file of the model's folder"):
        genai_folder(folder / "model.onnx")


def test_genai_symlink_out_of_the_folder_is_refused(run_cli, tmp_path):
    folder = tmp_path / "src"
    shutil.copytree(FP32, folder)
    secret = tmp_path / "secret.txt"
    secret.write_text("not for copying")
    (folder / "notes.txt").symlink_to(secret)
    plan = tmp_path / "plan.json"
    assert run_cli("plan", folder / "model.onnx", *DIMS, "--budget", "650KiB", "--params", "-o", plan).exit_code == 0
    out = tmp_path / "out"
    out.mkdir()
    res = run_cli("apply", plan, "-o", out / "model.onnx")
    assert res.exit_code == 1 and "symlink to a file outside" in res.stderr
    assert list(out.iterdir()) == []  # nothing half-written


def test_int4_weights_stay_packed_unless_forced():
    analysis = analyse(
        load_model(
            INT4 / "model.onnx",
            dims={"batch_size": 1, "sequence_length": 16, "past_sequence_length": 256, "total_sequence_length": 256},
        )
    )
    plan = scheduled_plan(analysis, PlanRequest.of_options(select_distance=1, params=True, min_bytes=0))
    packed = [r for r in plan["rejected"] if r["reason"] == "prepacked"]
    assert packed and all("MatMulNBits" in r["detail"] for r in packed)
    assert not any("weight_Q4" in o["tensor"] for o in plan["offloads"])
    name = packed[0]["tensor"]
    forced = scheduled_plan(
        analysis, PlanRequest.of_options(select_distance=1, params=True, min_bytes=0, force=(name,))
    )
    assert name in {o["tensor"] for o in forced["offloads"]}


def test_int4_rewrite_matches_at_all_optimizations(run_cli, tmp_path):
    """With MatMulNBits weights resident, an int4 rewrite is bit-identical to its original at
    ORT_ENABLE_ALL (with them offloaded the logits differed)."""
    plan = tmp_path / "plan.json"
    res = run_cli("plan", INT4 / "model.onnx", *DIMS, "--select-distance", "1", "--params", "-o", plan)
    assert json.loads(plan.read_text())["offloads"]
    out = tmp_path / "out"
    out.mkdir()
    assert run_cli("apply", plan, "-o", out / "model.onnx").exit_code == 0
    res = run_cli(
        "run", out / "model.onnx", "--device", "cpu", "--compare-to", INT4 / "model.onnx", "--opt-level", "all",
        "--repeat", "1", "--json", "--dim", "batch_size=1", "--dim", "sequence_length=8",
        "--dim", "past_sequence_length=256", "--dim", "total_sequence_length=256", "--dim", "kv_cache_dim=16",
    )  # fmt: skip
    assert res.exit_code == 0, res.stderr
    assert all(c["identical"] for c in res.json()["comparison"].values())


OPTIMUM_LIKE = """
<ir_version: 10, opset_import: ["" : 17]>
g (float[batch, seq, 8] x, float[batch, past, 8] past_x, int64[batch, "past + seq"] mask)
  => (float[batch, "past + seq", 8] y) {
  y = Concat <axis = 1> (past_x, x)
}
"""


def test_a_dimension_that_is_a_sum_follows_from_its_parts(write_model, run_cli):
    path = write_model(OPTIMUM_LIKE)
    loaded = load_model(path, dims={"batch": 1, "seq": 4, "past": 6})
    assert loaded.dims["past + seq"] == 10
    assert [d.dim_value for d in loaded.proto.graph.input[2].type.tensor_type.shape.dim] == [1, 10]
    res = run_cli("inspect", path, "--dim", "batch=1", "--dim", "seq=4", "--dim", "past=6", "--dim", "past + seq=11")
    assert res.exit_code == 1
    assert "contradicts its parts, which make it 10" in res.stderr and "Traceback" not in res.stderr


def test_shape_points_plan_at_the_largest_and_every_point_fits(run_cli, tmp_path):
    plan = tmp_path / "plan.json"
    res = run_cli(
        "plan", FP32 / "model.onnx", *DIMS, "--budget", "700KiB", "--params", "-o", plan, "--json",
        "--shape-point", "sequence_length=64", "--shape-point", "sequence_length=1",
    )  # fmt: skip
    assert res.exit_code == 0, res.stderr
    doc = res.json()
    points = doc["shape_points"]
    assert {p["dims"]["sequence_length"] for p in points} == {16, 1}  # the largest, 64, is where it planned
    assert json.loads(plan.read_text())["model"]["dims"]["sequence_length"] == 64
    assert all(p["peak_bytes"]["after"] <= 700 * 1024 for p in points)
    tight = run_cli(
        "simulate",
        FP32 / "model.onnx",
        "--plan",
        plan,
        "--shape-point",
        "sequence_length=1024",
        "--max-peak",
        "1.95MiB",
    )
    assert tight.exit_code == 1 and "shape point(s) are above --max-peak" in tight.stderr
    out = tmp_path / "out"
    out.mkdir()
    assert run_cli("apply", plan, "-o", out / "model.onnx").exit_code == 0
    for seq in (1, 16, 64):  # the rewritten model is right at every point
        ran = run_cli(
            "run", out / "model.onnx", "--device", "cpu", "--compare-to", FP32 / "model.onnx", "--repeat", "1",
            "--dim", "batch_size=1", "--dim", f"sequence_length={seq}", "--dim", "past_sequence_length=256",
            "--dim", "total_sequence_length=256", "--dim", "kv_cache_dim=16", "--execution-order", "default",
        )  # fmt: skip
        assert ran.exit_code == 0, ran.stderr


def test_a_bad_shape_point_is_one_error_and_writes_no_plan(run_cli, tmp_path):
    plan = tmp_path / "plan.json"
    res = run_cli("plan", FP32 / "model.onnx", *DIMS, "--params", "-o", plan, "--shape-point", "no_such_dim=3")
    assert res.exit_code == 1 and "--shape-point no_such_dim=3" in res.stderr and "Traceback" not in res.stderr
    assert not plan.exists()
    res = run_cli("simulate", FP32 / "model.onnx", *DIMS, "--shape-point", "sequence_length")
    assert res.exit_code == 1 and "is not NAME=VALUE" in res.stderr


def test_a_broken_genai_config_is_one_clear_error(run_cli, tmp_path):
    folder = tmp_path / "src"
    shutil.copytree(FP32, folder)
    (folder / "genai_config.json").write_text('{"model": {"decoder": NaN}}')
    res = run_cli("plan", folder / "model.onnx", *DIMS, "-o", tmp_path / "p.json")
    plan = tmp_path / "p.json"
    if res.exit_code == 0:  # planning does not read the config; apply does
        res = run_cli("apply", plan, "-o", tmp_path / "out" / "model.onnx")
    assert res.exit_code == 1 and "Traceback" not in res.stderr
    assert "onnxruntime-genai config" in res.stderr and "genai_config.json is not JSON: NaN" in res.stderr
    (folder / "genai_config.json").write_text('{"model": ')
    res = run_cli("apply", plan, "-o", tmp_path / "out2" / "model.onnx")
    assert res.exit_code == 1 and "is not JSON (line 1" in res.stderr
