"""The simulator's report (`SimResult`) and `simulate`, which makes it.

`simulate` builds the program of a model with a plan (or of a rewritten model, or of the model as
it is), traces its memory before and after, bounds it from below, and estimates its time on a
device profile. `SimResult.to_json` is the document ``offloadctl simulate --json`` prints.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from offloadctl.analysis.graph import Analysis
from offloadctl.analysis.timeline import subgraph_memory
from offloadctl.core.plantypes import Plan
from offloadctl.simulation.memory import MemoryTrace, base_lower_bound, before_trace, trace
from offloadctl.simulation.profiles import DEFAULT_PROFILE, Profile, load_profile
from offloadctl.simulation.program import before_program, program_for
from offloadctl.simulation.timing import TimeFigures, node_costs, scratched, times

__all__ = ["CONVENTION", "SimResult", "simulate"]

CONVENTION = (
    "working set of a step = every tensor alive while it runs (outputs allocated before inputs are freed) "
    "+ resident weights; unknown-size tensors count as 0 bytes"
)


@dataclass(frozen=True)
class SimResult:
    """What the simulator found; `to_json` gives the document `offloadctl simulate --json` prints."""

    model: str
    rewritten: bool
    plan_path: str | None
    before: MemoryTrace
    after: MemoryTrace
    lower_bound_bytes: int
    lower_bound_position: int | None
    lower_bound_node: str | None
    transfer_bytes: dict[str, int]
    copies: dict[str, int]
    unknown_tensors: list[str]
    profile: Profile | None
    times: TimeFigures | None
    # bytes at the peak (after the plan) that live inside If/Loop/Scan bodies, which are not planned in
    bodies_at_peak: int = 0

    @property
    def peak_before(self) -> int:
        return self.before.peak_bytes

    @property
    def peak_after(self) -> int:
        return self.after.peak_bytes

    def timeline(self) -> list[dict[str, Any]]:
        """One row per step of the "after" program, with the unplanned working set at node steps."""
        rows = []
        after = self.after
        for s in range(len(after.kinds)):
            pos = after.positions[s]
            rows.append(
                {
                    "step": s,
                    "kind": after.kinds[s],
                    "position": pos,
                    "node": after.labels[s],
                    "before": self.before.device[pos] if after.kinds[s] == "node" else None,
                    "after": after.device[s],
                    "host": after.host[s],
                }
            )
        return rows

    def to_json(self, *, timeline_limit: int | None = 10_000) -> dict[str, Any]:
        steps = len(self.after.kinds)
        doc: dict[str, Any] = {
            "model": self.model,
            "rewritten": self.rewritten,
            "plan": self.plan_path,
            "convention": CONVENTION,
            "peak_bytes": {
                "before": self.peak_before,
                "after": self.peak_after,
                "saved": self.peak_before - self.peak_after,
            },
            "peak_at": {"before": self.before.at(self.before.peak_step), "after": self.after.at(self.after.peak_step)},
            "lower_bound_bytes": self.lower_bound_bytes,
            "lower_bound_at": {"position": self.lower_bound_position, "node": self.lower_bound_node},
            "resident_weight_bytes": {"before": self.before.resident_device, "after": self.after.resident_device},
            "transfer_bytes": dict(self.transfer_bytes),
            "copies": dict(self.copies),
            "host_peak_bytes": self.after.host_peak_bytes,
            "bodies_at_peak_bytes": self.bodies_at_peak,
            "unknown_size": {
                "count": len(self.unknown_tensors),
                "counted_as_bytes": 0,
                "tensors": self.unknown_tensors[:100],
            },
            "profile": self.profile.to_json() if self.profile is not None else None,
            "time_s": None,
            "time_nodes": None,
            "stall_s": None,
            "slowdown": None,
        }
        if self.times is not None:
            t = self.times
            doc["time_s"] = {"baseline": t.baseline, "serialized": t.serialized, "overlapped": t.overlapped}
            doc["time_nodes"] = {
                "total": t.nodes,
                "measured": t.measured_nodes,
                "estimated": t.nodes - t.measured_nodes,
            }
            doc["stall_s"] = t.stall
            doc["slowdown"] = t.slowdown
        if timeline_limit is None or steps <= timeline_limit:
            doc["timeline"] = self.timeline()
        else:
            doc["timeline"] = None
            doc["timeline_omitted"] = f"{steps} steps > limit {timeline_limit} (raise it with --timeline-limit)"
        return doc


def simulate(
    analysis: Analysis,
    plan: Plan | None = None,
    *,
    profile: Profile | str | None = DEFAULT_PROFILE,
    plan_source: str = "plan",
    planned_here: bool = False,
) -> SimResult:
    """Simulate memory (and time, with a profile) of a model, with a scheduled plan or without one.

    Args:
        analysis: the analysed model: an original model, or one already rewritten by apply.
        plan: a scheduled plan for this model (None: no plan). Not allowed for a rewritten model.
        profile: a `Profile`, a bundled profile name or a profile file; None skips the time model.
            The kernel scratch a measured profile records counts in the memory figures
            (`offloadctl.simulation.timing.scratched`).
        plan_source: how to name the plan in error messages (e.g. its file).
        planned_here: the plan was just made from this analysis by a planner, so what it states
            about the model is not checked again (`offloadctl.contract.check.check_plan_for_model`).

    Raises:
        OffloadError: the plan is not scheduled, belongs to another model, or contradicts it.
    """
    prof = load_profile(profile) if isinstance(profile, str) else profile
    analysis = scratched(analysis, prof)
    base, program = program_for(analysis, plan, plan_source, checked=planned_here)
    before = before_trace(base)  # the same for every plan: traced once per base
    after = before if program is before_program(base) else trace(program, base)
    moved = {"d2h": 0, "h2d": 0}
    copies = {"d2h": 0, "h2d": 0}
    for s, kind in enumerate(program.kinds):
        if kind != "node":
            copies[kind] += 1
            moved[kind] += program.sizes[program.reads[s][0]]
    bound, at = base_lower_bound(base)
    step = after.peak_step
    bodies = subgraph_memory(analysis).bodies
    bodies_at_peak = 0
    if step is not None and program.kinds[step] == "node" and not base.rewritten:
        bodies_at_peak = bodies.get(program.positions[step], 0)
    estimate = None
    if prof is not None:
        estimate = times(program, node_costs(base, prof), prof)
    return SimResult(
        model=str(analysis.loaded.path),
        rewritten=base.rewritten,
        plan_path=None,
        before=before,
        after=after,
        lower_bound_bytes=bound,
        lower_bound_position=at,
        lower_bound_node=(base.labels[at] if at < base.n else "end of run (graph outputs)") if at is not None else None,
        transfer_bytes=moved,
        copies=copies,
        unknown_tensors=list(base.unknown),
        profile=prof,
        times=estimate,
        bodies_at_peak=bodies_at_peak,
    )
