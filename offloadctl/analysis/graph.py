"""Read-only analysis of a loaded model: execution order, producers, uses and sizes.

The execution order is the one onnxruntime runs with ``ExecutionOrder.PRIORITY_BASED``
(`offloadctl.analysis.order`): Kahn's algorithm where, among ready nodes, Shape/Size come first,
then forward before backward (``__backwardpass`` attribute), then the lowest file index; or, asked
for, its DEFAULT order (the reverse depth-first walk every non-Python host runs). Constant
nodes take no position: onnxruntime folds them into initializers, so their outputs are weights
like initializers.
Positions count only the remaining ("original") nodes.

A tensor read inside a subgraph (If/Loop/Scan body, as an outer-scope name) is a use at the parent
node's position. Producer-to-user distances are read off these lists, which follow the execution
order (`offloadctl.analysis.order` names a cycle, with networkx, when there is one).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

import onnx

from offloadctl.analysis.order import (
    EXECUTION_ORDERS,
    HIGH_PRIORITY_OPS,
    PLAIN_RANK,
    default_order,
    describe_node,
    execution_order,
    executor_order,
    predecessors,
    priority_rank,
)
from offloadctl.core.bulk import paused_gc
from offloadctl.core.errors import OffloadError
from offloadctl.core.onnxutil import is_constant_node, is_pin, subgraph_outer_names
from offloadctl.loading.inference import start_inference
from offloadctl.loading.model import LoadedModel
from offloadctl.loading.tensors import TensorInfos, tensor_infos

if TYPE_CHECKING:
    from offloadctl.core import plantypes  # imported where used: it takes a seventh of the command line's start-up

__all__ = ["SUBGRAPH_READ", "Use", "Analysis", "analyse", "derived", "use_key", "with_scratch"]

logger = logging.getLogger(__name__)

#: where a read inside a subgraph of a node sorts among the node's inputs: after every one of them
SUBGRAPH_READ = 1 << 30


def use_key(position: int, input_index: int | None) -> tuple[int, int]:
    """The first-use order of a read: by position, then input index, a read inside a subgraph last."""
    return (position, input_index if input_index is not None else SUBGRAPH_READ)


class Use(NamedTuple):
    """One read of a tensor: by the node at ``position``, at ``input_index``.

    ``input_index`` is None for a read inside a subgraph of that node (an outer-scope name).
    """

    position: int
    input_index: int | None
    node: str

    @property
    def sort_key(self) -> tuple[int, int]:
        return use_key(self.position, self.input_index)

    def to_json(self) -> plantypes.Use:
        return {"position": self.position, "node": self.node, "input_index": self.input_index}


@dataclass
class Analysis:
    """Everything the planning stages need to know about a model, computed once."""

    loaded: LoadedModel
    nodes: list[onnx.NodeProto]  # original nodes in execution order; index = position
    file_index: list[int]  # file index (in graph.node) of the node at each position
    was_sorted: bool
    plain_priority: bool  # no Shape/Size and no backward node: onnxruntime runs a sorted file in file order
    graph_inputs: list[str]
    graph_outputs: list[str]
    initializers: set[str]
    constants: dict[str, int]  # Constant-node output -> file index of the Constant node
    producer: dict[str, int]  # activation name -> position of its producer
    uses: dict[str, list[Use]]  # tensor -> uses in execution order (position, input index)
    infos: TensorInfos  # lazy: looked-up tensors are converted (and inference run) on demand
    node_names: list[str]  # a unique label for each position (node name, or generated)
    sparse_weights: frozenset[str] = frozenset()  # sparse initializers and Constant sparse_values
    backward: bool = False  # some node is a backward node (``__backwardpass``), which priority order runs apart
    topological: bool = True  # the file's node order is a valid order (was_sorted: it is the order that runs)
    order: str = "priority"  # the execution order positions count in: "priority" or "default"
    # positions of the nodes that run on the CPU beside a device provider (`offloadctl.loading.placed`):
    # what they make is in host memory; empty when the whole model runs on one device
    host: frozenset[int] = frozenset()
    # position -> bytes its kernel allocates while it runs and frees before it returns, as a measured
    # profile records them (`offloadctl.simulation.timing.scratched`, `with_scratch`: set when the analysis
    # is made, never after); every memory figure counts them
    scratch: dict[int, int] = field(default_factory=dict)
    # positions of the nodes that have attributes, in order (None: not known, every position): only
    # these can hold a subgraph or be an order pin's, and a big graph has few
    attributed: list[int] | None = None
    # what later stages computed from this analysis, by key (`derived`)
    derived: dict[Hashable, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def num_positions(self) -> int:
        return len(self.nodes)

    @cached_property
    def weights(self) -> set[str]:
        return self.initializers | set(self.constants)

    @cached_property
    def sorted_weights(self) -> tuple[str, ...]:
        """`weights` in name order (the order plans and ids list them in)."""
        return tuple(sorted(self.weights))

    @cached_property
    def graph_output_set(self) -> frozenset[str]:
        """`graph_outputs` as a set, for lookups."""
        return frozenset(self.graph_outputs)

    def kind(self, tensor: str) -> str:
        """'activation', 'parameter' or 'input' for a main-graph tensor."""
        if tensor in self.producer:
            return "activation"
        if tensor in self.initializers or tensor in self.constants:
            return "parameter"
        return "input"

    def with_attributes(self) -> Sequence[int]:
        """The positions whose nodes have attributes (every position when that is not known)."""
        return self.attributed if self.attributed is not None else range(self.num_positions)

    def dynamic_inputs(self) -> list[str]:
        """The graph inputs of unknown size (a dynamic dimension nobody pinned): what is computed from
        them has no size either, so it is not offloaded and no budget can be checked."""
        return [
            name
            for name in self.graph_inputs
            if (info := self.infos.get(name)) is not None and info.copyable and info.bytes is None
        ]

    @paused_gc()
    def unknown_sizes(self) -> list[str]:
        """Graph inputs, activations and weights whose byte size is unknown (memory figures count
        them as 0 bytes), in that order; an order pin's tensors are left out."""
        # an order pin's tensors (a view, an Optional, a shape) hold no bytes of their own
        pins = {p for p in self.with_attributes() if is_pin(self.nodes[p])}
        made = [n for n, p in self.producer.items() if p not in pins] if pins else list(self.producer)
        names = dict.fromkeys([*self.graph_inputs, *made, *self.sorted_weights])
        left = self.infos.convert(names)  # what it converted has a known size
        return [n for n in left if (info := self.infos.get(n)) is None or info.bytes is None]


