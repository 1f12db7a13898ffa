"""`offloadctl run`: device checks, inputs, the order check and the output comparison (CPU only)."""

from __future__ import annotations

import json
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from offloadctl.core.errors import OffloadError
from offloadctl.running.checks import compare_order
from offloadctl.running.sessions import (
    SESSION_METADATA_KEY,
    check_session_settings,
    import_onnxruntime,
    read_session_settings,
    session_config,
    settings_warnings,
)

from conftest import IR_VERSION, SAMPLE_NAMES, SAMPLES


def _save(model: onnx.ModelProto, path) -> str:
    onnx.save(model, str(path))
    return str(path)


def _with_settings(src, dst, settings: dict) -> str:
    model = onnx.load(str(src))
    entry = model.metadata_props.add()
    entry.key = SESSION_METADATA_KEY
    entry.value = json.dumps(settings)
    return _save(model, dst)


@pytest.mark.parametrize("name", SAMPLE_NAMES)
def test_sample_runs_on_cpu_and_matches_itself(run_cli, name):
    model = SAMPLES / f"{name}.onnx"
    result = run_cli(
        "run",
        model,
        "--device",
        "cpu",
        "--inputs",
        SAMPLES / f"{name}.inputs.npz",
        "--compare-to",
        model,
        "--opt-level",
        "disable",
        "--repeat",
        "2",
        "--json",
    )
    assert result.exit_code == 0, result.stderr
    doc = result.json()
    assert doc["device"] == "cpu"
    assert doc["providers"][0] == "CPUExecutionProvider"
    assert len(doc["latency_s"]["runs"]) == 2
    assert doc["latency_s"]["median"] > 0
    assert doc["order"]["matches"] is True
    assert doc["order"]["verdict"] == "as planned"
    assert doc["order"]["ran_count"] == doc["order"]["planned_count"] > 0
    expected_outputs = [o.name for o in onnx.load(str(model)).graph.output]
    assert list(doc["outputs"]) == expected_outputs
    assert set(doc["comparison"]) == set(expected_outputs)
    assert all(c["identical"] and c["max_abs"] == 0.0 for c in doc["comparison"].values())
    assert doc["tolerance"] == {"rtol": 0.0, "atol": 0.0}


def test_optimized_run_checks_relative_order(run_cli):
    result = run_cli(
        "run", SAMPLES / "transformer.onnx", "--device", "cpu", "--repeat", "1", "--opt-level", "all", "--json"
    )
    assert result.exit_code == 0, result.stderr
    order = result.json()["order"]
    assert order["mode"] == "relative" and order["matches"] is True
    assert 0 < order["ran_count"] <= order["planned_count"]


def test_default_run_verifies_the_plan_exactly(run_cli):
    result = run_cli(
        "run",
        SAMPLES / "seed.onnx",
        "--device",
        "cpu",
        "--repeat",
        "1",
        "--json",
        "--compare-to",
        SAMPLES / "seed.onnx",
    )
    assert result.exit_code == 0, result.stderr
    report = result.json()
    assert report["order"]["mode"] == "exact" and report["order"]["matches"] is True
    assert all(c["identical"] for c in report["comparison"].values())


def test_human_output_has_tables(run_cli):
    result = run_cli(
        "run",
        SAMPLES / "seed.onnx",
        "--device",
        "cpu",
        "--inputs",
        SAMPLES / "seed.inputs.npz",
        "--opt-level",
        "disable",
        "--repeat",
        "1",
    )
    assert result.exit_code == 0, result.stderr
    assert "CPUExecutionProvider" in result.stdout
    assert "as planned" in result.stdout
    assert "median" in result.stdout


def test_perturbed_weights_differ_and_exit_1(run_cli, tmp_path):
    model = onnx.load(str(SAMPLES / "mlp.onnx"))
    init = model.graph.initializer[0]
    array = numpy_helper.to_array(init).copy()
    array.flat[0] += 1.0
    init.CopyFrom(numpy_helper.from_array(array, init.name))
    perturbed = _save(model, tmp_path / "perturbed.onnx")
    result = run_cli(
        "run",
        perturbed,
        "--device",
        "cpu",
        "--inputs",
        SAMPLES / "mlp.inputs.npz",
        "--compare-to",
        SAMPLES / "mlp.onnx",
        "--json",
    )
    assert result.exit_code == 1
    doc = result.json()  # the report is still printed
    (out,) = doc["comparison"]
    assert doc["comparison"][out]["identical"] is False
    assert doc["comparison"][out]["within_tolerance"] is False
    assert doc["comparison"][out]["max_abs"] > 1e-3
    assert "differ" in result.stderr and out in result.stderr
    assert "Traceback" not in result.stderr


