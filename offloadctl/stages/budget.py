"""The budget strategy: choose what to offload so the peak device memory fits a budget.

Where the distance strategy (HyperOffload) offloads every gap longer than ``select_distance``, the
budget strategy chooses individual *intervals* — the gaps of an activation between consecutive
producer/use positions, and the idle stretches of a weight (before its first use, between uses,
after its last use) — so that the simulated peak fits ``budget_bytes`` while moving as few bytes
as possible over the host link.

Why bytes moved is the objective: every offloaded interval costs one host-to-device copy of the
tensor (plus one device-to-host copy per activation, plus one more for an offloaded graph output).
Those bytes are what the link pays for, and the stall an offload adds is proportional to them:
with copies on the compute stream (onnxruntime today) every byte moved is time the model waits,
and with a separate copy stream the bytes still share one link and can only hide behind compute.
The number of offloads, by contrast, says nothing: one large tensor costs more than ten small ones.

Algorithm (greedy on the peak step, then pruning, then prefetch placement):

1. Candidates are what ``select`` accepts at select distance 0 (so ``--never``, unknown sizes,
   host-side inputs, weights that are graph outputs, ``--min-bytes`` are all respected).
   ``--force`` tensors start offloaded (their largest gap) and stay offloaded.
2. While the peak exceeds the budget, look at the peak step. Among the intervals that would free it,
   take the one with the largest reduction of over-budget memory (summed over all steps, each step
   capped at its excess) per byte moved; update the memory profile incrementally and repeat.
3. Pruning: drop every chosen interval whose removal keeps the peak within the budget (the most
   expensive first).
4. Prefetch: every reload is first placed at its use (distance 0). Then, in execution order, each
   offload gets the largest per-tensor ``prefetch_distance`` <= the requested global distance that
   keeps the peak within the budget (the memory profile is monotone in the distance, so a binary
   search finds it).

If the budget is below the lower bound (the largest single-node working set: inputs, outputs and
weights one node reads), or the greedy cannot reach it, an ``OffloadError`` gives the lower bound
and the best peak reachable. When the user did not enable weights (``--params``) and activations
alone cannot reach the budget, weights are added as candidates and the plan says so.

Weight streaming (``stream_weights``): weights stay on the host and come in by *layer group*.
Groups are built from the execution order: eligible weights sorted by first use are packed into
consecutive groups of at most the size of the largest single node's weights (so a group never has
to be larger than what one node needs anyway; for a transformer this gives roughly the attention
projections, the MLP up and the MLP down of each layer). Group k is copied in at the start of group
k - depth's window and each weight is freed after its last use, so at most depth + 1 groups are on
the device. A weight also read outside its group's window (shared across layers) stays resident.
Streamed weights are fixed choices; with a budget they start loaded at their first use, the greedy
handles the rest, and prefetch placement then gives each streamed weight the longest lead, up to its
group's depth, that keeps the budget.

Memory model (the simulator's): over the execution order, steps 0..n-1 are the nodes and step n
the end of the run. A tensor lives from its producer to its last consumer; graph inputs from step 0,
graph outputs to the end; weights all the time unless offloaded. An offloaded activation keeps its
device buffer from the producer to max(last device use, D2H, release_after); a reload lives from
its ``h2d_before`` to the last use of its group (an offloaded graph output's final reload from
``output_h2d_before`` to the end); an offloaded weight lives only from each group's H2D to the
group's last use. A model with dynamic input dimensions is refused until they are pinned
(``--input-shape``); other tensors of unknown size count 0 bytes.
"""

from __future__ import annotations

import bisect
import fnmatch
import logging
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from offloadctl.analysis import Analysis, Use
from offloadctl.errors import OffloadError
from offloadctl.plan import check_plan_model, record_stage
from offloadctl.stages.filter import DEFAULT_MIN_BYTES, DEFAULT_SELECT_NUM, first_use_key
from offloadctl.stages.prefetch import DEFAULT_PREFETCH_DISTANCE, DEFAULT_RELEASE_DISTANCE
from offloadctl.stages.select import select
from offloadctl.simulate import lower_bound, peak_memory
from offloadctl.units import byte_arg, fmt_bytes

