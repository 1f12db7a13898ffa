"""A plan's estimated figures: peak memory before and after, lower bound, bytes moved, time.

`estimate_figures` condenses a simulation (`offloadctl.simulation.result.SimResult`) into an
`Estimate`, the typed figures the command line prints and serialises (`Estimate.to_json`) into its
``--json`` documents; `with_run_order_peak`, `with_run_time` and `with_device_peaks` give the same
figures with what runs in place of what was planned. `record_estimate` stores them in the plan's
informative ``summary.estimate`` (what ``offloadctl plan`` writes), keyed by a hash of the plan's
offloads; `recorded_estimate` gives them back only while the offloads are unchanged, so ``offloadctl
apply`` can quote them without simulating again (on a large model the simulation needs shape
inference over the whole graph, which a weights-only apply otherwise never runs).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypedDict

from offloadctl.core.files import json_sha256
from offloadctl.core.plantypes import Plan
from offloadctl.simulation.result import SimResult

__all__ = [
    "Estimate",
    "Peaks",
    "estimate_figures",
    "record_estimate",
    "recorded_estimate",
    "with_device_peaks",
    "with_run_order_peak",
    "with_run_time",
    "streams_declined",
]


class _PeaksOptional(TypedDict, total=False):
    planned_before: int
    planned_after: int
    device: str
    of: str
    run_by: str
    pins_checked: int
    pins_broken: int


class PeaksDoc(_PeaksOptional):
    """`Peaks` as a plan and a ``--json`` document hold them (``peak_bytes``)."""

    before: int
    after: int
    saved: int


class _EstimateOptional(TypedDict, total=False):
    planned_slowdown: Mapping[str, float] | None


class EstimateDoc(_EstimateOptional):
    """`Estimate` as a plan (``summary.estimate``) and a ``--json`` document hold it."""

    copy_mode: str
    peak_bytes: PeaksDoc
    lower_bound_bytes: int
    transfer_bytes: Mapping[str, int]
    copies: Mapping[str, int]
    unknown_size_tensors: int
    profile: str | None
    time_s: Mapping[str, float] | None
    time_nodes: Mapping[str, int] | None
    slowdown: Mapping[str, float] | None
    bodies_at_peak_bytes: int
    streams_declined: Declined | None


class Declined(TypedDict, total=False):
    """Why a plan made for copies on streams runs them in line (`streams_declined`): the slowdowns both
    ways, the peaks where streams hold more, and the profile."""

    streams: float
    inline: float
    peaks: dict[str, int]
    profile: str | None


@dataclass(frozen=True)
class Peaks:
    """Peak device memory before and after a plan (``peak_bytes`` in JSON), and what they are of.

    Attributes:
        before: the model's peak; after: its rewrite's (`saved`: what the plan saves).
        planned_before, planned_after: the planned sequence's own peaks, where ``before`` and
            ``after`` are of what runs (a device's placement, onnxruntime's order, two streams).
        device: the device whose placement they count (``plan --device``).
        of: what the peaks are of, in words; run_by: what ran the rewrite (the DEFAULT walk, the
            two-stream executor).
        pins_checked, pins_broken: the rewrite's order pins checked against the order that runs
            it, and those it breaks.
    """

    before: int
    after: int
    planned_before: int | None = None
    planned_after: int | None = None
    device: str | None = None
    of: str | None = None
    run_by: str | None = None
    pins_checked: int | None = None
    pins_broken: int | None = None

    @property
    def saved(self) -> int:
        """What the plan saves: ``before - after``."""
        return self.before - self.after

    def to_json(self) -> PeaksDoc:
        """The peaks as a plan and a ``--json`` document hold them: ``before``, ``after`` and ``saved``, the
        optional figures only where given."""
        doc: PeaksDoc = {"before": self.before, "after": self.after, "saved": self.saved}
        for f in dataclasses.fields(self)[2:]:
            value = getattr(self, f.name)
            if value is not None:
                doc[f.name] = value  # type: ignore[literal-required]  # (each optional field is a key of PeaksDoc)
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Peaks:
        """The peaks `to_json` wrote (``saved`` follows from the others)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in doc.items() if k in names})


