"""A plan's rewritten model in memory, analysed as it will run, and its figures: the CPU arena's
and, in onnxruntime's DEFAULT order, the device's.

`simulate` reports the CPU arena's peak (`offloadctl.simulation.ortcpu`) of the model before and after
its plan. The "after" is the rewritten model itself, built by `apply_plan` without writing a file
(its input shapes pinned as planned) and analysed in the same execution order, so the figure counts
what onnxruntime will see: the copy nodes, their buffers and the planner's reuse around them.

A plan's own simulation places each copy at its planned position among the original nodes. Under
the DEFAULT order (every host but Python) that is not what runs: the walk is taken over the
rewritten graph, copies and order pins included (`offloadctl.analysis.order`). `run_order_result`
simulates the rewrite itself, so its peak is the peak of the model that runs.

On a device provider that runs some nodes on the CPU (a plan made with ``--device``), onnxruntime
also inserts copies between the two and runs the two providers' streams interleaved: `device_result`
simulates the model, or its rewrite, as placed there (`offloadctl.loading.placed`), in the order the
executor runs it (`offloadctl.analysis.order.executor_order`), counting only device memory.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from offloadctl.analysis.graph import Analysis, analyse
from offloadctl.core.onnxutil import copy_kind, is_event, is_pin, pin_view_source
from offloadctl.core.plantypes import Plan
from offloadctl.loading.model import declared_model
from offloadctl.loading.placed import HostPlacement, Placement, placed
from offloadctl.rewriting.metadata import KEY_PINS, PinCheck, check_pins, metadata_json, planned_device
from offloadctl.rewriting.rewrite import RewriteOptions, apply_plan
from offloadctl.rewriting.streams import StreamLayout, checked_streams, with_events
from offloadctl.simulation.arena import ArenaConfig
from offloadctl.simulation.ortcpu import CpuPeak, cpu_peak, declared_shapes
from offloadctl.simulation.ortstreams import cpu_peak_on_streams, executor_analysis
from offloadctl.simulation.profiles import Profile
from offloadctl.simulation.result import SimResult, simulate
from offloadctl.simulation.timing import scratched

__all__ = [
    "as_device_runs",
    "as_it_runs",
    "LoadsInLine",
    "loads_in_line",
    "plan_placement",
    "CpuFigures",
    "cpu_figures",
    "device_result",
    "pins_in_order",
    "placement_of",
    "rewritten_analysis",
    "run_order_result",
    "STREAMS_REPLAY_MAX_NODES",
    "StreamsCost",
    "streams_cost",
    "streams_run_result",
]


def rewritten_analysis(
    plan: Plan | None, analysis: Analysis, placement: Placement | None = None, *, target: str = "gpu"
) -> Analysis:
    """The analysis of ``analysis``'s model rewritten by ``plan`` (in memory; None: the model as it
    is), in the same order, at the shapes it was planned at (a rewrite written with its symbolic
    dimensions would leave the sizes that depend on them unknown); with ``placement``, as onnxruntime
    places it on that device (its copies inserted, the host nodes known). ``target`` is the pins'
    (`RewriteOptions`)."""
    if plan is None:
        proto = analysis.loaded.proto
    else:
        proto = apply_plan(plan, analysis, options=RewriteOptions(pin_shapes=True, target=target, share_weights=True))
    host: frozenset[int] | None = None
    if placement is not None:
        proto, host = placed(proto, placement)
    loaded = dataclasses.replace(analysis.loaded, proto=proto, sizes_from_run=None)
    rewritten = analyse(loaded, order=analysis.order, host=host)
    measured = analysis.infos.measured
    if measured is not None:
        rewritten.infos.use_measured(measured)
    return rewritten


def as_device_runs(analysis: Analysis, host: HostPlacement) -> Analysis:
    """A rewritten model's analysis as the device its plan was made for runs it (``host``, as the rewrite
    records it: `offloadctl.rewriting.metadata.planned_device`): the copies onnxruntime inserts there, the
    nodes it runs on the host, its executor's order."""
    proto, on_host = placed(analysis.loaded.proto, placement_of(analysis, host))
    loaded = dataclasses.replace(analysis.loaded, proto=proto, sizes_from_run=None)
    ran = analyse(loaded, order=analysis.order, host=on_host)
    if analysis.infos.measured is not None:
        ran.infos.use_measured(analysis.infos.measured)
    return ran