__all__ = [
    "DEFAULT_STREAM_DEPTH",
    "SLOW_SEARCH_SIZE",
    "BudgetResult",
    "budget_filter",
    "lower_bound",
    "memory_profile",
    "plan_peak",
    "bytes_moved",
    "check_budget",
]

logger = logging.getLogger(__name__)

# steps x candidates above which the budget search warns that it may take minutes. Measured on the
# generated transformer-like graphs with weights (bench/gen_large.py, 2 cores): 1.6 million at 1,000
# nodes took about 1 s, 14 million at 3,000 nodes about 40 s.
SLOW_SEARCH_SIZE = 5_000_000

DEFAULT_STREAM_DEPTH = 1


# --------------------------------------------------------------------------------------------
# Memory accounting from a plan (independent of the greedy's internal state)
# --------------------------------------------------------------------------------------------


def _size(analysis: Analysis, name: str) -> int:
    info = analysis.infos.get(name)
    return (info.bytes or 0) if info is not None else 0


def _where(analysis: Analysis, pos: int) -> str:
    if pos >= analysis.num_positions:
        return "the graph outputs, all on the device at the end of the run"
    return f"the working set of node {analysis.node_names[pos]!r} at position {pos}: its inputs, outputs and weights"


def _default_intervals(analysis: Analysis, name: str) -> list[tuple[int, int]]:
    """Live steps (inclusive) of a tensor nobody offloads."""
    n = analysis.num_positions
    uses = analysis.uses.get(name, [])
    is_output = name in analysis.graph_outputs
    if name in analysis.producer:
        start = analysis.producer[name]
    elif name in analysis.weights:
        return [(0, n)] if uses else []
    else:  # graph input
        start = 0
    end = n if is_output else (uses[-1].position if uses else start)
    return [(start, max(start, end))]


def _offload_intervals(off: dict[str, Any], n: int, prefetch_distance: int) -> list[tuple[int, int]]:
    """Live steps of an offloaded tensor from its plan entry (h2d_before null: use the distance)."""
    is_act = off["kind"] == "activation"
    distance = off["prefetch_distance"] if off["prefetch_distance"] is not None else prefetch_distance
    low = off["d2h_after"] + 1 if is_act else 0
    spans: list[tuple[int, int]] = []
    if is_act:
        p0 = off["d2h_after"]
        last_dev = off["device_uses"][-1]["position"] if off["device_uses"] else p0
        release = off["release_after"] if off["release_after"] is not None else last_dev
        spans.append((off["producer"]["position"], max(last_dev, p0, release)))
    for group in off["reload_groups"]:
        first = group["uses"][0]["position"]
        h2d = group["h2d_before"] if group["h2d_before"] is not None else max(low, first - distance)
        spans.append((h2d, group["uses"][-1]["position"]))
    if off.get("graph_output") and off.get("output_h2d_before") is not None:
        spans.append((off["output_h2d_before"], n))
    return spans


def _add(mem: np.ndarray, spans: Iterable[tuple[int, int]], b: int) -> None:
    for s, e in spans:
        mem[s : e + 1] += b


def memory_profile(
    analysis: Analysis, plan: dict[str, Any] | None = None, *, prefetch_distance: int = DEFAULT_PREFETCH_DISTANCE
) -> np.ndarray:
    """Device bytes live at each step 0..n (step n = the end of the run) under ``plan``.

    A plan before the prefetch stage (``h2d_before`` null) is placed with each offload's own
    ``prefetch_distance`` or else ``prefetch_distance``, as the prefetch stage would.
    """
    n = analysis.num_positions
    mem = np.zeros(n + 1, dtype=np.int64)
    offloads = {o["tensor"]: o for o in (plan["offloads"] if plan else [])}
    names = list(analysis.graph_inputs) + list(analysis.producer) + sorted(analysis.weights)
    for name in dict.fromkeys(names):
        b = _size(analysis, name)
        if not b:
            continue
        off = offloads.get(name)
        spans = _offload_intervals(off, n, prefetch_distance) if off else _default_intervals(analysis, name)
        _add(mem, spans, b)
    return mem


