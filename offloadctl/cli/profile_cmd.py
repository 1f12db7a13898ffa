"""`offloadctl profile`: measure a device profile (node times, executor overheads, copy costs) on the device."""

from __future__ import annotations

import logging
from typing import Any

import click
from rich.markup import escape
from rich.table import Table

from offloadctl.cli.common import finish
from offloadctl.cli.options import (
    ShapeOptions,
    ep_option,
    input_shape_option,
    inputs_option,
    json_option,
    model_argument,
    opt_level_option,
    output_option,
)
from offloadctl.cli.ui import out_console, steps
from offloadctl.core.files import check_output_path
from offloadctl.core.units import fmt_bytes
from offloadctl.loading.input_shapes import parse_dims, parse_input_shapes
from offloadctl.running.profiler import DEFAULT_REPEAT, measure_profile
from offloadctl.running.sessions import DEVICES, parse_ep_options
from offloadctl.simulation.profiles import write_profile

__all__ = ["COMMANDS", "profile_cmd", "summary"]

logger = logging.getLogger(__name__)


def summary(doc: dict[str, Any], output: str) -> dict[str, Any]:
    """The figures of a measured profile that `profile --json` prints (the node table left out)."""
    measured = doc["measured"]
    return {
        "output": output,
        "model": measured["model"]["path"],
        "sha256": measured["model"]["sha256"],
        "device": measured["device"],
        "repeat": measured["repeat"],
        "intra_op_num_threads": measured["session"]["intra_op_num_threads"],
        "opt_level": measured["session"]["opt_level"],
        "fused": len(measured.get("fused", [])),
        "latency_s": measured["latency_s"]["median"],
        "kernel_sum_s": measured["kernel_sum_s"],
        "nodes": {"model": measured["model"]["nodes"], "measured": len(measured["nodes"])},
        "executor": {k: v for k, v in measured["executor"].items() if k != "source"},
        "link": doc["link"],
        "link_fit_error": {d: measured["link"][d]["max_relative_error"] for d in ("d2h", "h2d")},
        "link_fit_bytes": measured["link"]["d2h"]["fitted_bytes"],
        "peak_flops": doc["peak_flops"],
        "mem_bandwidth": doc["mem_bandwidth"],
        "kernel_launch_s": doc["kernel_launch_s"],
        "run_overhead_s": doc["run_overhead_s"],
    }


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.2f} us"


def _print(info: dict[str, Any], model: str) -> None:
    console = out_console()
    device = info["device"]
    table = Table(
        title=f"measured on {escape(device['name'])} ({device['provider']}, onnxruntime {device['onnxruntime']})",
        show_edge=False,
        show_header=False,
    )
    table.add_column(style="bold")
    table.add_column()
    table.add_row("model", f"{escape(model)} (sha256 {info['sha256'][:12]}…)")
    threads = info["intra_op_num_threads"]
    level = info["opt_level"]
    optimizations = "no graph optimizations" if level == "disable" else f"graph optimizations at {level}"
    table.add_row(
        "session",
        f"PRIORITY_BASED, {optimizations}, {threads or 'default'} intra-op thread{'s' if threads != 1 else ''}",
    )
    if level != "disable":
        table.add_row(
            "fusions",
            f"{info['fused']} tensors taken in by onnxruntime's rewrites at {level} "
            "(plans with this profile keep them)",
        )
    table.add_row("latency", f"{info['latency_s'] * 1e3:.3f} ms (median of {info['repeat']} or more runs)")
    table.add_row(
        "node times", f"{info['nodes']['measured']} nodes, summing to {info['kernel_sum_s'] * 1e3:.3f} ms in profiling"
    )
    executor = info["executor"]
    table.add_row("executor", f"{_us(executor['run_overhead_s'])} per run, {_us(executor['node_overhead_s'])} per node")
    low, high = info["link_fit_bytes"]
    for direction, label in (("d2h", "D2H (MemcpyToHost)"), ("h2d", "H2D (MemcpyFromHost)")):
        link = info["link"][direction]
        table.add_row(
            label,
            f"{_us(link['latency_s'])} + bytes / {fmt_bytes(link['bandwidth'])}/s "
            f"(fit within {info['link_fit_error'][direction]:.0%} from {fmt_bytes(low)} to {fmt_bytes(high)})",
        )
    table.add_row(
        "roofline",
        f"{info['peak_flops']['default'] / 1e9:.1f} GFLOP/s, {fmt_bytes(info['mem_bandwidth'])}/s, "
        f"{_us(info['kernel_launch_s'])} per estimated node",
    )
    console.print(table)
    console.print(f"use it: offloadctl simulate {escape(model)} --profile {escape(info['output'])}", style="dim")


