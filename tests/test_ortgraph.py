"""Positions count what onnxruntime runs: the rewrites it applies at every optimization level.

Each kind of rewrite (offloadctl.loading.ortgraph) is checked against onnxruntime itself: the planned
positions leave out what it removes and include what it adds, `run` finds the untouched original
and the rewritten model both run exactly as predicted, and the rewrite is bit-identical.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from offloadctl.analysis.graph import analyse
from offloadctl.analysis.order import expected_run_order
from offloadctl.loading.model import load_model
from offloadctl.loading.ortgraph import normalize

from models import IR_VERSION, OPSET, save, tensor

ort = pytest.importorskip("onnxruntime")


def _model(nodes, inputs, outputs, inits=(), opset=OPSET):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model, full_check=True)
    return model


def _ran(path) -> list[str]:
    """Node names in the order onnxruntime ran them (CPU, optimizations off, PRIORITY_BASED)."""
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    so.enable_profiling = True
    so.profile_file_prefix = str(path.parent / "profile")
    session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    feeds = {}
    for i in session.get_inputs():
        shape = [d if isinstance(d, int) else 1 for d in i.shape]
        feeds[i.name] = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    session.run(None, feeds)
    events = json.loads(open(session.end_profiling()).read())
    kernels = sorted(
        (e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")), key=lambda e: e["ts"]
    )
    return [e["name"][: -len("_kernel_time")] for e in kernels]


def cast(src: str, dst: str, to: int, name: str) -> onnx.NodeProto:
    return helper.make_node("Cast", [src], [dst], to=to, name=name)


def relu(src: str, dst: str, name: str) -> onnx.NodeProto:
    return helper.make_node("Relu", [src], [dst], name=name)


F, D, H, I32, I64 = TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.INT32, TensorProto.INT64

# name -> (nodes, outputs, the nodes onnxruntime removes)
CAST_CASES = {
    "float->double->float (a lossless pair)": (
        [relu("x", "r", "r0"), cast("r", "a", D, "c1"), cast("a", "b", F, "c2"), relu("b", "y", "r1")],
        [tensor("y")],
        {"c1", "c2"},
    ),
    "same type twice": (
        [relu("x", "r", "r0"), cast("r", "a", F, "c1"), cast("a", "b", F, "c2"), relu("b", "y", "r1")],
        [tensor("y")],
        {"c1", "c2"},
    ),
    "a cast read only by casts": (
        [
            relu("x", "r", "r0"),
            cast("r", "a", D, "c1"),
            cast("a", "b", F, "c2"),
            cast("a", "c", I64, "c3"),
            relu("b", "y", "r1"),
        ],
        [tensor("y"), tensor("c", elem_type=I64)],
        {"c1", "c2"},
    ),
    "float->half->float loses precision: kept": (
        [relu("x", "r", "r0"), cast("r", "a", H, "c1"), cast("a", "b", F, "c2"), relu("b", "y", "r1")],
        [tensor("y")],
        set(),
    ),
    "float->int->float loses precision: kept": (
        [relu("x", "r", "r0"), cast("r", "a", I32, "c1"), cast("a", "b", F, "c2"), relu("b", "y", "r1")],
        [tensor("y")],
        set(),
    ),
    "a pair read by a graph output: the second kept": (
        [relu("x", "r", "r0"), cast("r", "a", D, "c1"), cast("a", "y", F, "c2")],
        [tensor("y")],
        {"c1"},
    ),
    "a cast of a graph input": (
        [cast("x", "a", D, "c1"), cast("a", "b", F, "c2"), relu("b", "y", "r1")],
        [tensor("y")],
        {"c1", "c2"},
    ),
    "a single same-type cast: kept": ([cast("x", "a", F, "c1"), relu("a", "y", "r1")], [tensor("y")], set()),
    "float->double->half->float": (
        [relu("x", "r", "r0"), cast("r", "a", D, "c1"), cast("a", "b", H, "c2"), cast("b", "y", F, "c3")],
        [tensor("y")],
        {"c1"},
    ),
}


@pytest.mark.parametrize("case", sorted(CAST_CASES))
def test_removed_casts_take_no_position(tmp_path, case):
    nodes, outputs, removed = CAST_CASES[case]
    path = save(_model(nodes, [tensor("x")], outputs), tmp_path / "m.onnx")
    ran = _ran(path)
    assert set(n.name for n in nodes) - set(ran) == removed  # what onnxruntime itself drops
    assert expected_run_order(onnx.load(str(path))) == ran
    analysis = analyse(load_model(path))
    assert analysis.node_names == ran  # planning counts exactly what runs


def _shared_dq_model():
    wq = numpy_helper.from_array(np.arange(9, dtype=np.int8).reshape(3, 3), "wq")
    scale = numpy_helper.from_array(np.array(0.5, np.float32), "scale")
    zero = numpy_helper.from_array(np.array(0, np.int8), "zero")
    nodes = [
        relu("x", "a", "r0"),
        helper.make_node("DequantizeLinear", ["wq", "scale", "zero"], ["w"], name="dq"),
        helper.make_node("MatMul", ["a", "w"], ["b"], name="mm1"),
        relu("b", "c", "r1"),
        relu("x", "e", "r2"),
        helper.make_node("MatMul", ["c", "w"], ["y"], name="mm2"),
        helper.make_node("Add", ["y", "e"], ["z"], name="add"),
    ]
    return _model(nodes, [tensor("x", (2, 3))], [tensor("z", (2, 3))], [wq, scale, zero])


def test_a_shared_dequantize_gets_a_copy_per_reader(tmp_path):
    path = save(_shared_dq_model(), tmp_path / "m.onnx")
    ran = _ran(path)
    assert "dq/duplicated" in ran  # onnxruntime duplicated it ...
    assert expected_run_order(onnx.load(str(path))) == ran  # ... and runs the copy late, as predicted
    analysis = analyse(load_model(path))
    assert (
        analysis.node_names.index("dq/duplicated") == analysis.node_names.index("mm2") - 1
    )  # planned before its reader
    assert analysis.infos["w/duplicated"].bytes == 36


def test_normalize_reaches_a_fixed_point_onnxruntime_leaves_alone(tmp_path):
    nodes, outputs, _ = CAST_CASES["float->double->half->float"]
    model = _model(nodes, [tensor("x")], outputs)
    first = normalize(model)
    assert first.casts_removed >= 1 and not normalize(model).changed
    path = save(model, tmp_path / "normalized.onnx")
    assert _ran(path) == [n.name for n in model.graph.node]


@pytest.mark.parametrize("maker", ["casts", "dequantize"])
def test_plans_apply_and_run_as_planned_on_both_kinds(run_cli, tmp_path, maker):
    if maker == "casts":
        nodes = [relu("x", "r", "r0"), cast("r", "a", D, "c1"), cast("a", "b", F, "c2")]
        nodes += [
            relu("b", "b1", "n1"),
            relu("b1", "b2", "n2"),
            relu("b2", "b3", "n3"),
            helper.make_node("Add", ["b3", "r"], ["y"], name="add"),
        ]
        model = _model(nodes, [tensor("x")], [tensor("y")])
    else:
        model = _shared_dq_model()
    path = save(model, tmp_path / "m.onnx")
    original = run_cli("run", path, "--device", "cpu", "--json")
    assert original.exit_code == 0, original.stderr
    assert original.json()["order"]["verdict"] == "as planned"
    plan = tmp_path / "p.json"
    res = run_cli("plan", path, "-o", plan, "--select-distance", "1", "--prefetch-distance", "0", "--params")
    assert res.exit_code == 0, res.stderr
    assert json.loads(plan.read_text())["offloads"]
    out = tmp_path / "o.onnx"
    assert run_cli("apply", plan, "-o", out).exit_code == 0
    res = run_cli("run", out, "--device", "cpu", "--compare-to", path, "--json", "--strict-order")
    assert res.exit_code == 0, res.stderr
    doc = res.json()
    assert doc["order"]["verdict"] == "as planned" and doc["order"]["mode"] == "exact"
    assert all(c["identical"] for c in doc["comparison"].values())


def test_inlined_function_bodies_are_predicted_for_untouched_originals(run_cli, tmp_path):
    """onnxruntime appends the bodies it inlines: the original's order check predicts where they run."""
    nodes = [
        relu("x", "a", "r0"),
        helper.make_node("HardSwish", ["a"], ["h"], name="hs"),
        relu("x", "e", "r1"),
        helper.make_node("Add", ["h", "e"], ["y"], name="add"),
    ]
    model = _model(nodes, [tensor("x")], [tensor("y")], opset=17)
    path = save(model, tmp_path / "m.onnx")
    res = run_cli("run", path, "--device", "cpu", "--json")
    assert res.exit_code == 0, res.stderr
    assert res.json()["order"]["verdict"] == "as planned"


