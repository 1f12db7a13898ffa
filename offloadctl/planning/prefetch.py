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

from offloadctl.analysis.timeline import h2d_low, h2d_position, release_point
from offloadctl.contract.document import advance_stage, record_stage, require_stage
from offloadctl.core.bulk import paused_gc
from offloadctl.core.plantypes import Plan
from offloadctl.planning.request import PrefetchPart, recorded, taking

__all__ = ["prefetch", "prefetch_own"]


@taking(PrefetchPart)
@paused_gc()
def prefetch(plan: Plan, options: PrefetchPart) -> Plan:
    """Return a "scheduled" plan with every H2D position and release point filled in (``options``:
    `PrefetchPart`, or its fields as keywords)."""
    require_stage(plan, "filtered", "prefetch")
    return _schedule(record_stage(plan, "scheduled", "prefetch", recorded(PrefetchPart, options)), options)


@paused_gc()
def prefetch_own(plan: Plan, options: PrefetchPart) -> Plan:
    """`prefetch` of a "filtered" plan the caller owns, done to that plan itself (no copy): for a
    planner's plan just built, which nothing else holds (a budget plan lists thousands of offloads)."""
    require_stage(plan, "filtered", "prefetch")
    recorded_options = recorded(PrefetchPart, options)
    advance_stage(plan, "scheduled", "prefetch", recorded_options)
    return _schedule(plan, options)


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
