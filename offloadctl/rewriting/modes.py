"""How a plan's rewrite is written: the copy mode a plan was made for (`planned_copy_mode`), the one
asked for and the one written (`choose_copy_mode`), and the device a plan was made for (`plan_device`)."""

from __future__ import annotations

from dataclasses import dataclass

from offloadctl.core.errors import OffloadError
from offloadctl.core.plantypes import Plan
from offloadctl.loading.placed import HostPlacement
from offloadctl.planning.request import runs_copy_streams
from offloadctl.simulation.costs import COPY_MODES
from offloadctl.simulation.estimate import recorded_estimate, streams_declined

__all__ = ["CopyChoice", "choose_copy_mode", "plan_device", "planned_copy_mode"]

_MODE_WORDS = {"inline": "in line", "streams": "on streams"}


def plan_device(plan: Plan) -> str:
    """The device a plan was made for (``plan --device``: ``ascend``, ``cuda``, ``webgpu``), or ""."""
    return HostPlacement.of_record(plan["options"].get("select", {})).name


def planned_copy_mode(plan: Plan) -> str:
    """How a plan's copies were planned to run (`COPY_MODES`): the mode its events pass recorded
    (``plan --copies``), ``inline`` for a plan made by the stage commands."""
    mode = (plan.get("summary") or {}).get("events", {}).get("copies")
    return mode if mode in COPY_MODES else "inline"


@dataclass(frozen=True)
class CopyChoice:
    """The copy mode a rewrite is written with (`choose_copy_mode`).

    Attributes:
        mode: what is written.
        planned: what the plan was made for (`planned_copy_mode`).
        why: when ``mode`` is not what was asked for (or planned), why, for a warning; None otherwise.
    """

    mode: str
    planned: str
    why: str | None = None

    @property
    def overridden(self) -> bool:
        """The rewrite is written in another mode than the plan's figures count."""
        return self.mode != self.planned


def choose_copy_mode(plan: Plan, requested: str | None = None) -> CopyChoice:
    """The copy mode to write ``plan`` with: ``requested`` when given (it overrides the plan's, with a
    reason to warn of: the plan's figures then count the other mode), else the plan's own. A provider
    without streams (WebGPU) and a plan that moves nothing get their copies in line: there is no stream to
    put them on, or nothing to overlap."""
    planned = planned_copy_mode(plan)
    if requested is not None and requested not in COPY_MODES:
        raise OffloadError(f"unknown copy mode {requested!r}", hint=f"use one of: {', '.join(COPY_MODES)}")
    mode = requested or planned
    why = None
    declined = (plan.get("summary") or {}).get("events", {}).get("streams_declined")
    if mode == "streams" and declined:  # made for streams, which gained nothing: the plan runs in line
        why = (
            f"the plan estimates {declined['streams']:.2f}x with its copies on streams and {declined['inline']:.2f}x "
            f"in line (profile {declined['profile']}), so it runs them in line; written on streams as asked (its "
            "recorded figures are those in line: simulate the rewrite for its own)"
        )
    elif mode != planned:
        why = (
            f"the plan was made for copies {_MODE_WORDS[planned]} and is written with copies {_MODE_WORDS[mode]}, as "
            f"asked: its recorded figures are those of copies {_MODE_WORDS[planned]} (simulate the rewrite for its own)"
        )
    if mode == "streams" and not runs_copy_streams(plan_device(plan)):
        return CopyChoice("inline", planned, "WebGPU registers no streams: its copies run in line, and no partition "
                          "file is written")  # fmt: skip
    if mode == "streams" and not plan["offloads"]:
        return CopyChoice("inline", planned, "the plan moves nothing, so there is nothing to overlap: the model is "
                          "written without events and without a partition file")  # fmt: skip
    slower = _streams_not_faster(plan) if mode == "streams" else None
    if slower is not None:  # a streams rewrite holds no less than in line: without time to gain, in line wins
        if requested is None:
            return CopyChoice("inline", planned, f"{slower}: the copies are written in line")
        why = f"{slower}; written on streams as asked"
    return CopyChoice(mode, planned, why)


def _streams_not_faster(plan: Plan) -> str | None:
    """Why ``plan``'s copies gain no time on a stream of their own (its recorded estimate on streams, events
    priced, is no faster than in line: `streams_declined`; a plan that `offloadctl plan` made records that
    itself, an older one may not), or None when they do or the plan records no estimate."""
    figures = recorded_estimate(plan)
    declined = streams_declined(figures) if figures else None
    if declined is None or "streams" not in declined:
        return None
    return (
        f"its events cost more than the overlap hides: the plan estimates {declined['streams']:.2f}x with its copies "
        f"on streams and {declined['inline']:.2f}x in line (profile {declined['profile']})"
    )
