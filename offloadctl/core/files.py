"""File handling shared by every stage: hashing, output-path checks and atomic writes.

Every output offloadctl writes goes through `atomic_write`: the bytes land in a temporary file in
the destination folder and are renamed over the destination only when complete, so a failure never
leaves a half-written or clobbered file behind. Inputs are only ever read.

An output path is taken as the user means it (`output_target`): a symlink is written through to the
file it points to (atomically, beside that file, and the link stays), and a character device or a
FIFO (``-o /dev/null``, ``-o /dev/stdout``, a named pipe) is written through once the whole output
is ready. Nothing else that is not a regular file (a block device, a socket) is ever written or
replaced: such an output is refused before any work starts.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

from offloadctl.core.errors import OffloadError

__all__ = [
    "sha256_file",
    "json_sha256",
    "same_file",
    "check_output_path",
    "output_target",
    "written_through",
    "check_distinct_outputs",
    "atomic_write",
    "atomic_write_text",
    "restored_on_failure",
    "NotJsonNumber",
    "refuse_json_constant",
    "finite_json_float",
]


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Return the hex sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def json_sha256(value: Any) -> str:
    """sha256 of a JSON value's canonical text: sorted keys, no whitespace, UTF-8."""
    # json's ASCII encoder is the faster one; it writes the same text unless a string holds a
    # character beyond ASCII, which it writes as \uXXXX (so does a control character either way)
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    if "\\u" in text:
        text = json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def same_file(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """True when two paths name the same file: equal after resolving symlinks, or hard links of one file."""
    pa, pb = Path(a), Path(b)
    try:
        if pa.resolve() == pb.resolve():
            return True
        return pa.exists() and pb.exists() and os.path.samefile(pa, pb)
    except (OSError, RuntimeError):  # unreadable or looping paths: compare them as written
        return os.path.abspath(pa) == os.path.abspath(pb)


def output_target(output: str | os.PathLike[str]) -> Path:
    """The path writing ``output`` writes: the file a symlink points to (at the end of a chain, and
    whether it exists yet or not), else ``output`` itself."""
    out = Path(output)
    return Path(os.path.realpath(out)) if out.is_symlink() else out


def written_through(output: str | os.PathLike[str]) -> bool:
    """Whether ``output`` (through symlinks) is a character device or a FIFO, which an output is written
    into as it is (``-o /dev/null`` discards it), not replaced by a new file."""
    try:
        mode = output_target(output).stat().st_mode
    except OSError:
        return False
    return stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)


def _check_kind(out: Path) -> None:
    """Refuse an output that exists and is neither a regular file nor written through (a block device, a
    socket): offloadctl never replaces or writes into one."""
    target = output_target(out)
    try:
        mode = target.stat().st_mode
    except OSError:
        return  # not there yet (or a dangling link): a new file
    if stat.S_ISREG(mode) or stat.S_ISCHR(mode) or stat.S_ISFIFO(mode) or stat.S_ISDIR(mode):
        return
    kind = "a block device" if stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) else "not a regular file"
    where = out if target == out else f"{out} (which points to {target})"
    raise OffloadError(
        f"output {where} is {kind}: offloadctl writes files, and writes through character devices and FIFOs "
        "(-o /dev/null discards), but never into or over anything else",
        hint="give the path of a file to write",
    )


def check_output_path(output: str | os.PathLike[str], *inputs: str | os.PathLike[str] | None) -> Path:
    """Refuse an output that would overwrite an input or cannot be written; return it as a Path.

    ``inputs`` are every file the command reads (a model's external data files included): an
    output equal to one of them, through symlinks or as a hard link, is refused. So is an output that
    is neither a file nor written through (`output_target`, `written_through`).
    """
    out = Path(output)
    try:
        _check_kind(out)
        for src in dict.fromkeys(inputs):  # each distinct input once: a model may name one data file per weight
            if src is None:
                continue
            if same_file(out, src):
                raise OffloadError(
                    f"output {out} is the same file as the input {src}",
                    hint="write the result to a new path; inputs are never modified",
                )
        if not written_through(out):
            target = output_target(out)
            _check_writable(target)
            _check_name_length(target)
    except OSError as exc:  # e.g. a name longer than the file system allows
        raise OffloadError(
            f"cannot write {out}: {exc.strerror or exc}", hint="choose a shorter or valid output path"
        ) from None
    return out