@click.command("profile")
@model_argument
@click.option(
    "--device",
    required=True,
    type=click.Choice(list(DEVICES)),
    help="Where to measure: ascend (CANN), cpu, cuda or webgpu.",
)
@inputs_option
@input_shape_option
@click.option(
    "--repeat",
    type=click.IntRange(min=1),
    default=DEFAULT_REPEAT,
    show_default=True,
    help="Runs per measurement after one warm-up run (medians are taken); fast models get more.",
)
@ep_option
@click.option(
    "--threads",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="onnxruntime intra-op threads of the measured sessions (0: its default, one per physical core); the "
    "profile describes sessions run this way.",
)
@opt_level_option(
    "onnxruntime's graph optimization level of the model's timed runs: the level the model will be served "
    "at. Above disable, each fused node's time goes to the original node that writes its output, and plans made "
    "with the profile keep the tensors the fusions took in (reason fused).",
)
@output_option("the measured profile (JSON, schemas/profile.schema.json)")
@json_option
def profile_cmd(
    model: str,
    device: str,
    inputs: str | None,
    shapes: ShapeOptions,
    repeat: int,
    ep_option: tuple[str, ...],
    threads: int,
    opt_level: str,
    output: str,
    as_json: bool,
) -> None:
    """Measure MODEL on a device and write a profile for simulate and plan (--profile FILE).

    \b
    Runs the model as `offloadctl run` does (PRIORITY_BASED order, --opt-level: no graph
    optimizations by default) and records: every node's duration from onnxruntime's profiling
    (median of --repeat runs; above disable, each fused node's time goes to an original node), with the
    model's sha256; the executor's cost beyond the kernels; MemcpyToHost and MemcpyFromHost timed
    over a sweep of sizes and fitted as latency + bytes / bandwidth; roofline figures for nodes
    without a measurement; and what it ran on. Measure on a quiet machine.
    """
    if inputs is not None and (shapes.input_shape or shapes.dim):
        raise click.UsageError("--inputs and --input-shape/--dim exclude each other: the inputs fix the shapes")
    check_output_path(output, model, inputs)
    input_shapes = parse_input_shapes(shapes.input_shape)
    dims = parse_dims(shapes.dim)
    options = parse_ep_options(ep_option)
    if options and device == "cpu":
        logger.warning("--ep-option is ignored with --device cpu (the CPU provider takes no such options)")
    with steps(not as_json, total=5) as step:
        doc = measure_profile(
            model,
            device,
            inputs=inputs,
            input_shapes=input_shapes,
            dims=dims,
            repeat=repeat,
            ep_options=options,
            threads=threads,
            report=step,
            opt_level=opt_level,
        )
        step(f"writing {output}")
        write_profile(output, doc)
    info = summary(doc, output)
    if not as_json:
        _print(info, model)
    parts = [
        f"latency {info['latency_s'] * 1e3:.3f} ms",
        f"{info['nodes']['measured']} node times",
        f"on {info['device']['provider']}",
    ]
    finish("profile", model, parts, [output], as_json=as_json, doc=info)


COMMANDS = [profile_cmd]
