"""A rewrite's measured memory against its original's (`offloadctl.running.growth`), and `run`'s verdict on it."""

from __future__ import annotations

import onnx
from onnx import helper

from offloadctl.running.growth import MemoryGrowth, moved_nodes

from conftest import SAMPLES


def test_moved_nodes_are_those_at_another_place_among_the_originals():
    assert moved_nodes(["a", "b", "c"], ["a", "copy", "b", "pin", "c"]) == []
    assert moved_nodes(["a", "b", "c", "d"], ["a", "copy", "c", "b", "d"]) == ["c", "b"]


def test_growth_is_explained_up_to_the_copies_and_a_percent_of_the_original():
    assert MemoryGrowth(1000, 1100, 100).explained
    assert MemoryGrowth(1000, 1110, 100).explained  # the arena's rounding
    assert MemoryGrowth(1000, 1111, 100).explained is False
    assert MemoryGrowth(1000, 5000, None).explained is None  # a copy of unknown size: not judged
    assert MemoryGrowth(1000, 1300, 100).to_json()["excess_bytes"] == 200


def _run(run_cli, model, *args):
    return run_cli(
        "run", model, "--device", "cpu", "--inputs", SAMPLES / "unet.inputs.npz", "--repeat", "1",
        "--execution-order", "default", "--measure-memory", "--compare-to", SAMPLES / "unet.onnx", *args,
    )  # fmt: skip


def test_run_fails_a_rewrite_whose_arena_grows_beyond_its_copies(run_cli, tmp_path):
    """The rewrite as apply writes it: onnxruntime's arena is above the original's by no more than its
    copies (PASSED). The same rewrite with one more node, last in the DEFAULT walk, that reads every
    convolution's output and keeps them all alive: far more than the copies explain, so run fails,
    naming both figures."""
    plan, out = tmp_path / "plan.json", tmp_path / "unet.offload.onnx"
    made = run_cli("plan", SAMPLES / "unet.onnx", "-o", plan, "--select-distance", "10", "--execution-order", "default")
    assert made.exit_code == 0, made.stderr
    assert run_cli("apply", plan, "-o", out).exit_code == 0
    result = _run(run_cli, out, "--json")
    assert result.exit_code == 0, result.stderr
    growth = result.json()["memory_growth"]
    assert growth["explained"] is True and growth["copy_bytes"] > 0
    original = _run(run_cli, SAMPLES / "unet.onnx", "--json").json()["measured_memory"][0]["peak_bytes"]
    assert growth["original_bytes"] == original
    assert growth["rewrite_bytes"] <= original + growth["copy_bytes"] + original // 100

    kept = onnx.load(str(out))
    inferred = onnx.shape_inference.infer_shapes(onnx.load(str(SAMPLES / "unet.onnx"))).graph.value_info
    typed = {v.name for v in inferred if v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT}
    activations = [o for n in kept.graph.node if n.op_type in ("Conv", "Relu") for o in n.output if o in typed]
    assert len(activations) > 10
    kept.graph.node.append(helper.make_node("SequenceConstruct", activations, ["kept"], name="keep_all"))
    worse = tmp_path / "unet.kept.onnx"
    onnx.save(kept, str(worse))
    failed = _run(run_cli, worse)
    assert failed.exit_code == 1
    message = " ".join(failed.stderr.split())
    assert "beyond what the rewrite's copies account for" in message and "fix:" in message
    assert "Traceback" not in failed.stderr
    doc = _run(run_cli, worse, "--json")
    assert doc.exit_code == 1 and doc.json()["passed"] is False
    assert doc.json()["memory_growth"]["explained"] is False


def test_a_streams_rewrite_that_grows_is_blamed_on_its_copy_stream():
    """On two streams the growth comes from the copy stream (copies issued as their gates open, buffers
    planned apart), not from the order: the fix is copies in line, not an order flag."""
    from types import SimpleNamespace

    from offloadctl.cli.run_cmd import _growth_error

    report = SimpleNamespace(growth=MemoryGrowth(1000, 5000, 100), execution_order="default", streams=object())
    error = _growth_error("m.onnx", "orig.onnx", report)
    assert "the copy stream issues each copy" in str(error) and error.hint == "apply the plan with --copies inline"
    error = _growth_error("m.onnx", "orig.onnx", SimpleNamespace(**{**vars(report), "streams": None}))
    assert "--execution-order default" in error.hint and "copy stream" not in str(error)


def test_growth_the_arenas_rounding_explains_is_not_blamed_on_the_order():
    """onnxruntime's arena (kNextPowerOfTwo regions) can put a large copy in a region twice its size: ddddocr's
    32 MiB weight copy took a 64 MiB one, 23 MiB over what its copies explain, which run once blamed on the
    order. What the replica counts of that rounding (up to the excess) is explained, and said."""
    assert MemoryGrowth(1000, 1400, 100, rounding_bytes=300).explained
    assert MemoryGrowth(1000, 1400, 100, rounding_bytes=200).explained is False
    assert MemoryGrowth(1000, 1400, 100, rounding_bytes=300).to_json()["rounding_bytes"] == 300


def test_the_replica_counts_what_rounding_a_large_copy_adds(tmp_path):
    """A 9 MiB weight copy made when the arena's next region is 16 MiB takes it whole (it is not split under
    twice the request): the replica's rounding of the rewrite over the original is that region's slack."""
    import numpy as np
    from onnx import TensorProto, numpy_helper

    from offloadctl.analysis.graph import analyse
    from offloadctl.loading.model import load_model
    from offloadctl.pipeline import make_plan
    from offloadctl.rewriting.rewrite import apply_plan
    from offloadctl.running.growth import arena_rounding

    n = 1 << 18  # 1 MiB of float32
    weight = numpy_helper.from_array(np.ones((1, 9 * n), np.float32), "W")
    nodes = [
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("Sin", ["a"], ["b"]),
        helper.make_node("Concat", ["b", "b"], ["d"], axis=1),
        helper.make_node("Concat", ["d", "d"], ["e"], axis=1),
        helper.make_node("Cos", ["e"], ["f"]),
        helper.make_node("ReduceSum", ["f"], ["s1"], keepdims=0),
        helper.make_node("ReduceSum", ["W"], ["s2"], keepdims=0),
        helper.make_node("Add", ["s1", "s2"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])], [weight],
    )  # fmt: skip
    source = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=9), str(source))
    original = analyse(load_model(source))
    plan = make_plan(original, params=True, force=("W",), select_distance=2, prefetch_distance=0)
    rewrite_path = tmp_path / "m.offload.onnx"
    onnx.save(apply_plan(plan, original), str(rewrite_path))
    assert arena_rounding(analyse(load_model(rewrite_path)), original) == 7 * 4 * n  # a 16 MiB region for 9 MiB
    assert arena_rounding(original, original) == 0
