"""`offloadctl run`: run a (rewritten) model with onnxruntime, time it, check its order and outputs."""

from __future__ import annotations

import logging
import math

import click
from rich.markup import escape
from rich.table import Table

from offloadctl.analysis.order import EXECUTION_ORDERS
from offloadctl.cli.common import finish
from offloadctl.cli.options import (
    ShapeOptions,
    ep_option,
    execution_order_option,
    input_shape_option,
    inputs_option,
    json_option,
    model_argument,
    opt_level_option,
)
from offloadctl.cli.ui import foreign_stdout_aside, out_console, print_json
from offloadctl.core.errors import OffloadError
from offloadctl.core.files import check_output_path
from offloadctl.core.units import fmt_bytes
from offloadctl.loading.input_shapes import parse_dims, parse_input_shapes
from offloadctl.rewriting.metadata import planned_execution_order
from offloadctl.running.checks import OrderCheck, OutputComparison
from offloadctl.running.growth import MemoryGrowth
from offloadctl.running.inputs import parse_value_ranges
from offloadctl.running.inputs import save_outputs as save_outputs_file
from offloadctl.running.placement import InsertedCopy
from offloadctl.running.runner import STREAMS_DEFECT_HINT, RunReport, run_model
from offloadctl.running.sessions import DEVICES, parse_ep_options, quiet_onnxruntime

__all__ = ["COMMANDS", "run"]

logger = logging.getLogger(__name__)


class Tolerance(click.ParamType):
    """A comparison tolerance: a finite number >= 0 (``nan`` and ``inf`` would pass anything)."""

    name = "FLOAT"

    def convert(self, value, param, ctx):
        if isinstance(value, float):
            number = value
        else:
            try:
                number = float(value)
            except ValueError:
                self.fail(f"{value!r} is not a number", param, ctx)
        if not math.isfinite(number) or number < 0:
            self.fail(f"{value!r} is not a tolerance: give a finite number >= 0", param, ctx)
        return number


