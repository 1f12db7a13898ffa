"""Inputs are never damaged and figures never mislead: outputs that would overwrite what a command
reads, external data that points elsewhere, permissions of copied data files, and the hostile inputs
that used to end in a traceback.

Each case runs the real command and checks what the user sees (exit 1, one error line with a fix, no
traceback) and what is on disk afterwards (inputs byte for byte as before, nothing new written).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import stat
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.external_data_helper import set_external_data
from test_bad_inputs import assert_clean_failure

from offloadctl.contract.document import read_plan
from offloadctl.planning.request import FilterPart, PlanRequest, PrefetchPart, SelectPart

from models import IR_VERSION, OPSET, make_model, save, tensor

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
        [helper.make_node("Add", ["s", "B"], ["t_out"], name="then_add")],
        "then",
        [],
        [tensor("t_out")],
        initializer=[b],
    )
    else_branch = helper.make_graph(
        [helper.make_node("Neg", ["s"], ["e_out"], name="else_neg")], "else", [], [tensor("e_out")]
    )
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["a"], name="mm"),
        helper.make_node("Constant", [], ["c"], value=c, name="const_c"),
        helper.make_node("Add", ["a", "c"], ["s"], name="add"),
        helper.make_node("If", ["cond"], ["y"], then_branch=then_branch, else_branch=else_branch, name="branch"),
    ]
    model = make_model(
        nodes,
        [tensor("x"), helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [tensor("y")],
        initializers=[w],
    )
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


@pytest.mark.parametrize("mode", [0o600, 0o640, 0o644])
def test_a_rewritten_model_keeps_the_permissions_of_its_source(run_cli, tmp_path, mode):
    import offloadctl

    model = tmp_path / "seed.onnx"
    shutil.copyfile(SAMPLES / "seed.onnx", model)
    model.chmod(mode)
    plan = tmp_path / "p.json"
    assert run_cli("plan", model, "-o", plan, "--select-distance", "1").exit_code == 0
    assert run_cli("apply", plan, "-o", tmp_path / "out.onnx").exit_code == 0
    assert stat.S_IMODE((tmp_path / "out.onnx").stat().st_mode) == mode
    analysis = offloadctl.analyse(model)
    offloadctl.apply(offloadctl.make_plan(analysis, select_distance=1), analysis, tmp_path / "api.onnx")
    assert stat.S_IMODE((tmp_path / "api.onnx").stat().st_mode) == mode


def test_a_model_over_2_gib_keeps_the_permissions_of_its_source_in_both_files(tmp_path):
    from offloadctl.rewriting.writing import write_model

    weight = numpy_helper.from_array(np.ones((32, 32), np.float32), "w")  # above onnx's 1 KiB external threshold
    proto = make_model([helper.make_node("Neg", ["w"], ["y"])], [], [tensor("y", (32, 32))], initializers=[weight])
    out = tmp_path / "big.onnx"
    written = write_model(proto, out, source_dir=tmp_path, max_embedded_bytes=10, mode=0o600)
    assert written == [tmp_path / "big.onnx.data"]
    assert stat.S_IMODE(out.stat().st_mode) == 0o600 == stat.S_IMODE(written[0].stat().st_mode)


# ---------------------------------------------------------------------------------------------------
# External data that points out of the model's folder
# ---------------------------------------------------------------------------------------------------


def _relocate(model_path: Path, old: str, new: str) -> None:
    model = onnx.load(str(model_path), load_external_data=False)
    from offloadctl.core.onnxutil import iter_tensor_protos

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


# ---------------------------------------------------------------------------------------------------
# Hostile inputs that used to end in a traceback
# ---------------------------------------------------------------------------------------------------


def _sparse_initializer_model(path: Path) -> Path:
    values = numpy_helper.from_array(np.array([1.0, 2.0], np.float32), "S")
    indices = numpy_helper.from_array(np.array([0, 5], np.int64), "S_indices")
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node("Neg", ["a"], ["b"], name="neg"),
        helper.make_node("Add", ["b", "S"], ["y"], name="add"),
    ]
    graph = helper.make_graph(nodes, "g", [tensor("x")], [tensor("y")])
    graph.sparse_initializer.append(helper.make_sparse_tensor(values, indices, [4, 8]))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    return save(model, path)


def test_sparse_initializers_count_at_their_dense_size_and_stay_on_the_device(run_cli, tmp_path):
    path = _sparse_initializer_model(tmp_path / "sparse.onnx")
    inspect = run_cli("inspect", path, "--json")
    assert inspect.exit_code == 0, inspect.stderr
    assert inspect.json()["weights"]["bytes"] == 4 * 8 * 4
    sim = run_cli("simulate", path, "--json")
    assert sim.exit_code == 0, sim.stderr
    assert sim.json()["resident_weight_bytes"]["before"] == 128
    plan_path = _plan(
        run_cli, path, tmp_path / "p.json", "--params", "--select-distance", "0", "--prefetch-distance", "0"
    )
    plan = read_plan(plan_path)
    assert {r["tensor"]: r["reason"] for r in plan["rejected"]}["S"] == "not-copyable"
    out = tmp_path / "o.onnx"
    assert run_cli("apply", plan_path, "-o", out).exit_code == 0
    res = run_cli("run", out, "--device", "cpu", "--compare-to", path, "--json")
    assert res.exit_code == 0, res.stderr
    assert all(c["identical"] for c in res.json()["comparison"].values())


def test_a_sparse_constant_is_never_planned_so_the_plan_always_applies(run_cli, tmp_path):
    sparse = helper.make_sparse_tensor(
        numpy_helper.from_array(np.array([1.0], np.float32), "v"),
        numpy_helper.from_array(np.array([3], np.int64), "i"),
        [4, 8],
    )
    nodes = [
        helper.make_node("Constant", [], ["C"], sparse_value=sparse, name="const"),
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node("Neg", ["a"], ["b"], name="neg_b"),
        helper.make_node("Neg", ["b"], ["c"], name="neg_c"),
        helper.make_node("Add", ["c", "C"], ["y"], name="add"),
    ]
    path = save(make_model(nodes, [tensor("x")], [tensor("y")]), tmp_path / "m.onnx")
    plan = _plan(run_cli, path, tmp_path / "p.json", "--params", "--select-distance", "0", "--prefetch-distance", "0")
    assert {r["tensor"]: r["reason"] for r in read_plan(plan)["rejected"]}["C"] == "not-copyable"
    res = run_cli("apply", plan, "-o", tmp_path / "o.onnx")
    assert res.exit_code == 0, res.stderr


@pytest.mark.parametrize("where", ["initializer", "value_info-of-an-input"])
def test_an_element_type_onnx_does_not_define(run_cli, tmp_path, where):
    if where == "initializer":
        w = numpy_helper.from_array(np.ones((4, 8), np.float32), "W")
        w.data_type = 99
        model = make_model(
            [helper.make_node("Add", ["x", "W"], ["y"], name="add")],
            [tensor("x")],
            [tensor("y")],
            initializers=[w],
            check=False,
        )
        needle = "'W'"
    else:
        model = make_model(
            [helper.make_node("Relu", ["x"], ["y"], name="relu")],
            [tensor("x", elem_type=99)],
            [tensor("y")],
            check=False,
        )
        needle = "'x'"
    path = save(model, tmp_path / "m.onnx")
    for args in (["inspect", path], ["plan", path, "-o", tmp_path / "p.json", "--params"], ["simulate", path]):
        assert_clean_failure(run_cli(*args), needle, "element type 99", "onnx does not define")
    assert not (tmp_path / "p.json").exists()


def test_a_stale_value_info_of_an_undefined_type_is_ignored(run_cli, tmp_path):
    """A declared type for a tensor onnx infers itself is not trusted: inference decides."""
    model = make_model(_chain(), [tensor("x")], [tensor("y")], check=False)
    model.graph.value_info.append(helper.make_tensor_value_info("b", 99, [4, 8]))
    path = save(model, tmp_path / "m.onnx")
    res = run_cli("inspect", path, "--json")
    assert res.exit_code == 0, res.stderr
    assert res.json()["activations"]["bytes"] == 5 * 128  # a, b, c, d, y


def _chain():
    from models import chain_nodes

    return chain_nodes()


def test_positions_written_as_whole_floats_are_read_as_integers(run_cli, tmp_path):
    plan_path = _plan(
        run_cli, SAMPLES / "seed.onnx", tmp_path / "p.json", "--select-distance", "1", "--prefetch-distance", "0"
    )
    text = plan_path.read_text()
    plan = json.loads(text)
    group = plan["offloads"][0]["reload_groups"][0]
    group["h2d_before"] = float(group["h2d_before"])
    plan["offloads"][0]["d2h_after"] = float(plan["offloads"][0]["d2h_after"])
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(plan, indent=1))
    assert ".0," in edited.read_text()
    for args in (["apply", edited, "-o", tmp_path / "o.onnx"], ["simulate", SAMPLES / "seed.onnx", "--plan", edited]):
        res = run_cli(*args)
        assert res.exit_code == 0, res.stderr


def test_positions_with_a_fraction_are_refused(run_cli, tmp_path):
    plan_path = _plan(
        run_cli, SAMPLES / "seed.onnx", tmp_path / "p.json", "--select-distance", "1", "--prefetch-distance", "0"
    )
    plan = json.loads(plan_path.read_text())
    plan["offloads"][0]["reload_groups"][0]["h2d_before"] = 5.5
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(plan))
    for args in (["apply", edited, "-o", tmp_path / "o.onnx"], ["simulate", SAMPLES / "seed.onnx", "--plan", edited]):
        assert_clean_failure(run_cli(*args), "h2d_before")
    assert not (tmp_path / "o.onnx").exists()


def test_plans_built_in_memory_must_use_integers():
    from offloadctl.contract.document import validate_plan
    from offloadctl.core.errors import OffloadError

    plan = json.loads(
        (SAMPLES / "seed.onnx").with_suffix(".onnx").parent.joinpath("seed.onnx").read_bytes()[:0] or b"{}"
    )
    from offloadctl.analysis.graph import analyse
    from offloadctl.loading.model import load_model
    from offloadctl.planning.make import scheduled_plan

    plan = scheduled_plan(
        analyse(load_model(SAMPLES / "seed.onnx")), PlanRequest.of_options(select_distance=1, prefetch_distance=0)
    )
    validate_plan(plan)
    plan["offloads"][0]["reload_groups"][0]["uses"][0]["position"] = 5.0
    with pytest.raises(OffloadError, match="uses/0/position is 5.0, not an integer"):
        validate_plan(plan)


def _deep(kind: str) -> str:
    return ('{"a": ' if kind == "object" else "") + "[" * 100_000 + "]" * 100_000 + ("}" if kind == "object" else "")


def test_deeply_nested_json_is_refused_everywhere(run_cli, tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text(_deep("object"))
    assert_clean_failure(run_cli("apply", deep, "-o", tmp_path / "o.onnx"), "nested too deeply")
    assert_clean_failure(run_cli("filter", deep, "-o", tmp_path / "f.json"), "nested too deeply")
    assert_clean_failure(run_cli("simulate", SAMPLES / "seed.onnx", "--profile", deep), "nested too deeply")
    assert_clean_failure(run_cli("inspect", deep), str(deep))
    model_json = tmp_path / "model.json"
    model_json.write_text('{"graph": ' + "[" * 100_000 + "]" * 100_000 + "}")
    assert_clean_failure(run_cli("plan", model_json, "-o", tmp_path / "p.json"), "not a valid ONNX model")
    assert not any(p.name in ("o.onnx", "f.json", "p.json") for p in tmp_path.iterdir())


@pytest.mark.parametrize("option", ["--budget", "--min-bytes"])
def test_byte_sizes_beyond_64_bits_are_refused(run_cli, tmp_path, option):
    res = run_cli("plan", SAMPLES / "seed.onnx", "-o", tmp_path / "p.json", option, "99999999999999999999999")
    assert res.exit_code == 2 and "Traceback" not in res.stderr
    assert "more bytes than any device has" in res.stderr
    assert not (tmp_path / "p.json").exists()


def test_byte_sizes_are_parsed_exactly():
    from offloadctl.core.units import parse_bytes

    assert parse_bytes("9007199254740993") == 9007199254740993  # 2**53 + 1: a float would round it
    assert parse_bytes("1.5GiB") == 3 * 2**29
    assert parse_bytes("0.1KB") == 100


def test_absurd_shapes_are_refused(run_cli, tmp_path):
    from models import long_reuse_model

    path = save(long_reuse_model(dynamic=True), tmp_path / "dyn.onnx")
    res = run_cli("plan", path, "-o", tmp_path / "p.json", "--input-shape", "x=10000000000000000000,8")
    assert_clean_failure(res, "dimension 0", "larger than onnx allows")
    res = run_cli("plan", path, "-o", tmp_path / "p.json", "--input-shape", "x=100000000000000000,8", "--budget", "1MB")
    assert_clean_failure(res, "tensor 'x'", "more than any device holds")
    huge = make_model(_chain(), [tensor("x", (2**40, 2**40))], [tensor("y", (2**40, 2**40))], check=False)
    huge_path = save(huge, tmp_path / "huge.onnx")
    for args in (["inspect", huge_path], ["plan", huge_path, "-o", tmp_path / "p.json", "--budget", "10MB"]):
        assert_clean_failure(run_cli(*args), "more than any device holds")
    assert not (tmp_path / "p.json").exists()


def test_an_output_name_too_long_for_the_file_system(run_cli, tmp_path):
    for length in (305, 250):
        res = run_cli("plan", SAMPLES / "seed.onnx", "-o", tmp_path / ("a" * length + ".json"))
        assert_clean_failure(res, "cannot write")
    assert list(tmp_path.iterdir()) == []


def test_int4_weights_are_not_copyable(run_cli, tmp_path):
    w4 = helper.make_tensor("W4", TensorProto.INT4, [4, 8], [1] * 32)
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node("Neg", ["a"], ["b"], name="neg"),
        helper.make_node("Cast", ["W4"], ["w"], to=TensorProto.FLOAT, name="cast"),
        helper.make_node("Add", ["b", "w"], ["y"], name="add"),
    ]
    model = make_model(nodes, [tensor("x")], [tensor("y")], initializers=[w4], check=False)
    model.opset_import[0].version = 21
    path = save(model, tmp_path / "m.onnx")
    plan_path = _plan(
        run_cli, path, tmp_path / "p.json", "--params", "--select-distance", "0", "--prefetch-distance", "0"
    )
    plan = read_plan(plan_path)
    assert "W4" not in {o["tensor"] for o in plan["offloads"]}
    rejected = {r["tensor"]: r for r in plan["rejected"]}
    assert rejected["W4"]["reason"] == "not-copyable" and "int4" in rejected["W4"]["detail"]
    assert rejected["W4"]["bytes"] == 16  # still counted: 32 four-bit values
    out = tmp_path / "o.onnx"
    assert run_cli("apply", plan_path, "-o", out).exit_code == 0
    res = run_cli("run", out, "--device", "cpu", "--compare-to", path, "--json")
    assert res.exit_code == 0, res.stderr


def test_only_the_copy_kernels_types_are_copyable():
    from offloadctl.core.memcpy import COPY_TYPES
    from offloadctl.loading.tensors import tensor_info

    assert tensor_info("t", TensorProto.FLOAT, (2,)).copyable
    for elem in (
        TensorProto.INT4,
        TensorProto.UINT4,
        TensorProto.FLOAT8E4M3FN,
        TensorProto.COMPLEX64,
        TensorProto.STRING,
    ):
        assert elem not in COPY_TYPES
        assert not tensor_info("t", elem, (2,)).copyable
    assert tensor_info("t", TensorProto.COMPLEX64, (2,)).bytes == 16  # not copyable, still counted


@pytest.mark.parametrize("order", ["stale-first", "stale-last"])
def test_conflicting_value_info_entries_do_not_change_sizes(run_cli, tmp_path, order):
    """Shape inference decides; a stale or duplicate declaration changes no size and no copy's shape."""
    model = make_model(_chain(), [tensor("x")], [tensor("y")], check=False)
    entries = [
        helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 2]),
        helper.make_tensor_value_info("a", TensorProto.FLOAT, [4, 8]),
    ]
    model.graph.value_info.extend(entries if order == "stale-first" else entries[::-1])
    model.graph.value_info.append(helper.make_tensor_value_info("c", TensorProto.FLOAT, [3, 3]))
    path = save(model, tmp_path / "m.onnx")
    plan_path = _plan(run_cli, path, tmp_path / "p.json", "--select-distance", "0", "--prefetch-distance", "0")
    plan = json.loads(plan_path.read_text())
    assert {o["tensor"]: (o["bytes"], o["shape"]) for o in plan["offloads"]} == {t: (128, [4, 8]) for t in "abcd"}
    out = tmp_path / "o.onnx"
    assert run_cli("apply", plan_path, "-o", out).exit_code == 0
    rewritten = onnx.load(str(out))
    copies = {
        vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim]
        for vi in rewritten.graph.value_info
        if "__offload" in vi.name
    }
    assert copies and all(shape == [4, 8] for shape in copies.values())
    from offloadctl.core.memcpy import register_schemas

    register_schemas()
    own = [vi for vi in rewritten.graph.value_info if "__offload" in vi.name]
    del rewritten.graph.value_info[:]
    rewritten.graph.value_info.extend(own)  # the model's own stale entries are left as they were
    onnx.shape_inference.infer_shapes(rewritten, strict_mode=True)  # the copies agree with inference
    res = run_cli("run", out, "--device", "cpu", "--compare-to", path, "--json")
    assert res.exit_code == 0, res.stderr


