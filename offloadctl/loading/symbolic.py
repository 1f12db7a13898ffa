"""onnxruntime's symbolic shape inference, run so that it loses as little as it can.

onnx's own shape inference stops where its data propagation does (a Reshape whose shape is sliced
out of a Shape, a Range over computed bounds); onnxruntime's tool
(``onnxruntime.tools.symbolic_shape_infer``, shipped with every onnxruntime build, needs sympy)
computes such shapes with sympy. Used as it ships, it loses whole models in two ways, which this
module closes:

- **External data.** It reads the values of small weights (shapes, axes, Range bounds) with
  ``numpy_helper.to_array``, which looks for a tensor's data file relative to the current folder.
  The tool must run in a private folder (it writes ``sym_shape_infer_temp.onnx`` and a data file
  into the current one when it gives up), where the model's data files are not. So every
  external weight of at most `VALUE_BYTES` is read into the copy the tool sees, from the model's
  own folder; larger ones keep their dimensions and lose their data (no shape depends on them).
- **One failing node.** A handler that raises (an ``AssertionError`` in ``_infer_Range`` on a
  torch dynamo export, a value it cannot read) used to end the whole inference. Here the node's
  outputs get fresh symbolic dimensions instead (keeping what onnx's inference knew of their
  type and rank), so only the tensors that depend on them stay unknown. `SymbolicResult.failures`
  names each such node.

It is also slow as it ships on a model with Resize chains and unpinned dimensions: it repeats its
pass over the graph whenever it merges two symbolic dimensions, and every pass simplifies the same
nested ``floor`` expressions with sympy again, and simplify itself simplifies each level of a
nested ``floor`` once for every level above it (PP-OCRv4's detector: five passes, up to 0.8 s a
Resize). ``sympy.simplify`` is a pure function of an immutable expression, so each result is kept
for the run (`_simplify_once`).

The copy nodes offloadctl inserts are read as Identity (the tool does not know them), and
onnxruntime's DynamicQuantizeLSTM (``quantize_dynamic`` makes one of every LSTM), which neither
onnx nor the tool sizes, gets the RNN shapes its schema gives.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import onnx
from onnx import TensorProto

from offloadctl.core.onnxutil import copy_kind, named_subgraphs, pin_view_source, subgraphs

__all__ = [
    "VALUE_BYTES",
    "NodeFailure",
    "SymbolicResult",
    "TypeHint",
    "body_key",
    "body_types",
    "copies_as_identity",
    "symbolic_value_infos",
]

logger = logging.getLogger(__name__)

#: External weights up to this size are read for the tool (their values may be shapes or bounds).
VALUE_BYTES = 64 * 1024

#: What onnx's own inference knew of a tensor: (element type or 0, shape with None for unknown dims,
#: or None for an unknown rank).
TypeHint = Callable[[str], "tuple[int, tuple[int | None, ...] | None] | None"]


@dataclass(frozen=True)
class NodeFailure:
    """A node whose shape the tool could not compute: its outputs got fresh symbolic dimensions."""

    node: str
    op_type: str
    error: str


@dataclass
class SymbolicResult:
    """What the tool inferred (value_info entries) and the nodes it could not follow."""

    value_infos: list[onnx.ValueInfoProto] = field(default_factory=list)
    failures: list[NodeFailure] = field(default_factory=list)
    error: str | None = None  # the tool could not run at all (None when it ran)
    #: the types the tool found inside If/Loop/Scan bodies, by `body_key` of each body
    bodies: dict[tuple[str, ...], dict[str, onnx.TypeProto]] = field(default_factory=dict)


_MISSING_WARNED: set[str] = set()


def symbolic_value_infos(proto: onnx.ModelProto, path: Path, hint: TypeHint | None = None) -> SymbolicResult:
    """Shapes from onnxruntime's symbolic shape inference, when onnxruntime (and sympy) are installed.

    Args:
        proto: the model as shape inference should see it (weights not loaded).
        path: the model file; its folder holds the external data files.
        hint: what onnx's own inference knew of a tensor, for the outputs of a node the tool cannot
            follow.

    Runs in a private temporary folder, removed afterwards. Without onnxruntime or sympy a warning
    (once per model) says which sizes stay unknown and how to get them.
    """
    try:
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference
    except Exception as exc:  # onnxruntime, or the sympy it needs, is missing
        if str(path) not in _MISSING_WARNED:
            _MISSING_WARNED.add(str(path))
            logger.warning(
                "some sizes of %s are unknown to onnx's shape inference, and onnxruntime's symbolic shape inference "
                "cannot help: it cannot be imported (%s: %s); install onnxruntime and sympy "
                "(pip install sympy) for those sizes",
                path,
                type(exc).__name__,
                exc,
            )
        return SymbolicResult(error=f"{type(exc).__name__}: {exc}")
    work = _with_small_weights(copies_as_identity(proto), path.parent)
    engine = _robust_engine(SymbolicShapeInference, hint or (lambda name: None))
    with (
        tempfile.TemporaryDirectory(prefix="offloadctl-shapes-") as folder,
        _working_directory(folder),
        _robust_bodies(engine),
        _simplify_once(),
    ):
        try:
            inferred = _run(engine, work)
        except Exception as exc:  # best effort, like onnx's inference: keep nothing, say why
            logger.info("onnxruntime's symbolic shape inference failed on %s (%s: %s)", path, type(exc).__name__, exc)
            return SymbolicResult(failures=list(engine.failures_), error=f"{type(exc).__name__}: {exc}")
    for failure in engine.failures_:
        logger.info(
            "onnxruntime's symbolic shape inference cannot follow node %r (%s) of %s (%s); what depends on its "
            "outputs stays unknown",
            failure.node,
            failure.op_type,
            path,
            failure.error,
        )
    return SymbolicResult(
        list(inferred.graph.value_info) + list(inferred.graph.output),
        list(engine.failures_),
        bodies=body_types(inferred.graph),
    )


def body_key(path: tuple[str, ...], node: onnx.NodeProto, attribute: str) -> tuple[str, ...]:
    """A body's key: the keys of the graphs around it, then the node that holds it (by its first
    output, unique in its graph) and the attribute (``then_branch``, ``body``, ...). Names repeat
    across bodies (Optimum's merged decoder has the same tensors in both branches), keys do not."""
    return (*path, node.output[0] if node.output else node.name, attribute)


def body_types(graph: onnx.GraphProto, path: tuple[str, ...] = ()) -> dict[tuple[str, ...], dict[str, onnx.TypeProto]]:
    """Every body's tensor types in ``graph`` (an inferred one), by `body_key`."""
    found: dict[tuple[str, ...], dict[str, onnx.TypeProto]] = {}
    for node in graph.node:
        for name, body in named_subgraphs(node):
            key = body_key(path, node, name)
            found[key] = {vi.name: vi.type for vi in (*body.value_info, *body.output)}
            found.update(body_types(body, key))
    return found


@contextlib.contextmanager
def _robust_bodies(engine: Any) -> Iterator[None]:
    """The tool infers each If/Loop/Scan body with a fresh instance of its class, named in its module:
    make that instance a robust one too (same hint), so that one failing node in a body loses only
    what depends on it, not the whole body."""
    import onnxruntime.tools.symbolic_shape_infer as tool

    plain = tool.SymbolicShapeInference
    robust = type(engine)

    def make(int_max: int, auto_merge: bool, guess_output_rank: bool, verbose: int, prefix: str = "") -> Any:
        sub = robust(engine.hint_, prefix=prefix)
        sub.failures_ = engine.failures_  # one list: a body's failures are the model's
        return sub

    tool.SymbolicShapeInference = make
    try:
        yield
    finally:
        tool.SymbolicShapeInference = plain


@contextlib.contextmanager
def _simplify_once() -> Iterator[None]:
    """``sympy.simplify`` with each result kept for the run, for the tool's calls and for the calls
    simplify makes itself on the parts of an expression (each level of nested ``floor`` simplifies
    the levels below it again). The tool reads sympy from its module's globals, simplify itself
    from its own module's. Keys are sympy expressions (and the options), equal only when the same:
    sympy>=1.13 no longer calls ``Float(2.0)`` and ``Integer(2)`` equal."""
    import sys

    import onnxruntime.tools.symbolic_shape_infer as tool

    plain = getattr(tool, "sympy", None)
    inner = sys.modules.get("sympy.simplify.simplify")
    real = getattr(inner, "simplify", None)
    if plain is None or not callable(real):  # sympy laid out otherwise: run the tool as it ships
        yield
        return
    kept: dict[Any, Any] = {}

    def simplify(expr: Any, *args: Any, **kwargs: Any) -> Any:
        if not isinstance(expr, plain.Basic):  # a Python number: 2 == 2.0 would share a key
            return real(expr, *args, **kwargs)
        try:
            key = (expr, args, tuple(sorted(kwargs.items())))
            found = kept.get(key)
        except TypeError:  # an option that cannot be a key
            return real(expr, *args, **kwargs)
        if found is None:
            found = kept[key] = real(expr, *args, **kwargs)
        return found

    class _Sympy(types.ModuleType):
        def __getattr__(self, name: str) -> Any:
            return getattr(plain, name)

    remembering = _Sympy(plain.__name__)
    remembering.simplify = simplify  # type: ignore[attr-defined]
    tool.sympy, inner.simplify = remembering, simplify  # type: ignore[union-attr]
    try:
        yield
    finally:
        tool.sympy, inner.simplify = plain, real  # type: ignore[union-attr]


def _run(engine: Any, proto: onnx.ModelProto) -> onnx.ModelProto:
    """``SymbolicShapeInference.infer_shapes`` without its final refusal: what was inferred before an
    incomplete stop is kept (the tool itself raises then, and writes files into the current folder)."""
    engine._preprocess(proto)
    while engine.run_:
        engine._infer_impl()
    engine._update_output_from_vi()
    return engine.out_mp_


class _Robust:
    """The tool's node handlers made robust (see the module docstring); mixed into the tool's class by
    `_robust_engine`, so that ``super()`` is the tool. ``hint_`` is what onnx's inference knew."""

    hint_: TypeHint
    known_vi_: dict[str, onnx.ValueInfoProto]
    out_mp_: onnx.ModelProto
    prefix_: str
    sympy_data_: dict[str, Any]

    def __init__(self, hint: TypeHint, prefix: str = "") -> None:
        # int_max, auto_merge, guess_rank, verbose, and the prefix of a body's new symbols
        super().__init__(2**31 - 1, True, False, 0, prefix=prefix)  # type: ignore[call-arg]
        self.hint_ = hint
        self.failures_: list[NodeFailure] = []
        self._unknown_dims = 0
        handlers: dict[str, Callable[[onnx.NodeProto], Any]] = getattr(self, "dispatcher_")  # noqa: B009
        handlers.setdefault("DynamicQuantizeLSTM", self._infer_DynamicQuantizeLSTM)
        self.dispatcher_ = {op: self._guarded(handler) for op, handler in handlers.items()}

    def _infer_DynamicQuantizeLSTM(self, node: onnx.NodeProto) -> None:  # noqa: N802 - the tool's naming
        """onnxruntime's quantized LSTM (``quantize_dynamic`` makes one of every LSTM), which neither
        onnx nor the tool knows: its schema gives the outputs onnx's RNN shapes, Y [seq_length,
        num_directions, batch_size, hidden_size] and Y_h, Y_c [num_directions, batch_size, hidden_size]."""
        x = self._get_shape(node, 0)  # type: ignore[attr-defined]
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        hidden = attrs.get("hidden_size")
        if x is None or len(x) != 3 or hidden is None:
            raise ValueError("X of rank 3 and a hidden_size attribute are needed")
        directions = 2 if attrs.get("direction") == b"bidirectional" else 1
        seq, batch = x[0], x[1]
        elem_type = self.known_vi_[node.input[0]].type.tensor_type.elem_type
        shapes = ([seq, directions, batch, hidden], [directions, batch, hidden], [directions, batch, hidden])
        for name, shape in zip(node.output, shapes):
            if name:
                self._set_value(name, onnx.helper.make_tensor_value_info(name, elem_type, shape))

    def _infer_Shape(self, node: onnx.NodeProto) -> None:  # noqa: N802 - the tool's naming
        """Shape with its ``start`` and ``end`` attributes (opset 15), which the tool ignores: a
        torch dynamo export reads single dimensions so (``Shape(x, start=1, end=2)``), and the
        whole shape in their place corrupts every size computed from it."""
        shape = self._get_sympy_shape(node, 0)  # type: ignore[attr-defined]
        attrs = {a.name: a.i for a in node.attribute if a.name in ("start", "end")}
        # onnx's rule: negative values count from the end, then both are clamped to [0, rank]
        self.sympy_data_[node.output[0]] = shape[slice(attrs.get("start", 0), attrs.get("end"))]

    def _guarded(self, handler: Callable[[onnx.NodeProto], Any]) -> Callable[[onnx.NodeProto], Any]:
        def call(node: onnx.NodeProto) -> Any:
            try:
                handler(node)
            except Exception as exc:  # noqa: BLE001 - any failure of the tool's handler
                self._give_up(node, exc)
                return None
            self._check_outputs(node)
            return None

        return call

    def _onnx_infer_single_node(self, node: onnx.NodeProto) -> None:
        try:
            super()._onnx_infer_single_node(node)  # type: ignore[misc]
        except Exception as exc:  # noqa: BLE001 - onnx's inference of one node, inside the tool
            self._give_up(node, exc)
            return
        self._check_outputs(node)

    def _check_outputs(self, node: onnx.NodeProto) -> None:
        """Outputs without a type or a rank (onnx's inference of a node that reads a tensor the tool
        gave up on), on which the tool's own checks fail, get what onnx knew; and a shape that
        contradicts onnx's inference (another rank, another known dimension) is not believed."""
        for name in node.output:
            vi = self.known_vi_.get(name)
            if not name or vi is None:
                continue
            kind = vi.type.WhichOneof("value")
            if kind not in (None, "tensor_type"):
                continue
            known = self.hint_(name)
            if kind is None or not vi.type.tensor_type.HasField("shape"):
                if kind is None or (known is not None and known[1] is not None):
                    self._set_value(name, self._unknown_value(name, node))
            elif known is not None and known[1] is not None and not _agrees(vi, known[1]):
                self._give_up(node, ValueError(f"its shape contradicts onnx's inference of {name!r}"))
                return

    def _give_up(self, node: onnx.NodeProto, exc: Exception) -> None:
        label = node.name or (node.output[0] if node.output else node.op_type)
        if not any(f.node == label for f in self.failures_):
            detail = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
            self.failures_.append(
                NodeFailure(label, node.op_type, f"{type(exc).__name__}{': ' + detail if detail else ''}")
            )
        for name in node.output:
            if name:
                self._set_value(name, self._unknown_value(name, node))

    def _set_value(self, name: str, vi: onnx.ValueInfoProto) -> None:
        """Replace what the tool knows of ``name``: its entries are elements of the value_info of the
        model it returns, which handlers update in place, so the entry is overwritten, not replaced."""
        entry = self.known_vi_.get(name)
        if entry is None:
            entry = self.known_vi_[name] = self.out_mp_.graph.value_info.add()
        entry.CopyFrom(vi)

    def _unknown_value(self, name: str, node: onnx.NodeProto) -> onnx.ValueInfoProto:
        """What onnx's inference knew of the output, its unknown dimensions made fresh symbols."""
        known = self.hint_(name)
        elem_type, shape = known if known is not None else (0, None)
        if not elem_type:  # the tool stops at an undefined type: guess the first input's, as it does
            first = self.known_vi_.get(node.input[0]) if node.input else None
            elem_type = first.type.tensor_type.elem_type if first is not None else 0
        elem_type = elem_type or TensorProto.FLOAT
        dims: list[int | str] | None = None
        if shape is not None:
            dims = []
            for d in shape:
                if d is None:
                    self._unknown_dims += 1
                    dims.append(str(self._new_symbolic_dim(f"offloadctl_unknown{self.prefix_}", self._unknown_dims)))  # type: ignore[attr-defined]
                else:
                    dims.append(d)
        return onnx.helper.make_tensor_value_info(name, elem_type, dims)


def _robust_engine(inference_class: Any, hint: TypeHint) -> Any:
    """An instance of the tool whose node handlers never end the inference (see the module docstring)."""
    robust = type("RobustSymbolicShapeInference", (_Robust, inference_class), {})
    return robust(hint)


def _agrees(vi: onnx.ValueInfoProto, shape: tuple[int | None, ...]) -> bool:
    """The tool's shape has the rank onnx inferred, and every dimension onnx knows as a number."""
    dims = vi.type.tensor_type.shape.dim
    if len(dims) != len(shape):
        return False
    return all(want is None or not d.HasField("dim_value") or d.dim_value == want for d, want in zip(dims, shape))


def _with_small_weights(proto: onnx.ModelProto, folder: Path) -> onnx.ModelProto:
    """A copy of the model whose external weights of at most `VALUE_BYTES` hold their data (read
    from ``folder``), and whose larger external weights keep only their dimensions."""
    if not any(t.data_location == TensorProto.EXTERNAL for t in proto.graph.initializer):
        return proto
    from onnx.external_data_helper import load_external_data_for_tensor

    work = onnx.ModelProto()
    work.CopyFrom(proto)
    for tensor in work.graph.initializer:
        if tensor.data_location != TensorProto.EXTERNAL:
            continue
        length = next((int(e.value) for e in tensor.external_data if e.key == "length" and e.value.isdigit()), None)
        small = length is not None and length <= VALUE_BYTES
        if small:
            try:
                load_external_data_for_tensor(tensor, str(folder))
            except Exception as exc:  # noqa: BLE001 - a file the loader already checked; keep dims only
                logger.info("cannot read external data of %r for shape inference (%s)", tensor.name, exc)
                small = False
        if not small:
            del tensor.external_data[:]
            tensor.ClearField("raw_data")
        tensor.data_location = TensorProto.DEFAULT
    return work


@contextlib.contextmanager
def _working_directory(folder: str) -> Iterator[None]:
    previous = os.getcwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(previous)


def copies_as_identity(proto: onnx.ModelProto) -> onnx.ModelProto:
    """The model without its MemcpyToHost/MemcpyFromHost copies (a copy; the model itself when it
    has none), for onnxruntime's symbolic shape inference, which gives up on ops it does not know
    and needs constant inputs (axes, shapes) as constants: each copy becomes an Identity and every
    reader of a copy, in subgraphs too, reads the copied tensor itself. An order pin's view (a
    no-op Reshape, `offloadctl.contract.order_pins`) is read as the tensor it views, the same way."""
    copies = [
        i
        for i, n in enumerate(proto.graph.node)
        if (copy_kind(n) is not None and len(n.input) == 1) or pin_view_source(n) is not None
    ]
    if not copies:
        return proto
    plain = onnx.ModelProto()
    plain.CopyFrom(proto)
    source: dict[str, str] = {}
    for i in copies:
        node = plain.graph.node[i]
        node.op_type = "Identity"
        del node.attribute[:]
        del node.input[1:]  # a pin's view: its shape input goes
        source[node.output[0]] = node.input[0]

    def original(name: str) -> str:
        for _ in range(len(source) + 1):
            if name not in source:
                break
            name = source[name]
        return name

    def reroute(graph: onnx.GraphProto) -> None:
        for node in graph.node:
            if node.op_type != "Identity" or node.output[0] not in source:
                for k, name in enumerate(node.input):
                    if name in source:
                        node.input[k] = original(name)
            for g in subgraphs(node):
                reroute(g)

    reroute(plain.graph)
    return plain
