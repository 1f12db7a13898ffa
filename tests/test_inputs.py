"""Input conventions users already type: --input-shape forms, --dim, and `run`'s inputs and outputs."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from offloadctl.core.errors import OffloadError
from offloadctl.loading.input_shapes import parse_dims, parse_input_shapes
from offloadctl.loading.model import load_model
from tests.conftest import SAMPLES

DYNAMIC = """
<ir_version: 10, opset_import: ["" : 17]>
g (float[batch, seq, 8] x, float[batch, 8] z) => (float[batch, seq, 8] y, float[batch, 8] w) {
    a = Relu(x)
    b = Neg(a)
    c = Neg(b)
    y = Add(c, a)
    w = Neg(z)
}
"""


@pytest.mark.parametrize("spec", ["x=2,3,8", "x:2,3,8", "x:[2,3,8]", "x:[2, 3, 8]"])
def test_input_shape_takes_the_polygraphy_and_onnxsim_forms(spec):
    assert parse_input_shapes([spec]) == {"x": [2, 3, 8]}


def test_input_shape_names_may_hold_separators_and_scalars_pin_too():
    assert parse_input_shapes(["input:0:[1,3]", "in=put=4,5", "s=", "t:[]"]) == {
        "input:0": [1, 3],
        "in=put": [4, 5],
        "s": [],
        "t": [],
    }


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("x:[1,3", "unbalanced brackets"),
        ("x:1,,3", "an empty dimension"),
        ("x:[a,3]", "dimensions must be integers"),
        ("x:-1,3", "dimensions must be >= 0"),
        ("x", "is not NAME=D0,D1"),
    ],
)
def test_bad_input_shapes_say_what_is_wrong(spec, needle):
    with pytest.raises(OffloadError, match=needle) as info:
        parse_input_shapes([spec])
    assert "input:[1,3,224,224]" in info.value.hint  # the hint shows every accepted form


def test_dim_pins_named_dimensions_everywhere_the_inputs_use_them(write_model):
    path = write_model(DYNAMIC)
    loaded = load_model(path, dims=parse_dims(["batch=2", "seq=5"]))
    inputs = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in loaded.proto.graph.input}
    assert inputs == {"x": [2, 5, 8], "z": [2, 8]}
    assert loaded.dims == {"batch": 2, "seq": 5}
    # a partial pin is kept too: z is fully known, x still depends on seq
    from offloadctl.analysis.graph import analyse

    analysis = analyse(load_model(path, dims={"batch": 2}))
    assert analysis.infos["w"].bytes == 2 * 8 * 4 and analysis.infos["a"].bytes is None


def test_dim_errors_name_the_dimension(write_model):
    path = write_model(DYNAMIC)
    with pytest.raises(OffloadError, match="'height', which is not a dimension of any input") as info:
        load_model(path, dims={"height": 3})
    assert "batch, seq" in info.value.hint
    with pytest.raises(OffloadError, match="--dim batch=3 contradicts --input-shape x"):
        load_model(path, input_shapes={"x": [2, 5, 8]}, dims={"batch": 3})
    for bad in ("batch", "batch=-1", "batch=x", "=3"):
        with pytest.raises(OffloadError, match="--dim"):
            parse_dims([bad])


def test_plan_records_dims_and_apply_and_simulate_reuse_them(run_cli, write_model, tmp_path):
    path = write_model(DYNAMIC)
    plan_path, out = tmp_path / "plan.json", tmp_path / "out.onnx"
    result = run_cli(
        "plan",
        path,
        "-o",
        plan_path,
        "--select-distance",
        "1",
        "--prefetch-distance",
        "0",
        "--dim",
        "batch=2",
        "--input-shape",
        "x:[2,5,8]",
    )
    assert result.exit_code == 0, result.stderr
    plan = json.loads(plan_path.read_text())
    assert plan["model"]["dims"] == {"batch": 2} and plan["model"]["input_shapes"] == {"x": [2, 5, 8]}
    assert {o["tensor"] for o in plan["offloads"]} == {"a"}  # its size is known through the pins
    assert run_cli("apply", plan_path, "-o", out).exit_code == 0
    sim = run_cli("simulate", path, "--plan", plan_path, "--json")
    assert sim.exit_code == 0, sim.stderr
    assert sim.json()["unknown_size"]["count"] == 0
    rewritten = onnx.load(str(out))
    # the rewritten model keeps the source's dynamic dimensions ...
    shapes = {v.name: [d.dim_value or d.dim_param for d in v.type.tensor_type.shape.dim] for v in rewritten.graph.input}
    declared = {
        v.name: [d.dim_value or d.dim_param for d in v.type.tensor_type.shape.dim]
        for v in onnx.load(str(path)).graph.input
    }
    assert shapes == declared and shapes != {"x": [2, 5, 8], "z": [2, 8]}
    # ... or the planning pins with --pin-shapes
    pinned = tmp_path / "pinned.onnx"
    assert run_cli("apply", plan_path, "-o", pinned, "--pin-shapes").exit_code == 0
    kept = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in onnx.load(str(pinned)).graph.input}
    assert kept == {"x": [2, 5, 8], "z": [2, 8]}
    # the rewritten model records the shapes it was planned at: `run` generates inputs of those sizes
    ran = run_cli("run", out, "--device", "cpu", "--repeat", "1", "--compare-to", path, "--json")
    assert ran.exit_code == 0, ran.stderr
    assert ran.json()["inputs"]["x"]["shape"] == [2, 5, 8]


def test_inspect_and_select_take_dim_too(run_cli, write_model, tmp_path):
    path = write_model(DYNAMIC)
    doc = run_cli("inspect", path, "--json", "--dim", "batch=1", "--dim", "seq=4").json()
    assert doc["activations"]["unknown_size"] == 0
    result = run_cli("select", path, "-o", tmp_path / "s.json", "--dim", "nope=1")
    assert result.exit_code == 1 and "'nope', which is not a dimension" in result.stderr


# ---------------------------------------------------------------------------------------------
# run: where inputs come from


def _seed_inputs():
    return dict(np.load(SAMPLES / "seed.inputs.npz"))


def _run_json(run_cli, *args):
    result = run_cli("run", SAMPLES / "seed.onnx", "--device", "cpu", "--repeat", "1", "--json", *args)
    assert result.exit_code == 0, result.stderr
    return result.json()


def test_run_reads_a_folder_of_npy_files_and_the_onnx_test_data_layout(run_cli, tmp_path):
    x = _seed_inputs()["x"]
    npy = tmp_path / "npy"
    npy.mkdir()
    np.save(npy / "x.npy", x)
    pb = tmp_path / "model" / "test_data_set_0"
    pb.mkdir(parents=True)
    (pb / "input_0.pb").write_bytes(numpy_helper.from_array(x).SerializeToString())  # unnamed: by position
    named = tmp_path / "named"
    named.mkdir()
    (named / "input_0.pb").write_bytes(numpy_helper.from_array(x, "x").SerializeToString())
    out = tmp_path / "outs.npz"
    reference = _run_json(run_cli, "--inputs", SAMPLES / "seed.inputs.npz", "--save-outputs", out)
    want = dict(np.load(out))
    for source in (npy, pb, pb.parent, named):
        doc = _run_json(run_cli, "--inputs", source, "--save-outputs", out)
        assert doc["inputs"]["x"]["shape"] == list(x.shape)
        got = dict(np.load(out))
        assert got.keys() == want.keys() and all(np.array_equal(got[k], want[k]) for k in want)
    assert reference["files_written"] == [str(out)]


def test_bad_input_folders_are_one_clear_error(run_cli, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "input_0.pb").write_bytes(b"\xff\xfe not a tensor")
    extra = tmp_path / "extra"
    extra.mkdir()
    np.save(extra / "x.npy", _seed_inputs()["x"])
    np.save(extra / "q.npy", _seed_inputs()["x"])
    for folder, needle in (
        (empty, "holds no NAME.npy files"),
        (bad, "not a serialized onnx TensorProto"),
        (extra, "'q', which is not an input"),
    ):
        result = run_cli("run", SAMPLES / "seed.onnx", "--device", "cpu", "--inputs", folder)
        assert result.exit_code == 1, folder
        assert needle in result.stderr and "Traceback" not in result.stderr


def test_seed_and_value_range_shape_the_random_inputs(run_cli, tmp_path, write_model):
    path = write_model("""
    <ir_version: 10, opset_import: ["" : 17]>
    g (float[64] x, int64[64] i) => (float[64] y, int64[64] j) {
        y = Identity(x)
        j = Identity(i)
    }
    """)

    def outputs(*args):
        out = tmp_path / "o.npz"
        result = run_cli("run", path, "--device", "cpu", "--repeat", "1", "--save-outputs", out, *args)
        assert result.exit_code == 0, result.stderr
        return dict(np.load(out))

    a, b, c = outputs("--seed", "1"), outputs("--seed", "1"), outputs("--seed", "2")
    assert np.array_equal(a["y"], b["y"]) and not np.array_equal(a["y"], c["y"])
    ranged = outputs("--value-range", "2,3", "--value-range", "i:[10,12]")
    assert ranged["y"].min() >= 2 and ranged["y"].max() < 3
    assert set(np.unique(ranged["j"])) <= {10, 11, 12} and ranged["j"].dtype == np.int64
    for bad, needle in (
        ("3,2", "LOW <= HIGH"),
        ("q:[0,1]", "'q', which is not an input"),
        ("0,nan", "finite"),
        ("i:[0.2,0.8]", "holds no int64 value"),
    ):
        result = run_cli("run", path, "--device", "cpu", "--value-range", bad)
        assert result.exit_code == 1 and needle in result.stderr, (bad, result.stderr)


def test_save_outputs_never_overwrites_an_input_and_writes_nothing_on_failure(run_cli, tmp_path):
    result = run_cli("run", SAMPLES / "seed.onnx", "--device", "cpu", "--save-outputs", SAMPLES / "seed.onnx")
    assert result.exit_code == 1 and "same file as the input" in result.stderr
    out = tmp_path / "o.npz"
    failed = run_cli(
        "run", SAMPLES / "seed.onnx", "--device", "cpu", "--inputs", tmp_path / "missing.npz", "--save-outputs", out
    )
    assert failed.exit_code == 1 and not out.exists()
    assert list(tmp_path.iterdir()) == []  # no temporary file left behind either


@pytest.mark.parametrize("value", ["nan", "inf", "-1", "NaN"])
def test_run_refuses_tolerances_that_are_not_tolerances(run_cli, value):
    for option in ("--rtol", "--atol"):
        result = run_cli(
            "run", SAMPLES / "seed.onnx", "--device", "cpu", "--compare-to", SAMPLES / "seed.onnx", option, value
        )
        assert result.exit_code == 2, (option, value)
        assert "finite number >= 0" in result.stderr


def test_run_model_refuses_nan_tolerances_too():
    from offloadctl.running.runner import run_model

    with pytest.raises(OffloadError, match="--rtol nan is not a tolerance"):
        run_model(str(SAMPLES / "seed.onnx"), "cpu", rtol=float("nan"))


def test_generated_inputs_are_what_a_language_model_expects():
    from onnx import TensorProto

    from offloadctl.running.inputs import InputSpec, generate_inputs

    specs = [
        InputSpec("input_ids", TensorProto.INT64, (2, 4)),
        InputSpec("attention_mask", TensorProto.INT64, (2, 7)),
        InputSpec("position_ids", TensorProto.INT64, (2, 4)),
        InputSpec("past_key_values.0.key", TensorProto.FLOAT, (2, 2, 3, 8)),
        InputSpec("seqlens_k", TensorProto.INT32, (2,)),
        InputSpec("total_sequence_length", TensorProto.INT32, ()),
        InputSpec("use_cache_branch", TensorProto.BOOL, (1,)),
    ]
    feeds, _ = generate_inputs(specs)
    assert (feeds["attention_mask"] == 1).all() and feeds["attention_mask"].dtype == np.int64
    assert feeds["position_ids"].tolist() == [[3, 4, 5, 6]] * 2  # after the 3 past positions
    assert feeds["seqlens_k"].tolist() == [6, 6] and feeds["seqlens_k"].dtype == np.int32
    assert int(feeds["total_sequence_length"]) == 7 and feeds["use_cache_branch"].tolist() == [True]
    assert feeds["past_key_values.0.key"].shape == (2, 2, 3, 8)
    # a shared KV buffer (onnxruntime-genai): the past is the whole context, the mask says what is past
    shared, _ = generate_inputs(
        [
            InputSpec("input_ids", TensorProto.INT64, (1, 4)),
            InputSpec("attention_mask", TensorProto.INT64, (1, 4)),
            InputSpec("past_key_values.0.key", TensorProto.FLOAT, (1, 2, 64, 8)),
            InputSpec("position_ids", TensorProto.INT64, (1, 4)),
        ]
    )
    assert shared["position_ids"].tolist() == [[0, 1, 2, 3]]
    # a range the user gives wins over the rule
    ranged, _ = generate_inputs(specs, value_ranges={"attention_mask": (0, 0)})
    assert (ranged["attention_mask"] == 0).all()