def test_a_declared_type_still_serves_an_op_onnx_cannot_infer(tmp_path):
    """Custom-domain ops have no inference: their declared output types are used."""
    from offloadctl.loading.model import load_model
    from offloadctl.loading.tensors import tensor_infos

    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node("Custom", ["a"], ["b"], domain="my.ops", name="custom"),
        helper.make_node("Neg", ["b"], ["y"], name="neg"),
    ]
    graph = helper.make_graph(nodes, "g", [tensor("x")], [tensor("y")], value_info=[tensor("b", (2, 16))])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid("my.ops", 1)])
    model.ir_version = IR_VERSION
    infos = tensor_infos(load_model(save(model, tmp_path / "m.onnx")))
    assert infos["b"].bytes == 2 * 16 * 4


# ---------------------------------------------------------------------------------------------------
# Ctrl-C
# ---------------------------------------------------------------------------------------------------

_INTERRUPT_DURING_IMPORT = """
import builtins, sys
real = builtins.__import__
def interrupting(name, *args, **kwargs):
    if name == {module!r}:
        raise KeyboardInterrupt
    return real(name, *args, **kwargs)
builtins.__import__ = interrupting
sys.argv = ["offloadctl", "inspect", {model!r}]
from offloadctl._entry import main
main()
"""


