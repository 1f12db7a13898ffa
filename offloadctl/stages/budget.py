"""The budget strategy: choose what to offload so the peak device memory fits a budget.

Where the distance strategy (HyperOffload) offloads every gap longer than ``select_distance``, the
budget strategy chooses individual *intervals* — the gaps of an activation between consecutive
producer/use positions, and the idle stretches of a weight (before its first use, between uses,
after its last use) — so that the peak fits ``budget_bytes`` at the least cost.

The cost (``objective``, see `offloadctl.costs`) is a price per copy: the bytes moved (every byte
crosses the host link; with copies in line on the compute stream every byte is time the model
waits), or the estimated time the copy adds under the copy mode (``copies``): in line, ``latency +
bytes / bandwidth`` of its direction from a device profile; on streams (an estimate for a mode
onnxruntime does not run yet), what the compute in the copy's window does not hide. Offloading a
tensor at all costs its *opening* copies (an activation's D2H, plus the H2D feeding it back as a
graph output; a weight's first H2D), and each further interval one H2D. The number of offloads, by
contrast, says nothing: one large tensor costs more than ten small ones. On streams an H2D is priced
as issued ``prefetch_distance`` before its use, and an activation's D2H by the compute up to its
release point, which its first offloaded gap decides: the greedy prices each move from the current
state, pruning prices each removal the same way, and no bound is recorded (the cost is not a sum of
per-copy prices). With the time objective, the plan the bytes objective finds at the same budget is
estimated too and the faster of the two kept (``budget.compared``), so asking for time never gives
a longer estimated time than asking for bytes.

Memory follows `offloadctl.timeline` (the simulator's rules, stated once there). With prefetch
distance 0 and release distance 0, an interval frees exactly its idle steps, so the search works
on *intervals*: each one a set of steps it frees, its bytes and its cost.

Greedy search (the default), built to scale to graphs of 100,000 nodes:

1. Candidates are what ``select`` accepts at select distance 0 (so ``--never``, unknown sizes,
   host-side inputs, weights that are graph outputs, ``--min-bytes`` are all respected).
   ``--force`` tensors start offloaded (their largest gap) and stay offloaded.
2. While the peak exceeds the budget, look at the peak step. Every interval that would free it is
   scored by the reduction of over-budget memory it brings, summed over all steps (each step
   capped at its excess), per unit of cost. The best is taken together with the intervals that
   score exactly as well, as many as the peak step still needs: the largest that fit in what is
   left, then the smallest that completes it (one round moves many equally good weights at once,
   few and large ones rather than many small ones). Scores are computed for all intervals at once
   from prefix sums of the capped excess (one per distinct tensor size) over the over-budget steps
   only; the memory profile is a `timeline.WorkingSet` (add an interval, find the peak: O(sqrt(steps))).
3. Pruning: every chosen interval whose removal keeps the peak within the budget is dropped, the
   most expensive first (a removal only raises memory, so an interval that cannot go now never can).
4. Prefetch: every reload is first placed at its use (distance 0). Then, in execution order, each
   offload gets the largest per-tensor ``prefetch_distance`` <= the requested global distance that
   keeps the peak within the budget. With copies on streams it gets only the lead its H2Ds need to
   be done in time on the shared link (scheduled back from their deadlines, one copy at a time per
   direction; `_Planner.place_prefetch_streams`), within the same limits: a longer lead would hold
   memory and take the link ahead of copies due sooner.

The plan's ``budget`` object records what the plan costs and a proven lower bound on what any plan
of this strategy must cost (for each of the steps furthest over the budget: the cheapest way to
free its excess, taking intervals fractionally; with release distance 0, where an interval frees
exactly its idle steps), and the gap between them.

Exact search (``optimal=True``, needs HiGHS; linear costs only: bytes, or time with copies in line):
the same choice written as an integer covering program (`offloadctl.stages.optimal`), started from
the greedy's plan, with a time limit; it returns the best plan found, HiGHS's proven bound and the gap. Every answer is checked against the
timeline in exact integer bytes before it is trusted; one that does not fit, or costs more than the
greedy's, is set aside for the greedy's.

If the budget is below the lower bound (the largest single-node working set: inputs, outputs and
weights one node reads), or cannot be reached, a `BudgetUnreachable` error gives the lower bound and
the best peak reachable. `BudgetSearch` prepares what does not depend on the budget once, for
sweeps over many budgets (`offloadctl.tradeoff`). When the user did not enable weights (``--params``) and activations alone
cannot reach the budget, weights are added as candidates and the plan says so.

Weight streaming (``stream_weights``): weights stay on the host and come in by *layer group*.
Groups are built from the execution order: eligible weights sorted by first use are packed into
consecutive groups of at most the size of the largest single node's weights (so a group never has
to be larger than what one node needs anyway; for a transformer this gives roughly the attention
projections, the MLP up and the MLP down of each layer). Group k is copied in at the start of group
k - depth's window and each weight is freed after its last use, so at most depth + 1 groups are on
the device. A weight also read outside its group's window (shared across layers) stays resident.
Streamed weights are fixed choices; with a budget they start loaded at their first use, the search
handles the rest, and prefetch placement then gives each streamed weight the longest lead, up to
its group's depth, that keeps the budget.

A model with dynamic input dimensions is refused until they are pinned (``--input-shape``); other
tensors of unknown size count 0 bytes.
"""

from __future__ import annotations

import fnmatch
import heapq
import itertools
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from offloadctl import timeline
from offloadctl.analysis import Analysis, Use
from offloadctl.costs import (
    COPY_MODES,
    BytesMoved,
    CopyCost,
    CopyTiming,
    InlineTime,
    StreamStall,
    copy_timing,
    make_cost,
    plan_cost,
)
from offloadctl.errors import OffloadError
from offloadctl.plan import check_plan_model, record_stage, require_stage
from offloadctl.plantypes import Kind, Offload, Rejection, RejectionReason, offload, rejection, reload_group
from offloadctl.profiles import DEFAULT_PROFILE, Profile, load_profile
from offloadctl.stages.filter import DEFAULT_MIN_BYTES, DEFAULT_SELECT_NUM, first_use_key
from offloadctl.stages.prefetch import DEFAULT_PREFETCH_DISTANCE, DEFAULT_RELEASE_DISTANCE
from offloadctl.stages.select import select
from offloadctl.timeline import WorkingSet, lower_bound
from offloadctl.units import byte_arg, fmt_bytes

__all__ = [
    "DEFAULT_STREAM_DEPTH",
    "DEFAULT_TIME_LIMIT",
    "BudgetResult",
    "BudgetSearch",
    "BudgetUnreachable",
    "budget_filter",
    "lower_bound",
    "memory_profile",
    "plan_peak",
    "bytes_moved",
    "check_budget",
]

logger = logging.getLogger(__name__)

DEFAULT_STREAM_DEPTH = 1
DEFAULT_TIME_LIMIT = 60.0  # seconds the exact search may take
_BOUND_STEPS = 32  # steps furthest over the budget whose cheapest cover bounds the cost


# --------------------------------------------------------------------------------------------
# Memory accounting from a plan (the timeline's)
# --------------------------------------------------------------------------------------------


def _where(analysis: Analysis, pos: int) -> str:
    if pos >= analysis.num_positions:
        return "the graph outputs, all on the device at the end of the run"
    return f"the working set of node {analysis.node_names[pos]!r} at position {pos}: its inputs, outputs and weights"


def memory_profile(
    analysis: Analysis,
    plan: dict[str, Any] | None = None,
    *,
    prefetch_distance: int = DEFAULT_PREFETCH_DISTANCE,
    release_distance: int = DEFAULT_RELEASE_DISTANCE,
) -> np.ndarray:
    """Device bytes live at each step 0..n (step n = the end of the run) under ``plan``.

    A plan before the prefetch stage (``h2d_before``, ``release_after`` null) is placed with each
    offload's own ``prefetch_distance`` or else ``prefetch_distance``, and ``release_distance``,
    as the prefetch stage would. See `offloadctl.timeline.profile`.
    """
    return timeline.profile(analysis, plan, prefetch_distance=prefetch_distance, release_distance=release_distance)


def plan_peak(
    analysis: Analysis,
    plan: dict[str, Any] | None = None,
    *,
    prefetch_distance: int = DEFAULT_PREFETCH_DISTANCE,
    release_distance: int = DEFAULT_RELEASE_DISTANCE,
) -> tuple[int, int]:
    """(peak bytes, step of the first peak) of :func:`memory_profile`."""
    return timeline.peak_of(
        memory_profile(analysis, plan, prefetch_distance=prefetch_distance, release_distance=release_distance)
    )


def bytes_moved(plan: dict[str, Any]) -> int:
    """Bytes a plan copies per run: one D2H per activation, one H2D per reload group and output."""
    return int(plan_cost(plan, BytesMoved()))


