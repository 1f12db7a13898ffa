"""Every bad input gets one clear error (exit 1, no traceback) and loses nothing.

Each case runs the real command through ``run_cli`` and checks: exit status 1, the exception is
SystemExit, no "Traceback" anywhere, exactly one ``error:`` line naming the offending thing plus a
``fix:`` line on stderr, nothing on stdout, and the output untouched: a new output path does not
exist afterwards (no temporary file either) and an existing output file keeps its bytes.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from offloadctl.contract.document import read_plan, validate_plan, write_plan

from models import chain_nodes, long_reuse_model, make_model, save, tensor

SAMPLES = Path(__file__).resolve().parent.parent / "sample_models"


def assert_clean_failure(result, *needles: str) -> None:
    """Exit 1 with one error line naming ``needles`` and a fix; no traceback, nothing on stdout."""
    text = result.stdout + result.stderr
    assert result.exit_code == 1, text
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in text
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert sum(line.startswith("error:") for line in lines) == 1, result.stderr
    assert any(line.strip().startswith("fix:") for line in lines), result.stderr
    for needle in needles:
        assert needle in result.stderr, (needle, result.stderr)


def _flat(text: str) -> str:
    """Text without any whitespace: log lines are wrapped to the console width, even mid-word."""
    return "".join(text.split())


def _warned(stderr: str, *needles: str) -> bool:
    return all(_flat(n) in _flat(stderr) for n in needles)


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.is_file()}


class Outputs:
    """A fresh output path and an existing output file, to check that a failure touches neither."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder / "out"
        self.folder.mkdir()
        self.existing = self.folder / "existing.json"
        self.existing.write_text("KEEP ME\n")
        self.new = self.folder / "new.json"
        self.before = _snapshot(self.folder)

    def assert_untouched(self) -> None:
        assert not self.new.exists()
        assert _snapshot(self.folder) == self.before  # no temporary file left, existing one unchanged


@pytest.fixture
def outputs(tmp_path) -> Outputs:
    return Outputs(tmp_path)


# ---------------------------------------------------------------------------------------------------
# Files that are not ONNX models
# ---------------------------------------------------------------------------------------------------


def _truncated(path: Path) -> str:
    data = (SAMPLES / "unet.onnx").read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return "not a valid ONNX model"


def _text(path: Path) -> str:
    path.write_text("this is a README, not a model\n")
    return "not a valid ONNX model"


def _png(path: Path) -> str:
    rng = np.random.default_rng(0)
    path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + rng.integers(0, 256, 400, dtype=np.uint8).tobytes())
    return "not a valid ONNX model"


def _json(path: Path) -> str:
    path.write_text(json.dumps({"layers": [1, 2, 3], "name": "resnet"}))
    return "not a valid ONNX model"


def _empty(path: Path) -> str:
    path.write_bytes(b"")
    return "is empty"


def _missing(path: Path) -> str:
    return "does not exist"


def _folder(path: Path) -> str:
    path.mkdir()
    return "is a directory"


BAD_MODELS = {
    "missing": ("model.onnx", _missing),
    "empty": ("model.onnx", _empty),
    "truncated": ("model.onnx", _truncated),
    "text": ("model.onnx", _text),
    "png": ("model.onnx", _png),
    "json-named-onnx": ("model.onnx", _json),
    "json-named-json": ("model.json", _json),
    "text-named-textproto": ("model.textproto", _text),
    "folder": ("model.onnx", _folder),
}


@pytest.mark.parametrize("case", sorted(BAD_MODELS))
@pytest.mark.parametrize("command", ["inspect", "select", "plan"])
def test_bad_model_file(run_cli, tmp_path, outputs, case, command):
    name, make = BAD_MODELS[case]
    path = tmp_path / name
    needle = make(path)
    for out in (outputs.new, outputs.existing):
        args = [command, path] if command == "inspect" else [command, path, "-o", out]
        assert_clean_failure(run_cli(*args), str(path), needle)
        if command == "inspect":
            break
    outputs.assert_untouched()


def test_truncated_sample_models_at_many_cut_points(run_cli, tmp_path):
    """Cuts at field boundaries can still decode: every cut point must fail cleanly all the same."""
    data = (SAMPLES / "seed.onnx").read_bytes()
    path = tmp_path / "cut.onnx"
    for cut in range(1, len(data), 7):
        path.write_bytes(data[:cut])
        assert_clean_failure(run_cli("plan", path, "-o", tmp_path / "p.json"), str(path))
        assert not (tmp_path / "p.json").exists()


