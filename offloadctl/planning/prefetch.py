"""The prefetch stage: where each host-to-device copy runs, and when device buffers are released.

Each reload group's H2D moves ``prefetch_distance`` positions before the group's first use; a
per-tensor ``prefetch_distance`` in the plan wins over the global value. It is clamped so that it
never runs before its D2H (activations: not before position d2h_after + 1) or before position 0
(weights). The H2D feeding an offloaded graph output stays at the end: nothing waits for it
earlier, and moving it would only hold device memory longer.

Release (HyperOffload release_distance): the device buffer of an offloaded activation may be
reused only after its D2H finished and after position (last device use + release_distance), the
last device use being the producer when every use is reloaded.

Both positions follow the rules of `offloadctl.analysis.timeline` (`h2d_position`, `release_point`), which
the simulator and the budget strategy use too.
"""

from __future__ import annotations

import math

import numpy as np

from offloadctl.analysis import timeline
from offloadctl.analysis.graph import Analysis
from offloadctl.analysis.timeline import h2d_low, h2d_position, release_point
from offloadctl.contract.document import advance_stage, record_stage, require_stage
from offloadctl.core.bulk import paused_gc
from offloadctl.core.plantypes import Offload, Plan
from offloadctl.planning.request import PrefetchPart, recorded
from offloadctl.simulation.costs import CopyTiming

__all__ = ["lead_by_time", "prefetch", "prefetch_own"]


@paused_gc()
def prefetch(plan: Plan, options: PrefetchPart) -> Plan:
    """Return a "scheduled" plan with every H2D position and release point filled in (``options``:
    `PrefetchPart`)."""
    require_stage(plan, "filtered", "prefetch")
    return _schedule(record_stage(plan, "scheduled", "prefetch", recorded(options)), options)


@paused_gc()
def prefetch_own(plan: Plan, options: PrefetchPart) -> Plan:
    """`prefetch` of a "filtered" plan the caller owns, done to that plan itself (no copy): for a
    planner's plan just built, which nothing else holds (a budget plan lists thousands of offloads)."""
    require_stage(plan, "filtered", "prefetch")
    recorded_options = recorded(options)
    advance_stage(plan, "scheduled", "prefetch", recorded_options)
    return _schedule(plan, options)


def lead_by_time(plan: Plan, analysis: Analysis, timing: CopyTiming) -> int:
    """Copies on streams: issue each reload group's H2D earlier than the prefetch distance placed it, as
    early as its copy needs to be done by the start of its first use (on the baseline's node times), as
    far as the plan's peak device memory allows: the peak is never raised, and no H2D moves later.
    Returns how many H2Ds moved.

    The link is shared, as `offloadctl.planning.budget.search.Planner.place_prefetch_streams` models it:
    D2Hs go first come first served from the end of their producers; H2Ds are scheduled back from
    their deadlines, latest first, each done before the link time the later ones took and started no
    earlier than its tensor's D2H is done. The moves are then made in execution order, each as early as
    the memory left under the peak lets it (a move only adds the buffer's bytes to the steps it gains).
    """
    if not plan["offloads"]:
        return 0
    n = analysis.num_positions
    values = timeline.profile(analysis, plan, prefetch_distance=0)  # every position is filled in
    peak = int(values.max())
    sizes = {off["tensor"]: timeline.tensor_bytes(analysis, off["tensor"]) for off in plan["offloads"]}
    done = _d2hs_done(plan, timing, sizes, n)
    wanted = _wanted_issues(plan, timing, sizes, done)
    moved = 0
    for _, issue, off, k in sorted(wanted, key=lambda w: (w[0], w[2]["tensor"], w[3])):
        group, size = off["reload_groups"][k], sizes[off["tensor"]]
        old = group["h2d_before"]
        assert old is not None
        over = np.flatnonzero(values[issue:old] > peak - size)
        new = issue + (int(over[-1]) + 1 if len(over) else 0)
        if new < old:
            values[new:old] += size
            group["h2d_before"] = new
            moved += 1
    return moved


def _d2hs_done(plan: Plan, timing: CopyTiming, sizes: dict[str, int], n: int) -> dict[str, float]:
    """When each offloaded activation's D2H is done, the D2Hs first come first served on the link from
    the end of their producers."""
    starts = timing.starts
    done: dict[str, float] = {}
    link_free = 0.0
    activations = [(off["d2h_after"], off["tensor"]) for off in plan["offloads"] if off["kind"] == "activation"]
    for d2h_after, tensor in sorted((p, t) for p, t in activations if p is not None):
        begin = max(float(starts[min(d2h_after + 1, n)]), link_free)
        link_free = done[tensor] = begin + float(timing.d2h(sizes[tensor]))
    return done


def _wanted_issues(
    plan: Plan, timing: CopyTiming, sizes: dict[str, int], done: dict[str, float]
) -> list[tuple[int, int, Offload, int]]:
    """(first use, issue position, offload, group) of each H2D its copy wants issued earlier than placed:
    scheduled back from their deadlines, latest first, each done before the link time the later ones took
    and started no earlier than its tensor's D2H is done."""
    starts = timing.starts
    jobs = [
        (g["uses"][0]["position"], off["tensor"], k, off)
        for off in plan["offloads"]
        for k, g in enumerate(off["reload_groups"])
    ]
    wanted: list[tuple[int, int, Offload, int]] = []
    free = math.inf
    for first, tensor, k, off in sorted(jobs, key=lambda j: (j[0], j[1], j[2]), reverse=True):
        end = min(float(starts[first]), free)
        begin = max(end - float(timing.h2d(sizes[tensor])), done.get(tensor, 0.0))
        free = min(free, begin)
        low = timeline.h2d_low(off["kind"], off["d2h_after"])
        issue = max(low, min(first, int(np.searchsorted(starts, begin, side="right")) - 1))
        placed = off["reload_groups"][k]["h2d_before"]
        assert placed is not None  # the prefetch stage placed it
        if issue < placed:
            wanted.append((first, issue, off, k))
    return wanted


def _schedule(new: Plan, options: PrefetchPart) -> Plan:
    """Fill in ``new``'s H2D positions and release points (its stage already advanced)."""
    prefetch_distance, release_distance = options.prefetch_distance, options.release_distance
    n = new["model"]["num_positions"]
    for off in new["offloads"]:
        distance = off["prefetch_distance"] if off["prefetch_distance"] is not None else prefetch_distance
        low = h2d_low(off["kind"], off["d2h_after"])
        for group in off["reload_groups"]:
            group["h2d_before"] = h2d_position(group["uses"][0]["position"], low, distance)
        if off["kind"] == "activation":
            last_device_use = off["device_uses"][-1]["position"] if off["device_uses"] else off["d2h_after"]
            assert last_device_use is not None  # an activation has its D2H position
            off["release_after"] = release_point(last_device_use, release_distance, n)
    return new
