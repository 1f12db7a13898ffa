"""`offloadctl apply PLAN.json -o OUT.onnx [--model MODEL]`: rewrite a model by a scheduled plan."""

from __future__ import annotations

import dataclasses
import functools
import logging
from pathlib import Path
from typing import Any

import click

from offloadctl.analysis.graph import Analysis
from offloadctl.cli.common import finish, low_figures_text
from offloadctl.cli.figure_lines import peak_text, plan_effect, print_estimate, slowdown_text, warn_broken_pins
from offloadctl.cli.options import json_option, output_option
from offloadctl.cli.ui import out_console, steps
from offloadctl.contract.document import read_plan
from offloadctl.core.files import check_output_path
from offloadctl.core.plantypes import Plan
from offloadctl.core.units import fmt_bytes
from offloadctl.job import Job, genai_output_folder, genai_source, plan_model
from offloadctl.rewriting.modes import CopyChoice, choose_copy_mode, plan_device
from offloadctl.rewriting.preview import StreamsCost, streams_cost
from offloadctl.rewriting.rewrite import TARGETS, ApplyResult, RewriteOptions, target_for
from offloadctl.simulation.costs import COPY_MODES
from offloadctl.simulation.estimate import Estimate, recorded_estimate

__all__ = ["COMMANDS"]

logger = logging.getLogger(__name__)


@click.command("apply")
@click.argument("plan_path", metavar="PLAN", type=click.Path(path_type=str))
@output_option("the rewritten model")
@click.option(
    "--model",
    type=click.Path(path_type=str),
    default=None,
    help="The model the plan was made for (default: the plan's model.path).",
)
@click.option(
    "--no-order-pins",
    "order_pins",
    flag_value=False,
    default=True,
    help="Leave out the no-op views that hold each copy where it was planned in onnxruntime's DEFAULT order; "
    "the plan then holds only under PRIORITY_BASED (Python hosts).",
)
@click.option(
    "--pin-shapes",
    is_flag=True,
    help="Keep the input dimensions the plan was made at pinned in the rewritten model (by default it keeps the "
    "model's symbolic dimensions, so it runs at any shape).",
)
@click.option(
    "--target",
    type=click.Choice(list(TARGETS)),
    default="gpu",
    show_default=True,
    help="The provider the model will run on, for the order pins' form: gpu (CPU, CUDA, WebGPU: a pin reads a "
    "device tensor only through Shape) or ascend (CANN has no Shape kernel, so such a pin would copy the tensor "
    "to the host: those copies go unpinned and hold only under PRIORITY_BASED).",
)
@click.option(
    "--copies",
    type=click.Choice(list(COPY_MODES)),
    default=None,
    help="How the copies run (default: as the plan was made, plan --copies; given, it overrides the plan with a "
    "warning). inline: the copies run on the compute stream, each paid in full time. streams: on a stream of their "
    "own, "
    "beside compute, on CUDA and CANN (onnxruntime's multi-stream executor): gates and fences are added as Identity "
    "nodes and a partition file is written beside OUT (OUT's stem + .streams.json), which the model's metadata "
    "names (offloadctl.streams) and offloadctl run loads. WebGPU and the CPU run the copies in line either way.",
)
@json_option
def apply(
    plan_path: str,
    output: str,
    model: str | None,
    order_pins: bool,
    pin_shapes: bool,
    target: str,
    copies: str | None,
    as_json: bool,
) -> None:
    """Insert the copies of a scheduled plan into its model and write OUT.onnx.

    The input model is not modified. Run the result with `offloadctl run`, or in your own
    onnxruntime session with the settings recorded in its metadata (offloadctl.session):
    ConstantFolding disabled, and PRIORITY_BASED execution order where the host can set it (order
    pins hold the copies in place in the DEFAULT order, the only one C, C++, C#, Java,
    onnxruntime-genai and Triton hosts run). The rewritten model keeps the source's dynamic
    dimensions unless --pin-shapes. The peak and time figures are those `offloadctl plan`
    recorded in the plan (`simulate OUT` computes them for the rewritten model).
    """
    plan = read_plan(plan_path, stages=("scheduled",))
    source = plan_model(plan, plan_path, model)
    _warn_target(plan, target, order_pins)
    result = ApplyResult()
    # a genai model's rewrite is a new genai folder, made here (of the model optimized from, with --opt-level)
    with genai_output_folder(genai_source(plan, source), output):
        check_output_path(output, plan_path, source)  # before the model loads
        with steps(not as_json, total=4) as step:
            job = Job.of_plan(plan_path, stages=("scheduled",), model=model, step=step, plan=plan)
            choice = choose_copy_mode(plan, copies)
            if choice.why is not None:
                logger.warning("%s", choice.why)
            # asked by name: written on streams even where they would peak higher
            asked = copies == "streams"
            options = RewriteOptions(order_pins, pin_shapes, target, choice.mode, streams_above_inline=asked)
            _, extra = job.write_rewrite(output, result=result, step=step, options=options)
    written = _Written(plan, choice, result, job.analysis, options)
    if not as_json:
        _print_apply(result, extra, written.figures)
    written.warn()
    parts = [f"{job.model_path} -> {output}", f"{result.d2h} D2H + {result.h2d} H2D copies", *written.parts(output)]
    doc = written.doc(str(job.model_path), plan_path, output, extra)
    finish("apply", plan_path, parts, [output, *extra], as_json=as_json, doc=doc)