def plan_peak(
    analysis: Analysis, plan: dict[str, Any] | None = None, *, prefetch_distance: int = DEFAULT_PREFETCH_DISTANCE
) -> tuple[int, int]:
    """(peak bytes, step of the first peak) of :func:`memory_profile`."""
    mem = memory_profile(analysis, plan, prefetch_distance=prefetch_distance)
    pos = int(np.argmax(mem))
    return int(mem[pos]), pos


def bytes_moved(plan: dict[str, Any]) -> int:
    """Bytes a plan copies per run: one D2H per activation, one H2D per reload group and output."""
    total = 0
    for off in plan["offloads"]:
        copies = len(off["reload_groups"]) + (off["kind"] == "activation")
        copies += bool(off.get("graph_output") and off.get("output_h2d_before") is not None)
        total += copies * off["bytes"]
    return total


# --------------------------------------------------------------------------------------------
# Internal model of one candidate tensor and its state
# --------------------------------------------------------------------------------------------


@dataclass
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
    template: dict[str, Any]  # the select-stage entry (dtype, shape, producer...)

    @property
    def num_gaps(self) -> int:
        return len(self.entries) - 1

    def gap_len(self, i: int) -> int:
        return self.entries[i + 1] - self.entries[i]

    def gap_containing(self, pos: int) -> int | None:
        """The gap whose interior holds ``pos``, if any."""
        k = bisect.bisect_right(self.entries, pos) - 1
        if 0 <= k < self.num_gaps and self.entries[k] < pos < self.entries[k + 1]:
            return k
        return None


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


def _spans(c: _Cand, st: _State, n: int, release_distance: int) -> list[tuple[int, int]]:
    if not st.offloaded:
        if c.is_act:
            return [(c.start, n if c.output else c.entries[-1])]
        return [(0, n)]
    lay = _layout(c, st)
    spans: list[tuple[int, int]] = []
    low = c.start + 1 if c.is_act else 0
    if c.is_act:
        last_dev = lay.device_uses[-1].position if lay.device_uses else c.start
        release = min(last_dev + release_distance, max(n - 1, 0))
        spans.append((c.start, max(last_dev, release)))
    for _, g in lay.groups:
        spans.append((max(low, g[0].position - st.distance), g[-1].position))
    if c.is_act and c.output:
        spans.append((n, n))
    return spans


def _cost(c: _Cand, st: _State) -> int:
    if not st.offloaded:
        return 0
    copies = (len(st.cuts) + 1 + (1 if c.output else 0)) if c.is_act else len(st.cuts) + 1
    return copies * c.b


# --------------------------------------------------------------------------------------------
# The greedy
# --------------------------------------------------------------------------------------------


