"""Models of large embedded weights held once in memory: the file read weight by weight
(`offloadctl.loading.model`), shape inference given the weights' shapes only
(`offloadctl.core.onnxutil.shape_only_copy`), and a rewrite that refers to its source's weights until the
writer streams them out (`offloadctl.rewriting.writing.write_model` with ``weights_from``). The figures:
``python bench/bench_rss.py``."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from offloadctl.loading import model as model_module

from conftest import SAMPLES

MODELS = [SAMPLES / "unet.onnx", SAMPLES / "training.onnx", SAMPLES / "bert" / "model.onnx"]


@pytest.mark.parametrize("path", MODELS, ids=lambda p: p.parent.name if p.name == "model.onnx" else p.stem)
def test_the_file_read_weight_by_weight_is_the_model_onnx_reads(monkeypatch, path):
    monkeypatch.setattr(model_module, "STREAMED_FROM_BYTES", 0)
    streamed = model_module._read_binary(path)
    assert streamed is not None and streamed == onnx.load(str(path))


def test_a_file_that_is_not_protobuf_is_left_to_onnx_to_refuse(monkeypatch, tmp_path, run_cli):
    monkeypatch.setattr(model_module, "STREAMED_FROM_BYTES", 0)
    cut = tmp_path / "cut.onnx"
    cut.write_bytes((SAMPLES / "unet.onnx").read_bytes()[:5000])  # truncated inside a weight
    assert model_module._read_binary(cut) is None
    refused = run_cli("inspect", cut)
    assert refused.exit_code == 1 and "is not a valid ONNX model" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_a_rewrite_that_shares_its_sources_weights_is_written_whole(monkeypatch, tmp_path, run_cli):
    """Every weight counted as large: the rewrite holds their shapes only, the file written holds their data,
    runs bit-identical to the original, and the library's apply gives back the whole model."""
    import offloadctl

    monkeypatch.setattr("offloadctl.core.onnxutil.SHARED_WEIGHT_BYTES", 0)
    plan, out = tmp_path / "plan.json", tmp_path / "unet.offload.onnx"
    assert run_cli("plan", SAMPLES / "unet.onnx", "-o", plan, "--params", "--select-distance", "10").exit_code == 0
    assert run_cli("apply", plan, "-o", out).exit_code == 0
    ran = run_cli("run", out, "--device", "cpu", "--compare-to", SAMPLES / "unet.onnx", "--inputs",
                  SAMPLES / "unet.inputs.npz")  # fmt: skip
    assert ran.exit_code == 0 and "outputs bit-identical" in ran.stdout, ran.stderr
    analysis = offloadctl.analyse(SAMPLES / "unet.onnx")
    whole = offloadctl.apply(offloadctl.make_plan(analysis, params=True, select_distance=10), analysis,
                             tmp_path / "api.onnx")  # fmt: skip
    written = onnx.load(str(tmp_path / "api.onnx"))
    assert whole == written
    source = {t.name: t for t in onnx.load(str(SAMPLES / "unet.onnx")).graph.initializer}
    assert all(t == source[t.name] for t in written.graph.initializer if t.name in source)
    feeds = dict(np.load(SAMPLES / "unet.inputs.npz"))
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(whole.SerializeToString(), so, providers=["CPUExecutionProvider"])
    want = ort.InferenceSession(str(SAMPLES / "unet.onnx"), so, providers=["CPUExecutionProvider"])
    assert all(np.array_equal(a, b) for a, b in zip(session.run(None, feeds), want.run(None, feeds)))


def test_shape_inference_sees_the_shapes_of_weights_it_gets_without_their_data():
    from offloadctl.core.onnxutil import shape_only_copy

    source = onnx.load(str(SAMPLES / "bert" / "model.onnx"))
    shaped = shape_only_copy(source, lambda t: True)
    assert [(t.name, list(t.dims), t.data_type) for t in shaped.graph.initializer] == [
        (t.name, list(t.dims), t.data_type) for t in source.graph.initializer
    ]
    assert not any(t.raw_data for t in shaped.graph.initializer) and shaped.graph.node == source.graph.node
    full = onnx.shape_inference.infer_shapes(source).graph.value_info
    empty = onnx.shape_inference.infer_shapes(shape_only_copy(source, lambda t: t.data_type == 1)).graph.value_info
    assert {v.name: v.type for v in full} == {v.name: v.type for v in empty}


def test_a_small_file_is_left_to_onnx_load():
    assert model_module._read_binary(SAMPLES / "mlp.onnx") is None  # small: onnx.load reads it
