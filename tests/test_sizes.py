"""Sizes are never silently lost: external data, nodes onnxruntime's symbolic inference cannot follow,
Shape slices, and what onnxruntime's kernels really return (shared KV buffers), against onnxruntime."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from offloadctl.analysis.graph import analyse
from offloadctl.loading.model import load_model
from offloadctl.loading.symbolic import VALUE_BYTES

from models import COMPUTED_RESHAPE


def _reshape_model() -> onnx.ModelProto:
    """Reshape(x, Concat(Slice(Shape(x)), tail)) with ``tail`` a weight (the `COMPUTED_RESHAPE` pattern):
    onnx's data propagation stops at the Slice, and onnxruntime's symbolic inference needs the weight's
    values. ``big`` is a weight larger than `VALUE_BYTES`."""
    model = onnx.parser.parse_model(COMPUTED_RESHAPE)
    graph = model.graph
    tail = next(n for n in graph.node if n.output[0] == "tail")
    graph.node.remove(tail)
    graph.initializer.append(numpy_helper.from_array(np.array([-1, 8], np.int64), "tail"))
    graph.initializer.append(numpy_helper.from_array(np.ones((160, 128), np.float32), "big"))
    graph.node.append(helper.make_node("Neg", ["big"], ["nbig"]))
    graph.output.append(helper.make_tensor_value_info("nbig", TensorProto.FLOAT, None))
    model.ir_version = 8
    return model


def _external(tmp_path, *, one_file: bool):
    folder = tmp_path / ("one" if one_file else "many")
    folder.mkdir()
    path = folder / "model.onnx"
    onnx.save(
        _reshape_model(),
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=one_file,
        location="model.data" if one_file else None,
        size_threshold=0,
    )
    return path


@pytest.mark.parametrize("one_file", [True, False], ids=["one data file", "one file per tensor"])
def test_sizes_need_the_values_of_external_weights(tmp_path, monkeypatch, one_file):
    path = _external(tmp_path, one_file=one_file)
    monkeypatch.chdir(tmp_path)  # the model's folder is not the current one
    analysis = analyse(load_model(path))
    assert analysis.infos["r"].bytes == 1 * 40 * 8 * 4
    assert analysis.unknown_sizes() == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["many" if not one_file else "one"]  # nothing left here


def test_only_small_external_weights_are_read_for_inference(tmp_path, monkeypatch):
    from offloadctl.loading import symbolic

    read = []
    original = symbolic._with_small_weights

    def spy(proto, folder):
        work = original(proto, folder)
        read.extend(t.name for t in work.graph.initializer if t.raw_data)
        return work

    monkeypatch.setattr(symbolic, "_with_small_weights", spy)
    analysis = analyse(load_model(_external(tmp_path, one_file=True)))
    assert analysis.infos["r"].bytes == 40 * 8 * 4 and analysis.infos["nbig"].bytes == 160 * 128 * 4
    assert read == ["tail"]  # 16 bytes; big (80 KiB) keeps its dims only
    assert 160 * 128 * 4 > VALUE_BYTES


def _range_model() -> onnx.ModelProto:
    """A torch dynamo pattern: Range(0, Squeeze(Shape(x, start=1, end=2))) — onnx's inference does not
    know the Range's length; onnxruntime's tool did not honour Shape's start/end and failed on it."""
    text = """
    <ir_version: 10, opset_import: ["" : 18]>
    g (float[B, N] x, float[B, N] w) => (float[B, N] y, float[N] z) {
        s = Shape<start = 1, end = 2>(x)
        n = Squeeze(s)
        zero = Constant<value = int64 {0}>()
        one = Constant<value = int64 {1}>()
        idx = Range(zero, n, one)
        f = Cast<to = 1>(idx)
        z = Neg(f)
        y = Add(x, w)
    }
    """
    return onnx.parser.parse_model(text)


def test_shape_slices_are_read_as_onnx_defines_them(tmp_path):
    path = tmp_path / "range.onnx"
    onnx.save(_range_model(), str(path))
    analysis = analyse(load_model(path, dims={"B": 3, "N": 5}))
    assert analysis.infos["idx"].shape == (5,)
    assert analysis.infos["z"].bytes == 5 * 4
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    x = np.zeros((3, 5), np.float32)
    assert session.run(["z"], {"x": x, "w": x})[0].shape == (5,)


