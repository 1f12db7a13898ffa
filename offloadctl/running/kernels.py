"""Reading onnxruntime's profiling files: the kernel event of every node of every run (`kernel_runs`)
and each node's median time over the runs (`node_medians`).
"""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["KernelEvent", "kernel_runs", "node_medians"]

_KERNEL_SUFFIX = "_kernel_time"


@dataclass(frozen=True)
class KernelEvent:
    """One node's kernel event of one run."""

    name: str
    op_type: str
    seconds: float
    input_shapes: tuple[tuple[int, ...], ...]


def _shapes(arg: Any) -> tuple[tuple[int, ...], ...]:
    shapes = []
    for entry in arg or []:
        dims: Iterable[Any] = next(iter(entry.values()), []) if isinstance(entry, dict) else []
        shapes.append(tuple(int(d) for d in dims))
    return tuple(shapes)


def kernel_runs(profile_path: str | os.PathLike[str], *, skip: int = 1) -> list[list[KernelEvent]]:
    """The top-level kernel events of each run in an onnxruntime profiling file, in run order.

    Events nested inside another node's event (nodes of an If/Loop/Scan body, run by their parent)
    are left out: the parent's duration covers them. The first ``skip`` runs (warm-up) are dropped.
    """
    with open(profile_path, encoding="utf-8") as f:
        events = json.load(f)
    runs = sorted(
        (e for e in events if isinstance(e, dict) and e.get("cat") == "Session" and e.get("name") == "model_run"),
        key=lambda e: e.get("ts", 0),
    )
    nodes = sorted(
        (
            e
            for e in events
            if isinstance(e, dict) and e.get("cat") == "Node" and str(e.get("name", "")).endswith(_KERNEL_SUFFIX)
        ),
        key=lambda e: (e.get("ts", 0), -e.get("dur", 0)),
    )
    result: list[list[KernelEvent]] = []
    k = 0
    for run in runs:
        start, end = run.get("ts", 0), run.get("ts", 0) + run.get("dur", 0)
        while k < len(nodes) and nodes[k].get("ts", 0) < start:
            k += 1
        first = k
        while k < len(nodes) and nodes[k].get("ts", 0) <= end:
            k += 1
        result.append(_top_level(nodes[first:k]))
    return result[skip:]


def _top_level(events: list[dict[str, Any]]) -> list[KernelEvent]:
    """The kernel events of one run (in start order) that no other event covers."""
    top: list[KernelEvent] = []
    covered = -1
    for e in events:
        ts, dur = e.get("ts", 0), e.get("dur", 0)
        if ts < covered:
            continue  # inside the previous top-level event
        covered = ts + dur
        args = e.get("args") or {}
        name = e["name"][: -len(_KERNEL_SUFFIX)]
        top.append(KernelEvent(name, str(args.get("op_name", "")), dur * 1e-6, _shapes(args.get("input_type_shape"))))
    return top


def node_medians(runs: list[list[KernelEvent]]) -> dict[str, dict[str, Any]]:
    """Node name -> {op_type, seconds (median over runs), input_shapes}, in the order nodes ran."""
    times: dict[str, list[float]] = {}
    first: dict[str, KernelEvent] = {}
    for run in runs:
        for e in run:
            times.setdefault(e.name, []).append(e.seconds)
            first.setdefault(e.name, e)
    return {
        name: {
            "op_type": first[name].op_type or "unknown",
            "seconds": statistics.median(values),
            "input_shapes": [list(s) for s in first[name].input_shapes],
        }
        for name, values in times.items()
    }
