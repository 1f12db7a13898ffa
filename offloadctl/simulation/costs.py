"""What an offload costs: the objective the budget search minimises, one copy at a time.

A plan's cost is the sum of the costs of its copies: one D2H per offloaded activation, one H2D per
reload group, one more H2D for an offloaded graph output. A `CopyCost` prices one copy; the budget
search (greedy and exact) only ever asks it that:

- `BytesMoved` (``--objective bytes``): a copy costs its bytes. Every byte crosses the host link,
  and with copies in line on the compute stream (onnxruntime today) every byte is time the model
  waits.
- `InlineTime` (``--objective time``, ``--copies inline``): a copy costs the seconds it takes with
  copies in line, ``latency_s + bytes / bandwidth`` of its direction from a device profile (the
  simulator's "serialized" figure minus the baseline is exactly this sum).
- `StreamStall` (``--objective time``, ``--copies streams``): a copy on a separate copy stream
  costs only what compute does not hide, ``max(0, copy time - compute time in its window)``, on the
  profile's node times. An H2D's window runs from where it is issued (its group's first use less
  the prefetch distance) to that use; a D2H's from just after its producer to the release point,
  where the compute stream waits for it before the buffer may be reused. So its price depends on
  *where* the copy is, and a D2H's on which of the tensor's gaps is offloaded first: the cost of a
  plan is no longer a sum of prices of sizes (``linear`` is False), and the exact search, which
  needs one, does not take it. This price guides the search; the simulator's streams time, which
  judges the plan, runs the copies as ``apply --copies streams`` writes them (one copy stream, its
  event nodes), not yet timed on a device (`STREAMS_NOTE`). A hidden
  copy still costs `HIDDEN_SHARE` of its time: it occupies the link, which other copies share, and
  among hidden copies the search should prefer the fewest.

Which objective a command uses when none is asked for: `default_objective` (time with a measured
profile from ``offloadctl profile``, bytes otherwise). `plan_cost` prices a whole plan with any of
them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from offloadctl.core.plantypes import Objective, Offload, Plan
from offloadctl.simulation.profiles import DEFAULT_PROFILE, Profile, load_profile

if TYPE_CHECKING:
    from offloadctl.analysis.graph import Analysis

__all__ = [
    "OBJECTIVES",
    "COPY_MODES",
    "STREAMS_NOTE",
    "HIDDEN_SHARE",
    "CopyCost",
    "BytesMoved",
    "InlineTime",
    "StreamStall",
    "CopyTiming",
    "copy_timing",
    "default_objective",
    "linear_objective",
    "make_cost",
    "optimal_refusal",
    "plan_cost",
    "copies_of",
    "copy_mode_label",
]

OBJECTIVES = ("bytes", "time")
COPY_MODES = ("inline", "streams")
STREAMS_NOTE = "as apply --copies streams writes them, one copy stream and its event nodes; not yet timed on a device"
HIDDEN_SHARE = 1e-3


def copy_mode_label(copies: str) -> str:
    """How the command line names a copy mode."""
    if copies == "streams":
        return f"copies on streams, {STREAMS_NOTE}"
    return "copies in line"


def default_objective(profile: Profile | None) -> str:
    """``time`` for a measured profile (written by ``offloadctl profile``), ``bytes`` otherwise."""
    return "time" if profile is not None and profile.measured is not None else "bytes"


class CopyCost:
    """Prices one copy. Subclasses set ``objective`` and ``unit`` and implement `d2h` and `h2d`.

    ``linear``: the price of a copy depends on its size and direction alone (`d2h`, `h2d`), so a
    plan's cost is a plain sum the exact search can write down. Position-aware prices (`d2h_at`,
    `h2d_at`) default to those.
    """

    objective: str = ""
    unit: str = ""
    integral: bool = False  # every price is a whole number (the exact search may then round its gap)
    linear: bool = True
    copies: str = "inline"

    def d2h(self, nbytes: int) -> float:
        """Cost of one device-to-host copy of ``nbytes``."""
        raise NotImplementedError

    def h2d(self, nbytes: int) -> float:
        """Cost of one host-to-device copy of ``nbytes``."""
        raise NotImplementedError

    def d2h_at(self, nbytes: int, producer: int, release: int) -> float:
        """A D2H after the node at ``producer`` that the compute stream waits for after node ``release``."""
        return self.d2h(nbytes)

    def h2d_at(self, nbytes: int, issue: int, use: int) -> float:
        """An H2D issued before the node at ``issue`` whose copy the node at ``use`` reads (``issue`` <= ``use``)."""
        return self.h2d(nbytes)

    def d2h_many(self, nbytes: np.ndarray, producer: np.ndarray, release: np.ndarray) -> np.ndarray:
        """`d2h_at` of many copies at once."""
        return np.fromiter(
            (self.d2h_at(int(b), int(p), int(r)) for b, p, r in zip(nbytes, producer, release)),
            dtype=np.float64,
            count=len(nbytes),
        )

    def h2d_many(self, nbytes: np.ndarray, issue: np.ndarray, use: np.ndarray) -> np.ndarray:
        """`h2d_at` of many copies at once."""
        return np.fromiter(
            (self.h2d_at(int(b), int(i), int(u)) for b, i, u in zip(nbytes, issue, use)),
            dtype=np.float64,
            count=len(nbytes),
        )

    def to_json(self) -> Objective:
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

    def d2h_many(self, nbytes: np.ndarray, producer: np.ndarray, release: np.ndarray) -> np.ndarray:
        return np.asarray(nbytes, dtype=np.float64)

    def h2d_many(self, nbytes: np.ndarray, issue: np.ndarray, use: np.ndarray) -> np.ndarray:
        return np.asarray(nbytes, dtype=np.float64)


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

    def d2h_many(self, nbytes: np.ndarray, producer: np.ndarray, release: np.ndarray) -> np.ndarray:
        link = self.profile.d2h
        return link.latency_s + np.asarray(nbytes, dtype=np.float64) / link.bandwidth

    def h2d_many(self, nbytes: np.ndarray, issue: np.ndarray, use: np.ndarray) -> np.ndarray:
        link = self.profile.h2d
        return link.latency_s + np.asarray(nbytes, dtype=np.float64) / link.bandwidth

    def to_json(self) -> Objective:
        return {"objective": self.objective, "unit": self.unit, "profile": self.profile.name, "copies": "inline"}


@dataclass(frozen=True, eq=False)
class CopyTiming:
    """When each node runs (the baseline, no copies) and how long a copy takes, on one profile.

    ``starts[p]`` is the time node p starts (the seconds of nodes 0..p-1); ``starts[n]`` is the end.
    """

    profile: Profile
    starts: np.ndarray

    @property
    def num_positions(self) -> int:
        return len(self.starts) - 1

    def d2h(self, nbytes: int | np.ndarray) -> Any:
        return self.profile.d2h.latency_s + np.asarray(nbytes, dtype=np.float64) / self.profile.d2h.bandwidth

    def h2d(self, nbytes: int | np.ndarray) -> Any:
        return self.profile.h2d.latency_s + np.asarray(nbytes, dtype=np.float64) / self.profile.h2d.bandwidth

    def compute(self, first: Any, last: Any) -> Any:
        """Seconds of the nodes first..last (inclusive; 0 where last < first), element-wise."""
        n = self.num_positions
        first = np.clip(np.asarray(first, dtype=np.int64), 0, n)
        last = np.clip(np.asarray(last, dtype=np.int64), -1, n - 1)
        return np.where(last >= first, self.starts[np.maximum(last + 1, first)] - self.starts[first], 0.0)


def copy_timing(analysis: Analysis, profile: Profile) -> CopyTiming:
    """The `CopyTiming` of a model (not one already rewritten) on a profile."""
    from offloadctl.simulation.timing import node_seconds

    seconds = np.asarray(node_seconds(analysis, profile), dtype=np.float64)
    starts = np.concatenate(([0.0], np.cumsum(seconds)))
    starts.flags.writeable = False
    return CopyTiming(profile, starts)


@dataclass(frozen=True, eq=False)
class StreamStall(CopyCost):
    """A copy on a copy stream costs the time compute does not hide: max(0, copy time - window)
    (+ `HIDDEN_SHARE` of its time); see the module docstring."""

    timing: CopyTiming
    objective = "time"
    unit = "seconds"
    linear = False
    copies = "streams"

    @property
    def profile(self) -> Profile:
        return self.timing.profile

    def d2h(self, nbytes: int) -> float:
        return float(self.timing.d2h(nbytes))

    def h2d(self, nbytes: int) -> float:
        return float(self.timing.h2d(nbytes))

    def d2h_many(self, nbytes: np.ndarray, producer: np.ndarray, release: np.ndarray) -> np.ndarray:
        t = self.timing.d2h(nbytes)
        hidden = self.timing.compute(np.asarray(producer) + 1, release)
        return np.maximum(t - hidden, 0.0) + HIDDEN_SHARE * t

    def h2d_many(self, nbytes: np.ndarray, issue: np.ndarray, use: np.ndarray) -> np.ndarray:
        t = self.timing.h2d(nbytes)
        hidden = self.timing.compute(issue, np.asarray(use) - 1)
        return np.maximum(t - hidden, 0.0) + HIDDEN_SHARE * t

    def __post_init__(self) -> None:
        object.__setattr__(self, "_starts", self.timing.starts.tolist())  # one copy's price in plain floats

    def _hidden(self, first: int, last: int) -> float:
        starts = self._starts  # type: ignore[attr-defined]
        first = min(max(first, 0), len(starts) - 1)
        last = min(last, len(starts) - 2)
        return starts[last + 1] - starts[first] if last >= first else 0.0

    def d2h_at(self, nbytes: int, producer: int, release: int) -> float:
        t = self.profile.d2h.time(nbytes)
        return max(t - self._hidden(producer + 1, release), 0.0) + HIDDEN_SHARE * t

    def h2d_at(self, nbytes: int, issue: int, use: int) -> float:
        t = self.profile.h2d.time(nbytes)
        return max(t - self._hidden(issue, use - 1), 0.0) + HIDDEN_SHARE * t

    def to_json(self) -> Objective:
        return {"objective": self.objective, "unit": self.unit, "profile": self.profile.name, "copies": "streams"}


def linear_objective(objective: str | CopyCost, copies: str) -> bool:
    """Whether a search objective prices each copy by its size and direction alone (`CopyCost.linear`),
    what the exact search (``--optimal``) needs: a cost given as an object says so itself; the time
    objective with copies on streams (`StreamStall`) prices each copy by the compute around it."""
    if isinstance(objective, CopyCost):
        return objective.linear
    return not (objective == "time" and copies == "streams")


def optimal_refusal(because: str = "") -> tuple[str, str]:
    """(message, fix) of the error for ``--optimal`` with an objective that is not linear
    (`linear_objective`); ``because`` says why that objective was chosen, when it was defaulted."""
    return (
        "--optimal supports only the linear objectives: bytes, or time with copies in line. With --copies "
        f"streams the time objective{because} prices each copy by the compute around it, which the exact "
        "program cannot state",
        "drop --optimal, or give --objective bytes or --copies inline",
    )


def make_cost(
    objective: str = "bytes",
    profile: Profile | str | None = None,
    *,
    copies: str = "inline",
    analysis: Analysis | None = None,
) -> CopyCost:
    """The `CopyCost` of an objective name.

    ``time`` uses ``profile`` (default: the simulator's default) and the copy mode: ``inline`` prices
    each copy's time, ``streams`` the stall it leaves on ``analysis``'s compute (needs the analysis).
    """
    if copies not in COPY_MODES:
        raise ValueError(f"unknown copy mode {copies!r}; expected one of {', '.join(COPY_MODES)}")
    if objective == "bytes":
        return BytesMoved()
    if objective == "time":
        prof = profile if isinstance(profile, Profile) else load_profile(profile or DEFAULT_PROFILE)
        if copies == "inline":
            return InlineTime(prof)
        if analysis is None:
            raise ValueError("the time objective with copies on streams needs the model's analysis")
        return StreamStall(copy_timing(analysis, prof))
    raise ValueError(f"unknown objective {objective!r}; expected one of {', '.join(OBJECTIVES)}")


def copies_of(offload: Offload) -> tuple[int, int]:
    """(D2H copies, H2D copies) of one plan entry."""
    d2h = 1 if offload["kind"] == "activation" else 0
    h2d = len(offload["reload_groups"]) + bool(
        offload.get("graph_output") and offload.get("output_h2d_before") is not None
    )
    return d2h, h2d


def _positions(offload: Offload, n: int) -> tuple[tuple[int, int] | None, list[tuple[int, int]]]:
    """(producer, release) of an entry's D2H, and (issue, use) of each H2D; positions not filled in yet
    count as at the use (H2D) and at the last device use (release)."""
    d2h = None
    if offload["kind"] == "activation":
        producer = offload["d2h_after"]
        assert producer is not None  # a valid plan's activation has its D2H position
        release = offload.get("release_after")
        if release is None:
            release = offload["device_uses"][-1]["position"] if offload["device_uses"] else producer
        d2h = (producer, release)
    h2d = []
    for group in offload["reload_groups"]:
        use = group["uses"][0]["position"]
        h2d.append((use if group["h2d_before"] is None else group["h2d_before"], use))
    out_h2d = offload.get("output_h2d_before")
    if offload.get("graph_output") and out_h2d is not None:
        h2d.append((out_h2d, n))
    return d2h, h2d


def plan_cost(plan: Plan, cost: CopyCost) -> float:
    """The cost of every copy a plan makes."""
    total = 0.0
    n = plan["model"]["num_positions"]
    for off in plan["offloads"]:
        if cost.linear:
            d2h, h2d = copies_of(off)
            total += d2h * cost.d2h(off["bytes"]) + h2d * cost.h2d(off["bytes"])
            continue
        where_d2h, where_h2d = _positions(off, n)
        if where_d2h is not None:
            total += cost.d2h_at(off["bytes"], *where_d2h)
        total += sum(cost.h2d_at(off["bytes"], issue, use) for issue, use in where_h2d)
    return total
