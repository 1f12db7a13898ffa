"""Inputs are never damaged and figures never mislead: outputs that would overwrite what a command
reads, external data that points elsewhere, permissions of copied data files, and the hostile inputs
that used to end in a traceback.

Each case runs the real command and checks what the user sees (exit 1, one error line with a fix, no
traceback) and what is on disk afterwards (inputs byte for byte as before, nothing new written).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.external_data_helper import set_external_data

from models import IR_VERSION, OPSET, make_model, save, tensor
from test_bad_inputs import assert_clean_failure

SAMPLES = Path(__file__).resolve().parent.parent / "sample_models"


def _snapshot(folder: Path) -> dict[str, bytes]:
    """Every file below ``folder`` (relative path -> bytes); symlinks are recorded as their target."""
    found = {}
    for path in sorted(folder.rglob("*")):
        rel = str(path.relative_to(folder))
        if path.is_symlink():
            found[rel] = b"-> " + os.fsencode(os.readlink(path))
        elif path.is_file():
            found[rel] = path.read_bytes()
    return found


def _externalize(tensor: TensorProto, folder: Path, location: str) -> None:
    """Move a tensor's bytes to ``folder/location`` (appended) and point the tensor there."""
    data = tensor.raw_data or numpy_helper.from_array(numpy_helper.to_array(tensor)).raw_data
    path = folder / location
    offset = path.stat().st_size if path.exists() else 0
    with open(path, "ab") as f:
        f.write(data)
    tensor.ClearField("float_data")
    tensor.raw_data = data
    set_external_data(tensor, location, offset=offset, length=len(data))
    tensor.ClearField("raw_data")
    tensor.data_location = TensorProto.EXTERNAL