_T = TypeVar("_T")


def derived(analysis: Analysis, key: Hashable, compute: Callable[[Analysis], _T]) -> _T:
    """``compute(analysis)``, computed once per Analysis object and ``key`` and kept on it (an
    analysis is read-only, so what the later stages derive from it holds as long as it lives)."""
    found = analysis.derived
    if key not in found:
        found[key] = compute(analysis)
    return found[key]


def with_scratch(analysis: Analysis, scratch: Mapping[int, int]) -> Analysis:
    """``analysis`` counting the kernel scratch ``scratch`` (position -> bytes) in its memory figures:
    itself when that is the scratch it counts, else a copy that shares all it holds but the scratch and
    what was derived from it. An analysis never changes once made, so nothing derived from it is ever
    cleared: a figure made with other scratch comes from another analysis."""
    found = {p: b for p, b in scratch.items() if b}
    if found == analysis.scratch:
        return analysis
    # made once per scratch (a budget search simulates many plans with one profile)
    return derived(analysis, ("with scratch", *sorted(found.items())), lambda a: dataclasses.replace(a, scratch=found))


@dataclass
class _Definitions:
    """What defines each tensor name of the main graph, read once from the file."""

    graph_inputs: list[str]
    initializers: set[str]
    sparse: set[str]  # sparse initializers and Constant sparse_values
    constants: dict[str, int]  # Constant-node output -> its file index
    compute: list[int]  # file indices of the nodes that take positions
    # "a graph input", "a weight", or the file index of a node (described only when reporting a
    # duplicate, so big graphs do not format a label per tensor)
    defined: dict[str, str | int]
    file_nodes: list[onnx.NodeProto]
    file_outputs: list[list[str]]


