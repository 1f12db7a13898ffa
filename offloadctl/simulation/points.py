"""One plan at several shape points (prefill and decode, sequence lengths 1, 512 and 4096), in the
spirit of TensorRT's min/opt/max profiles.

A plan's copies sit at node positions, which do not depend on the shapes; only the sizes do. At
each point the model is loaded with that point's dimensions (over the plan's own), analysed in the
plan's order, and the plan, its sizes taken from the point (`resized`), simulated there: peak
before and after, and the estimated time. The rewritten model keeps its symbolic dimensions, so it
runs at every point.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypedDict

from offloadctl.analysis.graph import Analysis, analyse
from offloadctl.core.errors import OffloadError
from offloadctl.core.plantypes import Plan
from offloadctl.loading.input_shapes import follows_from
from offloadctl.loading.model import load_model
from offloadctl.simulation.profiles import Profile
from offloadctl.simulation.result import SimResult, simulate

__all__ = ["largest_point", "PointResult", "at_points", "parse_point", "point_analysis", "resized"]


class PointDoc(TypedDict):
    """A shape point's figures in a ``--json`` document (`PointResult.to_json`)."""

    dims: dict[str, int]
    peak_bytes: dict[str, int]
    slowdown: dict[str, float] | None
    unknown_size: int


@dataclass(frozen=True)
class PointResult:
    """The simulation of a plan (or of the model alone) at one shape point."""

    dims: dict[str, int]
    result: SimResult

    def to_json(self) -> PointDoc:
        r = self.result
        return {
            "dims": self.dims,
            "peak_bytes": {"before": r.peak_before, "after": r.peak_after},
            "slowdown": None if r.times is None else r.times.slowdown,
            "unknown_size": len(r.unknown_tensors),
        }


def parse_point(text: str) -> dict[str, int]:
    """``NAME=VALUE[,NAME=VALUE...]`` -> {name: value} (``--shape-point``)."""
    dims: dict[str, int] = {}
    for part in text.split(","):
        name, sep, value = part.partition("=")
        if not sep or not name.strip() or not value.strip().isdigit():
            raise OffloadError(
                f"--shape-point {text!r} is not NAME=VALUE[,NAME=VALUE...]",
                hint="give the dimensions of one point, e.g. --shape-point sequence_length=1,past_sequence_length=511",
            )
        dims[name.strip()] = int(value)
    return dims


def point_analysis(analysis: Analysis, dims: Mapping[str, int]) -> Analysis:
    """The model of ``analysis`` loaded at ``dims`` (over its own pins) and analysed in its order."""
    base = analysis.loaded
    merged = {**base.dims, **dims}
    # a dimension that is a sum of others follows from its parts again (`load_model`)
    merged = {k: v for k, v in merged.items() if k in dims or not follows_from(k, merged)}
    try:
        loaded = load_model(
            base.path, input_shapes=base.input_shapes or None, dims=merged, input_shapes_from="the plan"
        )
    except OffloadError as exc:
        point = ",".join(f"{k}={v}" for k, v in dims.items())
        raise OffloadError(f"--shape-point {point}: {exc.message}", hint=exc.hint) from None
    return analyse(loaded, order=analysis.order)


def resized(plan: Plan, analysis: Analysis) -> Plan:
    """``plan`` with each offload's size and shape those of ``analysis`` (another shape point of the
    same model); positions, uses and reloads are the plan's.

    Raises:
        OffloadError: an offloaded tensor's size is unknown at this point.
    """
    out = copy.deepcopy(plan)
    for off in out["offloads"]:
        info = analysis.infos.get(off["tensor"])
        if info is None or info.bytes is None:
            raise OffloadError(
                f"the size of offloaded tensor {off['tensor']!r} is unknown at this shape point",
                hint="give every dynamic dimension of the point (--shape-point NAME=VALUE,...)",
            )
        off["bytes"] = info.bytes
        off["shape"] = info.int_shape()
    out["model"]["dims"] = dict(analysis.loaded.dims)
    out["model"]["input_shapes"] = dict(analysis.loaded.input_shapes)
    return out


def at_points(
    analysis: Analysis, plan: Plan | None, points: Sequence[Mapping[str, int]], *, profile: Profile | None
) -> list[PointResult]:
    """The plan (or the model alone) simulated at each shape point."""
    found = []
    for dims in points:
        here = point_analysis(analysis, dims)
        found.append(
            PointResult(
                dict(here.loaded.dims),
                simulate(here, None if plan is None else resized(plan, here), profile=profile),
            )
        )
    return found


def largest_point(
    analysis: Analysis, points: list[dict[str, int]]
) -> tuple[Analysis, list[dict[str, int]], PointResult | None]:
    """The analysis at the shape point with the largest peak (the model's own or one of ``points``), the
    points left to check, and that point's result when it is not the model's own: a budget plan made at
    the largest point fits the smaller ones too, which the plan command then checks."""
    base = simulate(analysis, None, profile=None).peak_before
    found = at_points(analysis, None, points, profile=None)
    k = max(range(len(found)), key=lambda i: found[i].result.peak_before)
    worst = found[k]
    if worst.result.peak_before <= base:
        return analysis, points, None
    return point_analysis(analysis, points[k]), [dict(analysis.loaded.dims), *points[:k], *points[k + 1 :]], worst