@click.command("run")
@model_argument
@click.option(
    "--device",
    required=True,
    type=click.Choice(list(DEVICES)),
    help="Where to run: ascend (CANN), cpu, cuda or webgpu (the WebGPU plugin provider).",
)
@inputs_option
@input_shape_option
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the random inputs.")
@click.option(
    "--value-range",
    "value_range",
    multiple=True,
    metavar="[NAME:]LOW,HIGH",
    help="Range of the random inputs (all inputs, or one by name; repeatable): floats uniform in [LOW, HIGH), "
    "integers LOW..HIGH. Default: floats standard normal, integers 0..3.",
)
@click.option(
    "--save-outputs",
    type=click.Path(dir_okay=False, path_type=str),
    metavar="FILE.npz",
    help="Write the model's outputs to an .npz file (numpy.load reads it).",
)
@click.option(
    "--compare-to",
    type=click.Path(dir_okay=False, path_type=str),
    help="Run this original model too, with the same inputs, and compare every output.",
)
@ep_option
@click.option(
    "--repeat", type=click.IntRange(min=1), default=5, show_default=True, help="Timed runs after one warm-up run."
)
@opt_level_option(
    "onnxruntime graph optimizations. With 'disable' (the default, which verifies the plan) the order must "
    "match exactly and outputs be bit-identical; with fusions onnxruntime renumbers fused nodes and may run copies "
    "earlier than planned.",
)
@click.option(
    "--rtol", type=Tolerance(), help="Relative tolerance for --compare-to [default: 1e-5; 0 with --opt-level disable]."
)
@click.option(
    "--atol", type=Tolerance(), help="Absolute tolerance for --compare-to [default: 1e-6; 0 with --opt-level disable]."
)
@click.option("--strict-order", is_flag=True, help="Exit 1 when nodes did not run in the planned (file) order.")
@execution_order_option
@click.option(
    "--measure-memory",
    is_flag=True,
    help="Also measure what onnxruntime's allocators hold for one run of a fresh session: at --execution-order "
    "default their own statistics (MaxInUse, through onnxruntime's C API), at priority the smallest arena limit "
    "the run fits in.",
)
@json_option
def run(
    model: str,
    device: str,
    inputs: str | None,
    shapes: ShapeOptions,
    seed: int,
    value_range: tuple[str, ...],
    save_outputs: str | None,
    compare_to: str | None,
    ep_option: tuple[str, ...],
    repeat: int,
    opt_level: str,
    rtol: float | None,
    atol: float | None,
    strict_order: bool,
    order: str | None,
    measure_memory: bool,
    as_json: bool,
) -> None:
    """Run MODEL with onnxruntime on a device, in the order its rewrite was planned for (PRIORITY_BASED for
    any other model, or --execution-order), and check it.

    \b
    Reports the providers really in use (fails if onnxruntime fell back to the CPU), the median
    latency, whether nodes ran in the file's order (read back from profiling), and with
    --compare-to whether every output matches the original.

    \b
    Random inputs never get invented sizes: pin dynamic dimensions with --input-shape or --dim
    (a rewritten model keeps the pins its plan was made with).
    """
    if save_outputs is not None:
        check_output_path(save_outputs, model, compare_to, inputs)
    order = order or planned_execution_order(model) or "priority"
    quiet_onnxruntime(device)
    with foreign_stdout_aside():  # onnxruntime prints to stdout itself when streams share a device
        report = run_model(
            model,
            device,
            inputs=inputs,
            compare_to=compare_to,
            ep_options=parse_ep_options(ep_option),
            repeat=repeat,
            opt_level=opt_level,
            rtol=rtol,
            atol=atol,
            input_shapes=parse_input_shapes(shapes.input_shape),
            dims=parse_dims(shapes.dim),
            seed=seed,
            value_ranges=parse_value_ranges(value_range),
            order=order,
            memory=measure_memory,
        )
    written = _save_outputs(report, save_outputs)
    for warning in report.warnings:
        logger.warning("%s", warning)
    if as_json and _failed(report, strict_order):
        print_json({"command": "run", "passed": False, **report.to_json(), "files_written": written})
    if not as_json:
        _print_report(report)
        _print_memory(report)
    _fail(report, model, device, compare_to, opt_level, strict_order)
    subject = f"{model} on {device} ({report.providers[0]})"
    parts = _verdict_parts(report, order, compare_to, planned_execution_order(model))
    finish("run", subject, parts, written, as_json=as_json, doc=report.to_json())


def _failed(report: RunReport, strict_order: bool) -> bool:
    """Whether the run fails (`_fail` says why)."""
    return bool(
        report.outputs_differ or report.undone_copies or _grown(report) or (strict_order and not report.order.matches)
    )


def _save_outputs(report: RunReport, save_outputs: str | None) -> list[str]:
    """Write the outputs to ``save_outputs`` (--save-outputs), warning about those that are not tensors;
    the files written."""
    if save_outputs is None:
        return []
    skipped = save_outputs_file(save_outputs, report.output_values)
    if skipped:
        report.warnings.append(f"--save-outputs: left out {', '.join(skipped)} (not tensors)")
    return [save_outputs]


def _grown(report: RunReport) -> bool:
    return report.growth is not None and report.growth.explained is False


def _fail(
    report: RunReport, model: str, device: str, compare_to: str | None, opt_level: str, strict_order: bool
) -> None:
    """Raise the run's failure, if any: outputs that differ, copies onnxruntime added, memory the copies do
    not explain, or (--strict-order) nodes out of the planned order."""
    _check_outputs(report, model, compare_to, opt_level)
    if report.undone_copies:
        raise _undone_error(model, device, report.undone_copies)
    if _grown(report):
        raise _growth_error(model, compare_to, report)
    if strict_order and not report.order.matches:
        raise OffloadError(
            f"{model}: nodes did not run in the planned (file) order",
            hint="run with PRIORITY_BASED order and --opt-level disable, or drop --strict-order",
        )


