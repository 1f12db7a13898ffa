"""Patterns found in real exported models (PyTorch, paddle2onnx, silero, ...), each reduced to a tiny graph.

Each test names the pattern it stands for; the models are written by hand so the suite needs no
exporter and no downloaded file.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from offloadctl.analysis.graph import analyse
from offloadctl.loading.inline import inlined_calls
from offloadctl.loading.model import load_model
from offloadctl.planning.budget.strategy import budget_filter
from offloadctl.planning.make import scheduled_plan
from offloadctl.planning.prefetch import prefetch
from offloadctl.planning.request import PlanRequest, PrefetchPart, SelectPart
from offloadctl.planning.select import select
from offloadctl.rewriting.rewrite import apply_plan
from offloadctl.running.runner import run_model
from offloadctl.simulation.memory import lower_bound
from offloadctl.simulation.result import simulate

# PyTorch's LSTM export builds its initial state's shape at run time:
# Shape(x) -> Gather(idx) -> Unsqueeze -> Concat(with a constant) -> Expand's shape input.
# `idx` and `tail` are int64 weights and `u` an int64 activation that only feed that shape
# computation; `w` is a float weight and `tok`/`emb` an int64 index into float data: real offloads.
SHAPE_PATH_MODEL = """
<ir_version: 10, opset_import: ["" : 17]>
g (float[4, 8] x, int64[4] tok) => (float[4, 4, 8] y, float[4, 8] z)
  <int64 idx = {0}, int64[2] tail = {4, 8}, int64[1] ax = {0}, float[8] w = {1, 2, 3, 4, 5, 6, 7, 8},
   float[4, 8] emb = {0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.3, 1.4, 1.5,
                      1.6, 1.7, 1.8, 1.9, 2.0, 2.1, 2.2, 2.3, 2.4, 2.5, 2.6, 2.7, 2.8, 2.9, 3.0, 3.1}>
{
    a = Relu(x)
    s = Shape(a)
    g0 = Gather(s, idx)
    b = Neg(a)
    c = Neg(b)
    d = Neg(c)
    u = Unsqueeze(g0, ax)
    e = Neg(d)
    f = Neg(e)
    full = Concat<axis = 0>(u, tail)
    h = Mul(f, w)
    y0 = Expand(h, full)
    y = Relu(y0)
    k = Gather(emb, tok)
    m = Add(k, w)
    z = Add(m, a)
}
"""


def _analysis(path, **shapes):
    return analyse(load_model(path, input_shapes=shapes or None))


def test_weights_and_activations_feeding_only_shape_computations_are_host_inputs(write_model):
    path = write_model(SHAPE_PATH_MODEL)
    analysis = _analysis(path)
    plan = scheduled_plan(analysis, PlanRequest.of_options(select_distance=0, params=True, prefetch_distance=0))
    offloaded = {o["tensor"] for o in plan["offloads"]}
    rejected = {r["tensor"]: r for r in plan["rejected"]}
    for name in ("idx", "tail", "g0", "s", "u", "ax"):
        assert rejected[name]["reason"] == "host-input", name
    assert "shape computations" in rejected["idx"]["detail"]
    assert "Expand" in rejected["idx"]["detail"]
    assert rejected["full"]["reason"] == "host-input"  # read directly as Expand's shape
    # Float data and an int64 index into float data are still offloaded.
    assert {"w", "emb", "a"} <= offloaded
    assert "tok" not in rejected or rejected["tok"]["reason"] != "host-input"


def test_rewritten_shape_path_model_simulates_like_its_plan(write_model, tmp_path):
    # Offloading a shape-path weight hid the Expand's shape from shape inference on the rewritten
    # model, so `simulate` of the rewritten model disagreed with the plan's prediction.
    path = write_model(SHAPE_PATH_MODEL)
    analysis = _analysis(path)
    plan = scheduled_plan(analysis, PlanRequest.of_options(select_distance=0, params=True, prefetch_distance=0))
    out = tmp_path / "rewritten.onnx"
    onnx.save(apply_plan(plan, analysis), str(out))
    rewritten = analyse(load_model(out))
    predicted = simulate(analysis, plan, profile=None)
    measured = simulate(rewritten, profile=None)
    assert rewritten.infos["y0"].bytes == 4 * 4 * 8 * 4
    assert measured.peak_after == predicted.peak_after
    assert measured.peak_before == predicted.peak_before


# A training step as torch's exporter writes it: the loss is one NegativeLogLikelihoodLoss node (an
# ONNX function onnxruntime has no kernel for and inlines), and the model has a local function
# (`local.gelu_block`). onnxruntime gives inlined nodes new, higher indices and, in PRIORITY_BASED
# order, runs them only when nothing else is ready: the loss ran after the whole backward part.
FUNCTION_MODEL = """
<ir_version: 10, opset_import: ["" : 17, "local" : 1]>
g (float[4, 8] x, int64[4] t, float[8, 3] w) => (float loss, float[4, 3] grad_in, float[8, 3] grad_w) {
    h = MatMul(x, w)
    a = local.gelu_block(h)
    logp = LogSoftmax<axis = 1>(a)
    loss = NegativeLogLikelihoodLoss<reduction = "mean">(logp, t)
    p = Exp(logp)
    g1 = Neg(p)
    g2 = Mul(g1, a)
    g3 = Sigmoid(g2)
    grad_in = Mul(g3, p)
    xt = Transpose<perm = [1, 0]>(x)
    grad_w = MatMul(xt, grad_in)
}
<domain: "local", opset_import: ["" : 17]>
gelu_block (v) => (r) {
    s = Sigmoid(v)
    r = Mul(v, s)
}
"""


def test_functions_onnxruntime_inlines_are_expanded_in_file_order(write_model):
    path = write_model(FUNCTION_MODEL)
    original = onnx.load(str(path))
    assert len(inlined_calls(original)) == 2
    analysis = _analysis(path)
    ops = [n.op_type for n in analysis.nodes]
    assert "NegativeLogLikelihoodLoss" not in ops and "gelu_block" not in ops
    assert not analysis.loaded.proto.functions
    # The loss's body sits where the loss node was: before Exp, not at the end.
    names = analysis.node_names
    loss_body = [i for i, n in enumerate(analysis.nodes) if n.name.startswith("NegativeLogLikelihoodLoss_")]
    assert loss_body and max(loss_body) < ops.index("Exp")
    assert len(set(names)) == len(names)
    # Expanded nodes are named after their call; the file's own (unnamed) nodes stay as they were.
    unnamed = [n.op_type for n in analysis.nodes if not n.name]
    assert sorted(unnamed) == sorted(
        n.op_type for n in original.graph.node if n.op_type not in ("NegativeLogLikelihoodLoss", "gelu_block")
    )


def test_model_with_inlined_functions_runs_in_the_planned_order_bit_identically(write_model, tmp_path):
    path = write_model(FUNCTION_MODEL)
    analysis = _analysis(path)
    plan = scheduled_plan(analysis, PlanRequest.of_options(select_distance=1, params=True, prefetch_distance=1))
    assert plan["offloads"]
    out = tmp_path / "rewritten.onnx"
    onnx.save(apply_plan(plan, analysis), str(out))
    rng = np.random.default_rng(0)
    inputs = tmp_path / "inputs.npz"
    np.savez(
        inputs,
        x=rng.standard_normal((4, 8)).astype(np.float32),
        t=np.array([0, 2, 1, 0], dtype=np.int64),
        w=rng.standard_normal((8, 3)).astype(np.float32),
    )
    report = run_model(str(out), "cpu", inputs=inputs, compare_to=str(path), repeat=1, opt_level="disable")
    assert report.order.matches, report.order.to_json()
    assert not report.order.missing
    assert all(c.identical for c in report.comparison.values())


# GroupNormalization (opset 21) with its scale and bias as weights, as in diffusion UNets: its body
# depends on the input types, which onnx's inliner only finds when weights have a declared type.
GROUP_NORM_MODEL = """
<ir_version: 10, opset_import: ["" : 21]>
g (float[2, 4, 3, 3] x) => (float[2, 4, 3, 3] y)
  <float[4] scale = {1.0, 0.5, 2.0, 1.5}, float[4] bias = {0.0, 0.1, 0.2, 0.3}> {
    r = Relu(x)
    n = GroupNormalization<num_groups = 2>(r, scale, bias)
    m = Neg(n)
    y = Add(m, x)
}
"""


def test_group_normalization_with_weight_scale_is_expanded_and_runs_in_order(write_model, tmp_path):
    path = write_model(GROUP_NORM_MODEL)
    analysis = _analysis(path)
    assert "GroupNormalization" not in {n.op_type for n in analysis.nodes}
    plan = scheduled_plan(analysis, PlanRequest.of_options(select_distance=1, params=True, prefetch_distance=0))
    out = tmp_path / "rewritten.onnx"
    onnx.save(apply_plan(plan, analysis), str(out))
    report = run_model(str(out), "cpu", compare_to=str(path), repeat=1, opt_level="disable")
    assert report.order.matches, report.order.to_json()
    assert all(c.identical for c in report.comparison.values())


# The input is read first and last (a residual to the input, a mask read by every layer): it is on
# the device all run long and no plan can move it, so the lower bound must count it at every step.
INPUT_READ_LAST_MODEL = """
<ir_version: 10, opset_import: ["" : 17]>
g (float[1024] x) => (float[1024] y) <int64[1] starts = {0}, int64[1] ends = {1024}> {
    a = Relu(x)
    b = Concat<axis = 0>(a, a)
    c = Neg(b)
    d = Slice(c, starts, ends)
    e = Add(d, x)
    y = Mul(e, x)
}
"""


def test_lower_bound_counts_graph_inputs_until_their_last_read(write_model):
    analysis = _analysis(write_model(INPUT_READ_LAST_MODEL))
    bound, at = lower_bound(analysis)
    # At Neg: x (still to be read), b and c.
    assert bound == 4096 + 8192 + 8192
    assert analysis.nodes[at].op_type == "Neg"
    assert bound <= simulate(analysis, profile=None).peak_before


def test_budget_at_1_1x_lower_bound_fits_with_a_long_lived_input(write_model, tmp_path):
    # GroupNormalization bodies between residual adds to the input (a diffusion UNet's pattern):
    # with the input left out of the bound, a budget at 1.1x the bound could not be reached.
    nodes, weights, prev = [], [], "x"
    for i in range(4):
        weights += [
            numpy_helper.from_array(np.full(8, 1.0 + i, np.float32), f"s{i}"),
            numpy_helper.from_array(np.full(8, 0.1 * i, np.float32), f"b{i}"),
        ]
        nodes += [
            helper.make_node("Relu", [prev], [f"r{i}"]),
            helper.make_node("GroupNormalization", [f"r{i}", f"s{i}", f"b{i}"], [f"g{i}"], num_groups=2),
            helper.make_node("Add", [f"g{i}", "x" if i == 0 else f"r{i - 1}"], [f"a{i}"]),
        ]
        prev = f"a{i}"
    nodes.append(helper.make_node("Mul", [prev, "x"], ["y"]))
    value = [2, 8, 16, 16]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, value)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, value)],
        weights,
    )
    path = tmp_path / "gn.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10), str(path))
    analysis = _analysis(path)
    bound, _ = lower_bound(analysis)
    budget = int(bound * 1.1)
    assert budget < simulate(analysis, profile=None).peak_before
    selected = select(analysis, SelectPart(select_distance=0, params=True))
    plan = prefetch(
        budget_filter(selected, analysis, PlanRequest.of_options(budget=budget)), PrefetchPart(prefetch_distance=0)
    )
    assert simulate(analysis, plan, profile=None).peak_after <= budget


# silero VAD (op18, "ifless"): the network's last part is an If whose branches read a weight as
# Unsqueeze's axes, and the graph outputs carry a symbolic batch dimension. Only onnxruntime's
# symbolic shape inference sizes them; it gave up on the rewritten model (it knows neither
# MemcpyFromHost nor axes that arrive through a copy), so `simulate` of the rewritten model counted
# the outputs as 0 bytes and disagreed with the plan.
IF_AXES_MODEL = """
<ir_version: 10, opset_import: ["" : 17]>
g (float[N, 4] x, bool c) => (float[N, 1, 4] y) <int64[1] ax = {1}> {
    a = Relu(x)
    b = Neg(a)
    d = Neg(b)
    e = Neg(d)
    y = If(c) <
        then_branch = t () => (float[N, 1, 4] o1) { o1 = Unsqueeze(e, ax) },
        else_branch = f () => (float[N, 1, 4] o2) { n = Neg(e)  m = Sigmoid(n)  o2 = Unsqueeze(m, ax) }
    >
}
"""


def test_rewritten_model_keeps_sizes_that_need_symbolic_shape_inference(write_model, tmp_path):
    path = write_model(IF_AXES_MODEL)
    analysis = _analysis(path, x=[2, 4])
    assert analysis.infos["y"].bytes == 2 * 4 * 4
    # Forced: left to itself, select keeps `ax` on the host (see the next test).
    plan = scheduled_plan(
        analysis, PlanRequest.of_options(select_distance=1, params=True, prefetch_distance=0, force=("ax",))
    )
    assert "ax" in {o["tensor"] for o in plan["offloads"]}
    out = tmp_path / "rewritten.onnx"
    onnx.save(apply_plan(plan, analysis), str(out))
    rewritten = analyse(load_model(out, input_shapes={"x": [2, 4]}))
    assert rewritten.infos["y"].bytes == 2 * 4 * 4
    assert simulate(rewritten, profile=None).peak_after == simulate(analysis, plan, profile=None).peak_after


def test_weight_read_at_a_host_input_inside_a_subgraph_is_a_host_input(write_model):
    analysis = _analysis(write_model(IF_AXES_MODEL), x=[2, 4])
    plan = scheduled_plan(analysis, PlanRequest.of_options(select_distance=1, params=True, prefetch_distance=0))
    rejected = {r["tensor"]: r for r in plan["rejected"]}
    assert rejected["ax"]["reason"] == "host-input"
    assert "inside a subgraph of If" in rejected["ax"]["detail"]
    # the data the If reads is no host input: it is read only inside the If, which is not planned in
    assert rejected["e"]["reason"] == "subgraph-only"


def test_shape_inference_reads_through_copies_inside_subgraphs():
    # An If branch reads an offloaded weight as Unsqueeze's axes (silero VAD's pattern): the
    # symbolic inference needs the weight itself there, not the copy's output.
    from offloadctl.loading.symbolic import copies_as_identity as _copies_as_identity

    model = onnx.parser.parse_model("""
    <ir_version: 10, opset_import: ["" : 17]>
    g (float[4] x, bool c) => (float[1, 4] y) <int64[1] ax = {0}> {
        ax_dev = MemcpyFromHost(ax)
        y = If(c) <
            then_branch = t () => (float[1, 4] o1) { o1 = Unsqueeze(x, ax_dev) },
            else_branch = e () => (float[1, 4] o2) { n = Neg(x)  o2 = Unsqueeze(n, ax_dev) }
        >
    }
    """)
    plain = _copies_as_identity(model)
    assert [n.op_type for n in plain.graph.node] == ["Identity", "If"]
    branches = {a.name: a.g for a in plain.graph.node[1].attribute}
    assert branches["then_branch"].node[0].input[1] == "ax"
    assert branches["else_branch"].node[1].input[1] == "ax"
    assert model.graph.node[0].op_type == "MemcpyFromHost"  # the model itself is left alone
