"""A plan's estimated figures: peak memory before and after, lower bound, bytes moved, time.

`estimate_figures` condenses a simulation (`offloadctl.simulation.result.SimResult`) into the plain figures
the command line prints and puts in its ``--json`` documents. `record_estimate` stores them in the
plan's informative ``summary.estimate`` (what ``offloadctl plan`` writes), keyed by a hash of the
plan's offloads; `recorded_estimate` gives them back only while the offloads are unchanged, so
``offloadctl apply`` can quote them without simulating again (on a large model the simulation
needs shape inference over the whole graph, which a weights-only apply otherwise never runs).
"""

from __future__ import annotations

from typing import Any

from offloadctl.core.files import json_sha256
from offloadctl.core.plantypes import Plan
from offloadctl.simulation.result import SimResult

__all__ = [
    "estimate_figures",
    "record_estimate",
    "recorded_estimate",
    "with_device_peaks",
    "with_run_order_peak",
    "with_run_time",
    "streams_declined",
]


def estimate_figures(result: SimResult, copies: str = "inline") -> dict[str, Any]:
    """Peak, lower bound, bytes moved and estimated time of a simulation, as plain JSON values.

    ``copy_mode`` says which time the command quotes: ``inline`` (the simulator's serialized time,
    what onnxruntime runs in line) or ``streams`` (its overlapped time: the copies on a stream of their own,
    as ``apply --copies streams`` writes them).
    """
    doc = result.to_json(timeline_limit=0)
    return {
        "copy_mode": copies,
        "peak_bytes": doc["peak_bytes"],
        "lower_bound_bytes": doc["lower_bound_bytes"],
        "transfer_bytes": doc["transfer_bytes"],
        "copies": doc["copies"],
        "unknown_size_tensors": len(result.unknown_tensors),
        "profile": result.profile.name if result.profile is not None else None,
        "time_s": doc["time_s"],
        "time_nodes": doc["time_nodes"],
        "slowdown": doc["slowdown"],
        "bodies_at_peak_bytes": doc["bodies_at_peak_bytes"],
        "streams_declined": None,  # why a streams plan runs its copies in line (`simulation.estimate.streams_declined`)
    }


def with_run_order_peak(
    figures: dict[str, Any], replayed: SimResult, order: str, *, streams: bool = False
) -> dict[str, Any]:
    """``figures`` with the peak after taken from ``replayed`` (`offloadctl.rewriting.preview`: the
    rewrite simulated in the order onnxruntime runs it, ``order``; with ``streams``, as its executor runs
    the two streams of a rewrite whose copies have their own); the planned sequence's own peak stays
    beside it as ``planned_after``, and ``run_by`` says what ran it."""
    peak = dict(figures["peak_bytes"])
    peak["planned_after"] = peak["after"]
    peak["after"] = replayed.peak_after
    peak["saved"] = peak["before"] - replayed.peak_after
    if streams:
        peak["of"] = f"the rewrite with its copies on their own stream, in onnxruntime's {order.upper()} order"
        peak["run_by"] = "the two-stream executor"
    else:
        peak["of"] = f"the rewrite in onnxruntime's {order.upper()} order"
        peak["run_by"] = f"the {order.upper()} walk"
    return {**figures, "peak_bytes": peak}


def with_run_time(figures: dict[str, Any], replayed: SimResult) -> dict[str, Any]:
    """``figures`` with the time taken from ``replayed`` too (a streams rewrite as the executor runs its two
    streams: `offloadctl.rewriting.preview.streams_run_result`), as `simulate` of the rewrite estimates it:
    a load ``apply`` keeps in line and a copy its gate holds cost there what they cost when run. The planned
    sequence's slowdown stays beside it as ``planned_slowdown``."""
    doc = replayed.to_json(timeline_limit=0)
    if doc["time_s"] is None:
        return figures
    timed = {key: doc[key] for key in ("time_s", "time_nodes", "slowdown")}
    return {**figures, **timed, "planned_slowdown": figures["slowdown"]}


def with_device_peaks(
    figures: dict[str, Any],
    before: SimResult,
    after: SimResult,
    device: str,
    order: str,
    pins: tuple[int, int] | None = None,
    *,
    streams: bool = False,
) -> dict[str, Any]:
    """``figures`` with the peaks before and after taken from the model and its rewrite as ``device``
    runs them (`offloadctl.rewriting.preview.device_result`: its inserted copies, the nodes it runs
    on the host, its executor's order); the planned figures stay beside them as ``planned_before`` and
    ``planned_after``. ``pins``, (checked, broken): the rewrite's order pins checked against that
    order and those it breaks (copies on the wrong side of the node their pin names), are recorded as
    ``peak_bytes.pins_checked`` and ``pins_broken``. ``streams``: ``after`` is the rewrite with its
    copies on a stream of their own, as the two-stream executor runs it (``run_by`` says so)."""
    peak = dict(figures["peak_bytes"])
    peak["planned_before"], peak["planned_after"] = peak["before"], peak["after"]
    peak["before"], peak["after"] = before.peak_after, after.peak_after
    peak["saved"] = before.peak_after - after.peak_after
    peak["device"] = device
    peak["of"] = f"the model and its rewrite as {device} runs them, in onnxruntime's {order.upper()} order"
    if streams:  # the rewrite with its copies on a stream of their own (``streams``)
        peak["of"] += ", the rewrite's copies on a stream of their own"
        peak["run_by"] = "the two-stream executor"
    if pins is not None:
        peak["pins_checked"], peak["pins_broken"] = pins
    return {**figures, "peak_bytes": peak}


def _offloads_sha256(plan: Plan) -> str:
    return json_sha256(plan["offloads"])


def record_estimate(plan: Plan, figures: dict[str, Any]) -> None:
    """Store ``figures`` (`estimate_figures`) in ``plan["summary"]["estimate"]``."""
    plan.setdefault("summary", {})["estimate"] = {**figures, "offloads_sha256": _offloads_sha256(plan)}


def recorded_estimate(plan: Plan) -> dict[str, Any] | None:
    """The figures `record_estimate` stored, or None when there are none or the offloads changed since."""
    recorded = (plan.get("summary") or {}).get("estimate")
    if not isinstance(recorded, dict) or recorded.get("offloads_sha256") != _offloads_sha256(plan):
        return None
    return {k: v for k, v in recorded.items() if k != "offloads_sha256"}


def streams_declined(figures: dict[str, Any], in_line_peak: int | None = None) -> dict[str, Any] | None:
    """Why a plan's copies run in line though it was made for streams: on a stream of their own, as the
    executor runs them (``figures``: `offloadctl.rewriting.figures.as_run_figures` with copies on
    streams), they gain no time over in line, or they hold more than the same plan in line
    (``in_line_peak``, its peak after as run); None when neither. The slowdowns both ways, and the
    peaks where streams hold more."""
    slow = figures.get("slowdown")
    peak = figures["peak_bytes"]["after"]
    higher = in_line_peak is not None and peak > in_line_peak
    if not higher and (not slow or slow["overlapped"] < slow["serialized"]):
        return None
    declined = {"streams": slow["overlapped"], "inline": slow["serialized"]} if slow else {}
    if higher:
        declined["peaks"] = {"streams": peak, "inline": in_line_peak}
    return {**declined, "profile": figures.get("profile")}