def _verdict_parts(report: RunReport, order: str, compare_to: str | None, planned: str | None) -> list[str]:
    """The verdict line's parts: latency, the order (and the one planned when it is another: the run's
    warning says what that costs), the copies' stream, the arena, the comparison."""
    parts = [f"median {report.latency_median * 1e3:.3f} ms", _order_text(report, order)]
    if planned is not None and planned != order:
        parts.append(f"planned for {EXECUTION_ORDERS[planned]}, run in {EXECUTION_ORDERS[order]}")
    if report.streams is not None:
        parts.append("copies on their own stream")
    if report.page_locked.weights:
        parts.append(f"{report.page_locked.weights} streamed weight(s) page-locked")
    parts += _memory_parts(report)
    if report.comparison is not None:
        identical = all(c.identical for c in report.comparison.values())
        parts.append(f"outputs {'bit-identical to' if identical else 'within tolerance of'} {compare_to}")
    return parts


def _order_text(report: RunReport, order: str) -> str:
    if order == "priority":
        return "order as planned" if report.order.matches else "order differs from the plan"
    return "DEFAULT order as predicted" if report.order.matches else "DEFAULT order differs from the prediction"


def _memory_parts(report: RunReport) -> list[str]:
    """The device's measured arena, as the verdict quotes it."""
    parts = []
    for figure in report.measured_memory or []:
        if figure.device == report.device:
            what = "arena peak" if figure.method == "allocator-stats" else "smallest arena limit that runs"
            parts.append(f"{figure.allocator} {what} {fmt_bytes(figure.peak_bytes)}")
    return parts


def _undone_error(model: str, device: str, undone: list[InsertedCopy]) -> OffloadError:
    """The failure of a run where onnxruntime inserted copies of its own next to the rewrite's."""
    return OffloadError(
        f"{model}: on {device} onnxruntime inserted {len(undone)} copy(ies) of its own next to the rewrite's, so "
        "the plan is undone there: "
        + "; ".join(f"{c.node} ({c.op}) moves {c.tensor!r}" for c in undone[:8])
        + (f"; and {len(undone) - 8} more" if len(undone) > 8 else ""),
        hint="rewrite the model with this version of offloadctl (its order pins read no host tensor on a device), "
        "or with --no-order-pins",
    )


def _growth_error(model: str, compare_to: str | None, report: RunReport) -> OffloadError:
    """The failure of a run whose measured memory is above the original's by more than the rewrite's
    copies account for (`offloadctl.running.growth`)."""
    growth = report.growth
    assert growth is not None and growth.copy_bytes is not None and growth.excess_bytes is not None
    moved = growth.moved
    order = report.execution_order.upper()
    planned = planned_execution_order(model)
    if planned is not None and planned != report.execution_order:
        cause = (
            f"the rewrite was planned for the {EXECUTION_ORDERS[planned]} order and ran in {order}, whose walk "
            "keeps its copies and nodes elsewhere"
        )
        hint = f"run it in the order it was planned for (--execution-order {planned}), or plan with --execution-order "
        hint += report.execution_order
    elif report.streams is not None:
        cause = "the copy stream issues each copy as its gate opens and onnxruntime plans the two streams' buffers "
        cause += "apart, which keeps more alive than the copies in line (apply --json's streams_cpu_peak predicts it)"
        hint = "apply the plan with --copies inline"
    else:
        cause = (
            f"{len(moved)} original node(s) ran at another place than in the original's {order} order (first: "
            f"{', '.join(moved[:5])}), so more of them are alive at once"
            if moved
            else f"the order that ran keeps more alive than the original's {order} order"
        )
        hint = (
            f"plan with --execution-order {report.execution_order} (its figures count the walk that runs), or apply "
            "the plan with --no-order-pins"
        )
    return OffloadError(
        f"{model}: onnxruntime's arena peaks at {fmt_bytes(growth.rewrite_bytes)}, "
        f"{fmt_bytes(growth.excess_bytes)} above {compare_to}'s {fmt_bytes(growth.original_bytes)} beyond what the "
        f"rewrite's copies account for ({fmt_bytes(growth.copy_bytes)}): {cause}",
        hint=hint,
    )