def test_a_plan_given_as_model_says_so(run_cli, tmp_path, outputs):
    plan = tmp_path / "plan.json"
    assert run_cli("plan", SAMPLES / "seed.onnx", "-o", plan).exit_code == 0
    assert_clean_failure(run_cli("inspect", plan), str(plan), "is an offload plan, not an ONNX model")
    assert_clean_failure(run_cli("plan", plan, "-o", outputs.new), "offload plan")
    outputs.assert_untouched()


# ---------------------------------------------------------------------------------------------------
# Malformed graphs
# ---------------------------------------------------------------------------------------------------


def test_unsorted_nodes_plan_like_the_sorted_model_with_a_warning(run_cli, tmp_path):
    nodes = chain_nodes()
    sorted_path = save(make_model(nodes, [tensor("x")], [tensor("y")]), tmp_path / "sorted.onnx")
    shuffled = [nodes[4], nodes[2], nodes[0], nodes[3], nodes[1]]
    unsorted_path = save(make_model(shuffled, [tensor("x")], [tensor("y")], check=False), tmp_path / "unsorted.onnx")
    args = ("--select-distance", "1", "--prefetch-distance", "0")
    res = run_cli("plan", unsorted_path, "-o", tmp_path / "u.json", *args)
    assert res.exit_code == 0, res.stderr
    assert _warned(res.stderr, "not topologically sorted", "sorted into the order onnxruntime will run")
    assert _flat(res.stderr).count("nottopologicallysorted") == 1  # one warning, not one per layer
    assert run_cli("plan", sorted_path, "-o", tmp_path / "s.json", *args).exit_code == 0
    unsorted_plan = json.loads((tmp_path / "u.json").read_text())
    sorted_plan = json.loads((tmp_path / "s.json").read_text())
    assert [o["tensor"] for o in unsorted_plan["offloads"]] == ["a"]

    def positions(plan):
        return [(o["tensor"], o["d2h_after"], [g["h2d_before"] for g in o["reload_groups"]]) for o in plan["offloads"]]

    assert positions(unsorted_plan) == positions(sorted_plan)
    inspect = run_cli("inspect", unsorted_path, "--json")
    assert inspect.exit_code == 0 and inspect.json()["topologically_sorted"] is False


def test_cycle(run_cli, tmp_path, outputs):
    nodes = chain_nodes()
    nodes[0] = helper.make_node("Add", ["x", "c"], ["a"], name="relu")  # a -> b -> c -> a
    path = save(make_model(nodes, [tensor("x")], [tensor("y")], check=False), tmp_path / "cycle.onnx")
    res = run_cli("plan", path, "-o", outputs.new)
    assert_clean_failure(res, "cycle", "'relu'", "'neg_b'", "'neg_c'")
    outputs.assert_untouched()


def _dup_two_producers():
    nodes = chain_nodes()
    nodes[2] = helper.make_node("Neg", ["b"], ["a"], name="neg_c")
    return nodes, [], "tensor 'a' is defined twice", "'neg_c'"


def _dup_initializer():
    w = numpy_helper.from_array(np.zeros((4, 8), np.float32), "b")
    return chain_nodes(), [w], "tensor 'b' is defined twice", "a weight"


def _dup_graph_input():
    nodes = chain_nodes()
    nodes[1] = helper.make_node("Neg", ["a"], ["x"], name="neg_b")
    return nodes, [], "tensor 'x' is defined twice", "a graph input"


def _undefined_read():
    nodes = chain_nodes()
    nodes[2] = helper.make_node("Neg", ["nowhere"], ["c"], name="neg_c")
    return nodes, [], "reads tensor 'nowhere'", "'neg_c'"


@pytest.mark.parametrize("make", [_dup_two_producers, _dup_initializer, _dup_graph_input, _undefined_read])
@pytest.mark.parametrize("command", ["inspect", "plan"])
def test_tensor_name_errors(run_cli, tmp_path, outputs, make, command):
    nodes, inits, *needles = make()
    path = save(make_model(nodes, [tensor("x")], [tensor("y")], initializers=inits, check=False), tmp_path / "m.onnx")
    args = [command, path] if command == "inspect" else [command, path, "-o", outputs.new]
    assert_clean_failure(run_cli(*args), str(path), *needles)
    outputs.assert_untouched()


