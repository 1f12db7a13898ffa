"""Memory the timeline must count: inside subgraphs, and not at all for weights nothing reads.

A voice-activity model whose whole network sits in an If (one branch per sample rate, each with its
own weights) was reported with 8 bytes of weights and a 3 KiB peak: the weights and the working sets
inside If/Loop/Scan bodies were not counted. An initializer that no node reads was counted as
resident by the simulator but not by the budget strategy, and ``plan --budget`` ended in an
AssertionError. One memory model now says, for both:

- body weights are resident for the whole run; an If step holds its larger branch's working set,
  a Loop step one iteration's;
- onnxruntime drops an initializer nothing reads, so it takes no memory anywhere.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from offloadctl.analysis.graph import analyse
from offloadctl.analysis.timeline import (
    lower_bound,
    memory_tensors,
    profile,
    resident_spans,
    subgraph_memory,
    tensor_bytes,
)
from offloadctl.cli.inspect_cmd import inspect_report
from offloadctl.loading.model import load_model
from offloadctl.planning.budget.strategy import budget_filter, plan_peak
from offloadctl.planning.prefetch import prefetch
from offloadctl.planning.request import PlanRequest, PrefetchPart, SelectPart
from offloadctl.planning.select import select
from offloadctl.simulation.memory import lower_bound as simulator_lower_bound
from offloadctl.simulation.result import simulate

from models import make_model, save, tensor

KIB = 1024


def _weight(name: str, shape: tuple[int, ...]) -> onnx.TensorProto:
    return numpy_helper.from_array(np.full(shape, 0.01, np.float32), name)


def vad_like_model() -> onnx.ModelProto:
    """a = Relu(x); y = If(c) {then: 1 weight of 256 KiB} {else: 2 weights of 512 KiB}; out = Neg(y).

    Working sets inside the branches (their outputs are the If's output, counted outside):
    then: t1 (1 KiB) then t1 + t2 (2 KiB) -> 2 KiB; else: e1 (2 KiB) then e1 + e2 (3 KiB) -> 3 KiB.
    """
    then_branch = helper.make_graph(
        [
            helper.make_node("MatMul", ["a", "wt"], ["t1"]),
            helper.make_node("Relu", ["t1"], ["t2"]),
            helper.make_node("Add", ["t2", "a"], ["t_out"]),
        ],
        "then_net",
        [],
        [tensor("t_out", (1, 256))],
        initializer=[_weight("wt", (256, 256))],
    )
    else_branch = helper.make_graph(
        [
            helper.make_node("MatMul", ["a", "we1"], ["e1"]),
            helper.make_node("MatMul", ["e1", "we2"], ["e2"]),
            helper.make_node("Add", ["e2", "a"], ["e_out"]),
        ],
        "else_net",
        [],
        [tensor("e_out", (1, 256))],
        initializer=[_weight("we1", (256, 512)), _weight("we2", (512, 256))],
    )
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node("If", ["c"], ["y"], name="if_rate", then_branch=then_branch, else_branch=else_branch),
        helper.make_node("Neg", ["y"], ["out"], name="neg"),
    ]
    return make_model(nodes, [tensor("x", (1, 256)), tensor("c", (), TensorProto.BOOL)], [tensor("out", (1, 256))])


BODY_WEIGHTS = (256 * 256 + 256 * 512 + 512 * 256) * 4
# step 1 (the If): c (1 byte), a and y (1 KiB each), the else branch's 3 KiB, every body weight
PEAK = 1 + 2 * KIB + 3 * KIB + BODY_WEIGHTS


def test_weights_and_working_sets_inside_an_if_are_counted(tmp_path):
    path = save(vad_like_model(), tmp_path / "vad.onnx")
    analysis = analyse(load_model(path))
    inner = subgraph_memory(analysis)
    assert (inner.weight_count, inner.weight_bytes) == (3, BODY_WEIGHTS)
    assert inner.inner == {1: 3 * KIB}  # the larger branch, at the If's step
    result = simulate(analysis, profile=None)
    assert result.peak_before == PEAK and result.before.peak_step == 1
    assert result.before.resident_device == BODY_WEIGHTS
    assert lower_bound(analysis) == simulator_lower_bound(analysis) == (PEAK, 1)
    assert profile(analysis, prefetch_distance=0).tolist() == [
        BODY_WEIGHTS + 2 * KIB + 1,  # x, a, c
        PEAK,
        BODY_WEIGHTS + 2 * KIB,  # y, out
        BODY_WEIGHTS + KIB,  # the end of the run: out
    ]
    report = inspect_report(analysis)
    assert report["weights"]["in_subgraphs"] == {"count": 3, "bytes": BODY_WEIGHTS}
    assert report["weights"]["bytes"] == BODY_WEIGHTS  # the main graph has none


def test_inspect_shows_subgraph_weights(run_cli, tmp_path):
    path = save(vad_like_model(), tmp_path / "vad.onnx")
    result = run_cli("inspect", path)
    assert result.exit_code == 0, result.stderr
    assert "3 tensors" in result.stdout and "inside If/Loop/Scan bodies" in result.stdout
    doc = run_cli("inspect", path, "--json").json()
    assert doc["weights"]["in_subgraphs"]["bytes"] == BODY_WEIGHTS


def test_a_loop_holds_one_iteration_at_its_step(tmp_path):
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["c_in"], ["c_out"]),
            helper.make_node("Mul", ["acc_in", "a"], ["t"]),
            helper.make_node("Add", ["t", "a"], ["acc_out"]),
        ],
        "body",
        [tensor("i", (), TensorProto.INT64), tensor("c_in", (), TensorProto.BOOL), tensor("acc_in", (4, 8))],
        [tensor("c_out", (), TensorProto.BOOL), tensor("acc_out", (4, 8))],
    )
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node("Constant", [], ["go"], value=helper.make_tensor("go", TensorProto.BOOL, [], [True])),
        helper.make_node("Loop", ["n", "go", "x"], ["acc"], name="loop", body=body),
        helper.make_node("Mul", ["acc", "a"], ["y"], name="mul"),
    ]
    model = make_model(nodes, [tensor("x", (4, 8)), tensor("n", (), TensorProto.INT64)], [tensor("y", (4, 8))])
    analysis = analyse(load_model(save(model, tmp_path / "loop.onnx")))
    # inside: i, c_in, acc_in at the Identity (8 + 1 + 128); acc_in and t at the Mul (256); t at the Add
    assert subgraph_memory(analysis).inner == {1: 256}
    # the Loop's step: x, a (read inside the body), acc (its output), n, the Constant `go`, the body's 256
    assert simulate(analysis, profile=None).before.device[1] == 3 * 128 + 8 + 1 + 256
    assert lower_bound(analysis) == simulator_lower_bound(analysis)


def test_a_budget_plan_for_a_model_inside_an_if(run_cli, tmp_path):
    path = save(vad_like_model(), tmp_path / "vad.onnx")
    out = tmp_path / "plan.json"
    result = run_cli("plan", path, "-o", out, "--budget", str(PEAK - 1))
    assert result.exit_code == 1  # the If step itself is the peak: nothing can lower it
    assert f"({PEAK} bytes)" in result.stderr and "below the lower bound" in result.stderr and not out.exists()
    assert run_cli("plan", path, "-o", out, "--budget", str(PEAK)).exit_code == 0


# ---------------------------------------------------------------------------------------------------
# An initializer no node reads
# ---------------------------------------------------------------------------------------------------


def unused_weight_model() -> onnx.ModelProto:
    """A chain with a 1 MiB initializer that nothing reads; ``a`` idles for three positions."""
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node("Neg", ["a"], ["b"], name="neg_b"),
        helper.make_node("Neg", ["b"], ["c"], name="neg_c"),
        helper.make_node("Neg", ["c"], ["d"], name="neg_d"),
        helper.make_node("Add", ["d", "a"], ["y"], name="add_y"),
    ]
    unused = numpy_helper.from_array(np.zeros(262144, np.float32), "unused")
    return make_model(nodes, [tensor("x", (64, 64))], [tensor("y", (64, 64))], initializers=[unused])


def test_onnxruntime_drops_an_initializer_nothing_reads(tmp_path):
    path = save(unused_weight_model(), tmp_path / "m.onnx")
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.optimized_model_filepath = str(tmp_path / "as_loaded.onnx")
    ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    kept = onnx.load(str(tmp_path / "as_loaded.onnx"), load_external_data=False)
    assert "unused" not in {i.name for i in kept.graph.initializer}


def test_an_unread_initializer_takes_no_memory_anywhere(tmp_path):
    analysis = analyse(load_model(save(unused_weight_model(), tmp_path / "m.onnx")))
    tile = 64 * 64 * 4
    sim = simulate(analysis, profile=None)
    assert sim.peak_before == plan_peak(analysis)[0] == 3 * tile  # a, c, d at the Neg making d
    assert sim.before.resident_device == 0
    assert lower_bound(analysis)[0] == 3 * tile


def test_a_budget_plan_with_an_unread_initializer(run_cli, tmp_path):
    path = save(unused_weight_model(), tmp_path / "m.onnx")
    analysis = analyse(load_model(path))
    tile = 64 * 64 * 4
    plan = prefetch(
        budget_filter(select(analysis, SelectPart()), analysis, PlanRequest.of_options(budget=3 * tile)),
        PrefetchPart(prefetch_distance=0),
    )
    assert plan["budget"]["predicted_peak_bytes"] == simulate(analysis, plan, profile=None).peak_after <= 3 * tile
    out = tmp_path / "plan.json"
    result = run_cli("plan", path, "-o", out, "--budget", str(3 * tile), "--prefetch-distance", "0")
    assert result.exit_code == 0, result.stderr
    assert json.loads(out.read_text())["budget"]["predicted_peak_bytes"] <= 3 * tile
    below = run_cli("plan", path, "-o", tmp_path / "p2.json", "--budget", str(3 * tile - 1))
    assert below.exit_code == 1 and "lower bound" in below.stderr and "Traceback" not in below.stderr
    assert not (tmp_path / "p2.json").exists()


def test_the_if_model_runs(tmp_path):
    """The model the tests count is a real one: onnxruntime runs both branches."""
    path = save(vad_like_model(), tmp_path / "vad.onnx")
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = np.ones((1, 256), np.float32)
    for flag in (True, False):
        (out,) = sess.run(None, {"x": x, "c": np.array(flag)})
        assert out.shape == (1, 256) and np.isfinite(out).all()


def test_the_profile_without_offloads_counts_each_tensor_by_its_own_span(tmp_path):
    """`profile(analysis)` (built in one loop for big graphs) is the sum, tensor by tensor, of
    `resident_spans` at `tensor_bytes`: a graph input, activations, an output no node reads, a weight
    nobody reads (no memory), a weight that is a graph output (to the end)."""
    nodes = [
        helper.make_node("Add", ["x", "w"], ["a"], name="add"),
        helper.make_node("Neg", ["a"], ["dead"], name="dead_end"),
        helper.make_node("Relu", ["a"], ["b"], name="relu"),
        helper.make_node("Mul", ["b", "w"], ["y"], name="mul"),
    ]
    weights = [_weight("w", (4, 8)), _weight("unread", (16, 8)), _weight("shown", (2, 8))]
    model = make_model(nodes, [tensor("x")], [tensor("y"), tensor("shown", (2, 8))], initializers=weights)
    analysis = analyse(load_model(save(model, tmp_path / "m.onnx")))
    expected = np.zeros(analysis.num_positions + 1, dtype=np.int64)
    for name in memory_tensors(analysis):
        for start, end in resident_spans(analysis, name):
            expected[start : end + 1] += tensor_bytes(analysis, name)
    assert profile(analysis, prefetch_distance=0).tolist() == expected.tolist()
    assert expected[0] == 4 * 8 * 4 * 3 + 2 * 8 * 4  # x, w, a, and the shown weight; not the unread one
