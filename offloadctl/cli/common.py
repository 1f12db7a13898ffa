"""Steps several commands share: load and analyse a model, summarise a plan, end with a verdict.

Every command that succeeds ends with one verdict line, as Polygraphy's ``PASSED | ...``: what ran
on which model, the peak before -> after and the estimated slowdown where they are known, and the
files written. Under ``--json`` the figures go into the one JSON document on stdout and the verdict
goes to stderr. A ``--max-peak`` gate that fails prints one ``FAILED | ...`` line on stderr and
exits 1 (the outputs are written first, so a CI job can keep them).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import shlex
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import click
from rich.markup import escape
from rich.table import Table

from offloadctl.analysis.graph import Analysis
from offloadctl.cli.options import ShapeOptions, SizesOptions
from offloadctl.cli.report import report_plot_path
from offloadctl.cli.ui import err_console, out_console, print_json, steps
from offloadctl.contract.document import check_plan_model
from offloadctl.core.errors import OffloadError
from offloadctl.core.files import check_distinct_outputs, check_output_path, sha256_file
from offloadctl.core.plantypes import BudgetRecord, Plan
from offloadctl.core.units import fmt_bytes
from offloadctl.job import Job, PlanPins
from offloadctl.loading.input_shapes import follows_from, parse_dims, parse_input_shapes
from offloadctl.simulation.base import is_rewritten

__all__ = [
    "open_model",
    "check_unknown_sizes",
    "print_plan_summary",
    "plan_figures",
    "gate_failure",
    "low_figures_text",
    "finish",
    "ModelArgs",
    "model_group",
    "Verdict",
    "check_report_paths",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelArgs:
    """The model group, as Polygraphy's ``ModelArgs``: MODEL with ``--input-shape``/``--dim``,
    ``--sizes-from-run``/``--inputs`` and ``--execution-order`` as given (those a command has), and what opens
    the model with them (`open`). A command gets it in ``model`` (`model_group`)."""

    path: str
    shapes: ShapeOptions
    sizes: SizesOptions | None = None
    order: str | None = None

    def open(
        self,
        *,
        show_progress: bool,
        plan: Plan | None = None,
        plan_path: str | None = None,
        path: str | None = None,
        sizes: SizesOptions | None = None,
    ) -> Job:
        """`open_model` with the group's options: the model (or ``path``, such as the graph onnxruntime
        optimized from it, and ``sizes`` for it), with a plan's pins where it has them."""
        return open_model(
            path or self.path,
            self.shapes,
            sizes or self.sizes,
            plan=plan,
            plan_path=plan_path,
            show_progress=show_progress,
            order=self.order,
        )


def model_group(f: Callable[..., Any]) -> Callable[..., Any]:
    """The model group's action, the last of a command's decorators: MODEL and its options (``model``,
    ``shapes``, ``sizes``, ``order``, those the command has) reach the command as one `ModelArgs`, in
    ``model``."""

    @functools.wraps(f)
    def command(*args: Any, **kwargs: Any) -> Any:
        group = ModelArgs(
            kwargs.pop("model"), kwargs.pop("shapes"), kwargs.pop("sizes", None), kwargs.pop("order", None)
        )
        return f(*args, model=group, **kwargs)

    return command


