"""Expanding the nodes onnxruntime replaces by their function bodies, so the plan sees what runs.

onnxruntime has no kernel for a few ONNX ops that the standard defines as functions
(``NegativeLogLikelihoodLoss``, ``SoftmaxCrossEntropyLoss``, ``GroupNormalization``, ``Mish``,
``HardSwish``, ``CenterCropPad``), nor for calls to a model's own local functions: it inlines their
bodies when it loads the model, and the inlined nodes get new, higher node indices. Under
``PRIORITY_BASED`` they then run only when no original node is ready, far from the call's place in
the file, so the execution order the plan counts in is not the order that runs (and the memory model
misses the body's tensors). Planning therefore works on the model with those nodes already expanded
in place, exactly as onnx's own inliner writes them; the rewritten model carries the expanded nodes
and runs in its file order. The results are bit-identical to onnxruntime's own inlining (same ops).

Expanded nodes are named ``{call node}/{op}_{k}`` so that profiling can match them.
"""

from __future__ import annotations

import onnx
import onnx.inliner

__all__ = ["ONNXRUNTIME_INLINED_OPS", "expand_inlined_functions", "inlined_calls"]

# ONNX-domain ops with a function body that onnxruntime (CPU, 1.24) runs by inlining that body.
ONNXRUNTIME_INLINED_OPS = frozenset(
    {"NegativeLogLikelihoodLoss", "SoftmaxCrossEntropyLoss", "GroupNormalization", "Mish", "HardSwish", "CenterCropPad"}
)


def _is_call(node: onnx.NodeProto, local: set[tuple[str, str]]) -> bool:
    domain = "" if node.domain == "ai.onnx" else node.domain
    return (domain, node.op_type) in local or (domain == "" and node.op_type in ONNXRUNTIME_INLINED_OPS)


def inlined_calls(proto: onnx.ModelProto) -> list[onnx.NodeProto]:
    """Main-graph nodes onnxruntime would replace by a function body (empty for most models)."""
    local = {(f.domain, f.name) for f in proto.functions}
    names = {name for _, name in local} | ONNXRUNTIME_INLINED_OPS
    # The op type alone rules out almost every node of a big graph.
    return [n for n in proto.graph.node if n.op_type in names and _is_call(n, local)]


def expand_inlined_functions(proto: onnx.ModelProto, calls: list[onnx.NodeProto] | None = None) -> int:
    """Expand, in place and in file order, every node onnxruntime would inline; return how many.

    Calls to local functions and the ops in `ONNXRUNTIME_INLINED_OPS` are replaced by their bodies
    (in the main graph and in subgraphs); local functions are then dropped. A model without such
    nodes is left untouched. Raises nothing: a body onnx cannot expand leaves the model as it was.
    ``calls`` is ``inlined_calls(proto)``, when the caller has it already.
    """
    calls = inlined_calls(proto) if calls is None else calls
    if not calls and not proto.functions:
        return 0
    ids = [(f.domain, f.name) for f in proto.functions]
    ids += sorted(
        {("", n.op_type) for n in calls if (n.domain or "") in ("", "ai.onnx") and n.op_type in ONNXRUNTIME_INLINED_OPS}
    )
    try:
        expanded = onnx.inliner.inline_selected_functions(
            _typed_copy(proto), ids, exclude=False, inline_schema_functions=True
        )
    except Exception:  # noqa: BLE001 - onnx raises bare RuntimeErrors on bodies it cannot expand
        return 0
    named = _name_expanded(
        list(proto.graph.node), list(expanded.graph.node), {(f.domain, f.name) for f in proto.functions}
    )
    if named is None:
        return 0
    del proto.graph.node[:]
    proto.graph.node.extend(named)
    del proto.functions[:]
    have = {o.domain for o in proto.opset_import}
    proto.opset_import.extend(o for o in expanded.opset_import if o.domain not in have)
    return len(calls)


def _typed_copy(proto: onnx.ModelProto) -> onnx.ModelProto:
    """A copy with every tensor's type known: onnx's inliner needs the input types of the bodies
    that depend on them (GroupNormalization, the losses), weights included."""
    work = onnx.ModelProto()
    work.CopyFrom(proto)
    try:
        work = onnx.shape_inference.infer_shapes(work)
    except Exception:  # noqa: BLE001 - types stay as declared; the inliner says if it needs more
        pass
    graph = work.graph
    known = {v.name for v in graph.value_info} | {v.name for v in graph.input} | {v.name for v in graph.output}
    graph.value_info.extend(
        onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
        for t in graph.initializer
        if t.name not in known
    )
    return work


def _name_expanded(
    old: list[onnx.NodeProto], new: list[onnx.NodeProto], local: set[tuple[str, str]]
) -> list[onnx.NodeProto] | None:
    """Give each expanded node a unique name after its call; None if old and new do not line up."""
    taken = {n.name for n in old if n.name}
    out: list[onnx.NodeProto] = []
    j = 0
    for i, node in enumerate(old):
        if not _is_call(node, local):
            if j >= len(new) or list(new[j].output) != list(node.output):
                return None
            kept = onnx.NodeProto()
            kept.CopyFrom(new[j])
            out.append(kept)
            j += 1
            continue
        wanted = {o for o in node.output if o}
        after = old[i + 1] if i + 1 < len(old) else None
        base = node.name or f"{node.op_type}_{i}"
        k = 0
        while j < len(new):
            if (
                not wanted
                and after is not None
                and (_is_call(after, local) or list(new[j].output) == list(after.output))
            ):
                break
            body = onnx.NodeProto()
            body.CopyFrom(new[j])
            name = f"{base}/{body.op_type}_{k}"
            while name in taken:
                k += 1
                name = f"{base}/{body.op_type}_{k}"
            taken.add(name)
            body.name = name
            out.append(body)
            wanted -= set(body.output)
            j += 1
            k += 1
    if j != len(new):
        return None
    return out