@pytest.mark.parametrize("module", ["onnx", "rich.table", "jsonschema"])
def test_ctrl_c_during_start_up_exits_130_with_one_line(tmp_path, module):
    import subprocess
    import sys

    code = _INTERRUPT_DURING_IMPORT.format(module=module, model=str(SAMPLES / "seed.onnx"))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert res.returncode == 130, res.stderr
    assert res.stderr.strip() == "offloadctl: interrupted"
    assert res.stdout == ""


_INTERRUPT_WHILE_THE_PACKAGE_LOADS = """
import builtins, os, signal, sys
sys.argv = ["offloadctl", "inspect", {model!r}]
from _offloadctl import main  # the console script's first instruction
real = builtins.__import__
def interrupting(name, *args, **kwargs):
    if name == "typing":  # the first thing the offloadctl package imports
        os.kill(os.getpid(), signal.SIGINT)
    return real(name, *args, **kwargs)
builtins.__import__ = interrupting
main()
"""


def test_ctrl_c_from_the_console_scripts_first_instruction_exits_130_with_one_line(tmp_path):
    """A real SIGINT while the package loads, before any of offloadctl's code could catch an exception:
    the console script's entry point (`_offloadctl`) holds Ctrl-C to the one line from its first
    instruction on."""
    import subprocess
    import sys

    code = _INTERRUPT_WHILE_THE_PACKAGE_LOADS.format(model=str(SAMPLES / "seed.onnx"))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert res.returncode == 130, res.stderr
    assert res.stderr == "offloadctl: interrupted\n" and res.stdout == ""


