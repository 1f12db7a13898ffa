"""Loading a model for planning: the file read without its weights' bytes, its external data
checked (every data file inside the model's folder), its input dimensions pinned (`offloadctl.loading.input_shapes`)
and onnxruntime's load-time rewrites applied (`offloadctl.loading.ortgraph`).

Planning never needs weight bytes: models are read with ``load_external_data=False``, so weights in
external data files stay on disk. Types and sizes come later, lazily (`offloadctl.loading.tensors`).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

import onnx
from google.protobuf import json_format, text_format
from google.protobuf.message import DecodeError
from onnx import TensorProto

from offloadctl.core.errors import OffloadError
from offloadctl.core.files import sha256_file
from offloadctl.core.onnxutil import data_unread_by_inference, iter_tensor_protos, shape_only_copy
from offloadctl.loading.inference import start_inference
from offloadctl.loading.input_shapes import check_dims, expand_patterns, pin_dims, pin_input_shapes
from offloadctl.loading.ortgraph import normalize as normalize_graph

if TYPE_CHECKING:
    from offloadctl.core.ahead import Ahead
    from offloadctl.core.plantypes import SizesFromRun


__all__ = [
    "LoadedModel",
    "declared_model",
    "load_model",
    "read_onnx",
    "external_data_files",
    "external_location",
    "external_data_entries",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadedModel:
    """A model read for planning: the proto (weights not loaded) and where it came from."""

    proto: onnx.ModelProto
    path: Path
    sha256: str
    input_shapes: dict[str, list[int]]
    data_files: tuple[Path, ...] = ()  # every external data file the model reads, subgraphs included
    dims: dict[str, int] = field(default_factory=dict)  # symbolic dimensions pinned by name
    # the data files' ``location`` entries as the model writes them, sorted (apply's `external_locations`);
    # None when not known
    data_locations: tuple[str, ...] | None = None
    # read every size from one run (`offloadctl.running.sizes.measure_sizes`) when the model is analysed;
    # None: infer them
    sizes_from_run: SizesFromRun | None = None
    # the types graph inputs, outputs and value_info declared before the pins were applied (serialized
    # TypeProtos by name; None without pins): a rewrite gives them back, so the model stays dynamic
    declared_types: dict[str, bytes] | None = None
    # onnx's shape inference of ``proto``, running in a child process since `load_model` started it
    # (``infer_ahead``), for the analysis to take; not an argument, so a copy made by
    # dataclasses.replace (another proto) has none
    inference: Ahead[dict[str, list[bytes]]] | None = field(default=None, init=False, compare=False, repr=False)

    @property
    def files(self) -> tuple[Path, ...]:
        """Every file the model is read from: the model file and its external data files."""
        return (self.path, *self.data_files)


def declared_model(loaded: LoadedModel) -> onnx.ModelProto:
    """``loaded``'s model with the types its file declares (those before its pins) and no weight data shape
    inference does not read: what onnxruntime's allocation planner compares, without reading the file
    again."""
    work = shape_only_copy(loaded.proto, data_unread_by_inference)
    declared = loaded.declared_types or {}
    for vi in [*work.graph.input, *work.graph.output, *work.graph.value_info]:
        if vi.name in declared:
            vi.type.ParseFromString(declared[vi.name])
    return work


def load_model(
    path: str | os.PathLike[str],
    *,
    input_shapes: Mapping[str, Sequence[int]] | None = None,
    dims: Mapping[str, int] | None = None,
    normalize: bool = True,
    input_shapes_from: str = "--input-shape",
    sizes_from_run: SizesFromRun | None = None,
    infer_ahead: bool = False,
) -> LoadedModel:
    """Read an ONNX file without its external weight data and pin the given input dimensions.

    Args:
        path: the .onnx file.
        input_shapes: input name -> every dimension (``--input-shape``).
        dims: symbolic dimension name (dim_param) -> size, pinned wherever the main graph's
            inputs, outputs and value_info declare it (``--dim``, like onnxruntime's
            ``make_dynamic_shape_fixed --dim_param``).
        normalize: change the graph as onnxruntime changes it at every optimization level
            (`offloadctl.loading.ortgraph`), so that positions count what runs (the default).
        input_shapes_from: where ``input_shapes`` come from, for error messages.
        sizes_from_run: read every size from one run on onnxruntime's CPU provider when the model
            is analysed (`offloadctl.job.analysed`): ``{"inputs": FILE or None, "seed": N}``.
        infer_ahead: for a caller that will look up sizes: start onnx's shape inference of a big
            graph in a child process as soon as the graph is final, before the data files are
            checked (`offloadctl.loading.inference.start_inference`); its analysis takes it.

    Raises:
        OffloadError: the file is missing, empty, not ONNX, truncated, lacks an external data
            file, an ``input_shapes`` entry does not match a graph input, or a ``dims`` name is
            not a dimension of any input (or contradicts ``input_shapes``).
    """
    p = Path(path)
    proto = _read_onnx(p)
    pinned = expand_patterns(proto, {k: list(v) for k, v in (input_shapes or {}).items()}, p, input_shapes_from)
    named = dict(dims or {})
    declared = None
    if pinned or named:
        graph = proto.graph
        declared = {vi.name: vi.type.SerializeToString() for vi in [*graph.input, *graph.output, *graph.value_info]}
    if named:
        check_dims(proto, named, pinned, p)
    if pinned:
        pin_input_shapes(proto, pinned, p, input_shapes_from)
    if named:
        pin_dims(proto, named)
    if normalize:
        _normalize(proto, p)
    inference = start_inference(proto) if infer_ahead else None  # stopped when dropped unused
    data_files, data_locations = _checked_data_files(proto, p)
    loaded = LoadedModel(
        proto=proto,
        path=p,
        sha256=sha256_file(p),
        input_shapes=pinned,
        data_files=data_files,
        dims=named,
        data_locations=data_locations,
        sizes_from_run=None if sizes_from_run is None else {**sizes_from_run},
        declared_types=declared,
    )
    object.__setattr__(loaded, "inference", inference)
    return loaded


#: Files from this size on are read weight by weight (`_read_binary`)
STREAMED_FROM_BYTES = 16 << 20
_TEXT_SUFFIXES = (".json", ".txt", ".onnxtxt", ".textproto", ".prototxt")


def _read_binary(p: Path) -> onnx.ModelProto | None:
    """A binary ONNX file of `STREAMED_FROM_BYTES` or more, parsed as it is read: every field but the main
    graph's weights whole, each weight on its own, so the file's bytes and the parsed model are never in
    memory together (onnx.load holds both: twice the model). None for a smaller file, a text format, or
    bytes that are not protobuf's wire format (onnx.load then reads it, and says what is wrong)."""
    if p.suffix.lower() in _TEXT_SUFFIXES or p.stat().st_size < STREAMED_FROM_BYTES:
        return None
    model = onnx.ModelProto()
    head, graph = bytearray(), bytearray()
    try:
        with open(p, "rb") as f:
            end = os.fstat(f.fileno()).st_size
            while f.tell() < end:
                field, wire, raw = _tag(f)
                if field == 7 and wire == 2:  # ModelProto.graph
                    length, _ = _varint(f)
                    _read_graph(f, f.tell() + length, graph, model.graph)
                else:
                    head += raw + _value(f, wire)
        model.MergeFromString(bytes(head))
        model.graph.MergeFromString(bytes(graph))
    except (DecodeError, ValueError, EOFError):
        return None
    return model


