"""Build the bundled sample models and their inputs (``make samples``).

Each model is written with an explicit IR version that the installed onnxruntime accepts, plus an
``.npz`` of inputs beside it. All are small (a few MB in all) and deterministic.

- seed.onnx: HyperOffload's worked example m1=x/2; m3=m1*2; m4=m3*2; m5=m3+m4; out=m5*2-m1.
- unet.onnx: a UNet-like CNN whose encoder outputs are reused by the decoder (long skips).
- transformer.onnx: a small stack of self-attention blocks with a residual stream.
- training.onnx: forward layers whose activations are reused by a hand-written backward part.
- mlp.onnx: a plain MLP chain: every tensor is used right away, nothing worth offloading.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

IR_VERSION = 10
OPSET = 17

__all__ = ["build_all", "seed_model", "unet_model", "transformer_model", "training_model", "mlp_model"]


def _model(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="offloadctl-samples")
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model, full_check=True)
    return model


def _init(name: str, array: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(array.astype(np.float32), name)


def seed_model() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """m1=x/2; m3=m1*2; m4=m3*2; m5=m3+m4; out=m5*2-m1."""
    two = _init("two", np.array(2.0))
    nodes = [
        helper.make_node("Div", ["x", "two"], ["m1"], name="div"),
        helper.make_node("Mul", ["m1", "two"], ["m3"], name="mul_m3"),
        helper.make_node("Mul", ["m3", "two"], ["m4"], name="mul_m4"),
        helper.make_node("Add", ["m3", "m4"], ["m5"], name="add_m5"),
        helper.make_node("Mul", ["m5", "two"], ["m6"], name="mul_m6"),
        helper.make_node("Sub", ["m6", "m1"], ["out"], name="sub_out"),
    ]
    graph = helper.make_graph(
        nodes,
        "seed",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [4, 8])],
        initializer=[two],
    )
    rng = np.random.default_rng(0)
    return _model(graph), {"x": rng.standard_normal((4, 8)).astype(np.float32)}


def unet_model(depth: int = 3, base: int = 8, size: int = 32) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """Encoder (conv-relu-conv-relu, maxpool) and decoder (upsample, concat skip, conv) blocks."""
    rng = np.random.default_rng(1)
    nodes, inits = [], []
    counter = iter(range(10_000))

    def conv(x: str, cin: int, cout: int) -> str:
        i = next(counter)
        w = _init(f"conv{i}.w", rng.standard_normal((cout, cin, 3, 3)) * (1.0 / np.sqrt(cin * 9)))
        b = _init(f"conv{i}.b", rng.standard_normal(cout) * 0.1)
        inits.extend([w, b])
        nodes.append(helper.make_node("Conv", [x, w.name, b.name], [f"conv{i}"], name=f"conv{i}", pads=[1, 1, 1, 1]))
        nodes.append(helper.make_node("Relu", [f"conv{i}"], [f"relu{i}"], name=f"relu{i}"))
        return f"relu{i}"

    x, ch, skips = "image", 3, []
    for level in range(depth):
        out = base * 2**level
        x = conv(conv(x, ch, out), out, out)
        skips.append((x, out))
        nodes.append(
            helper.make_node("MaxPool", [x], [f"pool{level}"], name=f"pool{level}", kernel_shape=[2, 2], strides=[2, 2])
        )
        x, ch = f"pool{level}", out
    x = conv(conv(x, ch, ch * 2), ch * 2, ch * 2)
    ch = ch * 2
    scales = _init("up_scales", np.array([1, 1, 2, 2]))
    inits.append(scales)
    for level in reversed(range(depth)):
        skip, skip_ch = skips[level]
        nodes.append(
            helper.make_node("Resize", [x, "", "up_scales"], [f"up{level}"], name=f"up{level}", mode="nearest")
        )
        nodes.append(helper.make_node("Concat", [f"up{level}", skip], [f"cat{level}"], name=f"cat{level}", axis=1))
        x = conv(conv(f"cat{level}", ch + skip_ch, skip_ch), skip_ch, skip_ch)
        ch = skip_ch
    w = _init("head.w", rng.standard_normal((2, ch, 1, 1)) * 0.1)
    inits.append(w)
    nodes.append(helper.make_node("Conv", [x, "head.w"], ["mask"], name="head"))
    graph = helper.make_graph(
        nodes,
        "unet",
        [helper.make_tensor_value_info("image", TensorProto.FLOAT, [1, 3, size, size])],
        [helper.make_tensor_value_info("mask", TensorProto.FLOAT, [1, 2, size, size])],
        initializer=inits,
    )
    return _model(graph), {"image": rng.standard_normal((1, 3, size, size)).astype(np.float32)}


def transformer_model(
    layers: int = 4, seq: int = 64, dim: int = 64, heads: int = 4
) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """Pre-norm self-attention blocks with MLPs; the first embedding is also reused at the end."""
    rng = np.random.default_rng(2)
    nodes, inits = [], []
    head_dim = dim // heads

    def weight(name: str, shape: tuple[int, ...]) -> str:
        inits.append(_init(name, rng.standard_normal(shape) * (1.0 / np.sqrt(shape[0]))))
        return name

    def node(op: str, inputs: list[str], out: str, **attrs) -> str:
        nodes.append(helper.make_node(op, inputs, [out], name=out, **attrs))
        return out

    inits.append(numpy_helper.from_array(np.array([seq, heads, head_dim], dtype=np.int64), "split_heads"))
    inits.append(numpy_helper.from_array(np.array([seq, dim], dtype=np.int64), "merge_heads"))
    inits.append(_init("scale", np.array(1.0 / np.sqrt(head_dim))))
    x = node("MatMul", ["tokens", weight("embed", (dim, dim))], "embedded")
    first = x
    for i in range(layers):
        p = f"l{i}."
        ln = node(
            "LayerNormalization", [x, weight(p + "ln1.g", (dim,)), weight(p + "ln1.b", (dim,))], p + "ln1", axis=-1
        )
        heads_out = []
        for proj in ("q", "k", "v"):
            t = node("MatMul", [ln, weight(p + proj, (dim, dim))], p + proj + "_proj")
            t = node("Reshape", [t, "split_heads"], p + proj + "_heads")
            heads_out.append(node("Transpose", [t], p + proj + "_t", perm=[1, 0, 2] if proj != "k" else [1, 2, 0]))
        q, k, v = heads_out
        s = node("MatMul", [q, k], p + "scores")
        s = node("Mul", [s, "scale"], p + "scaled")
        s = node("Softmax", [s], p + "probs", axis=-1)
        a = node("MatMul", [s, v], p + "attn")
        a = node("Transpose", [a], p + "attn_t", perm=[1, 0, 2])
        a = node("Reshape", [a, "merge_heads"], p + "attn_merged")
        a = node("MatMul", [a, weight(p + "o", (dim, dim))], p + "attn_out")
        x = node("Add", [x, a], p + "res1")
        ln = node(
            "LayerNormalization", [x, weight(p + "ln2.g", (dim,)), weight(p + "ln2.b", (dim,))], p + "ln2", axis=-1
        )
        h = node("MatMul", [ln, weight(p + "fc1", (dim, 4 * dim))], p + "fc1_out")
        h = node("Relu", [h], p + "gelu")
        h = node("MatMul", [h, weight(p + "fc2", (4 * dim, dim))], p + "fc2_out")
        x = node("Add", [x, h], p + "res2")
    node("Add", [x, first], "hidden")
    node("MatMul", ["hidden", "embed"], "logits")
    graph = helper.make_graph(
        nodes,
        "transformer",
        [helper.make_tensor_value_info("tokens", TensorProto.FLOAT, [seq, dim])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [seq, dim])],
        initializer=inits,
    )
    return _model(graph), {"tokens": rng.standard_normal((seq, dim)).astype(np.float32)}


def training_model(layers: int = 6, batch: int = 32, dim: int = 128) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """Forward h_{i+1} = relu(h_i W_i); backward computes every dW_i from the saved h_i (reused late)."""
    rng = np.random.default_rng(3)
    nodes, inits = [], []
    h = "x"
    saved = []
    for i in range(layers):
        inits.append(_init(f"W{i}", rng.standard_normal((dim, dim)) / np.sqrt(dim)))
        nodes.append(helper.make_node("MatMul", [h, f"W{i}"], [f"z{i}"], name=f"fwd_matmul{i}"))
        nodes.append(helper.make_node("Relu", [f"z{i}"], [f"h{i + 1}"], name=f"fwd_relu{i}"))
        saved.append((h, f"z{i}"))
        h = f"h{i + 1}"
    nodes.append(helper.make_node("Sub", [h, "target"], ["diff"], name="loss_diff"))
    nodes.append(helper.make_node("Mul", ["diff", "diff"], ["sq"], name="loss_sq"))
    nodes.append(helper.make_node("ReduceMean", ["sq"], ["loss"], name="loss", keepdims=0))
    grad = "diff"
    zero = _init("zero", np.array(0.0))
    inits.append(zero)
    grads = []
    for i in reversed(range(layers)):
        h_in, z = saved[i]
        bw = {"__backwardpass": 1}
        nodes.append(helper.make_node("Greater", [z, "zero"], [f"mask{i}"], name=f"bwd_mask{i}", **bw))
        nodes.append(
            helper.make_node("Cast", [f"mask{i}"], [f"maskf{i}"], name=f"bwd_cast{i}", to=TensorProto.FLOAT, **bw)
        )
        nodes.append(helper.make_node("Mul", [grad, f"maskf{i}"], [f"dz{i}"], name=f"bwd_dz{i}", **bw))
        nodes.append(helper.make_node("Transpose", [h_in], [f"h_t{i}"], name=f"bwd_ht{i}", perm=[1, 0], **bw))
        nodes.append(helper.make_node("MatMul", [f"h_t{i}", f"dz{i}"], [f"dW{i}"], name=f"bwd_dW{i}", **bw))
        grads.append(f"dW{i}")
        if i > 0:
            nodes.append(helper.make_node("Transpose", [f"W{i}"], [f"W_t{i}"], name=f"bwd_wt{i}", perm=[1, 0], **bw))
            nodes.append(helper.make_node("MatMul", [f"dz{i}", f"W_t{i}"], [f"dh{i}"], name=f"bwd_dh{i}", **bw))
            grad = f"dh{i}"
    graph = helper.make_graph(
        nodes,
        "training",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, dim]),
            helper.make_tensor_value_info("target", TensorProto.FLOAT, [batch, dim]),
        ],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])]
        + [helper.make_tensor_value_info(g, TensorProto.FLOAT, [dim, dim]) for g in grads],
        initializer=inits,
    )
    inputs = {
        "x": rng.standard_normal((batch, dim)).astype(np.float32),
        "target": rng.standard_normal((batch, dim)).astype(np.float32),
    }
    return _model(graph), inputs


def mlp_model(layers: int = 8, dim: int = 64, batch: int = 16) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """Gemm-Relu chain: each activation is read once, right after it is made."""
    rng = np.random.default_rng(4)
    nodes, inits = [], []
    h = "x"
    for i in range(layers):
        inits.append(_init(f"fc{i}.w", rng.standard_normal((dim, dim)) / np.sqrt(dim)))
        inits.append(_init(f"fc{i}.b", rng.standard_normal(dim) * 0.1))
        nodes.append(helper.make_node("Gemm", [h, f"fc{i}.w", f"fc{i}.b"], [f"fc{i}"], name=f"fc{i}"))
        nodes.append(helper.make_node("Relu", [f"fc{i}"], [f"act{i}"], name=f"act{i}"))
        h = f"act{i}"
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, dim])],
        [helper.make_tensor_value_info(h, TensorProto.FLOAT, [batch, dim])],
        initializer=inits,
    )
    return _model(graph), {"x": rng.standard_normal((batch, dim)).astype(np.float32)}


BUILDERS = {
    "seed": seed_model,
    "unet": unet_model,
    "transformer": transformer_model,
    "training": training_model,
    "mlp": mlp_model,
}


def build_all(out_dir: Path) -> list[Path]:
    """Write every sample model and its inputs into ``out_dir``; return the model paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, build in BUILDERS.items():
        model, inputs = build()
        path = out_dir / f"{name}.onnx"
        onnx.save(model, str(path))
        np.savez(out_dir / f"{name}.inputs.npz", **inputs)
        paths.append(path)
    return paths


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", nargs="?", default=str(Path(__file__).parent))
    args = parser.parse_args()
    for p in build_all(Path(args.out_dir)):
        print(p)