@dataclass(frozen=True)
class Estimate:
    """A plan's figures, as the verdict quotes them and ``summary.estimate`` records them (`to_json`).

    Attributes:
        copy_mode: which time is quoted: ``inline`` (the simulator's serialized time) or ``streams``
            (its overlapped time: the copies on a stream of their own).
        peak: the peaks before and after (`Peaks`; ``peak_bytes`` in JSON).
        lower_bound_bytes: no plan's peak goes below it.
        transfer_bytes, copies: bytes moved and copies made, by direction.
        unknown_size_tensors: tensors of unknown size, counted as 0 bytes.
        profile: the device profile's name the time is estimated on (None: no time).
        time_s, time_nodes, slowdown: the estimated times (baseline, serialized, overlapped), the
            nodes timed (total, measured, estimated) and the slowdowns; None without a profile.
        bodies_at_peak_bytes: what subgraph bodies hold at the peak.
        streams_declined: why a plan made for copies on streams runs them in line
            (`streams_declined`); None when it does not.
        planned_slowdown: the planned sequence's slowdown, where ``slowdown`` is of what runs.
    """

    copy_mode: str
    peak: Peaks
    lower_bound_bytes: int
    transfer_bytes: Mapping[str, int]
    copies: Mapping[str, int]
    unknown_size_tensors: int
    profile: str | None
    time_s: Mapping[str, float] | None
    time_nodes: Mapping[str, int] | None
    slowdown: Mapping[str, float] | None
    bodies_at_peak_bytes: int
    streams_declined: Declined | None = None
    planned_slowdown: Mapping[str, float] | None = None

    def to_json(self) -> EstimateDoc:
        """The figures as plain JSON values (``peak_bytes`` for `peak`; ``planned_slowdown`` only where given)."""
        doc: EstimateDoc = {
            "copy_mode": self.copy_mode,
            "peak_bytes": self.peak.to_json(),
            "lower_bound_bytes": self.lower_bound_bytes,
            "transfer_bytes": self.transfer_bytes,
            "copies": self.copies,
            "unknown_size_tensors": self.unknown_size_tensors,
            "profile": self.profile,
            "time_s": self.time_s,
            "time_nodes": self.time_nodes,
            "slowdown": self.slowdown,
            "bodies_at_peak_bytes": self.bodies_at_peak_bytes,
            "streams_declined": self.streams_declined,
        }
        if self.planned_slowdown is not None:
            doc["planned_slowdown"] = self.planned_slowdown
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Estimate:
        """The figures `to_json` wrote (a plan's ``summary.estimate``)."""
        names = {f.name for f in dataclasses.fields(cls)} - {"peak"}
        return cls(peak=Peaks.from_json(doc["peak_bytes"]), **{k: v for k, v in doc.items() if k in names})

    def replace(self, **changes: Any) -> Estimate:
        """These figures with ``changes``."""
        return dataclasses.replace(self, **changes)


def estimate_figures(result: SimResult, copies: str = "inline") -> Estimate:
    """Peak, lower bound, bytes moved and estimated time of a simulation.

    ``copies`` says which time the command quotes: ``inline`` (the simulator's serialized time,
    what onnxruntime runs in line) or ``streams`` (its overlapped time: the copies on a stream of their own,
    as ``apply --copies streams`` writes them).
    """
    doc = result.to_json(timeline_limit=0)
    return Estimate(
        copy_mode=copies,
        peak=Peaks.from_json(doc["peak_bytes"]),
        lower_bound_bytes=doc["lower_bound_bytes"],
        transfer_bytes=doc["transfer_bytes"],
        copies=doc["copies"],
        unknown_size_tensors=len(result.unknown_tensors),
        profile=result.profile.name if result.profile is not None else None,
        time_s=doc["time_s"],
        time_nodes=doc["time_nodes"],
        slowdown=doc["slowdown"],
        bodies_at_peak_bytes=doc["bodies_at_peak_bytes"],
    )


def with_run_order_peak(figures: Estimate, replayed: SimResult, order: str, *, streams: bool = False) -> Estimate:
    """``figures`` with the peak after taken from ``replayed`` (`offloadctl.rewriting.preview`: the
    rewrite simulated in the order onnxruntime runs it, ``order``; with ``streams``, as its executor runs
    the two streams of a rewrite whose copies have their own); the planned sequence's own peak stays
    beside it as ``planned_after``, and ``run_by`` says what ran it."""
    peak = figures.peak
    if streams:
        of = f"the rewrite with its copies on their own stream, in onnxruntime's {order.upper()} order"
        run_by = "the two-stream executor"
    else:
        of, run_by = f"the rewrite in onnxruntime's {order.upper()} order", f"the {order.upper()} walk"
    after = replayed.peak_after
    ran = dataclasses.replace(peak, after=after, planned_after=peak.after, of=of, run_by=run_by)
    return figures.replace(peak=ran)


