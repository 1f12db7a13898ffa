"""The type, shape and byte size of every tensor of a loaded model.

Shapes come from onnx's own shape inference with data propagation, after the pins
(`offloadctl.loading.input_shapes`); they are looked up lazily (`TensorInfos`), so a command that needs a
few tensors pays for a few. Where onnx's inference leaves a size unknown, onnxruntime's symbolic
shape inference (`offloadctl.loading.symbolic`) runs once; sizes one run measured
(`offloadctl.loading.measured`) win over both. A tensor whose byte size stays unknown keeps
``bytes=None``; stages exclude it with a reason, never count it as zero.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from functools import cache
from typing import NamedTuple

import onnx
from onnx import TensorProto

from offloadctl.core.ahead import Ahead
from offloadctl.core.bulk import paused_gc
from offloadctl.core.errors import OffloadError
from offloadctl.core.memcpy import COPY_TYPES
from offloadctl.core.onnxutil import is_constant_node
from offloadctl.core.units import fmt_bytes
from offloadctl.loading.inference import inference_proto, inferred_types, types_by_name
from offloadctl.loading.measured import MeasuredSizes
from offloadctl.loading.model import LoadedModel
from offloadctl.loading.symbolic import NodeFailure, symbolic_value_infos

__all__ = [
    "MAX_TENSOR_BYTES",
    "TensorInfo",
    "TensorInfos",
    "tensor_info",
    "tensor_infos",
]

logger = logging.getLogger(__name__)


_SUB_BYTE_TYPES = {
    getattr(TensorProto, name)
    for name in ("INT4", "UINT4", "FLOAT4E2M1", "INT2", "UINT2")
    if hasattr(TensorProto, name)
}
_SUB_BYTE_BITS = {getattr(TensorProto, n): 2 for n in ("INT2", "UINT2") if hasattr(TensorProto, n)}
_DEFINED_TYPES = frozenset(TensorProto.DataType.values()) - {TensorProto.UNDEFINED}

#: Above this a tensor's size is a mistake in its declared shape: no device holds it, and sums of
#: such sizes would overflow the 64-bit integers the memory figures use.
MAX_TENSOR_BYTES = 1 << 50


@cache
def _itemsize(elem_type: int) -> int | None:
    """Bytes per element, or None for types without a fixed size (strings) or unknown to numpy."""
    if elem_type == TensorProto.STRING:
        return None
    try:
        return onnx.helper.tensor_dtype_to_np_dtype(elem_type).itemsize
    except (KeyError, TypeError, ValueError):
        return None


@cache
def _type_name(elem_type: int) -> str:
    """``float``, ``int64``, ... for a defined element type (asked once per tensor of a plan)."""
    return TensorProto.DataType.Name(elem_type).lower()


class TensorInfo(NamedTuple):
    """What planning knows about one tensor of the main graph (build it with `tensor_info`)."""

    name: str
    elem_type: int | None  # TensorProto data type; None for sequences, maps, optionals, unknown
    shape: tuple[int | str | None, ...] | None  # None when the rank is unknown
    copyable: bool  # a dense tensor whose type MemcpyToHost/MemcpyFromHost can move (memcpy.COPY_TYPES)
    type_kind: str | None = None  # "sequence", "map", "optional", "sparse_tensor", or "undefined" (no onnx type)
    bytes: int | None = None  # byte size, or None when a dimension or the element type is unknown

    @property
    def dtype(self) -> str:
        if self.type_kind == "undefined":
            return f"undefined element type {self.elem_type}"
        if self.elem_type is None:
            return self.type_kind or "unknown"
        return _type_name(self.elem_type)

    @property
    def sized(self) -> bool:
        """A dense tensor whose element type has a fixed size (its bytes are known once its shape is)."""
        return self.type_kind is None and (self.elem_type is None or _itemsize(self.elem_type) is not None)

    def int_shape(self) -> list[int]:
        """The shape as numbers, for a tensor whose size is known (so is every dimension)."""
        return [int(d) for d in self.shape or () if d is not None]

    def why_unknown(self) -> str:
        """Human-readable reason why `bytes` is None (or, for a tensor that cannot be copied, why not)."""
        if self.type_kind is not None or (self.elem_type is not None and _itemsize(self.elem_type) is None):
            return f"type {self.dtype} cannot be copied by MemcpyToHost/MemcpyFromHost"
        if self.shape is None or self.elem_type is None:
            return "shape inference could not find its shape"
        if not self.copyable:
            return f"type {self.dtype} cannot be copied by MemcpyToHost/MemcpyFromHost"
        unknown = [str(d) if d is not None else "?" for d in self.shape if not isinstance(d, int)]
        return f"dimension(s) {', '.join(unknown)} unknown"


def tensor_info(
    name: str,
    elem_type: int | None,
    shape: tuple[int | str | None, ...] | None,
    type_kind: str | None = None,
) -> TensorInfo:
    """A `TensorInfo` with its byte size computed (None when a dimension or the type is unknown).

    ``type_kind`` names a value that is not a dense tensor (see `TensorInfo`); an element type onnx
    does not define gets ``type_kind="undefined"``.
    """
    if type_kind is None and elem_type and elem_type not in _DEFINED_TYPES:
        type_kind = "undefined"
    size = None
    itemsize = _itemsize(elem_type) if elem_type and type_kind is None else None
    if itemsize is not None and shape is not None:
        count = 1
        for d in shape:
            if type(d) is not int or d < 0:
                count = -1
                break
            count *= d
        if count >= 0:
            if elem_type in _SUB_BYTE_TYPES:
                size = (count * _SUB_BYTE_BITS.get(elem_type, 4) + 7) // 8
            else:
                size = count * itemsize
    copyable = type_kind is None and (elem_type is None or elem_type in COPY_TYPES)
    return TensorInfo(name, elem_type, shape, copyable, type_kind, size)


def _dim(d: onnx.TensorShapeProto.Dimension) -> int | str | None:
    """A known size (>= 0), a symbolic name, or None."""
    if d.WhichOneof("value") == "dim_value":
        value = d.dim_value
        return value if value >= 0 else None
    return d.dim_param or None


def _type_to_info(name: str, serialized: bytes, cache: dict[bytes, tuple]) -> TensorInfo:
    """Convert a serialized TypeProto. ``cache`` maps serialized types to converted fields: models
    repeat a few types over thousands of tensors, so most lookups parse nothing."""
    fields = cache.get(serialized)
    if fields is None:
        fields = cache[serialized] = _type_fields(onnx.TypeProto.FromString(serialized))
    return TensorInfo(name, *fields)


def _type_fields(type_proto: onnx.TypeProto) -> tuple:
    which = type_proto.WhichOneof("value")
    if which == "tensor_type":
        tt = type_proto.tensor_type
        elem = tt.elem_type or None
        shape: tuple[int | str | None, ...] | None = None
        if tt.HasField("shape"):
            shape = tuple(map(_dim, tt.shape.dim))
        info = tensor_info("", elem, shape)
    elif which is None:
        info = tensor_info("", None, None)
    else:
        info = tensor_info("", None, None, which.removesuffix("_type"))
    return info[1:]


class TensorInfos(Mapping[str, TensorInfo]):
    """Type and shape of every main-graph tensor: inputs, weights, node outputs (after inference).

    Built lazily, because a big model has a few hundred thousand tensors and most commands need
    a handful: weights come from their initializers or Constant nodes; the other tensors from onnx's
    shape inference (with data propagation), run on the first lookup of a non-weight, and converted
    one by one as they are looked up. When onnx's inference leaves a looked-up tensor's size unknown,
    onnxruntime's symbolic shape inference runs once and fills what it can. What a tensor maps to
    does not depend on the order of lookups. Iterating lists every tensor (and runs the inference).
    """

    def __init__(
        self,
        loaded: LoadedModel,
        node_order: Sequence[int] | None = None,
        constants: Mapping[str, int] | None = None,
        producers: Mapping[str, int | str] | None = None,
        ahead: Ahead[dict[str, list[bytes]]] | None = None,
    ) -> None:
        self._loaded = loaded
        self._node_order = node_order
        self._producers = producers
        if ahead is not None and node_order is not None:  # it inferred the file's order, not this one
            ahead.cancel()
            ahead = None
        self._ahead = ahead  # onnx's inference of this model, running in a child process (`start_inference`)
        self._weights: dict[str, TensorProto | onnx.SparseTensorProto | onnx.NodeProto] = {}
        graph = loaded.proto.graph
        if constants is None:
            constants = {
                node.output[0]: i for i, node in enumerate(graph.node) if is_constant_node(node) and node.output
            }
        for name, index in constants.items():
            self._weights[name] = graph.node[index]
        for init in graph.initializer:
            self._weights.setdefault(init.name, init)
        for sparse in graph.sparse_initializer:
            # onnxruntime makes a dense initializer of it: its dense size is what the device holds
            self._weights.setdefault(sparse.values.name, sparse)
        self._done: dict[str, TensorInfo] = {}
        self._type_cache: dict[bytes, tuple] = {}  # serialized TypeProto -> TensorInfo fields after the name
        self._weight_cache: dict[tuple[int, tuple[int, ...]], tuple] = {}  # (data type, dims) -> the same
        # Serialized TypeProtos by tensor name, after onnx's inference and (if run) onnxruntime's:
        # bytes, so that the inferred model is not kept alive.
        self._types: dict[str, list[bytes]] | None = None
        self._declared: dict[str, list[bytes]] | None = None
        self._symbolic: dict[str, list[bytes]] | None = None
        self._symbolic_bodies: dict[tuple[str, ...], dict[str, onnx.TypeProto]] = {}
        #: nodes onnxruntime's symbolic shape inference could not follow (set once it has run)
        self.symbolic_failures: tuple[NodeFailure, ...] = ()
        self._inference_model: onnx.ModelProto | None = None
        self._present_past: dict[str, str] | None = None
        #: sizes read from one run (`offloadctl.loading.measured`), which win over inference; None: not measured
        self.measured: MeasuredSizes | None = None

    def _inference_proto(self) -> onnx.ModelProto:
        """The model as shape inference should see it (`inference_proto`), made once."""
        if self._inference_model is None:
            self._inference_model = inference_proto(self._loaded.proto, self._node_order, self._producers)
        return self._inference_model

    def _inferred(self) -> dict[str, list[bytes]]:
        if self._types is None:
            ahead, self._ahead = self._ahead, None
            types = ahead.result() if ahead is not None else None
            self._types = types if types is not None else self._run_inference()
        return self._types

    @paused_gc()
    def _run_inference(self) -> dict[str, list[bytes]]:
        """onnx's shape inference over the whole graph, as serialized types by name."""
        try:
            return inferred_types(self._inference_proto())
        except Exception as exc:  # inference is best effort: unknown sizes are excluded with a reason
            logger.warning(
                "shape inference failed on %s (%s); sizes come from the file's value_info", self._loaded.path, exc
            )
            graph = self._loaded.proto.graph
            return types_by_name((graph.value_info, graph.input, graph.output))

    def _declared_types(self) -> dict[str, list[bytes]]:
        """The types the file declares (value_info and graph outputs), by name."""
        if self._declared is None:
            graph = self._loaded.proto.graph
            self._declared = types_by_name((graph.value_info, graph.output))
        return self._declared

    def _symbolic_types(self) -> dict[str, list[bytes]]:
        if self._symbolic is None:
            result = symbolic_value_infos(self._inference_proto(), self._loaded.path, self._onnx_hint)
            self.symbolic_failures = tuple(result.failures)
            self._symbolic = types_by_name((result.value_infos,))
            self._symbolic_bodies = result.bodies
        return self._symbolic

    def body_types(self) -> dict[tuple[str, ...], dict[str, onnx.TypeProto]]:
        """The types onnxruntime's symbolic shape inference finds inside If/Loop/Scan bodies, by
        `offloadctl.loading.symbolic.body_key` (it runs once, if it has not yet): it follows shapes
        computed inside a body (a Reshape of a Concat of Shapes), which onnx's inference does not."""
        self._symbolic_types()
        return self._symbolic_bodies

    def _onnx_hint(self, name: str) -> tuple[int, tuple[int | None, ...] | None] | None:
        """Element type and shape onnx's inference found for a tensor (unknown dimensions None)."""
        found = self._inferred().get(name)
        if not found:
            return None
        info = _type_to_info(name, found[0], self._type_cache)
        if info.shape is None:
            return (info.elem_type or 0, None)
        return (info.elem_type or 0, tuple(d if isinstance(d, int) else None for d in info.shape))

    def _compute(self, name: str) -> TensorInfo | None:
        weight = self._weights.get(name)
        if weight is not None:
            if isinstance(weight, onnx.NodeProto):
                info = _constant_info(weight)
                if info is not None:
                    return info
            else:
                key = (
                    (weight.values.data_type, tuple(weight.dims))
                    if isinstance(weight, onnx.SparseTensorProto)
                    else (weight.data_type, tuple(weight.dims))
                )
                fields = self._weight_cache.get(key)
                if fields is None:
                    fields = self._weight_cache[key] = tensor_info("", *key)[1:]
                return TensorInfo(name, *fields)
        if self.measured is not None:
            found = self.measured.get(name)
            if found is not None:
                return tensor_info(name, found[0], found[1])
        info = _first_known(name, self._inferred().get(name, ()), self._type_cache)
        if info is None or info.bytes is None:
            declared = self._declared_types().get(name, ())
            if len(set(declared)) == 1:  # several declarations that disagree are not evidence
                better = _first_known(name, declared[:1], self._type_cache)
                if better is not None and (info is None or better.bytes is not None):
                    info = better
        shared = self._shared_kv().get(name)
        if shared is not None:  # the symbolic tool's guess for it is the past's shape: see below
            return None if info is None else self._present_as_kernel_returns(info, shared)
        if info is None or info.bytes is None:
            # Never replace a known size by an unknown one (the first of equals wins).
            better = _first_known(name, self._symbolic_types().get(name, ()), self._type_cache)
            if better is not None and (info is None or better.bytes is not None):
                info = better
        return info

    def use_measured(self, sizes: MeasuredSizes) -> None:
        """Take the sizes one run measured (`offloadctl.running.sizes.measure_sizes`) over inferred ones."""
        self.measured = sizes
        self._done.clear()

    def _shared_kv(self) -> dict[str, str]:
        """Present key/value outputs of GroupQueryAttention nodes -> the past input they may share."""
        if self._present_past is None:
            found: dict[str, str] = {}
            for node in self._loaded.proto.graph.node:
                if node.op_type == "GroupQueryAttention" and node.domain == "com.microsoft":
                    for out, past in zip(node.output[1:3], node.input[3:5]):
                        if out and past:
                            found[out] = past
            self._present_past = found
        return self._present_past

    def _present_as_kernel_returns(self, info: TensorInfo, past_name: str) -> TensorInfo:
        """onnxruntime's GroupQueryAttention returns a present of ``max(past length, total length)``
        positions (``group_query_attention_helper.h``): with a past and present that share one buffer
        (onnxruntime-genai's ``past_present_share_buffer``) the present is as long as the past buffer,
        whatever the model declares for it. The total length is what the model declares for the
        present (onnxruntime-genai's builder: the attention mask's length); where it declares none,
        the length stays unknown (onnxruntime's symbolic inference would say "the past's", which is
        wrong whenever the past is shorter)."""
        past = self.get(past_name)
        if info.shape is None or len(info.shape) != 4 or past is None or past.shape is None or len(past.shape) != 4:
            return info
        past_len, total = past.shape[2], info.shape[2]
        if isinstance(past_len, int) and isinstance(total, int):
            length: int | str | None = max(past_len, total)
        else:
            length = total if isinstance(total, str) else None
        if length == total:
            return info
        return tensor_info(info.name, info.elem_type, (*info.shape[:2], length, *info.shape[3:]))

    def _checked(self, info: TensorInfo) -> TensorInfo:
        """Refuse a tensor no model can really have: an undefined element type, an absurd size."""
        where = f"tensor {info.name!r} of {self._loaded.path}"
        if info.type_kind == "undefined":
            raise OffloadError(
                f"{where} has element type {info.elem_type}, which onnx does not define",
                hint="re-export the model, or fix the type of that initializer or value_info entry",
            )
        if info.bytes is not None and info.bytes > MAX_TENSOR_BYTES:
            raise OffloadError(
                f"{where} would take {fmt_bytes(info.bytes)} ({info.dtype}{list(info.shape or ())}), more than any "
                "device holds",
                hint="check the model's declared shapes, or pin smaller dimensions with --input-shape NAME=D0,D1,...",
            )
        return info

    def get(self, name: str, default: TensorInfo | None = None) -> TensorInfo | None:  # type: ignore[override]
        info = self._done.get(name)
        if info is None:
            info = self._compute(name)
            if info is None:
                return default
            self._done[name] = info = self._checked(info)
        return info

    @paused_gc()
    def convert(self, names: Iterable[str]) -> list[str]:
        """Convert the given tensors now, in one pass: what a caller that looks up nearly every tensor
        does first (a big model has hundreds of thousands). Lookups give what they would have given.

        An initializer, or a tensor whose first inferred type has a known, plausible size, is
        converted here; any other (Constant-node and sparse weights, unknown sizes and their
        fallbacks, sizes `get` refuses) is left to `get`, so nothing is refused that is not looked up.
        Returns the names this call did not convert, in their order: each tensor converted here has a
        known size, so a caller looking for unknown sizes need look up only these.
        """
        left: list[str] = []
        done = self._done
        weights = self._weights
        cache = self._type_cache
        shared = self._shared_kv()
        measured = self.measured.shapes if self.measured is not None else {}
        types: dict[str, list[bytes]] | None = None
        info_of = tuple.__new__  # TensorInfo(...) without the NamedTuple's Python-level __new__
        for name in names:
            if name in done or name in shared or name in measured:
                left.append(name)
                continue
            weight = weights.get(name)
            if weight is not None:
                if type(weight) is TensorProto:  # an initializer (not a Constant node, not sparse)
                    key = (weight.data_type, tuple(weight.dims))
                    fields = self._weight_cache.get(key)
                    if fields is None:
                        fields = self._weight_cache[key] = tensor_info("", *key)[1:]
                    if fields[3] is None and fields[-1] is not None and fields[-1] <= MAX_TENSOR_BYTES:
                        done[name] = info_of(TensorInfo, (name, *fields))
                        continue
                left.append(name)
                continue
            if types is None:
                types = self._inferred()
            found = types.get(name)
            if found:
                fields = cache.get(found[0])
                if fields is None:
                    fields = cache[found[0]] = _type_fields(onnx.TypeProto.FromString(found[0]))
                size = fields[-1]
                if size is not None and size <= MAX_TENSOR_BYTES:
                    done[name] = info_of(TensorInfo, (name, *fields))
                    continue
            left.append(name)
        return left

    def __getitem__(self, name: str) -> TensorInfo:
        info = self.get(name)
        if info is None:
            raise KeyError(name)
        return info

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.get(name) is not None

    def _names(self) -> dict[str, None]:
        names = dict.fromkeys(self._inferred())
        names.update(dict.fromkeys(self._weights))
        if any(self.get(n) is not None and self[n].bytes is None for n in names):
            names.update(dict.fromkeys(self._symbolic_types()))
        return {n: None for n in names if self.get(n) is not None}

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __len__(self) -> int:
        return len(self._names())


