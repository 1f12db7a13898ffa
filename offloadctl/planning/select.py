"""The select stage: which tensors sit idle long enough to offload (HyperOffload "distance").

For every activation, positions = [producer] + [each use] in execution order. Each gap between
consecutive entries larger than ``select_distance`` opens a reload group holding the use after the
gap and the uses that follow up to the next such gap. Uses before the first such gap keep reading
the device tensor. A weight (initializer or Constant node) stays on the host and is read through
one host-to-device copy per reload group; the first group starts at its first use, and it is
selected when it sits idle for more than ``select_distance`` positions before its first use, after
its last use, or between two uses. Every tensor not selected is listed with its reason.

Every reason is one `Rule` of `RULES`, stated once: its check gives one tensor's verdict (the first
rule that applies wins), and its screen marks, over all candidates at once, every tensor the check
could reject. The pass over a big model (`_Selector.consider_all`) chooses what no screen marks and
sends every other tensor through the checks, so a new reason is a new rule, screen and check together.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import itertools
import logging
import operator
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from offloadctl._version import __version__
from offloadctl.analysis.graph import SUBGRAPH_READ, Analysis, Use, derived
from offloadctl.contract.document import SCHEMA_VERSION
from offloadctl.core.bulk import paused_gc
from offloadctl.core.plantypes import (
    Kind,
    ModelInfo,
    Offload,
    Plan,
    Rejection,
    RejectionReason,
    ReloadGroup,
    offload,
    rejection,
    reload_group,
)
from offloadctl.core.plantypes import Use as PlanUse
from offloadctl.loading.tensors import TensorInfo
from offloadctl.planning.host_reads import (
    FORCE_ADVICE,
    HOST_INPUTS,
    HOST_REASONS,
    INDEX_TYPES,
    SHAPE_TYPES,
    SMALL_INDEX_BYTES,
    packing_nodes,
    prepacked_use,
    reads_on_host,
    shape_feeders,
)
from offloadctl.planning.request import SelectPart, recorded
from offloadctl.planning.uses import (
    UseArrays,
    input_bits,
    longest_gap,
    sort_key,
    split_reload_groups,
    weight_idle_end,
)
from offloadctl.simulation.base import plain_ids

__all__ = [
    "Chosen",
    "Selection",
    "derive_from_the_graph",
    "select",
    "selected_plan",
    "selection_for",
]

logger = logging.getLogger(__name__)


def _matches(name: str, patterns: Iterable[str]) -> bool:
    if not patterns:  # the usual case, for every tensor of a big graph
        return False
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


class _Selector:
    """The select stage over one analysis: each candidate's verdict, one check per method, in the
    order the reasons are listed (the first that applies wins)."""

    def __init__(self, analysis: Analysis, options: SelectPart) -> None:
        self.analysis = analysis
        self.options = options
        self.n = analysis.num_positions
        self.outputs = analysis.graph_output_set
        # (first-use key, candidate number) of each verdict: sorting by it keeps candidates of one key in
        # the order they were considered
        self.chosen: list[tuple[tuple[tuple[int, int], int], Chosen]] = []  # entries: `entry`, `chosen_entry`
        self.rejected: list[tuple[tuple[tuple[int, int], int], Rejection]] = []
        self.index: dict[str, int] = {}  # candidate -> its number
        self.gaps: dict[str, int] = {}  # candidate read by some node -> its longest idle stretch
        self.forced: set[str] = set()  # candidates that match a --force pattern
        # forced candidates that would stay for a host read (reason host-input or host-resident) -> why
        self.forced_on_host: dict[str, str] = {}
        self._feeders: dict[str, Use] | None = None  # computed on the first candidate that needs it
        self.subgraph_only: set[str] = set()  # candidates read only inside subgraphs (`consider_all`'s)
        # `consider_all`'s candidates' uses, and the step back from each (`UseArrays.steps`)
        self.use_steps: tuple[UseArrays, np.ndarray] | None = None
        self._short_details: dict[tuple[int, int], str] = {}  # (max gap, distance) -> the short-gaps detail
        self.host_reads: dict[int, frozenset[str]] = {}  # position -> names its subgraphs read on the host
        # position -> the inputs its node reads in host memory, for the nodes that have any
        self.host_inputs = {
            p: HOST_INPUTS[op] for p, op in enumerate(node.op_type for node in analysis.nodes) if op in HOST_INPUTS
        }
        self.packing = packing_nodes(analysis)  # position -> the inputs its node packs, for those that pack any
        self.fused = frozenset(options.fused)
        self.host_nodes = frozenset(options.host.nodes)
        self.host_device = options.host.device

    def reject(
        self,
        name: str,
        kind: Kind,
        uses: list[Use],
        reason: RejectionReason,
        detail: str,
        max_gap: int | None = None,
        info: TensorInfo | None = None,
    ) -> None:
        """List ``name`` as rejected (``info``: its size's source when the caller has it)."""
        first = sort_key(uses[0]) if uses else (self.n, 0)
        if info is None:
            info = self.analysis.infos.get(name)
        size = info.bytes if info is not None else None
        key = (first, self.index.setdefault(name, len(self.index)))
        self.rejected.append((key, rejection(name, kind, size, "select", reason, detail, max_gap)))

    def shape_feeders(self) -> dict[str, Use]:
        if self._feeders is None:
            self._feeders = shape_feeders(self.analysis, self.host_reads)
        return self._feeders

    def consider(self, name: str, kind: Kind) -> None:
        """Offload ``name`` or reject it with the first reason of `RULES` that applies."""
        analysis, options = self.analysis, self.options
        uses = analysis.uses.get(name) or []
        is_act = kind == "activation"
        start = analysis.producer[name] if is_act else 0
        max_gap = 0
        if uses:
            end = None if is_act else int(weight_idle_end(self.n, uses[-1][0]))
            max_gap = self.gaps[name] = longest_gap(start, uses, end)
        forced = bool(options.force) and _matches(name, options.force)
        if forced:
            self.forced.add(name)
        case = _Case(name, kind, uses, forced, max_gap)
        verdict, info = self._verdict(case)
        if verdict is not None:
            self.reject(name, kind, uses, *verdict, max_gap if uses else None, info)
            return
        assert info is not None  # a rule rejects a tensor without one
        if forced:  # offloaded though a host read would have kept it: the selection warns
            kept, _ = self._verdict(case._replace(forced=False, info=info), tensor_only=True)
            if kept is not None and kept[0] in HOST_REASONS:
                self.forced_on_host[name] = kept[1].removesuffix(FORCE_ADVICE)
        key = (sort_key(uses[0]), self.index.setdefault(name, len(self.index)))
        # Chosen(...) without the NamedTuple's Python-level __new__ (a big model chooses hundreds of thousands)
        self.chosen.append((key, tuple.__new__(Chosen, (name, kind, start, forced, info))))

    def _verdict(
        self, case: _Case, *, tensor_only: bool = False
    ) -> tuple[tuple[RejectionReason, str] | None, TensorInfo | None]:
        """(the verdict of the first rule of `RULES` that applies, or None; the tensor's info, looked up
        once the rules that need none have passed). ``tensor_only``: the rules that read the tensor alone."""
        info = case.info
        for rule in RULES:
            if rule.reads_tensor:
                if info is None:
                    info = self.analysis.infos.get(case.name)
                    case = case._replace(info=info)
            elif tensor_only:
                continue
            verdict = rule.check(self, case)
            if verdict is not None:
                return verdict, info
        return None, info

    def consider_all(self, activations: list[str], weights: list[str], arrays: UseArrays | None = None) -> None:
        """`consider` each of ``activations`` and then of ``weights``, in that order, as one pass.

        What a big model's candidates have in common is decided for all of them at once, from the same
        `RULES`: each rule's ``may_apply`` marks every candidate its check could reject, and a candidate
        no rule marks (and that matches no --force pattern) is chosen as `consider` would choose it;
        every other goes through `consider`, whose checks give the reason. The records are those
        `consider` makes. ``arrays``: the candidates' uses as arrays (`candidate_uses`), when the caller
        has them.
        """
        analysis, options = self.analysis, self.options
        names = [*activations, *weights]
        acts = len(activations)
        self.index.update(zip(names, range(len(self.index), len(self.index) + len(names))))
        if arrays is None:
            arrays = UseArrays.of([analysis.uses.get(name) or [] for name in names])
        has = arrays.counts > 0
        starts = np.zeros(len(names), dtype=np.int64)
        starts[:acts] = np.fromiter(map(analysis.producer.__getitem__, activations), dtype=np.int64, count=acts)
        ends = np.full(len(names), -1, dtype=np.int64)  # activations: no stretch after their last use
        ends[acts:] = weight_idle_end(self.n, arrays.last()[acts:])
        steps = arrays.steps(starts)
        gaps = arrays.max_gaps(steps, ends)
        self.use_steps = (arrays, steps)
        # every candidate looked up in order, as `consider` looks each up (a size it refuses is refused first)
        screen = _Screen(names, acts, has, gaps, list(map(analysis.infos.get, names)), arrays)
        plain = np.ones(len(names), dtype=bool)
        for rule in RULES:
            plain &= ~rule.may_apply(self, screen)
        plain &= ~_where(screen, options.force)  # a forced candidate is judged by the rules one by one
        self.gaps.update(zip(itertools.compress(names, has), gaps[has].tolist()))
        self.subgraph_only.update(itertools.compress(names, has & ~arrays.any(arrays.indices >= 0)))
        # (first-use key, candidate number) of each, as `consider` keys it (`sort_key` of its first use)
        first = arrays.offsets[plain]
        indices = arrays.indices[first]
        keys = zip(
            zip(arrays.positions[first].tolist(), np.where(indices < 0, SUBGRAPH_READ, indices).tolist()),
            itertools.compress(map(self.index.__getitem__, names), plain),
        )
        kinds = itertools.chain(itertools.repeat("activation", acts), itertools.repeat("parameter"))
        fields = itertools.compress(zip(names, kinds, starts.tolist(), itertools.repeat(False), screen.infos), plain)
        # Chosen(...) without the NamedTuple's Python-level __new__ (a big model chooses hundreds of thousands)
        self.chosen += zip(keys, map(tuple.__new__, itertools.repeat(Chosen), fields))
        for k in np.flatnonzero(~plain).tolist():
            self.consider(names[k], "activation" if k < acts else "parameter")

    def host_read_uses(self, screen: _Screen) -> np.ndarray:
        """For each candidate, whether a node reads it at an input kept in host memory, or inside a subgraph."""
        arrays = screen.arrays
        at_host = arrays.indices < 0  # inside a subgraph: its body decides
        if self.host_inputs:
            bits = input_bits(self.n, self.host_inputs)[arrays.positions]
            at_host |= ((bits >> np.clip(arrays.indices, 0, 63)) & 1).astype(bool) & (arrays.indices >= 0)
        return arrays.any(at_host)

    def packed_uses(self, screen: _Screen) -> np.ndarray:
        """For each candidate, whether a node that prepacks an input reads it there."""
        arrays = screen.arrays
        if not self.packing:
            return np.zeros(len(screen.names), dtype=bool)
        bits = input_bits(self.n, self.packing)[arrays.positions]
        packed = ((bits >> np.clip(arrays.indices, 0, 63)) & 1).astype(bool) & (arrays.indices >= 0)
        return arrays.any(packed)

    def gap_verdict(self, uses: list[Use], max_gap: int, distance: int) -> tuple[RejectionReason, str]:
        """Why a tensor whose longest idle stretch is ``max_gap`` (at most ``distance``) is not offloaded."""
        for use in uses:
            if use[1] is not None:
                break
        else:  # every read is inside a subgraph
            holders = sorted({f"{self.analysis.nodes[u.position].op_type} {u.node!r}" for u in uses})
            return (
                "subgraph-only",
                f"read only inside the bodies of {', '.join(holders[:3])}: in the main graph, where copies are "
                "planned, a body is one position, so the tensor never idles there; offloadctl does not plan inside "
                "If/Loop/Scan bodies",
            )
        return "short-gaps", self.short_detail(max_gap, distance)

    def short_detail(self, max_gap: int, distance: int) -> str:
        """The short-gaps detail of a tensor whose longest idle stretch is ``max_gap`` (worded once: a
        big model has a few distinct gaps over a hundred thousand tensors)."""
        detail = self._short_details.get((max_gap, distance))
        if detail is None:
            detail = self._short_details[max_gap, distance] = (
                f"largest idle stretch {max_gap} <= select distance {distance}"
            )
        return detail

    def _resident_reason(self, name: str, kind: Kind, uses: list[Use]) -> str | None:
        """Why a tensor stays where it is on the plan's device: a node the device runs on the CPU
        makes or reads it (then it is not on the device, or a copy from the host would be copied again;
        on WebGPU such rewrites failed to load or to run)."""
        if not self.host_nodes:
            return None
        analysis = self.analysis
        labels = analysis.node_names
        at = [analysis.producer[name]] if kind == "activation" else []
        at += [u.position for u in uses]
        where = next((p for p in at if labels[p] in self.host_nodes), None)
        if where is None:
            return None
        verb = "made" if kind == "activation" and where == at[0] else "read"
        op = analysis.nodes[where].op_type
        return f"{verb} on the host by {op} {labels[where]!r}: onnxruntime runs it on the CPU on {self.host_device}"

    def _host_reason(self, name: str, uses: list[Use], elem_type: int | None) -> str | None:
        analysis = self.analysis
        host_inputs = self.host_inputs
        host_use = None
        for use in uses:  # `reads_on_host`, with the node's host inputs from the table
            index = use[1]
            if index is None:
                if reads_on_host(analysis, use, name, self.host_reads):
                    host_use = use
                    break
            elif host_inputs and index in host_inputs.get(use[0], ()):
                host_use = use
                break
        if host_use is not None:
            op = analysis.nodes[host_use.position].op_type
            where = (
                f"read as input {host_use.input_index} of {op} {host_use.node!r}"
                if host_use.input_index is not None
                else f"read inside a subgraph of {op} {host_use.node!r} at an input"
            )
            return f"{where}, which onnxruntime keeps in host memory"
        if elem_type not in SHAPE_TYPES:  # only integer tensors feed shape computations
            return None
        end = self.shape_feeders().get(name)
        if end is None:
            return None
        op = analysis.nodes[end.position].op_type
        return (
            f"feeds only shape computations ending at input {end.input_index} of {op} {end.node!r}, "
            "which onnxruntime keeps in host memory"
        )


class _Case(NamedTuple):
    """One candidate as a rule's check sees it (``info`` looked up once the rules that need none pass)."""

    name: str
    kind: Kind
    uses: list[Use]
    forced: bool
    max_gap: int
    info: TensorInfo | None = None


class _Screen(NamedTuple):
    """Every candidate at once, as `_Selector.consider_all` knows them, for the rules' ``may_apply``:
    the first ``acts`` are activations, the rest weights."""

    names: list[str]
    acts: int
    has: np.ndarray  # read by some node
    gaps: np.ndarray  # the longest idle stretch
    infos: list[TensorInfo | None]
    arrays: UseArrays

    def each(self, predicate: Callable[[str], bool]) -> np.ndarray:
        return np.fromiter(map(predicate, self.names), dtype=bool, count=len(self.names))

    def each_info(self, predicate: Callable[[TensorInfo | None], bool]) -> np.ndarray:
        return np.fromiter(map(predicate, self.infos), dtype=bool, count=len(self.infos))

    def weights(self) -> np.ndarray:
        found = np.zeros(len(self.names), dtype=bool)
        found[self.acts :] = True
        return found


_Verdict = tuple[RejectionReason, str] | None


@dataclass(frozen=True)
class Rule:
    """One reason the select stage keeps a tensor on the device, stated once: ``check`` gives one
    candidate's verdict by it; ``may_apply`` marks, for all candidates at once, every candidate the
    check could reject (a superset: those are checked one by one, the others chosen outright);
    ``reads_tensor``: the check reads the tensor's type and size, looked up only once the rules before
    it have passed. The first rule of `RULES` whose check gives a verdict wins."""

    name: str
    check: Callable[[_Selector, _Case], _Verdict]
    may_apply: Callable[[_Selector, _Screen], np.ndarray]
    reads_tensor: bool = False


def _unused(sel: _Selector, c: _Case) -> _Verdict:
    if c.uses:
        return None
    return "unused", "no node reads it" + (" (graph output only)" if c.name in sel.outputs else "")


def _disabled(sel: _Selector, c: _Case) -> _Verdict:
    is_act = c.kind == "activation"
    if (sel.options.activations if is_act else sel.options.params) or c.forced:
        return None
    return "disabled", f"{c.kind} offload is switched off (--{'activations' if is_act else 'params'})"


def _switched_off(sel: _Selector, screen: _Screen) -> np.ndarray:
    return np.where(screen.weights(), not sel.options.params, not sel.options.activations)


def _never(sel: _Selector, c: _Case) -> _Verdict:
    return ("never", "matches a --never pattern") if _matches(c.name, sel.options.never) else None


def _short(sel: _Selector, c: _Case) -> _Verdict:
    # checked before size and placement: no idle stretch qualifies, whatever else holds
    if c.forced or c.max_gap > sel.options.select_distance:
        return None
    return sel.gap_verdict(c.uses, c.max_gap, sel.options.select_distance)


def _sparse(sel: _Selector, c: _Case) -> _Verdict:
    if c.name not in sel.analysis.sparse_weights:
        return None
    return (
        "not-copyable",
        "a sparse weight (onnxruntime makes it dense when it loads the model); offloadctl copies dense tensors only",
    )


def _not_copyable(sel: _Selector, c: _Case) -> _Verdict:
    info = c.info
    if info is None or info.copyable:
        return None
    if info.bytes is None:
        return "not-copyable", info.why_unknown()
    return (
        "not-copyable",
        f"type {info.dtype} cannot be copied by onnxruntime's MemcpyToHost/MemcpyFromHost on every provider",
    )


def _unknown_size(sel: _Selector, c: _Case) -> _Verdict:
    if c.info is not None and c.info.bytes is not None:
        return None
    why = c.info.why_unknown() if c.info is not None else "shape inference could not find its type"
    return "unknown-size", f"size unknown: {why}; pin dynamic inputs with --input-shape NAME=D0,D1,..."


def _host_input(sel: _Selector, c: _Case) -> _Verdict:
    assert c.info is not None  # the rules before it reject a tensor without one
    host = None if c.forced else sel._host_reason(c.name, c.uses, c.info.elem_type)
    return None if host is None else ("host-input", host)


def _small_index(sel: _Selector, c: _Case) -> _Verdict:
    info = c.info
    assert info is not None and info.bytes is not None
    if c.forced or not _is_small_index(info):
        return None
    return (
        "host-input",
        f"a small {info.dtype} tensor ({info.bytes} B): index and shape arithmetic, which device providers run on "
        "the CPU where they have no kernel for it, so its copy from the host is copied again (on WebGPU such a "
        "rewrite did not load)" + FORCE_ADVICE,
    )


def _is_small_index(info: TensorInfo | None) -> bool:
    return info is not None and info.elem_type in INDEX_TYPES and (info.bytes or 0) <= SMALL_INDEX_BYTES


def _prepacked(sel: _Selector, c: _Case) -> _Verdict:
    if c.forced or c.kind == "activation" or not sel.packing:
        return None
    packed = prepacked_use(sel.analysis, c.uses, sel.packing)
    return None if packed is None else ("prepacked", packed)


def _host_resident(sel: _Selector, c: _Case) -> _Verdict:
    if c.forced or not sel.host_nodes:
        return None
    resident = sel._resident_reason(c.name, c.kind, c.uses)
    return None if resident is None else ("host-resident", resident)


def _fused(sel: _Selector, c: _Case) -> _Verdict:
    if c.forced or c.name not in sel.fused:
        return None
    return (
        "fused",
        "onnxruntime's graph optimizations at the level of the measured profile take it into a fused node or a "
        "folded constant; a copy would read it and undo that rewrite",
    )


def _output_weight(sel: _Selector, c: _Case) -> _Verdict:
    if c.kind == "activation" or c.name not in sel.outputs:
        return None
    return "graph-output-weight", "a weight that is also a graph output stays on the device"


def _none(screen: _Screen) -> np.ndarray:
    return np.zeros(len(screen.names), dtype=bool)


def _where(screen: _Screen, patterns: Iterable[str]) -> np.ndarray:
    """The candidates whose name matches one of ``patterns``."""
    return screen.each(lambda name: _matches(name, patterns)) if patterns else _none(screen)


#: the rule whose verdict depends on the select distance (`Selection.at_distance` checks it again)
GAPS_RULE = "short gaps"

#: Every reason a tensor stays, in the order they are checked.
RULES: tuple[Rule, ...] = (
    Rule("unused", _unused, lambda sel, s: ~s.has),
    Rule("disabled", _disabled, _switched_off),
    Rule("never", _never, lambda sel, s: _where(s, sel.options.never)),
    Rule(GAPS_RULE, _short, lambda sel, s: s.gaps <= sel.options.select_distance),
    Rule("sparse", _sparse, lambda sel, s: s.each(sel.analysis.sparse_weights.__contains__), reads_tensor=True),
    Rule("not copyable", _not_copyable, lambda sel, s: s.each_info(lambda i: i is None or not i.copyable), True),
    Rule("unknown size", _unknown_size, lambda sel, s: s.each_info(lambda i: i is None or i.bytes is None), True),
    Rule(
        "read on the host",
        _host_input,
        lambda sel, s: sel.host_read_uses(s) | s.each_info(lambda i: i is not None and i.elem_type in SHAPE_TYPES),
        True,
    ),
    Rule("small index", _small_index, lambda sel, s: s.each_info(_is_small_index), True),
    Rule("prepacked", _prepacked, lambda sel, s: sel.packed_uses(s) & s.weights(), True),
    Rule(
        "host resident",
        _host_resident,
        lambda sel, s: np.full(len(s.names), bool(sel.host_nodes)),
        True,
    ),
    Rule("fused", _fused, lambda sel, s: s.each(sel.fused.__contains__) if sel.fused else _none(s), True),
    Rule("output weight", _output_weight, lambda sel, s: s.each(sel.outputs.__contains__) & s.weights(), True),
)


def _entry(analysis: Analysis, chosen: Chosen, distance: int) -> Offload:
    """The ``offloads`` entry of a chosen tensor: its uses split into reload groups at select distance ``distance``."""
    device, groups = _reload_split(analysis, chosen, distance)
    return chosen_entry(
        analysis,
        chosen,
        device_uses=[u.to_json() for u in device],
        reload_groups=[reload_group([u.to_json() for u in g], gap) for gap, g in groups],
    )


class Chosen(NamedTuple):
    """A tensor the select stage offloads, as `Selection` keeps it: its ``offloads`` entry is built
    only when a plan lists it (`chosen_entry`), since a big model has hundreds of thousands."""

    tensor: str
    kind: Kind
    start: int  # its producer's position (an activation), or 0
    forced: bool  # matched a --force pattern
    info: TensorInfo  # its type, shape and size (known: the select stage rejects a tensor without them)

    @property
    def size(self) -> int:
        """Its bytes, the ``bytes`` of its entry."""
        size = self.info.bytes
        assert size is not None  # checked by _by_tensor
        return size


def chosen_entry(
    analysis: Analysis,
    chosen: Chosen,
    *,
    device_uses: list[PlanUse] | None = None,
    reload_groups: list[ReloadGroup] | None = None,
    prefetch_distance: int | None = None,
) -> Offload:
    """The ``offloads`` entry of a chosen tensor, with the given uses and reload groups (none by
    default) and prefetch distance."""
    info, start = chosen.info, chosen.start
    is_act = chosen.kind == "activation"
    output = is_act and chosen.tensor in analysis.graph_output_set
    return offload(
        tensor=chosen.tensor,
        kind=chosen.kind,
        dtype=info.dtype,
        shape=info.int_shape(),
        size=chosen.size,
        producer={"position": start, "node": analysis.node_names[start]} if is_act else None,
        device_uses=device_uses if device_uses is not None else [],
        reload_groups=reload_groups if reload_groups is not None else [],
        graph_output=output,
        output_h2d_before=analysis.num_positions if output else None,
        prefetch_distance=prefetch_distance,
        forced=chosen.forced,
    )


_Key = tuple[tuple[int, int], int]  # a record's place in plan order: (its first use, its candidate number)

#: reasons the select stage gives before it looks at idle stretches, as `RULES` orders them: no select
#: distance changes them (each of those rules is named by the reason it gives)
_BEFORE_GAPS = frozenset(rule.name for rule in RULES[: [rule.name for rule in RULES].index(GAPS_RULE)])


class Selection:
    """One pass of the select stage over an analysis, at select distance 0, for plans with weights and
    without, and at any select distance (`at_distance`).

    The budget planner needs both (it adds weights when activations alone cannot fit a budget):
    the tensors are looked at once, and `plan` assembles either plan; ``plan(weights=False)`` is
    what ``select`` gives with ``params=False``, except that its offloads list no device uses and
    no reload groups, and they are not numbered: the budget planner lays out and numbers each one it
    takes itself, from the analysis's uses (`offloadctl.planning.budget.candidates.plan_entry`). A
    big model has hundreds of thousands, so the planner reads them as `Chosen` records (`chosen`),
    the rejections (`rejected`) and a plan without either (`header`), and no entry is built for a
    tensor it does not take. `select` reads the same pass at its own distance: a longer distance
    only rejects more tensors, for their short idle stretches (`selection_for` keeps one pass per
    analysis and options, so a weak plan's next step selects no tensor again).
    """

    def __init__(self, analysis: Analysis, options: SelectPart) -> None:
        self.options = options
        self.analysis = analysis
        self._selector = _Selector(analysis, dataclasses.replace(options, params=True, select_distance=0))
        self._parts: dict[bool, tuple[list[tuple[_Key, Chosen]], list[tuple[_Key, Rejection]]]] = {}
        self._lists: dict[bool, tuple[list[Chosen], list[Rejection]]] = {}
        self._plans: dict[bool, Plan] = {}
        self._gap_columns: dict[bool, tuple[np.ndarray, np.ndarray]] = {}
        activations, weights, arrays = candidate_uses(analysis)
        analysis.infos.convert([*activations, *weights])  # every candidate is looked up below
        self._selector.consider_all(activations, weights, arrays)
        on_host = self._selector.forced_on_host
        if on_host:
            shown = "; ".join(f"{name!r}: {why}" for name, why in list(on_host.items())[:3])
            logger.warning(
                "%d --force'd tensor(s) are read where onnxruntime keeps them in host memory, and are offloaded "
                "anyway: %s%s. On a device provider (CUDA, CANN, WebGPU) onnxruntime copies such a tensor straight "
                "back, or cannot load the rewrite; on the CPU provider the rewrite runs. Narrow --force (or add "
                "--never) to keep them",
                len(on_host),
                shown,
                " …" if len(on_host) > 3 else "",
            )

    def plan(self, *, weights: bool) -> Plan:
        """The selected plan, weights considered or not (forced ones are always); built once each, and
        shared: the stages after select copy what they change (`offloadctl.contract.document.record_stage`)."""
        made = self._plans.get(weights)
        if made is None:
            chosen, rejected = self._split(weights)
            made = self._plans[weights] = {
                **self.header(weights=weights),
                "offloads": [chosen_entry(self.analysis, c) for c in chosen],  # not numbered (id 0)
                "rejected": list(rejected),
            }
        return made

    def header(self, *, weights: bool) -> Plan:
        """`plan` with empty ``offloads`` and ``rejected`` lists (its model, options and history)."""
        return _selected(self.analysis, dataclasses.replace(self.options, params=weights, select_distance=0))

    def chosen(self, *, weights: bool) -> list[Chosen]:
        """The tensors `plan` lists as offloads, in its order."""
        return self._split(weights)[0]

    def rejected(self, *, weights: bool) -> list[Rejection]:
        """`plan`'s ``rejected`` list (do not change it: it is shared)."""
        return self._split(weights)[1]

    def at_distance(self, distance: int, *, weights: bool) -> tuple[list[Chosen], list[Rejection]]:
        """(chosen, rejected) at select distance ``distance``, in plan order: what `plan` lists, less
        the tensors whose longest idle stretch is at most ``distance`` (unless forced), which are
        rejected for it instead (the rejections are shared with `plan`'s where they are the same)."""
        if distance == 0:
            return self._split(weights)
        selector = self._selector
        gaps, forced, uses_of = selector.gaps, selector.forced, self.analysis.uses

        def short(name: str, kind: Kind, size: int | None, max_gap: int) -> Rejection:
            if name in selector.subgraph_only:
                reason, detail = selector.gap_verdict(uses_of[name], max_gap, distance)
            else:
                reason, detail = "short-gaps", selector.short_detail(max_gap, distance)
            return rejection(name, kind, size, "select", reason, detail, max_gap)

        keyed_chosen, keyed_rejected = self._keyed(weights)
        records = self._split(weights)[0]
        record_gaps, record_forced = self._columns(weights)
        keep = record_forced | (record_gaps > distance)
        chosen = list(itertools.compress(records, keep))
        moved = [
            (key, short(c.tensor, c.kind, c.info.bytes, gap))
            for (key, c), gap in itertools.compress(zip(keyed_chosen, record_gaps.tolist()), ~keep)
        ]
        rejected: list[tuple[_Key, Rejection]] = []
        for key, entry in keyed_rejected:
            name = entry["tensor"]
            if entry["reason"] not in _BEFORE_GAPS and gaps[name] <= distance and name not in forced:
                entry = short(name, entry["kind"], entry["bytes"], gaps[name])  # noqa: PLW2901 - rejected at this distance
            rejected.append((key, entry))
        if moved:
            rejected += moved
            rejected.sort(key=operator.itemgetter(0))
        return chosen, [entry for _, entry in rejected]

    @property
    def numbers(self) -> dict[str, int]:
        """Each candidate's number: its place among the candidates, activations first (do not change it)."""
        return self._selector.index

    def reload_gaps(self, distance: int) -> np.ndarray:
        """By candidate number (`numbers`): the largest gap before a reload group of its `select` entry
        at select distance ``distance``, for a tensor with uses. That is its largest step longer than
        the distance, or with none its first step (a weight's first group, a forced tensor's only
        group: a first step that opens a group without being longer is never the largest)."""
        arrays, steps = self._selector.use_steps or (UseArrays.of([]), np.zeros(0, dtype=np.int64))
        has = arrays.counts > 0
        largest = np.full(len(arrays.counts), -1, dtype=np.int64)
        if has.any():
            largest[has] = np.maximum.reduceat(np.where(steps > distance, steps, -1), arrays.offsets[has])
        none = has & (largest < 0)
        largest[none] = steps[arrays.offsets[none]]
        return largest

    def _columns(self, weights: bool) -> tuple[np.ndarray, np.ndarray]:
        """The longest idle stretch of each of `chosen`'s records, and whether it is forced, as arrays;
        made once each."""
        made = self._gap_columns.get(weights)
        if made is None:
            records = self._split(weights)[0]
            gaps = self._selector.gaps
            made = self._gap_columns[weights] = (
                np.fromiter((gaps[c.tensor] for c in records), dtype=np.int64, count=len(records)),
                np.fromiter((c.forced for c in records), dtype=bool, count=len(records)),
            )
        return made

    def unread_outputs(self) -> list[Rejection]:
        """The graph outputs no node reads (rejected as unused activations), in `plan` order, which is
        the same with weights and without."""
        outputs = self.analysis.graph_output_set
        found = [
            (key, entry)
            for key, entry in self._selector.rejected
            if entry["reason"] == "unused" and entry["kind"] == "activation" and entry["tensor"] in outputs
        ]
        found.sort(key=lambda item: item[0])
        return [entry for _, entry in found]

    def _split(self, weights: bool) -> tuple[list[Chosen], list[Rejection]]:
        """(chosen, rejected) of the plan with or without weights, in plan order; made once each."""
        made = self._lists.get(weights)
        if made is None:
            chosen, rejected = self._keyed(weights)
            made = self._lists[weights] = ([c for _, c in chosen], [entry for _, entry in rejected])
        return made

    def _keyed(self, weights: bool) -> tuple[list[tuple[_Key, Chosen]], list[tuple[_Key, Rejection]]]:
        """`_split`'s lists with each record's plan-order key; made once each."""
        made = self._parts.get(weights)
        if made is not None:
            return made
        selector = self._selector
        chosen, rejected = list(selector.chosen), list(selector.rejected)
        if not weights:
            disabled = {c.tensor for _, c in chosen if c.kind == "parameter" and not c.forced} | {
                entry["tensor"]
                for _, entry in rejected
                if entry["kind"] == "parameter"
                and entry["reason"] != "unused"
                and not _matches(entry["tensor"], self.options.force)
            }
            chosen = [(key, c) for key, c in chosen if c.tensor not in disabled]
            rejected = [(key, e) for key, e in rejected if e["tensor"] not in disabled]
            for name in sorted(disabled):
                self._disable(name, rejected)
        chosen.sort(key=lambda item: item[0])
        rejected.sort(key=lambda item: item[0])
        made = self._parts[weights] = (chosen, rejected)
        return made

    def _disable(self, name: str, rejected: list[tuple[_Key, Rejection]]) -> None:
        uses = self.analysis.uses[name]
        info = self.analysis.infos.get(name)
        max_gap = longest_gap(0, uses, int(weight_idle_end(self.analysis.num_positions, uses[-1].position)))
        size = info.bytes if info is not None else None
        why = "parameter offload is switched off (--params)"
        key = (uses[0].sort_key, self._selector.index[name])
        rejected.append((key, rejection(name, "parameter", size, "select", "disabled", why, max_gap)))


def candidate_uses(analysis: Analysis) -> tuple[list[str], list[str], UseArrays]:
    """The select stage's candidates, every activation and then every weight some node reads, and
    their uses as arrays: the graph alone decides them, so they are made once per analysis (while
    onnx infers the sizes, for a command that opens a big model: `offloadctl.job.Job.of_model`)."""
    return derived(analysis, "select candidates", _candidate_uses)


def _candidate_uses(analysis: Analysis) -> tuple[list[str], list[str], UseArrays]:
    activations = list(analysis.producer)
    weights = [t for t in analysis.sorted_weights if t in analysis.uses]
    uses = analysis.uses
    return activations, weights, UseArrays.of([uses.get(name) or [] for name in (*activations, *weights)])


def selection_for(analysis: Analysis, options: SelectPart) -> Selection:
    """The `Selection` of ``analysis`` with ``options`` (their select distance and ``params`` aside):
    made once per analysis and options, and shared by the stages that select with them."""
    key = dataclasses.replace(options, params=True, select_distance=0)
    made: dict[SelectPart, Selection] = derived(analysis, "selections", lambda _analysis: {})
    found = made.get(key)
    if found is None:
        found = made[key] = Selection(analysis, key)
    return found


@paused_gc()
def select(analysis: Analysis, options: SelectPart) -> Plan:
    """Build a plan at stage "selected" from an analysed model with the select ``options``
    (``select(analysis, SelectPart(select_distance=1))``)."""
    chosen, rejected = selection_for(analysis, options).at_distance(options.select_distance, weights=options.params)
    return selected_plan(analysis, options, enumerate(chosen), rejected)


def selected_plan(
    analysis: Analysis, options: SelectPart, chosen: Iterable[tuple[int, Chosen]], rejected: list[Rejection]
) -> Plan:
    """The "selected" plan listing the given chosen tensors, each with its number (``id``) among the
    tensors `select` chooses, and the rejections (shared, in a list of the plan's own)."""
    distance = options.select_distance
    offloads = []
    for i, c in chosen:
        entry = _entry(analysis, c, distance)
        entry["id"] = i
        offloads.append(entry)
    return {**_selected(analysis, options), "offloads": offloads, "rejected": list(rejected)}


def _reload_split(analysis: Analysis, chosen: Chosen, distance: int) -> tuple[list[Use], list[tuple[int, list[Use]]]]:
    """`split_reload_groups` of a chosen tensor at select distance ``distance``: (device uses, groups)."""
    uses, start = analysis.uses[chosen.tensor], chosen.start
    device, groups = split_reload_groups(start, uses, distance, first_group_at_start=chosen.kind != "activation")
    if not groups:  # only a forced tensor gets here: one group holding every use
        device, groups = ([], [(uses[0].position - start, list(uses))])
    return device, groups


def _selected(analysis: Analysis, options: SelectPart) -> Plan:
    """A plan at stage "selected" made with ``options``, its ``offloads`` and ``rejected`` lists empty."""
    recorded_options = recorded(options)
    return {
        "schema_version": SCHEMA_VERSION,
        "stage": "selected",
        "tool": {"name": "offloadctl", "version": __version__},
        "model": _model_info(analysis),
        "strategy": "distance",
        "options": {"select": recorded_options},
        "history": [{"stage": "selected", "tool_version": __version__, "options": recorded_options}],
        "offloads": [],
        "rejected": [],
    }


def _model_info(analysis: Analysis) -> ModelInfo:
    """What the plan records of its model: file, hash, positions, and how its sizes were found."""
    loaded = analysis.loaded
    model: ModelInfo = {
        "path": str(loaded.path),
        "sha256": loaded.sha256,
        "num_positions": analysis.num_positions,
        "input_shapes": loaded.input_shapes,
    }
    if loaded.dims:
        model["dims"] = dict(loaded.dims)
    if loaded.sizes_from_run is not None:
        model["sizes_from_run"] = {**loaded.sizes_from_run}
    if analysis.order != "priority":
        model["execution_order"] = analysis.order
    return model


def derive_from_the_graph(analysis: Analysis) -> None:
    """Derive what later stages derive from the graph alone (the simulation's tensor ids, the select
    stage's candidates and their uses), while onnx's shape inference still runs in its child: on a
    big model it takes longer than the analysis, so this costs no time, and the work after the sizes
    arrive starts further on."""
    with paused_gc():
        plain_ids(analysis)
        candidate_uses(analysis)