def open_model(
    model: str,
    shapes: ShapeOptions,
    sizes: SizesOptions | None = None,
    *,
    plan: Plan | None = None,
    plan_path: str | None = None,
    show_progress: bool = True,
    order: str | None = None,
) -> Job:
    """Load MODEL (weights stay on disk), pin input shapes and analyse it, with progress on a terminal.

    The pins are ``--input-shape`` and ``--dim``, else those of ``plan`` (a plan for this model, read
    from ``plan_path``, which the job then holds), else those a rewritten model records it was planned
    at (``offloadctl.planned_at``, which `run` uses too); sizes come from one run with ``--sizes-from-run``
    or when the plan's did. Positions count in ``order`` (``--execution-order``), else the plan's, else
    PRIORITY_BASED; an order that contradicts the plan's is an error.
    """
    input_shapes, dims, source, recorded = _pins(model, shapes, plan, plan_path, order)
    order = plan_order(plan, plan_path, order, recorded)
    requested = sizes.request() if sizes is not None else None
    if plan is not None:
        requested = requested or PlanPins.of(plan).sizes
    with steps(show_progress, total=2) as step:
        try:
            job = Job.of_model(
                model,
                input_shapes=input_shapes,
                dims=dims,
                sizes=requested,
                pins_from=source,
                step=step,
                order=order,
                infer_ahead=True,  # every command that opens a model here looks up sizes
            )
        except OffloadError:
            if plan is not None and source.endswith(f"of plan {plan_path}") and Path(model).is_file():
                check_plan_model(plan, sha256_file(model), model)  # the plan's pins fail: another model's plan
            raise
    if plan is not None and is_rewritten(job.analysis):  # refused by what reads the plan, with the reason
        job.plan, job.plan_path = plan, Path(plan_path) if plan_path else None
    elif plan is not None:
        job.with_plan(plan, plan_path)  # a plan made for another model is refused here
    _warn_dynamic(job.analysis)
    return job


def check_original(analysis: Analysis, what: str, hint: str) -> None:
    """Refuse a model that already holds copies where the original is needed (``what`` needs it)."""
    if is_rewritten(analysis):
        raise OffloadError(f"{analysis.loaded.path} already contains copies: {what} need the original model", hint=hint)


def _pins(
    model: str, shapes: ShapeOptions, plan: Plan | None, plan_path: str | None, order: str | None
) -> tuple[dict[str, list[int]], dict[str, int], str, str | None]:
    """(input shapes, dims, where they come from, the order a rewrite was planned for) a model is opened
    with: ``--input-shape`` and ``--dim``, else the plan's, else those a rewritten model records it was
    planned at (read once, and only when the pins or the ``order`` are not given)."""
    input_shapes, dims = parse_input_shapes(shapes.input_shape), parse_dims(shapes.dim)
    if plan is not None:
        if input_shapes or dims:
            return input_shapes, dims, "--input-shape", None
        pins = PlanPins.of(plan)
        return pins.input_shapes, pins.dims, f"model.input_shapes of plan {plan_path}", None
    if (input_shapes or dims) and order is not None:
        return input_shapes, dims, "--input-shape", None
    # a rewritten model records the shapes and the order its plan was made at (offloadctl.planned_at)
    from offloadctl.rewriting.metadata import planned_at

    planned, named, recorded = planned_at(model)
    if input_shapes or dims:
        return input_shapes, dims, "--input-shape", recorded
    return planned, named, f"offloadctl.planned_at of {model}" if planned or named else "--input-shape", recorded


def _warn_dynamic(analysis: Analysis) -> None:
    """Warn about graph inputs of unknown size: what depends on them is not offloaded."""
    dynamic = analysis.dynamic_inputs()
    if dynamic:
        logger.warning(
            "inputs with unknown dimensions: %s; tensors whose size depends on them are not offloaded (pin them "
            "at the sizes you run at, by the model's own dimension names: %s)",
            ", ".join(dynamic),
            pin_arguments(analysis, dynamic),
        )


def _unnamed(dim: Any) -> bool:
    """A dynamic dimension without a name: no name and no size, or a negative size (PaddleOCR's exports
    write -1)."""
    return not dim.dim_param and (not dim.HasField("dim_value") or dim.dim_value < 0)


