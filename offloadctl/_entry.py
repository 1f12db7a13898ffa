"""The `offloadctl` console script: start the command line, and end cleanly on Ctrl-C.

This module imports nothing heavy at the top, so that an interrupt during start-up (while onnx,
numpy and rich load) is handled like one during the work: one line on stderr and exit status 130,
never a traceback. Output files are written atomically, so an interrupt leaves none half-written.
The process lives for one command, so what it builds is kept from the garbage collector's later
walks (`offloadctl.core.bulk.keep_what_is_built`).
"""

from __future__ import annotations

import signal
import sys

__all__ = ["main", "INTERRUPTED_EXIT"]

INTERRUPTED_EXIT = 130  # 128 + SIGINT, what shells report for a command stopped by Ctrl-C


def _interrupted() -> int:
    sys.stderr.write("offloadctl: interrupted\n")
    return INTERRUPTED_EXIT


def main(argv: list[str] | None = None, *, restore_interrupt: bool = False) -> None:
    """Run the command line and exit with its status (130 when interrupted). ``restore_interrupt``: the
    console script (`_offloadctl`) held Ctrl-C while the package loaded; from here it raises
    ``KeyboardInterrupt`` again, so that an interrupted command cleans up as it unwinds."""
    try:
        if restore_interrupt:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        import click

        from offloadctl.cli import cli
        from offloadctl.core.bulk import keep_what_is_built

        keep_what_is_built()  # the process ends with the command: what it builds need no later collection

        try:
            code = cli.main(args=argv, prog_name="offloadctl", standalone_mode=False)
        except click.exceptions.Abort as exc:
            if isinstance(exc.__cause__, KeyboardInterrupt) or exc.__cause__ is None:
                code = _interrupted()
            else:  # end of input at a prompt
                code = 1
        except click.ClickException as exc:
            exc.show()
            code = exc.exit_code
    except KeyboardInterrupt:
        code = _interrupted()
    sys.exit(code if isinstance(code, int) else 0)
