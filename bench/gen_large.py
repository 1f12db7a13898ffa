"""Generate large transformer-like ONNX models with their weights in one external data file.

The model is a stack of pre-norm transformer layers over a residual stream ``[batch, seq, hidden]``.
Every layer reads a shared ``memory`` tensor (the embedding output), so that tensor has one use per
layer and stretches the per-use work of planning. Each layer has ``nodes_per_layer`` nodes: the
17-node base block (LayerNormalization, Q/K/V/O projections, attention, residual adds, MLP) plus
``nodes_per_layer - 17`` extra ``Mul`` nodes in the MLP (each by the layer's scalar ``pad``
weight). The model has ``2 + layers * nodes_per_layer`` nodes: an embedding ``MatMul`` before the
stack and a final ``LayerNormalization`` after it.

Weights never sit in memory all at once: the bytes of each weight are written straight to the data
file (zeros by default, a cheap repeating pattern with ``fill="pattern"``) and the initializers
are ``TensorProto``s with ``data_location=EXTERNAL`` and ``location``/``offset``/``length``
entries. Models use IR version 10 and opset 17, pass ``onnx.checker.check_model(path)`` and load
with ``onnx.load``.

Usage as a script::

    python bench/gen_large.py OUT.onnx --layers 100 --hidden 64 [--nodes-per-layer 17] [--fill pattern]
    python bench/gen_large.py OUT.onnx --nodes 100000      # picks the number of layers
"""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import dataclass
from pathlib import Path

import onnx
from onnx import TensorProto, helper

__all__ = [
    "IR_VERSION",
    "OPSET",
    "BASE_NODES_PER_LAYER",
    "LargeModelConfig",
    "GeneratedModel",
    "generate",
    "layers_for_nodes",
]

IR_VERSION = 10
OPSET = 17
BASE_NODES_PER_LAYER = 17
_CHUNK = 1 << 22  # bytes written per call when streaming a weight


@dataclass(frozen=True)
class LargeModelConfig:
    """Shape of a generated model.

    Attributes:
        layers: number of transformer layers.
        hidden: hidden size H (weights are H x H and H x 4H, so weight bytes grow as 12 * H^2 per layer).
        nodes_per_layer: nodes in each layer, at least ``BASE_NODES_PER_LAYER``.
        seq: sequence length of the (static) input ``[batch, seq, hidden]``.
        batch: batch size.
        fill: ``"zeros"`` or ``"pattern"`` (a repeating byte pattern) for the weight bytes.
    """

    layers: int
    hidden: int = 64
    nodes_per_layer: int = BASE_NODES_PER_LAYER
    seq: int = 16
    batch: int = 1
    fill: str = "zeros"

    def __post_init__(self) -> None:
        if self.layers < 1:
            raise ValueError("layers must be >= 1")
        if self.hidden < 1 or self.seq < 1 or self.batch < 1:
            raise ValueError("hidden, seq and batch must be >= 1")
        if self.nodes_per_layer < BASE_NODES_PER_LAYER:
            raise ValueError(f"nodes_per_layer must be >= {BASE_NODES_PER_LAYER}")
        if self.fill not in ("zeros", "pattern"):
            raise ValueError("fill must be 'zeros' or 'pattern'")

    @property
    def num_nodes(self) -> int:
        return 2 + self.layers * self.nodes_per_layer

    @property
    def weight_bytes(self) -> int:
        """Bytes in the data file (float32 weights, no padding)."""
        h = self.hidden
        pad = 1 if self.nodes_per_layer > BASE_NODES_PER_LAYER else 0
        per_layer = 4 * (4 * h + 12 * h * h + pad)
        return 4 * (h * h + 1 + 2 * h) + self.layers * per_layer


@dataclass(frozen=True)
class GeneratedModel:
    """Where a generated model and its data file are, and what they hold."""

    path: Path
    data_path: Path
    config: LargeModelConfig
    num_nodes: int
    num_initializers: int
    weight_bytes: int


def layers_for_nodes(nodes: int, nodes_per_layer: int = BASE_NODES_PER_LAYER) -> int:
    """The number of layers giving at least ``nodes`` nodes (at least one layer)."""
    return max(1, math.ceil((nodes - 2) / nodes_per_layer))


