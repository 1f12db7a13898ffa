"""A rewrite's copies put on a stream of their own (``apply --copies streams``): its events and partition
(`offloadctl.rewriting.streams.with_events`), the loads kept in line (`offloadctl.rewriting.preview.loads_in_line`),
and the rewrite written in line instead where no gate holds a copy, or where on streams it would peak
above in line and that was not asked for by name."""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

from offloadctl.analysis.graph import Analysis
from offloadctl.core.plantypes import Plan
from offloadctl.core.units import fmt_bytes
from offloadctl.rewriting.guards import GUARD_PREFIX
from offloadctl.rewriting.preview import loads_in_line, plan_placement
from offloadctl.rewriting.rewrite import ApplyResult, RewriteOptions, apply_plan
from offloadctl.rewriting.streams import StreamLayout, with_events

__all__ = ["OnStreams", "on_streams"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class OnStreams:
    """The rewrite as written: the model, its events (None: written in line), and why it was written in line."""

    proto: Any
    events: StreamLayout | None
    in_line_why: str | None


def on_streams(
    plan: Plan,
    analysis: Analysis,
    proto: Any,
    options: RewriteOptions,
    partition_name: str,
    result: ApplyResult | None,
) -> OnStreams:
    """``plan``'s rewrite ``proto`` with its copies on a stream of their own, the partition file named
    ``partition_name``; or written in line (`_written_in_line` says why, as a warning). ``result``
    gets the guards, the copy mode written, the loads in line and the reason."""
    placement = plan_placement(plan, analysis)
    decided = loads_in_line(plan, analysis, target=options.target, placement=placement)
    layout = with_events(proto, partition_name, analysis.order, options.target, in_line=decided.loads)
    why = _written_in_line(decided, bool(layout.copy_stream), options.streams_above_inline)
    events: StreamLayout | None = layout
    if why is not None:
        proto = apply_plan(plan, analysis, options=replace(options, share_weights=True))
        events = None
    if result is not None:
        result.guards = [n.name for n in proto.graph.node if n.name.startswith(GUARD_PREFIX)]
        result.copy_mode = "streams" if events is not None else "inline"
        result.in_line = [] if events is None else list(events.in_line)
        result.written_in_line = why
    return OnStreams(proto, events, why)


def _written_in_line(decided: Any, held: bool, asked: bool) -> str | None:
    """Why a rewrite planned on streams is written in line (None: it is written on streams), said as a
    warning: no copy a gate holds (``held`` False: nothing to overlap, and an empty stream crashes), or on
    streams it would peak above in line (`loads_in_line`'s ``decided``), unless ``asked`` for by name."""
    above = (
        f"on streams the rewrite would peak at {fmt_bytes(decided.streams_peak)} on the device as "
        f"onnxruntime's executor runs the two streams, {fmt_bytes(decided.above)} above the same plan in "
        f"line ({fmt_bytes(decided.inline_peak)}): its events move the walk so that loads run earlier"
    )
    if not held:
        logger.warning(
            "no copy of this plan can be held on a stream of its own (every load runs before any compute "
            "node, or no gate holds it): the copies are written in line, without a partition file"
        )
        return "no copy a gate holds"
    if decided.above and not asked:  # never above the rewrite in line
        logger.warning("%s; the copies are written in line (apply --copies streams writes them so)", above)
        return f"on streams it would peak {fmt_bytes(decided.above)} above in line"
    if decided.above:  # asked for: written so, and said
        logger.warning("%s; apply with --copies inline to keep the lower peak", above)
    return None
