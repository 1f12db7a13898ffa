"""The prefetch stage: where each host-to-device copy runs, and when device buffers are released.

Each reload group's H2D moves ``prefetch_distance`` positions before the group's first use; a
per-tensor ``prefetch_distance`` in the plan wins over the global value. It is clamped so that it
never runs before its D2H (activations: not before position d2h_after + 1) or before position 0
(weights). The H2D feeding an offloaded graph output stays at the end: nothing waits for it
earlier, and moving it would only hold device memory longer.

Release (HyperOffload release_distance): the device buffer of an offloaded activation may be
reused only after its D2H finished and after position (last device use + release_distance), the
last device use being the producer when every use is reloaded.
"""

from __future__ import annotations

from typing import Any

from offloadctl.plan import record_stage, require_stage

__all__ = ["DEFAULT_PREFETCH_DISTANCE", "DEFAULT_RELEASE_DISTANCE", "prefetch"]

DEFAULT_PREFETCH_DISTANCE = 50
DEFAULT_RELEASE_DISTANCE = 0


def prefetch(
    plan: dict[str, Any],
    *,
    prefetch_distance: int = DEFAULT_PREFETCH_DISTANCE,
    release_distance: int = DEFAULT_RELEASE_DISTANCE,
) -> dict[str, Any]:
    """Return a "scheduled" plan with every H2D position and release point filled in."""
    require_stage(plan, "filtered", "prefetch")
    new = record_stage(
        plan,
        "scheduled",
        "prefetch",
        {"prefetch_distance": prefetch_distance, "release_distance": release_distance},
    )
    last = max(new["model"]["num_positions"] - 1, 0)
    for off in new["offloads"]:
        distance = off["prefetch_distance"] if off["prefetch_distance"] is not None else prefetch_distance
        is_act = off["kind"] == "activation"
        low = off["d2h_after"] + 1 if is_act else 0
        for group in off["reload_groups"]:
            first = group["uses"][0]["position"]
            group["h2d_before"] = max(low, first - distance)
        if is_act:
            last_device_use = off["device_uses"][-1]["position"] if off["device_uses"] else off["d2h_after"]
            off["release_after"] = min(last_device_use + release_distance, last)
    return new
