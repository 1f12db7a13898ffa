"""Where onnxruntime reads a tensor in host memory, so that a copy of it from the host would only be
copied back (the select stage keeps such tensors): the inputs its kernels read on the host
(`HOST_INPUTS`), reads inside a subgraph at such an input (`reads_on_host`), integer tensors that only
feed shape computations (`shape_feeders`), and weights a kernel packs when the session is made
(`PREPACKED_WEIGHTS`, `prepacked_use`).
"""

from __future__ import annotations

import onnx
from onnx import TensorProto

from offloadctl.analysis.graph import Analysis, Use
from offloadctl.core.onnxutil import iter_graphs, subgraphs

__all__ = [
    "FORCE_ADVICE",
    "HOST_INPUTS",
    "HOST_REASONS",
    "INDEX_TYPES",
    "PREPACKED_WEIGHTS",
    "SHAPE_TYPES",
    "SMALL_INDEX_BYTES",
    "packing_nodes",
    "prepacked_use",
    "reads_on_host",
    "shape_feeders",
    "subgraph_host_reads",
]

# Inputs that onnxruntime's kernels read from host memory (shapes, axes, indices of shape ops).
# Tensors read there are small and already host-side on every execution provider: copying them to
# the device would only add a copy back. (op type -> input indices)
HOST_INPUTS: dict[str, frozenset[int]] = {
    op: frozenset(idx)
    for op, idx in {
        "Reshape": (1,),
        "Expand": (1,),
        "Tile": (1,),
        "Slice": (1, 2, 3, 4),
        "Resize": (1, 2, 3),
        "Upsample": (1,),
        "ConstantOfShape": (0,),
        "Range": (0, 1, 2),
        "TopK": (1,),
        "Pad": (1, 2, 3),
        "Unsqueeze": (1,),
        "Squeeze": (1,),
        "Split": (1,),
        "OneHot": (1,),
        "CumSum": (1,),
        "ReduceSum": (1,),
        "ReduceMean": (1,),
        "ReduceMax": (1,),
        "ReduceMin": (1,),
        "ReduceProd": (1,),
        "ReduceL1": (1,),
        "ReduceL2": (1,),
        "ReduceLogSum": (1,),
        "ReduceLogSumExp": (1,),
        "ReduceSumSquare": (1,),
        "NonMaxSuppression": (2, 3, 4),
        # min and max: CUDA and WebGPU read them in host memory (a copied-in bound made PP-OCR's
        # rewrite define the H2D's output twice on WebGPU)
        "Clip": (1, 2),
        "Trilu": (1,),
        # com.microsoft: seqlens_k and total_sequence_length (the genai builder's Casts of the mask's
        # sums and width). On WebGPU a copy of the first failed to run (a host-to-host MemcpyToHost),
        # of the second made onnxruntime define the H2D's output twice
        "GroupQueryAttention": (5, 6),
    }.items()
}


#: Kernels whose weights onnxruntime packs into their own layout when the session is made, and the
#: inputs it packs. A weight that arrives through MemcpyFromHost is not constant and is not packed:
#: the kernel takes another path. For MatMulNBits that path changed the logits of an int4 builder
#: model at ORT_ENABLE_ALL (by 0.0039 on the tiny sample, 0.246 on a 1B model) and ran a 128-token
#: prefill 3.3x slower on the 1B; the quantized kernels below pack their weights the same way.
#: (fp32 MatMul/Gemm/Conv weights are packed too, but their unpacked path gives the same results
#: within allclose at a similar speed: they are offloaded.)
PREPACKED_WEIGHTS: dict[tuple[str, str], frozenset[int]] = {
    ("com.microsoft", "MatMulNBits"): frozenset({1, 2, 3}),
    ("com.microsoft", "QAttention"): frozenset({1}),
    ("com.microsoft", "DynamicQuantizeMatMul"): frozenset({1}),
    ("com.microsoft", "MatMulIntegerToFloat"): frozenset({1}),
    ("com.microsoft", "DynamicQuantizeLSTM"): frozenset({1, 2}),
    ("", "QLinearMatMul"): frozenset({3}),
    ("", "QLinearConv"): frozenset({3}),
    ("", "MatMulInteger"): frozenset({1}),
}


def packing_nodes(analysis: Analysis) -> dict[int, frozenset[int]]:
    """Position -> the inputs its node packs (`PREPACKED_WEIGHTS`), for the nodes that pack any."""
    ops = {op for _, op in PREPACKED_WEIGHTS}
    found = {}
    for p, node in enumerate(analysis.nodes):
        if node.op_type in ops:
            domain = "" if node.domain in ("", "ai.onnx") else node.domain
            packed = PREPACKED_WEIGHTS.get((domain, node.op_type))
            if packed is not None:
                found[p] = packed
    return found