class _Planner:
    def __init__(
        self, analysis: Analysis, cands: list[_Cand], release_distance: int, report: Callable[[str], None] | None = None
    ) -> None:
        self.report = report or (lambda text: None)
        self.analysis = analysis
        self.n = analysis.num_positions
        self.cands = {c.name: c for c in cands}
        self.release = release_distance
        self.state: dict[str, _State] = {c.name: _State() for c in cands}
        self.fixed: set[str] = set()  # streamed weights: state never changed by the greedy
        self.mem = memory_profile(analysis, None)
        self.current: dict[str, list[tuple[int, int]]] = {}  # spans of each candidate's state, once computed
        # First and last step each candidate's current spans cover: only a candidate resident at a
        # step can free it, so moves_at looks at those alone (a vectorized test over all of them).
        self.names = list(self.cands)
        self.row = {name: i for i, name in enumerate(self.names)}
        self.cover = np.array([_cover(self.current_spans(name)) for name in self.names], dtype=np.int64).reshape(-1, 2)

    def spans(self, name: str, st: _State) -> list[tuple[int, int]]:
        return _spans(self.cands[name], st, self.n, self.release)

    def current_spans(self, name: str) -> list[tuple[int, int]]:
        spans = self.current.get(name)
        if spans is None:
            spans = self.current[name] = self.spans(name, self.state[name])
        return spans

    def set(self, name: str, st: _State) -> None:
        c = self.cands[name]
        new = self.spans(name, st)
        _add(self.mem, self.current_spans(name), -c.b)
        _add(self.mem, new, c.b)
        self.state[name] = st
        self.current[name] = new
        self.cover[self.row[name]] = _cover(new)

    def peak(self) -> tuple[int, int]:
        pos = int(np.argmax(self.mem))
        return int(self.mem[pos]), pos

    def moved(self) -> int:
        return sum(_cost(self.cands[k], s) for k, s in self.state.items())

    def change(self, name: str, st: _State) -> list[tuple[int, int, int]]:
        """How the profile changes if ``name`` moves to ``st``: (first step, last step, bytes) pieces,
        in order, covering only the steps that change."""
        b = self.cands[name].b
        events: dict[int, int] = {}
        for spans, sign in ((self.current_spans(name), -b), (self.spans(name, st), b)):
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

    def benefit(self, pieces: list[tuple[int, int, int]], excess: np.ndarray, budget: int) -> int:
        """Reduction of the over-budget bytes summed over all steps, for a change given as pieces.

        Step by step this is max(m - budget, 0) - max(m + delta - budget, 0), which equals
        min(excess, -delta) where delta < 0 and -min(max(m + delta - budget, 0), delta) where
        delta > 0: exact integers, computed on the changed steps only.
        """
        total = 0
        for s, e, delta in pieces:
            if delta < 0:
                total += int(np.minimum(excess[s : e + 1], -delta).sum())
            else:
                total -= int(np.minimum(np.maximum(self.mem[s : e + 1] + (delta - budget), 0), delta).sum())
        return total

    def moves_at(self, pos: int) -> list[tuple[str, _State]]:
        """State changes (one more interval each) that would free step ``pos``."""
        out = []
        resident = np.flatnonzero((self.cover[:, 0] <= pos) & (pos <= self.cover[:, 1]))
        for row in resident.tolist():  # in candidate order
            name = self.names[row]
            c = self.cands[name]
            if name in self.fixed:
                continue
            st = self.state[name]
            k = c.gap_containing(pos)
            if c.is_act:
                if pos < c.start or (pos > c.entries[-1] and not c.output):
                    continue
                if k is not None and k not in st.cuts:
                    out.append((name, _State(True, st.cuts | {k}, st.distance)))
                elif pos > c.entries[-1] and not st.offloaded:
                    # a graph output's trailing stretch: D2H after the producer, back at the end
                    out.append((name, _State(True, frozenset(), st.distance)))
            else:
                if not st.offloaded and (pos < c.entries[0] or pos > c.entries[-1]):
                    out.append((name, _State(True, st.cuts, st.distance)))
                elif k is not None and k not in st.cuts:
                    out.append((name, _State(True, st.cuts | {k}, st.distance)))
        return out

    def greedy(self, budget: int) -> bool:
        """Add intervals until the peak fits; False when no interval frees the peak step."""
        while True:
            peak, pos = self.peak()
            if peak <= budget:
                return True
            self.report(f"fitting the budget: peak {peak / 2**20:.1f} MiB, budget {budget / 2**20:.1f} MiB")
            best: tuple[tuple, str, _State] | None = None
            excess = np.maximum(self.mem - budget, 0)
            for name, st in self.moves_at(pos):
                pieces = self.change(name, st)
                if not any(s <= pos <= e and delta < 0 for s, e, delta in pieces):
                    continue  # does not free the peak step
                benefit = self.benefit(pieces, excess, budget)
                cost = _cost(self.cands[name], st) - _cost(self.cands[name], self.state[name])
                key = (benefit / max(cost, 1), -cost, benefit, name)
                if best is None or key > best[0]:
                    best = (key, name, st)
            if best is None:
                return False
            self.set(best[1], best[2])

    def prune(self, budget: int) -> None:
        """Drop every chosen interval whose removal keeps the peak within the budget."""
        changed = True
        while changed:
            changed = False
            options: list[tuple[int, str, _State]] = []
            for name, st in self.state.items():
                c = self.cands[name]
                if not st.offloaded or name in self.fixed:
                    continue
                for k in st.cuts:
                    rest = st.cuts - {k}
                    if c.is_act and not rest and not c.output:
                        new = _State() if not c.forced else None
                    else:  # a graph output keeps its trailing stretch offloaded
                        new = _State(True, rest, st.distance)
                    if new is not None:
                        options.append((_cost(c, st) - _cost(c, new), name, new))
                if (not c.is_act or c.output) and not st.cuts and not c.forced:
                    options.append((_cost(c, st), name, _State()))
            for _, name, new in sorted(options, key=lambda o: (-o[0], o[1])):
                old = self.state[name]
                if not old.offloaded or not _still_valid(old, new):
                    continue
                self.set(name, new)
                if self.peak()[0] <= budget:
                    changed = True
                else:
                    self.set(name, old)

    def place_prefetch(self, budget: float, distance: int, caps: dict[str, int] | None = None) -> None:
        """Largest per-tensor distance <= ``distance`` (or the tensor's cap) keeping the peak within budget."""
        caps = caps or {}
        order = sorted(
            (k for k, s in self.state.items() if s.offloaded and (k not in self.fixed or k in caps)),
            key=lambda k: (_first_reload(self.cands[k], self.state[k], self.n), k),
        )
        for name in order:
            st = self.state[name]
            lo, hi = 0, caps.get(name, distance)
            while lo < hi:
                mid = (lo + hi + 1) // 2
                self.set(name, _State(True, st.cuts, mid))
                if self.peak()[0] <= budget:
                    lo = mid
                else:
                    hi = mid - 1
            self.set(name, _State(True, st.cuts, lo))


