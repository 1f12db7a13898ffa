"""The two copy operators a rewritten model uses, made known to the onnx checker.

offloadctl encodes offloading with onnxruntime's own operators, domain "" (ai.onnx), version 1:

- ``MemcpyToHost``: device -> host (D2H); one input, one output of the same type.
- ``MemcpyFromHost``: host -> device (H2D); one input, one output of the same type.

onnxruntime has kernels for both (CUDA and CANN move the data; onnxruntime >= 1.23 also runs them
on the CPU execution provider). The onnx package does not define them, so ``onnx.checker`` rejects
a model that uses them until their schemas are registered: `register_schemas` does that, once per
process. The schemas have no shape inference; the rewrite writes ``value_info`` for every copy
output instead.

Not every element type can be copied: onnxruntime registers the copy kernels for the fixed-size
types of IR version 4 (`COPY_TYPES`: CUDA's ``AllFixedSizeTensorTypes``, CANN's
``AllFixedSizeTensorAndSequenceTensorTypes``; the CPU provider also takes the float8 types). A model
that copies an int4, float4, float8, complex or string tensor does not load on every provider, so
such tensors are never offloaded.
"""

from __future__ import annotations

import onnx
import onnx.defs

__all__ = ["MEMCPY_TO_HOST", "MEMCPY_FROM_HOST", "COPY_OPS", "COPY_TYPES", "register_schemas"]

MEMCPY_TO_HOST = "MemcpyToHost"
MEMCPY_FROM_HOST = "MemcpyFromHost"
COPY_OPS = (MEMCPY_TO_HOST, MEMCPY_FROM_HOST)

#: Element types every supported provider's copy kernels take (see the module docstring).
COPY_TYPES = frozenset(
    {
        onnx.TensorProto.FLOAT,
        onnx.TensorProto.DOUBLE,
        onnx.TensorProto.FLOAT16,
        onnx.TensorProto.BFLOAT16,
        onnx.TensorProto.INT8,
        onnx.TensorProto.INT16,
        onnx.TensorProto.INT32,
        onnx.TensorProto.INT64,
        onnx.TensorProto.UINT8,
        onnx.TensorProto.UINT16,
        onnx.TensorProto.UINT32,
        onnx.TensorProto.UINT64,
        onnx.TensorProto.BOOL,
    }
)

_DOCS = {
    MEMCPY_TO_HOST: "onnxruntime internal copy of a tensor from device memory to host memory.",
    MEMCPY_FROM_HOST: "onnxruntime internal copy of a tensor from host memory to device memory.",
}


def _tensor_types() -> list[str]:
    """Every tensor type this onnx version knows (taken from Identity's latest type constraint)."""
    identity = onnx.defs.get_schema("Identity")
    return [t for t in identity.type_constraints[0].allowed_type_strs if t.startswith("tensor(")]


def register_schemas() -> None:
    """Register MemcpyToHost and MemcpyFromHost (domain "", since version 1) with onnx.

    Idempotent: an operator the running onnx already knows is left alone.
    """
    types = _tensor_types()
    for op in COPY_OPS:
        if onnx.defs.has(op, ""):
            continue
        schema = onnx.defs.OpSchema(
            op,
            "",
            1,
            _DOCS[op],
            inputs=[onnx.defs.OpSchema.FormalParameter("input", "T", "the tensor to copy")],
            outputs=[onnx.defs.OpSchema.FormalParameter("output", "T", "the copy")],
            type_constraints=[("T", types, "any tensor type")],
        )
        onnx.defs.register_schema(schema)
