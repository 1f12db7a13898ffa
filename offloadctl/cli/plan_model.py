"""The plan command's model group: the model a plan is made for, opened (`PlanModel`: at
``--opt-level`` the graph onnxruntime optimized from it, written beside the plan), the request for the
device it runs on, and the shape point it is planned at."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Iterator
from pathlib import Path
from shlex import quote

from offloadctl.analysis.graph import Analysis
from offloadctl.cli.common import ModelArgs, check_original, check_report_paths, check_unknown_sizes
from offloadctl.cli.options import SizesOptions
from offloadctl.cli.plan_lines import host_placement
from offloadctl.cli.report import write_report
from offloadctl.cli.ui import out_console
from offloadctl.core.errors import OffloadError
from offloadctl.core.files import check_output_path, written_through
from offloadctl.core.units import fmt_bytes
from offloadctl.job import Job
from offloadctl.planning.advice import NextStep
from offloadctl.planning.passes import Planning
from offloadctl.planning.request import PlanRequest
from offloadctl.running.optimize import OptimizedModel, optimized_model, optimized_outputs, optimized_path
from offloadctl.simulation.points import largest_point, parse_point

__all__ = ["PlanModel", "as_asked", "optimized_outputs_for"]

logger = logging.getLogger(__name__)


def optimized_outputs_for(output: str, opt_level: str) -> list[Path]:
    """What ``plan --opt-level`` writes beside the plan (nothing at ``disable``)."""
    return list(optimized_outputs(output)) if opt_level != "disable" else []


@dataclasses.dataclass
class PlanModel:
    """The model a plan is made for, opened (the plan command's model group): the model asked for, or at
    ``--opt-level`` the graph onnxruntime optimized from it, written beside the plan."""

    job: Job
    optimized: OptimizedModel | None

    @classmethod
    def of(cls, model: ModelArgs, output: str, opt_level: str, device: str | None, as_json: bool) -> PlanModel:
        optimized = _optimized(model.path, output, opt_level, device) if opt_level != "disable" else None
        if optimized is None:
            job = model.open(show_progress=not as_json)
        else:  # shape inference knows no com.microsoft operator: sizes from a run unless asked otherwise
            sizes = model.sizes if model.sizes is not None and model.sizes.request() is not None else None
            sizes = sizes or SizesOptions(sizes_from_run=True, inputs=None)
            job = model.open(path=str(optimized.path), sizes=sizes, show_progress=not as_json)
        job.guard("the plan", output)
        return cls(job, optimized)

    def prepare(
        self,
        output: str,
        request: PlanRequest,
        device: str | None,
        report: str | None,
        strict: bool,
        max_peak: int | None,
        shape_points: tuple[str, ...],
        as_json: bool,
    ) -> tuple[Analysis, PlanRequest, list[dict[str, int]]]:
        """The analysis the plan is made on (at the largest shape point on a budget), the request with what
        ``device`` runs on the host, and the shape points; refuses what the model cannot be planned with."""
        analysis = self.job.analysis
        if report is not None:
            check_report_paths(report, *self.job.reads, others=[("the plan", output)])
        check_unknown_sizes(analysis, strict=strict)
        request = request.with_host(host_placement(analysis, device, as_json))
        if max_peak is not None or report is not None:
            hint = "check the rewritten model with offloadctl simulate MODEL --max-peak BYTES --report FILE.md"
            check_original(analysis, "--max-peak and --report", hint)
        points = [parse_point(p) for p in shape_points]
        if points and request.budget.uses_budget:
            analysis, points = _largest_point(analysis, points, as_json)
        return analysis, request, points

    def next_step_of_source(self, done: Planning, level: str) -> Planning:
        """``done`` with a weak plan's next step planning the model asked for, not the optimized graph."""
        if self.optimized is None or done.next_step is None:
            return done
        return dataclasses.replace(done, next_step=_of_source(done.next_step, self.optimized, level))

    def written(self, output: str, report: str | None, done: Planning) -> list[str | Path]:
        """The files the command wrote: the plan, the optimized graph and its data, the report."""
        made = [self.optimized.path, *self.optimized.data_files] if self.optimized else []
        written: list[str | Path] = [output, *made]
        if report is not None and done.simulation is not None and done.plan is not None:
            written += write_report(report, done.simulation, done.plan)
        return written


def _largest_point(
    analysis: Analysis, points: list[dict[str, int]], as_json: bool
) -> tuple[Analysis, list[dict[str, int]]]:
    """`offloadctl.simulation.points.largest_point`, saying so when the plan is made at another point."""
    analysis, points, worst = largest_point(analysis, points)
    if worst is not None and not as_json:
        dims = ", ".join(f"{d}={v}" for d, v in worst.dims.items())
        out_console().print(f"planning at the largest shape point, {dims} (peak {fmt_bytes(worst.result.peak_before)})")
    return analysis, points


def _optimized(model: str, output: str, level: str, device: str | None) -> OptimizedModel:
    """``plan --opt-level``: the graph onnxruntime runs at ``level`` for ``device``, written beside the plan
    (`offloadctl.running.optimize`), which is then the model planned; says when another level was made."""
    if written_through(output):
        raise OffloadError(
            f"--opt-level writes the optimized graph beside the plan, and {output} is not a file",
            hint="give -o the path of a plan file, or plan without --opt-level",
        )
    out = optimized_path(output)
    for path in optimized_outputs(output):
        check_output_path(path, model)
    made = optimized_model(model, out, level, device)
    if made.why is not None:
        logger.warning("planned at --opt-level %s, not %s: %s", made.level, level, made.why)
    return made


@contextlib.contextmanager
def as_asked(model: str, output: str, level: str) -> Iterator[None]:
    """A failure of ``plan --opt-level`` names the model asked for at its level, not the optimized graph,
    which the failure leaves unwritten."""
    try:
        yield
    except OffloadError as exc:
        if level != "disable":
            written = str(optimized_path(output))
            exc.restate(exc.message.replace(written, f"{model} (at --opt-level {level})"), exc.hint)
        raise


def _of_source(step: NextStep, optimized: OptimizedModel, level: str) -> NextStep:
    """A weak plan's next step with the model asked for and ``--opt-level``, not the optimized graph."""
    return step.with_command(
        step.command.replace(quote(str(optimized.path)), f"{quote(optimized.source)} --opt-level {level}", 1)
    )
