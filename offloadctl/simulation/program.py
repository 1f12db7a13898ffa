"""Programs: the steps the device runs, in onnxruntime's PRIORITY_BASED order, and the tensors they
read and write.

Without a plan the steps are the model's nodes (positions 0..n-1). With a plan, copies are steps
too: for every position q, first the H2Ds placed ``h2d_before: q`` (in plan order, then reload-group
order), then node q, then the D2Hs placed ``d2h_after: q``; H2Ds placed before ``num_positions`` run
after the last node. A model that is already rewritten (it contains ``MemcpyToHost``/
``MemcpyFromHost`` nodes) is walked in its own order, and its "before" is the same model with the
copies taken out (each copy output read as the tensor it copies). Copy steps carry the position of
the node they follow (D2H) or precede (H2D) so reports can name original nodes.

A program also records where each tensor lives (device or host), which tensors are resident for the
whole run, and, for an offloaded activation, the step its device buffer is held through (the plan's
release point) and the D2H the compute stream waits for there. `program_for` checks a plan against
the model (`offloadctl.contract.check`, the check apply makes) before building its program.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property, partial

from offloadctl.analysis.graph import Analysis
from offloadctl.analysis.timeline import subgraph_memory, weight_is_resident
from offloadctl.contract.check import check_plan_for_model
from offloadctl.contract.document import check_plan_model
from offloadctl.contract.order_pins import pin_layout
from offloadctl.core.errors import OffloadError
from offloadctl.core.onnxutil import copy_kind, is_event, is_pin, pin_view_source
from offloadctl.core.plantypes import Plan
from offloadctl.loading.placed import CPU_OUTPUT_OPS
from offloadctl.simulation.base import Base, base_of, canonical_names, interner

__all__ = ["DEVICE", "HOST", "Program", "before_program", "program_for"]

DEVICE, HOST = 0, 1


@dataclass
class Program:
    """Steps in run order and the tensors they read and write (ids index the tensor arrays)."""

    kinds: list[str]  # "node" | "d2h" | "h2d"
    positions: list[int]  # node: its position; d2h: the position it follows; h2d: the one it precedes
    reads: list[list[int]]
    writes: list[list[int]]
    names: list[str]
    sizes: list[int]
    place: list[int]  # DEVICE or HOST
    resident: list[bool]  # alive for the whole run (weights)
    from_start: list[bool]  # graph inputs
    to_end: list[bool]  # graph outputs
    inner: list[int] = field(default_factory=list)  # per step: memory inside the node's subgraphs
    always: int = 0  # device bytes resident for the whole run besides the tensors (subgraph weights)
    hold: dict[int, int] = field(default_factory=dict)  # tensor -> step its buffer is kept through
    waits: list[tuple[int, int]] = field(default_factory=list)  # (after step, wait for copy step)
    step_labels: list[str] | None = None  # rewritten models: the node labels
    # counts the nodes of order pins the model has (rewritten) or apply adds (a plan): `pin_nodes`
    count_pins: Callable[[], int] = field(default=lambda: 0, repr=False, compare=False)

    @cached_property
    def pin_nodes(self) -> int:
        """The nodes of the order pins: no data moves; the time model prices each as one more
        trivial node under a measured profile (the profile's kernel_launch_s), so they are counted
        when first asked (a plan's needs its pin layout)."""
        return self.count_pins()

    def label(self, base: Base, s: int) -> str:
        """A readable name for step ``s``."""
        if self.step_labels is not None:
            return self.step_labels[s]
        kind, pos = self.kinds[s], self.positions[s]
        if kind == "node":
            return base.labels[pos]
        tensor = self.names[self.reads[s][0]] if kind == "d2h" else self.names[self.writes[s][0]]
        tensor = tensor.split("@", 1)[0]
        if kind == "d2h":
            return f"D2H({tensor}) after {base.labels[pos]}"
        return f"H2D({tensor}) " + (f"before {base.labels[pos]}" if pos < base.n else "at the end")


def before_program(base: Base) -> Program:
    """The program of the model as it is (every tensor on the device), built once per base."""
    before = base.derived.get("before")
    if not isinstance(before, Program):
        before = base.derived["before"] = Program(
            kinds=["node"] * base.n,
            positions=list(range(base.n)),
            reads=base.reads,
            writes=base.writes,
            names=base.names,
            sizes=base.sizes,
            place=[DEVICE] * len(base.names),
            resident=base.resident,
            from_start=base.graph_input,
            to_end=base.graph_output,
            inner=base.inner,
            always=base.subgraph_weights,
        )
    return before


class _Steps:
    """The steps of a program with copies, appended in run order: the base's nodes (a stretch
    without copies at once, sharing the base's lists) and the copies between them."""

    def __init__(self, base: Base) -> None:
        self.base = base
        self.kinds: list[str] = []
        self.positions: list[int] = []
        self.reads: list[list[int]] = []
        self.writes: list[list[int]] = []
        self.inner: list[int] = []
        self.node_step = [0] * base.n  # position -> its step
        self.d2h_step: dict[int, int] = {}  # offloaded tensor -> the step of its D2H

    def nodes(self, first: int, end: int) -> None:
        """The nodes at positions ``first`` .. ``end - 1``, as the base has them."""
        if end <= first:
            return
        base, count = self.base, end - first
        self.node_step[first:end] = range(len(self.kinds), len(self.kinds) + count)
        self.kinds.extend(itertools.repeat("node", count))
        self.positions.extend(range(first, end))
        self.reads.extend(base.reads[first:end])
        self.writes.extend(base.writes[first:end])
        self.inner.extend(base.inner[first:end])

    def node(self, q: int, reads: list[int] | None) -> None:
        """The node at position ``q``, reading ``reads`` (None: what the base says it reads)."""
        if reads is None:
            self.nodes(q, q + 1)
            return
        self.node_step[q] = len(self.kinds)
        self.kinds.append("node")
        self.positions.append(q)
        self.reads.append(reads)
        self.writes.append(self.base.writes[q])
        self.inner.append(self.base.inner[q])

    def copy(self, kind: str, q: int, src: int, dst: int) -> None:
        """A copy (``kind`` h2d or d2h) anchored at position ``q``, reading ``src`` and writing ``dst``."""
        if kind == "d2h":
            self.d2h_step[src] = len(self.kinds)
        self.kinds.append(kind)
        self.positions.append(q)
        self.reads.append([src])
        self.writes.append([dst])
        self.inner.append(0)


def _plan_program(base: Base, plan: Plan) -> Program:
    """The program of the original model with the plan's copies inserted (the plan checked by `program_for`)."""
    n = base.n
    names = list(base.names)
    sizes = list(base.sizes)
    place = [DEVICE] * len(names)
    resident = list(base.resident)
    from_start = list(base.graph_input)
    to_end = list(base.graph_output)
    pre: dict[int, list[tuple[int, int]]] = {}  # position -> (source, copy) of the H2Ds before it
    post: dict[int, list[tuple[int, int]]] = {}  # position -> (tensor, host copy) of the D2Hs after it
    remap: dict[int, dict[int, int]] = {}  # position -> {tensor: copy read there instead}
    releases: list[tuple[int, int, int]] = []  # (tensor, host copy, release position)

    def new_tensor(name: str, size: int, where: int, end: bool = False) -> int:
        names.append(name)
        sizes.append(size)
        place.append(where)
        resident.append(False)
        from_start.append(False)
        to_end.append(end)
        return len(names) - 1

    for off in plan["offloads"]:
        name = off["tensor"]
        t = base.index[name]
        is_act = off["kind"] == "activation"
        size = sizes[t]
        if is_act:
            d2h = off["d2h_after"]
            assert d2h is not None  # a valid plan's activation has its D2H position
            src = new_tensor(f"{name}@host", size, HOST)
            post.setdefault(d2h, []).append((t, src))
            release = off["release_after"]
            releases.append((t, src, d2h if release is None else release))
        else:
            src = t
            place[t] = HOST
        for k, g in enumerate(off["reload_groups"]):
            dst = new_tensor(f"{name}@h2d{k}", size, DEVICE)
            h2d = g["h2d_before"]
            assert h2d is not None  # checked when the program is built from a scheduled plan
            pre.setdefault(h2d, []).append((src, dst))
            for u in g["uses"]:
                remap.setdefault(u["position"], {})[t] = dst
        if is_act and off["graph_output"] and off["output_h2d_before"] is not None:
            to_end[t] = False
            dst = new_tensor(f"{name}@output", size, DEVICE, end=True)
            pre.setdefault(off["output_h2d_before"], []).append((src, dst))

    steps = _Steps(base)
    # the nodes between the positions a copy touches are taken over from the base a stretch at a time
    done = 0  # the positions before this one are in the program
    for q in sorted({*pre, *post, *remap}):
        steps.nodes(done, q)
        for src, dst in pre.get(q, ()):
            steps.copy("h2d", q, src, dst)
        if q == n:
            break
        swap = remap.get(q)
        steps.node(q, [swap.get(t, t) for t in base.reads[q]] if swap else None)
        for src, dst in post.get(q, ()):
            steps.copy("d2h", q, src, dst)
        done = q + 1
    else:
        steps.nodes(done, n)
    kinds, positions, node_step, d2h_step = steps.kinds, steps.positions, steps.node_step, steps.d2h_step
    program = Program(kinds, positions, steps.reads, steps.writes, names, sizes, place, resident, from_start, to_end)
    program.inner = steps.inner
    program.always = base.subgraph_weights
    last = len(kinds) - 1
    for t, _src, release in releases:
        d = d2h_step[t]
        point = last if release >= n else max(node_step[release], d)
        program.hold[t] = point
        program.waits.append((point, d))
    return program


def _copy_steps(analysis: Analysis) -> tuple[list[str], list[int], list[int]]:
    """Each step's kind (node, d2h, h2d), the original position it is anchored to (a D2H: the node it
    follows; an H2D: the node it precedes) and the analysis position it is. An order pin's node is
    not a step, nor is an event node of a streams rewrite: neither moves data (their time is counted
    apart, `Program.pin_nodes`)."""
    kinds: list[str] = []
    positions: list[int] = []
    steps: list[int] = []
    originals = 0
    for p, node in enumerate(analysis.nodes):
        if is_pin(node) or is_event(node):
            continue
        steps.append(p)
        kind = copy_kind(node) or "node"
        kinds.append(kind)
        if kind == "node":
            positions.append(originals)
            originals += 1
        else:
            positions.append(originals - 1 if kind == "d2h" else originals)
    return kinds, positions, steps


def _rewritten_sizes(analysis: Analysis, base: Base, names: list[str]) -> list[int]:
    """Each tensor's size; a copy has the size of what it copies (apply writes value_info, but do not
    rely on it)."""
    sizes = [0] * len(names)
    for t, name in enumerate(names):
        size = base.sizes[base.index[base.canon(name)]] if base.canon(name) in base.index else None
        info = analysis.infos.get(name)
        own = info.bytes if info is not None else None
        sizes[t] = own if own is not None else (size or 0)
    return sizes


def _rewritten_places(
    analysis: Analysis,
    kinds: list[str],
    steps: list[int],
    reads: list[list[int]],
    writes: list[list[int]],
    index: dict[str, int],
) -> list[int]:
    """Where each tensor lives: a D2H's output, and on a device where some nodes run on the host
    (`Analysis.host`), what they make and what a kernel writes to host memory (Shape, Size), on the
    host; so is a weight or graph input that only copies and host nodes read."""
    place = [DEVICE] * len(index)
    host = analysis.host
    for s, kind in enumerate(kinds):
        if kind == "d2h" or (host and (steps[s] in host or analysis.nodes[steps[s]].op_type in CPU_OUTPUT_OPS)):
            for t in writes[s]:
                place[t] = HOST
    read: set[int] = set()
    on_device: set[int] = set()
    for s, kind in enumerate(kinds):
        read.update(reads[s])
        if kind == "node" and steps[s] not in host:
            on_device.update(reads[s])
    for name in [*analysis.weights, *analysis.graph_inputs]:
        t = index[name]
        if t in read and t not in on_device:
            place[t] = HOST  # an offloaded weight (or input), or one only the host reads
    return place


def _d2h_waits(kinds: list[str], reads: list[list[int]], writes: list[list[int]]) -> list[tuple[int, int]]:
    """(step, d2h step) pairs: a D2H's buffer is freed only after its last node read and the copy."""
    last_node_read: dict[int, int] = {}
    producer_step: dict[int, int] = {}
    for s, kind in enumerate(kinds):
        for t in writes[s]:
            producer_step[t] = s
        if kind == "node":
            for t in reads[s]:
                last_node_read[t] = s
    waits = []
    for s, kind in enumerate(kinds):
        if kind == "d2h" and reads[s]:
            t = reads[s][0]
            waits.append((max(s, last_node_read.get(t, producer_step.get(t, s))), s))
    return waits


def _extend_by_pins(
    pin_reads: list[tuple[int, int]],
    kinds: list[str],
    steps: list[int],
    reads: list[list[int]],
    writes: list[list[int]],
    readers: set[int],
) -> None:
    """Count the reads of order pins' nodes in the lifetimes they make (in place, in ``reads``).

    A pin's node is no step, but it reads a tensor where it runs, and a tensor is freed only after its
    last reader. Under DEFAULT a pin's ``Shape(dep)`` can run long after ``dep``'s own last use (next
    to the copy's consumer): ``dep`` stays alive all that while. The read is counted at the last step
    before the pin's node (the tensor is freed before the next step allocates), or, where that step
    made the tensor, at the next one when nothing else reads it. Only what a node makes counts: the
    pins' own constants are no activations, and a view reads its copy's output where the copy's
    readers do (counting it at another step would make that step wait for the copy)."""
    made_at: dict[int, int] = {}
    for s, outs in enumerate(writes):
        if kinds[s] == "node":
            for t in outs:
                made_at[t] = s
    for t, position in pin_reads:
        if t not in made_at:  # a weight (the pins' own constants), a graph input or a copy: read where planned
            continue
        s = bisect.bisect_left(steps, position) - 1  # the last step before the pin's node
        if s > made_at[t]:
            reads[s].append(t)
            readers.add(t)
        elif t not in readers and s + 1 < len(steps):
            reads[s + 1].append(t)
            readers.add(t)


def _rewritten_program(analysis: Analysis, base: Base) -> Program:
    """The program of a rewritten model: its own nodes, copies included, in its own order."""
    kinds, positions, steps = _copy_steps(analysis)
    pins = len(analysis.nodes) - len(steps)  # the order pins' nodes are no steps
    step_of = {p: s for s, p in enumerate(steps)}
    names, index, tid = interner()
    for name in analysis.graph_inputs:
        tid(name)
    for name in analysis.sorted_weights:
        tid(name)
    # an order pin's view is the tensor it views, and an event's output the tensor it reads: no buffer of
    # their own, their readers read that tensor
    views = _aliases(analysis)
    reads: list[list[int]] = [[] for _ in kinds]
    readers: set[int] = set()
    pin_reads: list[tuple[int, int]] = []  # (tensor, position of the pin node reading it)
    for name, uses in analysis.uses.items():
        t = tid(views.get(name, name))
        for use in uses:
            s = step_of.get(use.position)
            if s is not None:
                reads[s].append(t)
                readers.add(t)
            elif use.position < len(analysis.nodes):
                pin_reads.append((t, use.position))
    writes = [[tid(o) for o in analysis.nodes[p].output if o and o not in views] for p in steps]
    _extend_by_pins(pin_reads, kinds, steps, reads, writes, readers)
    for name in analysis.graph_outputs:
        tid(name)
    count = len(names)
    weights, outputs = set(analysis.weights), set(analysis.graph_outputs)
    resident = [name in weights and weight_is_resident(index[name] in readers, name in outputs) for name in names]
    from_start = [False] * count
    for name in analysis.graph_inputs:
        from_start[index[name]] = True
    to_end = [False] * count
    for name in analysis.graph_outputs:
        to_end[index[name]] = True
    sub = subgraph_memory(analysis)
    program = Program(
        kinds,
        positions,
        reads,
        writes,
        names,
        _rewritten_sizes(analysis, base, names),
        _rewritten_places(analysis, kinds, steps, reads, writes, index),
        resident,
        from_start,
        to_end,
        inner=[sub.at(p) for p in steps],
        always=sub.weight_bytes,
        step_labels=[analysis.node_names[p] for p in steps],
        count_pins=lambda: pins,
    )
    program.waits.extend(_d2h_waits(kinds, reads, writes))
    return program


def _aliases(analysis: Analysis) -> dict[str, str]:
    """Each order-pin view's and event output's name -> the tensor it stands for (chains followed)."""
    direct: dict[str, str] = {}
    for node in analysis.nodes:
        source = pin_view_source(node) or (node.input[0] if is_event(node) else None)
        if source and node.output:
            direct[node.output[0]] = source
    canon = canonical_names(direct)
    return {name: canon(name) for name in direct}


def program_for(analysis: Analysis, plan: Plan | None, source: str, *, checked: bool = False) -> tuple[Base, Program]:
    """The base of ``analysis`` and the program of the model with ``plan`` (None: as it is);
    ``checked``: the plan's facts are known to hold for this model (a plan a planner just made from it).

    Raises:
        OffloadError: a plan for a rewritten model, or a plan that is not scheduled, belongs to
            another model or contradicts it.
    """
    base = base_of(analysis)
    if base.rewritten and plan is not None:
        raise OffloadError(
            f"{analysis.loaded.path} already contains MemcpyToHost/MemcpyFromHost copies; it cannot take a plan",
            hint="simulate the rewritten model on its own, or the original model with the plan",
        )
    if base.rewritten or analysis.host:  # a placed model is simulated as it is (`offloadctl.loading.placed`)
        assert plan is None, "a plan is simulated on the model without its placement"
        return base, _rewritten_program(analysis, base)
    if plan is not None:
        check_plan_model(plan, analysis.loaded.sha256, analysis.loaded.path)
        if plan.get("stage") != "scheduled":
            raise OffloadError(
                f"{source} is at stage {plan.get('stage')!r}; simulating needs a scheduled plan",
                hint="run offloadctl prefetch on it (or offloadctl plan to do every stage)",
            )
        if not checked:
            check_plan_for_model(plan, analysis)  # what apply accepts, and nothing else
    if plan is None or not plan["offloads"]:
        return base, before_program(base)
    program = _plan_program(base, plan)
    program.count_pins = partial(_pin_count, plan, analysis)
    return base, program


def _pin_count(plan: Plan, analysis: Analysis) -> int:
    return pin_layout(plan, analysis).nodes