def test_tiny_difference_passes_tolerance_but_not_bit_equality(run_cli, tmp_path):
    model = onnx.load(str(SAMPLES / "seed.onnx"))
    init = model.graph.initializer[0]
    value = numpy_helper.to_array(init).astype(np.float32)
    init.CopyFrom(numpy_helper.from_array(np.nextafter(value, np.float32(np.inf)).astype(np.float32), init.name))
    nudged = _save(model, tmp_path / "nudged.onnx")
    common = (
        "run",
        nudged,
        "--device",
        "cpu",
        "--inputs",
        SAMPLES / "seed.inputs.npz",
        "--compare-to",
        SAMPLES / "seed.onnx",
        "--repeat",
        "1",
        "--json",
    )
    loose = run_cli(*common, "--rtol", "1e-3", "--atol", "1e-5")
    assert loose.exit_code == 0, loose.stderr
    assert loose.json()["comparison"]["out"]["identical"] is False
    assert loose.json()["comparison"]["out"]["within_tolerance"] is True
    strict = run_cli(*common, "--opt-level", "disable")
    assert strict.exit_code == 1
    assert strict.json()["comparison"]["out"]["within_tolerance"] is False


def test_ascend_without_toolkit_fails_clearly(run_cli):
    assert "CANNExecutionProvider" in ort.get_available_providers()  # onnxruntime-cann, no toolkit here
    result = run_cli("run", SAMPLES / "seed.onnx", "--device", "ascend", "--json")
    assert result.exit_code == 1
    assert result.stdout == ""
    assert "onnxruntime is not using CANNExecutionProvider" in result.stderr
    assert "CANN toolkit" in result.stderr and "set_env.sh" in result.stderr and "--device cpu" in result.stderr
    assert "Traceback" not in result.stderr


def test_cuda_not_available_fails_clearly(run_cli):
    assert "CUDAExecutionProvider" not in ort.get_available_providers()
    result = run_cli("run", SAMPLES / "seed.onnx", "--device", "cuda")
    assert result.exit_code == 1
    assert "CUDAExecutionProvider is not available" in result.stderr
    assert "offloadctl[cuda]" in result.stderr
    assert "Traceback" not in result.stderr


def test_npz_missing_input_is_named(run_cli, tmp_path):
    inputs = dict(np.load(SAMPLES / "training.inputs.npz"))
    del inputs["target"]
    np.savez(tmp_path / "partial.npz", **inputs)
    result = run_cli("run", SAMPLES / "training.onnx", "--device", "cpu", "--inputs", tmp_path / "partial.npz")
    assert result.exit_code == 1
    assert "lacks input 'target'" in result.stderr
    assert "Traceback" not in result.stderr


def test_npz_extra_input_and_wrong_dtype_and_shape(run_cli, tmp_path):
    x = np.load(SAMPLES / "seed.inputs.npz")["x"]
    cases = {
        "extra.npz": ({"x": x, "y": x}, "'y', which is not an input"),
        "dtype.npz": ({"x": x.astype(np.float64)}, "dtype float64"),
        "shape.npz": ({"x": x.reshape(8, 4)}, "shape [8, 4]"),
    }
    for file_name, (arrays, message) in cases.items():
        np.savez(tmp_path / file_name, **arrays)
        result = run_cli("run", SAMPLES / "seed.onnx", "--device", "cpu", "--inputs", tmp_path / file_name)
        assert result.exit_code == 1, file_name
        assert message in result.stderr, (file_name, result.stderr)


def test_ir_version_14_is_explained(run_cli, tmp_path):
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])  # default IR version
    assert model.ir_version == 14
    path = _save(model, tmp_path / "ir14.onnx")
    result = run_cli("run", path, "--device", "cpu")
    assert result.exit_code == 1
    assert "has IR version 14, newer than this onnxruntime" in result.stderr
    assert "ir_version = 13" in result.stderr
    assert "Traceback" not in result.stderr