# --------------------------------------------------------------------------------------------
# Candidate tensors, their states and the intervals they offer
# --------------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Cand:
    """One eligible tensor. Gap i of an activation lies between entries[i] and entries[i+1]
    (entries = producer + distinct use positions); gap i of a weight lies between use positions
    entries[i] and entries[i+1] (its outer stretches are freed by offloading it at all)."""

    name: str
    is_act: bool
    b: int
    start: int  # producer (activations) or 0
    uses: list[Use]
    entries: list[int]
    output: bool
    forced: bool
    template: Offload  # the select-stage entry (dtype, shape, producer...)

    @property
    def num_gaps(self) -> int:
        return len(self.entries) - 1

    def gap_len(self, i: int) -> int:
        return self.entries[i + 1] - self.entries[i]

    @property
    def kind(self) -> Kind:
        return "activation" if self.is_act else "parameter"


@dataclass(frozen=True)
class _State:
    offloaded: bool = False
    cuts: frozenset[int] = frozenset()
    distance: int = 0


@dataclass
class _Layout:
    device_uses: list[Use]
    groups: list[tuple[int, list[Use]]]  # (gap before it, uses)


def _layout(c: _Cand, st: _State) -> _Layout:
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
    return _Layout(device, groups)


def _spans(c: _Cand, st: _State, n: int, release_distance: int) -> list[timeline.Span]:
    """Steps a candidate occupies in a state (the timeline's rules)."""
    if not st.offloaded:
        if c.is_act:
            return [(c.start, n if c.output else c.entries[-1])]
        return [(0, n)]
    lay = _layout(c, st)
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


def _opening_cost(c: _Cand, cost: CopyCost) -> float:
    """Cost of offloading a candidate at all: an activation's D2H (+ the H2D back for a graph
    output), a weight's first H2D (prices of size alone: a linear cost's)."""
    if c.is_act:
        return cost.d2h(c.b) + (cost.h2d(c.b) if c.output else 0.0)
    return cost.h2d(c.b)


def _state_cost(c: _Cand, st: _State, cost: CopyCost, n: int = 0, release_distance: int = 0, lead: int = 0) -> float:
    """What a candidate's copies cost in a state. A position-aware cost (not ``linear``) prices each
    H2D issued ``lead`` positions before its group's first use and the D2H released after the last
    device use (+ ``release_distance``); see `offloadctl.costs`."""
    if not st.offloaded:
        return 0.0
    if cost.linear:
        return _opening_cost(c, cost) + len(st.cuts) * cost.h2d(c.b)
    low = timeline.h2d_low(c.kind, c.start if c.is_act else None)
    total = sum(cost.h2d_at(c.b, timeline.h2d_position(f, low, lead), f) for f in _group_firsts(c, st))
    if c.is_act:
        last_device = min(c.entries[k] for k in st.cuts) if st.cuts else c.entries[-1]
        total += cost.d2h_at(c.b, c.start, timeline.release_point(last_device, release_distance, n))
        if c.output:
            total += cost.h2d_at(c.b, n, n)
    return total


def _changes(old: list[timeline.Span], new: list[timeline.Span], b: int) -> list[tuple[int, int, int]]:
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


class _Intervals:
    """Every interval the search may offload, as arrays (one row per interval).

    Row kinds: a candidate's *opening* (gap -1: offloading it at all; frees a weight's outer
    stretches or a graph output's trailing stretch, nothing for other activations) and its *gaps*
    (gap k >= 0: frees the idle steps between entries k and k+1). A gap taken while its candidate
    is not offloaded brings the opening with it. Ranges are inclusive; an empty range has first >
    last. ``held_first`` is where a range starts when it is the candidate's first freed stretch
    and the release distance holds the buffer (activations).
    """

    def __init__(self, cands: list[_Cand], n: int, release_distance: int, cost: CopyCost, lead: int = 0) -> None:
        count = len(cands)
        size = np.fromiter((c.b for c in cands), dtype=np.int64, count=count)
        is_act = np.fromiter((c.is_act for c in cands), dtype=bool, count=count)
        output = np.fromiter((c.output for c in cands), dtype=bool, count=count)
        lengths = np.fromiter((len(c.entries) for c in cands), dtype=np.int64, count=count)
        flat = np.fromiter(itertools.chain.from_iterable(c.entries for c in cands), dtype=np.int64, count=int(lengths.sum()))
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


# --------------------------------------------------------------------------------------------
# The search
# --------------------------------------------------------------------------------------------