def pin_arguments(analysis: Analysis, names: Sequence[str]) -> str:
    """The options that pin the dynamic dimensions of the graph inputs ``names``, to paste after the
    command with ``SIZE`` replaced by the sizes the model runs at: ``--dim NAME=SIZE`` for each named
    dimension (in the order the inputs declare them), and ``--input-shape 'INPUT=D0,...'`` for an input
    with an unnamed one (its fixed dimensions kept, ``SIZE`` for the others). No size is made up: a
    detector planned on a 1x1 image has figures that mean nothing, and ``SIZE`` pasted as it is is a usage
    error that names the option."""
    declared = {v.name: v for v in analysis.loaded.proto.graph.input}
    named: dict[str, None] = {}
    shapes: list[str] = []
    for name in names:
        value = declared.get(name)
        if value is None or not value.type.HasField("tensor_type"):
            continue
        dims = list(value.type.tensor_type.shape.dim)
        if any(map(_unnamed, dims)):
            sizes = ",".join(str(d.dim_value) if d.dim_value > 0 else "SIZE" for d in dims)
            shapes.append("--input-shape " + shlex.quote(f"{name}={sizes}"))
            continue
        named.update((d.dim_param, None) for d in dims if d.dim_param)
    # a sum such as Optimum's "past_sequence_length + sequence_length" follows from its parts
    ones = dict.fromkeys(named, 1)
    given = [d for d in named if not follows_from(d, ones)]
    pins = [*(f"--dim {shlex.quote(f'{d}=SIZE')}" for d in given), *shapes]
    return " ".join(pins) or "--input-shape NAME=D0,D1,... or --dim NAME=VALUE"


def print_points(dims: Mapping[str, int], result: Any, points: Sequence[Any]) -> None:
    """The peak and slowdown at each shape point, the plan's own first."""
    if not points:
        return
    table = Table(title="shape points", show_edge=False)
    for col in ("dimensions", "peak before", "peak after", "slowdown"):
        table.add_column(col, justify="left" if col == "dimensions" else "right")

    def row(d: Mapping[str, int], r: Any, mark: str = "") -> None:
        slow = "-" if r.times is None else f"{r.times.slowdown['serialized']:.2f}x"
        text = ", ".join(f"{k}={v}" for k, v in d.items()) or "(static)"
        table.add_row(escape(text) + mark, fmt_bytes(r.peak_before), fmt_bytes(r.peak_after), slow)

    row(dims, result, " (planned at)")
    for p in points:
        row(p.dims, p.result)
    out_console().print(table)


def points_failure(points: Sequence[Any], limit: int | None, what: str) -> str | None:
    """The failure when the peak after the plan passes ``limit`` at a shape point (None: it holds)."""
    if limit is None:
        return None
    over = [p for p in points if p.result.peak_after > limit]
    if not over:
        return None
    worst = max(over, key=lambda p: p.result.peak_after)
    dims = ", ".join(f"{k}={v}" for k, v in worst.dims.items())
    return (
        f"{len(over)} shape point(s) are above {what} {fmt_bytes(limit)}: at {dims} the peak after the plan is "
        f"{fmt_bytes(worst.result.peak_after)}"
    )


def plan_order(plan: Plan | None, plan_path: str | None, order: str | None, rewrite: str | None = None) -> str:
    """The execution order a command works in: ``order`` (``--execution-order``), else the plan's, else
    ``rewrite``, the one a rewritten model was planned for (its ``offloadctl.planned_at``), else
    ``priority``. A plan's positions count in its own order, so another one is refused; a rewrite looked
    at in another order than its plan's is what the command is asked for (what the rewrite costs there)."""
    recorded = PlanPins.of(plan).order if plan is not None else None
    if order is not None and recorded is not None and order != recorded:
        raise OffloadError(
            f"plan {plan_path} counts positions in the {recorded} execution order, not {order}",
            hint=f"drop --execution-order, or plan again with --execution-order {order}",
        )
    return order or recorded or rewrite or "priority"