def test_a_node_the_tool_cannot_follow_loses_only_what_depends_on_it(tmp_path, monkeypatch, caplog):
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference

    def broken(self, node):
        raise AssertionError

    monkeypatch.setattr(SymbolicShapeInference, "_infer_Range", broken)
    path = tmp_path / "range.onnx"
    onnx.save(_range_model(), str(path))
    caplog.set_level("INFO")
    analysis = analyse(load_model(path, dims={"B": 3, "N": 5}))
    assert analysis.unknown_sizes() == ["idx", "f"]  # the Range and what is computed from it (z is declared)
    assert analysis.infos["y"].bytes == 3 * 5 * 4
    assert [f.op_type for f in analysis.infos.symbolic_failures] == ["Range"]
    assert "cannot follow node" in caplog.text


def test_the_tools_passes_simplify_each_expression_once_with_the_same_result(monkeypatch):
    """onnxruntime's tool repeats its pass over the graph after merging two symbolic dimensions (here
    the Resizes' floor(2.0*floor(2.0*H)) with y's H2), each pass simplified the Resizes' expressions
    with sympy again, and simplify itself simplifies the inner floor again for the outer one
    (PP-OCRv4's detector: up to 0.8 s a Resize, five passes over). Each is now simplified once a
    run, and what the tool infers stays the same."""
    import contextlib

    import sympy
    from onnxruntime.tools import symbolic_shape_infer as tool

    from offloadctl.loading import symbolic

    model = onnx.parser.parse_model(
        """
        <ir_version: 8, opset_import: ["" : 13]>
        g (float[N, 3, H, W] x, float[N, 3, H2, W2] y) => (float[N, 3, ?, ?] z) {
          scales = Constant <value = float[4] {1.0, 1.0, 2.0, 2.0}> ()
          half = Resize <mode = "nearest"> (x, , scales)
          up = Resize <mode = "nearest"> (half, , scales)
          z = Add (up, y)
        }
        """
    )
    inner = sys.modules["sympy.simplify.simplify"]  # simplify calls itself by this module's name
    plain = inner.simplify
    computed: list[object] = []

    def counting(expr, *args, **kwargs):
        computed.append((expr, args, tuple(sorted(kwargs.items()))))
        return plain(expr, *args, **kwargs)

    monkeypatch.setattr(inner, "simplify", counting)
    monkeypatch.setattr(sympy, "simplify", counting)  # what the tool calls

    def inferred() -> tuple[list[bytes], list[object]]:
        computed.clear()
        result = symbolic.symbolic_value_infos(model, Path("model.onnx"))
        assert result.error is None and not result.failures
        return [vi.SerializeToString() for vi in result.value_infos], list(computed)

    kept, once = inferred()
    monkeypatch.setattr(symbolic, "_simplify_once", contextlib.nullcontext)  # the tool as it ships
    shipped, asked = inferred()
    assert kept == shipped
    assert len(asked) > len(set(asked))  # the second pass asked again ...
    assert len(once) == len(set(once)) and set(once) == set(asked)  # ... and is now answered from the first
    assert inner.simplify is counting and tool.sympy is sympy  # both given back after each run


