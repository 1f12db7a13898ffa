"""The greedy budget search: intervals as arrays, the planner that adds and prunes them on an
incremental memory profile, prefetch placement, and a proven lower bound on the cost.

`solve` runs one search for one budget (with the exact search from its result when asked); see
the package docstring for the rules.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable

import numpy as np

from offloadctl.analysis import timeline
from offloadctl.analysis.graph import Analysis
from offloadctl.analysis.timeline import WorkingSet
from offloadctl.planning.budget.candidates import (
    Cand,
    Intervals,
    State,
    cost_in_state,
    group_firsts,
    span_changes,
    spans_in_state,
)
from offloadctl.simulation.costs import CopyCost, CopyTiming
from offloadctl.simulation.memory import resident_profile

__all__ = ["Intervals", "Planner"]

_BOUND_STEPS = 32  # steps furthest over the budget whose cheapest cover bounds the cost


class Planner:
    """Candidate states, the memory profile they give (a `WorkingSet`), and the search over them."""

    def __init__(
        self,
        analysis: Analysis,
        cands: list[Cand],
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
        self.state: list[State] = [State()] * len(cands)
        self.fixed = np.zeros(len(cands), dtype=bool)  # streamed weights: never changed by the search
        self.offloaded = np.zeros(len(cands), dtype=bool)
        self.ws = WorkingSet(resident_profile(analysis))
        self.iv = iv = Intervals(cands, n, release_distance, cost, lead)
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

    def spans(self, i: int, st: State | None = None) -> list[timeline.Span]:
        return spans_in_state(self.cands[i], self.state[i] if st is None else st, self.n, self.release)

    def _fast(self, i: int, st: State) -> bool:
        """True when a change of candidate ``i`` to ``st`` frees or takes exactly interval rows."""
        return not self.release and not st.distance and not self.state[i].distance

    def _row_ranges(self, j: int) -> list[timeline.Span]:
        iv = self.iv
        return [(int(iv.first0[j]), int(iv.last0[j])), (int(iv.first1[j]), int(iv.last1[j]))]

    def _rows_between(self, i: int, old: State, new: State) -> tuple[list[int], list[int]]:
        """(rows freed, rows restored) going from ``old`` to ``new``: intervals the new state offloads that the
        old did not, and intervals the old state offloaded that the new does not."""
        iv = self.iv
        freed: list[int] = []
        restored: list[int] = []
        for j in self.rows[i]:
            g = int(iv.gap[j])
            had = old.offloaded if g < 0 else g in old.cuts
            has = new.offloaded if g < 0 else g in new.cuts
            if has and not had:
                freed.append(j)
            elif had and not has:
                restored.append(j)
        return freed, restored

    def set(
        self, i: int, st: State, rows: tuple[list[int], list[int]] | None = None, *, defer: list | None = None
    ) -> None:
        """Move candidate ``i`` to state ``st``, updating the profile exactly.

        ``rows``: (rows freed, rows taken back) when the caller knows them. ``defer``: collect the
        profile changes as (first, last, bytes) there instead of applying them.
        """
        c = self.cands[i]
        old = self.state[i]
        iv = self.iv
        if self._fast(i, st):
            freed, restored = rows if rows is not None else self._rows_between(i, old, st)
            changes = [(s, e, -c.size) for j in freed for s, e in self._row_ranges(j)]
            changes += [(s, e, c.size) for j in restored for s, e in self._row_ranges(j)]
            iv.taken[freed] = True
            iv.taken[restored] = False
            if restored:
                self._open = None
        else:
            self._open = None
            changes = span_changes(self.spans(i), self.spans(i, st), c.size)
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
                self.d2h_now[i] = self.cost.d2h_at(c.size, c.start, timeline.release_point(last, self.release, self.n))
            else:
                self.last_device[i] = np.iinfo(np.int64).max
                self.d2h_now[i] = 0.0

    def peak(self) -> tuple[int, int]:
        return self.ws.peak()

    def state_cost(self, i: int, st: State | None = None, cost: CopyCost | None = None) -> float:
        """What candidate ``i``'s copies cost in ``st`` (default: its state), under ``cost`` (default: the search's)."""
        return cost_in_state(
            self.cands[i], self.state[i] if st is None else st, cost or self.cost, self.n, self.release, self.lead
        )

    def moved(self, cost: CopyCost | None = None) -> float:
        """What every candidate's copies cost: the offloaded ones', in candidate order (the others cost 0.0)."""
        taken = np.flatnonzero(self.offloaded).tolist()
        # a float, as the sum over every candidate was, even when none is offloaded (0 with no candidate)
        start = 0.0 if self.cands else 0
        return sum((self.state_cost(i, cost=cost) for i in taken), start)

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
            earlier = (
                self.offloaded[cand] & iv.is_act[rows] & (iv.gap[rows] >= 0) & (iv.entry[rows] < self.last_device[cand])
            )
            cost = cost + np.where(earlier, iv.d2h_first[rows] - self.d2h_now[cand], 0.0)
        owner = np.arange(len(rows))
        firsts = [self._starts(rows), iv.first1[rows]]
        lasts = [iv.last0[rows], iv.last1[rows]]
        owners = [owner, owner]
        opening = iv.opening[cand]
        with_opening = bundle & (opening >= 0)
        o = opening[with_opening]
        for first, last in ((iv.first0[o], iv.last0[o]), (iv.first1[o], iv.last1[o])):
            firsts.append(first)
            lasts.append(last)
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
        new = State(True, st.cuts | {g} if g >= 0 else st.cuts, st.distance)
        freed = [j]
        if not st.offloaded and g >= 0 and iv.opening[i] >= 0:
            freed.append(int(iv.opening[i]))
        self.set(i, new, (freed, []), defer=defer)

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
            if self._takes_back_the_peak(i, new, rows, peak, at, budget):
                continue  # it would take back the peak step, which has no room for it
            if self._fits(i, new, budget, rows):
                self.set(i, new, rows)
                peak, at = self.peak()
                if len(new.cuts) == 1:
                    self._push_removal(heap, i, next(iter(new.cuts)), last=True)
                if new.offloaded and not new.cuts:
                    self._push_removal(heap, i, -1, last=True)

    def _takes_back_the_peak(
        self, i: int, new: State, rows: tuple[list[int], list[int]], peak: int, at: int, budget: int
    ) -> bool:
        """Whether removing candidate ``i``'s interval (to ``new``, changing ``rows``) surely puts it back on
        the peak step ``at``, which has no room for it: a quick no before the full check."""
        if not self._fast(i, new) or peak + self.cands[i].size <= budget:
            return False
        return any(s <= at <= e for j in rows[1] for s, e in self._row_ranges(j))

    def _removal(self, i: int, k: int) -> tuple[State, tuple[list[int], list[int]]] | None:
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
            return State(), ([], [opening] if opening >= 0 else [])
        if k not in st.cuts:
            return None
        rest = st.cuts - {k}
        row = self.row_of.get((i, k))
        taken_back = [row] if row is not None else []
        if c.is_act and not rest and not c.output:
            if c.forced:
                return None
            return State(), ([], taken_back)
        return State(True, rest, st.distance), ([], taken_back)

    def _push_removal(self, heap: list, i: int, k: int, *, last: bool) -> None:
        c = self.cands[i]
        change = self._removal(i, k)
        if change is None:
            return
        saved = self.state_cost(i) - self.state_cost(i, change[0])
        self._pushed += 1
        heapq.heappush(heap, (-saved, c.name, self._pushed, i, k))

    def _fits(self, i: int, st: State, budget: float, rows: tuple[list[int], list[int]] | None = None) -> bool:
        """True when moving candidate ``i`` to ``st`` keeps the peak within ``budget``."""
        b = self.cands[i].size
        if self._fast(i, st):
            freed, restored = rows if rows is not None else self._rows_between(i, self.state[i], st)
            if freed:
                return False  # only removals are asked for
            return all(self.ws.max(s, e) + b <= budget for j in restored for s, e in self._row_ranges(j) if s <= e)
        return all(
            self.ws.max(s, e) + delta <= budget
            for s, e, delta in span_changes(self.spans(i), self.spans(i, st), b)
            if delta > 0
        )

    def place_prefetch(self, budget: float, distance: int, caps: dict[str, int] | None = None) -> None:
        """Largest per-tensor distance <= ``distance`` (or the tensor's cap) keeping the peak within budget."""
        caps = caps or {}
        firsts = {
            i: group_firsts(self.cands[i], s)
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
        new = State(True, st.cuts, lead)
        if self.release or st.distance:
            self.set(i, new)
            return
        for s, e in self._windows(i, firsts, lead):
            self.ws.add(s, e, self.cands[i].size)
        self.state[i] = new

    def _longest_lead(self, i: int, firsts: list[int], cap: int, budget: float) -> int:
        room = budget - self.cands[i].size
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
            return self._fits(i, State(True, self.state[i].cuts, lead), budget)
        windows = [(s, e) for s, e in self._windows(i, firsts, lead) if s <= e]
        if not windows:
            return True
        lo = min(s for s, _ in windows)
        hi = max(e for _, e in windows)
        extra = np.zeros(hi - lo + 1, dtype=np.int64)
        for s, e in windows:
            extra[s - lo : e - lo + 1] += self.cands[i].size
        return bool((self.ws.window(lo, hi) + extra).max() <= budget)

    def place_prefetch_streams(
        self, budget: float, distance: int, timing: CopyTiming, caps: dict[str, int] | None = None
    ) -> None:
        """Copies on streams: each offload gets the lead its H2Ds need to be done in time on a shared
        link, at most ``distance`` (or its cap) and at most the longest lead that keeps the budget.

        The link is shared: copies in one direction take turns on it, in the order they are issued
        (each direction apart here; the simulator that judges the plan runs both on the one copy
        stream ``apply --copies streams`` writes, event nodes priced). D2Hs go first come first
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
            link_free = done[i] = max(float(starts[min(c.start + 1, self.n)]), link_free) + float(timing.d2h(c.size))
        firsts = {
            i: group_firsts(self.cands[i], s)
            for i, s in enumerate(self.state)
            if s.offloaded and (not self.fixed[i] or self.cands[i].name in caps)
        }
        jobs = sorted(((f, self.cands[i].name, i) for i, groups in firsts.items() for f in groups), reverse=True)
        needed: dict[int, int] = {}
        free = math.inf
        for f, _, i in jobs:
            c = self.cands[i]
            end = min(float(starts[f]), free)
            begin = max(end - float(timing.h2d(c.size)), done.get(i, 0.0))
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
                    self.set(i, State(True, frozenset(range(c.num_gaps))))
            best = self.peak()[0]
            for i, st in enumerate(saved):
                self.set(i, st)
            return best
        iv = self.iv
        rows = np.flatnonzero(~iv.taken & ~self.fixed[iv.cand])
        freed = np.zeros(self.n + 1, dtype=np.int64)
        for first, last in ((iv.first0[rows], iv.last0[rows]), (iv.first1[rows], iv.last1[rows])):
            keep = first <= last
            freed += timeline.sweep(self.n + 1, first[keep], last[keep], iv.bytes[rows][keep])
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