def test_ctrl_c_while_working_exits_130_and_leaves_no_file(tmp_path):
    import subprocess
    import sys

    code = """
import sys
import offloadctl.core.files as files
import offloadctl.contract.document as plan_module
real = files.atomic_write
def write(path, fill, **kw):  # Ctrl-C once the plan's bytes are in the temporary file
    def fill_then_stop(tmp):
        fill(tmp)
        raise KeyboardInterrupt
    return real(path, fill_then_stop, **kw)
plan_module.atomic_write = write
sys.argv = ["offloadctl", "plan", {model!r}, "-o", "p.json"]
from offloadctl._entry import main
main()
""".format(model=str(SAMPLES / "seed.onnx"))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert res.returncode == 130, res.stderr
    assert "Traceback" not in res.stderr and res.stderr.strip().endswith("offloadctl: interrupted")
    assert list(tmp_path.iterdir()) == []  # neither the plan nor its temporary file


# ---------------------------------------------------------------------------------------------------
# One plan-versus-model check for apply and simulate
# ---------------------------------------------------------------------------------------------------


def _edit_first(field: str, value):
    def edit(plan: dict) -> None:
        off = plan["offloads"][0]
        if field == "use_input_index":
            off["reload_groups"][0]["uses"][0]["input_index"] = 1 - off["reload_groups"][0]["uses"][0]["input_index"]
        elif field == "use_node":
            off["reload_groups"][0]["uses"][0]["node"] = "not-a-node"
        elif field == "graph_output":
            off["graph_output"] = True
        elif field == "output_h2d_before":
            off["output_h2d_before"] = plan["model"]["num_positions"]
        elif field == "release_after":
            off["release_after"] = off["d2h_after"] - 1 if off["d2h_after"] > 0 else None
        else:
            off[field] = value

    return edit


CONTRADICTIONS = {
    "input index": (_edit_first("use_input_index", None), "does not have"),
    "node name": (_edit_first("use_node", None), "'not-a-node'"),
    "graph_output on a non-output": (_edit_first("graph_output", None), "graph_output=true"),
    "output_h2d_before on a non-output": (_edit_first("output_h2d_before", None), "not a graph output"),
    "bytes": (_edit_first("bytes", 999), "bytes 999"),
    "shape": (_edit_first("shape", [1, 2, 3]), "shape [1, 2, 3]"),
    "dtype": (_edit_first("dtype", "float16"), "dtype 'float16'"),
}


@pytest.fixture
def unet_plan(run_cli, tmp_path) -> tuple[Path, dict]:
    path = _plan(
        run_cli, SAMPLES / "unet.onnx", tmp_path / "p.json", "--select-distance", "3", "--prefetch-distance", "1"
    )
    plan = json.loads(path.read_text())
    first = plan["offloads"][0]
    assert (
        first["kind"] == "activation"
        and not first["graph_output"]
        and first["reload_groups"][0]["uses"][0]["input_index"] in (0, 1)
    )
    return path, plan


