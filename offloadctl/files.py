"""File handling shared by every stage: hashing, output-path checks and atomic writes.

Every output offloadctl writes goes through `atomic_write`: the bytes land in a temporary file in
the destination folder and are renamed over the destination only when complete, so a failure never
leaves a half-written or clobbered file behind. Inputs are only ever read.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from offloadctl.errors import OffloadError

__all__ = ["sha256_file", "check_output_path", "atomic_write", "atomic_write_text"]


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Return the hex sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def check_output_path(output: str | os.PathLike[str], *inputs: str | os.PathLike[str] | None) -> Path:
    """Refuse an output that would overwrite an input or cannot be written; return it as a Path."""
    out = Path(output)
    for src in dict.fromkeys(inputs):  # each distinct input once: a model may name one data file per weight
        if src is None:
            continue
        src_path = Path(src)
        if out.resolve() == src_path.resolve():
            raise OffloadError(
                f"output {out} is the same file as the input {src_path}",
                hint="write the result to a new path; inputs are never modified",
            )
    if out.exists() and out.is_dir():
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
    return out


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


def atomic_write(path: str | os.PathLike[str], write: Callable[[Path], None]) -> None:
    """Call ``write(tmp_path)`` to fill a temporary file, then rename it over ``path``."""
    out = Path(path)
    try:
        with _temporary_beside(out) as tmp:
            write(tmp)
            # mkstemp creates 0600 files; give the result the usual permissions.
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)
            os.replace(tmp, out)
    except OSError as exc:
        raise OffloadError(f"cannot write {out}: {exc.strerror or exc}", hint="check the path and free disk space") from exc


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write text atomically (UTF-8)."""
    atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