def placement_of(analysis: Analysis, host: HostPlacement) -> Placement:
    """The `Placement` of a plan's ``host`` placement in ``analysis``: its nodes on the host (by label in a
    plan, by first output here: names survive a rewrite), the tensors onnxruntime copies, the Casts it
    inserts."""
    labels = set(host.nodes)
    outputs = (node.output for node, label in zip(analysis.nodes, analysis.node_names) if label in labels)
    return Placement(frozenset(out[0] for out in outputs if out and out[0]), host.copies, host.casts)


def device_result(
    plan: Plan | None,
    analysis: Analysis,
    placement: Placement,
    *,
    target: str = "gpu",
    profile: Profile | str | None = None,
) -> tuple[SimResult, PinCheck | None]:
    """The simulation of ``plan``'s rewrite (None: the model as it is) as onnxruntime runs it on a
    device where ``placement`` holds, in ``analysis``'s order: its ``after`` counts device memory in
    the order the executor runs the placed graph; and the rewrite's order pins against that order
    (`pins_in_order`)."""
    placed_analysis = rewritten_analysis(plan, analysis, placement, target=target)
    return simulate(placed_analysis, None, profile=profile), pins_in_order(placed_analysis)


def pins_in_order(rewritten: Analysis) -> PinCheck | None:
    """The order pins a rewrite records (``offloadctl.order_pins``) against the order ``rewritten``
    runs its nodes in (None: it records none), as `offloadctl run` checks them against the order
    that ran. On a device whose inserted copies onnxruntime appends after every node, PRIORITY_BASED
    holds back the nodes that wait for those copies, and the H2Ds that are ready (a weight's, at
    once) run first, before the nodes their pins name."""
    constraints = metadata_json(rewritten.loaded.proto, KEY_PINS)
    if not isinstance(constraints, list):
        return None
    names = [node.name for node in rewritten.nodes]
    return check_pins([c for c in constraints if isinstance(c, dict)], names, rewritten.order)


@dataclasses.dataclass(frozen=True)
class CpuFigures:
    """The CPU arena's figures before and after a plan (``before`` is None for a model that is
    already rewritten: its original is not at hand)."""

    before: CpuPeak | None
    after: CpuPeak
    execution_order: str
    # under PRIORITY_BASED, the smallest arena limit ``after`` runs in: what `run --measure-memory` measures
    # there (a bisection of an arena with kSameAsRequested regions; the C API's MaxInUse runs DEFAULT only)
    limit_bytes: int | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "execution_order": self.execution_order,
            "before": None if self.before is None else self.before.to_json(),
            "after": self.after.to_json(),
            "after_limit_bytes": self.limit_bytes,
        }


def cpu_figures(
    analysis: Analysis,
    plan: Plan | None,
    *,
    rewritten: bool,
    profile: Profile | None,
    streams: Sequence[Sequence[str]] | None = None,
) -> CpuFigures:
    """The CPU arena's peak of the model (``before``) and of it rewritten by ``plan`` (``after``; the
    model itself without a plan), counting the kernel scratch ``profile`` measured. ``streams``: the
    logic streams of a rewrite whose copies run on a stream of their own (its checked partition
    file, `offloadctl.rewriting.streams.checked_streams`), which onnxruntime plans apart
    (`offloadctl.simulation.ortstreams`).

    Shapes the allocation planner compares are those of the model file and of its rewrite as written
    (symbolic dimensions kept), sizes those of the analysis (its pins)."""
    file_shapes = declared_shapes(declared_model(analysis.loaded))
    analysis = scratched(analysis, profile)
    if streams:
        here = cpu_peak_on_streams(analysis, streams, shapes=file_shapes)
    else:
        here = cpu_peak(analysis, shapes=file_shapes)
    if plan is None:
        return CpuFigures(None if rewritten else here, here, analysis.order, _limit(analysis, file_shapes, streams))
    after = scratched(rewritten_analysis(plan, analysis), profile)
    # the planner compares the shapes the rewrite declares as apply writes it (symbolic dimensions
    # kept), not the pinned ones its sizes come from: a pinned copy was credited with reuse onnxruntime
    # does not find (PP-OCRv4 det's DEFAULT rewrite: 57.77 MB replayed, 61.03 MB measured)
    written = declared_shapes(apply_plan(plan, analysis, options=RewriteOptions(share_weights=True)))
    return CpuFigures(here, cpu_peak(after, shapes=written), analysis.order, _limit(after, written, None))