def test_graph_output_nobody_produces(run_cli, tmp_path, outputs):
    model = make_model(chain_nodes(), [tensor("x")], [tensor("y"), tensor("ghost")], check=False)
    path = save(model, tmp_path / "m.onnx")
    assert_clean_failure(run_cli("plan", path, "-o", outputs.new), "graph output 'ghost'", str(path))
    outputs.assert_untouched()


def test_missing_external_data_file(run_cli, tmp_path, outputs):
    folder = tmp_path / "model"
    folder.mkdir()
    w = numpy_helper.from_array(np.ones((8, 8), np.float32), "W")
    model = make_model([helper.make_node("MatMul", ["x", "W"], ["y"])], [tensor("x")], [tensor("y")], initializers=[w])
    onnx.save(model, str(folder / "m.onnx"), save_as_external_data=True, location="m.data", size_threshold=0)
    # with the data file present, planning works (and never reads the weight bytes)
    assert run_cli("plan", folder / "m.onnx", "-o", tmp_path / "ok.json", "--params").exit_code == 0
    (folder / "m.data").unlink()
    for args in (["inspect", folder / "m.onnx"], ["plan", folder / "m.onnx", "-o", outputs.new]):
        assert_clean_failure(run_cli(*args), "m.data", "'W'", "is missing")
    outputs.assert_untouched()


# ---------------------------------------------------------------------------------------------------
# Plans that cannot be used
# ---------------------------------------------------------------------------------------------------


@pytest.fixture
def plans(tmp_path, run_cli):
    """The seed model's plan at each stage: {stage: (path, dict)}."""
    seed = SAMPLES / "seed.onnx"
    paths = {s: tmp_path / f"{s}.json" for s in ("selected", "filtered", "scheduled")}
    assert run_cli("select", seed, "-o", paths["selected"], "--select-distance", "1").exit_code == 0
    assert run_cli("filter", paths["selected"], "-o", paths["filtered"]).exit_code == 0
    assert run_cli("prefetch", paths["filtered"], "-o", paths["scheduled"], "--prefetch-distance", "2").exit_code == 0
    return {s: (p, json.loads(p.read_text())) for s, p in paths.items()}


def _edit(plan: dict, edit) -> dict:
    new = copy.deepcopy(plan)
    edit(new)
    return new


def _set(path: str, value):
    def edit(plan: dict) -> None:
        *head, last = path.split("/")
        target = plan
        for key in head:
            target = target[int(key)] if isinstance(target, list) else target[key]
        if value is _DELETE:
            del target[int(last) if isinstance(target, list) else last]
        else:
            target[int(last) if isinstance(target, list) else last] = value

    return edit


_DELETE = object()

BAD_PLAN_FIELDS = {
    "bytes-not-integer": ("offloads/0/bytes", "many", "field offloads/0/bytes"),
    "bytes-negative": ("offloads/0/bytes", -3, "field offloads/0/bytes"),
    "tensor-missing": ("offloads/0/tensor", _DELETE, "'tensor' is a required property"),
    "kind-unknown": ("offloads/0/kind", "gradient", "field offloads/0/kind"),
    "stage-unknown": ("stage", "planned", "field stage"),
    "schema-version-string": ("schema_version", "1", "field schema_version"),
    "schema-version-missing": ("schema_version", _DELETE, "'schema_version' is a required property"),
    "h2d-after-first-use": ("offloads/0/reload_groups/0/h2d_before", 99, "h2d_before=99"),
    "h2d-before-d2h": ("offloads/0/reload_groups/0/h2d_before", 0, "h2d_before=0"),
    "use-beyond-model": ("offloads/0/reload_groups/0/uses/0/position", 42, "beyond the model's 6 positions"),
    "host-cast-readers-a-string": (
        "options/select/host_casts",
        [{"tensor": "x", "readers": "h"}],
        "field options/select/host_casts/0/readers",
    ),
    "rejected-reason-unknown": ("rejected/rows/0/4", "bored", "field rejected/rows/0/4 (reason)"),
    "rejected-row-short": ("rejected/rows/0/6", _DELETE, "field rejected/rows/0"),
    "rejected-detail-past-the-texts": ("rejected/rows/0/6", 99, "rejected/rows/0/6 (detail) is 99, past the"),
    "rejected-columns-renamed": ("rejected/columns/0", "name", "field rejected/columns"),
    "rejected-detail-text-a-number": ("rejected/details/0", 3, "field rejected/details/0"),
}