def check_unknown_sizes(analysis: Analysis, *, strict: bool) -> list[str]:
    """Say when memory figures rest on tensors of unknown size (they count as 0 bytes): a warning,
    or with ``strict`` an error. Returns the names."""
    from offloadctl.analysis.timeline import unknown_tensors

    unknown = unknown_tensors(analysis)
    if not unknown:
        return unknown
    shown = ", ".join(unknown[:8]) + (" …" if len(unknown) > 8 else "")
    path = analysis.loaded.path
    dynamic = [n for n in analysis.graph_inputs if n in set(unknown)]
    if dynamic:
        pins = pin_arguments(analysis, dynamic)
        fix = f"pin the dynamic inputs ({', '.join(dynamic)}) at the sizes you run at: {pins}"
    else:  # every input is known: pinning would not help
        failed = analysis.infos.symbolic_failures
        stuck = f" (it could not follow {', '.join(f'{f.node!r} ({f.op_type})' for f in failed[:3])})" if failed else ""
        fix = (
            "shape inference cannot follow their shapes (data-dependent shapes, control flow, or ops it does not "
            f"know){stuck}; nothing to pin: --sizes-from-run reads every size from one run on onnxruntime's CPU "
            "provider instead"
        )
    if strict:
        raise OffloadError(
            f"{len(unknown)} tensor(s) of {path} have an unknown size, and --strict refuses figures that count them "
            f"as 0 bytes: {shown}",
            hint=fix + " (or drop --strict to accept the figures)",
        )
    logger.warning(
        "%d tensor(s) of %s have an unknown size and count as 0 bytes in every memory figure, so the figures may "
        "be low: %s (%s; --strict makes this an error)",
        len(unknown),
        path,
        shown,
        fix,
    )
    return unknown


class PlanFigures(TypedDict):
    """What a plan offloads, in numbers, as the planning commands' ``--json`` documents give it."""

    stage: str
    strategy: str
    offloads: dict[str, int]
    rejected: dict[str, int]
    budget: BudgetRecord | None


def plan_figures(plan: Plan) -> PlanFigures:
    """What a plan offloads, in numbers (for --json and the verdict)."""
    offloads = plan["offloads"]
    return {
        "stage": plan["stage"],
        "strategy": plan.get("strategy", "distance"),
        "offloads": {
            "count": len(offloads),
            "activations": sum(o["kind"] == "activation" for o in offloads),
            "parameters": sum(o["kind"] == "parameter" for o in offloads),
            "bytes": sum(o["bytes"] for o in offloads),
        },
        "rejected": dict(sorted(Counter(r["reason"] for r in plan["rejected"]).items())),
        "budget": plan.get("budget"),
    }


def low_figures_text(unknown: int) -> str | None:
    """What the verdict says when memory figures count tensors of unknown size as 0 bytes."""
    if not unknown:
        return None
    return f"figures low: {unknown} tensor(s) of unknown size count as 0 B"


def limits_text(budget: int | None = None, max_peak: int | None = None) -> str | None:
    """The limits a verdict was reached against, in the bytes they were understood as: ``budget 7.63 MiB
    (8,000,000 B)``, ``--max-peak ...``; None without either."""
    parts = [f"{name} {fmt_bytes(n)} ({n:,} B)" for name, n in (("budget", budget), ("--max-peak", max_peak)) if n]
    return ", ".join(parts) or None


def gate_failure(max_peak: int | None, peak: int, what: str, *, unknown: int = 0) -> str | None:
    """The one-line reason a ``--max-peak`` gate fails, or None when it passes (or is not set).

    A peak that counts ``unknown`` tensors of unknown size as 0 bytes is known to be low: the gate
    cannot pass on it."""
    if max_peak is None:
        return None
    if peak > max_peak:
        return f"{what} {fmt_bytes(peak)} ({peak} bytes) is above --max-peak {fmt_bytes(max_peak)} ({max_peak} bytes)"
    if unknown:
        return (
            f"{what} {fmt_bytes(peak)} is known to be low ({unknown} tensor(s) of unknown size count as 0 B), so "
            f"--max-peak {fmt_bytes(max_peak)} cannot pass on it: pin the dynamic dimensions (--input-shape, --dim) "
            "or read the sizes from one run (--sizes-from-run)"
        )
    return None