def _limit(analysis: Analysis, shapes: Mapping[str, Any], streams: Sequence[Sequence[str]] | None) -> int | None:
    """Under PRIORITY_BASED, the smallest arena limit one run fits in (an arena of kSameAsRequested regions,
    as `offloadctl.running.allocator.measure_by_limit` sets one up): what is measured there."""
    if analysis.order != "priority" or streams:
        return None
    return cpu_peak(analysis, shapes=shapes, config=ArenaConfig(extend_strategy="kSameAsRequested")).arena_bytes


def run_order_result(plan: Plan, analysis: Analysis, *, profile: Profile | str | None = None) -> SimResult:
    """The simulation of ``plan``'s rewrite as onnxruntime runs it in ``analysis``'s order (its
    ``before`` is the model without copies, its ``after`` the rewrite)."""
    return simulate(rewritten_analysis(plan, analysis), None, profile=profile)


#: Above this many nodes the two-stream reuse plan is not replayed: the replay keeps each node's
#: upstream nodes as a bit set, which grows with the square of the node count.
STREAMS_REPLAY_MAX_NODES = 20_000


@dataclasses.dataclass(frozen=True)
class StreamsCost:
    """The CPU arena's peak of one plan's rewrite with its copies on a stream of their own and in line."""

    streams: CpuPeak
    inline: CpuPeak

    @property
    def extra_bytes(self) -> int:
        return self.streams.peak_bytes - self.inline.peak_bytes

    def to_json(self) -> dict[str, object]:
        return {"streams_bytes": self.streams.peak_bytes, "inline_bytes": self.inline.peak_bytes}


def plan_placement(plan: Plan, analysis: Analysis) -> Placement | None:
    """The placement a plan made for a device records (``plan --device``), None for any other plan."""
    host = HostPlacement.of_record(plan["options"].get("select", {}))
    return placement_of(analysis, host) if host.device else None


#: rounds of `loads_in_line` at most: each takes the loads alive where the memory is over the in-line rewrite's
#: peak only because they were issued early (one or two rounds do on the models measured)
IN_LINE_ROUNDS = 8


@dataclasses.dataclass(frozen=True)
class LoadsInLine:
    """The loads of a streams rewrite that go in line (`loads_in_line`), and the device peaks that decided it:
    the streams rewrite's as the two-stream executor runs it with them in line, and the in-line rewrite's."""

    loads: list[str]
    streams_peak: int
    inline_peak: int

    @property
    def above(self) -> int:
        """What the streams rewrite still holds above the in-line rewrite (0: nothing)."""
        return max(0, self.streams_peak - self.inline_peak)


