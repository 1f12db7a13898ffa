"""The orders onnxruntime runs a graph's nodes in, and the names it runs them under.

``ExecutionOrder.PRIORITY_BASED`` (`execution_order`): Kahn's algorithm where, among ready nodes,
Shape/Size come first, then forward before backward (``__backwardpass``), then the lowest file
index. Only the Python binding sets it; the plan's positions count in this order.

``ExecutionOrder.DEFAULT`` (`default_order`): onnxruntime's reverse depth-first walk
(``Graph::ReverseDFSFrom`` in ``graph_viewer.cc``) from the leaves (nodes nobody reads), each pushed in
node-index order, a node's producers pushed in ascending index so that the highest-index unvisited
producer is explored first, a node emitted once its producers are. It ignores priorities. C, C++,
C#, Java, onnxruntime-genai and Triton hosts can run no other order.

`expected_run_order` predicts, for a model as it stands, the names of the nodes onnxruntime runs
in that order, after the rewrites it applies at every optimization level
(`offloadctl.loading.ortgraph`); `offloadctl run` checks the profiled order against it.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping

import onnx

from offloadctl.core.errors import OffloadError
from offloadctl.core.onnxutil import is_backward, is_constant_node, subgraph_outer_names
from offloadctl.loading.ortgraph import (
    expand_inlined_functions,
    inlined_calls,
    remove_duplicate_casts,
    unique_dequantize,
)

__all__ = [
    "EXECUTION_ORDERS",
    "HIGH_PRIORITY_OPS",
    "PLAIN_RANK",
    "default_order",
    "describe_node",
    "execution_order",
    "expected_run_order",
    "node_reads",
    "predecessors",
    "priority_rank",
    "priority_ranks",
    "sorted_priority_order",
]

HIGH_PRIORITY_OPS = frozenset({"Shape", "Size"})

#: The one vocabulary of orders: offloadctl's names (``--execution-order``, plans, metadata) -> the name of
#: onnxruntime's ExecutionOrder member, used only where onnxruntime or a host reads it (sessions, the
#: settings record a rewritten model carries).
EXECUTION_ORDERS: dict[str, str] = {"priority": "PRIORITY_BASED", "default": "DEFAULT"}

PLAIN_RANK = 2  # a forward node that is not Shape/Size: ordered by file index alone


def priority_rank(node: onnx.NodeProto) -> int:
    """A node's first sort key in onnxruntime's priority order: Shape/Size first, then forward
    before backward (``__backwardpass``); ties are broken by file index."""
    rank = 0 if node.op_type in HIGH_PRIORITY_OPS else PLAIN_RANK
    if node.attribute and is_backward(node):
        rank += 1
    return rank


def priority_ranks(nodes: list[onnx.NodeProto], *, forward_only: bool = False) -> list[int]:
    """`priority_rank` of each node (``forward_only``: the caller knows none is a backward node, so the
    op type alone gives the rank, without a look at the attributes)."""
    if forward_only:
        return [0 if node.op_type in HIGH_PRIORITY_OPS else PLAIN_RANK for node in nodes]
    return [priority_rank(node) for node in nodes]


def execution_order(
    nodes: list[onnx.NodeProto],
    available: set[str],
    reads: list[list[str]] | None = None,
    ranks: list[int] | None = None,
    outputs: list[list[str]] | None = None,
) -> tuple[list[int], bool]:
    """Order node indices as onnxruntime's PRIORITY_BASED mode does.

    Args:
        nodes: the nodes that take part (Constant nodes already removed), in file order.
        available: tensor names present before any node runs (inputs, initializers, constants).
        reads, ranks, outputs: ``node_reads(node)``, ``priority_ranks(nodes)`` and the outputs of
            each node, when the caller has them already (big graphs: protobuf fields are slow to read).

    Returns:
        (order, was_sorted): indices into ``nodes``, and whether ``nodes`` was already in a
        topological order.

    Raises:
        OffloadError: the graph has a cycle or reads a tensor nobody provides.
    """
    if reads is None:
        reads = [node_reads(node) for node in nodes]
    rank = priority_ranks(nodes) if ranks is None else ranks
    if all(r == PLAIN_RANK for r in rank) and _file_order_runs(nodes, available, reads, outputs):
        # Kahn's algorithm by file index alone returns a topological file order unchanged.
        return list(range(len(nodes))), True
    all_preds, _ = predecessors(nodes, available, reads, outputs)
    order = _kahn(nodes, all_preds, rank)
    was_sorted = all(order[k] < order[k + 1] for k in range(len(order) - 1))
    return order, was_sorted


def sorted_priority_order(
    nodes: list[onnx.NodeProto], ranks: list[int] | None = None, producer: Mapping[str, int] | None = None
) -> list[int] | None:
    """`execution_order` of nodes already in a topological order (each reads only what earlier nodes
    make, or no node) when every node is a plain forward node or Shape/Size, in one pass without the
    graph's edges: the file order, each Shape/Size moved to right after the last node it reads from
    (in Kahn's algorithm a ready Shape/Size goes first, and the next plain node in file order is
    always ready). None when some node is a backward node. The order is not checked to be
    topological: callers build it so (`offloadctl.rewriting.rewrite`). ``ranks``: `priority_ranks`
    of the nodes, and ``producer``: the index of the node that makes each tensor, when the caller
    knows them (it is asked only for what a Shape/Size node reads).
    """
    if ranks is None:
        ranks = priority_ranks(nodes)
    high = [i for i, r in enumerate(ranks) if r == 0]
    if any(r not in (0, PLAIN_RANK) for r in ranks):
        return None
    if not high:
        return list(range(len(nodes)))
    if producer is None:
        producer = {out: i for i, node in enumerate(nodes) for out in node.output if out}
    waiting: dict[int, list[int]] = {}  # node -> the Shape/Size nodes that read from it
    indegree: dict[int, int] = {}
    for h in high:
        preds = {producer[name] for name in node_reads(nodes[h]) if name in producer}
        indegree[h] = len(preds)
        for p in preds:
            waiting.setdefault(p, []).append(h)
    ready = [h for h in high if indegree[h] == 0]
    heapq.heapify(ready)
    order: list[int] = []

    def emit(i: int) -> None:
        order.append(i)
        for h in waiting.get(i, ()):
            indegree[h] -= 1
            if indegree[h] == 0:
                heapq.heappush(ready, h)

    for i in [None, *(i for i, rank in enumerate(ranks) if rank != 0)]:
        if i is not None:
            emit(i)
        while ready:  # the Shape/Size nodes this made ready, and those they make ready, lowest index first
            emit(heapq.heappop(ready))
    return order


def default_order(
    nodes: list[onnx.NodeProto],
    available: set[str],
    reads: list[list[str]] | None = None,
    outputs: list[list[str]] | None = None,
) -> list[int]:
    """Order node indices as onnxruntime's DEFAULT mode does (``Graph::ReverseDFSFrom`` from the
    leaves); the node index is the position in ``nodes``.

    Raises:
        OffloadError: the graph has a cycle or reads a tensor nobody provides.
    """
    if reads is None:
        reads = [node_reads(node) for node in nodes]
    all_preds, topological = predecessors(nodes, available, reads, outputs)
    if not topological:
        execution_order(nodes, available, reads, [PLAIN_RANK] * len(nodes), outputs)  # a cycle is an error
    read = [False] * len(nodes)
    for preds in all_preds:
        for p in preds:
            read[p] = True
    stack: list[tuple[int, bool]] = [(i, False) for i in range(len(nodes)) if not read[i]]
    visited = [False] * len(nodes)
    order: list[int] = []
    pop, push = stack.pop, stack.append
    while stack:
        i, leave = pop()
        if leave:
            order.append(i)
            continue
        if visited[i]:
            continue
        visited[i] = True
        push((i, True))
        for p in sorted(all_preds[i]):
            if not visited[p]:
                push((p, False))
    return order


def executor_order(
    order: list[int], preds: list[set[int]], host: list[bool], *, first: bool | None = None
) -> list[int]:
    """The order onnxruntime's single-threaded executor runs ``order`` (a topological order of node
    indices, `execution_order` or `default_order`) in when the nodes ``host`` marks run on the CPU
    provider and the others on a device provider.

    onnxruntime splits the order into one logic stream per device, numbered by the device of their
    first node in ``order`` (``DeviceBasedPartitioner``), each stream keeping ``order``'s order. In a
    stream, a node that reads from a node of the other stream waits at a barrier for it, and a node
    read by the other stream triggers that stream's barriers after it runs (``allocation_planner.cc``).
    A barrier passes on its second arrival, the stream's or the trigger's. The streams run one after
    the other, each until a barrier stops it, and a trigger resumes the stream it releases at once,
    before its own stream goes on (``RunSince``, ``ScheduleDownstream`` and ``BarrierStep`` with no
    inter-op thread pool). Each stream's own order is ``order``'s; only how the two interleave changes.
    ``first``, the ``host`` value of the stream a partition file lists first (the copy stream of
    `offloadctl.rewriting.streams`), makes that stream the one that runs first; by default it is the
    stream of the first node in ``order``.
    """
    if not order or all(h == host[order[0]] for h in host):
        return list(order)
    steps, downstream, barriers = _stream_steps(order, preds, host, host[order[0]] if first is None else first)
    count = [2] * barriers
    ran: list[int] = []
    frames = [(1, 0), (0, 0)]  # (stream, step) still to run; the last one runs first
    while frames:
        s, k = frames.pop()
        mine = steps[s]
        while k < len(mine):
            kind, value = mine[k]
            k += 1
            if kind == "node":
                ran.append(value)
            elif kind == "barrier":
                count[value] -= 1
                if count[value]:
                    break  # the other stream's node has not run: this stream stops here
            else:  # a trigger runs each released stream at once, then this one goes on
                frames.append((s, k))
                frames.extend(reversed(downstream.get(value, [])))
                break
    return ran


def _stream_steps(
    order: list[int], preds: list[set[int]], host: list[bool], side: bool
) -> tuple[list[list[tuple[str, int]]], dict[int, list[tuple[int, int]]], int]:
    """(each stream's steps: ("barrier", id), ("node", i), ("trigger", point); for each trigger point the
    (stream, step) of the barriers it releases; the number of barriers), as onnxruntime plans them;
    stream 0 holds the nodes whose ``host`` is ``side``."""
    stream = [0 if h == side else 1 for h in host]
    members: list[list[int]] = [[], []]
    for i in order:
        members[stream[i]].append(i)
    triggered: dict[int, int] = {}  # node -> its trigger point: a node of the other stream reads it
    for s in (0, 1):
        for i in members[s]:
            for p in preds[i]:
                if stream[p] != s:
                    triggered.setdefault(p, len(triggered))
    steps: list[list[tuple[str, int]]] = [[], []]
    downstream: dict[int, list[tuple[int, int]]] = {}
    barriers = 0
    for s in (0, 1):
        mine = steps[s]
        for i in members[s]:
            for p in sorted(preds[i]):
                if stream[p] != s:
                    downstream.setdefault(triggered[p], []).append((s, len(mine)))
                    mine.append(("barrier", barriers))
                    barriers += 1
            mine.append(("node", i))
            if i in triggered:
                mine.append(("trigger", triggered[i]))
    return steps, downstream, barriers


def _producers(nodes: list[onnx.NodeProto], outputs: list[list[str]] | None = None) -> dict[str, int]:
    """Each tensor a node makes -> that node's index (``outputs``: each node's outputs, when the
    caller has read them already)."""
    producer: dict[str, int] = {}
    for i, outs in enumerate(outputs if outputs is not None else (node.output for node in nodes)):
        for out in outs:
            producer[out] = i
    producer.pop("", None)
    return producer


def _unprovided(node: onnx.NodeProto, index: int, name: str) -> OffloadError:
    """The error for a node that reads a tensor nobody provides."""
    return OffloadError(
        f"node {describe_node(node, index)} reads tensor {name!r}, which no node, graph input or weight provides",
        hint="the model is malformed; re-export it or fix the tensor name",
    )


def _file_order_runs(
    nodes: list[onnx.NodeProto],
    available: set[str],
    reads: list[list[str]],
    outputs: list[list[str]] | None = None,
) -> bool:
    """Whether every node reads only what is available or what an earlier node makes: the check of
    `predecessors` without building each node's predecessors (a big graph has a hundred thousand).

    Raises:
        OffloadError: a node reads a tensor nobody provides.
    """
    at = _producers(nodes, outputs).get
    topological = True
    for i, names in enumerate(reads):
        for name in names:
            k = at(name)
            if k is None:
                if name not in available:
                    raise _unprovided(nodes[i], i, name)
            elif k >= i:
                topological = False
    return topological


def predecessors(
    nodes: list[onnx.NodeProto],
    available: set[str],
    reads: list[list[str]],
    outputs: list[list[str]] | None = None,
) -> tuple[list[set[int]], bool]:
    """(the nodes each node reads from, whether the file order is topological).

    Raises:
        OffloadError: a node reads a tensor nobody provides.
    """
    producer = _producers(nodes, outputs)
    producer_of = producer.get
    all_preds: list[set[int]] = []
    topological = True
    for i, names in enumerate(reads):
        preds = {producer_of(name, -1) for name in names}
        if -1 in preds:
            preds.discard(-1)
            missing = next((n for n in names if n not in producer and n not in available), None)
            if missing is not None:
                raise _unprovided(nodes[i], i, missing)
        if preds and max(preds) >= i:
            topological = False
        all_preds.append(preds)
    return all_preds, topological


def _kahn(nodes: list[onnx.NodeProto], all_preds: list[set[int]], rank: list[int]) -> list[int]:
    """Kahn's algorithm, the ready node of the lowest (rank, index) first."""
    consumers: list[list[int]] = [[] for _ in nodes]
    indegree = [0] * len(nodes)
    for i, preds in enumerate(all_preds):
        for p in preds:
            consumers[p].append(i)
        indegree[i] = len(preds)
    heap = [(rank[i], i) for i in range(len(nodes)) if indegree[i] == 0]
    heapq.heapify(heap)
    order: list[int] = []
    pop, push = heapq.heappop, heapq.heappush
    while heap:
        i = pop(heap)[1]
        order.append(i)
        for c in consumers[i]:
            indegree[c] -= 1
            if indegree[c] == 0:
                push(heap, (rank[c], c))
    if len(order) != len(nodes):
        raise _cycle_error(nodes, consumers, indegree)
    return order


