"""The simulate command's model group: the model opened with its plan's pins and its outputs checked
(`opened`), and the simulation it reports (`Simulated`): of the model as the device its plan or its
rewrite was made for runs it, on that device's profile by default."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from offloadctl.analysis.graph import Analysis
from offloadctl.cli.common import ModelArgs, check_report_paths, check_unknown_sizes
from offloadctl.core.files import check_output_path
from offloadctl.core.plantypes import Plan
from offloadctl.core.units import fmt_bytes
from offloadctl.job import Job
from offloadctl.planning.advice import weak_plan_advice
from offloadctl.planning.request import profile_for
from offloadctl.rewriting.modes import plan_device, planned_copy_mode
from offloadctl.rewriting.preview import as_it_runs
from offloadctl.simulation.profiles import Profile, load_profile
from offloadctl.simulation.result import SimResult, simulate

__all__ = ["Simulated", "opened"]

logger = logging.getLogger(__name__)


def opened(
    model: ModelArgs,
    plan: Plan | None,
    plan_path: str | None,
    plot: str | None,
    report: str | None,
    strict: bool,
    as_json: bool,
) -> Job:
    """The model opened with the plan's pins (or the options'), its outputs checked before any work."""
    if plot:
        check_output_path(plot, model.path, plan_path)
    check_report_paths(report, model.path, plan_path, plot=plot)  # with --plot the report links to that image
    job = model.open(plan=plan, plan_path=plan_path, show_progress=not as_json)
    check_unknown_sizes(job.analysis, strict=strict)
    if plot:
        job.guard("the plot", plot)
    check_report_paths(report, *job.reads, plot=plot)
    return job


@dataclasses.dataclass
class Simulated:
    """The simulation the command reports: of the model as its device runs it (a rewrite's copy stream run
    as the executor runs it), on the profile of the device the plan or the rewrite was made for by default."""

    result: SimResult
    doc: dict[str, Any]
    profile: Profile
    profile_name: str
    streams: list[list[str]] | None
    runs_on: str

    @classmethod
    def of(
        cls,
        job: Job,
        model: str,
        plan: Plan | None,
        plan_path: str | None,
        profile: str | None,
        timeline_limit: int,
    ) -> Simulated:
        ran, partition, streams, runs_on = as_it_runs(model, job.analysis)  # a rewrite's device memory: as it runs
        # a plan made for a device, or a rewrite of one: that device's profile by default
        name = profile_for(profile, (plan_device(plan) if plan else "") or runs_on or None)
        prof = load_profile(name)
        result = simulate(ran, plan, profile=prof, plan_source=f"plan file {plan_path}")
        result = dataclasses.replace(result, plan_path=plan_path)
        doc = result.to_json(timeline_limit=timeline_limit)
        doc["copy_streams"] = partition
        return cls(result, doc, prof, name, streams, runs_on)

    def copies(self, plan: Plan | None) -> str:
        """How the copies run: on streams for a rewrite with its partition file, else as planned."""
        if self.streams is not None:
            return "streams"
        return planned_copy_mode(plan) if plan is not None else "inline"

    def advise(self, analysis: Analysis, plan: Plan | None) -> None:
        """A weak plan's advice."""
        if plan is not None and not self.result.rewritten:
            if warning := weak_plan_advice(analysis, plan, result=self.result):
                logger.warning("%s", warning)

    def as_device_runs(self, parts: list[str | None], plan: Plan | None) -> None:
        """A rewrite of a plan made for a device is quoted as that device runs it (its original as the device
        runs it is simulate ORIGINAL --plan PLAN's)."""
        if self.runs_on and plan is None:
            parts[0] = f"peak {fmt_bytes(self.result.peak_after)} as {self.runs_on} runs it"
            self.doc["device"] = self.runs_on
