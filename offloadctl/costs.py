"""What an offload costs: the objective the budget search minimises, one copy at a time.

A plan's cost is the sum of the costs of its copies: one D2H per offloaded activation, one H2D per
reload group, one more H2D for an offloaded graph output. A `CopyCost` prices one copy of a given
size in a given direction; the budget search (greedy and exact) only ever asks it that, so any
per-copy price that adds up plugs in:

- `BytesMoved` (``--objective bytes``, the default): a copy costs its bytes. Every byte crosses the
  host link, and with copies in line on the compute stream (onnxruntime today) every byte is time
  the model waits.
- `InlineTime` (``--objective time``): a copy costs the seconds it takes with copies in line,
  ``latency_s + bytes / bandwidth`` of its direction from a device profile (the simulator's
  "serialized" figure minus the baseline is exactly this sum).

`plan_cost` prices a whole plan with any of them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from offloadctl.profiles import DEFAULT_PROFILE, Profile, load_profile

__all__ = ["OBJECTIVES", "CopyCost", "BytesMoved", "InlineTime", "make_cost", "plan_cost", "copies_of"]

OBJECTIVES = ("bytes", "time")


class CopyCost:
    """Prices one copy. Subclasses set ``objective`` and ``unit`` and implement `d2h` and `h2d`."""

    objective: str = ""
    unit: str = ""
    integral: bool = False  # every price is a whole number (the exact search may then round its gap)

    def d2h(self, nbytes: int) -> float:
        """Cost of one device-to-host copy of ``nbytes``."""
        raise NotImplementedError

    def h2d(self, nbytes: int) -> float:
        """Cost of one host-to-device copy of ``nbytes``."""
        raise NotImplementedError

    def to_json(self) -> dict[str, Any]:
        return {"objective": self.objective, "unit": self.unit}


@dataclass(frozen=True)
class BytesMoved(CopyCost):
    """A copy costs the bytes it moves."""

    objective = "bytes"
    unit = "bytes"
    integral = True

    def d2h(self, nbytes: int) -> float:
        return nbytes

    def h2d(self, nbytes: int) -> float:
        return nbytes


@dataclass(frozen=True)
class InlineTime(CopyCost):
    """A copy costs its time on the compute stream: latency + bytes / bandwidth of its direction."""

    profile: Profile
    objective = "time"
    unit = "seconds"

    def d2h(self, nbytes: int) -> float:
        return self.profile.d2h.time(nbytes)

    def h2d(self, nbytes: int) -> float:
        return self.profile.h2d.time(nbytes)

    def to_json(self) -> dict[str, Any]:
        return {"objective": self.objective, "unit": self.unit, "profile": self.profile.name}


def make_cost(objective: str = "bytes", profile: Profile | str | None = None) -> CopyCost:
    """The `CopyCost` of an objective name; ``time`` uses ``profile`` (default: the simulator's default)."""
    if objective == "bytes":
        return BytesMoved()
    if objective == "time":
        prof = profile if isinstance(profile, Profile) else load_profile(profile or DEFAULT_PROFILE)
        return InlineTime(prof)
    raise ValueError(f"unknown objective {objective!r}; expected one of {', '.join(OBJECTIVES)}")


def copies_of(offload: dict[str, Any]) -> tuple[int, int]:
    """(D2H copies, H2D copies) of one plan entry."""
    d2h = 1 if offload["kind"] == "activation" else 0
    h2d = len(offload["reload_groups"]) + bool(offload.get("graph_output") and offload.get("output_h2d_before") is not None)
    return d2h, h2d


def plan_cost(plan: dict[str, Any], cost: CopyCost) -> float:
    """The cost of every copy a plan makes."""
    total = 0.0
    for off in plan["offloads"]:
        d2h, h2d = copies_of(off)
        total += d2h * cost.d2h(off["bytes"]) + h2d * cost.h2d(off["bytes"])
    return total