def test_missing_and_corrupt_model_files(run_cli, tmp_path):
    result = run_cli("run", tmp_path / "nope.onnx", "--device", "cpu")
    assert result.exit_code == 1 and "does not exist" in result.stderr
    (tmp_path / "bad.onnx").write_bytes(b"\x08\x07garbage that is not a model")
    result = run_cli("run", tmp_path / "bad.onnx", "--device", "cpu")
    assert result.exit_code == 1 and "bad.onnx" in result.stderr
    assert "Traceback" not in result.stderr


def test_generated_int64_bool_and_dynamic_inputs(run_cli, write_model):
    path = write_model(
        """
        <ir_version: 10, opset_import: ["" : 17]>
        g (int64[3] idx, bool[2] flag, float[N, 4] x) => (float[3, 2] picked, bool[2] inverted, float[N, 4] y)
        <float[4, 2] table = {1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0}>
        {
            picked = Gather <axis = 0> (table, idx)
            inverted = Not (flag)
            y = Relu (x)
        }
        """
    )
    refused = run_cli("run", path, "--device", "cpu", "--repeat", "1", "--json")
    assert refused.exit_code == 1 and refused.stdout == ""  # no size is invented for N
    assert "cannot generate input 'x'" in refused.stderr and "dimension(s) 0 (N) are dynamic" in refused.stderr
    assert "--input-shape x=N,4" in refused.stderr and "--dim N=SIZE" in refused.stderr
    for pin in (("--input-shape", "x=3,4"), ("--input-shape", "x:[3,4]"), ("--dim", "N=3")):
        result = run_cli("run", path, "--device", "cpu", "--repeat", "1", "--json", *pin)
        assert result.exit_code == 0, result.stderr
        assert result.json()["inputs"]["x"]["shape"] == [3, 4]
    doc = result.json()
    assert doc["inputs"]["idx"] == {"shape": [3], "dtype": "int64", "source": "generated"}
    assert doc["inputs"]["flag"]["dtype"] == "bool"
    assert "table" not in doc["inputs"]
    assert doc["outputs"]["picked"] == {"shape": [3, 2], "dtype": "float32"}


def _non_topological_model(tmp_path) -> str:
    # File order: second, first, third; onnxruntime must run `first` before `second`.
    nodes = [
        helper.make_node("Mul", ["a", "a"], ["c"], name="second"),
        helper.make_node("Relu", ["x"], ["a"], name="first"),
        helper.make_node("Neg", ["c"], ["y"], name="third"),
    ]
    graph = helper.make_graph(
        nodes,
        "unsorted",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=IR_VERSION)
    return _save(model, tmp_path / "unsorted.onnx")  # not topologically sorted: check_model would refuse


def test_an_unsorted_file_is_predicted_in_the_order_onnxruntime_runs(run_cli, tmp_path):
    path = _non_topological_model(tmp_path)
    result = run_cli("run", path, "--device", "cpu", "--opt-level", "disable", "--repeat", "1", "--json")
    assert result.exit_code == 0, result.stderr
    assert result.json()["order"]["matches"] is True


def test_order_check_detects_a_different_order(run_cli, tmp_path, monkeypatch):
    """When onnxruntime runs another order than predicted, run warns, and fails with --strict-order."""
    import onnx

    import offloadctl.running.checks

    path = _non_topological_model(tmp_path)
    file_order = [n.name for n in onnx.load(str(path)).graph.node]
    monkeypatch.setattr(
        offloadctl.running.checks, "expected_run_order", lambda proto, order="priority": file_order
    )  # a wrong prediction
    result = run_cli("run", path, "--device", "cpu", "--opt-level", "disable", "--repeat", "1", "--json")
    assert result.exit_code == 0  # a warning, not a failure
    order = result.json()["order"]
    assert order["matches"] is False
    assert order["first_differences"][0] == {"index": 0, "planned": "second", "ran": "first"}
    assert any("planned (file) order" in w for w in result.json()["warnings"])
    strict = run_cli("run", path, "--device", "cpu", "--opt-level", "disable", "--repeat", "1", "--strict-order")
    assert strict.exit_code == 1
    assert "did not run in the planned (file) order" in strict.stderr


def test_compare_order_modes():
    planned = ["a", "b", "c", "d"]
    assert compare_order(planned, ["a", "b", "c", "d", "Memcpy"], exact=True).matches
    fused = compare_order(planned, ["a", "c", "d"], exact=False)
    assert fused.matches and fused.missing == ["b"]
    assert not compare_order(planned, ["a", "c", "d"], exact=True).matches
    swapped = compare_order(planned, ["a", "c", "b", "d"], exact=False)
    assert not swapped.matches
    assert swapped.first_differences[0] == {"index": 1, "planned": "b", "ran": "c"}


