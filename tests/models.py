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
    "to_fp16",
    "old_pin_model",
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


def to_fp16(model: onnx.ModelProto) -> onnx.ModelProto:
    """A float16 copy of a float32 model: its float inputs, outputs, weights, Constant values and
    typed value_info become float16, and Casts to float cast to float16 (what a half-precision export
    looks like to the planner and to a device provider)."""
    from onnx import numpy_helper

    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    # Resize's roi and scales stay float32 whatever the data's type
    keep = {n.input[i] for n in graph.node if n.op_type == "Resize" for i in (1, 2) if i < len(n.input)}

    def half(t: onnx.TensorProto) -> None:
        if t.data_type == TensorProto.FLOAT and t.name not in keep:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype("float16"), t.name))

    for t in graph.initializer:
        half(t)
    for v in [*graph.input, *graph.output, *graph.value_info]:
        if v.type.tensor_type.elem_type == TensorProto.FLOAT:
            v.type.tensor_type.elem_type = TensorProto.FLOAT16
    for node in graph.node:
        for a in node.attribute:
            if a.type == onnx.AttributeProto.TENSOR and not (set(node.output) & keep):
                half(a.t)
            if node.op_type == "Cast" and a.name == "to" and a.i == TensorProto.FLOAT:
                a.i = TensorProto.FLOAT16
    return out


def old_pin_model(elem_type: int) -> onnx.ModelProto:
    """Copies held by the pin form that reads the host tensor: the D2H by Shape(host, 0, 0) into a
    view of a device tensor, the H2D by reading a view of the host tensor, Reshape(host, ...)."""
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("MemcpyToHost", ["r"], ["h"], name="d2h"),
        helper.make_node("Shape", ["h"], ["e"], name="pin_dep", start=0, end=0),
        helper.make_node("Shape", ["r"], ["s"], name="pin_shape"),
        helper.make_node("Concat", ["s", "e"], ["c"], name="pin_concat", axis=0),
        helper.make_node("Reshape", ["r", "c"], ["v"], name="pin_view"),
        helper.make_node("Neg", ["v"], ["n"], name="neg"),
        helper.make_node("Shape", ["h"], ["hs"], name="pin2_shape"),
        helper.make_node("Shape", ["n"], ["ne"], name="pin2_dep", start=0, end=0),
        helper.make_node("Concat", ["hs", "ne"], ["hc"], name="pin2_concat", axis=0),
        helper.make_node("Reshape", ["h", "hc"], ["hv"], name="pin2_view"),
        helper.make_node("MemcpyFromHost", ["hv"], ["d"], name="h2d"),
        helper.make_node("Add", ["n", "d"], ["y"], name="add"),
    ]
    model = make_model(nodes, [tensor("x", elem_type=elem_type)], [tensor("y", elem_type=elem_type)], check=False)
    model.graph.value_info.extend([tensor(n, elem_type=elem_type) for n in ("h", "hv", "d")])
    return model


#: ConstantOfShape and Sum have no WebGPU kernel: onnxruntime runs them on the CPU, so ``w`` and ``t``
#: are copied to the device and ``a`` and ``c`` to the host (docs/devices.md)
HOST_NODES_MODEL = """<ir_version: 9, opset_import: ["" : 17]>
g (float[4,8] x) => (float[4,8] y) {
    shape = Constant<value = int64[2] {4, 8}>()
    w = ConstantOfShape<value = float[1] {0.5}>(shape)
    a = Relu(x)
    s = Sum(a, w)
    b = Mul(a, w)
    c = Neg(b)
    n1 = Neg(c)
    n2 = Abs(n1)
    n3 = Neg(n2)
    t = Sum(c, s)
    d = Abs(t)
    e = Add(d, n3)
    y = Add(e, b)
}"""