def _cycle_error(nodes: list[onnx.NodeProto], consumers: list[list[int]], indegree: list[int]) -> OffloadError:
    import networkx as nx

    stuck = [i for i in range(len(nodes)) if indegree[i] > 0]
    graph = nx.DiGraph((p, c) for p in stuck for c in consumers[p] if indegree[c] > 0)
    try:
        cycle = [u for u, _ in nx.find_cycle(graph)]
    except nx.NetworkXNoCycle:  # pragma: no cover - Kahn stalls only on cycles
        cycle = stuck[:5]
    chain = " -> ".join(describe_node(nodes[i], i) for i in cycle[:6])
    return OffloadError(f"the graph has a cycle: {chain}", hint="the model is malformed; re-export it")


def node_reads(node: onnx.NodeProto) -> list[str]:
    """Every tensor a node reads: its inputs, then (sorted) what its subgraphs read from outside."""
    reads = [name for name in node.input if name]
    if node.attribute:  # only a node with attributes can have subgraphs
        reads.extend(sorted(subgraph_outer_names(node)))
    return reads


def describe_node(node: onnx.NodeProto, index: int) -> str:
    return f"{node.name!r} ({node.op_type})" if node.name else f"#{index} ({node.op_type})"


def expected_run_order(proto: onnx.ModelProto, order: str = "priority") -> list[str]:
    """Names of the nodes onnxruntime runs with PRIORITY_BASED (``order="default"``: its DEFAULT
    order), in the order it runs them.

    The model is not changed. Constant nodes (folded into initializers) and nodes onnxruntime
    replaces (function calls, removed Casts) are left out; the bodies onnxruntime inlines are
    simulated but left out too (their names are onnxruntime's own). Nodes without a name, or
    whose name is not unique, cannot be matched with profiling and are left out.
    """
    work = onnx.ModelProto()
    work.CopyFrom(proto)
    calls = inlined_calls(work)
    call_outputs = {tuple(n.output) for n in calls}
    kept_outputs = {tuple(n.output) for n in work.graph.node} - call_outputs
    body_names: set[str] = set()
    if expand_inlined_functions(work, calls):
        # onnxruntime appends the inlined bodies after every other node
        body = [n for n in work.graph.node if tuple(n.output) not in kept_outputs]
        rest = [n for n in work.graph.node if tuple(n.output) in kept_outputs]
        body_names = {n.name for n in body}
        ordered = [onnx.NodeProto() for _ in rest + body]
        for dst, src in zip(ordered, rest + body):
            dst.CopyFrom(src)
        del work.graph.node[:]
        work.graph.node.extend(ordered)
    unique_dequantize(work.graph, place="end")
    remove_duplicate_casts(work)
    graph = work.graph
    nodes = [n for n in graph.node if not is_constant_node(n)]
    available = {v.name for v in graph.input} | {t.name for t in graph.initializer}
    available |= {s.values.name for s in graph.sparse_initializer}
    available |= {o for n in graph.node if is_constant_node(n) for o in n.output}
    if order == "default":
        ran = default_order(nodes, available)
    else:
        ran, _ = execution_order(nodes, available)
    names = [nodes[i].name for i in ran if nodes[i].name and nodes[i].name not in body_names]
    counts: dict[str, int] = {}
    for name in names:
        counts[name] = counts.get(name, 0) + 1
    return [n for n in names if counts[n] == 1]