def loads_in_line(
    plan: Plan, analysis: Analysis, *, target: str = "gpu", placement: Placement | None = None
) -> LoadsInLine:
    """The copies to device of ``plan``'s streams rewrite that go in line, on the compute stream, so that the
    rewrite as the two-stream executor runs it peaks no higher than the same plan written in line, as that
    runs (same order, same device). On the copy stream a load is issued as soon as its gate opens; in line
    under DEFAULT the walk runs one right before its reader. A load alive at the streams rewrite's peak only
    because it was issued before the in-line rewrite issues it is taken off the copy stream (its gates taken
    out, `offloadctl.rewriting.streams.release_loads`), round by round, until the peak is no higher or no
    such load is left."""
    inline = rewritten_analysis(plan, analysis, placement, target=target)
    limit = simulate(inline, None, profile=None).peak_after
    inline_at = _original_nodes_before(inline)
    released: list[str] = []
    peak = limit
    for _ in range(IN_LINE_ROUNDS):
        rewritten, layout = _streams_rewrite(plan, analysis, target=target, placement=placement, in_line=released)
        if not layout.copy_stream:  # nothing left on the copy stream: the rewrite is written in line
            peak = limit
            break
        ran = executor_analysis(rewritten, [layout.copy_stream, layout.compute_stream])
        result = simulate(ran, None, profile=None)
        peak = result.peak_after
        if peak <= limit:
            break
        early = _early_at_peak(ran, result, inline_at, set(layout.copy_stream), limit)
        if not early:
            break
        released += early
    return LoadsInLine(released, peak, limit)


def _original_nodes_before(analysis: Analysis) -> dict[str, int]:
    """For each copy of a rewrite's analysis, how many of the model's own nodes run before it."""
    before, seen = {}, 0
    for node, name in zip(analysis.nodes, analysis.node_names):
        if copy_kind(node) is not None:
            before[name] = seen
        elif not (is_pin(node) or is_event(node)):
            seen += 1
    return before


def _early_at_peak(
    ran: Analysis, result: SimResult, inline_at: dict[str, int], copy_stream: set[str], limit: int
) -> list[str]:
    """The loads on the copy stream alive where ``result`` holds more than ``limit`` (issued at or before such
    a step, first read after it) that ran issues before the in-line rewrite issues them (``inline_at``: the
    model's nodes before each)."""
    trace = result.after
    index = {name: k for k, name in enumerate(ran.node_names)}
    over = sorted(
        index[label]
        for step, held in enumerate(trace.device)
        if held > limit and (label := trace.labels[step]) in index
    )  # (a step's position counts the model's own nodes only: the node's name places it in ran)
    if not over:
        return []
    ran_at = _original_nodes_before(ran)
    early = []
    for pos, (node, name) in enumerate(zip(ran.nodes, ran.node_names)):
        if copy_kind(node) != "h2d" or name not in copy_stream or ran_at.get(name, 0) >= inline_at.get(name, 0):
            continue
        first = _first_read(ran, node.output[0], pos)
        k = bisect.bisect_left(over, pos)  # an over-limit step at or after the load, before its first read
        if k < len(over) and over[k] < first:
            early.append(name)
    return early


def _first_read(analysis: Analysis, name: str, default: int) -> int:
    """Where the first node reads ``name``'s data: an order pin's view is followed to its readers, and a
    pin's or an event's Shape, which reads no data, does not count."""
    first, todo, seen = None, [name], {name}
    while todo:
        for use in analysis.uses.get(todo.pop(), ()):
            node = analysis.nodes[use.position]
            if pin_view_source(node) is not None or is_event(node):
                if node.output[0] not in seen:
                    seen.add(node.output[0])
                    todo.append(node.output[0])
            elif not is_pin(node):
                first = use.position if first is None else min(first, use.position)
    return default if first is None else first


def _streams_rewrite(
    plan: Plan,
    analysis: Analysis,
    *,
    target: str,
    placement: Placement | None = None,
    in_line: Sequence[str] | None = None,
) -> tuple[Analysis, StreamLayout]:
    """``plan``'s rewrite as ``apply --copies streams`` writes it, in memory: its analysis in
    ``analysis``'s order at the shapes it was planned at (sizes as ``analysis`` has them), and its
    streams; with ``placement``, as onnxruntime places it on that device (its copies inserted, the host
    nodes known: they run on the compute stream's side of the partition). ``in_line``: the loads that go in
    line (`loads_in_line`, worked out here when None)."""
    if in_line is None:
        in_line = loads_in_line(plan, analysis, target=target, placement=placement).loads
    pinned = apply_plan(plan, analysis, options=RewriteOptions(pin_shapes=True, target=target, share_weights=True))
    layout = with_events(pinned, "preview.streams.json", analysis.order, target, in_line=in_line)
    host: frozenset[int] | None = None
    if placement is not None:
        pinned, host = placed(pinned, placement)
    loaded = dataclasses.replace(analysis.loaded, proto=pinned, sizes_from_run=None)
    rewritten = analyse(loaded, order=analysis.order, host=host)
    if analysis.infos.measured is not None:
        rewritten.infos.use_measured(analysis.infos.measured)
    return rewritten, layout