def _if_model(then_nodes, then_out, outer_nodes, outputs, inits=()):
    then_branch = helper.make_graph(then_nodes, "then", [], [then_out])
    else_branch = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["e_out"], name="else_id")], "else", [], [tensor("e_out", (2, 3))]
    )
    nodes = outer_nodes + [
        helper.make_node("If", ["cond"], ["y"], then_branch=then_branch, else_branch=else_branch, name="branch")
    ]
    cond = helper.make_tensor_value_info("cond", TensorProto.BOOL, [])
    return _model(nodes, [tensor("x", (2, 3)), cond], outputs, inits)


def test_a_dequantize_also_read_inside_a_subgraph(tmp_path):
    wq = numpy_helper.from_array(np.arange(6, dtype=np.int8).reshape(2, 3), "wq")
    scale = numpy_helper.from_array(np.array(0.5, np.float32), "scale")
    outer = [
        helper.make_node("DequantizeLinear", ["wq", "scale"], ["w"], name="dq"),
        helper.make_node("Add", ["x", "w"], ["a"], name="add"),
    ]
    then = [helper.make_node("Mul", ["a", "w"], ["t_out"], name="then_mul")]
    model = _if_model(then, tensor("t_out", (2, 3)), outer, [tensor("y", (2, 3))], [wq, scale])
    path = save(model, tmp_path / "m.onnx")
    expected = expected_run_order(onnx.load(str(path)))
    assert "dq/duplicated" in expected  # the subgraph keeps the original, the Add gets a copy
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "profile")
    session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    session.run(None, {"x": np.ones((2, 3), np.float32), "cond": np.array(True)})
    events = json.loads(open(session.end_profiling()).read())
    ran = [
        e["name"][:-12]
        for e in sorted(
            (e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")), key=lambda e: e["ts"]
        )
    ]
    assert [n for n in ran if n in set(expected)] == expected
    analysis = analyse(load_model(path))
    assert analysis.node_names == ["dq", "dq/duplicated", "add", "branch"]


def test_casts_inside_a_subgraph_are_removed_there_too(tmp_path):
    then = [
        helper.make_node("Relu", ["x"], ["r"], name="t_relu"),
        helper.make_node("Cast", ["r"], ["d"], to=D, name="t_c1"),
        helper.make_node("Cast", ["d"], ["t_out"], to=F, name="t_c2"),
    ]
    model = _if_model(then, tensor("t_out", (2, 3)), [], [tensor("y", (2, 3))])
    normalized = onnx.ModelProto()
    normalized.CopyFrom(model)
    changes = normalize(normalized)
    assert changes.casts_removed == 1  # t_c1; t_c2 makes a subgraph output and stays
    then_graph = next(a.g for a in normalized.graph.node[0].attribute if a.name == "then_branch")
    assert [n.name for n in then_graph.node] == ["t_relu", "t_c2"]
    feeds = {"x": np.random.default_rng(1).standard_normal((2, 3)).astype(np.float32), "cond": np.array(True)}
    outs = []
    for m, name in ((model, "a.onnx"), (normalized, "b.onnx")):
        path = save(m, tmp_path / name)
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        outs.append(ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"]).run(None, feeds)[0])
    assert outs[0].tobytes() == outs[1].tobytes()