def test_metadata_settings_are_used(run_cli, tmp_path):
    path = _with_settings(
        SAMPLES / "seed.onnx",
        tmp_path / "seed.meta.onnx",
        {
            "execution_order": "PRIORITY_BASED",
            "disabled_optimizers": ["ConstantFolding"],
            "cann": {"enable_cann_graph": "0"},
        },
    )
    result = run_cli("run", path, "--device", "cpu", "--compare-to", SAMPLES / "seed.onnx", "--repeat", "1", "--json")
    assert result.exit_code == 0, result.stderr
    doc = result.json()
    assert doc["session"]["disabled_optimizers"] == ["ConstantFolding"]
    assert doc["warnings"] == []
    assert doc["comparison"]["out"]["identical"] is True


def test_session_config_for_ascend_defaults_metadata_and_overrides():
    settings = {"disabled_optimizers": ["ConstantFolding"], "cann": {"device_id": "1"}}
    so, providers, kwargs, *_ = session_config(
        settings, "ascend", opt_level="basic", ep_options={"enable_cann_graph": "1"}
    )
    assert so.execution_order == ort.ExecutionOrder.PRIORITY_BASED
    assert so.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    assert providers == [
        (
            "CANNExecutionProvider",
            {"enable_cann_graph": "1", "arena_extend_strategy": "kSameAsRequested", "device_id": "1"},
        ),
        "CPUExecutionProvider",
    ]
    assert kwargs == {"enable_fallback": 0, "disabled_optimizers": ["ConstantFolding"]}
    _, cuda_providers, *_ = session_config({}, "cuda", ep_options={"device_id": "2"})
    assert cuda_providers == [("CUDAExecutionProvider", {"device_id": "2"}), "CPUExecutionProvider"]


def test_check_session_settings_for_a_users_session(tmp_path):
    path = _with_settings(
        SAMPLES / "seed.onnx",
        tmp_path / "seed.meta.onnx",
        {
            "execution_order": "PRIORITY_BASED",
            "disabled_optimizers": ["ConstantFolding"],
            "cann": {"enable_cann_graph": "0"},
        },
    )
    warnings = check_session_settings(
        path, ort.SessionOptions(), None, ["CANNExecutionProvider", "CPUExecutionProvider"]
    )
    assert len(warnings) == 3
    assert "PRIORITY_BASED" in warnings[0] and "DEFAULT" in warnings[0]
    assert "ConstantFolding" in warnings[1]
    assert "enable_cann_graph=0" in warnings[2] and "enable_cann_graph=1 (the provider's default)" in warnings[2]
    so, providers, kwargs, *_ = session_config({"cann": {"enable_cann_graph": "0"}}, "ascend")
    assert check_session_settings(path, so, ["ConstantFolding"], providers) == []
    assert check_session_settings(path, so, ["ConstantFolding"], {"cann": {"enable_cann_graph": "false"}}) == []
    assert check_session_settings(SAMPLES / "seed.onnx", ort.SessionOptions(), None, None) == []


def test_ep_option_against_metadata_warns(run_cli, tmp_path):
    path = _with_settings(SAMPLES / "seed.onnx", tmp_path / "m.onnx", {"cann": {"enable_cann_graph": "0"}})
    settings = read_session_settings(path)
    assert settings == {"cann": {"enable_cann_graph": "0"}}
    so, providers, kwargs, *_ = session_config(settings, "ascend", ep_options={"enable_cann_graph": "1"})
    warnings = settings_warnings(settings, so, kwargs.get("disabled_optimizers"), providers)
    assert len(warnings) == 1 and "enable_cann_graph=0" in warnings[0]


def test_missing_onnxruntime_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(OffloadError) as info:
        import_onnxruntime("ascend")
    assert info.value.message == "onnxruntime is not installed"
    assert "offloadctl[cann]" in info.value.hint


def test_bad_metadata_names_the_file(run_cli, tmp_path):
    model = onnx.load(str(SAMPLES / "seed.onnx"))
    entry = model.metadata_props.add()
    entry.key = SESSION_METADATA_KEY
    entry.value = "{not json"
    path = _save(model, tmp_path / "badmeta.onnx")
    result = run_cli("run", path, "--device", "cpu")
    assert result.exit_code == 1
    assert "badmeta.onnx" in result.stderr and SESSION_METADATA_KEY in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("name", SAMPLE_NAMES)