@pytest.mark.parametrize("case", sorted(BAD_PLAN_FIELDS))
def test_plan_failing_schema_or_rules_names_the_field(run_cli, tmp_path, plans, outputs, case):
    field, value, needle = BAD_PLAN_FIELDS[case]
    _, filtered = plans["filtered"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(_edit(filtered, _set(field, value))))
    for out in (outputs.new, outputs.existing):
        assert_clean_failure(run_cli("prefetch", bad, "-o", out), str(bad), needle)
    outputs.assert_untouched()


def test_unknown_schema_version(run_cli, tmp_path, plans, outputs):
    _, selected = plans["selected"]
    bad = tmp_path / "v7.json"
    bad.write_text(json.dumps(_edit(selected, _set("schema_version", 7))))
    assert_clean_failure(
        run_cli("filter", bad, "-o", outputs.new), str(bad), "schema_version 7", "reads versions 1 and 2"
    )
    outputs.assert_untouched()


def test_a_version_1_plan_is_read_and_the_next_stage_writes_version_2(run_cli, tmp_path, plans):
    """Version 1 files held the rejected candidates as a list of entries: they read as they are, and
    what a stage makes of them is written as version 2, with the table."""
    path, _ = plans["selected"]
    selected = read_plan(path)
    old = tmp_path / "v1.json"
    old.write_text(json.dumps({**selected, "schema_version": 1}))
    assert read_plan(old) == {**selected, "schema_version": 1}
    out = tmp_path / "filtered.json"
    assert run_cli("filter", old, "-o", out).exit_code == 0
    written = json.loads(out.read_text())
    assert written["schema_version"] == 2 and written["rejected"]["rows"]
    assert read_plan(out)["rejected"] == read_plan(plans["filtered"][0])["rejected"]


def _plan_file(tmp_path: Path, kind: str) -> tuple[Path, str]:
    path = tmp_path / "plan.json"
    if kind == "not-json":
        path.write_text('{"schema_version": 1, "stage": ')
        return path, "is not JSON (line 1"
    if kind == "binary":
        path.write_bytes((SAMPLES / "seed.onnx").read_bytes())
        return path, "not a JSON text file"
    if kind == "json-list":
        path.write_text("[1, 2, 3]")
        return path, "expected a JSON object, got list"
    if kind == "missing":
        return path, "does not exist"
    if kind == "folder":
        path.mkdir()
        return path, "is a directory"
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["not-json", "binary", "json-list", "missing", "folder"])
@pytest.mark.parametrize("command", ["filter", "prefetch"])
def test_unreadable_plan_file(run_cli, tmp_path, outputs, kind, command):
    path, needle = _plan_file(tmp_path, kind)
    for out in (outputs.new, outputs.existing):
        assert_clean_failure(run_cli(command, path, "-o", out), str(path), needle)
    outputs.assert_untouched()


@pytest.mark.parametrize(
    ("command", "stage", "needle"),
    [
        ("filter", "filtered", "needs stage 'selected'"),
        ("filter", "scheduled", "needs stage 'selected'"),
        ("prefetch", "selected", "run offloadctl filter on it first"),
        ("prefetch", "scheduled", "needs stage 'filtered'"),
    ],
)
def test_plan_at_the_wrong_stage(run_cli, plans, outputs, command, stage, needle):
    path, _ = plans[stage]
    assert_clean_failure(run_cli(command, path, "-o", outputs.new), str(path), f"at stage '{stage}'", needle)
    outputs.assert_untouched()


def test_apply_never_writes_over_its_inputs(run_cli, tmp_path, plans):
    model = tmp_path / "seed.onnx"
    shutil.copy(SAMPLES / "seed.onnx", model)
    plan_path = tmp_path / "plan.json"
    assert run_cli("plan", model, "-o", plan_path, "--select-distance", "1").exit_code == 0
    before = {p: p.read_bytes() for p in (model, plan_path)}
    for out in (model, plan_path):
        res = run_cli("apply", plan_path, "-o", out, "--model", model)
        assert_clean_failure(res, "is the same file as the input")
    assert {p: p.read_bytes() for p in (model, plan_path)} == before


def test_apply_refuses_a_plan_that_is_not_scheduled(run_cli, plans, outputs):
    path, _ = plans["filtered"]
    res = run_cli("apply", path, "-o", outputs.folder / "m.onnx", "--model", SAMPLES / "seed.onnx")
    assert_clean_failure(res, str(path), "stage 'filtered'")
    assert not (outputs.folder / "m.onnx").exists()


def test_apply_refuses_a_plan_made_for_another_model(run_cli, plans, outputs):
    path, _ = plans["scheduled"]
    res = run_cli("apply", path, "-o", outputs.folder / "m.onnx", "--model", SAMPLES / "mlp.onnx")
    assert_clean_failure(res, "mlp.onnx", "seed.onnx")
    assert not (outputs.folder / "m.onnx").exists()