def external_model(folder: Path, name: str = "m.onnx") -> Path:
    """y = If(cond, then: (x @ W + c) + B, else: -(x @ W + c)) with three external data files:
    the initializer W in w.bin, the Constant c in c.bin, the If branch's initializer B in b.bin."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "W")
    c = numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "c_value")
    b = numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "B")
    then_branch = helper.make_graph(
        [helper.make_node("Add", ["s", "B"], ["t_out"], name="then_add")], "then", [], [tensor("t_out")], initializer=[b]
    )
    else_branch = helper.make_graph([helper.make_node("Neg", ["s"], ["e_out"], name="else_neg")], "else", [], [tensor("e_out")])
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["a"], name="mm"),
        helper.make_node("Constant", [], ["c"], value=c, name="const_c"),
        helper.make_node("Add", ["a", "c"], ["s"], name="add"),
        helper.make_node("If", ["cond"], ["y"], then_branch=then_branch, else_branch=else_branch, name="branch"),
    ]
    model = make_model(nodes, [tensor("x"), helper.make_tensor_value_info("cond", TensorProto.BOOL, [])], [tensor("y")], initializers=[w])
    graph = model.graph
    _externalize(graph.initializer[0], folder, "w.bin")
    _externalize(graph.node[1].attribute[0].t, folder, "c.bin")
    then_graph = next(a.g for a in graph.node[3].attribute if a.name == "then_branch")
    _externalize(then_graph.initializer[0], folder, "b.bin")
    path = folder / name
    path.write_bytes(model.SerializeToString())
    return path


@pytest.fixture
def ext(tmp_path) -> Path:
    return external_model(tmp_path / "src")


def _plan(run_cli, model: Path, out: Path, *args: str) -> Path:
    res = run_cli("plan", model, "-o", out, *args)
    assert res.exit_code == 0, res.stderr
    return out


# ---------------------------------------------------------------------------------------------------
# An output never overwrites what the command reads
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("data_file", ["w.bin", "c.bin", "b.bin"])
def test_plan_refuses_to_write_over_any_external_data_file(run_cli, ext, data_file):
    before = _snapshot(ext.parent)
    res = run_cli("plan", ext, "-o", ext.parent / data_file)
    assert_clean_failure(res, data_file, "same file as the input")
    assert _snapshot(ext.parent) == before


def test_select_and_simulate_plot_refuse_external_data_files(run_cli, ext):
    before = _snapshot(ext.parent)
    assert_clean_failure(run_cli("select", ext, "-o", ext.parent / "c.bin"), "c.bin")
    assert_clean_failure(run_cli("simulate", ext, "--plot", ext.parent / "b.bin"), "b.bin")
    assert _snapshot(ext.parent) == before


@pytest.mark.parametrize("data_file", ["w.bin", "c.bin", "b.bin"])
def test_apply_refuses_to_write_over_any_external_data_file(run_cli, ext, tmp_path, data_file):
    plan = _plan(run_cli, ext, tmp_path / "p.json")
    before = _snapshot(ext.parent)
    assert_clean_failure(run_cli("apply", plan, "-o", ext.parent / data_file), data_file)
    assert _snapshot(ext.parent) == before


@pytest.mark.parametrize("data_file", ["w.bin", "c.bin", "b.bin"])
def test_apply_refuses_a_model_named_like_a_data_file_it_copies(run_cli, ext, tmp_path, data_file):
    """In another folder, the model and the copy of a data file of the same name would collide."""
    plan = _plan(run_cli, ext, tmp_path / "p.json")
    other = tmp_path / "other"
    other.mkdir()
    before = _snapshot(tmp_path)
    res = run_cli("apply", plan, "-o", other / data_file)
    assert_clean_failure(res, data_file, "would both be written")
    assert _snapshot(tmp_path) == before


def test_outputs_through_symlinks_and_hard_links_are_refused(run_cli, ext, tmp_path):
    (tmp_path / "link.bin").symlink_to(ext.parent / "w.bin")
    os.link(ext, tmp_path / "hard.onnx")
    before = _snapshot(tmp_path)
    assert_clean_failure(run_cli("plan", ext, "-o", tmp_path / "link.bin"), "link.bin", "same file as the input")
    assert_clean_failure(run_cli("plan", ext, "-o", tmp_path / "hard.onnx"), "hard.onnx", "same file as the input")
    plan = tmp_path / "p.json"
    _plan(run_cli, SAMPLES / "seed.onnx", plan)
    before = _snapshot(tmp_path)
    (tmp_path / "plan-link.json").symlink_to(plan)
    assert_clean_failure(run_cli("prefetch", plan, "-o", tmp_path / "plan-link.json"), "same file as the input")
    assert _snapshot(tmp_path) == {**before, "plan-link.json": b"-> " + os.fsencode(str(plan))}


def test_apply_to_another_folder_works_and_copies_every_data_file(run_cli, ext, tmp_path):
    plan = _plan(run_cli, ext, tmp_path / "p.json", "--params", "--select-distance", "0", "--prefetch-distance", "0")
    out = tmp_path / "out" / "m.offload.onnx"
    out.parent.mkdir()
    res = run_cli("apply", plan, "-o", out)
    assert res.exit_code == 0, res.stderr
    for name in ("w.bin", "c.bin", "b.bin"):
        assert (out.parent / name).read_bytes() == (ext.parent / name).read_bytes()
    feeds = {"x": np.ones((4, 8), np.float32), "cond": np.array(True)}
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    want = ort.InferenceSession(str(ext), so, providers=["CPUExecutionProvider"]).run(None, feeds)
    got = ort.InferenceSession(str(out), so, providers=["CPUExecutionProvider"]).run(None, feeds)
    assert got[0].tobytes() == want[0].tobytes()


def test_copied_data_files_keep_their_permissions(run_cli, ext, tmp_path):
    (ext.parent / "w.bin").chmod(0o600)
    (ext.parent / "c.bin").chmod(0o640)
    plan = _plan(run_cli, ext, tmp_path / "p.json")
    out = tmp_path / "out" / "m.onnx"
    out.parent.mkdir()
    assert run_cli("apply", plan, "-o", out).exit_code == 0
    assert stat.S_IMODE((out.parent / "w.bin").stat().st_mode) == 0o600
    assert stat.S_IMODE((out.parent / "c.bin").stat().st_mode) == 0o640


# ---------------------------------------------------------------------------------------------------
# External data that points out of the model's folder
# ---------------------------------------------------------------------------------------------------


def _relocate(model_path: Path, old: str, new: str) -> None:
    model = onnx.load(str(model_path), load_external_data=False)
    from offloadctl.model import iter_tensor_protos

    for t in iter_tensor_protos(model.graph):
        for entry in t.external_data:
            if entry.key == "location" and entry.value == old:
                entry.value = new
    model_path.write_bytes(model.SerializeToString())


@pytest.mark.parametrize("command", ["inspect", "plan", "simulate"])
def test_a_data_file_symlinked_from_elsewhere_is_refused(run_cli, ext, tmp_path, command):
    secret = tmp_path / "secret.bin"
    secret.write_bytes((ext.parent / "b.bin").read_bytes())
    (ext.parent / "b.bin").unlink()
    (ext.parent / "b.bin").symlink_to(secret)
    args = [command, ext] + (["-o", tmp_path / "p.json"] if command == "plan" else [])
    assert_clean_failure(run_cli(*args), "b.bin", "outside the model's folder")
    assert not (tmp_path / "p.json").exists()


def test_apply_never_copies_bytes_from_outside_the_models_folder(run_cli, ext, tmp_path):
    plan = _plan(run_cli, ext, tmp_path / "p.json")
    secret = tmp_path / "secret.bin"
    secret.write_bytes((ext.parent / "w.bin").read_bytes())
    (ext.parent / "w.bin").unlink()
    (ext.parent / "w.bin").symlink_to(secret)
    out = tmp_path / "out" / "m.onnx"
    out.parent.mkdir()
    assert_clean_failure(run_cli("apply", plan, "-o", out), "w.bin", "outside the model's folder")
    assert list(out.parent.iterdir()) == []


@pytest.mark.parametrize("location", ["../outside.bin", "ABSOLUTE"])
def test_locations_that_leave_the_folder_are_refused(run_cli, ext, tmp_path, location):
    target = tmp_path / "outside.bin"
    target.write_bytes((ext.parent / "c.bin").read_bytes())
    location = str(target) if location == "ABSOLUTE" else location
    _relocate(ext, "c.bin", location)
    needle = "absolute path" if Path(location).is_absolute() else "outside the model's folder"
    assert_clean_failure(run_cli("plan", ext, "-o", tmp_path / "p.json"), "'c_value'", needle)
    assert not (tmp_path / "p.json").exists()


def test_a_missing_data_file_inside_an_if_branch_fails_at_planning(run_cli, ext, tmp_path):
    (ext.parent / "b.bin").unlink()
    assert_clean_failure(run_cli("plan", ext, "-o", tmp_path / "p.json"), "b.bin", "'B'", "is missing")
    assert not (tmp_path / "p.json").exists()