def _check_outputs(report: RunReport, model: str, compare_to: str | None, opt_level: str) -> None:
    """Fail when the rewrite changed the results; when the original itself is not deterministic on
    these inputs, say that instead: the comparison cannot tell, and the rewrite is not blamed."""
    differ = report.outputs_differ
    unstable = report.original_unstable
    blamed = [name for name in differ if name not in unstable]
    if blamed:
        hint = "the rewrite changed the results; check the plan and the session settings" + (
            "" if opt_level == "disable" else ", or compare with --opt-level disable"
        )
        if report.streams is not None:  # a possible cause of its own (docs/streams.md)
            hint = f"the rewrite changed the results: {STREAMS_DEFECT_HINT}; else {hint.split('; ', 1)[1]}"
        raise OffloadError(
            f"outputs of {model} differ from {compare_to} beyond tolerance (rtol={report.rtol}, atol={report.atol}): "
            f"{', '.join(blamed)}",
            hint=hint,
        )
    if differ:
        worst = ", ".join(
            f"{name} (up to {c.max_abs:.3g} between two runs)" if c.max_abs is not None else name
            for name, c in unstable.items()
        )
        raise OffloadError(
            f"{compare_to} is not deterministic on these inputs: two runs of it give different {worst}, so the "
            f"comparison cannot tell whether the rewrite {model} changed anything",
            hint="give inputs the model is deterministic on (--inputs FILE.npz: a real attention mask, real token "
            "ids), or compare with --opt-level disable",
        )


def _print_memory(report: RunReport) -> None:
    if not report.measured_memory:
        return
    table = Table(
        title=f"measured memory ({report.execution_order} order, one run of a fresh session)", show_edge=False
    )
    for col in ("allocator", "device", "peak", "after session creation", "activations", "allocations", "how"):
        table.add_column(col, justify="left" if col in ("allocator", "device", "how") else "right")
    for f in report.measured_memory:
        after = "?" if f.in_use_after_creation is None else fmt_bytes(f.in_use_after_creation)
        active = "?" if f.in_use_after_creation is None else fmt_bytes(f.peak_bytes - f.in_use_after_creation)
        how = "allocator statistics (MaxInUse)" if f.method == "allocator-stats" else "smallest arena limit that runs"
        table.add_row(f.allocator, f.device, fmt_bytes(f.peak_bytes), after, active, str(f.allocations or "-"), how)
    out_console().print(table)
    if report.growth is not None:
        _print_growth(report.growth)
    if any(f.device == "cpu" for f in report.measured_memory):
        out_console().print(
            "on the CPU provider device and host are one memory: its arena holds a rewrite's host copies too, so a "
            "rewrite can raise it; the device peak a plan lowers is simulate's (peak_bytes)",
            soft_wrap=True,
        )


def _print_growth(growth: MemoryGrowth) -> None:
    """The rewrite's measured peak against the original's, and what the arena's rounding adds."""
    copies = "unknown" if growth.copy_bytes is None else fmt_bytes(growth.copy_bytes)
    verdict = {True: "explained by the copies", False: "[bold red]more than the copies explain[/]", None: "-"}
    rounding = ""
    if growth.rounding_bytes:
        rounding = f", the arena's rounding {fmt_bytes(growth.rounding_bytes)}"
        verdict[True] = "explained by the copies and the arena's rounding"
    out_console().print(
        f"against the original: {fmt_bytes(growth.original_bytes)} -> {fmt_bytes(growth.rewrite_bytes)}, the "
        f"rewrite's copies {copies}{rounding}: {verdict[growth.explained]}",
        soft_wrap=True,
    )
    if growth.rounding_bytes:
        out_console().print(
            f"onnxruntime's arena rounds the rewrite's buffers up by {fmt_bytes(growth.rounding_bytes)} more than the "
            "original's (kNextPowerOfTwo regions: a large copy can take a region twice its size); a device arena "
            "does the same unless its provider is given arena_extend_strategy=kSameAsRequested (run's default on "
            "CANN; --ep-option arena_extend_strategy=kSameAsRequested on CUDA)",
            soft_wrap=True,
        )