def streams_run_result(
    plan: Plan,
    analysis: Analysis,
    *,
    target: str = "gpu",
    profile: Profile | str | None = None,
    placement: Placement | None = None,
) -> SimResult:
    """The simulation of ``plan``'s rewrite as ``apply --copies streams`` writes it, in the order
    onnxruntime's executor runs its two streams (`offloadctl.simulation.ortstreams.executor_analysis`):
    its ``after`` counts the device memory of copies issued as their gates open. With ``placement``, on
    the device it holds for (`device_result`'s placement: the nodes it runs on the host, the copies
    onnxruntime inserts)."""
    rewritten, layout = _streams_rewrite(plan, analysis, target=target, placement=placement)
    if not layout.copy_stream:  # no copy a gate holds: apply writes the copies in line
        return simulate(rewritten_analysis(plan, analysis, placement, target=target), None, profile=profile)
    ran = executor_analysis(rewritten, [layout.copy_stream, layout.compute_stream])
    return simulate(ran, None, profile=profile)


def streams_cost(
    plan: Plan, analysis: Analysis, *, profile: Profile | None = None, target: str = "gpu"
) -> StreamsCost | None:
    """The CPU arena's peak (where device and host are one memory; a device runs the same executor) of
    ``plan``'s rewrite as ``apply --copies streams`` writes it, replayed with onnxruntime's reuse plan
    for two streams (`offloadctl.simulation.ortstreams`), against the same plan's rewrite written in
    line. None above `STREAMS_REPLAY_MAX_NODES` nodes.

    The planner compares the shapes the file declares, so they are those of the rewrite as written
    (symbolic dimensions kept), the sizes those of the analysis (its pins)."""
    if analysis.num_positions > STREAMS_REPLAY_MAX_NODES:
        return None
    in_line = loads_in_line(plan, analysis, target=target).loads
    rewritten, layout = _streams_rewrite(plan, analysis, target=target, in_line=in_line)
    written = apply_plan(plan, analysis, options=RewriteOptions(target=target, share_weights=True))
    with_events(written, "preview.streams.json", analysis.order, target, in_line=in_line)
    rewritten = scratched(rewritten, profile)
    streams = [layout.copy_stream, layout.compute_stream]
    on_streams = cpu_peak_on_streams(rewritten, streams, shapes=declared_shapes(written))
    return StreamsCost(on_streams, cpu_figures(analysis, plan, rewritten=False, profile=profile).after)


def as_it_runs(model: str, analysis: Analysis) -> tuple[Analysis, str | None, list[list[str]] | None, str]:
    """The analysis device memory follows, a streams rewrite's partition file and streams, checked
    (`offloadctl.rewriting.streams.checked_streams`), and the device a rewrite's plan was made for: a
    rewrite as that device runs it (`as_device_runs`), and a streams rewrite
    in the order the executor runs its two streams (`offloadctl.simulation.ortstreams.executor_analysis`);
    any other model as ``analysis`` has it, with None, None and ""."""
    device = planned_device(analysis.loaded.proto)
    ran = as_device_runs(analysis, device) if device is not None else analysis
    name = device.name if device is not None else ""
    checked = checked_streams(model, analysis.loaded.proto, analysis.order)
    if checked is None:
        return ran, None, None, name
    return executor_analysis(ran, checked[1]), checked[0], checked[1], name
