"""Building big structures quickly: Python's cyclic garbage collector held off while they are built.

A model of 100,000 nodes makes the analysis, the plan and its ``rejected`` list out of a few million
small tuples, lists and dicts. Python's collector runs after every few hundred new containers and
now and then walks every container alive: about a fifth of the time of ``offloadctl plan`` and
``apply`` went to collections that freed nothing, since these structures hold no reference cycles.
`paused_gc` switches automatic collection off while one such structure is built and back on
afterwards (anything a collection would have found is collected then). It is a decorator as well as
a context manager, and nests: only the outermost pause switches the collector back on, and a
collector that was already off stays off. In the console script's process, which ends with its
command, pauses also keep what they built from later collections (`keep_what_is_built`).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["paused_gc", "keep_what_is_built"]

_freeze = False  # set by keep_what_is_built


def keep_what_is_built() -> None:
    """Declare that this process keeps what it builds until it exits, as the console script does:
    each pause then ends by moving everything alive into the collector's permanent generation
    (`gc.freeze`), so that no later collection walks the model, its analysis or its plan again.

    Only for a process offloadctl owns: in another program it would keep that program's reference
    cycles of the moment alive until it exits.
    """
    global _freeze
    _freeze = True


@contextlib.contextmanager
def paused_gc() -> Iterator[None]:
    """Hold off automatic garbage collection while a big acyclic structure is built.

    Use as ``with paused_gc(): ...`` or as a decorator ``@paused_gc()`` (each call pauses afresh).
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        if _freeze:
            gc.freeze()
        gc.enable()
