"""Writing a rewritten model: the model file, its external data files copied beside it when it goes to
another folder (or kept embedded when the whole model fits protobuf's limit), never over a file the
job reads, and nothing half-written left behind on failure (`write_model`).
"""

from __future__ import annotations

import contextlib
import filecmp
import functools
import os
import shutil
import stat
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import onnx

from offloadctl.core.errors import OffloadError
from offloadctl.core.files import atomic_write, check_distinct_outputs, output_target, same_file, written_through
from offloadctl.core.onnxutil import copy_fields
from offloadctl.loading.model import external_data_entries

#: protobuf's limit for one serialized message: a bigger model keeps its weights in data files
MAX_EMBEDDED_BYTES = 2**31 - 1

__all__ = [
    "MAX_EMBEDDED_BYTES",
    "check_model_outputs",
    "data_copies",
    "external_locations",
    "fill_shared_weights",
    "shared_weights",
    "write_model",
]


def external_locations(model: onnx.ModelProto) -> list[str]:
    """The distinct external data files (``location`` values) the model's tensors refer to."""
    return sorted({location for _, location in external_data_entries(model)})


def data_copies(
    model: onnx.ModelProto,
    out_path: str | os.PathLike[str],
    source_dir: str | os.PathLike[str],
    *,
    locations: Sequence[str] | None = None,
) -> list[Path]:
    """Where `write_model` copies the model's external data files (none when the output goes to
    the source's folder; beside the file a symlinked output points to). ``locations``: the model's
    `external_locations`, when the caller has them."""
    out = output_target(out_path)
    out_dir = out.parent if str(out.parent) else Path(".")
    if Path(source_dir).resolve() == out_dir.resolve():
        return []
    return [out_dir / location for location in (external_locations(model) if locations is None else locations)]


def check_model_outputs(
    model: onnx.ModelProto,
    out_path: str | os.PathLike[str],
    source_dir: str | os.PathLike[str],
    protected: Sequence[str | os.PathLike[str]] = (),
    *,
    big: bool = False,
    locations: Sequence[str] | None = None,
) -> None:
    """Refuse a write of ``model`` to ``out_path`` whose files (the model, the copies of its data
    files, with ``big`` the data file of a model over 2 GiB) collide with each other or with a
    ``protected`` file (one the command reads). ``locations``: the model's `external_locations`,
    when the caller has them. A model written through a character device or a FIFO (``-o /dev/null``)
    can have no file beside it."""
    out = output_target(out_path)
    out_dir = out.parent if str(out.parent) else Path(".")
    outputs = [("the rewritten model", out)]
    copies = data_copies(model, out, source_dir, locations=locations)
    if written_through(out) and (copies or big):
        raise OffloadError(
            f"{out_path} is not a file, and the rewritten model needs its weights in data files beside it",
            hint="write the rewrite to a file in a folder of its own",
        )
    outputs += [(f"the copy of external data file {p.name}", p) for p in copies]
    if big:
        outputs.append((f"the weights of the rewritten model ({out.name}.data)", out_dir / f"{out.name}.data"))
    check_distinct_outputs(outputs)
    for what, path in outputs:
        for src in protected:
            if same_file(path, src):
                raise OffloadError(
                    f"{what} would overwrite {src}, which the command reads",
                    hint="write the output to another path or folder; inputs are never modified",
                )