def _definitions(loaded: LoadedModel) -> _Definitions:
    """Every name's definition; a name defined twice, or a graph output nobody defines, is refused."""
    graph = loaded.proto.graph
    sparse = {i.values.name for i in graph.sparse_initializer}
    initializers = {i.name for i in graph.initializer} | sparse
    graph_inputs = [i.name for i in graph.input if i.name not in initializers]
    found = _Definitions(graph_inputs, initializers, sparse, {}, [], {}, list(graph.node), [])
    defined = found.defined
    defined.update(dict.fromkeys(graph_inputs, "a graph input"))
    defined.update(dict.fromkeys(initializers, "a weight"))
    found.file_outputs = [node.output[:] for node in found.file_nodes]  # a slice is a list, made faster than list()
    for idx, node in enumerate(found.file_nodes):
        outputs = found.file_outputs[idx]
        for out in outputs:
            if out in defined and out:
                _defined_twice(loaded, found, out, node, idx)
            defined[out] = idx
        if not is_constant_node(node):
            found.compute.append(idx)
        elif outputs and outputs[0]:
            found.constants[outputs[0]] = idx
            if any(a.name == "sparse_value" for a in node.attribute):
                sparse.add(outputs[0])
    defined.pop("", None)
    _check_outputs_defined(loaded, defined)
    return found


def _check_outputs_defined(loaded: LoadedModel, defined: Mapping[str, object]) -> None:
    """Refuse a graph output that no node, graph input or weight defines."""
    for out in loaded.proto.graph.output:
        if out.name not in defined:
            raise OffloadError(
                f"graph output {out.name!r} of {loaded.path} is not produced by any node, graph input or weight",
                hint="the model is malformed; re-export it or fix the output name",
            )


def _defined_twice(loaded: LoadedModel, found: _Definitions, out: str, node: onnx.NodeProto, idx: int) -> None:
    first = found.defined[out]
    by = f"node {describe_node(found.file_nodes[first], first)}" if isinstance(first, int) else first
    raise OffloadError(
        f"tensor {out!r} is defined twice in {loaded.path} (by node {describe_node(node, idx)} and by {by})",
        hint="tensor names must be unique; re-export the model or rename one of them",
    )


def _node_reads(
    nodes: list[onnx.NodeProto],
) -> tuple[list[list[str]], list[list[str]], list[int], list[list[str]], list[bool]]:
    """(inputs, reads inside subgraphs (outer-scope names, sorted), priority ranks, every read, whether
    it has attributes) of each node. The subgraph reads and ranks come from the attributes, which
    most nodes of a big graph lack."""
    inputs = [node.input[:] for node in nodes]
    outer: list[list[str]] = [[]] * len(nodes)  # shared empty list, never mutated
    ranks = [PLAIN_RANK] * len(nodes)
    attributed = [False] * len(nodes)
    for i, node in enumerate(nodes):
        if node.attribute:
            attributed[i] = True
            ranks[i] = priority_rank(node)
            names = subgraph_outer_names(node)
            if names:
                outer[i] = sorted(names)
        elif node.op_type in HIGH_PRIORITY_OPS:
            ranks[i] = 0
    reads = []
    for ins, out in zip(inputs, outer):
        present = ins if "" not in ins else [name for name in ins if name]  # optional inputs left out
        reads.append(present + out if out else present)
    return inputs, outer, ranks, reads, attributed