def _check_writable(out: Path) -> None:
    """Refuse an output that is a folder, or lies in a folder that does not exist or cannot be written,
    or is a read-only file."""
    if out.is_dir():
        raise OffloadError(f"output {out} is a directory", hint="give a file path for the output")
    parent = out.parent if str(out.parent) else Path(".")
    blocking = next((a for a in (parent, *parent.parents) if a.exists() and not a.is_dir()), None)
    if blocking is not None:
        raise OffloadError(
            f"cannot write {out}: {blocking} is a file, not a folder",
            hint="choose an output path inside an existing folder",
        )
    if not parent.is_dir():
        raise OffloadError(
            f"cannot write {out}: folder {parent} does not exist",
            hint=f"create it first (mkdir -p {parent}) or choose another output path",
        )
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OffloadError(
            f"cannot write {out}: folder {parent} is not writable",
            hint="choose an output path in a folder you can write to",
        )
    if out.exists() and not os.access(out, os.W_OK):
        raise OffloadError(f"cannot write {out}: file is read-only", hint="choose another output path")


def _check_name_length(out: Path) -> None:
    """Refuse a file name the temporary file beside it could not get (``.NAME.random.tmp``)."""
    parent = out.parent if str(out.parent) else Path(".")
    try:
        limit = os.pathconf(parent, "PC_NAME_MAX")
    except (OSError, ValueError):
        limit = 255
    if len(os.fsencode(out.name)) + len(".") + 8 + len(".tmp") + 1 > limit:
        raise OffloadError(
            f"cannot write {out}: the file name is {len(os.fsencode(out.name))} bytes long; this folder allows "
            f"names of at most {limit} bytes, and the output is first written under a slightly longer temporary name",
            hint=f"choose a file name shorter than {limit - 14} bytes",
        )


def check_distinct_outputs(outputs: Sequence[tuple[str, str | os.PathLike[str]]]) -> None:
    """Refuse two outputs of one command that land on the same file.

    ``outputs`` are (what it is, path) pairs, e.g. ("the rewritten model", "out/m.onnx").
    """
    for i, (what, path) in enumerate(outputs):
        for other_what, other in outputs[:i]:
            if same_file(path, other):
                raise OffloadError(
                    f"{what} and {other_what} would both be written to {path}",
                    hint="choose another output path, so that each file is written once",
                )


@contextlib.contextmanager
def _temporary_beside(path: Path) -> Iterator[Path]:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent or ".")
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
    except BaseException:
        with contextlib.suppress(OSError):
            tmp_path.unlink()
        raise


@contextlib.contextmanager
def restored_on_failure(*paths: str | os.PathLike[str]) -> Iterator[None]:
    """While open, ``paths`` may be written (replaced, as `atomic_write` does); when the block raises, each
    gets back the file it held before, or none: a command that fails leaves no file of its own behind
    and no earlier one overwritten. A command that exits on purpose (`SystemExit`, a gate that fails
    after writing) keeps what it wrote. The earlier files are kept by a hard link beside them (a copy
    where the file system has none)."""
    kept: dict[Path, Path | None] = {}
    try:
        for path in map(Path, paths):
            kept[path] = _kept_beside(path) if path.is_file() else None
        yield
    except SystemExit:
        _drop(kept)
        raise
    except BaseException:
        for path, old in kept.items():
            with contextlib.suppress(OSError):
                if old is not None:
                    os.replace(old, path)
                else:
                    path.unlink(missing_ok=True)
        raise
    else:
        _drop(kept)


def _kept_beside(path: Path) -> Path:
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".kept", dir=path.parent)
    os.close(fd)
    os.unlink(name)
    try:
        os.link(path, name)
    except OSError:
        shutil.copy2(path, name)
    return Path(name)