@dataclasses.dataclass
class _Written:
    """What apply wrote for a plan, and what its verdict says of it: the plan's figures are quoted only for a
    rewrite written in the mode they count."""

    plan: Plan
    choice: CopyChoice
    result: ApplyResult
    analysis: Analysis
    options: RewriteOptions

    @property
    def fell_back(self) -> bool:
        """Planned and asked on streams, written in line (no copy a gate holds, or a higher peak on streams)."""
        return self.choice.mode == "streams" and self.result.copy_mode == "inline"

    @functools.cached_property
    def figures(self) -> Estimate | None:
        if (self.choice.overridden or self.fell_back) and self.plan["offloads"]:
            return None
        return recorded_estimate(self.plan)

    @functools.cached_property
    def cost(self) -> StreamsCost | None:
        if self.result.copy_mode != "streams":
            return None
        return streams_cost(self.plan, self.analysis, target=self.options.target)

    def warn(self) -> None:
        _warn_streams_cost(self.cost)
        if self.figures is not None:
            warn_broken_pins(self.figures.peak, self.plan["model"].get("execution_order", "priority"))

    def parts(self, output: str) -> list[str | None]:
        """The verdict's parts after the copies: the mode written, what went in line, the plan's figures."""
        result, copies, parts = self.result, self.result.copy_mode, []
        if self.choice.overridden:
            parts.append(
                f"copies written {copies}, planned {self.choice.planned}"
                if self.plan["offloads"]
                else "no copies: nothing to overlap, no partition file"
            )
        if self.fell_back:
            parts.append(f"copies written inline: {result.written_in_line}")
        if result.in_line and copies == "streams":
            parts.append(f"{len(result.in_line)} load(s) in line")
        if result.unpinned and self.options.order_pins:
            parts.append(f"{len(result.unpinned)} unpinned group(s) hold under PRIORITY_BASED only")
        if self.figures is None:
            return [*parts, f"peak and time: offloadctl simulate {output}"]
        figures = self.figures
        words, raised = plan_effect(figures.peak, self.plan, bodies_bytes=figures.bodies_at_peak_bytes)
        return [
            *parts,
            peak_text(figures.peak),
            words or (raised and "the plan raises the peak"),
            slowdown_text(figures),
            low_figures_text(figures.unknown_size_tensors),
        ]

    def doc(self, model: str, plan_path: str, output: str, extra: list[Path]) -> dict[str, Any]:
        """The --json document."""
        result = self.result
        return {
            "model": model,
            "plan": plan_path,
            "output": output,
            # across: the copies between host and device written for the plan's device (plan --device)
            "copies": {"d2h": result.d2h, "h2d": result.h2d, "across": result.across},
            "order_pins": result.pins,
            "unpinned": result.unpinned,
            "target": self.options.target,
            "copy_mode": result.copy_mode,
            "loads_in_line": result.in_line,
            "written_in_line": result.written_in_line,  # why copies on streams were written in line, or None
            "planned_copy_mode": self.choice.planned,
            "partition_file": next((str(p) for p in extra if p.suffix == ".json"), None),
            "guards": result.guards,
            "streams_cpu_peak": self.cost.to_json() if self.cost is not None else None,
            "offloaded": {"activations": result.activations, "parameters": result.parameters},
            "data_files": [str(p) for p in extra],
            # recorded by `offloadctl plan`; None for a plan made otherwise
            "estimate": self.figures.to_json() if self.figures is not None else None,
        }