def _read_graph(f: BinaryIO, end: int, rest: bytearray, graph: onnx.GraphProto) -> None:
    """Read a GraphProto's fields up to ``end``: each initializer parsed into ``graph`` as it is read, every
    other field's bytes onto ``rest``."""
    while f.tell() < end:
        field, wire, raw = _tag(f)
        if field == 5 and wire == 2:  # GraphProto.initializer
            length, _ = _varint(f)
            graph.initializer.add().ParseFromString(_exactly(f, length))
        else:
            rest += raw + _value(f, wire)
    if f.tell() != end:
        raise ValueError("a graph's fields run past its length")


def _varint(f: BinaryIO) -> tuple[int, bytes]:
    raw = bytearray()
    while True:
        byte = f.read(1)
        if not byte:
            raise EOFError
        raw += byte
        if not byte[0] & 0x80:
            break
        if len(raw) > 10:
            raise ValueError("a varint longer than 10 bytes")
    return sum((b & 0x7F) << (7 * k) for k, b in enumerate(raw)), bytes(raw)


def _tag(f: BinaryIO) -> tuple[int, int, bytes]:
    tag, raw = _varint(f)
    return tag >> 3, tag & 7, raw


def _value(f: BinaryIO, wire: int) -> bytes:
    """A field's encoded value after its tag, as read."""
    if wire == 0:
        return _varint(f)[1]
    if wire == 1:
        return _exactly(f, 8)
    if wire == 5:
        return _exactly(f, 4)
    if wire == 2:
        length, raw = _varint(f)
        return raw + _exactly(f, length)
    raise ValueError(f"wire type {wire} is not one onnx writes")


def _exactly(f: BinaryIO, n: int) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise EOFError
    return data


def read_onnx(path: str | os.PathLike[str]) -> onnx.ModelProto:
    """The ONNX file at ``path`` as written (without its external data, nothing pinned or normalized), or one
    clear error saying what is wrong with it (`OffloadError`)."""
    return _read_onnx(Path(path))