def _first_known(name: str, types: Sequence[bytes], cache: dict[bytes, tuple]) -> TensorInfo | None:
    """The first description with a known size, else the first one (None if there is none)."""
    first = None
    for t in types:
        info = _type_to_info(name, t, cache)
        if info.bytes is not None:
            return info
        if first is None:
            first = info
    return first


def tensor_infos(
    loaded: LoadedModel,
    node_order: Sequence[int] | None = None,
    constants: Mapping[str, int] | None = None,
    producers: Mapping[str, int | str] | None = None,
    ahead: Ahead[dict[str, list[bytes]]] | None = None,
) -> TensorInfos:
    """Type and shape of every main-graph tensor (a lazy mapping, see `TensorInfos`).

    Args:
        loaded: the model.
        node_order: file indices of the nodes in a topological order, for a file whose nodes are
            not sorted (onnx's shape inference walks the file order and would stop at the first
            node whose input comes later).
        constants: output name -> file index of each Constant node, when the caller knows them.
        producers: tensor name -> file index of the main-graph node that produces it (any other
            value: no node does), when the caller knows it.
        ahead: the inference `start_inference` started for this model, used when ``node_order``
            is None (the file's order), stopped otherwise.
    """
    return TensorInfos(loaded, node_order, constants, producers, ahead)


def _constant_info(node: onnx.NodeProto) -> TensorInfo | None:
    for attr in node.attribute:
        if attr.name == "value" and attr.type == onnx.AttributeProto.TENSOR:
            t = attr.t
            return tensor_info(node.output[0], t.data_type, tuple(t.dims))
        if attr.name in ("value_float", "value_int"):
            elem = TensorProto.FLOAT if attr.name == "value_float" else TensorProto.INT64
            return tensor_info(node.output[0], elem, ())
        if attr.name in ("value_floats", "value_ints"):
            elem = TensorProto.FLOAT if attr.name == "value_floats" else TensorProto.INT64
            n = len(attr.floats) if attr.name == "value_floats" else len(attr.ints)
            return tensor_info(node.output[0], elem, (n,))
        if attr.name in ("value_string", "value_strings"):
            return tensor_info(node.output[0], TensorProto.STRING, None)
        if attr.name == "sparse_value" and attr.type == onnx.AttributeProto.SPARSE_TENSOR:
            # onnxruntime makes the dense tensor: its size counts, whatever is stored
            sparse = attr.sparse_tensor
            return tensor_info(node.output[0], sparse.values.data_type, tuple(sparse.dims))
    return None
