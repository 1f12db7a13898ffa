"""Builders for the small ONNX models the reliability tests need (bad inputs, subgraphs, random DAGs).

Every builder pins IR version 10 and opset 17 (what the installed onnxruntime accepts) and returns a
``ModelProto``; ``save`` writes it without running the checker, so malformed models can be written on
purpose.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import onnx
from onnx import TensorProto, helper

__all__ = [
    "IR_VERSION",
    "OPSET",
    "COMPUTED_RESHAPE",
    "make_model",
    "save",
    "tensor",
    "chain_nodes",
    "long_reuse_model",
]

IR_VERSION = 10
OPSET = 17

# Shape -> Slice -> Concat -> Reshape (as exported by paddle2onnx): onnx's data propagation stops at the
# Slice, so only onnxruntime's symbolic shape inference (which needs sympy) sizes `r` (1 x 40 x 8 floats).
COMPUTED_RESHAPE = """
<ir_version: 8, opset_import: ["" : 12]>
g (float[1, 8, 1, 40] x) => (float[1, 40, 8] y) {
    s = Shape(x)
    starts = Constant<value = int64[1] {0}>()
    ends = Constant<value = int64[1] {1}>()
    axes = Constant<value = int64[1] {0}>()
    head = Slice(s, starts, ends, axes)
    tail = Constant<value = int64[2] {-1, 8}>()
    shape = Concat<axis = 0>(head, tail)
    r = Reshape(x, shape)
    y = Neg(r)
}
"""


def tensor(name: str, shape: Sequence[int | str | None] = (4, 8), elem_type: int = TensorProto.FLOAT):
    """A ValueInfoProto for a tensor (a str dimension is a dynamic one)."""
    return helper.make_tensor_value_info(name, elem_type, list(shape))


def make_model(
    nodes: Sequence[onnx.NodeProto],
    inputs: Sequence[onnx.ValueInfoProto],
    outputs: Sequence[onnx.ValueInfoProto],
    *,
    initializers: Sequence[onnx.TensorProto] = (),
    check: bool = True,
) -> onnx.ModelProto:
    """A model with one graph; ``check`` runs onnx's full checker (switch it off for broken models)."""
    graph = helper.make_graph(list(nodes), "g", list(inputs), list(outputs), initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    if check:
        onnx.checker.check_model(model, full_check=True)
    return model


def save(model: onnx.ModelProto, path: Path) -> Path:
    """Write a model as-is and return its path."""
    onnx.save(model, str(path))
    return path


def chain_nodes() -> list[onnx.NodeProto]:
    """a = Relu(x); b = Neg(a); c = Neg(b); d = Neg(c); y = Add(d, a): `a` idles for 3 positions."""
    return [
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node("Neg", ["a"], ["b"], name="neg_b"),
        helper.make_node("Neg", ["b"], ["c"], name="neg_c"),
        helper.make_node("Neg", ["c"], ["d"], name="neg_d"),
        helper.make_node("Add", ["d", "a"], ["y"], name="add_y"),
    ]


def long_reuse_model(*, dynamic: bool = False) -> onnx.ModelProto:
    """The `chain_nodes` model; ``dynamic`` makes the first dimension of x a symbol N."""
    shape: tuple[int | str, int] = ("N", 8) if dynamic else (4, 8)
    return make_model(chain_nodes(), [tensor("x", shape)], [tensor("y", shape)])
