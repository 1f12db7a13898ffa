"""Shape inference as the analysis runs it (`offloadctl.loading.inference`): what a rewrite declares and
onnx cannot compute itself is kept."""

from __future__ import annotations

import onnx
from onnx import helper

from offloadctl.core.onnxutil import PIN_ATTR
from offloadctl.loading.inference import inference_proto, inferred_types

from models import make_model, tensor


def test_an_order_pins_view_keeps_the_type_the_rewrite_declares():
    """A pin's view reshapes by a Concat of computed shapes, which shape inference cannot always follow
    (PP-OCR's opset-11 classifier lost every size after its first pin, onnxruntime's symbolic inference
    failing on it too): here a D2H pin's ``Shape(OptionalHasElement(Optional(host)))``. The type the
    rewrite declares for the view, its source's, is what inference sees, so every tensor computed from
    it keeps its size."""

    def pin(op, inputs, out, view=0, **attrs):
        node = helper.make_node(op, inputs, [out], name=f"offload/pin/{out}", **attrs)
        node.attribute.append(helper.make_attribute(PIN_ATTR, view))
        return node

    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        pin("Optional", ["a"], "wrapped"),
        pin("OptionalHasElement", ["wrapped"], "present"),
        pin("Shape", ["present"], "empty"),
        pin("Shape", ["a"], "a_shape"),
        pin("Concat", ["a_shape", "empty"], "joined", axis=0),
        pin("Reshape", ["a", "joined"], "v", view=1),
        helper.make_node("Neg", ["v"], ["n"], name="neg"),
        helper.make_node("Relu", ["n"], ["y"], name="out"),
    ]
    model = make_model(nodes, [tensor("x")], [tensor("y", (None, None))], check=False)
    model.graph.value_info.append(tensor("v"))
    seen = inference_proto(model)
    assert [vi.name for vi in seen.graph.value_info] == ["v"]
    types = inferred_types(seen)
    (n,) = {bytes(t) for t in types["n"]}
    parsed = onnx.TypeProto.FromString(n)
    assert [d.dim_value for d in parsed.tensor_type.shape.dim] == [4, 8]
