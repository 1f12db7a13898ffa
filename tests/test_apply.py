"""`offloadctl apply`: rewritten models run, give the same outputs and run in the planned order."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from offloadctl.analysis.graph import analyse
from offloadctl.contract.document import write_plan
from offloadctl.core.errors import OffloadError
from offloadctl.core.files import sha256_file
from offloadctl.loading.model import load_model
from offloadctl.planning.make import scheduled_plan
from offloadctl.planning.request import PlanRequest
from offloadctl.rewriting.metadata import session_settings
from offloadctl.rewriting.rewrite import ApplyResult, RewriteOptions, apply_plan
from offloadctl.rewriting.writing import write_model

from models import idle_typed_model

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_models"
SAMPLE_NAMES = ["seed", "unet", "transformer", "training", "mlp"]
COPY_OPS = ("MemcpyToHost", "MemcpyFromHost")
DISABLE_ALL = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
ENABLE_ALL = ort.GraphOptimizationLevel.ORT_ENABLE_ALL


# ---------------------------------------------------------------------------------------------
# Helpers


def _session(
    path: Path,
    level,
    *,
    weights: bool = False,
    profile_prefix: Path | None = None,
    optimized: Path | None = None,
    order=ort.ExecutionOrder.PRIORITY_BASED,
):
    so = ort.SessionOptions()
    so.execution_order = order
    so.graph_optimization_level = level
    so.log_severity_level = 3
    if profile_prefix is not None:
        so.enable_profiling = True
        so.profile_file_prefix = str(profile_prefix)
    if optimized is not None:
        so.optimized_model_filepath = str(optimized)
    disabled = ["ConstantFolding"] if weights else []
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"], disabled_optimizers=disabled)


def _run(path: Path, feeds: dict, level=DISABLE_ALL, **kw) -> list[np.ndarray]:
    return _session(path, level, **kw).run(None, feeds)


def _profiled_order(path: Path, feeds: dict, prefix: Path, level=DISABLE_ALL, **kw) -> list[str]:
    sess = _session(path, level, profile_prefix=prefix, **kw)
    sess.run(None, feeds)
    events = json.loads(Path(sess.end_profiling()).read_text())
    kernels = sorted(
        (e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")), key=lambda e: e["ts"]
    )
    return [e["name"][: -len("_kernel_time")] for e in kernels]


def _file_order(model: onnx.ModelProto) -> list[str]:
    return [n.name for n in model.graph.node if n.op_type != "Constant"]


def _subgraph_node_count(graph: onnx.GraphProto) -> int:
    """Nodes inside If/Loop/Scan bodies: profiling reports them too, under onnxruntime's own names."""
    count = 0
    for node in graph.node:
        for attr in node.attribute:
            for sub in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs):
                count += len(sub.node) + _subgraph_node_count(sub)
    return count


