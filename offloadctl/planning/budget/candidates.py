"""Candidate tensors of the budget strategy, their states, and what a state means.

A candidate (`Cand`) is a tensor the select stage accepts at distance 0, with its entries (producer
and distinct use positions; a weight's use positions) between which its gaps lie. A `State` says
whether it is offloaded, which gaps are cut (each opens a reload group) and the prefetch distance
of its reloads. From a state come its reload layout, the steps it occupies (the timeline's rules),
what its copies cost, and its plan entry.
"""

from __future__ import annotations

import fnmatch
import itertools
import operator
from dataclasses import dataclass

import numpy as np

from offloadctl.analysis import timeline
from offloadctl.analysis.graph import Analysis, Use
from offloadctl.core.plantypes import Kind, Offload, Rejection, RejectionReason, rejection, reload_group
from offloadctl.planning.select import Chosen, Selection, chosen_entry
from offloadctl.simulation.costs import CopyCost
from offloadctl.simulation.profiles import Profile

__all__ = [
    "FLOOR_SHARE_OF_PEAK",
    "Cand",
    "Floor",
    "Intervals",
    "Layout",
    "State",
    "candidates",
    "copy_floor",
    "cost_in_state",
    "group_firsts",
    "layout",
    "opening_cost",
    "plan_entry",
    "reject",
    "span_changes",
    "spans_in_state",
]


@dataclass(slots=True)
class Cand:
    """One eligible tensor. Gap i of an activation lies between entries[i] and entries[i+1]
    (entries = producer + distinct use positions); gap i of a weight lies between use positions
    entries[i] and entries[i+1] (its outer stretches are freed by offloading it at all)."""

    name: str
    is_act: bool
    size: int  # bytes
    start: int  # producer (activations) or 0
    uses: list[Use]
    entries: list[int]
    output: bool
    forced: bool
    chosen: Chosen  # what the select stage knows of it (its entry is built only if it is taken)

    @property
    def num_gaps(self) -> int:
        return len(self.entries) - 1

    def gap_len(self, i: int) -> int:
        return self.entries[i + 1] - self.entries[i]

    @property
    def kind(self) -> Kind:
        return "activation" if self.is_act else "parameter"


@dataclass(frozen=True)
class State:
    offloaded: bool = False
    cuts: frozenset[int] = frozenset()
    distance: int = 0


@dataclass
class Layout:
    device_uses: list[Use]
    groups: list[tuple[int, list[Use]]]  # (gap before it, uses)


def layout(c: Cand, st: State) -> Layout:
    """device_uses and reload groups of a candidate under a state (offloaded)."""
    starts = {c.entries[i + 1] for i in st.cuts}
    if not c.is_act:
        starts.add(c.entries[0])
    device: list[Use] = []
    groups: list[tuple[int, list[Use]]] = []
    prev = c.start
    for u in c.uses:
        if u.position in starts and (not groups or groups[-1][1][0].position != u.position):
            groups.append((u.position - prev, [u]))
        elif groups:
            groups[-1][1].append(u)
        else:
            device.append(u)
        prev = u.position
    return Layout(device, groups)


def spans_in_state(c: Cand, st: State, n: int, release_distance: int) -> list[timeline.Span]:
    """Steps a candidate occupies in a state (the timeline's rules)."""
    if not st.offloaded:
        if c.is_act:
            return [timeline.buffer_span(c.start, c.entries[-1], n, to_end=c.output)]
        return [(0, n)]  # a weight a node reads is resident
    lay = layout(c, st)
    low = timeline.h2d_low(c.kind, c.start if c.is_act else None)
    groups = [(timeline.h2d_position(g[0].position, low, st.distance), g[-1].position) for _, g in lay.groups]
    last_device = lay.device_uses[-1].position if lay.device_uses else c.start
    return timeline.offloaded_spans(
        activation=c.is_act,
        producer=c.start,
        last_device_use=last_device,
        release_after=timeline.release_point(last_device, release_distance, n) if c.is_act else None,
        groups=groups,
        output_h2d=n if c.output else None,
        num_positions=n,
    )