@dataclass(frozen=True)
class Verdict:
    """How a command ends: its verdict line (``PASSED | plan MODEL | ... | wrote ...``, or ``FAILED | ...``
    with the gate's failure) and its ``--json`` document (`to_json`).

    Attributes:
        command: the subcommand's name.
        subject: the model or plan it worked on.
        parts: figures for the verdict (None entries are left out).
        written: every file the command wrote.
        doc: the command's own fields of the JSON document.
        failure: the reason a gate failed (exit status 1); None when it passed.
    """

    command: str
    subject: str
    parts: tuple[str | None, ...] = ()
    written: tuple[str, ...] = ()
    doc: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    failure: str | None = None

    @property
    def passed(self) -> bool:
        return self.failure is None

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` document: ``command`` and ``passed``, the command's fields, ``files_written``."""
        return {"command": self.command, "passed": self.passed, **self.doc, "files_written": list(self.written)}

    def line(self) -> str:
        """The verdict line."""
        head = f"{self.command} {self.subject}"
        if self.failure is not None:
            return f"FAILED | {head} | {self.failure}"
        fields = [head, *(p for p in self.parts if p)]
        if self.written:
            fields.append("wrote " + ", ".join(self.written))
        return "PASSED | " + " | ".join(fields)


def finish(
    command: str,
    subject: str,
    parts: Sequence[str | None],
    written: Sequence[str | Path],
    *,
    as_json: bool,
    doc: dict[str, Any] | None = None,
    failure: str | None = None,
) -> None:
    """End a command with its `Verdict`: the JSON document (under --json) on stdout, then the verdict line
    (on stderr under --json or for a failure, whose exit status is 1)."""
    verdict = Verdict(command, subject, tuple(parts), tuple(str(f) for f in written), doc or {}, failure)
    if as_json:
        print_json(verdict.to_json())
    if not verdict.passed:
        err_console().print(verdict.line(), markup=False, highlight=False, soft_wrap=True)
        raise click.exceptions.Exit(1)
    console = err_console() if as_json else out_console()
    console.print(verdict.line(), markup=False, highlight=False, soft_wrap=True)


def check_report_paths(
    report: str | None, *inputs: Any, others: Sequence[tuple[str, Any]] = (), plot: str | None = None
) -> Path | None:
    """Refuse a report (or the plot beside it) that would overwrite an input (``inputs``: what the
    command reads) or another output of the command (``others``: (what, path) pairs); return the
    plot path. ``plot`` is a plot the user asked for, which the report then links to."""
    if report is None:
        return None
    check_output_path(report, *inputs)
    drawn = Path(plot) if plot else report_plot_path(report)
    if not plot:
        check_output_path(drawn, *inputs)
    outputs = [("the report", report), ("the report's plot", drawn), *[(w, p) for w, p in others if p is not None]]
    check_distinct_outputs(outputs)
    return drawn


def print_plan_summary(plan: Plan) -> None:
    """One short table of what a plan offloads, and why the rest is not."""
    offloads = plan["offloads"]
    console = out_console()
    acts = [o for o in offloads if o["kind"] == "activation"]
    params = [o for o in offloads if o["kind"] == "parameter"]
    table = Table(title=f"plan ({plan['stage']})", show_edge=False)
    table.add_column("kind")
    table.add_column("offloaded", justify="right")
    table.add_column("bytes", justify="right")
    table.add_column("H2D copies", justify="right")
    for label, group in (("activation", acts), ("parameter", params)):
        table.add_row(
            label,
            str(len(group)),
            fmt_bytes(sum(o["bytes"] for o in group)),
            str(sum(len(o["reload_groups"]) + (o["output_h2d_before"] is not None) for o in group)),
        )
    console.print(table)
    reasons = Counter(r["reason"] for r in plan["rejected"])
    if reasons:
        console.print("not offloaded: " + ", ".join(f"{v} {k}" for k, v in sorted(reasons.items())))