@pytest.mark.parametrize("case", sorted(CONTRADICTIONS))
@pytest.mark.parametrize("command", ["apply", "simulate"])
def test_apply_and_simulate_refuse_the_same_contradictions(run_cli, tmp_path, unet_plan, case, command):
    import copy

    edit, needle = CONTRADICTIONS[case]
    plan = copy.deepcopy(unet_plan[1])
    edit(plan)
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(plan))
    args = (
        ["apply", edited, "-o", tmp_path / "o.onnx"]
        if command == "apply"
        else ["simulate", SAMPLES / "unet.onnx", "--plan", edited]
    )
    assert_clean_failure(run_cli(*args), needle)
    assert not (tmp_path / "o.onnx").exists()


def test_a_release_before_the_last_device_use_is_refused(run_cli, tmp_path):
    path = _plan(
        run_cli, SAMPLES / "seed.onnx", tmp_path / "p.json", "--select-distance", "1", "--prefetch-distance", "0"
    )
    plan = json.loads(path.read_text())
    off = plan["offloads"][0]  # m1: read by Mul on the device, reloaded for Sub
    assert [u["node"] for u in off["device_uses"]] == ["mul_m3"]
    off["release_after"] = off["device_uses"][-1]["position"] - 1
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(plan))
    for args in (["apply", edited, "-o", tmp_path / "o.onnx"], ["simulate", SAMPLES / "seed.onnx", "--plan", edited]):
        assert_clean_failure(run_cli(*args), "before its last device use")
    assert not (tmp_path / "o.onnx").exists()


def test_every_stage_function_checks_the_stage_it_reads():
    from offloadctl.analysis.graph import analyse
    from offloadctl.core.errors import OffloadError
    from offloadctl.loading.model import load_model
    from offloadctl.planning.filter import filter_plan
    from offloadctl.planning.prefetch import prefetch
    from offloadctl.planning.select import select

    selected = select(analyse(load_model(SAMPLES / "seed.onnx")), SelectPart(select_distance=1))
    filtered = filter_plan(selected, FilterPart())
    scheduled = prefetch(filtered, PrefetchPart())
    for stage_function, options, wrong in (
        (filter_plan, FilterPart(), scheduled),
        (filter_plan, FilterPart(), filtered),
        (prefetch, PrefetchPart(), scheduled),
        (prefetch, PrefetchPart(), selected),
    ):
        with pytest.raises(
            OffloadError, match=f"reads a plan at stage .* but this plan is at stage '{wrong['stage']}'"
        ):
            stage_function(wrong, options)
    from offloadctl.planning.budget.strategy import budget_filter

    analysis = analyse(load_model(SAMPLES / "seed.onnx"))
    for wrong in (filtered, scheduled):
        with pytest.raises(
            OffloadError,
            match=f"budget strategy reads a plan at stage 'selected', but this plan is at stage '{wrong['stage']}'",
        ):
            budget_filter(wrong, analysis, PlanRequest.of_options(budget=1000))


# ---------------------------------------------------------------------------------------------------
# Figures that mislead
# ---------------------------------------------------------------------------------------------------


def _custom_op_model(path: Path) -> Path:
    """x -> Relu -> Custom (a domain onnx does not know, no declared type) -> Neg -> y."""
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node("Custom", ["a"], ["c"], domain="my.ops", name="custom"),
        helper.make_node("Neg", ["a"], ["y"], name="neg"),
    ]
    graph = helper.make_graph(
        nodes, "g", [tensor("x")], [tensor("y"), helper.make_tensor_value_info("c", TensorProto.FLOAT, None)]
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid("my.ops", 1)])
    model.ir_version = IR_VERSION
    return save(model, path)


def test_unknown_sizes_are_a_loud_warning_and_an_error_with_strict(run_cli, tmp_path):
    path = _custom_op_model(tmp_path / "m.onnx")
    res = run_cli("plan", path, "-o", tmp_path / "p.json")
    assert res.exit_code == 0, res.stderr
    assert "unknown size and count as 0 bytes" in " ".join(res.stderr.split()) and "c" in res.stderr
    strict = run_cli("plan", path, "-o", tmp_path / "q.json", "--strict")
    assert_clean_failure(strict, "unknown size", "--strict")
    assert not (tmp_path / "q.json").exists()
    assert_clean_failure(run_cli("simulate", path, "--strict"), "unknown size")
    assert run_cli("simulate", SAMPLES / "unet.onnx", "--strict").exit_code == 0  # every size known


def test_shape_inference_leaves_nothing_in_the_current_folder(run_cli, tmp_path, monkeypatch):
    """onnxruntime's symbolic shape inference writes sym_shape_infer_temp.onnx where it runs when it
    cannot finish (an op it does not know): it runs in a private folder, removed afterwards."""
    import tempfile

    model = _custom_op_model(tmp_path / "m.onnx")
    cwd, private = tmp_path / "cwd", tmp_path / "tmp"
    cwd.mkdir()
    private.mkdir()
    monkeypatch.chdir(cwd)
    # a temporary folder of this test's own: another offloadctl running on the machine uses the system's
    monkeypatch.setattr(tempfile, "tempdir", str(private))
    for args in (["inspect", model], ["plan", model, "-o", tmp_path / "p.json"], ["simulate", model]):
        assert run_cli(*args).exit_code == 0
    assert list(cwd.iterdir()) == []
    assert list(private.iterdir()) == []