def _ordered(
    loaded: LoadedModel,
    nodes: list[onnx.NodeProto],
    available: set[str],
    reads: list[list[str]],
    ranks: list[int],
    outputs: list[list[str]],
    kind: str = "priority",
    quiet: bool = False,
) -> tuple[list[int], bool, bool]:
    """(the order onnxruntime runs the nodes in, whether the file has them in it, whether the file's
    order is topological at all), saying so when the file's order is not the one that runs (unless
    ``quiet``: a graph built in memory, such as a placed one, whose copies come last)."""
    try:
        if kind == "default":
            order = default_order(nodes, available, reads, outputs)
            was_sorted = all(order[k] < order[k + 1] for k in range(len(order) - 1))
        else:
            order, was_sorted = execution_order(nodes, available, reads, ranks, outputs)
    except OffloadError as exc:
        raise OffloadError(f"{loaded.path}: {exc.message}", hint=exc.hint) from None
    topological = was_sorted or _is_topological(reads, outputs)
    if kind == "default" or quiet:
        return order, was_sorted, topological
    if not topological:
        logger.warning(
            "%s: nodes are not topologically sorted; they were sorted into the order onnxruntime will run "
            "and plan positions count in that order",
            loaded.path,
        )
    elif not was_sorted:
        moved = sum(1 for k, i in enumerate(order) if k != i)
        logger.info(
            "%s: onnxruntime runs %d node(s) at another place than the file has them (Shape/Size as soon as they "
            "are ready, forward nodes before backward ones); plan positions count in the order it runs",
            loaded.path,
            moved,
        )
    return order, was_sorted, topological


def _producers_and_uses(
    order: list[int],
    outputs: list[list[str]],
    inputs: list[list[str]],
    outer: list[list[str]],
    node_names: list[str],
) -> tuple[dict[str, int], dict[str, list[Use]]]:
    """Each activation's producer position and each tensor's uses, in execution order: positions
    ascend, and within a node the input indices ascend before the subgraph reads (input_index None),
    which is `Use.sort_key`'s order. ``outputs``, ``inputs`` and ``outer`` are per compute node."""
    producer: dict[str, int] = {}
    uses: dict[str, list[Use]] = {}
    get = uses.get
    new_use = tuple.__new__  # Use(...) without the NamedTuple's Python-level __new__ (big graphs)
    for pos, i in enumerate(order):
        label = node_names[pos]
        for out in outputs[i]:
            producer[out] = pos
        k = 0
        for name in inputs[i]:
            if name:
                use = new_use(Use, (pos, k, label))
                lst = get(name)
                if lst is None:
                    uses[name] = [use]
                else:
                    lst.append(use)
            k += 1
        for name in outer[i]:
            uses.setdefault(name, []).append(Use(pos, None, label))
    producer.pop("", None)
    return producer, uses