class _Planner:
    """Candidate states, the memory profile they give (a `WorkingSet`), and the search over them."""

    def __init__(
        self,
        analysis: Analysis,
        cands: list[_Cand],
        release_distance: int,
        cost: CopyCost,
        report: Callable[[str], None] | None = None,
        lead: int = 0,
    ) -> None:
        self.report = report or (lambda text: None)
        self.n = n = analysis.num_positions
        self.cands = cands
        self.release = release_distance
        self.cost = cost
        self.lead = lead  # the prefetch distance position-aware prices assume
        self.state: list[_State] = [_State()] * len(cands)
        self.fixed = np.zeros(len(cands), dtype=bool)  # streamed weights: never changed by the search
        self.offloaded = np.zeros(len(cands), dtype=bool)
        self.ws = WorkingSet(timeline.profile(analysis, None, prefetch_distance=0))
        self.iv = iv = _Intervals(cands, n, release_distance, cost, lead)
        # position-aware costs: each activation's last device use (its first freed stretch) and D2H price
        self.last_device = np.full(len(cands), np.iinfo(np.int64).max, dtype=np.int64)
        self.d2h_now = np.zeros(len(cands), dtype=np.float64)
        self.rows: list[list[int]] = [[] for _ in cands]
        self.row_of: dict[tuple[int, int], int] = {}
        for j, (i, g) in enumerate(zip(iv.cand.tolist(), iv.gap.tolist())):
            self.rows[i].append(j)
            self.row_of[(i, g)] = j
        # entry of each candidate's first freed stretch (where the release distance holds it)
        self.first_entry = np.full(len(cands), np.iinfo(np.int64).max, dtype=np.int64)
        self._pushed = 0  # order of pruning options with equal savings
        self._open: np.ndarray | None = None  # rows not taken (a superset while rows are only taken)

    # ---------------------------------------------------------------- state and memory

    def spans(self, i: int, st: _State | None = None) -> list[timeline.Span]:
        return _spans(self.cands[i], self.state[i] if st is None else st, self.n, self.release)

    def _fast(self, i: int, st: _State) -> bool:
        """True when a change of candidate ``i`` to ``st`` frees or takes exactly interval rows."""
        return not self.release and not st.distance and not self.state[i].distance

    def _row_ranges(self, j: int) -> list[timeline.Span]:
        iv = self.iv
        return [(int(iv.first0[j]), int(iv.last0[j])), (int(iv.first1[j]), int(iv.last1[j]))]

    def _rows_between(self, i: int, old: _State, new: _State) -> tuple[list[int], list[int]]:
        """Rows freed and rows taken back going from ``old`` to ``new``."""
        iv = self.iv
        added: list[int] = []
        removed: list[int] = []
        for j in self.rows[i]:
            g = int(iv.gap[j])
            had = old.offloaded if g < 0 else g in old.cuts
            has = new.offloaded if g < 0 else g in new.cuts
            if has and not had:
                added.append(j)
            elif had and not has:
                removed.append(j)
        return added, removed

    def set(self, i: int, st: _State, rows: tuple[list[int], list[int]] | None = None, *, defer: list | None = None) -> None:
        """Move candidate ``i`` to state ``st``, updating the profile exactly.

        ``rows``: (rows freed, rows taken back) when the caller knows them. ``defer``: collect the
        profile changes as (first, last, bytes) there instead of applying them.
        """
        c = self.cands[i]
        old = self.state[i]
        iv = self.iv
        if self._fast(i, st):
            added, removed = rows if rows is not None else self._rows_between(i, old, st)
            changes = [(s, e, -c.b) for j in added for s, e in self._row_ranges(j)]
            changes += [(s, e, c.b) for j in removed for s, e in self._row_ranges(j)]
            iv.taken[added] = True
            iv.taken[removed] = False
            if removed:
                self._open = None
        else:
            self._open = None
            changes = _changes(self.spans(i), self.spans(i, st), c.b)
            first = np.iinfo(np.int64).max
            for j in self.rows[i]:
                g = int(iv.gap[j])
                iv.taken[j] = st.offloaded if g < 0 else g in st.cuts
                if iv.taken[j] and c.is_act and (g >= 0 or c.output):
                    first = min(first, int(iv.entry[j]))
            self.first_entry[i] = first
        if defer is not None:
            defer.extend(changes)
        else:
            for s, e, delta in changes:
                self.ws.add(s, e, delta)
        self.state[i] = st
        self.offloaded[i] = st.offloaded
        if not self.cost.linear and c.is_act:
            if st.offloaded:
                last = min(c.entries[k] for k in st.cuts) if st.cuts else c.entries[-1]
                self.last_device[i] = last
                self.d2h_now[i] = self.cost.d2h_at(c.b, c.start, timeline.release_point(last, self.release, self.n))
            else:
                self.last_device[i] = np.iinfo(np.int64).max
                self.d2h_now[i] = 0.0

    def peak(self) -> tuple[int, int]:
        return self.ws.peak()

    def state_cost(self, i: int, st: _State | None = None, cost: CopyCost | None = None) -> float:
        """What candidate ``i``'s copies cost in ``st`` (default: its state), under ``cost`` (default: the search's)."""
        return _state_cost(
            self.cands[i], self.state[i] if st is None else st, cost or self.cost, self.n, self.release, self.lead
        )

    def moved(self, cost: CopyCost | None = None) -> float:
        return sum(self.state_cost(i, cost=cost) for i in range(len(self.cands)))

    # ---------------------------------------------------------------- moves

    def _starts(self, rows: np.ndarray) -> np.ndarray:
        """First step of each row's first range, shortened by the release hold where it would apply."""
        iv = self.iv
        if not self.release:
            return iv.first0[rows]
        cand = iv.cand[rows]
        held = iv.is_act[rows] & (~self.offloaded[cand] | (iv.entry[rows] < self.first_entry[cand]))
        return np.where(held, iv.held_first[rows], iv.first0[rows])

    def covering(self, pos: int, *, held: bool = True) -> np.ndarray:
        """Rows not taken whose own steps include ``pos`` (one at most per candidate).

        ``held``: a row that would become its candidate's first freed stretch starts after the
        release hold (False: it starts at its first idle step).
        """
        iv = self.iv
        if self._open is None:
            self._open = np.flatnonzero(~iv.taken & ~self.fixed[iv.cand])
        rows = self._open = self._open[~iv.taken[self._open]]
        first0 = self._starts(rows) if held else iv.first0[rows]
        hit = ((first0 <= pos) & (pos <= iv.last0[rows])) | ((iv.first1[rows] <= pos) & (pos <= iv.last1[rows]))
        return rows[hit]

    def moves(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """For each row, taking it as a move: (cost, range owner, range first, range last, bytes per row).

        A gap of a candidate that is not offloaded yet brings the candidate's opening along (its
        cost, and its freed steps).
        """
        iv = self.iv
        cand = iv.cand[rows]
        bundle = ~self.offloaded[cand] & (iv.gap[rows] >= 0)
        cost = iv.own_cost[rows] + np.where(bundle, iv.bundle_cost[rows], 0.0)
        if not self.cost.linear:
            # a gap before an offloaded activation's first freed stretch moves its D2H's release earlier
            earlier = self.offloaded[cand] & iv.is_act[rows] & (iv.gap[rows] >= 0) & (iv.entry[rows] < self.last_device[cand])
            cost = cost + np.where(earlier, iv.d2h_first[rows] - self.d2h_now[cand], 0.0)
        owner = np.arange(len(rows))
        firsts = [self._starts(rows), iv.first1[rows]]
        lasts = [iv.last0[rows], iv.last1[rows]]
        owners = [owner, owner]
        opening = iv.opening[cand]
        with_opening = bundle & (opening >= 0)
        o = opening[with_opening]
        for f, l in ((iv.first0[o], iv.last0[o]), (iv.first1[o], iv.last1[o])):
            firsts.append(f)
            lasts.append(l)
            owners.append(owner[with_opening])
        return cost, np.concatenate(owners), np.concatenate(firsts), np.concatenate(lasts), iv.bytes[rows]

    def benefits(
        self, count: int, owner: np.ndarray, first: np.ndarray, last: np.ndarray, size: np.ndarray, excess: np.ndarray
    ) -> np.ndarray:
        """Sum over each move's freed steps of min(excess, bytes), for ``count`` moves (exact integers).

        Only over-budget steps count; one prefix sum of the capped excess per distinct size.
        """
        total = np.zeros(count, dtype=np.int64)
        over = np.flatnonzero(excess > 0)
        keep = first <= last
        owner, first, last = owner[keep], first[keep], last[keep]
        if not len(over) or not len(owner):
            return total
        values = excess[over]
        lo = np.searchsorted(over, first, side="left")
        hi = np.searchsorted(over, last, side="right")
        b = size[owner]
        for value in np.unique(b).tolist():
            prefix = np.concatenate(([0], np.cumsum(np.minimum(values, value))))
            mine = b == value
            np.add.at(total, owner[mine], prefix[hi[mine]] - prefix[lo[mine]])
        return total

    def take(self, j: int, *, defer: list | None = None) -> None:
        """Offload row ``j`` (and its candidate's opening if needed)."""
        iv = self.iv
        i = int(iv.cand[j])
        st = self.state[i]
        g = int(iv.gap[j])
        new = _State(True, st.cuts | {g} if g >= 0 else st.cuts, st.distance)
        added = [j]
        if not st.offloaded and g >= 0 and iv.opening[i] >= 0:
            added.append(int(iv.opening[i]))
        self.set(i, new, (added, []), defer=defer)

    # ---------------------------------------------------------------- the greedy

    def greedy(self, budget: int) -> bool:
        """Add intervals until the peak fits; False when no interval frees the peak step."""
        while True:
            peak, pos = self.peak()
            if peak <= budget:
                return True
            self.report(f"fitting the budget: peak {peak / 2**20:.1f} MiB, budget {budget / 2**20:.1f} MiB")
            rows = self.covering(pos)
            if not len(rows):
                return False
            excess = self.ws.values() - budget
            cost, owner, first, last, size = self.moves(rows)
            benefit = self.benefits(len(rows), owner, first, last, size, excess)
            ratio = benefit / np.where(cost > 0, cost, np.finfo(np.float64).tiny)
            order = np.lexsort((self.iv.cand[rows], -benefit, cost, -ratio))
            best = ratio[order[0]]
            ties = order[ratio[order] >= best]
            changes: list[tuple[int, int, int]] = []
            for k in _fill(size[ties], peak - budget):
                self.take(int(rows[ties[k]]), defer=changes)
            if changes:
                self.ws.add_many(*zip(*changes))

    def prune(self, budget: int) -> None:
        """Drop every chosen interval whose removal keeps the peak within the budget, most expensive first.

        A removal only raises memory, so an option that does not fit now never will: each is tried once.
        """
        heap: list[tuple[float, str, int, int, int]] = []
        for i in range(len(self.cands)):
            st = self.state[i]
            if st.offloaded and not self.fixed[i]:
                for k in sorted(st.cuts):
                    self._push_removal(heap, i, k, last=len(st.cuts) == 1)
                self._push_removal(heap, i, -1, last=not st.cuts)
        peak, at = self.peak()
        while heap:
            _, _, _, i, k = heapq.heappop(heap)
            change = self._removal(i, k)
            if change is None:
                continue
            new, rows = change
            if self._fast(i, new) and peak + self.cands[i].b > budget and any(
                s <= at <= e for j in rows[1] for s, e in self._row_ranges(j)
            ):
                continue  # it would take back the peak step, which has no room for it
            if self._fits(i, new, budget, rows):
                self.set(i, new, rows)
                peak, at = self.peak()
                if len(new.cuts) == 1:
                    self._push_removal(heap, i, next(iter(new.cuts)), last=True)
                if new.offloaded and not new.cuts:
                    self._push_removal(heap, i, -1, last=True)

    def _removal(self, i: int, k: int) -> tuple[_State, tuple[list[int], list[int]] | None] | None:
        """The state without cut ``k`` (k = -1: without offloading at all), and the rows it takes back;
        None when that is not a removal the strategy allows from the current state."""
        c = self.cands[i]
        st = self.state[i]
        if not st.offloaded:
            return None
        if k < 0:
            if st.cuts or c.forced or (c.is_act and not c.output):
                return None
            opening = int(self.iv.opening[i])
            return _State(), ([], [opening] if opening >= 0 else [])
        if k not in st.cuts:
            return None
        rest = st.cuts - {k}
        row = self.row_of.get((i, k))
        taken_back = [row] if row is not None else []
        if c.is_act and not rest and not c.output:
            if c.forced:
                return None
            return _State(), ([], taken_back)
        return _State(True, rest, st.distance), ([], taken_back)

    def _push_removal(self, heap: list, i: int, k: int, *, last: bool) -> None:
        c = self.cands[i]
        change = self._removal(i, k)
        if change is None:
            return
        saved = self.state_cost(i) - self.state_cost(i, change[0])
        self._pushed += 1
        heapq.heappush(heap, (-saved, c.name, self._pushed, i, k))

    def _fits(self, i: int, st: _State, budget: float, rows: tuple[list[int], list[int]] | None = None) -> bool:
        """True when moving candidate ``i`` to ``st`` keeps the peak within ``budget``."""
        b = self.cands[i].b
        if self._fast(i, st):
            added, removed = rows if rows is not None else self._rows_between(i, self.state[i], st)
            if added:
                return False  # only removals are asked for
            return all(self.ws.max(s, e) + b <= budget for j in removed for s, e in self._row_ranges(j) if s <= e)
        return all(
            self.ws.max(s, e) + delta <= budget
            for s, e, delta in _changes(self.spans(i), self.spans(i, st), b)
            if delta > 0
        )

    def place_prefetch(self, budget: float, distance: int, caps: dict[str, int] | None = None) -> None:
        """Largest per-tensor distance <= ``distance`` (or the tensor's cap) keeping the peak within budget."""
        caps = caps or {}
        firsts = {
            i: _group_firsts(self.cands[i], s)
            for i, s in enumerate(self.state)
            if s.offloaded and (not self.fixed[i] or self.cands[i].name in caps)
        }
        order = sorted(firsts, key=lambda i: (firsts[i][0] if firsts[i] else self.n, self.cands[i].name))
        for i in order:
            cap = caps.get(self.cands[i].name, distance)
            if cap <= 0 or not firsts[i]:
                continue
            lead = cap if budget == math.inf else self._longest_lead(i, firsts[i], cap, budget)
            if lead:
                self._lead(i, firsts[i], lead)

    def _windows(self, i: int, firsts: list[int], lead: int) -> list[timeline.Span]:
        """Steps each reload group of candidate ``i`` newly occupies when its H2D moves ``lead`` earlier."""
        c = self.cands[i]
        low = timeline.h2d_low(c.kind, c.start if c.is_act else None)
        return [(timeline.h2d_position(f, low, lead), f - 1) for f in firsts]

    def _lead(self, i: int, firsts: list[int], lead: int) -> None:
        st = self.state[i]
        new = _State(True, st.cuts, lead)
        if self.release or st.distance:
            self.set(i, new)
            return
        for s, e in self._windows(i, firsts, lead):
            self.ws.add(s, e, self.cands[i].b)
        self.state[i] = new

    def _longest_lead(self, i: int, firsts: list[int], cap: int, budget: float) -> int:
        room = budget - self.cands[i].b
        lead = cap
        for s, e in self._windows(i, firsts, cap):
            if s > e:
                continue
            full = np.flatnonzero(self.ws.window(s, e) > room)
            if len(full):
                lead = min(lead, e - s - int(full[-1]))
        overlap = any(b_ - a_ <= lead for a_, b_ in zip(firsts, firsts[1:]))
        if lead and overlap and not self._lead_fits(i, firsts, lead, budget):  # windows that overlap
            lo, hi = 0, lead - 1
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if self._lead_fits(i, firsts, mid, budget):
                    lo = mid
                else:
                    hi = mid - 1
            lead = lo
        return lead

    def _lead_fits(self, i: int, firsts: list[int], lead: int, budget: float) -> bool:
        if self.release or self.state[i].distance:
            return self._fits(i, _State(True, self.state[i].cuts, lead), budget)
        windows = [(s, e) for s, e in self._windows(i, firsts, lead) if s <= e]
        if not windows:
            return True
        lo = min(s for s, _ in windows)
        hi = max(e for _, e in windows)
        extra = np.zeros(hi - lo + 1, dtype=np.int64)
        for s, e in windows:
            extra[s - lo : e - lo + 1] += self.cands[i].b
        return bool((self.ws.window(lo, hi) + extra).max() <= budget)

    def place_prefetch_streams(
        self, budget: float, distance: int, timing: CopyTiming, caps: dict[str, int] | None = None
    ) -> None:
        """Copies on streams: each offload gets the lead its H2Ds need to be done in time on a shared
        link, at most ``distance`` (or its cap) and at most the longest lead that keeps the budget.

        The link is shared: copies in one direction take turns on it, in the order they are issued
        (one copy stream per direction, as the simulator runs them). D2Hs go first come first
        served from the end of their producers. H2Ds are scheduled backwards from their deadlines
        (the start of the group's first use, on the baseline's times), latest deadline first: each
        ends by its deadline and before the link time the later ones took, and starts no earlier
        than its tensor's D2H is done. A group needs the lead back to the first node that starts
        by then; a tensor takes the longest its groups need. So two copies due close together are
        both issued early enough to pass one after the other, and a lead longer than needed, which
        would hold device memory another offload's lead may need and take the link ahead of copies
        due sooner, is not given.
        """
        caps = caps or {}
        starts = timing.starts
        link_free = 0.0
        done: dict[int, float] = {}  # activation -> when its D2H is done
        acts = [i for i, s in enumerate(self.state) if s.offloaded and self.cands[i].is_act]
        for i in sorted(acts, key=lambda i: (self.cands[i].start, self.cands[i].name)):
            c = self.cands[i]
            link_free = done[i] = max(float(starts[min(c.start + 1, self.n)]), link_free) + float(timing.d2h(c.b))
        firsts = {
            i: _group_firsts(self.cands[i], s)
            for i, s in enumerate(self.state)
            if s.offloaded and (not self.fixed[i] or self.cands[i].name in caps)
        }
        jobs = sorted(((f, self.cands[i].name, i) for i, groups in firsts.items() for f in groups), reverse=True)
        needed: dict[int, int] = {}
        free = math.inf
        for f, _, i in jobs:
            c = self.cands[i]
            end = min(float(starts[f]), free)
            begin = max(end - float(timing.h2d(c.b)), done.get(i, 0.0))
            free = min(free, begin)
            low = timeline.h2d_low(c.kind, c.start if c.is_act else None)
            issue = max(low, min(f, int(np.searchsorted(starts, begin, side="right")) - 1))
            needed[i] = max(needed.get(i, 0), f - issue)
        order = sorted(firsts, key=lambda i: (firsts[i][0] if firsts[i] else self.n, self.cands[i].name))
        for i in order:
            lead = min(needed.get(i, 0), caps.get(self.cands[i].name, distance))
            if lead > 0 and firsts[i]:
                if budget != math.inf:
                    lead = self._longest_lead(i, firsts[i], lead, budget)
                if lead:
                    self._lead(i, firsts[i], lead)

    # ---------------------------------------------------------------- bounds

    def best_reachable(self) -> int:
        """The peak with every interval of every candidate offloaded (streamed weights as they are)."""
        if self.release:
            saved = list(self.state)
            for i, c in enumerate(self.cands):
                if not self.fixed[i]:
                    self.set(i, _State(True, frozenset(range(c.num_gaps))))
            best = self.peak()[0]
            for i, st in enumerate(saved):
                self.set(i, st)
            return best
        iv = self.iv
        rows = np.flatnonzero(~iv.taken & ~self.fixed[iv.cand])
        freed = np.zeros(self.n + 1, dtype=np.int64)
        for f, l in ((iv.first0[rows], iv.last0[rows]), (iv.first1[rows], iv.last1[rows])):
            keep = f <= l
            freed += timeline.sweep(self.n + 1, f[keep], l[keep], iv.bytes[rows][keep])
        return int((self.ws.values() - freed).max())

    def cost_bound(self, budget: int) -> float:
        """A lower bound on the cost of any plan from the current state that fits ``budget``.

        For each of the steps furthest over the budget, the cheapest way to free its excess with
        moves from the current state (each candidate frees its bytes there at most once; moves
        taken fractionally) must be paid on top of what is already chosen.
        """
        values = self.ws.values()
        excess = values - budget
        over = np.flatnonzero(excess > 0)
        base = self.moved()
        if not len(over):
            return base
        if len(over) > _BOUND_STEPS:
            over = over[np.argpartition(-excess[over], _BOUND_STEPS)[:_BOUND_STEPS]]
        best = 0.0
        for pos in over.tolist():
            rows = self.covering(pos, held=False)
            if not len(rows):
                continue
            cost, _, _, _, size = self.moves(rows)
            per_byte = cost / size
            order = np.argsort(per_byte, kind="stable")
            sizes = size[order].astype(np.float64)
            freed = np.cumsum(sizes)
            need = float(excess[pos])
            if freed[-1] < need:  # this step cannot be freed: no plan fits, and the search says so
                continue
            k = int(np.searchsorted(freed, need, side="left"))  # the move that completes the cover
            paid = float((sizes[:k] * per_byte[order[:k]]).sum())
            paid += (need - (freed[k - 1] if k else 0.0)) * per_byte[order[k]]
            best = max(best, paid)
        return base + best


def _fill(sizes: np.ndarray, need: int) -> list[int]:
    """Which of equally good moves (``sizes`` bytes each, best first) to take to free ``need`` bytes.

    The largest that still fit in what is left, then the smallest one that completes the cover:
    few moves, and little freed beyond the need.
    """
    order = np.argsort(-sizes, kind="stable")
    chosen: list[int] = []
    left = int(need)
    for k in order.tolist():
        if int(sizes[k]) <= left:
            chosen.append(k)
            left -= int(sizes[k])
            if left <= 0:
                return chosen
    taken = set(chosen)
    rest = [k for k in order.tolist() if k not in taken]
    if rest:
        chosen.append(min(rest, key=lambda k: (int(sizes[k]) < left, int(sizes[k]))) if left > 0 else rest[0])
    return chosen


def _group_firsts(c: _Cand, st: _State) -> list[int]:
    """First use position of each reload group of an offloaded candidate, in order."""
    starts = {c.entries[k + 1] for k in st.cuts}
    if not c.is_act:
        starts.add(c.entries[0])
    return sorted(starts)



# --------------------------------------------------------------------------------------------
# The exact search
# --------------------------------------------------------------------------------------------


_TIME_SCALE = 1e6  # the time objective goes to HiGHS in microseconds (costs near 1 solve better)


@dataclass
class _Exact:
    """What the exact search did."""

    status: str
    seconds: float
    time_limit: float
    columns: int
    rows: int
    nonzeros: int
    bound: float | None  # proven lower bound on the cost, in the objective's unit
    answer: str  # "accepted", or why the greedy's plan was kept

    def to_json(self) -> dict[str, Any]:
        return {
            "name": "HiGHS",
            "status": self.status,
            "seconds": round(self.seconds, 3),
            "time_limit_s": self.time_limit,
            "columns": self.columns,
            "rows": self.rows,
            "nonzeros": self.nonzeros,
            "answer": self.answer,
        }


def _exact(p: _Planner, base: np.ndarray, pinned: set[int], budget: int, time_limit: float) -> tuple[_Exact, list[_State] | None]:
    """Solve the choice exactly from the greedy's states; returns the solver's states if they beat them.

    ``base``: the profile with only the fixed choices (streamed weights, ``pinned`` forced tensors)
    applied; every other candidate starts not offloaded in the program.
    """
    from offloadctl.stages.optimal import CoverProblem, solve_cover

    iv = p.iv
    n = p.n
    scale = 1.0 if p.cost.integral else _TIME_SCALE
    prob = CoverProblem(steps=n + 1, excess=base - budget)
    start: list[float] = []
    y_of: dict[int, int] = {}
    x_of: dict[int, int] = {}
    greedy = p.state
    for i, c in enumerate(p.cands):
        if p.fixed[i] or i in pinned or not p.rows[i]:
            continue
        st = greedy[i]
        y = prob.column(float(iv.opening_cost[i]) * scale, lower=1.0 if c.forced else 0.0)
        start.append(float(st.offloaded))
        y_of[i] = y
        gaps: list[tuple[int, int, int]] = []  # (entry, column, row)
        for j in p.rows[i]:
            g = int(iv.gap[j])
            if g < 0:
                for first, last in p._row_ranges(j):
                    prob.frees(y, first, last, c.b)
                if c.is_act:
                    gaps.append((int(iv.entry[j]), y, j))
                continue
            x = prob.column(float(iv.own_cost[j]) * scale)
            start.append(float(g in st.cuts))
            x_of[j] = x
            for first, last in p._row_ranges(j):
                prob.frees(x, first, last, c.b)
            prob.row([x, y], [1.0, -1.0], -math.inf, 0.0)  # an interval needs its tensor offloaded
            gaps.append((int(iv.entry[j]), x, j))
        if c.is_act and iv.opening[i] < 0:  # an activation is offloaded for the sake of its gaps
            cols = [col for _, col, _ in gaps]
            prob.row([y] + cols, [1.0] + [-1.0] * len(cols), -math.inf, 0.0)
        if c.is_act and p.release:
            # the buffer is held release_distance steps past the first freed stretch:
            # first_k = before_k - before_(k-1), before_k = "some stretch up to k is freed"
            previous = None
            taken_before = 0.0
            for entry, col, _ in sorted(gaps):
                before = prob.column(0.0, integer=False)
                taken_before = max(taken_before, start[col])
                start.append(taken_before)
                prob.row([before, col], [1.0, -1.0], 0.0, math.inf)
                if previous is None:
                    prob.row([before, col], [1.0, -1.0], -math.inf, 0.0)
                else:
                    prob.row([before, previous], [1.0, -1.0], 0.0, math.inf)
                    prob.row([before, previous, col], [1.0, -1.0, -1.0], -math.inf, 0.0)
                hold = (entry + 1, min(entry + p.release, max(n - 1, 0)))
                prob.frees(before, hold[0], hold[1], -c.b)
                if previous is not None:
                    prob.frees(previous, hold[0], hold[1], c.b)
                previous = before
    solution = solve_cover(prob, start=np.asarray(start), time_limit=time_limit, integral_objective=p.cost.integral)
    bound = solution.bound / scale if solution.bound is not None else None
    report = _Exact(
        solution.status, solution.seconds, time_limit, solution.columns, solution.rows, solution.nonzeros, bound, ""
    )
    if solution.values is None:
        report.answer = "no solution found in the time limit: the greedy's plan is kept"
        return report, None
    chosen = list(greedy)
    for i, y in y_of.items():
        cuts = frozenset(int(iv.gap[j]) for j in p.rows[i] if j in x_of and solution.values[x_of[j]] > 0.5)
        offloaded = bool(solution.values[y] > 0.5)
        chosen[i] = _State(True, cuts) if offloaded else _State()
    peak = _exact_peak(p, base, chosen, pinned)
    if peak > budget:
        report.answer = f"rejected: its plan peaks at {peak} bytes > budget {budget} (solver tolerance); the greedy's plan is kept"
        return report, None
    if sum(p.state_cost(i, s) for i, s in enumerate(chosen)) >= p.moved():
        report.answer = "no cheaper than the greedy's plan, which is kept"
        return report, None
    report.answer = "accepted"
    return report, chosen


def _exact_peak(p: _Planner, base: np.ndarray, states: list[_State], pinned: set[int]) -> int:
    """The peak of ``states`` in exact integer bytes, recomputed from the spans (no incremental state)."""
    firsts: list[int] = []
    lasts: list[int] = []
    sizes: list[int] = []
    for i, (c, st) in enumerate(zip(p.cands, states)):
        if p.fixed[i] or i in pinned or not st.offloaded:
            continue
        for s, e, delta in _changes(_spans(c, _State(), p.n, p.release), _spans(c, st, p.n, p.release), c.b):
            firsts.append(s)
            lasts.append(e)
            sizes.append(delta)
    values = np.asarray(base, dtype=np.int64) + timeline.sweep(p.n + 1, firsts, lasts, sizes)
    return int(values.max())


# --------------------------------------------------------------------------------------------
# Weight streaming
# --------------------------------------------------------------------------------------------


def _stream_groups(cands: list[_Cand]) -> tuple[list[list[_Cand]], list[int]]:
    """Pack weights (by first use) into layer groups; returns (groups, window start of each)."""
    weights = sorted((c for c in cands if not c.is_act), key=lambda c: (c.entries[0], c.name))
    if not weights:
        return [], []
    per_node: dict[int, int] = {}
    for c in weights:
        per_node[c.entries[0]] = per_node.get(c.entries[0], 0) + c.b
    cap = max(per_node.values())
    groups: list[list[_Cand]] = []
    size = 0
    for c in weights:
        same_node = groups and groups[-1][-1].entries[0] == c.entries[0]
        if groups and (same_node or size + c.b <= cap):
            groups[-1].append(c)
            size += c.b
        else:
            groups.append([c])
            size = c.b
    starts = [g[0].entries[0] for g in groups]
    return groups, starts


def _stream_states(cands: list[_Cand], depth: int) -> tuple[dict[str, _State], dict[str, Any]]:
    groups, starts = _stream_groups(cands)
    states: dict[str, _State] = {}
    resident: list[str] = []
    group_bytes = []
    for k, g in enumerate(groups):
        window_end = starts[k + 1] - 1 if k + 1 < len(groups) else math.inf
        load_at = starts[max(k - depth, 0)]
        kept = 0
        for c in g:
            if c.entries[-1] > window_end:
                resident.append(c.name)
                continue
            states[c.name] = _State(True, frozenset(), c.entries[0] - load_at)
            kept += c.b
        group_bytes.append(kept)
    info = {
        "depth": depth,
        "groups": len(groups),
        "largest_group_bytes": max(group_bytes, default=0),
        "streamed_bytes": sum(group_bytes),
        "resident_shared": sorted(resident),
    }
    return states, info


# --------------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------------


@dataclass
class BudgetResult:
    """What the strategy found, besides the plan."""

    requested: int | None
    lower_bound: int
    lower_bound_position: int
    peak_before: int
    peak: int
    peak_position: int
    moved: int
    weights_added: bool = False
    stream: dict[str, Any] | None = None
    chosen: dict[str, str] = field(default_factory=dict)
    objective: dict[str, Any] = field(default_factory=lambda: BytesMoved().to_json())
    cost: float = 0.0
    cost_bound: float | None = None
    bound_source: str | None = None  # "steps" (the cheapest cover of the worst steps) or "solver"
    optimal: bool = False
    search: str = "greedy"
    solver: dict[str, Any] | None = None
    copies: str = "inline"

    @property
    def gap(self) -> float | None:
        """(cost - proven bound) / cost; 0 for a plan that costs nothing."""
        if self.cost_bound is None:
            return None
        if self.cost <= 0:
            return 0.0
        return max(0.0, (self.cost - self.cost_bound) / self.cost)

    def to_json(self, prefetch_distance: int, release_distance: int) -> dict[str, Any]:
        doc = {
            "requested_bytes": self.requested,
            "lower_bound_bytes": self.lower_bound,
            "lower_bound_position": self.lower_bound_position,
            "peak_before_bytes": self.peak_before,
            "predicted_peak_bytes": self.peak,
            "predicted_peak_position": self.peak_position,
            "bytes_moved": self.moved,
            "assumed_prefetch_distance": prefetch_distance,
            "assumed_release_distance": release_distance,
            "weights_added_by_budget": self.weights_added,
            "search": self.search,
            "objective": self.objective,
            "copies": self.copies,
            "cost": self.cost,
            "cost_bound": self.cost_bound,
            "gap": self.gap,
            "bound_source": self.bound_source,
            "optimal": self.optimal,
            "solver": self.solver,
            "chosen": self.chosen,
        }
        if self.stream is not None:
            doc["stream_weights"] = self.stream
        return doc


def _candidates(analysis: Analysis, selected0: dict[str, Any], min_bytes: int) -> tuple[list[_Cand], list[dict]]:
    outputs = set(analysis.graph_outputs)
    cands: list[_Cand] = []
    small: list[dict] = []
    for off in selected0["offloads"]:
        name = off["tensor"]
        is_act = off["kind"] == "activation"
        uses = analysis.uses[name]
        start = analysis.producer[name] if is_act else 0
        # uses are in execution order; a node reading a tensor twice gives one entry
        positions = [uses[0][0]] if len(uses) == 1 else list(dict.fromkeys([u[0] for u in uses]))
        entries = [start] + positions if is_act else positions
        if off["bytes"] < min_bytes and not off.get("forced"):
            small.append(_reject(off["tensor"], off["kind"], off["bytes"], "min-bytes", f"{off['bytes']} bytes < --min-bytes {min_bytes}", entries))
            continue
        cands.append(
            _Cand(name, is_act, off["bytes"], start, uses, entries, is_act and name in outputs, bool(off.get("forced")), off)
        )
    cands.extend(_unread_outputs(analysis, selected0, min_bytes, small))
    return cands, small


def _unread_outputs(analysis: Analysis, selected0: dict[str, Any], min_bytes: int, small: list[dict]) -> list[_Cand]:
    """Graph outputs no node reads (e.g. gradients): offloadable over their trailing stretch only.

    ``select`` rejects them as unused (HyperOffload offloads by uses); here a D2H right after the
    producer and the final H2D free the device buffer until the end of the run.
    """
    sel = selected0["options"]["select"]
    never, force = tuple(sel.get("never", ())), tuple(sel.get("force", ()))
    n = analysis.num_positions
    found = []
    for r in selected0["rejected"]:
        name = r["tensor"]
        if r["reason"] != "unused" or r["kind"] != "activation" or name not in analysis.graph_outputs:
            continue
        forced = any(fnmatch.fnmatchcase(name, pat) for pat in force)
        if any(fnmatch.fnmatchcase(name, pat) for pat in never) or not (sel["activations"] or forced):
            continue
        info = analysis.infos.get(name)
        if info is None or info.bytes is None:
            continue
        start = analysis.producer[name]
        if info.bytes < min_bytes and not forced:
            small.append(_reject(name, "activation", info.bytes, "min-bytes", f"{info.bytes} bytes < --min-bytes {min_bytes}", [start]))
            continue
        template = offload(
            tensor=name, kind="activation", dtype=info.dtype, shape=[int(d) for d in info.shape or ()], size=info.bytes,
            producer={"position": start, "node": analysis.node_names[start]}, device_uses=[], reload_groups=[],
            graph_output=True, output_h2d_before=n, forced=forced,
        )
        found.append(_Cand(name, True, info.bytes, start, [], [start], True, forced, template))
    return found


def _max_gap(entries: list[int]) -> int | None:
    return max((b - a for a, b in zip(entries, entries[1:])), default=None)


def _reject(tensor: str, kind: Kind, b: int | None, reason: RejectionReason, detail: str, entries: list[int]) -> Rejection:
    return rejection(tensor, kind, b, "filter", reason, detail, _max_gap(entries))


def _entry(c: _Cand, st: _State, n: int) -> Offload:
    """The plan entry of a candidate offloaded in state ``st``."""
    lay = _layout(c, st)
    t = c.template
    producer = t["producer"]
    return offload(
        tensor=c.name,
        kind=c.kind,
        dtype=t["dtype"],
        shape=t["shape"],
        size=t["bytes"],
        producer={"position": producer["position"], "node": producer["node"]} if producer is not None else None,
        device_uses=[u.to_json() for u in lay.device_uses],
        reload_groups=[reload_group([u.to_json() for u in g], gap) for gap, g in lay.groups],
        graph_output=c.output,
        output_h2d_before=n if c.output else None,
        prefetch_distance=st.distance,
        forced=bool(t.get("forced")),
    )


@dataclass
class _Outcome:
    planner: _Planner
    fits: bool
    reachable: int | None = None  # the best peak reachable, when it does not fit
    bound: float | None = None
    exact: _Exact | None = None


def _solve(
    analysis: Analysis,
    cands: list[_Cand],
    *,
    budget: int | None,
    prefetch_distance: int,
    release_distance: int,
    stream: dict[str, _State] | None,
    cost: CopyCost,
    optimal: bool = False,
    time_limit: float = DEFAULT_TIME_LIMIT,
    report: Callable[[str], None] | None = None,
    timing: CopyTiming | None = None,
) -> _Outcome:
    """One search: ``timing`` places prefetches for copies on streams (None: copies in line)."""
    p = _Planner(analysis, cands, release_distance, cost, report, lead=prefetch_distance)

    def place(limit: float) -> None:
        if timing is None:
            p.place_prefetch(limit, prefetch_distance, caps)
        else:
            p.place_prefetch_streams(limit, prefetch_distance, timing, caps)

    caps: dict[str, int] = {}
    forced: list[int] = []
    for i, c in enumerate(cands):
        if stream and c.name in stream:
            # streamed weights are fixed choices; with a budget their lead (depth) may be shortened
            p.fixed[i] = True
            if budget is None:
                p.set(i, stream[c.name])
            else:
                caps[c.name] = stream[c.name].distance
                p.set(i, _State(True, stream[c.name].cuts, 0))
        elif c.forced:
            forced.append(i)
    pinned = {i for i in forced if not p.rows[i]}  # forced tensors the search has no interval of
    for i in forced:
        c = cands[i]
        if c.is_act and c.num_gaps:
            best = max(range(c.num_gaps), key=lambda k: (c.gap_len(k), -k))
            p.set(i, _State(True, frozenset({best})))
        else:  # a weight, or a graph output nobody reads: its outer or trailing stretch
            p.set(i, _State(True))
    if budget is None:
        place(math.inf)
        return _Outcome(p, True)
    if p.peak()[0] > budget:
        reachable = p.best_reachable()
        if reachable > budget:
            return _Outcome(p, False, reachable=reachable)
    bound = p.cost_bound(budget) if not release_distance and cost.linear else None
    if not p.greedy(budget):  # a release hold can leave a step no interval frees
        return _Outcome(p, False, reachable=p.best_reachable())
    p.report("fitting the budget: dropping offloads it does not need")
    p.prune(budget)
    exact = None
    if optimal:
        p.report("fitting the budget: solving the exact program")
        exact, states = _exact(p, _program_base(p, pinned), pinned, budget, time_limit)
        if states is not None:
            for i, st in enumerate(states):
                if st != p.state[i]:
                    p.set(i, st)
    p.report("fitting the budget: placing prefetches")
    place(budget)
    return _Outcome(p, True, bound=bound, exact=exact)


def _program_base(p: _Planner, pinned: set[int]) -> np.ndarray:
    """The profile with only the fixed choices applied: forced tensors the program decides on are
    taken back to not offloaded (without touching the planner)."""
    values = p.ws.values()
    firsts: list[int] = []
    lasts: list[int] = []
    sizes: list[int] = []
    for i, c in enumerate(p.cands):
        st = p.state[i]
        if p.fixed[i] or i in pinned or not st.offloaded:
            continue
        for s, e, delta in _changes(_spans(c, st, p.n, p.release), _spans(c, _State(), p.n, p.release), c.b):
            firsts.append(s)
            lasts.append(e)
            sizes.append(delta)
    return values + timeline.sweep(p.n + 1, firsts, lasts, sizes)


class BudgetUnreachable(OffloadError):
    """No plan of the budget strategy fits the budget; ``reachable`` is the best peak it can reach."""

    def __init__(self, message: str, *, hint: str | None = None, reachable: int) -> None:
        super().__init__(message, hint=hint)
        self.reachable = reachable


class BudgetSearch:
    """The budget strategy prepared once for a selected plan, to run at any number of budgets.

    What does not depend on the budget is done once and kept: the checks of the plan and the
    model, the lower bound, the candidates (with and without weights) and the device timing of
    copies on streams. `filter` runs one search; `budget_filter` is one `BudgetSearch` and one
    `filter`. The frontier (`offloadctl.tradeoff`) runs many.
    """

    def __init__(
        self,
        plan: dict[str, Any],
        analysis: Analysis,
        *,
        prefetch_distance: int = DEFAULT_PREFETCH_DISTANCE,
        release_distance: int = DEFAULT_RELEASE_DISTANCE,
        select_num: int = DEFAULT_SELECT_NUM,
        min_bytes: int = DEFAULT_MIN_BYTES,
        stream_weights: bool = False,
        stream_depth: int = DEFAULT_STREAM_DEPTH,
    ) -> None:
        require_stage(plan, "selected", "the budget strategy")
        check_plan_model(plan, analysis.loaded.sha256, analysis.loaded.path)
        dynamic = [
            name for name in analysis.graph_inputs
            if (info := analysis.infos.get(name)) is not None and info.copyable and info.bytes is None
        ]
        if dynamic:
            raise OffloadError(
                f"a budget cannot be checked for {analysis.loaded.path}: input(s) {', '.join(dynamic)} have dynamic "
                "dimensions, so the sizes of the tensors computed from them are unknown",
                hint="pin them with --input-shape NAME=D0,D1,... (on select or plan)",
            )
        if select_num != DEFAULT_SELECT_NUM:
            logger.warning("--select-num %d is not used by the budget strategy (it fits the budget instead)", select_num)
        self.plan = plan
        self.analysis = analysis
        self.prefetch_distance = prefetch_distance
        self.release_distance = release_distance
        self.select_num = select_num
        self.min_bytes = min_bytes
        self.stream_weights = stream_weights
        self.stream_depth = stream_depth
        self.lower_bound, self.lower_bound_position = lower_bound(analysis)
        self.peak_before = plan_peak(analysis, None)[0]
        sel = plan["options"]["select"]
        self.params = sel["params"] or stream_weights
        self._prepared: dict[bool, tuple] = {}
        self._timing: dict[int, tuple[Profile, CopyTiming]] = {}

    def _prepare(self, with_params: bool) -> tuple:
        """(selected plan, candidates, candidates too small, streamed states, streaming info), once each."""
        if with_params not in self._prepared:
            sel = self.plan["options"]["select"]
            if sel["select_distance"] == 0 and sel["params"] == with_params:
                selected0 = self.plan  # already every candidate (read only here)
            else:
                selected0 = select(
                    self.analysis, select_distance=0, activations=sel["activations"], params=with_params,
                    force=tuple(sel.get("force", ())), never=tuple(sel.get("never", ())),
                )
            cands, small = _candidates(self.analysis, selected0, self.min_bytes)
            stream = info = None
            if self.stream_weights:
                stream, info = _stream_states(cands, self.stream_depth)
            self._prepared[with_params] = (selected0, cands, small, stream, info)
        return self._prepared[with_params]

    def timing(self, profile: Profile) -> CopyTiming:
        """When each node runs on ``profile``, computed once per profile."""
        hit = self._timing.get(id(profile))
        if hit is None or hit[0] is not profile:
            hit = self._timing[id(profile)] = (profile, copy_timing(self.analysis, profile))
        return hit[1]

    def _attempt(self, with_params: bool, budget: int | None, cost: CopyCost, *, timing: CopyTiming | None,
                 optimal: bool, time_limit: float, report: Callable[[str], None] | None) -> tuple:
        selected0, cands, small, stream, info = self._prepare(with_params)
        outcome = _solve(
            self.analysis, cands, budget=budget, prefetch_distance=self.prefetch_distance,
            release_distance=self.release_distance, stream=stream, cost=cost, optimal=optimal, time_limit=time_limit,
            report=report, timing=timing,
        )
        return selected0, cands, small, info, outcome

    def filter(
        self,
        budget_bytes: int | None,
        *,
        objective: str | CopyCost = "bytes",
        profile: str | Profile | None = None,
        copies: str = "inline",
        optimal: bool = False,
        time_limit: float = DEFAULT_TIME_LIMIT,
        report: Callable[[str], None] | None = None,
        quiet: bool = False,
    ) -> dict[str, Any]:
        """The "filtered" plan whose peak fits ``budget_bytes`` at the least cost (see `budget_filter`).

        ``quiet``: do not warn when weights join the candidates (a sweep over many budgets reads
        ``weights_added_by_budget`` instead).
        """
        analysis = self.analysis
        if copies not in COPY_MODES:
            raise OffloadError(f"unknown copy mode {copies!r}", hint=f"use one of {', '.join(COPY_MODES)}")
        prof = profile if isinstance(profile, Profile) else load_profile(profile or DEFAULT_PROFILE)
        timing = self.timing(prof) if copies == "streams" else None
        if isinstance(objective, CopyCost):
            cost = objective
        elif objective == "time" and copies == "streams":
            cost = StreamStall(self.timing(prof))
        else:
            cost = make_cost(objective, prof)
        if optimal and not cost.linear:
            raise OffloadError(
                "the exact search (--optimal) supports only the linear objectives: bytes, or time with copies in line; "
                "with copies on streams a copy's price depends on the compute around it, which the program cannot state",
                hint="drop --optimal, or use --copies inline (or --objective bytes)",
            )
        if optimal and budget_bytes is None:
            logger.warning("--optimal needs --budget: without a budget there is nothing to optimise")
        lb, lb_pos, before = self.lower_bound, self.lower_bound_position, self.peak_before
        if budget_bytes is not None and budget_bytes < lb:
            raise BudgetUnreachable(
                f"budget {fmt_bytes(budget_bytes)} is below the lower bound {fmt_bytes(lb)} ({lb} bytes) of "
                f"{analysis.loaded.path} ({_where(analysis, lb_pos)}); the peak is {fmt_bytes(before)} without offload",
                hint=f"give --budget {byte_arg(lb)} or more",
                reachable=lb,
            )
        search = {"timing": timing, "optimal": optimal, "time_limit": time_limit, "report": report}
        first = self._attempt(self.params, budget_bytes, cost, **search)
        chosen = first
        weights_added = False
        retry = None
        if not first[-1].fits and not self.params:
            retry = self._attempt(True, budget_bytes, cost, **search)
            if retry[-1].fits:
                if not quiet:
                    logger.warning("activations alone cannot fit the budget: weights were considered too (as with --params)")
                chosen = retry
                weights_added = True
        if not chosen[-1].fits:
            best = min(a[-1].reachable for a in (first, retry) if a is not None and a[-1].reachable is not None)
            raise BudgetUnreachable(
                f"the budget strategy cannot fit {analysis.loaded.path} into {fmt_bytes(budget_bytes)}: the best peak "
                f"reachable is {fmt_bytes(best)} ({best} bytes; lower bound {fmt_bytes(lb)}, peak without offload "
                f"{fmt_bytes(before)})",
                hint=f"raise --budget to at least {byte_arg(best)}, or allow more candidates (--params, fewer --never patterns)",
                reachable=best,
            )
        build = dict(budget_bytes=budget_bytes, cost=cost, profile=prof, copies=copies, optimal=optimal,
                     time_limit=time_limit, weights_added=weights_added)
        if cost.objective != "time" or budget_bytes is None or isinstance(objective, CopyCost):
            return self._build(chosen, **build)
        # the time objective is priced copy by copy; the plan the bytes objective finds is checked too,
        # and the faster of the two (estimated as the chosen copy mode runs) is kept, so asking for
        # time never gives a longer estimate than asking for bytes
        with_params = True if chosen is retry else self.params
        other = self._attempt(with_params, budget_bytes, BytesMoved(), timing=timing, optimal=False,
                              time_limit=time_limit, report=report)
        if not other[-1].fits:  # pragma: no cover - the same candidates fit under any price
            return self._build(chosen, **build)
        if copies == "inline":  # the copies' time in line: a sum the planners' states give
            inline = InlineTime(prof)
            mine_s, theirs_s = chosen[-1].planner.moved(inline), other[-1].planner.moved(inline)
            kept = "bytes" if theirs_s < mine_s - 1e-12 * max(mine_s, 1e-30) else "time"
            new = self._build(chosen, **build) if kept == "time" else self._build(other, **build, searched=chosen[-1])
        else:
            new = self._build(chosen, **build)
            theirs = self._build(other, **build, searched=chosen[-1])
            mine_s, theirs_s = self._stall(new, prof), self._stall(theirs, prof)
            kept = "bytes" if theirs_s < mine_s - 1e-12 * max(mine_s, 1e-30) else "time"
            if kept == "bytes":
                new = theirs
        new["budget"]["compared"] = {"copies": copies, "stall_s": {"time": mine_s, "bytes": theirs_s}, "kept": kept}
        return new

    def _stall(self, filtered: dict[str, Any], profile: Profile) -> float:
        """The time a filtered plan's copies add to the baseline with copies on streams (the simulator's)."""
        from offloadctl.simulator import simulate
        from offloadctl.stages.prefetch import prefetch

        scheduled = prefetch(filtered, prefetch_distance=self.prefetch_distance, release_distance=self.release_distance)
        times = simulate(self.analysis, scheduled, profile=profile).times
        return times.overlapped - times.baseline

    def _build(self, attempt: tuple, *, budget_bytes: int | None, cost: CopyCost, profile: Profile, copies: str,
               optimal: bool, time_limit: float, weights_added: bool, searched: _Outcome | None = None) -> dict[str, Any]:
        """The filtered plan of one search's outcome, priced by ``cost``.

        ``searched``: the search whose bound (and solver) the plan reports, when its plan is another
        search's (the plan the bytes objective found, kept for the time objective).
        """
        analysis = self.analysis
        n = analysis.num_positions
        selected0, cands, small, stream_info, kept = attempt
        planner = kept.planner
        outcome = kept if searched is None else searched
        new = record_stage(  # only the chosen offloads go into the new plan: the selected ones are not copied
            {**self.plan, "offloads": []}, "filtered", "filter",
            {
                "select_num": self.select_num, "min_bytes": self.min_bytes, "strategy": "budget",
                "budget_bytes": budget_bytes, "profile": profile.name if cost.objective == "time" or copies == "streams" else None,
                "objective": cost.objective, "copies": copies, "optimal": optimal,
                "time_limit_s": float(time_limit) if optimal else None,
            },
        )
        new["strategy"] = "budget"
        offloads: list[dict[str, Any]] = []
        handled = {c.name for c in cands} | {r["tensor"] for r in small}
        rejected = [dict(r) for r in selected0["rejected"] if r["tensor"] not in handled] + small
        chosen: dict[str, str] = {}
        for i, c in enumerate(cands):
            st = planner.state[i]
            if st.offloaded:
                offloads.append(_entry(c, st, n))
                if planner.fixed[i]:
                    chosen[c.name] = "streamed weight (layer group)"
                elif c.forced:
                    chosen[c.name] = "forced (--force)"
                else:
                    chosen[c.name] = "needed to fit the budget"
            else:
                why = "the peak fits the budget without it" if budget_bytes is not None else "no budget given"
                rejected.append(_reject(c.name, c.kind, c.b, "budget-not-needed", why, c.entries))
        offloads.sort(key=first_use_key)
        for i, e in enumerate(offloads):
            e["id"] = i
        new["offloads"] = offloads
        new["rejected"] = rejected
        peak, pos = planner.peak()
        total = planner.moved(cost)
        result = BudgetResult(
            requested=budget_bytes, lower_bound=self.lower_bound, lower_bound_position=self.lower_bound_position,
            peak_before=self.peak_before, peak=peak, peak_position=pos, moved=bytes_moved(new),
            weights_added=weights_added, stream=stream_info, chosen=chosen, objective=cost.to_json(),
            cost=_round_cost(total, cost), copies=copies,
        )
        bound, source = (outcome.bound, "steps") if outcome.bound is not None else (None, None)
        if budget_bytes is None:
            bound, source = total, "steps"  # nothing to choose: the fixed choices are the only plan
        if outcome.exact is not None:
            result.search = "exact"
            result.solver = outcome.exact.to_json()
            solver_bound = outcome.exact.bound
            if solver_bound is not None and (bound is None or solver_bound > bound):
                bound, source = solver_bound, "solver"
            if searched is None and outcome.exact.status == "optimal" and outcome.exact.answer in (
                "accepted", "no cheaper than the greedy's plan, which is kept"
            ):
                result.optimal = True
                bound, source = total, "solver"
        if bound is not None and cost.linear:
            if cost.integral:
                bound = math.ceil(bound - 1e-6)
            result.cost_bound = _round_cost(min(bound, total), cost)
            result.bound_source = source
        new["budget"] = result.to_json(self.prefetch_distance, self.release_distance)
        return new


def budget_filter(
    plan: dict[str, Any],
    analysis: Analysis,
    *,
    budget_bytes: int | None,
    prefetch_distance: int = DEFAULT_PREFETCH_DISTANCE,
    release_distance: int = DEFAULT_RELEASE_DISTANCE,
    select_num: int = DEFAULT_SELECT_NUM,
    min_bytes: int = DEFAULT_MIN_BYTES,
    stream_weights: bool = False,
    stream_depth: int = DEFAULT_STREAM_DEPTH,
    profile: str | Profile | None = None,
    report: Callable[[str], None] | None = None,
    objective: str | CopyCost = "bytes",
    copies: str = "inline",
    optimal: bool = False,
    time_limit: float = DEFAULT_TIME_LIMIT,
) -> dict[str, Any]:
    """Turn a "selected" plan into a "filtered" plan whose peak fits ``budget_bytes`` at the least cost.

    Args:
        plan: a plan at stage "selected" for ``analysis``'s model; its select options (activations,
            params, force, never) are kept, its select distance is not used.
        analysis: the analysed model the plan was made for.
        budget_bytes: the peak to fit, or None to offload only what ``stream_weights`` and
            ``--force`` ask for.
        prefetch_distance: the global prefetch distance the prefetch stage will use; each offload
            gets its own distance, at most this, so the peak stays within the budget.
        release_distance: the release distance the prefetch stage will use.
        select_num: recorded; the budget strategy does not cap the number of offloads.
        min_bytes: candidates smaller than this are not considered.
        stream_weights: stream weights in by layer group (see the module docstring).
        stream_depth: how many groups ahead a group is copied in.
        profile: device profile (name or file) of the time objective and of copies on streams.
        report: called with a line of text as the search goes (the peak left to fit).
        objective: what to minimise: ``"bytes"`` (bytes moved), ``"time"`` (the estimated time the
            copies add under ``copies``, on ``profile``; the plan the bytes objective finds is
            checked too and the faster kept), or any `offloadctl.costs.CopyCost`.
        copies: ``"inline"`` (copies on the compute stream, what onnxruntime runs) or ``"streams"``
            (an estimate for copies on separate streams: prefetches are placed for the shared link).
        optimal: also solve the exact program (HiGHS) from the greedy's plan (linear objectives only).
        time_limit: seconds the exact program may take; the best plan found by then is kept.

    Raises:
        OffloadError: the plan is for another model, ``optimal`` with a cost that is not linear, or
            the budget cannot be reached (`BudgetUnreachable`: the message gives the lower bound
            and the best peak reachable).
    """
    return BudgetSearch(
        plan, analysis, prefetch_distance=prefetch_distance, release_distance=release_distance,
        select_num=select_num, min_bytes=min_bytes, stream_weights=stream_weights, stream_depth=stream_depth,
    ).filter(budget_bytes, objective=objective, profile=profile, copies=copies, optimal=optimal,
             time_limit=time_limit, report=report)


def _round_cost(value: float, cost: CopyCost) -> float | int:
    return int(round(value)) if cost.integral else float(value)


def check_budget(analysis: Analysis, plan: dict[str, Any]) -> dict[str, Any]:
    """Check a scheduled budget plan against the timeline and record its figures in ``plan["budget"]``.

    Returns the plan (updated in place).

    Raises:
        OffloadError: the predicted peak exceeds the budget (a bug in the strategy: never expected).
    """
    info = plan.get("budget")
    if info is None:
        return plan
    peak, pos = timeline.peak_of(timeline.profile(analysis, plan, prefetch_distance=0))
    requested = info.get("requested_bytes")
    if requested is not None and peak > requested:
        raise OffloadError(
            f"internal error: the budget plan for {analysis.loaded.path} peaks at {fmt_bytes(peak)} ({peak} bytes) > "
            f"budget {fmt_bytes(requested)} ({requested} bytes)",
            hint="please report it with the model; meanwhile use the distance strategy (--select-distance)",
        )
    info["predicted_peak_bytes"] = int(peak)
    info["predicted_peak_position"] = pos
    info["bytes_moved"] = bytes_moved(plan)
    return plan