def _copy_rows(setup: Table, report: RunReport) -> None:
    """The session table's rows on copies: those onnxruntime inserted, a stream of their own, and the
    device peak of the order that ran."""
    if report.inserted is not None:
        undone = len(report.undone_copies)
        text = f"{len(report.inserted)} (of them {undone} next to the rewrite's copies and pins)"
        if report.original_inserted is not None:
            text += f"; the original: {len(report.original_inserted)}"
        setup.add_row("copies onnxruntime inserted", f"[bold red]{text}[/]" if undone else text)
    if report.streams is not None:
        setup.add_row(
            "copies",
            f"on a stream of their own: {report.streams['copy_stream_nodes']} copy-stream nodes, partition file "
            f"{escape(report.streams['partition_file'])}",
        )
    if report.ran_peak_bytes is not None:
        setup.add_row("device peak, simulated in the order that ran", fmt_bytes(report.ran_peak_bytes))


def _print_report(report: RunReport) -> None:
    console = out_console()
    setup = Table(title="session", show_edge=False, show_header=False)
    setup.add_column(style="bold")
    setup.add_column()
    setup.add_row("model", escape(report.model))
    setup.add_row("device", f"{report.device} ({DEVICES[report.device]})")
    setup.add_row("providers in use", ", ".join(report.providers))
    setup.add_row("execution order", report.session["execution_order"])
    setup.add_row("optimizations", report.opt_level)
    setup.add_row("disabled optimizers", ", ".join(report.session["disabled_optimizers"]) or "-")
    for provider, options in report.session["provider_options"].items():
        setup.add_row(f"{provider} options", ", ".join(f"{k}={v}" for k, v in options.items()) or "-")
    setup.add_row(
        "latency",
        f"median {report.latency_median * 1e3:.3f} ms over {len(report.latency_runs)} runs "
        f"(min {min(report.latency_runs) * 1e3:.3f}, max {max(report.latency_runs) * 1e3:.3f}; 1 warm-up)",
    )
    order = report.order
    if order.matches:
        verdict = f"as planned ({order.ran_count} of {order.planned_count} planned nodes ran"
        verdict += ", order checked exactly)" if order.exact else ", relative order checked)"
    else:
        verdict = "[bold yellow]differs from the plan[/]"
    setup.add_row("order", verdict)
    _copy_rows(setup, report)
    console.print(setup)
    if not order.matches:
        console.print(_order_table(order))
    console.print(_outputs_table(report))


def _order_table(order: OrderCheck) -> Table:
    """The first differences between the planned order and the one that ran."""
    diffs = Table(title="first order differences", show_edge=False)
    for col in ("step", "planned", "ran"):
        diffs.add_column(col)
    for d in order.first_differences:
        diffs.add_row(str(d["index"]), escape(d["planned"]), escape(d["ran"]))
    if order.exact and order.missing:
        diffs.add_row(
            "-", escape(", ".join(order.missing[:5])) + (" …" if len(order.missing) > 5 else ""), "(did not run)"
        )
    return diffs


def _outputs_table(report: RunReport) -> Table:
    """Each output's shape and type, and with a comparison how it compares with the original's."""
    outputs = Table(
        title="outputs" if report.comparison is None else f"outputs vs {escape(str(report.compare_to))}",
        show_edge=False,
    )
    for col in ("output", "shape", "dtype"):
        outputs.add_column(col)
    if report.comparison is not None:
        for col in ("identical", "max abs", "max rel", "within tolerance"):
            outputs.add_column(col, justify="right")
    for name, desc in report.outputs.items():
        row = [escape(name), str(desc["shape"]), desc["dtype"]]
        if report.comparison is not None:
            row += _compared_cells(report.comparison[name])
        outputs.add_row(*row)
    return outputs


def _compared_cells(c: OutputComparison) -> list[str]:
    return [
        "yes" if c.identical else "no",
        "?" if c.max_abs is None else f"{c.max_abs:.3g}",
        "?" if c.max_rel is None else f"{c.max_rel:.3g}",
        "yes" if c.within_tolerance else "[bold red]no[/]" + (f" ({escape(c.note)})" if c.note else ""),
    ]


COMMANDS = [run]