@paused_gc()
def analyse(
    loaded: LoadedModel,
    *,
    order: str = "priority",
    sequence: Sequence[int] | None = None,
    host: Collection[int] | None = None,
    infer_ahead: bool = False,
) -> Analysis:
    """Compute execution order, producers, uses and sizes of a loaded model.

    ``order`` is the execution order positions count in: ``priority`` (PRIORITY_BASED, what
    `offloadctl run` and Python hosts set) or ``default`` (onnxruntime's DEFAULT, every other host).
    ``host``, the indices in ``graph.node`` of the nodes that run on the CPU beside a device provider
    (`offloadctl.loading.placed`), makes it the order onnxruntime's executor runs the two providers'
    streams in (`offloadctl.analysis.order.executor_order`). ``sequence``, indices in ``graph.node``
    in the order a run took them (onnxruntime's profile), replaces either: a node it lacks stays
    right after the one it follows. ``infer_ahead``, for a caller that will look up sizes, starts
    onnx's shape inference of a big model in a child process while this analysis runs
    (`offloadctl.loading.inference.start_inference`), unless `load_model` started it
    (``loaded.inference``), which is then taken either way.

    Raises:
        OffloadError: duplicate tensor names, a cycle, a read of an undefined tensor, or a graph
            output that nothing produces.
    """
    ahead = loaded.inference or (start_inference(loaded.proto) if infer_ahead else None)  # stopped when dropped unused
    found = _definitions(loaded)
    compute = found.compute
    available = set(found.graph_inputs) | found.initializers | set(found.constants)
    compute_nodes = [found.file_nodes[i] for i in compute]
    compute_outputs = [found.file_outputs[i] for i in compute]
    if order not in EXECUTION_ORDERS:
        raise OffloadError(f"unknown execution order {order!r}", hint=f"use one of: {', '.join(EXECUTION_ORDERS)}")
    kind = order
    inputs, outer, ranks, reads, attributed = _node_reads(compute_nodes)
    ordered, was_sorted, topological = _ordered(
        loaded, compute_nodes, available, reads, ranks, compute_outputs, kind, quiet=host is not None
    )
    on_host = frozenset(host or ())
    if on_host:
        preds, _ = predecessors(compute_nodes, available, reads, compute_outputs)
        ordered = executor_order(ordered, preds, [i in on_host for i in compute])
    if sequence is not None:
        ordered = _as_ran(ordered, compute, sequence)
    if on_host or sequence is not None:
        was_sorted = ordered == sorted(ordered)
    nodes = [compute_nodes[i] for i in ordered]
    file_index = [compute[i] for i in ordered]
    node_names = _unique_labels(nodes, file_index)
    producer, uses = _producers_and_uses(ordered, compute_outputs, inputs, outer, node_names)
    constants = found.constants
    return Analysis(
        loaded=loaded,
        nodes=nodes,
        file_index=file_index,
        was_sorted=was_sorted,
        plain_priority=all(r == PLAIN_RANK for r in ranks),
        backward=any(r % 2 for r in ranks),
        graph_inputs=found.graph_inputs,
        graph_outputs=[o.name for o in loaded.proto.graph.output],
        initializers=found.initializers,
        constants=constants,
        producer=producer,
        uses=uses,
        infos=tensor_infos(
            loaded,
            None if was_sorted else sorted(constants.values()) + file_index,
            constants,
            producers=found.defined,
            ahead=ahead,
        ),
        node_names=node_names,
        sparse_weights=frozenset(found.sparse),
        topological=topological,
        order=kind,
        host=frozenset(p for p, i in enumerate(file_index) if i in on_host),
        attributed=[p for p, i in enumerate(ordered) if attributed[i]],
    )


def _as_ran(ordered: list[int], file_index: list[int], sequence: Sequence[int]) -> list[int]:
    """``ordered`` re-sorted by each node's place in ``sequence`` (file indices); one it lacks follows
    its predecessor."""
    at = {i: k for k, i in enumerate(sequence)}
    keys: dict[int, tuple[int, int]] = {}
    last = (-1, 0)
    for i in ordered:
        where = at.get(file_index[i])
        last = (where, 0) if where is not None else (last[0], last[1] + 1)
        keys[i] = last
    return sorted(ordered, key=keys.__getitem__)


def _is_topological(reads: list[list[str]], outputs: list[list[str]]) -> bool:
    """True when every node reads only what earlier nodes (or no node) produce, in file order."""
    produced_at: dict[str, int] = {}
    for i, outs in enumerate(outputs):
        for out in outs:
            produced_at[out] = i
    return all(produced_at.get(name, -1) < i for i, names in enumerate(reads) for name in names)


def _unique_labels(nodes: list[onnx.NodeProto], file_index: list[int]) -> list[str]:
    names = [node.name for node in nodes]
    seen: dict[str, int] = {}
    for name in names:
        seen[name] = seen.get(name, 0) + 1
    return [
        name if name and seen[name] == 1 else f"{name or node.op_type}#{idx}"
        for name, node, idx in zip(names, nodes, file_index)
    ]