def _cover(spans: list[tuple[int, int]]) -> tuple[int, int]:
    """(first step, last step) the spans cover; an empty range when there are none."""
    if not spans:
        return (1, 0)
    return (min(s for s, _ in spans), max(e for _, e in spans))


def _first_reload(c: _Cand, st: _State, n: int) -> int:
    groups = _layout(c, st).groups
    return groups[0][1][0].position if groups else n


def _still_valid(old: _State, new: _State) -> bool:
    """A pruning option computed before other removals is still a one-step removal from ``old``."""
    if not new.offloaded:
        return len(old.cuts) <= 1
    return new.cuts < old.cuts and len(old.cuts - new.cuts) == 1


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
        positions = sorted({u.position for u in uses})
        entries = ([start] if is_act else []) + positions
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
        template = {
            "id": 0, "tensor": name, "kind": "activation", "dtype": info.dtype, "shape": list(info.shape or ()),
            "bytes": info.bytes, "producer": {"position": start, "node": analysis.node_names[start]},
            "d2h_after": start, "device_uses": [], "reload_groups": [], "graph_output": True,
            "output_h2d_before": n, "release_after": None, "prefetch_distance": None,
        }
        if forced:
            template["forced"] = True
        found.append(_Cand(name, True, info.bytes, start, [], [start], True, forced, template))
    return found


def _max_gap(entries: list[int]) -> int | None:
    return max((b - a for a, b in zip(entries, entries[1:])), default=None)


def _reject(tensor: str, kind: str, b: int | None, reason: str, detail: str, entries: list[int]) -> dict[str, Any]:
    return {"tensor": tensor, "kind": kind, "bytes": b, "stage": "filter", "reason": reason, "detail": detail, "max_gap": _max_gap(entries)}


def _entry(c: _Cand, st: _State, n: int) -> dict[str, Any]:
    lay = _layout(c, st)
    e = dict(c.template)
    e["device_uses"] = [u.to_json() for u in lay.device_uses]
    e["reload_groups"] = [{"uses": [u.to_json() for u in g], "gap": gap, "h2d_before": None} for gap, g in lay.groups]
    e["graph_output"] = c.output
    e["output_h2d_before"] = n if c.output else None
    e["release_after"] = None
    e["prefetch_distance"] = st.distance
    return e