def test_apply_and_simulate_refuse_an_offloaded_weight_read_on_the_device(run_cli, tmp_path, outputs):
    model = tmp_path / "seed.onnx"
    shutil.copy(SAMPLES / "seed.onnx", model)
    good = tmp_path / "plan.json"
    assert run_cli("plan", model, "-o", good, "--params", "--force", "two", "--prefetch-distance", "0").exit_code == 0
    plan = read_plan(good)
    (weight,) = plan["offloads"]
    group = weight["reload_groups"][0]
    assert weight["tensor"] == "two" and weight["device_uses"] == [] and len(group["uses"]) > 1
    weight["device_uses"] = [group["uses"].pop(0)]  # the first use reads the weight on the device
    group["h2d_before"] = group["uses"][0]["position"]
    validate_plan(plan)  # the schema allows it; the model check does not
    bad = tmp_path / "bad.json"
    write_plan(bad, plan)
    for res in (
        run_cli("apply", bad, "-o", outputs.folder / "m.onnx", "--model", model),
        run_cli("simulate", model, "--plan", bad),
    ):
        assert_clean_failure(res, "weight 'two'", "device_uses")
    assert not (outputs.folder / "m.onnx").exists()


def test_apply_refuses_a_plan_naming_a_tensor_the_model_lacks(run_cli, tmp_path, plans, outputs):
    _, scheduled = plans["scheduled"]
    bad = tmp_path / "ghost.json"
    bad.write_text(json.dumps(_edit(scheduled, _set("offloads/0/tensor", "ghost"))))
    res = run_cli("apply", bad, "-o", outputs.folder / "m.onnx", "--model", SAMPLES / "seed.onnx")
    assert_clean_failure(res, "'ghost'")
    assert not (outputs.folder / "m.onnx").exists()


# ---------------------------------------------------------------------------------------------------
# Output paths
# ---------------------------------------------------------------------------------------------------


def _unwritable_folder(tmp_path: Path) -> Path:
    """A folder this process cannot create files in.

    As a normal user a folder without write permission does; root ignores permissions, so as root
    use sysfs, where even root cannot create files.
    """
    if os.geteuid() != 0:
        folder = tmp_path / "readonly"
        folder.mkdir()
        folder.chmod(0o555)
        return folder
    return Path("/sys")


OUTPUT_CASES = {
    "parent-missing": (lambda tmp: tmp / "no" / "such" / "plan.json", "does not exist"),
    "parent-is-a-file": (lambda tmp: tmp / "file.txt" / "plan.json", "is a file, not a folder"),
    "output-is-a-folder": (lambda tmp: tmp, "is a directory"),
    "folder-not-writable": (lambda tmp: _unwritable_folder(tmp) / "offloadctl-test-plan.json", "cannot write"),
}


@pytest.mark.parametrize("case", sorted(OUTPUT_CASES))
@pytest.mark.parametrize("command", ["select", "plan", "filter"])
def test_output_path_that_cannot_be_written(run_cli, tmp_path, plans, case, command):
    (tmp_path / "file.txt").write_text("a file\n")
    make, needle = OUTPUT_CASES[case]
    out = make(tmp_path)
    existed = out.exists()
    source = plans["selected"][0] if command == "filter" else SAMPLES / "seed.onnx"
    assert_clean_failure(run_cli(command, source, "-o", out), str(out), needle)
    assert out.exists() == existed


def test_output_equal_to_input(run_cli, tmp_path, plans):
    model = tmp_path / "seed.onnx"
    shutil.copy(SAMPLES / "seed.onnx", model)
    original = model.read_bytes()
    link = tmp_path / "link.onnx"
    link.symlink_to(model)
    for out in (model, link, tmp_path / "." / "seed.onnx"):
        assert_clean_failure(run_cli("plan", model, "-o", out), "is the same file as the input")
        assert_clean_failure(run_cli("select", model, "-o", out), "is the same file as the input")
    assert model.read_bytes() == original
    for stage, command in (("selected", "filter"), ("filtered", "prefetch")):
        path, _ = plans[stage]
        before = path.read_bytes()
        assert_clean_failure(run_cli(command, path, "-o", path), "is the same file as the input")
        assert path.read_bytes() == before


