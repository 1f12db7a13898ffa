"""Terminal output helpers: consoles, logging, progress, the JSON document, and a click type for byte sizes.

Human-readable output uses rich. Under ``--json`` or when stdout is not a terminal, progress bars
stay silent and stdout carries only the JSON document. Output that is not a terminal is not wrapped
(tables and paths stay on one line each, whatever their length). Byte sizes are formatted and
parsed by `offloadctl.core.units`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

import click
from rich.console import Console
from rich.logging import RichHandler
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from offloadctl.core.errors import OffloadError
from offloadctl.core.units import parse_bytes

__all__ = [
    "out_console",
    "err_console",
    "setup_logging",
    "progress",
    "steps",
    "print_json",
    "BytesParam",
    "FiniteFloatRange",
]

_consoles: dict[str, Console] = {}


# Width of output that is not a terminal (a pipe, a file, a CI log): wide enough that no table cell,
# path or message is wrapped or cut, as a terminal's 80 columns would. COLUMNS, when set, wins.
PIPE_WIDTH = 10_000


def _console(file: Any) -> Console:
    console = Console(file=file, highlight=False)
    if not console.is_terminal and not os.environ.get("COLUMNS"):
        console = Console(file=file, highlight=False, width=PIPE_WIDTH)
    return console


def out_console() -> Console:
    if "out" not in _consoles or _consoles["out"].file is not sys.stdout:
        _consoles["out"] = _console(sys.stdout)
    return _consoles["out"]


def err_console() -> Console:
    if "err" not in _consoles or _consoles["err"].file is not sys.stderr:
        _consoles["err"] = _console(sys.stderr)
    return _consoles["err"]


def setup_logging(level: int) -> None:
    """Log records go to stderr: through rich on a terminal, one plain line each otherwise."""
    console = err_console()
    handler: logging.Handler
    if console.is_terminal:
        handler = RichHandler(console=console, show_time=False, show_path=False, markup=False)
        handler.setFormatter(logging.Formatter("%(message)s"))
    else:
        handler = logging.StreamHandler(console.file)
        handler.setFormatter(logging.Formatter("%(levelname)-8s %(message)s"))
    logging.basicConfig(level=level, handlers=[handler], force=True)
    # onnxruntime's Python tools (its symbolic shape inference) log their own doubts as warnings;
    # they mean nothing to a user of offloadctl, which reports unknown sizes itself. -v shows them.
    logging.getLogger("onnxruntime").setLevel(level if level <= logging.INFO else logging.ERROR)


def _interactive() -> bool:
    """Progress is drawn on stderr, and only when both stdout and stderr are terminals: output piped
    to a file or a CI log stays free of it."""
    return err_console().is_terminal and out_console().is_terminal


@contextlib.contextmanager
def progress(enabled: bool = True) -> Iterator[Progress | None]:
    """A rich progress display on stderr when ``enabled`` and interactive (see `_interactive`)."""
    if not enabled or not _interactive():
        yield None
        return
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console(),
        transient=True,
    ) as bar:
        yield bar


def _ignore_step(description: str, new: bool = True) -> None:
    """The step function when no progress is shown."""


@contextlib.contextmanager
def steps(enabled: bool = True, total: int | None = None) -> Iterator[Callable[[str], None]]:
    """A one-line progress display naming the current step: ``step("writing plan")``.

    With ``total``, the bar also counts the steps done out of ``total``; ``step(text, new=False)``
    rewords the current step (news from a long step). Shown only when ``enabled`` and interactive
    (see `_interactive`); otherwise ``step`` does nothing.
    """
    with progress(enabled) as bar:
        if bar is None:
            yield _ignore_step
            return
        task = bar.add_task("", total=total)
        started = False

        def step(description: str, new: bool = True) -> None:
            nonlocal started
            bar.update(task, description=description, advance=1 if started and new else 0)
            started = True

        yield step


class BytesParam(click.ParamType):
    """A click parameter for byte sizes with units."""

    name = "BYTES"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        try:
            return parse_bytes(str(value))
        except OffloadError as exc:
            self.fail(f"{exc.message}; {exc.hint}" if exc.hint else exc.message, param, ctx)


class FiniteFloatRange(click.FloatRange):
    """click's FloatRange that also refuses nan and the infinities (nan compares as in any range)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


def print_json(document: Any) -> None:
    """Print one JSON document on stdout."""
    click.echo(json.dumps(document, indent=1))


@contextlib.contextmanager
def foreign_stdout_aside() -> Iterator[None]:
    """While it is open, what other code in the process writes to standard output (file descriptor 1)
    goes to standard error with -v and nowhere without: onnxruntime prints "X reused by Y as input"
    there itself when several streams share a device, which would corrupt a ``--json`` document and
    bury the report. The command prints its own output after."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no standard output to keep clean
        yield
        return
    verbose = logging.getLogger().isEnabledFor(logging.INFO)
    target = os.dup(2) if verbose else os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(target, 1)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)
        os.close(target)
