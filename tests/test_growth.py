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