def opening_cost(c: Cand, cost: CopyCost) -> float:
    """Cost of offloading a candidate at all: an activation's D2H (+ the H2D back for a graph
    output), a weight's first H2D (prices of size alone: a linear cost's)."""
    if c.is_act:
        return cost.d2h(c.size) + (cost.h2d(c.size) if c.output else 0.0)
    return cost.h2d(c.size)


def cost_in_state(c: Cand, st: State, cost: CopyCost, n: int = 0, release_distance: int = 0, lead: int = 0) -> float:
    """What a candidate's copies cost in a state. A position-aware cost (not ``linear``) prices each
    H2D issued ``lead`` positions before its group's first use and the D2H released after the last
    device use (+ ``release_distance``); see `offloadctl.simulation.costs`."""
    if not st.offloaded:
        return 0.0
    if cost.linear:
        return opening_cost(c, cost) + len(st.cuts) * cost.h2d(c.size)
    low = timeline.h2d_low(c.kind, c.start if c.is_act else None)
    total = sum(cost.h2d_at(c.size, timeline.h2d_position(f, low, lead), f) for f in group_firsts(c, st))
    if c.is_act:
        last_device = min(c.entries[k] for k in st.cuts) if st.cuts else c.entries[-1]
        total += cost.d2h_at(c.size, c.start, timeline.release_point(last_device, release_distance, n))
        if c.output:
            total += cost.h2d_at(c.size, n, n)
    return total


def span_changes(old: list[timeline.Span], new: list[timeline.Span], b: int) -> list[tuple[int, int, int]]:
    """How the profile changes from spans ``old`` to ``new`` of a ``b``-byte tensor: (first, last,
    bytes) pieces covering only the steps that change."""
    events: dict[int, int] = {}
    for spans, sign in ((old, -b), (new, b)):
        for s, e in spans:
            events[s] = events.get(s, 0) + sign
            events[e + 1] = events.get(e + 1, 0) - sign
    pieces = []
    level = 0
    points = sorted(events)
    for k, at in enumerate(points[:-1]):
        level += events[at]
        if level:
            pieces.append((at, points[k + 1] - 1, level))
    return pieces


def group_firsts(c: Cand, st: State) -> list[int]:
    """First use position of each reload group of an offloaded candidate, in order."""
    starts = {c.entries[k + 1] for k in st.cuts}
    if not c.is_act:
        starts.add(c.entries[0])
    return sorted(starts)


#: A budget plan's copies free at least this share of the model's peak (unless the link's own floor is lower)
FLOOR_SHARE_OF_PEAK = 1000


