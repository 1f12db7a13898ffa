"""The `offloadctl` command line: a thin layer of click commands over the library.

One module per group of subcommands: `stages_cmd` (select, filter, prefetch), `plan_cmd`, `apply_cmd`,
`run_cmd`, `simulate_cmd`, `profile_cmd`, `frontier_cmd`, `inspect_cmd`; `options` holds the
option groups they share, `common` what they do alike (open a model, warnings, verdicts), `ui` the
consoles and progress, `plan_model` the plan command's model group (the model opened, optimized at
--opt-level, for the device), `plan_lines` what the planning commands print alike, `figure_lines` what
commands print of a plan's figures (peaks, slowdown, the warnings they call for), `simulate_model` the
simulate command's model group (the model opened, the simulation it reports), `simulate_lines` what
simulate prints, `report` the Markdown report and `plot` the timeline and frontier plots.
User errors (`OffloadError`) are printed as one message with a fix and exit status 1, without a
traceback; usage errors exit 2 (click); anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import logging

import click
from rich.markup import escape

from offloadctl._version import __version__
from offloadctl.cli.ui import err_console, setup_logging
from offloadctl.core.errors import OffloadError

__all__ = ["cli"]


class _Group(click.Group):
    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except OffloadError as exc:
            err_console().print(f"[bold red]error:[/] {escape(exc.message)}", highlight=False, soft_wrap=True)
            if exc.hint:
                err_console().print(f"  [bold]fix:[/] {escape(exc.hint)}", highlight=False, soft_wrap=True)
            ctx.exit(1)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="offloadctl")
@click.option("-v", "--verbose", is_flag=True, help="Show informational log messages.")
def cli(verbose: bool) -> None:
    """Cut the peak accelerator memory of an ONNX model by offloading idle tensors to the host.

    \b
    Pipeline: select -> filter -> prefetch (or `plan` for all three) -> apply -> run / simulate.
    """
    setup_logging(logging.INFO if verbose else logging.WARNING)


def _register() -> None:
    from offloadctl.cli import (
        apply_cmd,
        frontier_cmd,
        inspect_cmd,
        plan_cmd,
        profile_cmd,
        run_cmd,
        simulate_cmd,
        stages_cmd,
    )

    cli.add_command(inspect_cmd.inspect)
    for module in (stages_cmd, plan_cmd, apply_cmd, run_cmd, simulate_cmd, profile_cmd, frontier_cmd):
        for command in module.COMMANDS:
            cli.add_command(command)


_register()