def _print_apply(result: ApplyResult, extra: list[Path], figures: Estimate | None) -> None:
    """What apply wrote, for a person: the copies and pins, the files beside the model, the plan's figures."""
    console = out_console()
    console.print(
        f"inserted {result.d2h} device-to-host and {result.h2d} host-to-device copies "
        f"({result.activations} activation(s), {result.parameters} weight(s) offloaded)",
        soft_wrap=True,
    )
    if result.pins:
        console.print(f"held the copies in place with {result.pins} order pin(s) (no-op views)", soft_wrap=True)
    if result.across:
        console.print(
            f"wrote {result.across} copy(ies) between host and device where the plan's device needs them "
            "(onnxruntime would append them after every node)",
            soft_wrap=True,
        )
    if result.in_line and result.copy_mode == "streams":
        console.print(
            f"left {len(result.in_line)} load(s) in line, on the compute stream: no gate holds them, or issued as "
            "their gate opens they would keep more alive than the rewrite in line",
            soft_wrap=True,
        )
    if result.guards:
        console.print(
            f"guarded {len(result.guards)} node(s) that onnxruntime's multi-stream planner would let overwrite a "
            "buffer other nodes still read (an Identity each: docs/streams.md)",
            soft_wrap=True,
        )
    for reason in result.unpinned:
        console.print(f"[yellow]not pinned (holds under PRIORITY_BASED only)[/]: {reason}", soft_wrap=True)
    for path in extra:
        what = "the partition file that puts the copies on a stream of their own" if path.suffix == ".json" else ""
        console.print(f"placed {path} beside the rewritten model" + (f": {what}" if what else ""), soft_wrap=True)
    if figures is not None:
        print_estimate(figures, what="planned")


#: a streams rewrite whose CPU arena peaks this much above the same plan's in-line rewrite gets a warning
STREAMS_COST_WARNING = 0.10


def _warn_streams_cost(cost: StreamsCost | None) -> None:
    """Warn when the rewrite with its copies on their own stream keeps much more live than in line."""
    if cost is None or cost.extra_bytes <= STREAMS_COST_WARNING * cost.inline.peak_bytes:
        return
    logger.warning(
        "with its copies on their own stream the rewrite keeps more alive than in line: the CPU arena peaks at %s "
        "against %s (+%.0f%%; the copy stream issues each copy as its gate opens, where in line a copy may run "
        "later, and onnxruntime plans the two streams' buffers apart), and a device runs the same executor; check "
        "the device with offloadctl run --measure-memory, or apply with --copies inline",
        fmt_bytes(cost.streams.peak_bytes),
        fmt_bytes(cost.inline.peak_bytes),
        100 * cost.extra_bytes / cost.inline.peak_bytes,
    )


def _warn_target(plan: Plan, target: str, order_pins: bool) -> None:
    """Warn when a plan made for a device is written with the pins of another target: its figures
    count the pins its own target takes (`offloadctl.rewriting.rewrite.target_for`)."""
    name = plan_device(plan)
    want = target_for(name) if name else target
    if order_pins and target != want:
        logger.warning(
            "this plan was made for %s (plan --device %s): its figures count the pins of --target %s, not those of "
            "--target %s; add --target %s",
            name,
            name,
            want,
            target,
            want,
        )


COMMANDS = [apply]