def test_applied_plan_is_exact_and_runs_as_planned(run_cli, tmp_path, name):
    model = SAMPLES / f"{name}.onnx"
    plan, rewritten = tmp_path / "plan.json", tmp_path / f"{name}.offload.onnx"
    made = run_cli("plan", model, "-o", plan, "--select-distance", "1", "--prefetch-distance", "2", "--params")
    assert made.exit_code == 0, made.stderr
    applied = run_cli("apply", plan, "-o", rewritten)
    assert applied.exit_code == 0, applied.stderr
    copies = sum(n.op_type in ("MemcpyToHost", "MemcpyFromHost") for n in onnx.load(str(rewritten)).graph.node)
    assert copies > 0

    result = run_cli(
        "run",
        rewritten,
        "--device",
        "cpu",
        "--inputs",
        SAMPLES / f"{name}.inputs.npz",
        "--compare-to",
        model,
        "--opt-level",
        "disable",
        "--repeat",
        "1",
        "--strict-order",
        "--json",
    )
    assert result.exit_code == 0, result.stderr
    doc = result.json()
    assert all(c["identical"] for c in doc["comparison"].values())
    assert doc["order"]["verdict"] == "as planned"
    assert doc["order"]["ran_count"] == doc["order"]["planned_count"]  # every copy node ran, in file order
    assert doc["order"]["planned_count"] == len(_planned_nodes(rewritten))
    assert doc["session"]["disabled_optimizers"] == ["ConstantFolding"]
    assert doc["session"]["model_settings"]["execution_order"] == "PRIORITY_BASED"
    assert doc["warnings"] == []


def _planned_nodes(path) -> list[str]:
    return [n.name for n in onnx.load(str(path)).graph.node if n.op_type != "Constant"]


def test_generated_rank0_bool_input_runs(run_cli, write_model):
    path = write_model("""
    <ir_version: 10, opset_import: ["" : 17]>
    g (float[2] x, bool c) => (float[2] y) {
        y = If(c) <then_branch = g1 () => (float[2] a) { a = Neg(x) },
                   else_branch = g2 () => (float[2] b) { b = Relu(x) }>
    }
    """)
    result = run_cli("run", path, "--device", "cpu", "--repeat", "1", "--json")
    assert result.exit_code == 0, result.stderr
    assert result.json()["outputs"]["y"]["shape"] == [2]