class _DataWriter:
    """Appends weight bytes to the data file and builds the matching external-data TensorProto."""

    def __init__(self, path: Path, fill: str) -> None:
        self.path = path
        self.file = open(path, "wb")  # noqa: SIM115 - closed by close()
        self.offset = 0
        self.fill = fill
        self._zeros = bytes(_CHUNK)
        self._pattern = bytes(range(256)) * (_CHUNK // 256)

    def tensor(self, name: str, dims: list[int]) -> TensorProto:
        length = 4 * math.prod(dims)
        chunk = self._zeros if self.fill == "zeros" else self._pattern
        left = length
        while left > 0:
            n = min(left, _CHUNK)
            self.file.write(chunk[:n] if n < _CHUNK else chunk)
            left -= n
        t = TensorProto()
        t.name = name
        t.data_type = TensorProto.FLOAT
        t.dims.extend(dims)
        t.data_location = TensorProto.EXTERNAL
        for key, value in (("location", self.path.name), ("offset", str(self.offset)), ("length", str(length))):
            entry = t.external_data.add()
            entry.key = key
            entry.value = value
        self.offset += length
        return t

    def close(self) -> None:
        self.file.close()


def generate(path: str | os.PathLike[str], config: LargeModelConfig) -> GeneratedModel:
    """Write the model to ``path`` and its weights to ``path`` + ``.data`` beside it.

    Memory use is bounded by the graph proto (no weight bytes are held). Overwrites both files.
    """
    out = Path(path)
    data_path = out.with_name(out.name + ".data")
    h, s, b = config.hidden, config.seq, config.batch
    writer = _DataWriter(data_path, config.fill)
    nodes: list[onnx.NodeProto] = []
    inits: list[TensorProto] = []

    def weight(name: str, dims: list[int]) -> str:
        inits.append(writer.tensor(name, dims))
        return name

    def node(op: str, inputs: list[str], output: str, **attrs) -> str:
        nodes.append(helper.make_node(op, inputs, [output], name=output, **attrs))
        return output

    try:
        emb_w = weight("embed/w", [h, h])
        x = node("MatMul", ["tokens", emb_w], "embed/out")
        memory = x
        scale = weight("attn_scale", [])  # shared by every layer
        for i in range(config.layers):
            p = f"layer{i}/"
            ln1 = node(
                "LayerNormalization", [x, weight(p + "ln1/g", [h]), weight(p + "ln1/b", [h])], p + "ln1", axis=-1
            )
            q = node("MatMul", [ln1, weight(p + "wq", [h, h])], p + "q")
            k = node("MatMul", [ln1, weight(p + "wk", [h, h])], p + "k")
            v = node("MatMul", [ln1, weight(p + "wv", [h, h])], p + "v")
            kt = node("Transpose", [k], p + "kt", perm=[0, 2, 1])
            scores = node("MatMul", [q, kt], p + "scores")
            scaled = node("Mul", [scores, scale], p + "scaled")
            probs = node("Softmax", [scaled], p + "probs", axis=-1)
            ctx = node("MatMul", [probs, v], p + "ctx")
            attn = node("MatMul", [ctx, weight(p + "wo", [h, h])], p + "attn")
            r1 = node("Add", [x, attn], p + "res1")
            r1m = node("Add", [r1, memory], p + "res1m")
            ln2 = node(
                "LayerNormalization", [r1m, weight(p + "ln2/g", [h]), weight(p + "ln2/b", [h])], p + "ln2", axis=-1
            )
            up = node("MatMul", [ln2, weight(p + "w1", [h, 4 * h])], p + "up")
            act = node("Relu", [up], p + "act")
            pad = weight(p + "pad", []) if config.nodes_per_layer > BASE_NODES_PER_LAYER else ""
            for j in range(config.nodes_per_layer - BASE_NODES_PER_LAYER):
                act = node("Mul", [act, pad], f"{p}pad{j}")
            down = node("MatMul", [act, weight(p + "w2", [4 * h, h])], p + "down")
            x = node("Add", [r1m, down], p + "res2")
        final = node("LayerNormalization", [x, weight("final/g", [h]), weight("final/b", [h])], "final/out", axis=-1)
    finally:
        writer.close()
    graph = helper.make_graph(
        nodes,
        "large_transformer",
        [helper.make_tensor_value_info("tokens", TensorProto.FLOAT, [b, s, h])],
        [helper.make_tensor_value_info(final, TensorProto.FLOAT, [b, s, h])],
        initializer=inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="offloadctl-bench")
    model.ir_version = IR_VERSION
    out.write_bytes(model.SerializeToString())
    return GeneratedModel(
        path=out,
        data_path=data_path,
        config=config,
        num_nodes=len(nodes),
        num_initializers=len(inits),
        weight_bytes=writer.offset,
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("output", type=Path, help="the .onnx file to write (weights go to OUTPUT.data)")
    size = parser.add_mutually_exclusive_group(required=True)
    size.add_argument("--layers", type=int, help="number of transformer layers")
    size.add_argument("--nodes", type=int, help="total nodes wanted (the number of layers is derived)")
    parser.add_argument("--hidden", type=int, default=64, help="hidden size (default 64)")
    parser.add_argument("--nodes-per-layer", type=int, default=BASE_NODES_PER_LAYER)
    parser.add_argument("--seq", type=int, default=16)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--fill", choices=("zeros", "pattern"), default="zeros")
    parser.add_argument("--check", action="store_true", help="run onnx.checker.check_model on the written file")
    args = parser.parse_args(argv)
    layers = args.layers if args.layers is not None else layers_for_nodes(args.nodes, args.nodes_per_layer)
    config = LargeModelConfig(
        layers=layers,
        hidden=args.hidden,
        nodes_per_layer=args.nodes_per_layer,
        seq=args.seq,
        batch=args.batch,
        fill=args.fill,
    )
    gen = generate(args.output, config)
    if args.check:
        onnx.checker.check_model(str(gen.path))
    print(
        f"wrote {gen.path} ({gen.num_nodes} nodes, {config.layers} layers, {gen.num_initializers} weights) "
        f"and {gen.data_path} ({gen.weight_bytes} bytes)"
    )


if __name__ == "__main__":
    main()