def _provide_external_data(locations: list[str], source_dir: Path, out_dir: Path) -> list[Path]:
    """Copy each data file beside the output (streamed, never read into memory, keeping its
    permission bits); return the new files."""
    created: list[Path] = []
    if source_dir.resolve() == out_dir.resolve():
        return created
    try:
        for location in locations:
            src = source_dir / location
            dst = out_dir / location
            if Path(location).is_absolute() or not src.resolve().is_relative_to(source_dir.resolve()):
                raise OffloadError(
                    f"external data file {location!r} lies outside the model's folder {source_dir}",
                    hint="keep the model's data files inside its folder (no absolute paths, no '..', no symlinks to "
                    "elsewhere)",
                )
            if not dst.resolve().is_relative_to(out_dir.resolve()):
                raise OffloadError(
                    f"external data file {location!r} would be placed outside the output folder {out_dir}",
                    hint=f"write the output into the model's folder {source_dir}",
                )
            if dst.exists():
                if os.path.samefile(src, dst) or filecmp.cmp(src, dst, shallow=False):
                    continue
                raise OffloadError(
                    f"{dst} already exists and differs from the model's external data file {src}",
                    hint="write the output into another folder, or remove that file",
                )
            dst.parent.mkdir(parents=True, exist_ok=True)
            # A copy, not a hard link: onnx >= 1.23 refuses to load external data files with more
            # than one link (a "hardlink attack" guard), which would break the source model too.
            mode = stat.S_IMODE(src.stat().st_mode)
            atomic_write(dst, functools.partial(shutil.copyfile, src), mode=mode)
            created.append(dst)
    except BaseException:
        _remove(created)
        raise
    return created


def shared_weights(model: onnx.ModelProto, source: onnx.ModelProto | None) -> dict[str, onnx.TensorProto]:
    """The weights of ``model`` that hold no data but their type and dimensions, by name, each the source's
    weight of that name (the one to write)."""
    if source is None:
        return {}
    empty = {t.name for t in model.graph.initializer if not _holds_data(t)}
    return {t.name: t for t in source.graph.initializer if t.name in empty and _holds_data(t)}


_DATA_FIELDS = ("raw_data", "float_data", "int32_data", "int64_data", "double_data", "uint64_data", "string_data")


def _holds_data(tensor: onnx.TensorProto) -> bool:
    """A weight with its data (in the proto or in external data), not only its type and dimensions."""
    if tensor.data_location == onnx.TensorProto.EXTERNAL or tensor.HasField("raw_data"):
        return True
    return any(len(getattr(tensor, name)) for name in _DATA_FIELDS[1:])


def fill_shared_weights(model: onnx.ModelProto, shared: Mapping[str, onnx.TensorProto]) -> None:
    """Give each weight of ``model`` named in ``shared`` (`shared_weights`) its data back, in place: a rewrite
    made with ``share_weights`` made whole, for a caller that holds it rather than writes it."""
    for tensor in model.graph.initializer:
        if tensor.name in shared:
            tensor.CopyFrom(shared[tensor.name])


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


_GRAPH_TAG = _varint(7 << 3 | 2)  # ModelProto.graph, length-delimited
_INITIALIZER_TAG = _varint(5 << 3 | 2)  # GraphProto.initializer


def _serialize(model: onnx.ModelProto, shared: Mapping[str, onnx.TensorProto], path: Path) -> None:
    """Write ``model`` in protobuf's wire format to ``path``, its graph's weights one at a time (those in
    ``shared`` taken from there): the model's bytes are never in memory all at once. Protobuf reads a
    message's fields in any order, so the graph comes after the model's other fields and its weights
    after the graph's."""
    head, graph = onnx.ModelProto(), onnx.GraphProto()
    copy_fields(model, head, leave_out="graph")
    copy_fields(model.graph, graph, leave_out="initializer")
    weights = [shared.get(t.name, t) for t in model.graph.initializer]
    sizes = [t.ByteSize() for t in weights]
    body = graph.SerializeToString()
    length = len(body) + sum(len(_INITIALIZER_TAG) + len(_varint(n)) + n for n in sizes)
    with open(path, "wb") as f:
        f.write(head.SerializeToString())
        if model.HasField("graph"):
            f.write(_GRAPH_TAG + _varint(length) + body)
            for tensor, n in zip(weights, sizes):
                f.write(_INITIALIZER_TAG + _varint(n))
                f.write(tensor.SerializeToString())


def _remove(paths: list[Path]) -> None:
    for path in paths:
        with contextlib.suppress(OSError):
            path.unlink()


