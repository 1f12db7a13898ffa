"""The lines a measured profile fits to its timings: a copy's cost over its size (`fit_link`, over the
sizes a model can copy, `fit_range`) and the executor's cost per node (`node_overhead_for`).

Pure arithmetic over (bytes, seconds) points; `offloadctl.running.profiler` takes the timings.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from offloadctl.core.errors import OffloadError

__all__ = ["LinkFit", "fit_link", "fit_range", "node_overhead_for"]

FIT_LARGE = 64 << 10  # a copy fit reaches this size at least


@dataclass(frozen=True)
class LinkFit:
    """``seconds = latency_s + bytes / bandwidth`` fitted to measured (bytes, seconds) points."""

    latency_s: float
    bandwidth: float
    max_relative_error: float

    def time(self, nbytes: int) -> float:
        return self.latency_s + nbytes / self.bandwidth


def fit_link(points: Sequence[tuple[int, float]]) -> LinkFit:
    """Least-squares fit of ``latency + bytes / bandwidth`` on the relative error of each point.

    Weighting by 1/seconds lets the small copies decide the latency and the large ones the
    bandwidth (plain least squares would let the largest copy decide both). A negative latency is
    refitted as 0.

    Raises:
        OffloadError: fewer than two distinct sizes, or times that do not grow with size.
    """
    pts = [(float(b), float(t)) for b, t in points if t > 0]
    if len({b for b, _ in pts}) < 2:
        raise OffloadError(
            f"cannot fit a copy cost to {len(pts)} point(s): need times for at least two sizes",
            hint="time copies of at least two different sizes",
        )
    x = np.array([b for b, _ in pts])
    t = np.array([s for _, s in pts])
    w = 1.0 / t
    design = np.stack([np.ones_like(x), x], axis=1) * w[:, None]
    (latency, per_byte), *_ = np.linalg.lstsq(design, t * w, rcond=None)
    if latency < 0:
        latency = 0.0
        per_byte = float(np.sum(w * w * x * t) / np.sum(w * w * x * x))
    if per_byte <= 0:
        raise OffloadError(
            "measured copy times do not grow with the number of bytes copied: no bandwidth can be fitted",
            hint="measure again on a quiet machine (other work may have disturbed the timings)",
        )
    predicted = latency + per_byte * x
    return LinkFit(float(latency), float(1.0 / per_byte), float(np.max(np.abs(predicted - t) / t)))


def node_overhead_for(durations: Sequence[float], total: float) -> float:
    """The offset d such that ``sum(max(t + d, 0) for t in durations) == total``.

    A node's simulated time is its duration in profiling plus this offset, never below 0; the
    offset makes the nodes add up to the latency measured without profiling (``total``: the latency
    less the run's fixed cost). It is negative when the profiler's cost inside each event exceeds
    the executor's between nodes. With no time left (``total <= 0``) every node takes 0.
    """
    if not durations:
        return 0.0
    if total <= 0:
        return -max(durations)

    def covered(offset: float) -> float:
        return sum(max(t + offset, 0.0) for t in durations)

    low, high = -max(durations), max(total, 0.0)  # covered(low) = 0 <= total <= covered(high)
    for _ in range(200):
        mid = (low + high) / 2
        if covered(mid) < total:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def fit_range(sweep: Sequence[int], tensor_bytes: Sequence[int]) -> tuple[int, int]:
    """The sweep sizes a copy fit uses: from the largest one at or below the model's smallest tensor to
    the smallest one at or above its largest (or ``FIT_LARGE``), widened to at least three sizes
    (the whole sweep for a model without sizes).

    The cost of a copy per byte falls as copies outgrow the caches, so no one line fits 4 KiB and
    64 MiB; a profile's fit is made for the sizes its model can copy.
    """
    grid = sorted(set(sweep))
    if not tensor_bytes:
        return grid[0], grid[-1]
    # up to FIT_LARGE at least: below it every copy costs about its latency, and noise decides the slope
    small, large = min(tensor_bytes), max(max(tensor_bytes), FIT_LARGE)
    lo = max((g for g in grid if g <= small), default=grid[0])
    hi = min((g for g in grid if g >= large), default=grid[-1])
    inside = [g for g in grid if lo <= g <= hi]
    while len(inside) < min(3, len(grid)):  # at least three sizes: a line through two is at noise's mercy
        first, last = grid.index(inside[0]), grid.index(inside[-1])
        inside = grid[first : last + 2] if last + 1 < len(grid) else grid[max(first - 1, 0) : last + 1]
    return inside[0], inside[-1]