def with_run_time(figures: Estimate, replayed: SimResult) -> Estimate:
    """``figures`` with the time taken from ``replayed`` too (a streams rewrite as the executor runs its two
    streams: `offloadctl.rewriting.preview.streams_run_result`), as `simulate` of the rewrite estimates it:
    a load ``apply`` keeps in line and a copy its gate holds cost there what they cost when run. The planned
    sequence's slowdown stays beside it as ``planned_slowdown``."""
    doc = replayed.to_json(timeline_limit=0)
    if doc["time_s"] is None:
        return figures
    return figures.replace(
        time_s=doc["time_s"], time_nodes=doc["time_nodes"], slowdown=doc["slowdown"], planned_slowdown=figures.slowdown
    )


def with_device_peaks(
    figures: Estimate,
    before: SimResult,
    after: SimResult,
    device: str,
    order: str,
    pins: tuple[int, int] | None = None,
    *,
    streams: bool = False,
) -> Estimate:
    """``figures`` with the peaks before and after taken from the model and its rewrite as ``device``
    runs them (`offloadctl.rewriting.preview.device_result`: its inserted copies, the nodes it runs
    on the host, its executor's order); the planned figures stay beside them as ``planned_before`` and
    ``planned_after``. ``pins``, (checked, broken): the rewrite's order pins checked against that
    order and those it breaks (copies on the wrong side of the node their pin names), are recorded as
    ``peak_bytes.pins_checked`` and ``pins_broken``. ``streams``: ``after`` is the rewrite with its
    copies on a stream of their own, as the two-stream executor runs it (``run_by`` says so)."""
    planned = figures.peak
    of = f"the model and its rewrite as {device} runs them, in onnxruntime's {order.upper()} order"
    if streams:  # the rewrite with its copies on a stream of their own (``streams``)
        of += ", the rewrite's copies on a stream of their own"
    peak = dataclasses.replace(
        planned,
        before=before.peak_after,
        after=after.peak_after,
        planned_before=planned.before,
        planned_after=planned.after,
        device=device,
        of=of,
        run_by="the two-stream executor" if streams else planned.run_by,
        pins_checked=pins[0] if pins is not None else planned.pins_checked,
        pins_broken=pins[1] if pins is not None else planned.pins_broken,
    )
    return figures.replace(peak=peak)


def _offloads_sha256(plan: Plan) -> str:
    return json_sha256(plan["offloads"])


def record_estimate(plan: Plan, figures: Estimate) -> None:
    """Store ``figures`` in ``plan["summary"]["estimate"]``."""
    plan.setdefault("summary", {})["estimate"] = {**figures.to_json(), "offloads_sha256": _offloads_sha256(plan)}


def recorded_estimate(plan: Plan) -> Estimate | None:
    """The figures `record_estimate` stored, or None when there are none or the offloads changed since."""
    recorded = (plan.get("summary") or {}).get("estimate")
    if not isinstance(recorded, dict) or recorded.get("offloads_sha256") != _offloads_sha256(plan):
        return None
    return Estimate.from_json(recorded)


def streams_declined(figures: Estimate, in_line_peak: int | None = None) -> Declined | None:
    """Why a plan's copies run in line though it was made for streams: on a stream of their own, as the
    executor runs them (``figures``: `offloadctl.rewriting.figures.as_run_figures` with copies on
    streams), they gain no time over in line, or they hold more than the same plan in line
    (``in_line_peak``, its peak after as run); None when neither. The slowdowns both ways, and the
    peaks where streams hold more."""
    slow = figures.slowdown
    peak = figures.peak.after
    higher = in_line_peak is not None and peak > in_line_peak
    if not higher and (not slow or slow["overlapped"] < slow["serialized"]):
        return None
    declined: Declined = {"streams": slow["overlapped"], "inline": slow["serialized"]} if slow else {}
    if higher:
        assert in_line_peak is not None
        declined["peaks"] = {"streams": peak, "inline": in_line_peak}
    declined["profile"] = figures.profile
    return declined