def prepacked_use(analysis: Analysis, uses: list[Use], packing: dict[int, frozenset[int]]) -> str | None:
    """Why a weight should stay resident: a kernel packs it (``packing``: `packing_nodes`); None otherwise."""
    for use in uses:
        packed = packing.get(use[0])
        if packed is not None and use.input_index in packed:
            node = analysis.nodes[use.position]
            return (
                f"input {use.input_index} of {node.op_type} {use.node!r}, which onnxruntime packs when the session is "
                "made; copied in, it is not packed and the kernel takes another path (other results, slower)"
                + FORCE_ADVICE
            )
    return None


def reads_on_host(
    analysis: Analysis, use: Use, name: str | None = None, cache: dict[int, frozenset[str]] | None = None
) -> bool:
    """True when ``use`` reads at an input onnxruntime keeps in host memory.

    A read inside a subgraph (``input_index`` None) counts when the body reads ``name`` at such an
    input (an If branch's Unsqueeze axes, a Loop body's Reshape shape).
    """
    node = analysis.nodes[use.position]
    if use.input_index is not None:
        return use.input_index in HOST_INPUTS.get(node.op_type, frozenset())
    if name is None or cache is None:
        return False
    reads = cache.get(use.position)
    if reads is None:
        reads = cache[use.position] = subgraph_host_reads(node)
    return name in reads


def subgraph_host_reads(node: onnx.NodeProto) -> frozenset[str]:
    """Names a node's subgraphs (at any depth) read at inputs onnxruntime keeps in host memory."""
    found: set[str] = set()
    for body in subgraphs(node):
        for graph in iter_graphs(body):
            for inner in graph.node:
                for k in HOST_INPUTS.get(inner.op_type, ()):
                    if k < len(inner.input) and inner.input[k]:
                        found.add(inner.input[k])
    return frozenset(found)


#: Reasons a tensor is where the device provider cannot use a copy of it: onnxruntime keeps it in host
#: memory, so a copy from the host is copied straight back (or, on WebGPU, the rewrite does not load)
HOST_REASONS = frozenset({"host-input", "host-resident"})

#: How a rejection's detail ends where --force would override it (left out of the warning for a forced one)
FORCE_ADVICE = "; --force it to offload it anyway"

# Element types of shape arithmetic (Shape's output, Gather/Concat/Unsqueeze of dimensions).
SHAPE_TYPES = frozenset({TensorProto.INT64, TensorProto.INT32})
#: Integer and bool tensors at most this large are not offloaded: index, mask and shape arithmetic
#: (token type ids, sequence lengths), kept on the host by providers without kernels for them.
SMALL_INDEX_BYTES = 4096
INDEX_TYPES = frozenset(
    {
        TensorProto.INT64,
        TensorProto.INT32,
        TensorProto.INT16,
        TensorProto.INT8,
        TensorProto.UINT64,
        TensorProto.UINT32,
        TensorProto.UINT16,
        TensorProto.UINT8,
        TensorProto.BOOL,
    }
)


def shape_feeders(analysis: Analysis, cache: dict[int, frozenset[str]]) -> dict[str, Use]:
    """Integer tensors that only feed shape computations, each with one host read it ends in.

    An integer tensor whose every read is by a node all of whose outputs end, directly or through
    more such nodes, at inputs onnxruntime keeps in host memory (a Concat of dimensions that becomes
    an Expand's shape, a Gather index on a Shape output). onnxruntime places these small shape
    computations on the host; copying their inputs to the device only adds copies back and hides
    the shape values from shape inference. Computed in reverse execution order, so a node's outputs
    are decided before its inputs.
    """
    outputs = set(analysis.graph_outputs)
    ends: dict[str, Use] = {}  # tensor -> a host read it (eventually) feeds

    def end_of(name: str) -> Use | None:
        if name in outputs:
            return None
        info = analysis.infos.get(name)
        if info is None or info.elem_type not in SHAPE_TYPES:
            return None
        uses = analysis.uses.get(name)
        if not uses:
            return None
        found: Use | None = None
        for use in uses:
            if reads_on_host(analysis, use, name, cache):
                found = found or use
                continue
            if use.input_index is None:
                return None
            node_outputs = [o for o in analysis.nodes[use.position].output if o]
            if not node_outputs or any(o not in ends for o in node_outputs):
                return None
            found = found or ends[node_outputs[0]]
        return found

    for position in range(analysis.num_positions - 1, -1, -1):
        for name in analysis.nodes[position].output:
            if name:
                end = end_of(name)
                if end is not None:
                    ends[name] = end
    for name in analysis.weights:
        end = end_of(name)
        if end is not None:
            ends[name] = end
    return ends