def write_model(
    model: onnx.ModelProto,
    out_path: str | os.PathLike[str],
    *,
    source_dir: str | os.PathLike[str],
    max_embedded_bytes: int = MAX_EMBEDDED_BYTES,
    protected: Sequence[str | os.PathLike[str]] = (),
    locations: Sequence[str] | None = None,
    mode: int | None = None,
    weights_from: onnx.ModelProto | None = None,
) -> list[Path]:
    """Write ``model`` atomically to ``out_path``; return the data files written beside it.

    ``weights_from``: the source of a rewrite made with ``share_weights``
    (`offloadctl.rewriting.rewrite.RewriteOptions`): the data of each weight ``model`` holds only the
    type and dimensions of is taken from the source's weight of that name as the file is written, one
    weight at a time, so the model's bytes are never held in memory twice.

    ``mode`` gives the written model (and the data file of a model over 2 GiB) those permission bits,
    as `apply` gives a rewrite its source model's; None: the usual bits of a new file.

    External data files the model refers to (relative to ``source_dir``, the source model's
    folder) are copied beside the output when it goes to another folder (not hard-linked: onnx
    refuses to load external data files that have several links). A model larger than
    ``max_embedded_bytes`` (protobuf cannot serialize more than 2 GiB) is written with its
    embedded weights in one external file ``OUT.name + ".data"``.

    ``protected`` are files that must not be written (the inputs of the command): the output, the
    copied data files and the data file of a model over 2 GiB are checked against them and against
    each other before anything is written.

    ``locations`` are the model's `external_locations` when the caller knows them (a model from
    `apply_plan` refers to the data files of its source, `LoadedModel.data_locations`): a big
    model's tensors are then not walked again.

    Raises:
        OffloadError: the output cannot be written, an output would overwrite a protected file or
            another output, or a data file of that name exists and differs.
    """
    out = output_target(out_path)  # a symlinked output: the file it points to, and its data beside that
    out_dir = out.parent if str(out.parent) else Path(".")
    locations = external_locations(model) if locations is None else sorted(locations)
    shared = shared_weights(model, weights_from)
    big = model.ByteSize() + sum(t.ByteSize() for t in shared.values()) > max_embedded_bytes  # a walk: once
    check_model_outputs(model, out, source_dir, protected, big=big, locations=locations)
    created = _provide_external_data(locations, Path(source_dir), out_dir)
    try:
        if not big:
            atomic_write(out, lambda tmp: _serialize(model, shared, tmp), mode=mode)
            return created
        fill_shared_weights(model, shared)  # (a model over 2 GiB: its weights go to one data file)
        created.append(_write_big(model, out, locations, mode))
        return created
    except BaseException:
        _remove(created)
        raise


def _write_big(model: onnx.ModelProto, out: Path, locations: Sequence[str], mode: int | None) -> Path:
    """Write a model over 2 GiB with its weights in one data file beside it (``OUT.name + ".data"``), both
    atomically; the data file's path."""
    out_dir = out.parent if str(out.parent) else Path(".")
    data_name = out.name + ".data"
    if data_name in locations:
        raise OffloadError(
            f"cannot write the weights of {out} to {data_name}: the model already refers to a file of that name",
            hint="choose another output name",
        )
    try:
        with tempfile.TemporaryDirectory(prefix=f".{out.name}.", dir=out_dir) as tmp_dir:
            copy = onnx.ModelProto()
            copy.CopyFrom(model)
            onnx.save_model(
                copy,
                os.path.join(tmp_dir, out.name),
                save_as_external_data=True,
                all_tensors_to_one_file=True,
                location=data_name,
                size_threshold=1024,
            )
            for name in (data_name, out.name):
                if mode is not None:
                    os.chmod(os.path.join(tmp_dir, name), mode)
                else:  # tempfile's folder is private; its files get the usual bits of a new file
                    umask = os.umask(0)
                    os.umask(umask)
                    os.chmod(os.path.join(tmp_dir, name), 0o666 & ~umask)
            os.replace(os.path.join(tmp_dir, data_name), out_dir / data_name)
            try:
                os.replace(os.path.join(tmp_dir, out.name), out)
            except BaseException:
                _remove([out_dir / data_name])  # no data file without its model
                raise
    except OSError as exc:
        hint = "check the path and free disk space"
        raise OffloadError(f"cannot write {out}: {exc.strerror or exc}", hint=hint) from exc
    return out_dir / data_name
