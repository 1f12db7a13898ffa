"""The two copy operators a rewritten model uses, made known to the onnx checker.

offloadctl encodes offloading with onnxruntime's own operators, domain "" (ai.onnx), version 1:

- ``MemcpyToHost``: device -> host (D2H); one input, one output of the same type.
- ``MemcpyFromHost``: host -> device (H2D); one input, one output of the same type.

onnxruntime has kernels for both (CUDA and CANN move the data; onnxruntime >= 1.23 also runs them
on the CPU execution provider). The onnx package does not define them, so ``onnx.checker`` rejects
a model that uses them until their schemas are registered: `register_schemas` does that, once per
process. The schemas have no shape inference; the rewrite writes ``value_info`` for every copy
output instead.
"""

from __future__ import annotations

import onnx
import onnx.defs

__all__ = ["MEMCPY_TO_HOST", "MEMCPY_FROM_HOST", "COPY_OPS", "register_schemas"]

MEMCPY_TO_HOST = "MemcpyToHost"
MEMCPY_FROM_HOST = "MemcpyFromHost"
COPY_OPS = (MEMCPY_TO_HOST, MEMCPY_FROM_HOST)

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
