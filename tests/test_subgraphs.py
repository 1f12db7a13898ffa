"""Models with subgraphs (If, Loop, Scan): outer-scope reads are uses at the parent node's position.

A tensor read inside a body (as an outer-scope name) counts as one use, at the position of the node
that owns the body, with ``input_index`` null. Planning places reloads by those positions; apply
must reroute the read inside the body, and the rewritten model must give bit-identical outputs.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest

from offloadctl.analysis.graph import analyse
from offloadctl.contract.document import read_plan, validate_plan
from offloadctl.loading.model import load_model
from offloadctl.planning.make import scheduled_plan
from offloadctl.planning.request import PlanRequest

# `a` is produced at position 0, read by Neg at 1, then only inside both branches of the If at 4,
# and once more by the Mul at 5 (directly).
IF_MODEL = """
<ir_version: 10, opset_import: ["" : 17]>
g (float[4,8] x, bool c) => (float[4,8] y) {
    a = Relu(x)
    b = Neg(a)
    d = Neg(b)
    e = Neg(d)
    f = If(c) <
        then_branch = then_g () => (float[4,8] t_out) { t_out = Add(a, e) },
        else_branch = else_g () => (float[4,8] e_out) { e_out = Sub(e, a) }
    >
    y = Mul(f, a)
}
"""

# `a` is read inside the Loop body on every iteration; the Loop sits at position 4.
LOOP_MODEL = """
<ir_version: 10, opset_import: ["" : 17]>
g (float[4,8] x, int64 n) => (float[4,8] y) {
    a = Relu(x)
    b = Neg(a)
    d = Neg(b)
    e = Neg(d)
    keep_going = Constant <value = bool {1}> ()
    acc = Loop(n, keep_going, e) <
        body = loop_body (int64 i, bool c_in, float[4,8] acc_in) => (bool c_out, float[4,8] acc_out) {
            c_out = Identity(c_in)
            acc_out = Add(acc_in, a)
        }
    >
    y = Mul(acc, x)
}
"""

# `a` is read inside the Scan body; the Scan sits at position 4.
SCAN_MODEL = """
<ir_version: 10, opset_import: ["" : 17]>
g (float[4,8] x, float[8] s0) => (float[8] final, float[4,4,8] cols) {
    a = Relu(x)
    b = Neg(a)
    d = Neg(b)
    e = Neg(d)
    final, cols = Scan(s0, e) <
        num_scan_inputs = 1,
        body = scan_body (float[8] s_in, float[8] row) => (float[8] s_out, float[4,8] col) {
            s_out = Add(s_in, row)
            col = Mul(row, a)
        }
    >
}
"""

# An If nested in a Loop body reads `a` two scopes down: still one use at the Loop's position.
NESTED_MODEL = """
<ir_version: 10, opset_import: ["" : 17]>
g (float[4,8] x, int64 n, bool c) => (float[4,8] y) {
    a = Relu(x)
    b = Neg(a)
    d = Neg(b)
    e = Neg(d)
    keep_going = Constant <value = bool {1}> ()
    acc = Loop(n, keep_going, e) <
        body = loop_body (int64 i, bool c_in, float[4,8] acc_in) => (bool c_out, float[4,8] acc_out) {
            c_out = Identity(c_in)
            acc_out = If(c) <
                then_branch = then_g () => (float[4,8] t_out) { t_out = Add(acc_in, a) },
                else_branch = else_g () => (float[4,8] e_out) { e_out = Sub(acc_in, a) }
            >
        }
    >
    y = Add(acc, x)
}
"""

# The whole network is one If: every node lives in a branch; the weight w is read in both.
WHOLE_IF_MODEL = """
<ir_version: 10, opset_import: ["" : 17]>
g (float[4,8] x, bool c) => (float[4,8] y) <float[8] w = {1, 2, 3, 4, 5, 6, 7, 8}> {
    y = If(c) <
        then_branch = then_g () => (float[4,8] t_out) {
            t1 = Relu(x)
            t2 = Neg(t1)
            t3 = Neg(t2)
            t4 = Add(t3, w)
            t_out = Add(t4, t1)
        },
        else_branch = else_g () => (float[4,8] e_out) {
            e1 = Neg(x)
            e_out = Mul(e1, w)
        }
    >
}
"""

RNG = np.random.default_rng(7)
X = RNG.standard_normal((4, 8)).astype(np.float32)
FEEDS = {
    "if": [{"x": X, "c": np.array(True)}, {"x": X, "c": np.array(False)}],
    "loop": [{"x": X, "n": np.array(3, np.int64)}, {"x": X, "n": np.array(0, np.int64)}],
    "scan": [{"x": X, "s0": RNG.standard_normal(8).astype(np.float32)}],
    "nested": [{"x": X, "n": np.array(2, np.int64), "c": np.array(c)} for c in (True, False)],
    "whole-if": [{"x": X, "c": np.array(True)}, {"x": X, "c": np.array(False)}],
}
MODELS = {"if": IF_MODEL, "loop": LOOP_MODEL, "scan": SCAN_MODEL, "nested": NESTED_MODEL, "whole-if": WHOLE_IF_MODEL}
PARENT_OP = {"if": "If", "loop": "Loop", "scan": "Scan", "nested": "Loop"}


def _analysis(path: Path):
    return analyse(load_model(path))


def _uses(analysis, tensor: str) -> list[tuple[int, int | None]]:
    return [(u.position, u.input_index) for u in analysis.uses[tensor]]


@pytest.mark.parametrize("kind", ["if", "loop", "scan", "nested"])
def test_outer_read_in_a_body_is_a_use_at_the_parent_position(write_model, kind):
    analysis = _analysis(write_model(MODELS[kind]))
    parent = next(p for p, n in enumerate(analysis.nodes) if n.op_type == PARENT_OP[kind])
    assert parent == 4  # Constant nodes take no position
    expected = [(1, 0), (parent, None)] + ([(5, 1)] if kind == "if" else [])
    assert _uses(analysis, "a") == expected
    # one use per parent node, however many branches or scopes read it
    assert sum(1 for u in analysis.uses["a"] if u.position == parent) == 1
    # names defined inside a body are not main-graph tensors
    body_names = {"t_out", "e_out", "acc_out", "c_out", "s_out", "col"}
    assert body_names.isdisjoint(analysis.uses) and body_names.isdisjoint(analysis.producer)


@pytest.mark.parametrize("kind", ["if", "loop", "scan", "nested"])
def test_plan_reloads_before_the_parent_node(write_model, kind):
    plan = scheduled_plan(
        _analysis(write_model(MODELS[kind])), PlanRequest.of_options(select_distance=1, prefetch_distance=0)
    )
    validate_plan(plan)
    offloads = {o["tensor"]: o for o in plan["offloads"]}
    a = offloads["a"]
    assert a["d2h_after"] == 0
    assert [(u["position"], u["input_index"]) for u in a["device_uses"]] == [(1, 0)]
    (group,) = a["reload_groups"]
    assert group["uses"][0]["position"] == 4 and group["uses"][0]["input_index"] is None
    assert group["uses"][0]["node"].startswith(PARENT_OP[kind])
    assert group["gap"] == 3 and group["h2d_before"] == 4


def test_gap_to_a_body_read_is_measured_from_the_parent(write_model):
    # with select distance 3 the gap 1 -> 4 (=3) does not qualify: the body read is at 4, not later
    plan = scheduled_plan(
        _analysis(write_model(LOOP_MODEL)), PlanRequest.of_options(select_distance=3, prefetch_distance=0)
    )
    assert "a" not in {o["tensor"] for o in plan["offloads"]}
    assert {r["tensor"]: r["max_gap"] for r in plan["rejected"]}["a"] == 3


def test_prefetch_moves_the_reload_ahead_of_the_parent(write_model):
    plan = scheduled_plan(
        _analysis(write_model(IF_MODEL)), PlanRequest.of_options(select_distance=1, prefetch_distance=2)
    )
    (group,) = {o["tensor"]: o for o in plan["offloads"]}["a"]["reload_groups"]
    assert group["h2d_before"] == 2


def test_whole_network_in_one_if_plans(write_model, run_cli, tmp_path):
    path = write_model(WHOLE_IF_MODEL)
    analysis = _analysis(path)
    assert [n.op_type for n in analysis.nodes] == ["If"]
    assert _uses(analysis, "x") == [(0, None)] and _uses(analysis, "w") == [(0, None)]
    out = tmp_path / "plan.json"
    res = run_cli("plan", path, "-o", out, "--select-distance", "0", "--params")
    assert res.exit_code == 0, res.stderr
    plan = read_plan(out)
    assert plan["model"]["num_positions"] == 1
    assert plan["offloads"] == []  # nothing idles in a one-position run
    reasons = {r["tensor"]: r["reason"] for r in plan["rejected"]}
    assert reasons == {"y": "unused", "w": "subgraph-only"}  # read only inside the If: said so
    assert "which are not planned in" in res.stdout + res.stderr  # and the verdict says why nothing moved


# ---------------------------------------------------------------------------------------------------
# apply + run: the rewritten models give identical outputs
# ---------------------------------------------------------------------------------------------------


def _session(path: Path):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    so.log_severity_level = 3
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def _assert_identical(original: Path, rewritten: Path, feeds_list: list[dict]) -> None:
    want_session, got_session = _session(original), _session(rewritten)
    for feeds in feeds_list:
        want = want_session.run(None, feeds)
        got = got_session.run(None, feeds)
        assert len(want) == len(got)
        for w, g in zip(want, got):
            assert w.dtype == g.dtype and w.shape == g.shape
            assert np.array_equal(w, g)


def _body_reads(node: onnx.NodeProto) -> set[str]:
    """Every name read by a node inside the bodies of ``node``, at any depth."""
    names: set[str] = set()
    for attr in node.attribute:
        for g in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs:
            for inner in g.node:
                names.update(inner.input)
                names |= _body_reads(inner)
            names.update(o.name for o in g.output)
    return names


def _memcpy_count(model: onnx.ModelProto) -> dict[str, int]:
    counts: dict[str, int] = {}

    def walk(graph: onnx.GraphProto) -> None:
        for node in graph.node:
            if node.op_type.startswith("Memcpy"):
                counts[node.op_type] = counts.get(node.op_type, 0) + 1
            for attr in node.attribute:
                for g in [attr.g] if attr.type == onnx.AttributeProto.GRAPH else attr.graphs:
                    walk(g)

    walk(model.graph)
    return counts


@pytest.mark.parametrize("prefetch", ["0", "2"])
@pytest.mark.parametrize("kind", ["if", "loop", "scan", "nested"])
def test_apply_and_run_subgraph_models_identically(write_model, run_cli, tmp_path, kind, prefetch):
    path = write_model(MODELS[kind])
    plan, rewritten = tmp_path / "plan.json", tmp_path / "model.offload.onnx"
    args = ("--select-distance", "1", "--prefetch-distance", prefetch)
    assert run_cli("plan", path, "-o", plan, *args).exit_code == 0
    res = run_cli("apply", plan, "-o", rewritten, "--no-order-pins")  # the bare encoding, checked below
    assert res.exit_code == 0, res.stderr
    model = onnx.load(str(rewritten))
    onnx.checker.check_model(model, full_check=True)
    pinned = tmp_path / "model.pinned.onnx"
    assert run_cli("apply", plan, "-o", pinned).exit_code == 0
    _assert_identical(path, pinned, FEEDS[kind])
    counts = _memcpy_count(model)
    offloads = json.loads(plan.read_text())["offloads"]
    assert counts.get("MemcpyToHost") == len(offloads) >= 1
    assert counts.get("MemcpyFromHost") == sum(len(o["reload_groups"]) for o in offloads)
    # copies live in the main graph only; the body now reads the reloaded tensor, not `a`
    assert _memcpy_count(onnx.load(str(path))) == {}
    parent = next(n for n in model.graph.node if n.op_type == PARENT_OP[kind])
    (host,) = {n.output[0] for n in model.graph.node if n.op_type == "MemcpyToHost" and n.input[0] == "a"}
    (reload,) = {n.output[0] for n in model.graph.node if n.op_type == "MemcpyFromHost" and n.input[0] == host}
    body_reads = _body_reads(parent)
    assert "a" not in body_reads and reload in body_reads
    _assert_identical(path, rewritten, FEEDS[kind])


def test_whole_if_model_applies_and_runs_identically(write_model, run_cli, tmp_path):
    path = write_model(WHOLE_IF_MODEL)
    plan, rewritten = tmp_path / "plan.json", tmp_path / "model.offload.onnx"
    assert run_cli("plan", path, "-o", plan, "--params").exit_code == 0
    res = run_cli("apply", plan, "-o", rewritten)
    assert res.exit_code == 0, res.stderr
    onnx.checker.check_model(onnx.load(str(rewritten)), full_check=True)
    _assert_identical(path, rewritten, FEEDS["whole-if"])

    # forcing the weight makes it live on the host and be reloaded before the If reads it
    forced_plan, forced = tmp_path / "forced.json", tmp_path / "forced.offload.onnx"
    assert run_cli("plan", path, "-o", forced_plan, "--params", "--force", "w").exit_code == 0
    (w,) = json.loads(forced_plan.read_text())["offloads"]
    assert w["tensor"] == "w" and w["reload_groups"][0]["h2d_before"] == 0
    res = run_cli("apply", forced_plan, "-o", forced)
    assert res.exit_code == 0, res.stderr
    model = onnx.load(str(forced))
    onnx.checker.check_model(model, full_check=True)
    assert _memcpy_count(model) == {"MemcpyFromHost": 1}
    _assert_identical(path, forced, FEEDS["whole-if"])


@pytest.mark.parametrize("kind", ["if", "whole-if"])
def test_run_command_compares_subgraph_models(write_model, run_cli, tmp_path, kind):
    path = write_model(MODELS[kind])
    plan, rewritten, inputs = tmp_path / "plan.json", tmp_path / "m.offload.onnx", tmp_path / "inputs.npz"
    extra = ("--force", "w") if kind == "whole-if" else ()
    assert run_cli("plan", path, "-o", plan, "--select-distance", "1", "--params", *extra).exit_code == 0
    assert run_cli("apply", plan, "-o", rewritten).exit_code == 0
    np.savez(inputs, **FEEDS[kind][0])
    res = run_cli(
        "run",
        rewritten,
        "--device",
        "cpu",
        "--inputs",
        inputs,
        "--compare-to",
        path,
        "--opt-level",
        "disable",
        "--repeat",
        "1",
        "--json",
    )
    assert res.exit_code == 0, res.stdout + res.stderr
    report = res.json()
    assert report["comparison"] and all(c["identical"] for c in report["comparison"].values())
    assert report["order"]["matches"] is True, report["order"]


BODY_WEIGHTS_MODEL = """
<ir_version: 10, opset_import: ["" : 17]>
g (float[4,8] x, bool c) => (float[4,8] y) {
    y = If(c) <
        then_branch = then_g () => (float[4,8] t_out) <float[8] wt = {1, 2, 3, 4, 5, 6, 7, 8}> {
            t1 = Relu(x)
            t_out = Add(t1, wt)
        },
        else_branch = else_g () => (float[4,8] e_out) <float[8] we = {8, 7, 6, 5, 4, 3, 2, 1}> {
            e_out = Mul(x, we)
        }
    >
}
"""


def test_what_bodies_hold_is_named_in_the_verdict(write_model, run_cli, tmp_path):
    """Weights inside If branches are counted as weights, and the plan names the control-flow node
    that holds them, since no plan reaches into its bodies (the If-wrapped silero VAD keeps 340 there)."""
    path = write_model(BODY_WEIGHTS_MODEL)
    res = run_cli("plan", path, "--params", "--select-distance", "0", "-o", tmp_path / "p.json", "--json")
    assert res.exit_code == 0, res.stderr
    (body,) = json.loads(res.stdout)["unreached_bodies"]
    assert body["op"] == "If" and body["weights"] == 2 and body["weight_bytes"] == 64
    assert "no plan reaches what If/Loop/Scan bodies hold" in res.stderr and "2 weight(s)" in res.stderr
    # the verdict line names the node, and --explain gives it a row of its own
    res = run_cli("plan", path, "--params", "--select-distance", "0", "-o", tmp_path / "q.json", "--explain")
    assert res.exit_code == 0, res.stderr
    verdict = " ".join((res.stdout + res.stderr).split())
    assert "the plan does not lower the peak: If" in verdict and "in its bodies, which are not planned in" in verdict
    explained = " ".join(res.stdout.split())
    assert "(its bodies)" in explained and "not reached" in explained and "2 weight(s) resident" in explained


# Each branch counts a Range over a length read from x's shape: onnx's inference cannot size it, and
# both branches name their tensors alike (as Optimum's merged decoder does), with other shapes.
RANGE_BODIES_MODEL = """
<ir_version: 10, opset_import: ["" : 17]>
g (float[4,8] x, bool c) => (float[4,8] y)
<int64 zero = {0}, int64 one = {1}, int64[1] axes = {1}>
{
    y = If(c) <
        then_branch = then_g () => (float[4,8] t_out) {
            s = Shape(x)
            d = Gather<axis = 0>(s, one)
            r = Range(zero, d, one)
            rf = Cast<to = 1>(r)
            t_out = Add(x, rf)
        },
        else_branch = else_g () => (float[4,8] e_out) {
            s = Shape(x)
            d = Gather<axis = 0>(s, zero)
            r = Range(zero, d, one)
            rf = Cast<to = 1>(r)
            e = Unsqueeze(rf, axes)
            e_out = Add(x, e)
        }
    >
}
"""


def test_body_sizes_onnx_cannot_infer_come_from_onnxruntimes_inference(write_model, run_cli, tmp_path):
    from offloadctl.loading.symbolic import symbolic_value_infos

    path = write_model(RANGE_BODIES_MODEL)
    bodies = symbolic_value_infos(onnx.load(path), path).bodies
    shape = lambda key, name: [d.dim_value for d in bodies[key][name].tensor_type.shape.dim]  # noqa: E731
    assert shape(("y", "then_branch"), "r") == [8] and shape(("y", "else_branch"), "r") == [4]
    res = run_cli("plan", path, "-o", tmp_path / "p.json", "--json")
    assert res.exit_code == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["unknown_size_tensors"] == 0
    # the larger branch: r (int64[8], 64 B) and rf (float[8], 32 B) alive together at its Cast
    assert doc["unreached_bodies"][0]["working_bytes"] == 96


NONZERO_BODY_MODEL = """
<ir_version: 10, opset_import: ["" : 17]>
g (bool c, float[4] x) => (float[4] y) {
    y = If(c) <
        then_branch = t () => (float[4] ty) {
            nz = NonZero(x)
            a = Cast<to = 1>(nz)
            b = Relu(a)
            d = Sigmoid(b)
            ty = Identity(x)
        },
        else_branch = e () => (float[4] ey) {
            ey = Identity(x)
        }
    >
}
"""


def test_body_tensors_of_unknown_size_are_listed_in_the_bodys_order(write_model):
    from offloadctl.analysis.timeline import unknown_tensors

    analysis = analyse(load_model(write_model(NONZERO_BODY_MODEL)))
    found = [name for name in unknown_tensors(analysis) if "/then_branch/" in name]
    # NonZero's output size depends on the data: it and all computed from it, in the order the body makes them
    # (not in a set's order, which changes from run to run)
    assert [name.rsplit("/", 1)[1] for name in found] == ["nz", "a", "b", "d"]


@pytest.mark.parametrize("model", [IF_MODEL, LOOP_MODEL, None])
def test_the_budget_planners_baseline_and_bound_are_the_timelines(write_model, model):
    """The budget planner takes the memory of the model as it is from the simulation's trace of it
    (`resident_profile`) and its lower bound from the simulation's base (`lower_bound`), which a
    simulation of its plan then reuses: step by step the timeline's, bodies' working sets included."""
    from offloadctl.analysis import timeline
    from offloadctl.simulation.memory import lower_bound, resident_profile

    path = (
        write_model(model) if model is not None else Path(__file__).parent.parent / "sample_models" / "transformer.onnx"
    )
    analysis = analyse(load_model(path))
    expected = timeline.profile(analysis, None, prefetch_distance=0)
    bound = timeline.lower_bound(analysis)
    from_trace = resident_profile(analysis)
    assert from_trace.dtype == np.int64 and np.array_equal(from_trace, expected)
    assert from_trace.max() > 0
    assert lower_bound(analysis) == bound


@pytest.mark.parametrize("kind", ["if", "loop", "scan", "nested", "whole-if"])
def test_a_nodes_working_set_counts_what_its_bodies_read(write_model, kind):
    """The weak-plan advice prices the node at the peak by what it reads and writes: its inputs and
    outputs, and the outer tensors its bodies read (the analysis's uses without an input index)."""
    from offloadctl.planning.advice import _node_working_set

    analysis = _analysis(write_model(MODELS[kind]))
    bodies = 0
    for p, node in enumerate(analysis.nodes):
        inner = {t for t, uses in analysis.uses.items() if any(u.position == p and u.input_index is None for u in uses)}
        bodies += bool(inner)
        names = {n for n in (*node.input, *node.output) if n} | inner
        expected = sum(info.bytes or 0 for n in names if (info := analysis.infos.get(n)) is not None)
        assert _node_working_set(analysis, p) == expected
    assert bodies >= 1