def _drop(kept: dict[Path, Path | None]) -> None:
    for old in kept.values():
        if old is not None:
            with contextlib.suppress(OSError):
                old.unlink()


def atomic_write(path: str | os.PathLike[str], write: Callable[[Path], object], *, mode: int | None = None) -> None:
    """Call ``write(tmp_path)`` to fill a temporary file, then rename it over ``path``.

    The result gets permission bits ``mode`` (a copy of a file keeps its source's), by default
    the usual ones for a new file (0666 less the umask).
    """
    out = output_target(path)  # a symlink keeps pointing to the file, which is replaced
    try:
        if written_through(out):
            _write_through(out, write)
            return
        with _temporary_beside(out) as tmp:
            write(tmp)
            if mode is None:  # mkstemp creates 0600 files
                umask = os.umask(0)
                os.umask(umask)
                mode = 0o666 & ~umask
            os.chmod(tmp, mode)
            os.replace(tmp, out)
    except OSError as exc:
        raise OffloadError(
            f"cannot write {out}: {exc.strerror or exc}", hint="check the path and free disk space"
        ) from exc


def _write_through(out: Path, write: Callable[[Path], object]) -> None:
    """Fill a private temporary file, then copy it into the character device or FIFO ``out``: whoever reads
    there gets the whole output or, when writing fails, nothing."""
    with tempfile.TemporaryDirectory(prefix="offloadctl-") as folder:
        tmp = Path(folder) / out.name
        write(tmp)
        with open(tmp, "rb") as src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write text atomically (UTF-8)."""
    atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


class NotJsonNumber(ValueError):
    """``NaN``, ``Infinity`` or ``-Infinity`` in a JSON text: Python's json module reads them, but
    JSON has no such numbers, and every figure in a plan or profile must be finite."""


def refuse_json_constant(token: str) -> NoReturn:
    """``parse_constant`` for `json.loads`: refuse NaN and the infinities (see `NotJsonNumber`)."""
    raise NotJsonNumber(f"{token} is not a JSON number")


def finite_json_float(text: str) -> float:
    """``parse_float`` for `json.loads`: a number too large for a double (``1e999``) is refused too,
    where Python would read it as infinity."""
    value = float(text)
    if not math.isfinite(value):
        raise NotJsonNumber(f"{text} is too large for a number")
    return value


def read_json(
    path: str | os.PathLike[str],
    what: str,
    *,
    fix: str,
    missing: str | None = None,
    parse_float: Callable[[str], Any] = finite_json_float,
) -> Any:
    """The JSON document in ``path``, or one `OffloadError` naming the file as ``what`` ("plan file",
    "profile file", ...) and the fix: a folder, a missing or unreadable file, text that is not UTF-8
    or not JSON (with its line and column), NaN or an infinity (JSON has no such numbers; see
    `NotJsonNumber`), or nesting too deep to read. ``fix`` ends every hint (what the file should be,
    or how to make it again); ``missing`` is the hint for a file that does not exist."""
    p = Path(path)
    if p.is_dir():
        raise OffloadError(f"{what} {p} is a directory", hint=f"give the path of a .json file: {fix}")
    if not p.is_file():
        raise OffloadError(f"{what} {p} does not exist", hint=missing or f"check the path: {fix}")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise OffloadError(f"{what} {p} is not a JSON text file (it is not UTF-8 text)", hint=fix) from None
    except OSError as exc:
        raise OffloadError(
            f"cannot read {what} {p}: {exc.strerror or exc}", hint="check the file's permissions"
        ) from None
    try:
        return json.loads(text, parse_float=parse_float, parse_constant=refuse_json_constant)
    except NotJsonNumber as exc:
        raise OffloadError(
            f"{what} {p} is not JSON: {exc}", hint=f"write finite numbers (JSON has no NaN or Infinity); {fix}"
        ) from None
    except json.JSONDecodeError as exc:
        raise OffloadError(
            f"{what} {p} is not JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})", hint=f"fix the syntax; {fix}"
        ) from None
    except RecursionError:
        raise OffloadError(f"{what} {p} is not JSON this tool reads: it is nested too deeply", hint=fix) from None
