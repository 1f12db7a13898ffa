"""Where a plan's order pins go: the one rule the rewrite builds them by and the simulator counts them by.

onnxruntime's DEFAULT order (every host but Python) emits a node once its inputs are emitted and
ignores the file order: unheld, a ``MemcpyToHost`` runs right before its ``MemcpyFromHost``, next to
the consumer, and the tensor stays on the device the whole time. A data dependency holds a copy in
place, through a view that changes nothing (`offloadctl.rewriting.rewrite` builds it):
``view = Reshape(t, Concat(zeros, e, ...))`` where ``zeros`` is an int64 initializer of t's rank
(Reshape's 0 keeps that dimension) and each ``e`` an empty int64 tensor that depends on what the
view must wait for.

No pin node on a device reads a host tensor, on any provider and for any element type (onnxruntime
would copy it back to the device right away and undo the plan):

- The D2Hs after position p: the next original node that reads an activation (p + 1 when it does;
  never a Reshape, Squeeze, Unsqueeze or Flatten, which onnxruntime fuses with a Reshape before them)
  reads it through a view whose ``e`` are ``Shape(OptionalHasElement(Optional(host)))`` (the shape
  of a scalar), one per host copy. Optional and OptionalHasElement have CPU kernels only (the CUDA,
  CANN and WebGPU providers register none), so they run where the host copy is (fp16 too, which
  CUDA's and CANN's CPU fallback never moves); the Shape and the Concat read only their CPU outputs.
  Each D2H then runs no later than planned. They need opset 15; below it, D2Hs are not pinned.
  ONNX's Optional takes no bfloat16, float8, int4, uint4 or float4 tensor at any opset
  (`d2h_pinnable`): a D2H of one goes unpinned and is listed as holding under PRIORITY_BASED only
  (of those types only bfloat16 is ever copied: `offloadctl.core.memcpy.COPY_TYPES`).
- The H2Ds before position q: the view sits on the H2D's *device* output, and the group's uses read
  the view: ``e = Shape(dep, start=0, end=0)``. Under DEFAULT the pin's ``Shape(dep)`` runs where the
  walk reaches the view, which can be right before the group's first reader: a ``dep`` whose own
  last use came earlier stays alive all that while, and the simulation of the rewrite counts it
  (PP-OCRv4 det's DEFAULT rewrite ran at 257 MiB against 49 MiB planned). So ``dep`` is an
  activation still read at or after the first reader where there is one (`_Sources.awaited`): in a
  forward graph planned in the DEFAULT walk (`waits_ahead`) the earliest made from q - 1 on (the
  Concat and the view follow that node in the file, so the walk emits it, and then the H2D, when
  it reaches the view: the H2D runs no earlier than planned in that walk; the pin is recorded as
  holding in the DEFAULT order only, ``"order": "default"``, since PRIORITY_BASED runs the copy at
  its place in the file); else the latest made in the few positions before q; else the last made
  before q, one read at or after q preferred. The DEFAULT walk explores a node's highest-index
  input first, and the Concat (after the H2D in the file) reads only ``e`` and a constant, so
  ``dep`` is emitted before the H2D is reached. The view is a Reshape: its type must be one
  Reshape takes at the model's opset (`h2d_pinnable`).

Views sit on floating-point activations of known rank only (a view of a weight would hide it from
prepacking and constant folding; integer tensors are mostly shapes being computed, which
onnxruntime's Reshape fusions rewrite), never on a (De)QuantizeLinear output (onnxruntime fuses those
with their one reader) nor on an If/Loop/Scan output (onnxruntime inlines a constant If's branch and
renames it), nor on a tensor the plan keeps for onnxruntime's fusions (``options.select.fused``, from
a profile measured above ``--opt-level disable``): a pin reading it would undo the fusion as a copy
would.

Every pin edge goes forward in the planned sequence (an H2D's view waits for a node before the
group's first reader), and the planned sequence is a topological
order of the model, so a pin never makes a cycle. ``Shape(x, start, end)`` needs opset 15;
opsets 10 to 14 take ``Slice(Shape(x), [0], [0])`` (one more node per dependency); below 10 nothing is
pinned.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import onnx

from offloadctl.analysis.graph import Analysis
from offloadctl.core.files import json_sha256
from offloadctl.core.onnxutil import has_subgraphs
from offloadctl.core.plantypes import Plan

__all__ = [
    "RESHAPE_OPS",
    "PinLayout",
    "d2h_pinnable",
    "h2d_pinnable",
    "host_positions",
    "pin_layout",
    "pin_rank",
    "record_pins",
    "viewable",
    "waits_ahead",
]


@dataclass(frozen=True)
class PinLayout:
    """The pins of one plan."""

    # D2H position p -> (the position whose node is held, the index of the input its view stands in for)
    d2h: dict[int, tuple[int, int]] = field(default_factory=dict)
    # H2D position q -> (the position whose output it waits for, the index of that output)
    h2d: dict[int, tuple[int, int]] = field(default_factory=dict)
    nodes: int = 0  # nodes the pins add
    unpinned: list[str] = field(default_factory=list)  # copies no pin holds, and why
    slice_form: bool = False  # opsets 10 to 14: Slice(Shape(x), [0], [0])
    avoid: frozenset[str] = frozenset()  # tensors no pin reads: what the plan keeps for fusions


def _opset(analysis: Analysis) -> int:
    return next((o.version for o in analysis.loaded.proto.opset_import if o.domain in ("", "ai.onnx")), 0)


_QDQ = frozenset({"DequantizeLinear", "QuantizeLinear"})
# floating-point data: an integer tensor is often a shape being computed (Gather of a Shape, then
# Unsqueeze and Concat), which onnxruntime's Reshape fusions rewrite at ORT_ENABLE_ALL; a view there
# once broke a model's loading ("Attempting to get index by a name which does not exist")
_DATA_TYPES = frozenset(
    {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE}
)


def viewable(analysis: Analysis, name: str, avoid: frozenset[str] = frozenset()) -> bool:
    """A tensor a pin can view or wait for: a floating-point activation (a view of a weight would hide
    it from prepacking and constant folding; an integer tensor is often a shape being computed), not
    a (De)QuantizeLinear output (onnxruntime fuses those with their one reader) and not an
    If/Loop/Scan output; nor one in ``avoid`` (a tensor that onnxruntime's fusions take in at the
    level the plan was made for: a pin reading it would undo the fusion, as a copy would)."""
    if name in avoid:
        return False
    info = analysis.infos.get(name) if name else None
    if info is None or not info.copyable or info.elem_type not in _DATA_TYPES:
        return False
    producer = analysis.producer.get(name)
    if producer is None:
        return False
    node = analysis.nodes[producer]
    # an If/Loop/Scan output: onnxruntime may inline the body (a constant If's branch) and rename its
    # outputs, and at ORT_ENABLE_ALL a Reshape fusion after it then looked for the view's old input name
    return node.op_type not in _QDQ and not has_subgraphs(node)


#: Ops onnxruntime fuses with a Reshape before them (FuseContiguousReshapes): a view feeding one
#: was merged into a new Reshape that named an input that no longer existed, at ORT_ENABLE_ALL.
_RESHAPES = RESHAPE_OPS = frozenset({"Reshape", "Squeeze", "Unsqueeze", "Flatten"})


def _held_input(
    analysis: Analysis,
    position: int,
    avoid: frozenset[str],
    reloaded: frozenset[tuple[int, int]],
    host: frozenset[int] = frozenset(),
) -> int | None:
    """The input of the node at ``position`` a pin's view can stand in for (its index), or None. An
    input an H2D feeds is passed over (it reads the H2D's own view, and a view of a view is a pair
    of Reshapes that onnxruntime fuses into one), and so is one a Reshape-like node made (the view
    and that node are such a pair: GPT-2's attention reshapes, at ORT_ENABLE_ALL, did not load). A
    node the plan's device runs on the host (``host``) holds nothing: it would read the device view
    through a copy onnxruntime inserts, next to the rewrite's pin."""
    node = analysis.nodes[position]
    if node.op_type in _RESHAPES or position in host:
        return None

    def held(k: int, name: str) -> bool:
        made_by = analysis.producer.get(name)
        return (
            (position, k) not in reloaded
            and viewable(analysis, name, avoid)
            and (made_by is None or analysis.nodes[made_by].op_type not in _RESHAPES)
        )

    return next((k for k, name in enumerate(node.input) if held(k, name)), None)


class _Holders:
    """The first node at or after a position whose input a pin's view can stand in for (`_held_input`),
    each node looked at once: a plan that reloads every input (``--force '*'``) leaves no holder,
    and a scan from each copy to the end would look at a big graph's nodes once per copy."""

    def __init__(
        self,
        analysis: Analysis,
        avoid: frozenset[str],
        reloaded: frozenset[tuple[int, int]],
        host: frozenset[int],
    ) -> None:
        self.analysis, self.avoid, self.reloaded, self.host = analysis, avoid, reloaded, host
        self.found: dict[int, tuple[int, int] | None] = {}  # position -> the first holder at or after it

    def first(self, start: int) -> tuple[int, int] | None:
        """(position, input index) of the first holder at or after ``start``; None: none up to the end."""
        looked: list[int] = []
        result = None
        for t in range(start, self.analysis.num_positions):
            if t in self.found:
                result = self.found[t]
                break
            looked.append(t)
            k = _held_input(self.analysis, t, self.avoid, self.reloaded, self.host)
            if k is not None:
                result = (t, k)
                break
        self.found.update(dict.fromkeys(looked, result))
        return result


def _into_reshapes(plan: Plan, analysis: Analysis) -> frozenset[tuple[int, str]]:
    """(H2D position, tensor) of every reload group a Reshape-like node reads: a view feeding one
    is merged into a new Reshape that names an input that no longer exists (onnxruntime's
    FuseContiguousReshapes at ORT_ENABLE_ALL)."""
    found = set()
    for off in plan["offloads"]:
        groups = [(g["h2d_before"], g["uses"]) for g in off["reload_groups"]]
        for at, uses in groups:
            if at is not None and any(analysis.nodes[u["position"]].op_type in _RESHAPES for u in uses):
                found.add((at, off["tensor"]))
    return frozenset(found)


def _reloaded(plan: Plan) -> frozenset[tuple[int, int]]:
    """(position, input index) of every input a reload group's H2D feeds."""
    return frozenset(
        (use["position"], use["input_index"])
        for off in plan["offloads"]
        for group in off["reload_groups"]
        for use in group["uses"]
        if use["input_index"] is not None
    )


def _copy_positions(plan: Plan, end: int) -> tuple[dict[int, list[str]], dict[int, list[str]], dict[int, int]]:
    """(position -> the tensors of the D2H copies after it, position -> the tensors of the H2D copies
    before it, position -> the first position that reads an H2D before it: ``end`` for one that feeds
    a graph output)."""
    d2hs: dict[int, list[str]] = {}
    h2ds: dict[int, list[str]] = {}
    first_use: dict[int, int] = {}
    for off in plan["offloads"]:
        if off["kind"] == "activation" and off["d2h_after"] is not None:
            d2hs.setdefault(off["d2h_after"], []).append(off["tensor"])
        for group in off["reload_groups"]:
            q = group["h2d_before"]
            if q is not None:
                h2ds.setdefault(q, []).append(off["tensor"])
                read = min((u["position"] for u in group["uses"]), default=end)
                first_use[q] = min(first_use.get(q, read), read)
        at = off.get("output_h2d_before")
        if off.get("graph_output") and at is not None:
            h2ds.setdefault(at, []).append(off["tensor"])
            first_use[at] = min(first_use.get(at, end), end)
    return d2hs, h2ds, first_use


@functools.cache
def _takes(op: str, opset: int, elem_type: int) -> bool:
    """Whether ONNX's ``op`` at ``opset`` takes a tensor of ``elem_type`` as its first input."""
    try:
        schema = onnx.defs.get_schema(op, opset)
    except onnx.defs.SchemaError:
        return False
    wanted = f"tensor({onnx.TensorProto.DataType.Name(elem_type).lower()})"
    first = schema.inputs[0].type_str
    allowed = {c.type_param_str: c.allowed_type_strs for c in schema.type_constraints}
    return wanted in allowed.get(first, [first])


def _type_name(analysis: Analysis, tensor: str) -> str:
    info = analysis.infos.get(tensor)
    return onnx.TensorProto.DataType.Name(info.elem_type).lower() if info is not None else "unknown"


def d2h_pinnable(analysis: Analysis, tensor: str) -> bool:
    """Whether a D2H of ``tensor`` can be pinned: ONNX's ``Optional`` takes no bfloat16, float8, int4,
    uint4 or float4 tensor at any opset (a model with such a pin does not load), and no other op
    reads a host copy on the host alone on every provider. A tensor of unknown type is tried."""
    info = analysis.infos.get(tensor)
    if info is None or not info.elem_type:
        return True
    return _takes("Optional", max(_opset(analysis), 15), info.elem_type)


def h2d_pinnable(analysis: Analysis, tensor: str) -> bool:
    """Whether an H2D of ``tensor`` can be pinned: its view is a Reshape built from constant zeros, so
    its rank must be known and Reshape at the model's opset must take its type (float8 needs opset
    19, int4 and uint4 opset 21)."""
    info = analysis.infos.get(tensor)
    if pin_rank(analysis, tensor) is None:
        return False
    return info is None or not info.elem_type or _takes("Reshape", _opset(analysis), info.elem_type)


def pin_rank(analysis: Analysis, tensor: str) -> int | None:
    """The rank of ``tensor`` when its view can be built from constant zeros (None: unknown)."""
    info = analysis.infos.get(tensor)
    return None if info is None or info.shape is None else len(info.shape)


def _last_use(analysis: Analysis, name: str) -> int:
    """The position of the last node that reads ``name`` (the end for a graph output)."""
    if name in analysis.graph_outputs:
        return analysis.num_positions
    uses = analysis.uses.get(name) or []
    return max((u.position for u in uses), default=-1)


class _Sources:
    """The output an H2D waits for (`before`), the graph's nodes looked at once each between H2Ds:
    a graph whose tensors are seldom viewable would otherwise be scanned from each H2D back to its
    start."""

    def __init__(self, analysis: Analysis, avoid: frozenset[str]) -> None:
        self.analysis, self.avoid = analysis, avoid
        self.viewable: dict[int, list[int]] = {}  # position -> indices of its viewable outputs
        self.nearest: dict[int, int] = {}  # position -> the last position at or before it with one (-1: none)

    def outputs(self, s: int) -> list[int]:
        found = self.viewable.get(s)
        if found is None:
            outputs = self.analysis.nodes[s].output
            found = [j for j, name in enumerate(outputs) if viewable(self.analysis, name, self.avoid)]
            self.viewable[s] = found
        return found

    def last_at_or_before(self, s: int) -> int:
        """The last position at or before ``s`` whose node makes a viewable output (-1: none)."""
        looked: list[int] = []
        result = -1
        while s >= 0:
            if s in self.nearest:
                result = self.nearest[s]
                break
            looked.append(s)
            if self.outputs(s):
                result = s
                break
            s -= 1
        self.nearest.update(dict.fromkeys(looked, result))
        return result

    def awaited(self, q: int, read: int, low: int, *, ahead: bool = False) -> tuple[int, int] | None:
        """The output an H2D before ``q``, first read at ``read``, waits for. Under DEFAULT the pin's
        ``Shape`` of it can run as late as the walk reaches the H2D's first reader, so the output is
        one still alive there (read at or after ``read``) where there is one, and the pin keeps no
        tensor alive longer. With ``ahead`` (a forward graph planned in the DEFAULT walk) the earliest
        such made from q - 1 on, before ``read`` (the walk explores it before it reaches the H2D);
        then the latest such made before q (down to ``low``); else `before`'s."""
        after = range(max(q - 1, 0), min(read, q - 1 + _LOOK_AHEAD) if ahead else q)
        return self._alive_at(after, read) or self._alive_at(self._back_from(q - 2, low), read) or self.before(q, low)

    def _back_from(self, s: int, low: int) -> Iterator[int]:
        """The positions at or before ``s``, down to ``low``, whose nodes make a viewable output."""
        s = self.last_at_or_before(s)
        while s >= low:
            yield s
            s = self.last_at_or_before(s - 1)

    def _alive_at(self, positions: Iterable[int], read: int) -> tuple[int, int] | None:
        """The first (position, output) of ``positions`` whose viewable output is read at or after ``read``."""
        nodes = self.analysis.nodes
        for s in positions:
            for j in self.outputs(s):
                if _last_use(self.analysis, nodes[s].output[j]) >= read:
                    return (s, j)
        return None

    def before(self, q: int, low: int) -> tuple[int, int] | None:
        """The output an H2D before ``q`` waits for: of the last node before q that makes a viewable
        one, preferring (down to position ``low``) one still read at or after q."""
        analysis = self.analysis
        fallback = None
        s = self.last_at_or_before(q - 1)
        while s >= 0:
            if fallback is not None and s < low:
                break
            for j in self.outputs(s):
                if fallback is None:
                    fallback = (s, j)
                if _last_use(analysis, analysis.nodes[s].output[j]) >= q:
                    return (s, j)
            if s <= low:
                break
            s = self.last_at_or_before(s - 1)
        return fallback


#: how far after an H2D's planned point a pin may look for an output alive at its first reader
_LOOK_AHEAD = 64


def _d2h_count(analysis: Analysis, p: int, tensors: list[str], opset: int, unpinned: list[str]) -> int:
    """How many of the D2Hs of ``tensors`` after position ``p`` a pin can hold; why the others cannot
    is added to ``unpinned``."""
    if opset < 15:
        unpinned.append(f"{len(tensors)} D2H copy(ies) after position {p}: the model's opset {opset} has no Optional")
        return 0
    count = sum(d2h_pinnable(analysis, t) for t in tensors)
    if count < len(tensors):
        kinds = sorted({_type_name(analysis, t) for t in tensors if not d2h_pinnable(analysis, t)})
        unpinned.append(
            f"{len(tensors) - count} D2H copy(ies) after position {p}: ONNX's Optional takes no "
            f"{' or '.join(kinds)} tensor, and no other pin reads a host copy on the host alone"
        )
    return count


def pin_layout(plan: Plan, analysis: Analysis) -> PinLayout:
    """The order pins `offloadctl apply` adds for ``plan`` (a scheduled plan for ``analysis``): the
    layout `record_pins` stored in the plan while its offloads are unchanged, else found here (which
    needs the types of the activations around the copies: shape inference on the whole graph)."""
    d2hs, h2ds, first_use = _copy_positions(plan, analysis.num_positions)
    opset = _opset(analysis)
    if not d2hs and not h2ds:
        return PinLayout()
    select = plan["options"].get("select", {})
    host = host_positions(analysis, select.get("host_nodes", ()))
    # no pin reads what the plan keeps for fusions, nor what a node on the host makes (in host memory)
    avoid = frozenset(select.get("fused", ())) | {o for p in host for o in analysis.nodes[p].output if o}
    if opset < 10:
        return PinLayout(unpinned=[f"every copy: the model's opset {opset} is below 10"])
    recorded = _recorded(plan, analysis, d2hs, h2ds, first_use, avoid, opset < 15)
    if recorded is not None:
        return recorded
    per_dep = 2 if opset < 15 else 1  # Shape(x, 0, 0), or Slice(Shape(x), [0], [0])
    nodes = 0
    unpinned: list[str] = []
    held: dict[int, tuple[int, int]] = {}
    n = analysis.num_positions
    reloaded = _reloaded(plan)
    into_reshapes = _into_reshapes(plan, analysis)
    holder = _Holders(analysis, avoid, reloaded, host)
    for p, tensors in sorted(d2hs.items()):
        count = _d2h_count(analysis, p, tensors, opset, unpinned)
        if not count:
            continue
        found = holder.first(p + 1)
        if found is None:
            if p + 1 < n:
                unpinned.append(f"{count} D2H copy(ies) after position {p}: no later node reads a tensor")
            continue
        held[p] = found
        # Concat and Reshape (and Shape(t) when t's rank is unknown), then Optional, OptionalHasElement
        # and Shape per host copy
        t, k = found
        nodes += 2 + (pin_rank(analysis, analysis.nodes[t].input[k]) is None) + 3 * count
    waits: dict[int, tuple[int, int]] = {}
    sources = _Sources(analysis, avoid)
    ahead = waits_ahead(analysis, host)
    for q, tensors in sorted(h2ds.items()):
        if q == 0:
            continue
        ranked = [t for t in tensors if h2d_pinnable(analysis, t)]
        if len(ranked) < len(tensors):
            unpinned.append(
                f"{len(tensors) - len(ranked)} H2D copy(ies) before position {q}: rank unknown, or a type "
                f"Reshape does not take at the model's opset {opset}"
            )
        reshaped = [t for t in ranked if (q, t) in into_reshapes]
        if reshaped:
            unpinned.append(
                f"{len(reshaped)} H2D copy(ies) before position {q}: read by a Reshape, Squeeze, Unsqueeze or "
                "Flatten, which onnxruntime would fuse with the pin's view"
            )
            ranked = [t for t in ranked if t not in reshaped]
        if not ranked:
            continue
        source = sources.awaited(q, first_use[q], max(0, q - 8), ahead=ahead)
        if source is None:
            unpinned.append(f"{len(ranked)} H2D copy(ies) before position {q}: no earlier node makes a tensor")
            continue
        waits[q] = source
        nodes += per_dep + 2 * len(ranked)  # one empty shape of the output, then Concat and Reshape per copy
    return PinLayout(held, waits, nodes, unpinned, slice_form=opset < 15, avoid=avoid)


def waits_ahead(analysis: Analysis, host: frozenset[int] = frozenset()) -> bool:
    """Whether an H2D's pin may wait for a node after its planned point: in a plan counted in the
    DEFAULT walk of a forward graph on one device, where the rewrite's file is the planned sequence,
    so that the pin's Concat and view follow both the copy and that node, and the walk explores that
    node before it reaches the copy. (In a training graph the rewrite files backward copies apart
    from their pins, and the walk reached a copy before its pin.) Such a pin holds in the DEFAULT
    order only: PRIORITY_BASED runs the copy at its place in the file."""
    return analysis.order == "default" and not analysis.backward and not host


def host_positions(analysis: Analysis, labels: Any) -> frozenset[int]:
    """The positions of the nodes a plan's device runs on the host (``options.select.host_nodes``)."""
    wanted = set(labels)
    if not wanted:
        return frozenset()
    return frozenset(p for p, label in enumerate(analysis.node_names) if label in wanted)


# ------------------------------------------------------------------------------ the layout in the plan

# the pins' form: a layout recorded for another form is found again
_FORM = 3


def _layout_key(plan: Plan) -> str:
    """What a recorded layout holds for: the offloads, the tensors kept for fusions and the nodes the
    plan's device runs on the host."""
    select = plan["options"].get("select", {})
    kept = {"fused": select.get("fused", [])}
    if select.get("host_nodes"):
        kept["host"] = select["host_nodes"]
    return json_sha256({"offloads": plan["offloads"], **kept, "form": _FORM})


def record_pins(plan: Plan, layout: PinLayout) -> None:
    """Store ``layout`` (`pin_layout` of ``plan``) in ``plan["summary"]["pins"]``, keyed by a hash of
    the offloads and of the tensors kept for fusions: ``apply`` of a weights-only plan then needs no
    shape inference (``offloadctl plan`` has run it), and an edited plan gets its layout found again."""
    plan.setdefault("summary", {})["pins"] = {
        "d2h": {str(p): list(at) for p, at in layout.d2h.items()},
        "h2d": {str(q): list(at) for q, at in layout.h2d.items()},
        "nodes": layout.nodes,
        "unpinned": list(layout.unpinned),
        "key": _layout_key(plan),
    }


def _pairs(entries: Any, low: int, high: int) -> dict[int, tuple[int, int]] | None:
    """``{"position": [node position, index]}`` with every position in [low, high); None if malformed."""
    if not isinstance(entries, dict):
        return None
    found: dict[int, tuple[int, int]] = {}
    for key, value in entries.items():
        if not (isinstance(key, str) and key.isdigit() and isinstance(value, list) and len(value) == 2):
            return None
        if not all(type(v) is int and v >= 0 for v in value) or not low <= value[0] < high:
            return None
        found[int(key)] = (value[0], value[1])
    return found


def _recorded(
    plan: Plan,
    analysis: Analysis,
    d2hs: dict[int, list[str]],
    h2ds: dict[int, list[str]],
    first_use: dict[int, int],
    avoid: frozenset[str],
    slice_form: bool,
) -> PinLayout | None:
    """The layout `record_pins` stored, if it holds for the plan as it is and fits the model: every
    held node comes after its D2Hs and reads that input, every awaited node makes that output
    before the first reader of its H2Ds (so a recorded layout cannot make a cycle); None otherwise."""
    recorded = (plan.get("summary") or {}).get("pins")
    if not isinstance(recorded, dict) or recorded.get("key") != _layout_key(plan):
        return None
    n = analysis.num_positions
    held, waits = _pairs(recorded.get("d2h"), 0, n), _pairs(recorded.get("h2d"), 0, n)
    nodes, unpinned = recorded.get("nodes"), recorded.get("unpinned")
    if held is None or waits is None or type(nodes) is not int or not isinstance(unpinned, list):
        return None
    for p, (t, k) in held.items():
        if p not in d2hs or t <= p or k >= len(analysis.nodes[t].input) or not analysis.nodes[t].input[k]:
            return None
    for q, (s, j) in waits.items():
        if q not in h2ds or s >= first_use[q] or j >= len(analysis.nodes[s].output) or not analysis.nodes[s].output[j]:
            return None
    texts = [str(u) for u in unpinned]
    return PinLayout(held, waits, nodes, texts, slice_form=slice_form, avoid=avoid)
