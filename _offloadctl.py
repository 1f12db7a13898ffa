"""The `offloadctl` console script's entry point: from its first instruction on, Ctrl-C ends the command
with one line on stderr and exit status 130.

Importing the `offloadctl` package takes tens of milliseconds (typing, the plan's types), and the
console script imports it before any of its code can catch an interrupt: one then printed a
traceback. This module imports nothing but what the interpreter has built in, and holds
Ctrl-C to the one line until `offloadctl._entry.main` takes over, which turns it back into a
``KeyboardInterrupt`` so that a command interrupted in its work removes its temporary files.
"""

from __future__ import annotations

import os  # loaded with the interpreter already

try:  # the signal module itself imports enum, functools and collections: tens of milliseconds more
    import _signal as signal  # type: ignore[import-not-found]
except ImportError:  # not CPython
    import signal

INTERRUPTED_EXIT = 130  # 128 + SIGINT, what shells report for a command stopped by Ctrl-C


def _stop(signum: int, frame: object) -> None:
    os.write(2, b"offloadctl: interrupted\n")
    os._exit(INTERRUPTED_EXIT)  # nothing is written yet: nothing to clean up


# held from the first instruction on (not where the shell has SIGINT ignored, as for a background job)
_HELD = signal.getsignal(signal.SIGINT) is signal.default_int_handler
if _HELD:
    signal.signal(signal.SIGINT, _stop)


def main() -> None:
    """Run the command line (`offloadctl._entry.main`), holding Ctrl-C to one line while it loads."""
    from offloadctl._entry import main as run

    run(restore_interrupt=_HELD)
