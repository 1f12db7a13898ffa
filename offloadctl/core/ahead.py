"""Work done ahead: a function run in a forked child process while the caller goes on with other work.

A command on a big model spends most of a second in onnx's shape inference, a C++ call that holds
Python's global lock, while the analysis it does next needs no shape. `Ahead.start` forks the
process; the child runs the function on its copy of the memory and sends the result back, pickled,
through a pipe; `Ahead.result` reads it when the caller needs it. Only the result crosses: the child
logs and warns nothing, and it delivers nothing when the function raises or it dies, so the caller
then runs the function itself, with its errors and warnings, exactly as without the child.

Fork is used on Linux only (elsewhere `start` returns None and the caller works inline), and the
child runs only the function: it writes to no stream and leaves by ``os._exit``, so locks other
threads held when it forked (a progress display's) are never taken in it. A child whose result is
never asked for is killed when its `Ahead` is dropped or `cancel` is called.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import signal
import sys
import warnings
import weakref
from collections.abc import Callable
from typing import Any, Generic, TypeVar

__all__ = ["Ahead"]

T = TypeVar("T")

_OK = b"ok"


def _reap(pid: int, fd: int) -> None:
    """Stop a child and collect it (its result unread)."""
    with contextlib.suppress(OSError):
        os.close(fd)
    with contextlib.suppress(OSError):
        os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        os.waitpid(pid, 0)


class Ahead(Generic[T]):
    """The result of one call, computed in a forked child (`start`), read once (`result`)."""

    def __init__(self, pid: int, fd: int) -> None:
        self._pid = pid
        self._fd: int | None = fd
        self._finalizer = weakref.finalize(self, _reap, pid, fd)

    @classmethod
    def start(cls, func: Callable[..., T], *args: Any) -> Ahead[T] | None:
        """Fork a child that computes ``func(*args)``; None where this platform has no safe fork or
        the system refuses one (no memory or process left)."""
        if sys.platform != "linux":
            return None
        try:
            read_end, write_end = os.pipe()
        except OSError:  # out of file descriptors: the caller works inline
            return None
        try:
            with warnings.catch_warnings():  # Python 3.12+ warns of fork beside threads: the child takes no lock
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
        except OSError:  # no memory or process left for a child: the caller works inline
            os.close(read_end)
            os.close(write_end)
            return None
        if pid == 0:  # pragma: no cover - the child (its work is checked through the result)
            os.close(read_end)
            _child(func, args, write_end)
        os.close(write_end)
        return cls(pid, read_end)

    @property
    def unread(self) -> bool:
        """Whether the result is still to be read (the child may still be working)."""
        return self._fd is not None

    def result(self) -> T | None:
        """The function's result, waiting for the child if it is not done; None if the child
        delivered none (the function raised, or the child died): the caller computes it then."""
        fd = self._fd
        if fd is None:
            return None
        self._fd = None
        self._finalizer.detach()
        chunks = []
        try:
            while chunk := os.read(fd, 1 << 20):
                chunks.append(chunk)
        finally:
            os.close(fd)
            try:
                _, status = os.waitpid(self._pid, 0)
            except ChildProcessError:  # a host that ignores SIGCHLD has the system collect it: the bytes tell
                status = 0
        data = b"".join(chunks)
        if not os.WIFEXITED(status) or os.WEXITSTATUS(status) != 0 or not data.startswith(_OK):
            return None
        try:
            return pickle.loads(memoryview(data)[len(_OK) :])  # noqa: S301 - our own child's result
        except Exception:  # noqa: BLE001 - cut short: nothing delivered
            return None

    def cancel(self) -> None:
        """Stop the child; its result will not be read."""
        if self._fd is not None:
            self._fd = None
            self._finalizer()


def _child(func: Callable[..., Any], args: tuple[Any, ...], fd: int) -> None:  # pragma: no cover - in the child
    """Run ``func(*args)`` and write its pickled result to ``fd``; never returns."""
    code = 1
    try:
        logging.disable(logging.CRITICAL)  # the caller logs, when it computes the result itself
        warnings.simplefilter("ignore")  # and warns
        data = _OK + pickle.dumps(func(*args), protocol=pickle.HIGHEST_PROTOCOL)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        code = 0
    except BaseException:  # noqa: BLE001, S110 - nothing is delivered; the caller works inline
        pass
    finally:
        os._exit(code)