def copy_floor(profile: Profile, peak_before: int) -> int:
    """The smallest tensor a budget or slowdown plan copies when ``--min-bytes`` is not given: the lesser
    of what the profile's link moves in the fixed time one copy costs anyway (``latency_s x bandwidth``,
    the slower direction's; 250,000 bytes on ascend-910b), so that no copy costs more in overhead than in
    bytes, and 0.1% of the model's peak, so that a small model keeps copies that matter to it. A 4-byte
    scalar is below both on any model worth planning."""
    link = min((profile.h2d, profile.d2h), key=lambda d: d.latency_s * d.bandwidth)
    return max(1, min(int(link.latency_s * link.bandwidth), peak_before // FLOOR_SHARE_OF_PEAK))


@dataclass(frozen=True)
class Floor:
    """The smallest tensor a plan copies: ``bytes``, and whether ``--min-bytes`` gave it (else `copy_floor`)."""

    bytes: int
    given: bool = True

    def rejection(self, name: str, kind: Kind, size: int, entries: list[int]) -> Rejection:
        if self.given:
            return reject(name, kind, size, "min-bytes", f"{size} bytes < --min-bytes {self.bytes}", entries)
        detail = (
            f"{size} bytes: smaller than a copy is worth here ({self.bytes} bytes, the lesser of what the link moves "
            "in one copy's fixed time and 0.1% of the peak; --min-bytes sets another)"
        )
        return reject(name, kind, size, "too-small", detail, entries)


def candidates(
    analysis: Analysis, selection: Selection, weights: bool, floor: Floor
) -> tuple[list[Cand], list[Rejection]]:
    """The candidates of ``selection``'s plan with or without weights, and those under ``floor`` as
    rejections."""
    outputs = analysis.graph_output_set
    cands: list[Cand] = []
    small: list[Rejection] = []
    for chosen in selection.chosen(weights=weights):
        name = chosen.tensor
        is_act = chosen.kind == "activation"
        size = chosen.size
        uses = analysis.uses[name]
        start = chosen.start
        # uses are in execution order; a node reading a tensor twice gives one entry
        positions = [uses[0][0]] if len(uses) == 1 else list(dict.fromkeys([u[0] for u in uses]))
        entries = [start] + positions if is_act else positions
        if size < floor.bytes and not chosen.forced:
            small.append(floor.rejection(name, chosen.kind, size, entries))
            continue
        cands.append(Cand(name, is_act, size, start, uses, entries, is_act and name in outputs, chosen.forced, chosen))
    cands.extend(_unread_outputs(analysis, selection, floor, small))
    return cands, small


def _unread_outputs(analysis: Analysis, selection: Selection, floor: Floor, small: list[Rejection]) -> list[Cand]:
    """Graph outputs no node reads (e.g. gradients): offloadable over their trailing stretch only.

    ``select`` rejects them as unused (HyperOffload offloads by uses); here a D2H right after the
    producer and the final H2D free the device buffer until the end of the run.
    """
    options = selection.options
    never, force = tuple(options.never), tuple(options.force)
    found = []
    for r in selection.unread_outputs():
        name = r["tensor"]
        forced = any(fnmatch.fnmatchcase(name, pat) for pat in force)
        if any(fnmatch.fnmatchcase(name, pat) for pat in never) or not (options.activations or forced):
            continue
        info = analysis.infos.get(name)
        if info is None or info.bytes is None:
            continue
        start = analysis.producer[name]
        if info.bytes < floor.bytes and not forced:
            small.append(floor.rejection(name, "activation", info.bytes, [start]))
            continue
        chosen = Chosen(name, "activation", start, forced, info)
        found.append(Cand(name, True, info.bytes, start, [], [start], True, forced, chosen))
    return found


def _max_gap(entries: list[int]) -> int | None:
    """The largest difference between consecutive entries (None for fewer than two)."""
    return max(map(operator.sub, entries[1:], entries)) if len(entries) > 1 else None


def reject(
    tensor: str, kind: Kind, b: int | None, reason: RejectionReason, detail: str, entries: list[int]
) -> Rejection:
    return rejection(tensor, kind, b, "filter", reason, detail, _max_gap(entries))


def plan_entry(c: Cand, st: State, analysis: Analysis) -> Offload:
    """The plan entry of a candidate offloaded in state ``st``."""
    lay = layout(c, st)
    return chosen_entry(
        analysis,
        c.chosen,
        device_uses=[u.to_json() for u in lay.device_uses],
        reload_groups=[reload_group([u.to_json() for u in g], gap) for gap, g in lay.groups],
        prefetch_distance=st.distance,
    )


class Intervals:
    """Every interval the search may offload, as arrays (one row per interval).

    Row kinds: a candidate's *opening* (gap -1: offloading it at all; frees a weight's outer
    stretches or a graph output's trailing stretch, nothing for other activations) and its *gaps*
    (gap k >= 0: frees the idle steps between entries k and k+1). A gap taken while its candidate
    is not offloaded brings the opening with it. Ranges are inclusive; an empty range has first >
    last. ``held_first`` is where a range starts when it is the candidate's first freed stretch
    and the release distance holds the buffer (activations).
    """

    def __init__(self, cands: list[Cand], n: int, release_distance: int, cost: CopyCost, lead: int = 0) -> None:
        count = len(cands)
        size = np.fromiter((c.size for c in cands), dtype=np.int64, count=count)
        is_act = np.fromiter((c.is_act for c in cands), dtype=bool, count=count)
        output = np.fromiter((c.output for c in cands), dtype=bool, count=count)
        lengths = np.fromiter((len(c.entries) for c in cands), dtype=np.int64, count=count)
        flat = np.fromiter(
            itertools.chain.from_iterable(c.entries for c in cands), dtype=np.int64, count=int(lengths.sum())
        )
        owner = np.repeat(np.arange(count), lengths)
        first_entry = np.cumsum(lengths) - lengths
        last = flat[np.maximum(first_entry + lengths - 1, 0)] if len(flat) else np.zeros(count, dtype=np.int64)
        first = flat[np.minimum(first_entry, max(len(flat) - 1, 0))] if len(flat) else np.zeros(count, dtype=np.int64)
        # openings: weights (outer stretches) and graph outputs (trailing stretch)
        opens = np.flatnonzero((size > 0) & (~is_act | output))
        w = ~is_act[opens]
        o_first0 = np.where(w, 0, last[opens] + 1)
        o_last0 = np.where(w, first[opens] - 1, n - 1)
        o_first1 = np.where(w, last[opens] + 1, 1)
        o_last1 = np.where(w, n, 0)
        o_held = np.where(w, o_first0, last[opens] + release_distance + 1)
        # gaps with at least one idle step
        k = np.flatnonzero((owner[:-1] == owner[1:]) & (flat[1:] - flat[:-1] >= 2) & (size[owner[:-1]] > 0))
        g_cand = owner[k]
        g_first = flat[k] + 1
        g_held = np.where(is_act[g_cand], flat[k] + release_distance + 1, g_first)
        self.cand = np.concatenate((opens, g_cand))
        self.gap = np.concatenate((np.full(len(opens), -1, dtype=np.int64), k - first_entry[g_cand]))
        self.entry = np.concatenate((last[opens], flat[k]))
        self.first0 = np.concatenate((o_first0, g_first))
        self.last0 = np.concatenate((o_last0, flat[k + 1] - 1))
        self.first1 = np.concatenate((o_first1, np.ones(len(k), dtype=np.int64)))
        self.last1 = np.concatenate((o_last1, np.zeros(len(k), dtype=np.int64)))
        self.held_first = np.concatenate((o_held, g_held))
        self.bytes = size[self.cand]
        self.is_act = is_act[self.cand]
        self.opening = np.full(count, -1, dtype=np.int64)
        self.opening[opens] = np.arange(len(opens))
        # prices: each H2D issued `lead` positions before its group's first use (not before `low`); an
        # activation's D2H released after the last device use, which its first freed stretch decides
        producer = np.fromiter((c.start for c in cands), dtype=np.int64, count=count)
        low = np.where(is_act, producer + 1, 0)
        first_h2d = cost.h2d_many(size, np.maximum(0, first - lead), first)  # a weight's first group
        release_last = np.minimum(last + release_distance, max(n - 1, 0))
        out_h2d = np.where(output, cost.h2d_many(size, np.full(count, n), np.full(count, n)), 0.0)
        d2h_last = cost.d2h_many(size, producer, release_last)
        self.opening_cost = np.where(is_act, d2h_last + out_h2d, first_h2d)
        g_use = flat[k + 1]
        g_h2d = cost.h2d_many(size[g_cand], np.maximum(low[g_cand], g_use - lead), g_use)
        self.own_cost = np.concatenate((self.opening_cost[opens], g_h2d))
        rows_cand = self.cand
        release_first = np.minimum(self.entry + release_distance, max(n - 1, 0))
        # the D2H price when the row is its activation's first freed stretch, and what taking a gap of
        # a candidate not offloaded yet brings along (its D2H, or a weight's first H2D)
        self.d2h_first = np.where(self.is_act, cost.d2h_many(self.bytes, producer[rows_cand], release_first), 0.0)
        self.bundle_cost = np.where(self.is_act, self.d2h_first + out_h2d[rows_cand], self.opening_cost[rows_cand])
        self.taken = np.zeros(len(self.cand), dtype=bool)

    def __len__(self) -> int:
        return len(self.cand)