def test_a_write_that_fails_midway_leaves_nothing_behind(run_cli, outputs, monkeypatch):
    def disk_full(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", disk_full)
    for out in (outputs.new, outputs.existing):
        res = run_cli("plan", SAMPLES / "seed.onnx", "-o", out)
        assert_clean_failure(res, str(out), "No space left on device")
    outputs.assert_untouched()


# ---------------------------------------------------------------------------------------------------
# Dynamic dimensions and --input-shape
# ---------------------------------------------------------------------------------------------------


def test_dynamic_dimensions_without_input_shape_plan_and_warn(run_cli, tmp_path):
    path = save(long_reuse_model(dynamic=True), tmp_path / "dyn.onnx")
    out = tmp_path / "plan.json"
    res = run_cli("plan", path, "-o", out, "--select-distance", "0")
    assert res.exit_code == 0, res.stderr
    assert _warned(res.stderr, "unknown dimensions: x", "--dim N=SIZE")  # the option to fill in, by the dim's name
    plan = read_plan(out)
    validate_plan(plan)
    assert plan["offloads"] == []
    reasons = {r["tensor"]: r["reason"] for r in plan["rejected"]}
    assert reasons == {
        "a": "unknown-size",
        "b": "unknown-size",
        "c": "unknown-size",
        "d": "unknown-size",
        "y": "unused",
    }
    detail = next(r["detail"] for r in plan["rejected"] if r["tensor"] == "a")
    assert "N" in detail and "--input-shape" in detail


def test_dynamic_dimensions_with_input_shape_are_planned(run_cli, tmp_path):
    path = save(long_reuse_model(dynamic=True), tmp_path / "dyn.onnx")
    out = tmp_path / "plan.json"
    res = run_cli("plan", path, "-o", out, "--select-distance", "0", "--input-shape", "x=3,8")
    assert res.exit_code == 0, res.stderr
    assert "unknown dimensions" not in res.stderr
    plan = read_plan(out)
    assert plan["model"]["input_shapes"] == {"x": [3, 8]}
    assert {o["tensor"]: o["bytes"] for o in plan["offloads"]} == {"a": 96, "b": 96, "c": 96, "d": 96}


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("z=3,8", "'z', which is not an input"),
        ("x=3", "gave 1 dimensions, the model declares 2"),
        ("x=3,8,1", "gave 3 dimensions, the model declares 2"),
        ("x=a,8", "dimensions must be integers"),
        ("x=2.5,8", "dimensions must be integers"),
        ("x=-1,8", "dimensions must be >= 0"),
        ("x", "is not NAME=D0,D1,..."),
        ("=3,8", "is not NAME=D0,D1,..."),
        ("x=3,9", "dimension 1 is fixed to 8"),
    ],
)
@pytest.mark.parametrize("command", ["inspect", "plan"])
def test_bad_input_shape(run_cli, tmp_path, outputs, spec, needle, command):
    path = save(long_reuse_model(dynamic=True), tmp_path / "dyn.onnx")
    args = [command, path] if command == "inspect" else [command, path, "-o", outputs.new]
    assert_clean_failure(run_cli(*args, "--input-shape", spec), needle)
    outputs.assert_untouched()