def _solve(
    analysis: Analysis,
    cands: list[_Cand],
    *,
    budget: int | None,
    prefetch_distance: int,
    release_distance: int,
    stream: dict[str, _State] | None,
    report: Callable[[str], None] | None = None,
) -> tuple[_Planner, bool]:
    p = _Planner(analysis, cands, release_distance, report)
    caps: dict[str, int] = {}
    for c in cands:
        if stream and c.name in stream:
            # streamed weights are fixed choices; with a budget their lead (depth) may be shortened
            p.fixed.add(c.name)
            if budget is None:
                p.set(c.name, stream[c.name])
            else:
                caps[c.name] = stream[c.name].distance
                p.set(c.name, _State(True, stream[c.name].cuts, 0))
        elif c.forced:
            if c.is_act and c.num_gaps:
                best = max(range(c.num_gaps), key=lambda i: (c.gap_len(i), -i))
                p.set(c.name, _State(True, frozenset({best})))
            elif c.is_act:  # a graph output nobody reads: its trailing stretch
                p.set(c.name, _State(True))
            else:
                p.set(c.name, _State(True))
    if budget is None:
        p.place_prefetch(math.inf, prefetch_distance)
        return p, True
    if not p.greedy(budget):
        return p, False
    p.report("fitting the budget: dropping offloads it does not need")
    p.prune(budget)
    p.report("fitting the budget: placing prefetches")
    p.place_prefetch(budget, prefetch_distance, caps)
    return p, True