def test_symbolic_inference_missing_is_a_warning_naming_the_fix(tmp_path, monkeypatch, caplog):
    import builtins

    from offloadctl.loading.model import load_model
    from offloadctl.loading.tensors import tensor_infos

    real_import = builtins.__import__

    def no_symbolic(name, *args, **kwargs):
        if name.startswith("onnxruntime.tools.symbolic_shape_infer"):
            raise ImportError("No module named 'sympy'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_symbolic)
    infos = tensor_infos(load_model(_custom_op_model(tmp_path / "m.onnx")))
    with caplog.at_level("WARNING"):
        assert infos["c"].bytes is None
    assert "pip install sympy" in caplog.text and "sympy" in caplog.text


def test_a_plan_that_saves_nothing_says_so_and_why(run_cli, tmp_path):
    rng = np.random.default_rng(0)
    nodes, inits, prev = [], [], "x"
    for i in range(20):
        inits.append(numpy_helper.from_array((rng.standard_normal((16, 16)) * 0.1).astype(np.float32), f"W{i}"))
        nodes.append(helper.make_node("MatMul", [prev, f"W{i}"], [f"h{i}"], name=f"mm{i}"))
        nodes.append(helper.make_node("Relu", [f"h{i}"], [f"r{i}"], name=f"relu{i}"))
        prev = f"r{i}"
    path = save(
        make_model(nodes, [tensor("x", (4, 16))], [tensor(prev, (4, 16))], initializers=inits), tmp_path / "m.onnx"
    )
    weak = run_cli(
        "plan", path, "-o", tmp_path / "weak.json", "--params", "--select-distance", "5", "--prefetch-distance", "100"
    )
    assert weak.exit_code == 0, weak.stderr
    text = " ".join(weak.stderr.split())
    assert "lowers the simulated peak by only" in text
    assert "copied back before the tensor's idle stretch even starts" in text and "--prefetch-distance" in text
    sim = run_cli("simulate", path, "--plan", tmp_path / "weak.json")
    assert "lowers the simulated peak by only" in " ".join(sim.stderr.split())
    good = run_cli(
        "plan", path, "-o", tmp_path / "good.json", "--params", "--select-distance", "5", "--prefetch-distance", "1"
    )
    assert good.exit_code == 0 and "lowers the simulated peak by only" not in " ".join(good.stderr.split())


@pytest.mark.parametrize("name", ["unet", "transformer", "training", "mlp", "weak"])
def test_the_advice_reads_the_simulation_it_is_given_and_says_the_same(tmp_path, monkeypatch, name):
    from offloadctl.analysis.graph import analyse
    from offloadctl.loading.model import load_model
    from offloadctl.planning import advice
    from offloadctl.planning.make import scheduled_plan
    from offloadctl.simulation.result import simulate

    if name == "weak":  # a plan whose reloads come back before the idle stretch starts
        nodes, inits, prev = [], [], "x"
        for i in range(12):
            inits.append(numpy_helper.from_array(np.full((16, 16), 0.1, np.float32), f"W{i}"))
            nodes += [
                helper.make_node("MatMul", [prev, f"W{i}"], [f"h{i}"], name=f"mm{i}"),
                helper.make_node("Relu", [f"h{i}"], [f"r{i}"], name=f"relu{i}"),
            ]
            prev = f"r{i}"
        path = save(
            make_model(nodes, [tensor("x", (4, 16))], [tensor(prev, (4, 16))], initializers=inits), tmp_path / "m.onnx"
        )
        options = {"select_distance": 5, "prefetch_distance": 100}
    else:
        path = SAMPLES / f"{name}.onnx"
        options = {"select_distance": 2, "prefetch_distance": 1}
    analysis = analyse(load_model(path))
    plan = scheduled_plan(analysis, PlanRequest.of_options(params=True, **options))
    alone = advice.weak_plan_advice(analysis, plan)
    result = simulate(analysis, plan)

    def refuse(*args, **kwargs):
        raise AssertionError("simulated again")

    monkeypatch.setattr(advice, "peak_memory", refuse)
    monkeypatch.setattr(advice, "lower_bound", refuse)
    assert advice.weak_plan_advice(analysis, plan, result=result) == alone
    if name == "weak":
        assert alone is not None and "idle stretch even starts" in alone


def test_a_sorted_file_not_in_run_order_is_not_called_unsorted(run_cli, tmp_path, caplog):
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node("Neg", ["a"], ["b"], name="neg"),
        helper.make_node("Shape", ["x"], ["s"], name="shape"),
        helper.make_node("Reshape", ["b", "s"], ["y"], name="reshape"),
    ]
    path = save(make_model(nodes, [tensor("x")], [tensor("y")]), tmp_path / "m.onnx")
    res = run_cli("-v", "plan", path, "-o", tmp_path / "p.json")
    assert res.exit_code == 0, res.stderr
    text = " ".join(res.stderr.split())
    assert "not topologically sorted" not in text
    assert "runs 3 node(s) at another place than the file has them" in text
    report = run_cli("inspect", path, "--json").json()
    assert report["topologically_sorted"] is True and report["file_in_run_order"] is False


def test_a_plans_input_shapes_naming_a_non_input_are_reported_as_the_plans(run_cli, tmp_path):
    from models import long_reuse_model

    path = save(long_reuse_model(dynamic=True), tmp_path / "dyn.onnx")
    plan_path = _plan(run_cli, path, tmp_path / "p.json", "--input-shape", "x=4,8", "--select-distance", "1")
    plan = json.loads(plan_path.read_text())
    plan["model"]["input_shapes"] = {"nope": [4, 8]}
    edited = tmp_path / "edited.json"
    edited.write_text(json.dumps(plan))
    for args in (["apply", edited, "-o", tmp_path / "o.onnx"], ["simulate", path, "--plan", edited]):
        res = run_cli(*args)
        assert_clean_failure(res, "model.input_shapes of plan", "'nope'")
        assert "--input-shape" not in res.stderr


def test_apply_model_given_as_a_folder(run_cli, tmp_path):
    plan = _plan(run_cli, SAMPLES / "seed.onnx", tmp_path / "p.json")
    assert_clean_failure(run_cli("apply", plan, "-o", tmp_path / "o.onnx", "--model", tmp_path), "is a directory")