PASTS = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[N, 4] x, float[B, P, 4] past_0, float[C, Q, 4] past_1)
  => (float[N, 4] y, float[B, P, 4] p0, float[C, Q, 4] p1) {
  y = Relu(x)
  p0 = Neg(past_0)
  p1 = Neg(past_1)
}
"""


def test_an_input_shape_pattern_pins_every_input_it_matches(run_cli, write_model, tmp_path, outputs):
    """A dynamo export names each past input's dimensions apart: one pattern pins them all; a name
    given exactly wins; a pattern that matches nothing, or two that disagree on one input, are one
    clear error each, with nothing written."""
    path = write_model(PASTS)
    out = tmp_path / "plan.json"
    res = run_cli("plan", path, "-o", out, "--input-shape", "past_*=1,3,4", "--input-shape", "x=2,4")
    assert res.exit_code == 0, res.stderr
    assert "unknown dimensions" not in res.stderr
    shapes = json.loads(out.read_text())["model"]["input_shapes"]
    assert shapes == {"x": [2, 4], "past_0": [1, 3, 4], "past_1": [1, 3, 4]}
    exact = run_cli(
        "plan",
        path,
        "-o",
        out,
        "--input-shape",
        "past_*=1,3,4",
        "--input-shape",
        "past_1=2,5,4",
        "--input-shape",
        "x=2,4",
    )
    assert exact.exit_code == 0, exact.stderr
    assert json.loads(out.read_text())["model"]["input_shapes"]["past_1"] == [2, 5, 4]
    none = run_cli("plan", path, "-o", outputs.new, "--input-shape", "cache.*=1,3,4")
    assert_clean_failure(none, "pattern 'cache.*' matches no input")
    clash = run_cli("plan", path, "-o", outputs.new, "--input-shape", "past_*=1,3,4", "--input-shape", "p*=2,3,4")
    assert_clean_failure(clash, "which give it different shapes")
    outputs.assert_untouched()


def test_input_shape_given_twice(run_cli, tmp_path, outputs):
    path = save(long_reuse_model(dynamic=True), tmp_path / "dyn.onnx")
    res = run_cli("plan", path, "-o", outputs.new, "--input-shape", "x=3,8", "--input-shape", "x=4,8")
    assert_clean_failure(res, "input 'x' twice")
    outputs.assert_untouched()


# ---------------------------------------------------------------------------------------------------
# Values MemcpyToHost/MemcpyFromHost cannot move, and models with nothing to offload
# ---------------------------------------------------------------------------------------------------

NOT_COPYABLE = """
<ir_version: 10, opset_import: ["" : 17]>
g (float[4,8] x) => (float[4,8] y, float[8,8] cat) {
    a = Relu(x)
    s = Cast<to = 8>(a)
    seq = SequenceConstruct(a, a)
    b = Neg(a)
    c = Neg(b)
    d = Neg(c)
    sf = Cast<to = 1>(s)
    cat = ConcatFromSequence<axis = 0>(seq)
    y = Add(d, sf)
}
"""


def test_strings_and_sequences_are_rejected_as_not_copyable(run_cli, write_model, tmp_path):
    path = write_model(NOT_COPYABLE)
    out = tmp_path / "plan.json"
    res = run_cli("plan", path, "-o", out, "--select-distance", "0", "--force", "*")
    assert res.exit_code == 0, res.stderr
    plan = read_plan(out)
    rejected = {r["tensor"]: r for r in plan["rejected"]}
    assert rejected["s"]["reason"] == "not-copyable" and "string" in rejected["s"]["detail"]
    assert rejected["seq"]["reason"] == "not-copyable" and "sequence" in rejected["seq"]["detail"]
    offloaded = {o["tensor"] for o in plan["offloads"]}
    assert {"s", "seq"}.isdisjoint(offloaded)
    assert {"a", "b", "c", "d", "sf"} <= offloaded  # the float tensors around them are still candidates


def test_string_weight_is_not_copyable(run_cli, tmp_path):
    names = numpy_helper.from_array(np.array(["a", "b"], dtype=object), "names")
    nodes = chain_nodes() + [
        helper.make_node("Identity", ["names"], ["names_out"], name="id_names"),
        helper.make_node("Relu", ["y"], ["z"], name="relu_z"),
        helper.make_node("Relu", ["z"], ["z2"], name="relu_z2"),
        helper.make_node("Identity", ["names"], ["names_again"], name="id_again"),
    ]
    outs = [
        tensor("z2"),
        tensor("names_out", (2,), TensorProto.STRING),
        tensor("names_again", (2,), TensorProto.STRING),
    ]
    path = save(make_model(nodes, [tensor("x")], outs, initializers=[names]), tmp_path / "m.onnx")
    out = tmp_path / "plan.json"
    assert run_cli("plan", path, "-o", out, "--select-distance", "0", "--params").exit_code == 0
    rejected = {r["tensor"]: r["reason"] for r in read_plan(out)["rejected"]}
    assert rejected["names"] == "not-copyable"


def test_nothing_worth_offloading_gives_a_valid_empty_plan(run_cli, tmp_path):
    out = tmp_path / "plan.json"
    res = run_cli("plan", SAMPLES / "mlp.onnx", "-o", out)
    assert res.exit_code == 0, res.stderr
    plan = read_plan(out)
    validate_plan(plan)
    assert plan["stage"] == "scheduled"
    assert plan["offloads"] == []
    assert plan["rejected"] and all(r["reason"] for r in plan["rejected"])
    _check_apply_of_empty_plan(run_cli, out, tmp_path)


def _check_apply_of_empty_plan(run_cli, plan_path: Path, tmp_path: Path) -> None:
    import onnxruntime as ort

    rewritten = tmp_path / "mlp.offload.onnx"
    res = run_cli("apply", plan_path, "-o", rewritten, "--model", SAMPLES / "mlp.onnx")
    assert res.exit_code == 0, res.stderr
    model = onnx.load(str(rewritten))
    assert not any(n.op_type.startswith("Memcpy") for n in model.graph.node)
    inputs = dict(np.load(SAMPLES / "mlp.inputs.npz"))
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    want = ort.InferenceSession(str(SAMPLES / "mlp.onnx"), so, providers=["CPUExecutionProvider"]).run(None, inputs)
    got = ort.InferenceSession(str(rewritten), so, providers=["CPUExecutionProvider"]).run(None, inputs)
    for w, g in zip(want, got):
        np.testing.assert_array_equal(w, g)


def test_an_empty_graph_plans_to_an_empty_plan(run_cli, tmp_path):
    path = save(make_model([], [tensor("x")], [tensor("x")]), tmp_path / "empty_graph.onnx")
    out = tmp_path / "plan.json"
    assert run_cli("plan", path, "-o", out).exit_code == 0
    plan = read_plan(out)
    assert plan["model"]["num_positions"] == 0 and plan["offloads"] == [] and plan["rejected"] == []


# ---------------------------------------------------------------------------------------------------
# offloadctl run
# ---------------------------------------------------------------------------------------------------


def _run_case(tmp_path: Path, case: str) -> tuple[list, list[str]]:
    seed = SAMPLES / "seed.onnx"
    if case == "missing-model":
        return [tmp_path / "nope.onnx"], ["nope.onnx", "does not exist"]
    if case == "truncated-model":
        _truncated(tmp_path / "cut.onnx")
        return [tmp_path / "cut.onnx"], ["cut.onnx", "not a valid ONNX model"]
    if case == "inputs-not-npz":
        (tmp_path / "in.npz").write_text("not an archive")
        return [seed, "--inputs", tmp_path / "in.npz"], ["in.npz"]
    if case == "inputs-wrong-name":
        np.savez(tmp_path / "in.npz", y=np.zeros((4, 8), np.float32))
        return [seed, "--inputs", tmp_path / "in.npz"], ["in.npz", "'y'"]
    if case == "inputs-wrong-shape":
        np.savez(tmp_path / "in.npz", x=np.zeros((3, 3), np.float32))
        return [seed, "--inputs", tmp_path / "in.npz"], ["in.npz", "'x'", "[3, 3]"]
    if case == "compare-to-missing":
        return [seed, "--compare-to", tmp_path / "nope.onnx"], ["nope.onnx", "does not exist"]
    if case == "ir-version-too-new":
        model = long_reuse_model()
        model.ir_version = 14
        save(model, tmp_path / "ir14.onnx")
        return [tmp_path / "ir14.onnx"], ["ir14.onnx", "IR version 14"]
    raise AssertionError(case)


@pytest.mark.parametrize(
    "case",
    [
        "missing-model",
        "truncated-model",
        "inputs-not-npz",
        "inputs-wrong-name",
        "inputs-wrong-shape",
        "compare-to-missing",
        "ir-version-too-new",
    ],
)
def test_run_bad_inputs(run_cli, tmp_path, case):
    args, needles = _run_case(tmp_path, case)
    assert_clean_failure(run_cli("run", *args, "--device", "cpu", "--repeat", "1"), *needles)


def test_run_refuses_a_plan_given_as_model(run_cli, plans):
    path, _ = plans["scheduled"]
    assert_clean_failure(run_cli("run", path, "--device", "cpu"), str(path), "offload plan")


@pytest.mark.parametrize(
    "stage, command, needle",
    [
        ("selected", ["filter"], None),
        ("selected", ["filter", "--budget", "1KiB"], "records no select options (options.select)"),
        ("filtered", ["prefetch"], None),
        ("scheduled", ["apply"], None),
        ("scheduled", ["simulate", SAMPLES / "seed.onnx", "--plan"], None),
    ],
)
def test_a_plan_without_its_optional_options_is_read_like_any_other(run_cli, tmp_path, plans, stage, command, needle):
    """The schema lets ``options`` leave out a stage's options (a plan written by hand): every command
    reads such a plan as one that records them, or says what it lacks (the budget strategy selects
    again with the select options)."""
    _, plan = plans[stage]
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({**plan, "options": {}}))
    out = tmp_path / ("out.onnx" if command[0] == "apply" else "out.json")
    res = run_cli(*command, bare, *([] if command[0] == "simulate" else ["-o", out]))
    if needle is None:
        assert res.exit_code == 0, res.stderr
    else:
        assert_clean_failure(res, "seed.onnx", needle)
        assert not out.exists()