def _copies(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [n for n in model.graph.node if n.op_type in COPY_OPS]


def _feeds(name: str) -> dict:
    with np.load(SAMPLES / f"{name}.inputs.npz") as data:
        return {k: data[k] for k in data.files}


def _rewrite(
    model_path: Path, out: Path, *, pins: bool = False, **plan_kw
) -> tuple[dict, onnx.ModelProto, ApplyResult]:
    """Plan and apply; the bare encoding (no order pins) unless ``pins``."""
    analysis = analyse(load_model(model_path))
    plan = scheduled_plan(analysis, PlanRequest.of_options(**plan_kw))
    result = ApplyResult()
    proto = apply_plan(plan, analysis, result=result, options=RewriteOptions(order_pins=pins))
    write_model(proto, out, source_dir=model_path.parent)
    return plan, proto, result


def _check_equivalent(original: Path, rewritten: Path, feeds: dict, tmp_path: Path, *, weights: bool) -> None:
    """Bit-identical at ORT_DISABLE_ALL, close at ORT_ENABLE_ALL, file order == run order, copies kept."""
    want = _run(original, feeds)
    got = _run(rewritten, feeds, weights=weights)
    assert len(want) == len(got)
    for w, g in zip(want, got):
        assert np.array_equal(w, g)
    want_opt = _run(original, feeds, ENABLE_ALL)
    got_opt = _run(rewritten, feeds, ENABLE_ALL, weights=weights, optimized=tmp_path / "optimized.onnx")
    for w, g in zip(want_opt, got_opt):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    model = onnx.load(str(rewritten))
    inserted = len(_copies(model))
    optimized = onnx.load(str(tmp_path / "optimized.onnx"), load_external_data=False)
    assert len(_copies(optimized)) >= inserted
    profiled = _profiled_order(rewritten, feeds, tmp_path / "profile", weights=weights)
    main = set(_file_order(model))
    assert len([name for name in profiled if name not in main]) <= _subgraph_node_count(model.graph)
    assert [name for name in profiled if name in main] == _file_order(model)
    onnx.checker.check_model(model, full_check=True)


def _write_plan_file(tmp_path: Path, model_path: Path, name: str = "plan.json", **plan_kw) -> Path:
    plan = scheduled_plan(analyse(load_model(model_path)), PlanRequest.of_options(**plan_kw))
    path = tmp_path / name
    write_plan(path, plan)
    return path


# ---------------------------------------------------------------------------------------------
# The facts the design builds on


def test_memcpy_ops_run_as_kernels_on_the_cpu_ep(tmp_path):
    """onnxruntime-cann runs MemcpyToHost/MemcpyFromHost on the CPU EP, in file order (docs/commands.md,
    apply: the copies are onnxruntime's own ops)."""
    graph = helper.make_graph(
        [
            helper.make_node("MemcpyToHost", ["x"], ["h"], name="d2h"),
            helper.make_node("MemcpyFromHost", ["h"], ["d"], name="h2d"),
            helper.make_node("Mul", ["d", "x"], ["y"], name="mul"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
    )
    path = tmp_path / "memcpy.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=10), str(path))
    x = np.array([1, 2, 3], np.float32)
    assert np.array_equal(_run(path, {"x": x})[0], x * x)
    assert _profiled_order(path, {"x": x}, tmp_path / "p") == ["d2h", "h2d", "mul"]


# ---------------------------------------------------------------------------------------------
# Every sample model, activations and weights offloaded


@pytest.mark.parametrize("name", SAMPLE_NAMES)
@pytest.mark.parametrize(("select_distance", "prefetch_distance"), [(3, 0), (3, 2), (8, 1)])
def test_sample_rewrites_are_equivalent(name, select_distance, prefetch_distance, tmp_path):
    model_path = SAMPLES / f"{name}.onnx"
    before = sha256_file(model_path)
    out = tmp_path / f"{name}.offload.onnx"
    plan, proto, result = _rewrite(
        model_path,
        out,
        pins=True,  # what apply writes
        params=True,
        select_distance=select_distance,
        prefetch_distance=prefetch_distance,
        min_bytes=0,
    )
    weights = any(o["kind"] == "parameter" for o in plan["offloads"])
    assert result.h2d == len(_copies(proto)) - result.d2h
    _check_equivalent(model_path, out, _feeds(name), tmp_path, weights=weights)
    assert sha256_file(model_path) == before
    settings = session_settings(onnx.load(str(out)))
    assert settings["execution_order"] == "PRIORITY_BASED"
    # ConstantFolding would fold offloaded weights back onto the device, and the pins' Shape nodes away
    assert ("disabled_optimizers" in settings) == (weights or result.pins > 0)


def test_samples_exercise_activations_and_weights():
    """The parametrized test above is only meaningful if the plans offload both kinds."""
    kinds = set()
    for name in SAMPLE_NAMES:
        plan = scheduled_plan(
            analyse(load_model(SAMPLES / f"{name}.onnx")),
            PlanRequest.of_options(params=True, select_distance=3, min_bytes=0),
        )
        kinds |= {o["kind"] for o in plan["offloads"]}
    assert kinds == {"activation", "parameter"}


@pytest.mark.parametrize(
    ("prefetch", "expected"),
    [
        (0, ["Div", "MemcpyToHost", "Mul", "Mul", "Add", "Mul", "MemcpyFromHost", "Sub"]),
        (2, ["Div", "MemcpyToHost", "Mul", "Mul", "MemcpyFromHost", "Add", "Mul", "Sub"]),
    ],
)
def test_seed_example_order(prefetch, expected, seed_path, tmp_path):
    out = tmp_path / "seed.offload.onnx"
    _, proto, _ = _rewrite(seed_path, out, select_distance=1, prefetch_distance=prefetch)
    assert [n.op_type for n in proto.graph.node] == expected
    d2h, h2d = _copies(proto)
    assert list(d2h.input) == ["m1"]
    assert list(h2d.input) == list(d2h.output)
    sub = proto.graph.node[-1]
    assert list(sub.input)[1] == h2d.output[0]  # Sub reads the reloaded m1; Mul still reads m1
    assert "m1" in proto.graph.node[2].input
    assert _profiled_order(out, _feeds("seed"), tmp_path / "p") == _file_order(proto)
    _check_equivalent(seed_path, out, _feeds("seed"), tmp_path, weights=False)


# ---------------------------------------------------------------------------------------------
# Special cases


GRAPH_OUTPUT = """
<ir_version: 10, opset_import: ["" : 17]>
g (float[4] x) => (float[4] a, float[4] y) {
  a = Relu(x)
  b = Neg(a)
  c = Neg(b)
  d = Neg(c)
  e = Neg(d)
  y = Add(e, a)
}
"""


def test_offloaded_graph_output_keeps_its_name(write_model, tmp_path):
    path = write_model(GRAPH_OUTPUT)
    out = tmp_path / "out.onnx"
    plan, proto, _ = _rewrite(path, out, select_distance=2, prefetch_distance=0)
    (off,) = plan["offloads"]
    assert off["tensor"] == "a" and off["graph_output"]
    assert [o.name for o in proto.graph.output] == ["a", "y"]
    last = proto.graph.node[-1]
    assert last.op_type == "MemcpyFromHost" and list(last.output) == ["a"]
    relu = proto.graph.node[0]
    assert relu.output[0] != "a"
    d2h = proto.graph.node[1]
    assert d2h.op_type == "MemcpyToHost" and list(d2h.input) == [relu.output[0]]
    assert list(proto.graph.node[2].input) == [relu.output[0]]  # the device use reads the renamed tensor
    feeds = {"x": np.array([-1, 2, -3, 4], np.float32)}
    _check_equivalent(path, out, feeds, tmp_path, weights=False)


TWO_GROUPS = """
<ir_version: 10, opset_import: ["" : 17]>
g (float[4] x) => (float[4] y) {
  a = Relu(x)
  b = Neg(a)
  c = Neg(b)
  d = Neg(c)
  e = Add(d, a)
  f = Neg(e)
  h = Neg(f)
  i = Neg(h)
  y = Mul(i, a)
}
"""


def test_two_reload_groups(write_model, tmp_path):
    path = write_model(TWO_GROUPS)
    out = tmp_path / "out.onnx"
    plan, proto, result = _rewrite(path, out, select_distance=2, prefetch_distance=1)
    (off,) = plan["offloads"]
    assert len(off["reload_groups"]) == 2
    assert (result.d2h, result.h2d) == (1, 2)
    nodes = {n.name: n for n in proto.graph.node}
    host = nodes["offload0/d2h"].output[0]
    first, second = nodes["offload0/h2d0"], nodes["offload0/h2d1"]
    assert list(first.input) == list(second.input) == [host]
    assert nodes[off["reload_groups"][0]["uses"][0]["node"]].input[1] == first.output[0]
    assert nodes[off["reload_groups"][1]["uses"][0]["node"]].input[1] == second.output[0]
    order = [n.name for n in proto.graph.node]
    assert order.index("offload0/h2d1") == order.index(off["reload_groups"][1]["uses"][0]["node"]) - 2
    feeds = {"x": np.array([-1, 2, -3, 4], np.float32)}
    _check_equivalent(path, out, feeds, tmp_path, weights=False)


IF_BRANCH = """
<ir_version: 10, opset_import: ["" : 17]>
g (float[4] x, bool cond) => (float[4] y) {
  a = Relu(x)
  b = Neg(a)
  c = Neg(b)
  d = Neg(c)
  e = Neg(d)
  y = If(cond) <
    then_branch = then_g () => (float[4] t) { t = Add(e, a) },
    else_branch = else_g () => (float[4] s) { s = Sub(e, a) }
  >
}
"""


def test_read_inside_if_branch_is_rerouted(write_model, tmp_path):
    path = write_model(IF_BRANCH)
    out = tmp_path / "out.onnx"
    plan, proto, _ = _rewrite(path, out, select_distance=2, prefetch_distance=0)
    (off,) = [o for o in plan["offloads"] if o["tensor"] == "a"]
    (use,) = off["reload_groups"][0]["uses"]
    assert use["input_index"] is None
    if_node = next(n for n in proto.graph.node if n.op_type == "If")
    dev = next(n for n in proto.graph.node if n.name == "offload0/h2d0").output[0]
    for attr in if_node.attribute:
        assert list(attr.g.node[0].input) == ["e", dev]
    for cond in (True, False):
        feeds = {"x": np.array([-1, 2, -3, 4], np.float32), "cond": np.array(cond)}
        _check_equivalent(path, out, feeds, tmp_path, weights=False)


CONSTANT_WEIGHT = """
<ir_version: 10, opset_import: ["" : 17]>
g (float[4] x) => (float[4] y) {
  w = Constant <value = float[4] {1.5, 2, 3, 4}> ()
  a = Add(x, w)
  b = Neg(a)
  c = Neg(b)
  d = Neg(c)
  e = Neg(d)
  y = Mul(e, w)
}
"""


def test_constant_node_weight_becomes_an_initializer(write_model, tmp_path):
    path = write_model(CONSTANT_WEIGHT)
    out = tmp_path / "out.onnx"
    plan, proto, result = _rewrite(path, out, params=True, activations=False, select_distance=2, prefetch_distance=1)
    (off,) = plan["offloads"]
    assert off["tensor"] == "w" and off["kind"] == "parameter"
    assert result.d2h == 0 and result.h2d == 2
    assert not any(n.op_type == "Constant" for n in proto.graph.node)
    assert "w" in {i.name for i in proto.graph.initializer}
    assert "w" in {i.name for i in proto.graph.input}
    feeds = {"x": np.array([-1, 2, -3, 4], np.float32)}
    _check_equivalent(path, out, feeds, tmp_path, weights=True)


def test_unnamed_and_duplicate_nodes_get_unique_names(write_model, tmp_path):
    path = write_model(
        """
        <ir_version: 10, opset_import: ["" : 17]>
        g (float[4] x) => (float[4] y) {
          a = Relu(x)
          b = Neg(a)
          c = Neg(b)
          d = Neg(c)
          y = Add(d, a)
        }
        """
    )
    out = tmp_path / "out.onnx"
    _, proto, _ = _rewrite(path, out, select_distance=2, prefetch_distance=0)
    names = [n.name for n in proto.graph.node]
    assert all(names) and len(set(names)) == len(names)
    _check_equivalent(path, out, {"x": np.array([-1, 2, -3, 4], np.float32)}, tmp_path, weights=False)


def test_copy_outputs_take_no_name_the_model_already_uses(write_model, tmp_path):
    """Names of the copies' outputs avoid every tensor name: node outputs, weights (an unused one
    too), outputs, value_info entries and the names inside subgraphs."""
    path = write_model(
        """
        <ir_version: 10, opset_import: ["" : 17]>
        g (float[4] x, bool cond) => (float[4] y, float[4] a__offload0_dev0_1)
        <float[4] a__offload0_dev0_2 = {1.0, 2.0, 3.0, 4.0}, float[1] a__offload0_host_2 = {0.0},
         float[4] a__offload0_host_1>
        {
          a = Relu(x)
          a__offload0_host = Neg(a)
          c = Neg(a__offload0_host)
          d = If(cond) <
            then_branch = t () => (float[4] a__offload0_dev0) { a__offload0_dev0 = Neg(c) },
            else_branch = e () => (float[4] z) { z = Neg(c) }
          >
          a__offload0_dev0_1 = Add(d, a__offload0_dev0_2)
          y = Add(a__offload0_dev0_1, a)
        }
        """
    )
    out = tmp_path / "out.onnx"
    plan, proto, _ = _rewrite(path, out, select_distance=2, prefetch_distance=0)
    assert [o["tensor"] for o in plan["offloads"]][:1] == ["a"]
    copies = [n for n in proto.graph.node if n.op_type in COPY_OPS]
    assert {o for n in copies for o in n.output} == {"a__offload0_host_3", "a__offload0_dev0_3"}
    feeds = {"x": np.array([-1, 2, -3, 4], np.float32), "cond": np.array(True)}
    _check_equivalent(path, out, feeds, tmp_path, weights=False)


# ---------------------------------------------------------------------------------------------
# Plan checks and the command line


def test_apply_command_writes_model_and_keeps_input(run_cli, seed_path, tmp_path):
    plan = _write_plan_file(tmp_path, seed_path, select_distance=1, prefetch_distance=0)
    before = seed_path.read_bytes()
    out = tmp_path / "seed.offload.onnx"
    result = run_cli("apply", plan, "-o", out)
    assert result.exit_code == 0, result.stderr
    assert "1 device-to-host and 1 host-to-device" in result.stdout
    assert seed_path.read_bytes() == before
    model = onnx.load(str(out))
    props = {p.key: p.value for p in model.metadata_props}
    assert props["offloadctl.offloads"] == "1"
    assert len(props["offloadctl.plan_sha256"]) == 64
    assert model.ir_version == onnx.load(str(seed_path)).ir_version
    assert [(o.domain, o.version) for o in model.opset_import] == [("", 17)]


def test_plan_for_another_model_is_refused(run_cli, seed_path, tmp_path):
    plan = _write_plan_file(tmp_path, seed_path, select_distance=1, prefetch_distance=0)
    out = tmp_path / "out.onnx"
    result = run_cli("apply", plan, "-o", out, "--model", SAMPLES / "mlp.onnx")
    assert result.exit_code == 1
    assert "the plan was made for" in result.stderr
    assert not out.exists()


def test_missing_model_is_refused(run_cli, seed_path, tmp_path):
    plan_path = _write_plan_file(tmp_path, seed_path, select_distance=1, prefetch_distance=0)
    plan = json.loads(plan_path.read_text())
    plan["model"]["path"] = "no/such/model.onnx"
    write_plan(plan_path, plan)
    out = tmp_path / "out.onnx"
    result = run_cli("apply", plan_path, "-o", out)
    assert result.exit_code == 1
    assert "was not found" in result.stderr and "--model" in result.stderr
    assert not out.exists()


def test_model_found_beside_the_plan(run_cli, seed_path, tmp_path, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    (work / "seed.onnx").write_bytes(seed_path.read_bytes())
    monkeypatch.chdir(work)
    plan_path = _write_plan_file(work, Path("seed.onnx"), select_distance=1, prefetch_distance=0)
    monkeypatch.chdir(tmp_path)  # the plan's relative model path now only resolves beside the plan
    result = run_cli("apply", plan_path, "-o", tmp_path / "out.onnx")
    assert result.exit_code == 0, result.stderr


def test_output_equal_to_input_is_refused(run_cli, seed_path, tmp_path):
    model = tmp_path / "seed.onnx"
    model.write_bytes(seed_path.read_bytes())
    plan = _write_plan_file(tmp_path, model, select_distance=1, prefetch_distance=0)
    before = model.read_bytes()
    result = run_cli("apply", plan, "-o", model)
    assert result.exit_code == 1
    assert "same file as the input" in result.stderr
    assert model.read_bytes() == before


def test_unscheduled_plan_is_refused(run_cli, seed_path, tmp_path):
    selected = tmp_path / "selected.json"
    assert run_cli("select", seed_path, "-o", selected, "--select-distance", "1").exit_code == 0
    result = run_cli("apply", selected, "-o", tmp_path / "out.onnx")
    assert result.exit_code == 1
    assert "stage" in result.stderr


def _seed_plan():
    analysis = analyse(load_model(SAMPLES / "seed.onnx"))
    return scheduled_plan(analysis, PlanRequest.of_options(select_distance=1, prefetch_distance=0)), analysis


def test_plan_naming_an_unknown_tensor_is_refused():
    plan, analysis = _seed_plan()
    plan["offloads"][0]["tensor"] = "nope"
    with pytest.raises(OffloadError, match="plan names tensor 'nope' which the model"):
        apply_plan(plan, analysis)


def test_plan_with_wrong_kind_is_refused():
    plan, analysis = _seed_plan()
    plan["offloads"][0]["tensor"] = "x"
    with pytest.raises(OffloadError, match="'x' as activation, but .* it is a graph input"):
        apply_plan(plan, analysis)


def test_plan_with_wrong_uses_is_refused():
    plan, analysis = _seed_plan()
    bad = copy.deepcopy(plan)
    bad["offloads"][0]["reload_groups"][0]["uses"][0]["input_index"] = 0
    with pytest.raises(OffloadError, match="read of tensor 'm1' by node 'sub_out' .* at input 0"):
        apply_plan(bad, analysis)
    bad = copy.deepcopy(plan)
    bad["offloads"][0]["device_uses"] = []
    with pytest.raises(OffloadError, match="does not say where node 'mul_m3'"):
        apply_plan(bad, analysis)


def test_apply_plan_does_not_mutate_its_inputs():
    plan, analysis = _seed_plan()
    plan_before = copy.deepcopy(plan)
    proto_before = analysis.loaded.proto.SerializeToString()
    apply_plan(plan, analysis)
    assert plan == plan_before
    assert analysis.loaded.proto.SerializeToString() == proto_before


def test_zero_offload_plan_gives_an_equivalent_model(run_cli, seed_path, tmp_path):
    plan = _write_plan_file(tmp_path, seed_path)  # default distances: nothing to offload
    assert json.loads(plan.read_text())["offloads"] == []
    out = tmp_path / "out.onnx"
    assert run_cli("apply", plan, "-o", out).exit_code == 0
    model = onnx.load(str(out))
    original = onnx.load(str(seed_path))
    assert [(n.op_type, list(n.input), list(n.output)) for n in model.graph.node] == [
        (n.op_type, list(n.input), list(n.output)) for n in original.graph.node
    ]
    assert {p.key: p.value for p in model.metadata_props}["offloadctl.offloads"] == "0"
    _check_equivalent(seed_path, out, _feeds("seed"), tmp_path, weights=False)


def test_existing_metadata_is_kept_and_ours_replaced(write_model, tmp_path):
    model = onnx.parser.parse_model(GRAPH_OUTPUT)
    model.ir_version = 10
    for key, value in (("author", "me"), ("offloadctl.offloads", "99")):
        entry = model.metadata_props.add()
        entry.key, entry.value = key, value
    path = tmp_path / "meta.onnx"
    onnx.save(model, str(path))
    _, proto, _ = _rewrite(path, tmp_path / "out.onnx", select_distance=2, prefetch_distance=0)
    props = [(p.key, p.value) for p in proto.metadata_props]
    assert ("author", "me") in props
    assert [v for k, v in props if k == "offloadctl.offloads"] == ["1"]


# ---------------------------------------------------------------------------------------------
# External data


def test_external_data_model_rewritten_into_another_folder(run_cli, tmp_path):
    src = tmp_path / "src"
    dst = tmp_path / "dst"
    src.mkdir()
    dst.mkdir()
    model = onnx.load(str(SAMPLES / "mlp.onnx"))
    model_path = src / "mlp.onnx"
    onnx.save(
        model,
        str(model_path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="mlp.weights",
        size_threshold=0,
    )
    plan = _write_plan_file(tmp_path, model_path, params=True, select_distance=3, prefetch_distance=1, min_bytes=0)
    out = dst / "mlp.offload.onnx"
    result = run_cli("apply", plan, "-o", out)
    assert result.exit_code == 0, result.stderr
    assert (dst / "mlp.weights").is_file()
    assert os.path.getsize(out) < 20_000  # the weights stayed external
    _check_equivalent(SAMPLES / "mlp.onnx", out, _feeds("mlp"), tmp_path, weights=True)


def test_large_model_is_written_with_external_data(tmp_path):
    analysis = analyse(load_model(SAMPLES / "mlp.onnx"))
    plan = scheduled_plan(
        analysis, PlanRequest.of_options(params=True, select_distance=3, prefetch_distance=1, min_bytes=0)
    )
    proto = apply_plan(plan, analysis)
    out = tmp_path / "big.onnx"
    written = write_model(proto, out, source_dir=SAMPLES, max_embedded_bytes=1000)
    assert written == [tmp_path / "big.onnx.data"]
    assert os.path.getsize(out) < 20_000
    _check_equivalent(SAMPLES / "mlp.onnx", out, _feeds("mlp"), tmp_path, weights=True)


def test_unknown_tensor_refused_by_the_command(run_cli, seed_path, tmp_path):
    plan_path = _write_plan_file(tmp_path, seed_path, select_distance=1, prefetch_distance=0)
    plan = json.loads(plan_path.read_text())
    plan["offloads"][0]["tensor"] = "ghost"
    write_plan(plan_path, plan)
    out = tmp_path / "out.onnx"
    result = run_cli("apply", plan_path, "-o", out)
    assert result.exit_code == 1
    assert "plan names tensor 'ghost'" in result.stderr and "Traceback" not in result.stderr
    assert not out.exists()


def test_session_settings_absent_on_a_plain_model(seed_path):
    assert session_settings(onnx.load(str(seed_path))) is None


@pytest.mark.parametrize(
    ("attr", "value", "dtype"),
    [
        ("value_float", 1.5, np.float32),
        ("value_floats", [1.0, 2.0], np.float32),
        ("value_int", 3, np.int64),
        ("value_ints", [4, 5], np.int64),
    ],
)
def test_constant_numbers_become_initializers_of_their_type_and_shape(attr, value, dtype):
    from onnx import helper, numpy_helper

    from offloadctl.rewriting.rewrite import _constant_to_initializer

    tensor = _constant_to_initializer(helper.make_node("Constant", [], ["c"], **{attr: value}))
    assert tensor.name == "c"
    array = numpy_helper.to_array(tensor)
    assert array.dtype == dtype and array.tolist() == value


# ---------------------------------------------------------------------------------------------
# Order pins: the plan holds in onnxruntime's DEFAULT order (every host but Python)


def _held(proto: onnx.ModelProto, ran: list[str]) -> tuple[int, list[dict]]:
    """(pin constraints checked, those that did not hold) against an order that ran."""
    pins = json.loads(next(p.value for p in proto.metadata_props if p.key == "offloadctl.order_pins"))
    at = {name: k for k, name in enumerate(ran)}

    def broken(c: dict) -> bool:
        return at[c["copy"]] > at[c["before"]] if "before" in c else at[c["copy"]] < at[c["after"]]

    return len(pins), [c for c in pins if broken(c)]


@pytest.mark.parametrize("name", SAMPLE_NAMES)
def test_pins_hold_every_copy_in_the_default_order(name, tmp_path):
    """Without pins onnxruntime's DEFAULT order moves each D2H next to its H2D; with them every
    D2H runs before the node after its planned point and every H2D after the node before it, the
    outputs stay bit-identical, and PRIORITY_BASED still runs the file order."""
    model_path = SAMPLES / f"{name}.onnx"
    feeds = _feeds(name)
    out, bare = tmp_path / "pinned.onnx", tmp_path / "bare.onnx"
    plan, proto, result = _rewrite(model_path, out, pins=True, params=True, select_distance=2, prefetch_distance=1)
    _, bare_proto, _ = _rewrite(model_path, bare, pins=False, params=True, select_distance=2, prefetch_distance=1)
    if not plan["offloads"]:
        pytest.skip("nothing offloaded")
    assert result.pins > 0 and not result.unpinned
    ran = _profiled_order(out, feeds, tmp_path / "d", order=ort.ExecutionOrder.DEFAULT)
    checked, broken = _held(proto, ran)
    assert checked > 0 and broken == []
    assert [n for n in ran if n in set(_file_order(proto))] == [n for n in ran]  # every node is the file's
    for w, g in zip(_run(model_path, feeds), _run(out, feeds, weights=True, order=ort.ExecutionOrder.DEFAULT)):
        assert np.array_equal(w, g)
    assert _profiled_order(out, feeds, tmp_path / "p") == _file_order(proto)
    assert not any(n.op_type == "Shape" for n in bare_proto.graph.node if n.name.startswith("offload"))
    if name in ("unet", "transformer", "training"):  # not a plain chain: the DEFAULT order moves the bare copies
        _, moved = _held(proto, _profiled_order(bare, feeds, tmp_path / "b", order=ort.ExecutionOrder.DEFAULT))
        assert moved


def test_pins_survive_all_optimizations(tmp_path):
    """At ORT_ENABLE_ALL (ConstantFolding off, as the model asks) the pins still hold the copies,
    and the outputs stay close."""
    model_path = SAMPLES / "transformer.onnx"
    feeds = _feeds("transformer")
    out = tmp_path / "pinned.onnx"
    _, proto, _ = _rewrite(model_path, out, pins=True, params=True, select_distance=2, prefetch_distance=1)
    default = ort.ExecutionOrder.DEFAULT
    ran = _profiled_order(out, feeds, tmp_path / "all", ENABLE_ALL, weights=True, order=default)
    got = _run(out, feeds, ENABLE_ALL, weights=True, order=default)
    pins = json.loads(next(p.value for p in proto.metadata_props if p.key == "offloadctl.order_pins"))
    at = {n: k for k, n in enumerate(ran)}
    both = [c for c in pins if c["copy"] in at and (c.get("before") or c.get("after")) in at]
    assert len(both) > len(pins) // 2  # fusions rename some original nodes; the rest are checked
    assert all(at[c["copy"]] < at[c["before"]] if "before" in c else at[c["copy"]] > at[c["after"]] for c in both)
    for w, g in zip(_run(model_path, feeds, ENABLE_ALL), got):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def test_pins_make_no_cycle_and_skip_weights(write_model, tmp_path):
    """A pin views activations only (never a weight), and the rewritten graph stays a DAG."""
    path = write_model(TWO_GROUPS)
    out = tmp_path / "out.onnx"
    plan, proto, result = _rewrite(path, out, pins=True, select_distance=2, prefetch_distance=1)
    onnx.checker.check_model(proto, full_check=True)
    weights = {t.name for t in proto.graph.initializer}
    views = [n for n in proto.graph.node if n.op_type == "Reshape" and n.name.startswith("offload/pin/")]
    assert views and not any(v.input[0] in weights for v in views)
    assert result.pins == len(views)


RESHAPE_NEXT = """
<ir_version: 10, opset_import: ["" : 17]>
g (float[4] x) => (float[4] y) {
  a = Relu(x)
  ax = Constant <value = int64[1] {0}> ()
  u = Unsqueeze(x, ax)
  b = Neg(u)
  c = Neg(b)
  d = Neg(c)
  e = Squeeze(d, ax)
  y = Add(e, a)
}
"""


def test_pins_never_feed_a_reshape(write_model, tmp_path):
    """onnxruntime fuses a Reshape with a Reshape/Squeeze/Unsqueeze/Flatten after it, and at
    ORT_ENABLE_ALL such a fusion of a pin's view once broke a model's loading, both ways: a view that
    feeds one, and a view of what one made (GPT-2's attention reshapes, exported by optimum, did not
    load). The D2H after Relu is held by the second Neg, past the Unsqueeze and the Neg that reads its
    output, and the model loads and matches at every level."""
    from offloadctl.contract.order_pins import pin_layout

    path = write_model(RESHAPE_NEXT)
    analysis = analyse(load_model(path))
    plan = scheduled_plan(analysis, PlanRequest.of_options(select_distance=2, prefetch_distance=0))
    (off,) = plan["offloads"]
    assert off["tensor"] == "a" and off["d2h_after"] == 0
    assert analysis.nodes[1].op_type == "Unsqueeze"
    assert pin_layout(plan, analysis).d2h == {0: (3, 0)}  # not Neg(u) at 2: u is the Unsqueeze's
    proto = apply_plan(plan, analysis)
    made = {o: n.op_type for n in proto.graph.node for o in n.output}
    views = [n for n in proto.graph.node if n.op_type == "Reshape" and n.name.startswith("offload/pin/")]
    assert views and not any(made.get(v.input[0]) in ("Reshape", "Squeeze", "Unsqueeze", "Flatten") for v in views)
    out = tmp_path / "out.onnx"
    onnx.save(proto, str(out))
    feeds = {"x": np.array([-1, 2, -3, 4], np.float32)}
    _check_equivalent(path, out, feeds, tmp_path, weights=False)


def test_pins_never_read_what_the_plan_keeps_for_fusions(write_model, tmp_path):
    """A tensor onnxruntime's fusions take in (a plan made with a profile measured above
    --opt-level disable records them) is not read by a pin either: the D2H after Relu is held by the
    next node whose input is free, and the rewrite still runs bit-identical."""
    from offloadctl.contract.order_pins import pin_layout

    path = write_model(RESHAPE_NEXT)
    analysis = analyse(load_model(path))
    plan = scheduled_plan(analysis, PlanRequest.of_options(select_distance=2, prefetch_distance=0, fused=("u",)))
    assert plan["options"]["select"]["fused"] == ["u"]
    assert pin_layout(plan, analysis).d2h == {0: (3, 0)}  # not Neg(u) at 2: b = Neg(u) is read by 3
    proto = apply_plan(plan, analysis)
    views = [n for n in proto.graph.node if n.op_type == "Reshape" and n.name.startswith("offload/pin/")]
    assert views and all(v.input[0] != "u" for v in views)
    out = tmp_path / "out.onnx"
    onnx.save(proto, str(out))
    _check_equivalent(path, out, {"x": np.array([-1, 2, -3, 4], np.float32)}, tmp_path, weights=False)


def test_a_weights_only_apply_of_a_plan_from_plan_runs_no_shape_inference(run_cli, tmp_path, monkeypatch):
    """`offloadctl plan` records its pin layout (summary.pins, keyed by the offloads): apply builds the
    same pins from it without shape inference over the whole graph; an edited plan gets its pins
    found again."""
    from offloadctl.loading.tensors import TensorInfos

    model = SAMPLES / "transformer.onnx"
    plan_path = tmp_path / "plan.json"
    result = run_cli("plan", model, "-o", plan_path, "--params", "--no-activations", "--select-distance", "2")
    assert result.exit_code == 0, result.stderr
    plan = json.loads(plan_path.read_text())
    assert plan["offloads"] and plan["summary"]["pins"]["h2d"]
    analysis = analyse(load_model(model))
    expected = apply_plan(plan, analysis)  # this analysis's inference has run: the reference
    calls = []
    real = TensorInfos._run_inference
    monkeypatch.setattr(TensorInfos, "_run_inference", lambda self: calls.append(1) or real(self))
    out = tmp_path / "out.onnx"
    done = run_cli("apply", plan_path, "-o", out, "--model", model)
    assert done.exit_code == 0, done.stderr
    assert calls == []
    assert _nodes(onnx.load(str(out))) == _nodes(expected)
    # an edited plan: the recorded layout no longer holds, and the pins are found again
    plan["offloads"] = plan["offloads"][:1]
    plan["offloads"][0]["id"] = 0
    plan_path.write_text(json.dumps(plan))
    edited = run_cli("apply", plan_path, "-o", tmp_path / "edited.onnx", "--model", model)
    assert edited.exit_code == 0, edited.stderr
    assert calls
    fresh = dict(plan, summary={})
    assert _nodes(onnx.load(str(tmp_path / "edited.onnx"))) == _nodes(apply_plan(fresh, analyse(load_model(model))))


def _nodes(proto: onnx.ModelProto) -> list[tuple[str, str, tuple[str, ...], tuple[str, ...]]]:
    return [(n.op_type, n.name, tuple(n.input), tuple(n.output)) for n in proto.graph.node]


SHARED_HOLD = """
<ir_version: 10, opset_import: ["" : 17]>
g (float[4, 8] x) => (float[4, 8] y) {
    a = Relu(x)
    b = Neg(x)
    c = Add(a, b)
    d = Abs(c)
    e = Relu(d)
    f = Neg(e)
    shape = Constant<value = int64[2] {4, 8}>()
    r = Reshape(a, shape)
    g1 = Add(f, r)
    y = Add(g1, b)
}
"""


def test_pins_at_one_node_share_one_view_and_never_feed_a_reshape(write_model, tmp_path):
    """Two D2Hs held by the same input share one view (a view of a view is a Reshape after a Reshape,
    which onnxruntime's fusion merged into a node naming an input that no longer existed, at
    ORT_ENABLE_ALL), and an H2D whose use is a Reshape gets no view: both load and run there."""
    source = write_model(SHARED_HOLD)
    out = tmp_path / "pinned.onnx"
    plan, proto, result = _rewrite(source, out, pins=True, select_distance=2, prefetch_distance=0)
    assert {o["tensor"] for o in plan["offloads"]} == {"a", "b"}
    views = [n for n in proto.graph.node if n.op_type == "Reshape" and n.name.startswith("offload/pin/")]
    held = [v for v in views if "d2h@" in v.name]
    assert len(held) == 1  # both D2Hs wait through the same view of c's input
    concat = next(n for n in proto.graph.node if n.output[0] == held[0].input[1])
    assert len(concat.input) == 3  # the zeros and one empty shape per D2H
    assert any("Reshape" in u for u in result.unpinned)  # a's reload feeds a Reshape: left unpinned
    feeds = {"x": np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)}
    want = _run(source, feeds)
    for level in (DISABLE_ALL, ENABLE_ALL):
        got = _run(out, feeds, level, weights=True)
        assert all(np.allclose(w, g) for w, g in zip(want, got))


def test_a_plan_for_the_default_order_keeps_the_original_nodes_file_order(run_cli, tmp_path):
    """onnxruntime's DEFAULT walk picks a node's inputs by node index, so a rewrite for it keeps the
    original nodes in their file order (each copy beside the node it is planned at). Written in the
    planned order instead, the onnx wheel's DenseNet-121 walked into a peak 4.5x its original's
    (8.36 MiB -> 37.73 MiB); kept, the plan lowers it."""
    model = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / "light_densenet121.onnx"
    plan, out = tmp_path / "plan.json", tmp_path / "out.onnx"
    options = ["--params", "--select-distance", "10", "--execution-order", "default"]
    res = run_cli("plan", model, *options, "-o", plan, "--json")
    assert res.exit_code == 0, res.stderr
    peak = json.loads(res.stdout)["peak_bytes"]
    assert peak["after"] < peak["before"]
    assert run_cli("apply", plan, "-o", out).exit_code == 0

    def own(path: Path) -> list[tuple[str, tuple[str, ...]]]:  # the model's own nodes: op and outputs
        nodes = onnx.load(str(path), load_external_data=False).graph.node
        added = ("MemcpyToHost", "MemcpyFromHost", "Constant")
        return [
            (n.op_type, tuple(n.output))
            for n in nodes
            if n.op_type not in added and not any(a.name == "__offload_pin" for a in n.attribute)
        ]

    assert own(out) == own(model)


@pytest.mark.parametrize(
    ("model", "options"),
    [
        ("GRAPH_OUTPUT", {"select_distance": 2, "prefetch_distance": 0}),
        ("TWO_GROUPS", {"select_distance": 1, "prefetch_distance": 1}),
        ("transformer", {"select_distance": 5, "params": True}),
        ("unet", {"select_distance": 3, "params": True}),
    ],
)
def test_the_rewrite_knows_who_makes_each_tensor_without_reading_every_node(write_model, monkeypatch, model, options):
    """The order of a rewrite takes the node that makes each tensor from the analysis and the nodes
    the rewrite adds (`_Rewriter._producers`): the same map as reading every node's outputs, renamed
    graph outputs and order pins included."""
    import offloadctl.rewriting.rewrite as rewrite

    path = SAMPLES / f"{model}.onnx" if model in SAMPLE_NAMES else write_model(globals()[model])
    analysis = analyse(load_model(path))
    plan = scheduled_plan(analysis, PlanRequest.of_options(**options))
    assert plan["offloads"]
    seen = []
    real = rewrite.sorted_priority_order

    def checked(nodes, ranks=None, producer=None):
        seen.append(producer == {out: i for i, node in enumerate(nodes) for out in node.output if out})
        return real(nodes, ranks, producer)

    monkeypatch.setattr(rewrite, "sorted_priority_order", checked)
    apply_plan(plan, analysis, options=RewriteOptions(order_pins=True))
    assert seen == [True]


def _naive_dep_before(analysis, q, low, avoid):
    """The output an H2D before q waits for when nothing alive at its first reader is found: a scan
    back from q."""
    from offloadctl.contract.order_pins import _last_use, viewable

    fallback = None
    for s in range(q - 1, -1, -1):
        for j, name in enumerate(analysis.nodes[s].output):
            if not viewable(analysis, name, avoid):
                continue
            if fallback is None:
                fallback = (s, j)
            if _last_use(analysis, name) >= q:
                return (s, j)
        if fallback is not None and s <= low:
            break
    return fallback


def _naive_awaited(analysis, q, read, low, avoid, ahead=False):
    """The output an H2D before q, first read at ``read``, waits for, by the rule as written: one alive
    at ``read``, with ``ahead`` the earliest made from q - 1 on, then the latest made before q (down to
    ``low``), else `_naive_dep_before`."""
    from offloadctl.contract.order_pins import _LOOK_AHEAD, _last_use, viewable

    after = range(max(q - 1, 0), min(read, q - 1 + _LOOK_AHEAD)) if ahead else range(0)
    for s in [*after, *range(q - 1, low - 1, -1)]:
        names = analysis.nodes[s].output
        kept = [j for j, name in enumerate(names) if viewable(analysis, name, avoid)]
        found = next((j for j in kept if _last_use(analysis, names[j]) >= read), None)
        if found is not None:
            return (s, found)
    return _naive_dep_before(analysis, q, low, avoid)


# a's shape passed along ten Identity nodes: integer arithmetic, no output a pin can view
SHAPE_CHAIN = "\n".join(["    s1 = Shape(a)", *(f"    s{k} = Identity(s{k - 1})" for k in range(2, 12))])
# the same arithmetic carried on to s300 (a graph of 303 nodes with views only at its ends)
LONG_CHAIN = [f"    s{k} = Identity(s{k - 1})" for k in range(12, 301)]
# integer shape arithmetic between float nodes: few outputs a pin can view
SPARSE_VIEWS = f"""
<ir_version: 10, opset_import: ["" : 17]>
g (float[2, 3] x) => (float[2, 3] y) {{
    a = Relu(x)
{SHAPE_CHAIN}
    b = Reshape(a, s11)
    y = Neg(b)
}}
"""
# the only view before position 13 is a, read last at 14: an H2D before 14 waits for the unread d
# (at 13, above the scan's lower end), not for a below it, though a is read at 14
VIEW_BELOW_THE_SCAN = f"""
<ir_version: 10, opset_import: ["" : 17]>
g (float[2, 3] x) => (float[3, 2] y) {{
    a = Relu(x)
{SHAPE_CHAIN}
    k = Identity(s11)
    d = Neg(x)
    y = Reshape(a, k)
}}
"""


@pytest.mark.parametrize("name", [*SAMPLE_NAMES, "sparse", "below", "long"])
def test_the_pin_scans_find_what_a_scan_from_each_copy_finds(name, write_model, monkeypatch):
    """The holder of each D2H (the first later node whose input a view can stand in for) and the
    output each H2D waits for are those a scan from the copy finds, while each node is looked at
    once: with every tensor forced, no node holds a view, and a scan from each copy to the end of a
    big graph looked at its nodes once per copy."""
    from offloadctl.contract import order_pins as pins

    long_chain = SPARSE_VIEWS.replace("b = Reshape(a, s11)", "\n".join(LONG_CHAIN) + "\n    b = Reshape(a, s300)")
    texts = {"sparse": SPARSE_VIEWS, "below": VIEW_BELOW_THE_SCAN, "long": long_chain}
    path = write_model(texts[name]) if name in texts else SAMPLES / f"{name}.onnx"
    analysis = analyse(load_model(path))
    n = analysis.num_positions
    real = pins._held_input
    calls = []
    for force in ((), ("*",)):
        plan = scheduled_plan(
            analysis, PlanRequest.of_options(select_distance=0, params=True, prefetch_distance=0, force=force)
        )
        reloaded = pins._reloaded(plan)
        calls.clear()
        monkeypatch.setattr(pins, "_held_input", lambda *args: calls.append(args[1]) or real(*args))
        holders = pins._Holders(analysis, frozenset(), reloaded, frozenset())
        for start in range(n + 1):
            found = ((t, k) for t in range(start, n) if (k := real(analysis, t, frozenset(), reloaded)) is not None)
            assert holders.first(start) == next(found, None)
        assert len(calls) == len(set(calls)) <= n  # each node once
        monkeypatch.setattr(pins, "_held_input", real)
        sources = pins._Sources(analysis, frozenset())
        for q in range(1, n + 1):
            for low in {0, max(0, q - 8), q - 1}:
                for read in {q, min(q + 3, n), n}:
                    for ahead in (False, True):
                        expected = _naive_awaited(analysis, q, read, low, frozenset(), ahead)
                        assert sources.awaited(q, read, low, ahead=ahead) == expected, (q, read, low, ahead)
    # as pin_layout asks (down to 8 positions back): a bounded number of looks per copy
    sources = pins._Sources(analysis, frozenset())
    looked = []
    outputs = sources.outputs
    monkeypatch.setattr(sources, "outputs", lambda s: looked.append(s) or outputs(s))
    for q in range(1, n + 1):
        sources.awaited(q, n, max(0, q - 8), ahead=True)
    assert len(looked) <= n + (9 + pins._LOOK_AHEAD) * n


# every element type ONNX has for tensors, and whether a copy of it is offloaded (onnxruntime's copy kernels)
_ELEMENT_TYPES = [t for t in TensorProto.DataType.values() if t not in (TensorProto.UNDEFINED, TensorProto.STRING)]


@pytest.mark.parametrize("elem_type", _ELEMENT_TYPES, ids=TensorProto.DataType.Name)
def test_every_element_type_gets_a_pin_onnx_accepts_or_none(tmp_path, elem_type):
    """An idle activation of each element type: the rewrite loads and runs on the CPU in both orders
    with the original's outputs. float16 and bfloat16 ones are offloaded; ONNX's Optional takes no
    bfloat16 tensor, so a bfloat16 D2H goes without a pin and says so (it holds under PRIORITY_BASED
    only) while its H2D is pinned. float8, int4, uint4 and float4 are never copied (onnxruntime's copy
    kernels take none of them). (An integer tensor stays where the CPU reads it, and onnxruntime
    drops the Casts of float and double.)"""
    from offloadctl.core.memcpy import COPY_TYPES

    path = idle_typed_model(elem_type, tmp_path / "m.onnx")
    try:
        ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        runs = True
    except Exception:  # noqa: BLE001 - no Cast kernel for the type here (float6, int2, ...): plan only
        runs = False
    analysis = analyse(load_model(path))
    plan = scheduled_plan(analysis, PlanRequest.of_options(select_distance=3, prefetch_distance=0, min_bytes=0))
    offloaded = {o["tensor"] for o in plan["offloads"]}
    if elem_type in (TensorProto.FLOAT16, TensorProto.BFLOAT16):  # idle floating-point activations
        assert offloaded == {"a"}
    elif elem_type not in COPY_TYPES:  # onnxruntime cannot copy it
        assert not offloaded
    if not runs:
        assert elem_type not in COPY_TYPES
        return
    result = ApplyResult()
    out = tmp_path / "m.offload.onnx"
    write_model(apply_plan(plan, analysis, result=result), out, source_dir=tmp_path)
    onnx.checker.check_model(onnx.load(str(out)), full_check=True)
    pinned_d2h = elem_type != TensorProto.BFLOAT16
    assert any("Optional takes no bfloat16" in u for u in result.unpinned) == (not pinned_d2h and "a" in offloaded)
    feeds = {"x": np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)}
    expected = _run(path, feeds)
    for order in (ort.ExecutionOrder.PRIORITY_BASED, ort.ExecutionOrder.DEFAULT):
        for want, got in zip(expected, _run(out, feeds, weights=True, order=order)):
            assert np.array_equal(want, got, equal_nan=True)