def test_two_outputs_of_one_command_never_collide(run_cli, tmp_path):
    seed = SAMPLES / "seed.onnx"
    cases = [
        (["plan", seed, "-o", tmp_path / "same.md", "--report", tmp_path / "same.md"], "the plan and the report"),
        (["plan", seed, "-o", tmp_path / "p.png", "--report", tmp_path / "p.md"], "the plan and the report's plot"),
        (["simulate", seed, "--plot", tmp_path / "x.png", "--report", tmp_path / "x.png"], "would both be written"),
    ]
    for args, needle in cases:
        assert_clean_failure(run_cli(*args), needle)
    assert list(tmp_path.iterdir()) == []


def test_the_unknown_size_hint_never_asks_to_pin_inputs_that_are_pinned(run_cli, tmp_path):
    path = _custom_op_model(tmp_path / "m.onnx")  # x is fully known; only the custom op's output is not
    res = run_cli("simulate", path)
    text = " ".join(res.stderr.split())
    assert "nothing to pin" in text and "pin the dynamic inputs" not in text
    from models import long_reuse_model

    assert "--sizes-from-run" in text  # what does help there
    dyn = save(long_reuse_model(dynamic=True), tmp_path / "dyn.onnx")
    text = " ".join(run_cli("simulate", dyn).stderr.split())
    assert "pin the dynamic inputs (x)" in text


def test_the_dynamic_dimensions_hint_is_a_command_to_paste_with_the_models_own_names(run_cli, tmp_path):
    model = SAMPLES / "genai" / "llama-fp32" / "model.onnx"
    text = " ".join(run_cli("inspect", model).stderr.split())
    found = re.search(r"by the model's own dimension names: (.*?)\)", text)
    assert found, text
    pins = found[1].split()
    assert pins == [
        *("--dim", "batch_size=SIZE", "--dim", "sequence_length=SIZE", "--dim", "total_sequence_length=SIZE"),
        *("--dim", "past_sequence_length=SIZE", "--dim", "kv_cache_dim=SIZE"),
    ]  # no size made up: a detector planned on a 1x1 image has figures that mean nothing
    pasted = run_cli("simulate", model, *pins)  # as printed: SIZE is the user's to give
    said = " ".join(pasted.stderr.split())
    assert pasted.exit_code == 1 and "replace SIZE with the size batch_size has where the model runs" in said
    res = run_cli("simulate", model, *[p.replace("SIZE", "4") for p in pins])  # with sizes: every input known
    assert res.exit_code == 0 and "inputs with unknown dimensions" not in res.stderr
    # an input with an unnamed dimension is pinned by its shape, its fixed dimensions kept
    unnamed = onnx.parser.parse_model(
        """<ir_version: 8, opset_import: ["" : 17]>
        g (float[?, 4] x) => (float[?, 4] y) { y = Relu(x) }"""
    )
    path = save(unnamed, tmp_path / "unnamed.onnx")
    text = " ".join(run_cli("inspect", path).stderr.split())
    assert "--input-shape x=SIZE,4" in text
    pasted = run_cli("simulate", path, "--input-shape", "x=SIZE,4")
    assert pasted.exit_code == 1 and "replace each SIZE with the size that dimension has" in pasted.stderr
    # so is one with a negative size (PaddleOCR's exports write -1), whatever its other dimensions are named
    unnamed.graph.input[0].type.tensor_type.shape.dim[0].dim_value = -1
    unnamed.graph.input[0].type.tensor_type.shape.dim[1].dim_param = "?"
    path = save(unnamed, tmp_path / "negative.onnx")
    text = " ".join(run_cli("inspect", path).stderr.split())
    assert "--input-shape x=SIZE,SIZE" in text and "--dim" not in text
    res = run_cli("simulate", path, "--input-shape", "x=1,1")
    assert res.exit_code == 0 and "inputs with unknown dimensions" not in res.stderr, res.stderr


def test_the_hint_pins_every_dimension_that_does_not_follow_from_the_others(run_cli, tmp_path):
    """Left out is only a dimension its pinned parts make (``n + 1``): a plain name with a hyphen
    (``batch-size``) and arithmetic onnx dims may hold but offloadctl does not evaluate (``n / 2``)
    are pinned themselves, so the printed options, pasted, leave nothing unknown."""
    model = onnx.parser.parse_model(
        """<ir_version: 8, opset_import: ["" : 17]>
        g (float["batch-size"] a, float[n] b, float["n + 1"] c, float["n / 2"] d) => (float["batch-size"] ya,
          float[n] yb, float["n + 1"] yc, float["n / 2"] yd)
        { ya = Relu(a) yb = Relu(b) yc = Relu(c) yd = Relu(d) }"""
    )
    path = save(model, tmp_path / "dims.onnx")
    text = " ".join(run_cli("inspect", path).stderr.split())
    found = re.search(r"by the model's own dimension names: (.*?)\)", text)
    assert found, text
    pins = shlex.split(found[1])
    assert pins == ["--dim", "batch-size=SIZE", "--dim", "n=SIZE", "--dim", "n / 2=SIZE"]
    res = run_cli("simulate", path, *[p.replace("SIZE", "2") for p in pins])  # with sizes: every input known
    assert res.exit_code == 0 and "inputs with unknown dimensions" not in res.stderr, res.stderr


def test_a_shape_point_keeps_the_plans_pins_that_do_not_follow_from_its_dims(tmp_path):
    """A shape point changes ``n``: ``n + 1`` follows again, ``batch-size`` and ``n / 2`` keep the plan's pins."""
    from offloadctl.analysis.graph import analyse
    from offloadctl.loading.model import load_model
    from offloadctl.simulation.points import point_analysis

    model = onnx.parser.parse_model(
        """<ir_version: 8, opset_import: ["" : 17]>
        g (float["batch-size"] a, float[n] b, float["n + 1"] c, float["n / 2"] d) => (float["batch-size"] ya,
          float[n] yb, float["n + 1"] yc, float["n / 2"] yd)
        { ya = Relu(a) yb = Relu(b) yc = Relu(c) yd = Relu(d) }"""
    )
    path = save(model, tmp_path / "dims.onnx")
    analysis = analyse(load_model(path, dims={"batch-size": 2, "n": 3, "n / 2": 1}))
    point = point_analysis(analysis, {"n": 5})
    assert [point.infos[t].bytes for t in ("a", "b", "c", "d")] == [8, 20, 24, 4]


