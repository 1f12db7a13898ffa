"""What onnxruntime's CPU arena holds for one run when a partition file gives the session several
logic streams on one device: the multi-stream allocation planner, replayed (`cpu_peak_on_streams`).

With two streams on one device onnxruntime plans memory in two passes (``allocation_planner.cc``,
``ComputeReusePlan``):

* **No reuse at first.** Every node output gets a buffer of its own (a graph output too, held to
  the end), as for parallel execution.
* **Then reuse that is safe across streams** (``OptimizeReusePlanForMultiStream``). The nodes'
  dependences are the graph's edges and, within a stream, each node on the one listed before it.
  The planner walks them from the last nodes back to the first (Kahn's algorithm on the reversed
  dependences). At each node:

  - an output that must alias an input (Reshape, Identity, ...) shares it; one that may overwrite
    an input (Relu, Cast, ...) does when that input has one reader and the same declared size;
  - then each output ``o`` that is still its own and shares no buffer yet offers it to one value
    ``w`` waiting for a buffer (values of the nodes walked before, in the order their ``NodeArg``
    was made: the file's order here): ``w`` must have ``o``'s element size and declared shape,
    not be an output of a node that reads ``o``, and ``o``'s node and every reader of ``o``'s
    buffer must come before ``w``'s node by those dependences. ``w`` then shares ``o``'s buffer
    and its node and readers become readers of it. An ``o`` that gives its buffer away is done;
    one that does not waits in turn.

  A buffer is freed once every node that reads a value sharing it has run (in the order the
  executor runs the two streams, `offloadctl.analysis.order.executor_order`); the memory pattern
  is off. Everything else (weights, the arena, kernel scratch) is `offloadctl.simulation.ortcpu`'s.

The order in which the walk queues a node's upstream nodes comes from a hash set in onnxruntime,
seeded per process, so onnxruntime's own figure can differ between two processes (the transformer
sample's streams rewrite: 1,630,532 B in 7 runs of 8, 1,646,148 B in the eighth). This replays the
upstream nodes latest in the file first, which gave the figure seen most; the waiting values go in
the file's order, as their ``NodeArg`` objects were made (``bench/bench_streams_memory.py`` compares
the figure with onnxruntime's allocator statistics).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence

import onnx

from offloadctl.analysis.graph import Analysis, analyse
from offloadctl.analysis.order import executor_order
from offloadctl.core.onnxutil import ONNX_DOMAINS, subgraph_outer_names
from offloadctl.simulation.arena import ArenaConfig
from offloadctl.simulation.ortcpu import (
    _INPLACE_TYPES,
    ALIAS_OPS,
    INPLACE_OPS,
    CpuPeak,
    Shape,
    _itemsize,
    _same_shape,
    declared_shapes,
    replay,
)

__all__ = ["StreamsPlanner", "cpu_peak_on_streams", "executor_analysis", "ran_on_streams"]


def ran_on_streams(analysis: Analysis, first_stream: Sequence[str]) -> list[int]:
    """The positions of ``analysis`` in the order onnxruntime's executor runs them when the nodes
    named in ``first_stream`` form the stream a partition file lists first and the rest the other
    (`offloadctl.analysis.order.executor_order`)."""
    on_first = set(first_stream)
    made = {out: pos for pos, node in enumerate(analysis.nodes) for out in node.output if out}
    preds = [{made[i] for i in _reads(node) if i in made} for node in analysis.nodes]
    first = [name in on_first for name in analysis.node_names]
    return executor_order(list(range(len(analysis.nodes))), preds, first, first=True)


def executor_analysis(analysis: Analysis, streams: Sequence[Sequence[str]]) -> Analysis:
    """``analysis``'s model with its positions in the order onnxruntime's executor runs the logic streams
    of the partition ``streams`` (`ran_on_streams`; the first stream runs first), its sizes as
    ``analysis`` has them: the order the device's memory follows. The copy stream runs ahead of compute
    until a gate stops it, so a copy no gate holds is issued early and its buffer lives from then."""
    ran = ran_on_streams(analysis, streams[0])
    if ran == list(range(analysis.num_positions)):
        return analysis
    host = [analysis.file_index[p] for p in analysis.host] or None  # the nodes a device runs on the host stay there
    ordered = analyse(analysis.loaded, order=analysis.order, sequence=[analysis.file_index[p] for p in ran], host=host)
    if analysis.infos.measured is not None:
        ordered.infos.use_measured(analysis.infos.measured)
    return ordered


def _reads(node: onnx.NodeProto) -> list[str]:
    """What a node reads: its inputs and the outer values its subgraphs read."""
    return [*(i for i in node.input if i), *(sorted(subgraph_outer_names(node)) if node.attribute else [])]


#: what onnxruntime plans as ``kAllocate`` before reuse: a buffer of the value's own (a sequence or an
#: optional too, whose size is not known here)
_OWN = ("allocate", "nontensor")


class StreamsPlanner:
    """onnxruntime's reuse plan for several logic streams on one device (see the module)."""

    def __init__(
        self,
        analysis: Analysis,
        shapes: Mapping[str, tuple[int, Shape | None]],
        streams: Sequence[Sequence[str]],
    ) -> None:
        self.analysis = analysis
        self.shapes = shapes
        nodes = analysis.nodes
        self.reads = [_reads(node) for node in nodes]
        self.consumed = {name for reads in self.reads for name in reads}
        self.kind: dict[str, str] = {}
        self.buffer: dict[str, str] = {}
        self.producer: dict[str, int] = {out: pos for pos, node in enumerate(nodes) for out in node.output if out}
        self.upstream = self._dependences(streams)

    def _dependences(self, streams: Sequence[Sequence[str]]) -> list[set[int]]:
        """Each node's upstream nodes as onnxruntime's planner takes them: the producers of what it reads,
        and the node listed before it in its stream (each stream in the session's order; a node the
        partition leaves out, which a check refuses before, on the last stream)."""
        stream_of = {name: s for s, names in enumerate(streams) for name in names}
        members: list[list[int]] = [[] for _ in streams]
        for pos, name in enumerate(self.analysis.node_names):
            members[stream_of.get(name, len(streams) - 1)].append(pos)
        upstream = [{self.producer[i] for i in reads if i in self.producer} for reads in self.reads]
        for stream in members:
            for before, pos in zip(stream, stream[1:]):
                upstream[pos].add(before)
        return upstream

    def root(self, name: str) -> str:
        return self.buffer.get(name, name)

    def _same_size(self, a: str, b: str) -> bool:
        sa, sb = self.shapes.get(a), self.shapes.get(b)
        if sa is None or sb is None or onnx.TensorProto.STRING in (sa[0], sb[0]):
            return False
        return _itemsize(sa[0]) == _itemsize(sb[0]) and _same_shape(sa[1], sb[1])

    def plan(self) -> None:
        """The two passes: every output its own buffer, then the reuse that is safe across streams."""
        a = self.analysis
        outputs = set(a.graph_outputs)
        for node in a.nodes:
            for out in node.output:
                if out:
                    info = a.infos.get(out)
                    nontensor = info is not None and info.type_kind is not None
                    self.kind[out] = "output" if out in outputs else "nontensor" if nontensor else "allocate"
        self.readers: dict[str, set[int]] = {}
        for pos, reads in enumerate(self.reads):
            for name in reads:
                if self.kind.get(name) in _OWN:
                    self.readers.setdefault(name, set()).add(pos)
        self._ancestors = self._all_ancestors()
        self._made_from: dict[str, set[str]] = {}  # a value -> outputs of the nodes that read it
        # (itemsize, declared shape) -> the values waiting for a buffer, in the order their NodeArgs were made
        self._waiting: dict[tuple[int, Shape], list[tuple[tuple[int, int], str]]] = {}
        self._taken: set[str] = set()
        for pos in self._walk():
            self._reuse_input(pos)
            self._offer_outputs(pos)

    def _all_ancestors(self) -> list[int]:
        """Each node's upstream nodes by the dependences, itself included, as a bit set."""
        ancestors = [0] * len(self.upstream)
        done = [False] * len(self.upstream)
        for start in range(len(self.upstream)):
            stack = [start]
            while stack:
                pos = stack[-1]
                if done[pos]:
                    stack.pop()
                    continue
                todo = [u for u in self.upstream[pos] if not done[u]]
                if todo:
                    stack.extend(todo)
                    continue
                bits = 1 << pos
                for u in self.upstream[pos]:
                    bits |= ancestors[u]
                ancestors[pos] = bits
                done[pos] = True
                stack.pop()
        return ancestors

    def _walk(self) -> list[int]:
        """The planner's walk: from the nodes nothing depends on back to the first ones."""
        downstream = [0] * len(self.upstream)
        for ups in self.upstream:
            for u in ups:
                downstream[u] += 1
        file_index = self.analysis.file_index
        queue = deque(sorted((p for p in range(len(downstream)) if downstream[p] == 0), key=file_index.__getitem__))
        walked = []
        while queue:
            pos = queue.popleft()
            walked.append(pos)
            for u in sorted(self.upstream[pos], key=file_index.__getitem__, reverse=True):
                downstream[u] -= 1
                if downstream[u] == 0:
                    queue.append(u)
        return walked

    def _share(self, owner: str, value: str) -> None:
        """``value`` takes ``owner``'s buffer; the readers of ``value`` read it too."""
        self.kind[value] = "reuse"
        self.buffer[value] = owner
        self.readers.setdefault(owner, set()).update(self.readers.get(value, ()))
        self._taken.add(owner)

    def _reuse_input(self, pos: int) -> None:
        node = self.analysis.nodes[pos]
        key = (node.domain if node.domain not in ONNX_DOMAINS else "", node.op_type)
        for k, out in enumerate(node.output):
            if not out or self.kind.get(out) not in _OWN:
                continue
            for name in filter(None, node.input):
                self._made_from.setdefault(name, set()).add(out)
            alias = [node.input[i] for i, o in ALIAS_OPS.get(key, ()) if o == k and i < len(node.input)]
            if alias and alias[0]:
                self._share(alias[0], out)
                continue
            for i, o in INPLACE_OPS.get(key, ()):
                if o == k and i < len(node.input) and self._overwritable(node, node.input[i], out):
                    self._share(node.input[i], out)

    def _overwritable(self, node: onnx.NodeProto, name: str, out: str) -> bool:
        """Whether ``out`` may overwrite input ``name`` in place (``MayInplace``): a buffer of its own
        with one reader, of a type the kernel overwrites, and the same declared size."""
        if not name:
            return False
        types = _INPLACE_TYPES.get(node.op_type)
        if types is not None and self.shapes.get(name, (0, None))[0] not in types:
            return False
        return self.kind.get(name) in _OWN and len(self.readers.get(name, ())) == 1 and self._same_size(name, out)

    def _offer_outputs(self, pos: int) -> None:
        node = self.analysis.nodes[pos]
        for out in node.output:
            if not out or out in self._taken or self.kind.get(out) != "allocate":
                continue
            declared = self.shapes.get(out)
            if declared is None or declared[1] is None:
                continue
            bucket = self._waiting.setdefault((_itemsize(declared[0]), declared[1]), [])
            readers = self.readers.get(out, set())
            for k, (_, value) in enumerate(bucket):
                if value in self._made_from.get(out, ()) or not self._same_size(value, out):
                    continue
                before = self._ancestors[self.producer[value]]
                if before >> pos & 1 and all(before >> r & 1 for r in readers):
                    del bucket[k]
                    self._share(out, value)
                    self.readers[out].add(self.producer[value])
                    break
            else:
                bucket.append((self._made_order(out), out))
                bucket.sort()

    def _made_order(self, value: str) -> tuple[int, int]:
        node = self.analysis.file_index[self.producer[value]]
        return node, list(self.analysis.nodes[self.producer[value]].output).index(value)

    def resolve(self) -> None:
        """Point every shared value at the buffer's owner (a chain of shares ends at one)."""
        for value in list(self.buffer):
            owner = self.buffer[value]
            while owner in self.buffer and self.buffer[owner] != owner:
                owner = self.buffer[owner]
            self.buffer[value] = owner


def cpu_peak_on_streams(
    analysis: Analysis,
    streams: Sequence[Sequence[str]],
    *,
    shapes: Mapping[str, tuple[int, Shape | None]] | None = None,
    config: ArenaConfig | None = None,
) -> CpuPeak:
    """Replay one run of a fresh CPU session over ``analysis`` with the partition ``streams`` (each a
    list of node names, the first the stream that runs first), as `offloadctl.simulation.ortcpu.cpu_peak`
    does for one stream."""
    if shapes is None:
        shapes = declared_shapes(analysis.loaded.proto)
    planner = StreamsPlanner(analysis, shapes, streams)
    planner.plan()
    planner.resolve()
    return replay(analysis, planner, ran_on_streams(analysis, streams[0]), config)