def test_offloaded_matmul_weight_is_bit_identical_by_default(run_cli, tmp_path):
    # onnxruntime pre-packs constant MatMul weights, not ones that arrive through MemcpyFromHost,
    # and the two paths round differently for a single-row input; the verifying run compares like
    # with like.
    rng = np.random.default_rng(3)
    weight = numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"], name="mm")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("m", TensorProto.FLOAT, [1, 64])],
        initializer=[weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = IR_VERSION
    path = _save(model, tmp_path / "mm.onnx")
    plan, out = tmp_path / "plan.json", tmp_path / "out.onnx"
    assert run_cli("plan", path, "-o", plan, "--params", "--force", "w", "--select-distance", "0").exit_code == 0
    assert run_cli("apply", plan, "-o", out).exit_code == 0
    result = run_cli("run", out, "--device", "cpu", "--compare-to", path, "--repeat", "1", "--json")
    assert result.exit_code == 0, result.stderr
    assert result.json()["comparison"]["m"]["identical"] is True


def test_compare_to_a_model_with_other_inputs_is_refused_clearly(run_cli):
    result = run_cli("run", SAMPLES / "seed.onnx", "--device", "cpu", "--compare-to", SAMPLES / "mlp.onnx")
    assert result.exit_code == 1
    assert "expects input 'x'" in result.stderr and "made from" in result.stderr
    assert "INVALID_ARGUMENT" not in result.stderr


_NOISY = """
<ir_version: 10, opset_import: ["" : 17]>
g (float[4, 8] x) => (float[4, 8] y, float[4, 8] z) {
    noise = RandomNormalLike<dtype = 1SEED>(x)
    y = Add(x, noise)
    z = Neg(x)
}
"""


def test_an_original_that_is_not_deterministic_is_reported_and_the_rewrite_not_blamed(run_cli, tmp_path):
    original, other = tmp_path / "noisy.onnx", tmp_path / "other.onnx"
    onnx.save(onnx.parser.parse_model(_NOISY.replace("SEED", "")), str(original))
    onnx.save(onnx.parser.parse_model(_NOISY.replace("SEED", ", seed = 7.0")), str(other))
    args = ("--device", "cpu", "--repeat", "1", "--compare-to", original)
    same = run_cli("run", original, *args, "--json")  # a session's first run repeats; its second does not
    assert same.exit_code == 0
    report = json.loads(same.stdout)
    assert report["original_deterministic"] is False and list(report["original_unstable"]) == ["y"]
    assert "is not deterministic on these inputs: y differ between two of its runs" in " ".join(same.stderr.split())
    result = run_cli("run", other, *args)
    assert result.exit_code == 1 and "Traceback" not in result.stderr
    words = " ".join(result.stderr.split())
    assert "is not deterministic on these inputs: two runs of it give different y" in words
    assert "the rewrite changed the results" not in words


def test_a_deterministic_original_compared_with_itself_passes(run_cli, seed_path):
    result = run_cli("run", seed_path, "--device", "cpu", "--repeat", "1", "--compare-to", seed_path, "--json")
    assert result.exit_code == 0
    assert json.loads(result.stdout)["original_deterministic"] is True


@pytest.mark.parametrize("original_fails", ["refused", "otherwise", "not at all"])
def test_a_refused_rewrite_blames_the_model_only_when_onnxruntime_refuses_the_original_too(monkeypatch, original_fails):
    """With --compare-to, a rewrite onnxruntime refuses is tried against its original: the message says
    the rewrite is not the cause only when onnxruntime refuses the original too; any other outcome
    keeps the rewrite's own message and hint."""
    from offloadctl.core.errors import OffloadError
    from offloadctl.running import runner

    def original_session(*args, **kwargs):
        if original_fails == "refused":
            raise runner.ModelRefused("onnxruntime cannot load orig.onnx", "Add(6) is not implemented")
        if original_fails == "otherwise":
            raise OffloadError("orig.onnx has IR version 99, newer than this onnxruntime supports")
        return object()

    monkeypatch.setattr(runner, "_original_config", lambda *args: (None, None))
    monkeypatch.setattr(runner, "create_session", original_session)
    monkeypatch.setattr(runner, "feeds_for", lambda *args: {})
    monkeypatch.setattr(runner, "run_once", lambda *args: {})
    refusal = runner.ModelRefused("onnxruntime cannot load out.onnx", "Add(6) is not implemented", hint="own hint")
    with pytest.raises(OffloadError) as caught:
        with runner._original_refused_too(str(SAMPLES / "seed.onnx"), {}, "cpu", "disable", None, None):
            raise refusal
    if original_fails == "refused":
        assert "refuses the original" in caught.value.message and "Add(6) is not implemented)" in caught.value.message
        assert caught.value.hint != "own hint"
    else:
        assert caught.value is refusal


def test_a_rewrite_run_at_shapes_other_than_planned_says_its_figures_are_the_planned_ones(
    run_cli, write_model, tmp_path
):
    """Planned at N=8 and run at N=2: the figures its plan quotes are those of N=8, and run says so with the
    pins that plan for this run; at the planned shapes (its own, generated) it says nothing."""
    path = write_model(
        """<ir_version: 10, opset_import: ["" : 17]>
        g (float[N, 64] x) => (float[N, 64] y)
        { a = Relu(x) b = Sin(a) c = Cos(b) d = Sin(c) e = Cos(d) y = Add(e, a) }"""
    )
    plan, out = tmp_path / "plan.json", tmp_path / "m.offload.onnx"
    assert run_cli("plan", path, "-o", plan, "--dim", "N=8", "--select-distance", "1").exit_code == 0
    assert run_cli("apply", plan, "-o", out).exit_code == 0
    same = run_cli("run", out, "--device", "cpu", "--repeat", "1", "--json")
    assert same.exit_code == 0 and not [w for w in same.json()["warnings"] if "was planned at" in w]
    other = run_cli("run", out, "--device", "cpu", "--repeat", "1", "--input-shape", "x=2,64", "--json")
    assert other.exit_code == 0, other.stderr
    [warning] = [w for w in other.json()["warnings"] if "was planned at" in w]
    assert f"{out} was planned at x=8,64 and runs at x=2,64 here" in warning
    assert "plan again with --input-shape x=2,64" in warning