def test_numbers_that_are_not_finite_are_refused_everywhere(run_cli, tmp_path):
    # nan passes a range check (it compares false with everything): options, files and the library
    # refuse it and the infinities, so no plan ever records NaN or Infinity (which are not JSON)
    unet = SAMPLES / "unet.onnx"
    for args in (
        ["--max-slowdown", "nan"],
        ["--max-slowdown", "inf"],
        ["--max-slowdown", "1e999"],
        ["--budget", "300KiB", "--optimal", "--time-limit", "nan"],
        ["--budget", "300KiB", "--optimal", "--time-limit", "inf"],
    ):
        result = run_cli("plan", unet, "-o", tmp_path / "p.json", *args)
        assert result.exit_code == 2 and "is not a finite number" in result.stderr, (args, result.stderr)
        assert "Traceback" not in result.stdout + result.stderr
    assert list(tmp_path.iterdir()) == []

    plan = tmp_path / "p.json"
    assert run_cli("plan", SAMPLES / "seed.onnx", "-o", plan, "--select-distance", "1").exit_code == 0
    doc = json.loads(plan.read_text())
    doc["summary"]["nan"] = float("nan")
    plan.write_text(json.dumps(doc))
    assert "NaN" in plan.read_text()
    assert_clean_failure(run_cli("apply", plan, "-o", tmp_path / "o.onnx"), "NaN is not a JSON number")
    assert_clean_failure(run_cli("simulate", SAMPLES / "seed.onnx", "--plan", plan), "NaN is not a JSON number")

    bundled = Path(__file__).resolve().parent.parent / "offloadctl/simulation/profiles/cpu.json"
    profile = json.loads(bundled.read_text())
    profile["mem_bandwidth"] = float("inf")
    bad = tmp_path / "inf.profile.json"
    bad.write_text(json.dumps(profile))
    assert_clean_failure(run_cli("simulate", unet, "--profile", bad), "Infinity is not a JSON number")
    bad.write_text(bad.read_text().replace("Infinity", "1e999"))  # read by Python as infinity
    assert_clean_failure(run_cli("simulate", unet, "--profile", bad), "1e999 is too large for a number")
    plan.write_text(plan.read_text().replace("NaN", "-1e400"))
    assert_clean_failure(run_cli("apply", plan, "-o", tmp_path / "o.onnx"), "-1e400 is too large for a number")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["inf.profile.json", "p.json"]


def test_the_library_refuses_numbers_that_are_not_finite():
    import offloadctl

    analysis = offloadctl.analyse(offloadctl.load(SAMPLES / "unet.onnx"))
    for value in (float("nan"), float("inf")):
        with pytest.raises(offloadctl.OffloadError, match="max_slowdown=float"):  # in the caller's terms
            offloadctl.make_plan(analysis, max_slowdown=value)
        with pytest.raises(offloadctl.OffloadError, match="time limit"):
            offloadctl.make_plan(analysis, budget="300KiB", optimal=True, time_limit=value)


def test_simulate_and_run_take_a_rewrites_order_from_the_rewrite(run_cli, tmp_path):
    """A rewrite planned for DEFAULT is simulated in DEFAULT without the flag (its CPU line says so); a
    rewrite planned for PRIORITY_BASED run in DEFAULT says so in run's verdict and quotes what it costs."""
    plan, out = tmp_path / "plan.json", tmp_path / "t.onnx"
    made = run_cli("plan", SAMPLES / "transformer.onnx", "-o", plan, "--params", "--select-distance", "10",
                   "--execution-order", "default", "--json")  # fmt: skip
    assert made.exit_code in (0, 1), made.stderr
    assert run_cli("apply", plan, "-o", out).exit_code == 0
    plain = run_cli("simulate", out, "--json").json()
    flagged = run_cli("simulate", out, "--execution-order", "default", "--json").json()
    assert plain["peak_bytes"]["after"] == flagged["peak_bytes"]["after"] == made.json()["peak_bytes"]["after"]
    assert "CPU arena peak (default order" in run_cli("simulate", out).stdout
    plan2, out2 = tmp_path / "p2.json", tmp_path / "u.onnx"
    assert run_cli("plan", SAMPLES / "unet.onnx", "-o", plan2, "--params", "--select-distance", "10").exit_code == 0
    assert run_cli("apply", plan2, "-o", out2).exit_code == 0
    ran = run_cli("run", out2, "--device", "cpu", "--execution-order", "default", "--repeat", "1",
                  "--inputs", SAMPLES / "unet.inputs.npz")  # fmt: skip
    said = " ".join(ran.stderr.split())
    assert ran.exit_code == 0 and "| planned for PRIORITY_BASED, run in DEFAULT" in ran.stdout
    assert (
        f"{out2} was planned for the PRIORITY_BASED order and runs in DEFAULT here: its simulated device peak" in said
    )
    assert "plan again with --execution-order default" in said
    same = run_cli("run", out2, "--device", "cpu", "--repeat", "1", "--inputs", SAMPLES / "unet.inputs.npz")
    assert (
        same.exit_code == 0 and "was planned for the" not in same.stderr and "planned for PRIORITY" not in same.stdout
    )


def test_a_plan_that_barely_lowers_the_peak_says_so_in_its_verdict():
    from offloadctl.cli.figure_lines import plan_effect
    from offloadctl.simulation.estimate import Peaks

    def effect(before: int, after: int) -> str | None:
        return plan_effect(Peaks(before=before, after=after))[0]

    assert effect(1000, 1000) == "the plan does not lower the peak"
    assert effect(100_000, 99_900) == "the plan barely lowers the peak (100 B, under 1%)"
    assert effect(100_000, 98_000) is None  # a cut of 2% speaks for itself in the peak figures