def _best_reachable(analysis: Analysis, cands: list[_Cand], release_distance: int, stream: dict[str, _State] | None) -> int:
    p = _Planner(analysis, cands, release_distance)
    for c in cands:
        if stream and c.name in stream:
            p.set(c.name, _State(True, stream[c.name].cuts, 0))
        else:
            p.set(c.name, _State(True, frozenset(range(c.num_gaps))))
    return p.peak()[0]


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
    profile: str | None = None,
    report: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Turn a "selected" plan into a "filtered" plan whose simulated peak fits ``budget_bytes``.

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
        profile: device profile name, recorded.
        report: called with a line of text as the search goes (the peak left to fit): the time the
            search takes grows with candidates x steps x offloads chosen, minutes on big graphs.

    Raises:
        OffloadError: the plan is for another model, or the budget cannot be reached (the message
            gives the lower bound and the best peak reachable).
    """
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
    sel = plan["options"]["select"]
    n = analysis.num_positions
    lb, lb_pos = lower_bound(analysis)
    before, _ = plan_peak(analysis, None)
    if budget_bytes is not None and budget_bytes < lb:
        raise OffloadError(
            f"budget {fmt_bytes(budget_bytes)} is below the lower bound {fmt_bytes(lb)} ({lb} bytes) of "
            f"{analysis.loaded.path} ({_where(analysis, lb_pos)}); the peak is {fmt_bytes(before)} without offload",
            hint=f"give --budget {byte_arg(lb)} or more",
        )
    params = sel["params"] or stream_weights
    force, never = tuple(sel.get("force", ())), tuple(sel.get("never", ()))

    warned: list[bool] = []  # the slow-search warning is given once

    def attempt(with_params: bool):
        selected0 = select(
            analysis, select_distance=0, activations=sel["activations"], params=with_params, force=force, never=never
        )
        cands, small = _candidates(analysis, selected0, min_bytes)
        if budget_bytes is not None and n * len(cands) > SLOW_SEARCH_SIZE and not warned:
            warned.append(True)
            logger.warning(
                "the budget search over %d steps and %d candidates may take minutes (its time grows with steps x "
                "candidates x offloads chosen); the distance strategy (--select-distance, --select-num) plans a graph "
                "this size in seconds",
                n, len(cands),
            )
        stream = None
        info = None
        if stream_weights:
            stream, info = _stream_states(cands, stream_depth)
        planner, ok = _solve(
            analysis, cands, budget=budget_bytes, prefetch_distance=prefetch_distance,
            release_distance=release_distance, stream=stream, report=report,
        )
        return selected0, cands, small, stream, info, planner, ok

    def reachable(attempted) -> int:
        _, cands_, _, stream_, _, planner_, _ = attempted
        return min(planner_.peak()[0], _best_reachable(analysis, cands_, release_distance, stream_))

    first = attempt(params)
    selected0, cands, small, stream, stream_info, planner, ok = first
    weights_added = False
    retry = None
    if not ok and not params:
        retry = attempt(True)
        if retry[-1]:
            logger.warning("activations alone cannot fit the budget: weights were considered too (as with --params)")
            selected0, cands, small, stream, stream_info, planner, ok = retry
            weights_added = True
    if not ok:
        best = min(reachable(a) for a in (first, retry) if a is not None)
        raise OffloadError(
            f"the budget strategy cannot fit {analysis.loaded.path} into {fmt_bytes(budget_bytes)}: the best peak "
            f"reachable is {fmt_bytes(best)} ({best} bytes; lower bound {fmt_bytes(lb)}, peak without offload "
            f"{fmt_bytes(before)})",
            hint=f"raise --budget to at least {byte_arg(best)}, or allow more candidates (--params, fewer --never patterns)",
        )

    new = record_stage(
        plan, "filtered", "filter",
        {"select_num": select_num, "min_bytes": min_bytes, "strategy": "budget", "budget_bytes": budget_bytes, "profile": profile},
    )
    new["strategy"] = "budget"
    offloads: list[dict[str, Any]] = []
    handled = {c.name for c in cands} | {r["tensor"] for r in small}
    rejected = [dict(r) for r in selected0["rejected"] if r["tensor"] not in handled] + small
    chosen: dict[str, str] = {}
    for c in cands:
        st = planner.state[c.name]
        if st.offloaded:
            offloads.append(_entry(c, st, n))
            if stream and c.name in stream:
                chosen[c.name] = "streamed weight (layer group)"
            elif c.forced:
                chosen[c.name] = "forced (--force)"
            else:
                chosen[c.name] = "needed to fit the budget"
        else:
            why = "the peak fits the budget without it" if budget_bytes is not None else "no budget given"
            rejected.append(_reject(c.name, "activation" if c.is_act else "parameter", c.b, "budget-not-needed", why, c.entries))
    offloads.sort(key=first_use_key)
    for i, e in enumerate(offloads):
        e["id"] = i
    new["offloads"] = offloads
    new["rejected"] = rejected
    peak, pos = plan_peak(analysis, new, prefetch_distance=prefetch_distance) if release_distance == 0 else planner.peak()
    internal = planner.peak()
    if release_distance == 0 and peak != internal[0]:  # pragma: no cover - two accountings disagree: a bug
        raise AssertionError(f"budget accounting {internal[0]} != plan accounting {peak}")
    result = BudgetResult(
        requested=budget_bytes, lower_bound=lb, lower_bound_position=lb_pos, peak_before=before,
        peak=internal[0], peak_position=internal[1], moved=bytes_moved(new), weights_added=weights_added,
        stream=stream_info, chosen=chosen,
    )
    new["budget"] = result.to_json(prefetch_distance, release_distance)
    return new


def check_budget(analysis: Analysis, plan: dict[str, Any]) -> dict[str, Any]:
    """Check a scheduled budget plan with the simulator and record its figures in ``plan["budget"]``.

    The simulator (``offloadctl.simulate.peak_memory``) is the judge of memory figures. Returns the
    plan (updated in place).

    Raises:
        AssertionError: the predicted peak exceeds the budget (a bug in the strategy).
    """
    peak, pos = peak_memory(analysis, plan)
    info = plan.get("budget")
    if info is None:
        return plan
    requested = info.get("requested_bytes")
    if requested is not None and peak > requested:  # pragma: no cover - the strategy guarantees it
        raise AssertionError(f"budget plan peaks at {peak} bytes > budget {requested}")
    info["predicted_peak_bytes"] = int(peak)
    info["predicted_peak_position"] = pos
    info["bytes_moved"] = bytes_moved(plan)
    return plan