def early_host_node_model(layers: int = 16, hidden: int = 64) -> onnx.ModelProto:
    """A Hardmax first (WebGPU has no kernel for it: onnxruntime runs it on the CPU and inserts copies of
    its output and of ``x`` to the device), then ``layers`` MatMul + Relu layers, each with its own
    [hidden, hidden] weight ``w{i}``: a model whose weights a plan streams in one by one."""
    import numpy as np

    nodes = [
        helper.make_node("Hardmax", ["x"], ["h"], axis=-1, name="early_cpu"),
        helper.make_node("Add", ["x", "h"], ["a"], name="add"),
    ]
    weights, last = [], "a"
    for i in range(layers):
        w = np.random.default_rng(i).standard_normal((hidden, hidden)).astype(np.float32) * 0.05
        weights.append(onnx.numpy_helper.from_array(w, f"w{i}"))
        nodes += [
            helper.make_node("MatMul", [last, f"w{i}"], [f"m{i}"], name=f"mm{i}"),
            helper.make_node("Relu", [f"m{i}"], [f"r{i}"], name=f"relu{i}"),
        ]
        last = f"r{i}"
    io = [tensor("x", (8, hidden)), tensor(last, (8, hidden))]
    graph = helper.make_graph(nodes, "early_host", io[:1], io[1:], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def host_chain_model(read_on_device: bool = False) -> onnx.ModelProto:
    """Two Hardmax in a row (WebGPU runs both on the CPU, which has no float16 kernel for them), then
    an Add and MatMul + Relu layers; with ``read_on_device`` the first one's output ``h1`` is read on
    the device too (by ``add_h1``). In float16 (`to_fp16`) onnxruntime runs the pair in float32 and
    keeps no Cast between them, except the one back to float16 of ``h1`` when the device reads it."""
    import numpy as np

    nodes = [
        helper.make_node("Hardmax", ["x"], ["h1"], axis=-1, name="hm1"),
        helper.make_node("Hardmax", ["h1"], ["h2"], axis=-1, name="hm2"),
        helper.make_node("Add", ["x", "h2"], ["a"], name="add"),
    ]
    last = "a"
    if read_on_device:
        nodes.append(helper.make_node("Add", ["a", "h1"], ["a2"], name="add_h1"))
        last = "a2"
    weights = []
    for i in range(6):
        w = np.random.default_rng(i).standard_normal((64, 64)).astype(np.float32) * 0.05
        weights.append(onnx.numpy_helper.from_array(w, f"w{i}"))
        nodes += [
            helper.make_node("MatMul", [last, f"w{i}"], [f"m{i}"], name=f"mm{i}"),
            helper.make_node("Relu", [f"m{i}"], [f"r{i}"], name=f"relu{i}"),
        ]
        last = f"r{i}"
    graph = helper.make_graph(nodes, "host_chain", [tensor("x", (8, 64))], [tensor(last, (8, 64))], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def host_nodes_model() -> onnx.ModelProto:
    """`HOST_NODES_MODEL`, its nodes named ``n{index}_{op}``."""
    model = onnx.parser.parse_model(HOST_NODES_MODEL)
    for i, node in enumerate(model.graph.node):
        node.name = f"n{i}_{node.op_type}"
    return model


def idle_typed_model(elem_type: int, path: Path) -> Path:
    """``a = Cast(x, to=elem_type)``, idle across a chain of ten Relus, then read back as float: the one
    activation of that type a plan can offload."""
    chain = [helper.make_node("Relu", [f"y{k}"], [f"y{k + 1}"], name=f"relu{k}") for k in range(10)]
    nodes = [
        helper.make_node("Cast", ["x"], ["a"], name="to_type", to=elem_type),
        helper.make_node("Identity", ["x"], ["y0"], name="start"),
        *chain,
        helper.make_node("Cast", ["a"], ["b"], name="to_float", to=TensorProto.FLOAT),
        helper.make_node("Add", ["y10", "b"], ["out"], name="add"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, [4, 8])
    model = helper.make_model(
        helper.make_graph(nodes, "typed", [x], [out]), opset_imports=[helper.make_opsetid("", 23)]
    )
    model.ir_version = 11  # opset 23 (float4) needs IR 11
    onnx.save(model, str(path))
    return path