def test_a_dynamically_quantized_lstm_has_the_sizes_onnxruntime_gives_it(tmp_path):
    """onnxruntime's ``quantize_dynamic`` makes a com.microsoft DynamicQuantizeLSTM of every LSTM (ddddocr's
    OCR model has one), whose outputs neither onnx's inference nor onnxruntime's tool sized: they, and
    everything computed from them, were left out of plans."""
    hidden, width, directions = 2, 4, 2
    lstm = helper.make_node(
        "DynamicQuantizeLSTM",
        ["x", "w", "r", "", "", "", "", "", "w_scale", "w_zp", "r_scale", "r_zp"],
        ["y", "y_h", "y_c"],
        domain="com.microsoft",
        hidden_size=hidden,
        direction="bidirectional",
    )
    weights = {
        "w": np.ones((directions, width, 4 * hidden), np.int8),
        "r": np.ones((directions, hidden, 4 * hidden), np.int8),
        "w_scale": np.full((directions,), 0.1, np.float32),
        "w_zp": np.zeros((directions,), np.int8),
        "r_scale": np.full((directions,), 0.1, np.float32),
        "r_zp": np.zeros((directions,), np.int8),
    }
    graph = helper.make_graph(
        [lstm, helper.make_node("Relu", ["y"], ["z"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["S", 3, width])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, None) for name in ("z", "y_h", "y_c")],
        [numpy_helper.from_array(value, name) for name, value in weights.items()],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )
    model.ir_version = 8
    path = tmp_path / "lstm.onnx"
    onnx.save(model, str(path))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    z, y_h, y_c = session.run(None, {"x": np.ones((5, 3, width), np.float32)})
    analysis = analyse(load_model(path, dims={"S": 5}))
    assert analysis.unknown_sizes() == []
    assert [analysis.infos[name].shape for name in ("y", "z", "y_h", "y_c")] == [z.shape, z.shape, y_h.shape, y_c.shape]
    assert analysis.infos["y"].bytes == z.nbytes


def _gqa(tmp_path) -> str:
    text = """
    <ir_version: 10, opset_import: ["" : 17, "com.microsoft" : 1]>
    g (float[1, S, 32] q, float[1, S, 16] k, float[1, S, 16] v, float[1, 2, P, 8] past_k, float[1, 2, P, 8] past_v,
       int32[1] seqlens_k, int32 total, int64[1, T] attention_mask)
      => (float[1, S, 32] out, float[1, 2, T, 8] present_k, float[1, 2, T, 8] present_v) {
        out, present_k, present_v = com.microsoft.GroupQueryAttention<num_heads = 4, kv_num_heads = 2>(
            q, k, v, past_k, past_v, seqlens_k, total)
    }
    """
    path = tmp_path / "gqa.onnx"
    onnx.save(onnx.parser.parse_model(text), str(path))
    return str(path)


@pytest.mark.parametrize("past, seq, total", [(16, 4, 4), (0, 4, 4), (3, 4, 7)], ids=["shared", "empty", "growing"])
# The total length reaches the model as the attention mask's length, as in onnxruntime-genai's builder models.
def test_present_kv_is_as_long_as_onnxruntime_returns_it(tmp_path, past, seq, total):
    path = _gqa(tmp_path)
    analysis = analyse(load_model(path, dims={"S": seq, "P": past, "T": total}))
    rng = np.random.default_rng(0)
    feeds = {
        "q": rng.standard_normal((1, seq, 32)).astype(np.float32),
        "k": rng.standard_normal((1, seq, 16)).astype(np.float32),
        "v": rng.standard_normal((1, seq, 16)).astype(np.float32),
        "past_k": np.zeros((1, 2, past, 8), np.float32),
        "past_v": np.zeros((1, 2, past, 8), np.float32),
        "seqlens_k": np.array([total - 1], np.int32),
        "total": np.array(total, np.int32),
        "attention_mask": np.ones((1, total), np.int64),
    }
    got = ort.InferenceSession(path, providers=["CPUExecutionProvider"]).run(None, feeds)
    for name, value in zip(["out", "present_k", "present_v"], got):
        assert list(analysis.infos[name].shape) == list(value.shape), name
        analysis.infos.convert([name])  # the bulk path gives the same
        assert list(analysis.infos[name].shape) == list(value.shape), name


def test_external_weights_and_inline_weights_give_the_same_sizes(tmp_path):
    onnx.save(_reshape_model(), str(tmp_path / "inline.onnx"))
    external = _external(tmp_path, one_file=False)
    a, b = analyse(load_model(tmp_path / "inline.onnx")), analyse(load_model(external))
    names = [*a.producer, *a.weights]
    assert {n: a.infos[n].bytes for n in names} == {n: b.infos[n].bytes for n in names}


def test_a_present_whose_total_length_is_not_declared_stays_unknown(tmp_path):
    """onnxruntime's symbolic inference copies the past's shape to the present, which is wrong
    whenever the past is shorter than the total; without a declared total the size is unknown."""
    model = onnx.load(_gqa(tmp_path))
    for out in model.graph.output[1:]:
        out.type.tensor_type.shape.dim[2].Clear()
    onnx.save(model, str(tmp_path / "undeclared.onnx"))
    analysis = analyse(load_model(tmp_path / "undeclared.onnx", dims={"S": 4, "P": 0, "T": 4}))
    assert analysis.infos["present_k"].bytes is None
    assert "present_k" in analysis.unknown_sizes()