def _read_onnx(p: Path) -> onnx.ModelProto:
    """The ONNX file at ``p`` without its external data, or one clear error saying what is wrong.

    Raises:
        OffloadError: the file is missing, a folder, empty, a plan, not ONNX, truncated or unreadable.
    """
    if not p.exists():
        raise OffloadError(f"model file {p} does not exist", hint="check the path")
    if p.is_dir():
        raise OffloadError(f"model path {p} is a directory", hint="give the path of a .onnx file")
    if p.stat().st_size == 0:
        raise OffloadError(f"model file {p} is empty", hint="re-export the model")
    if _looks_like_plan(p):
        raise OffloadError(
            f"{p} is an offload plan, not an ONNX model",
            hint="pass the .onnx model here; plans go to offloadctl filter, prefetch or apply",
        )
    try:
        proto = _read_binary(p) or onnx.load(str(p), load_external_data=False)
    except (
        DecodeError,
        json_format.ParseError,
        text_format.ParseError,
        onnx.parser.ParseError,
        RuntimeError,
        ValueError,
        UnicodeDecodeError,
    ) as exc:
        detail = str(exc).splitlines()[0][:200] if str(exc) else ""
        raise OffloadError(
            f"model file {p} is not a valid ONNX model ({type(exc).__name__}: {detail})",
            hint="check that the file is a complete .onnx export (not truncated, not another format)",
        ) from None
    except OSError as exc:
        raise OffloadError(
            f"cannot read model file {p}: {exc.strerror or exc}", hint="check the file's permissions"
        ) from None
    if proto.ir_version <= 0 or not proto.HasField("graph") or not proto.opset_import:
        raise OffloadError(
            f"model file {p} is not a valid ONNX model (no IR version, opset or graph)",
            hint="check that the file is a complete .onnx export (not truncated, not another format)",
        )
    return proto


def _normalize(proto: onnx.ModelProto, path: Path) -> None:
    """Change the graph as onnxruntime does at every optimization level, saying what changed."""
    changes = normalize_graph(proto)
    if changes.inlined:
        logger.warning(
            "%s: onnxruntime runs %s as function bodies; they were expanded in place and plan positions "
            "count the expanded nodes",
            path,
            ", ".join(changes.inlined),
        )
    if changes.dequantize_copies or changes.casts_removed:
        logger.info(
            "%s: like onnxruntime (at every optimization level), %d shared DequantizeLinear output(s) get a copy "
            "per reader and %d redundant Cast node(s) are removed; plan positions count what runs",
            path,
            changes.dequantize_copies,
            changes.casts_removed,
        )


def _looks_like_plan(path: Path) -> bool:
    """True for a JSON document with the top-level keys of an offload plan."""
    try:
        with open(path, "rb") as f:
            head = f.read(1).lstrip()
            if head != b"{":
                return False
            document = json.loads(head + f.read())
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(document, dict) and "offloads" in document and "schema_version" in document


def external_location(tensor: TensorProto) -> str:
    """The ``location`` entry of a tensor stored as external data ("" if it has none)."""
    entries = tensor.external_data
    if entries and entries[0].key == "location":  # where onnx writes it
        return entries[0].value
    return next((e.value for e in entries if e.key == "location"), "")


def external_data_entries(proto: onnx.ModelProto) -> list[tuple[str, str]]:
    """(tensor name, ``location`` as written) of every tensor stored as external data, anywhere in
    the model."""
    return [
        (tensor.name, external_location(tensor))
        for tensor in iter_tensor_protos(proto.graph)
        if tensor.data_location == TensorProto.EXTERNAL
    ]


def external_data_files(proto: onnx.ModelProto, base_dir: Path) -> list[tuple[str, Path]]:
    """(tensor name, data file) for every tensor stored as external data, anywhere in the model."""
    paths: dict[str, Path] = {}
    found = []
    for name, location in external_data_entries(proto):
        path = paths.get(location)
        if path is None:
            path = paths[location] = base_dir / location
        found.append((name, path))
    return found


def _checked_data_files(proto: onnx.ModelProto, path: Path) -> tuple[tuple[Path, ...], tuple[str, ...]]:
    """The distinct external data files of a model, each checked: a relative location inside the
    model's folder (after symlinks), naming a file that exists; and their locations as written,
    sorted.

    onnxruntime refuses absolute locations, and a location that leaves the model's folder would
    make `apply` copy bytes from elsewhere into the output folder.
    """
    base = path.parent
    folder = base.resolve()
    files: dict[Path, None] = {}
    seen: set[str] = set()
    for tensor_name, location in external_data_entries(proto):
        if location in seen:  # models name the same data file for thousands of weights
            continue
        seen.add(location)
        if not location:
            raise OffloadError(
                f"weight {tensor_name!r} of {path} is stored as external data but names no data file",
                hint="re-export the model (its external_data entry has no 'location')",
            )
        if Path(location).is_absolute():
            raise OffloadError(
                f"weight {tensor_name!r} of {path} names its external data file by the absolute path {location}; "
                "onnxruntime refuses absolute locations",
                hint="move the data file into the model's folder and store its location relative to the model",
            )
        data_file = base / location
        try:
            resolved = data_file.resolve()
        except (OSError, RuntimeError):
            resolved = data_file.absolute()
        if not resolved.is_relative_to(folder):
            raise OffloadError(
                f"the external data file {location!r} of weight {tensor_name!r} of {path} lies outside the model's "
                f"folder {base} (it resolves to {resolved})",
                hint="keep the model's data files inside its folder (no '..' in locations, no symlinks to elsewhere)",
            )
        if not data_file.is_file():
            raise OffloadError(
                f"external data file {data_file} for weight {tensor_name!r} of {path} is missing",
                hint="keep the model's data files in the folder the model refers to",
            )
        files[data_file] = None
    return tuple(files), tuple(sorted(seen))