_NONZERO = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[B, 8] x) => (float[B, 8] y, int64[2, N] z) {
    r = Relu(x)
    z = NonZero(r)
    a = Neg(r)
    b = Neg(a)
    y = Add(b, r)
}
"""


def test_sizes_from_one_run_are_exact_where_inference_cannot_follow(run_cli, tmp_path):
    path = tmp_path / "nz.onnx"
    onnx.save(onnx.parser.parse_model(_NONZERO), str(path))
    inferred = run_cli("simulate", path, "--dim", "B=4", "--json").json()
    assert inferred["unknown_size"]["count"] == 1 and inferred["figures_low"]
    measured = run_cli("simulate", path, "--dim", "B=4", "--sizes-from-run", "--json").json()
    assert measured["unknown_size"]["count"] == 0 and not measured["figures_low"]
    # the generated inputs are seeded: z's size is what onnxruntime returns for them
    from offloadctl.running.inputs import generate_inputs, input_specs

    feeds, _ = generate_inputs(input_specs(load_model(path, dims={"B": 4}).proto))
    z = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(["z"], feeds)[0]
    assert measured["peak_bytes"]["before"] - inferred["peak_bytes"]["before"] == z.nbytes
    assert "figures low" not in run_cli("simulate", path, "--dim", "B=4", "--sizes-from-run").stdout


def test_a_plan_made_with_sizes_from_a_run_is_applied_with_them(run_cli, tmp_path):
    path = tmp_path / "nz.onnx"
    onnx.save(onnx.parser.parse_model(_NONZERO), str(path))
    x = np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32)
    np.savez(tmp_path / "in.npz", x=x)
    plan = tmp_path / "p.json"
    made = run_cli("plan", path, "-o", plan, "--inputs", tmp_path / "in.npz", "--select-distance", "1", "--json")
    assert made.exit_code in (0, 1), made.stderr
    assert made.json()["unknown_size_tensors"] == 0
    assert json.loads(plan.read_text())["model"]["sizes_from_run"] == {"inputs": str(tmp_path / "in.npz"), "seed": 0}
    out = tmp_path / "out.onnx"
    assert run_cli("apply", plan, "-o", out).exit_code == 0
    simulated = run_cli("simulate", path, "--plan", plan, "--json").json()  # repeats the run for the plan's sizes
    assert simulated["unknown_size"]["count"] == 0
    ran = run_cli("run", out, "--device", "cpu", "--inputs", tmp_path / "in.npz", "--compare-to", path)
    assert ran.exit_code == 0, ran.stderr


def test_sizes_from_run_needs_every_input_dimension_or_the_inputs(run_cli, tmp_path):
    path = tmp_path / "nz.onnx"
    onnx.save(onnx.parser.parse_model(_NONZERO), str(path))
    result = run_cli("simulate", path, "--sizes-from-run")
    assert result.exit_code == 1 and "Traceback" not in result.stderr
    assert "--sizes-from-run: cannot generate input 'x'" in result.stderr and "--inputs FILE.npz" in result.stderr


@pytest.mark.parametrize("looked_up_first", [False, True])
def test_unknown_sizes_are_those_every_lookup_finds_unknown(tmp_path, looked_up_first):
    """The bulk conversion behind `unknown_sizes` skips what it converted (each of a known size):
    the list is the one a lookup of every tensor gives, in the same order, whatever was looked up before."""
    path = tmp_path / "range.onnx"
    onnx.save(_range_model(), str(path))
    reference = analyse(load_model(path))  # B and N left dynamic
    names = list(dict.fromkeys([*reference.graph_inputs, *reference.producer, *sorted(reference.weights)]))
    expected = [n for n in names if (info := reference.infos.get(n)) is None or info.bytes is None]
    assert expected and len(expected) < len(names)  # the dynamic dimensions leave some sizes unknown
    analysis = analyse(load_model(path))
    if looked_up_first:
        for name in names[::2]:
            analysis.infos.get(name)
    assert analysis.unknown_sizes() == expected
