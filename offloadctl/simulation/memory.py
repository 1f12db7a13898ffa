"""Memory: the device and host bytes alive at every step of a program, and the lower bound.

Memory rules (onnxruntime's, stated once in `offloadctl.analysis.timeline`; this module applies them to
steps that include copies):

- A tensor is allocated on the device when the step producing it runs and freed after its last
  reader; a graph output lives to the end; a graph input lives from the first step to its last
  reader (or the end if it is also an output); an output nobody reads is freed after its producer.
- Weights (initializers, Constant nodes) are resident for the whole run unless offloaded; a weight
  that no node reads and that is not a graph output takes no memory (onnxruntime drops it).
- Memory inside subgraphs: body weights are resident for the whole run; a node with bodies also
  holds their working set while it runs (an If its larger branch, a Loop/Scan one iteration).
- An offloaded activation T: its device buffer is freed only after its last device reader, its
  D2H (an extra reader) and the plan's release point (``release_after``) have all passed. Its host
  copy lives from the D2H to the last H2D reading it (the end, for a graph output). Each reload
  group's copy lives on the device from its H2D to the group's last use; the copy feeding an
  offloaded graph output lives from its H2D to the end.
- An offloaded weight lives on the host for the whole run; each reload group's device copy lives
  from its H2D to the group's last use.
- A rewritten model follows the same rules with the release point at the D2H (what onnxruntime
  does, and what a plan with release distance 0 asks for).

Accounting convention: the *working set* of step k is every tensor alive while step k runs: all
tensors allocated at a step <= k and freed at a step >= k, plus resident weights. A step's outputs
are allocated before its inputs are freed, so both count at step k. "Live in" of step k excludes
what step k allocates; "live out" excludes what step k frees. The peak is the largest working set;
ties go to the earliest step. Host memory is accounted the same way.

Kernel scratch (what a kernel allocates while it runs and frees before it returns) is part of the
node's working set when a measured profile records it (`offloadctl.simulation.timing.scratched`).
Not modelled here: onnxruntime's buffer reuse inside an op (in-place kernels, Reshape/Squeeze
aliases) and the arena's rounding and fragmentation; `offloadctl.simulation.ortcpu` models them for
the CPU arena's own figure. An outer tensor a subgraph reads
counts as read by the parent node. Tensors whose size is unknown count as
0 bytes in every figure; `SimResult.unknown_tensors` lists them so the figures are never silently
low.

Lower bound (`offloadctl.analysis.timeline.step_bound`): the largest working set of a single node on its own
(its inputs, including the weights it reads, its outputs, the memory inside its subgraphs, the graph
inputs still to be read and the subgraph weights). The end of the run counts as one more such step
whose inputs are the graph outputs, which must all be on the device when the run returns. No plan
can go below it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property, partial
from typing import TypedDict

import numpy as np

from offloadctl.analysis import timeline
from offloadctl.analysis.graph import Analysis
from offloadctl.analysis.timeline import buffer_spans, step_bound, sweep
from offloadctl.core.plantypes import Plan
from offloadctl.simulation.base import Base, base_of, step_ids
from offloadctl.simulation.program import DEVICE, HOST, Program, before_program, program_for

__all__ = ["MemoryTrace", "base_lower_bound", "before_trace", "lower_bound", "peak_memory", "resident_profile", "trace"]


@dataclass(frozen=True)
class _Spans:
    """Where each tensor that is not resident the whole run lives: one entry per tensor, as arrays."""

    place: np.ndarray  # DEVICE or HOST
    size: np.ndarray  # bytes
    alloc: np.ndarray  # its first step
    free: np.ndarray  # its last step
    from_start: np.ndarray  # on the device before the first step (a graph input)
    to_end: np.ndarray  # kept to the last step (a graph output)


def _last_step(count: int, per_step: list[list[int]]) -> np.ndarray:
    """For each of ``count`` tensor ids, the last step whose list holds it (-1: none)."""
    found = np.full(count, -1, dtype=np.int64)
    steps, ids = step_ids(per_step)
    np.maximum.at(found, ids, steps)
    return found


def _intervals(program: Program) -> tuple[list[int], _Spans]:
    """Resident bytes per place, and the spans of the other tensors (`_Spans`): a buffer from the step
    that writes it (step 0 for a graph input) to its last read, or to the step the program holds it
    through, or to the last step for a graph output (`offloadctl.analysis.timeline.buffer_span`)."""
    steps = len(program.kinds)
    count = len(program.names)
    sizes = np.asarray(program.sizes, dtype=np.int64)
    place = np.asarray(program.place, dtype=np.int64)
    resident_mask = np.asarray(program.resident, dtype=bool)
    resident = [
        program.always + int(sizes[resident_mask & (place == DEVICE)].sum()),
        int(sizes[resident_mask & (place == HOST)].sum()),
    ]
    from_start = np.asarray(program.from_start, dtype=bool)
    to_end = np.asarray(program.to_end, dtype=bool)
    held = None
    if program.hold:
        held = np.full(count, -1, dtype=np.int64)
        held[list(program.hold)] = list(program.hold.values())
    first = np.where(from_start, 0, _last_step(count, program.writes))
    alloc, free = buffer_spans(first, _last_step(count, program.reads), steps - 1, to_end=to_end, hold=held)
    keep = ~resident_mask & (alloc >= 0) & (steps > 0)
    return resident, _Spans(place[keep], sizes[keep], alloc[keep], free[keep], from_start[keep], to_end[keep])


def _alive(program: Program, resident: list[int], spans: _Spans, where: int) -> np.ndarray:
    """Bytes alive during each step at ``where`` (DEVICE or HOST), from `_intervals`."""
    mine = spans.place == where
    alive = sweep(len(program.kinds), spans.alloc[mine], spans.free[mine], spans.size[mine])
    alive += resident[where]
    if where == DEVICE and program.inner:
        alive += program.inner
    return alive


def _working_sets(program: Program, where: int = DEVICE) -> list[int]:
    """Bytes alive during each step at ``where`` (DEVICE or HOST)."""
    resident, spans = _intervals(program)
    return _alive(program, resident, spans, where).tolist()


def _argmax(values: Sequence[int]) -> int | None:
    """The first step of the largest value (None: no steps)."""
    if not values:
        return None
    return values.index(max(values))


class StepAt(TypedDict):
    """Where a step is: its index, kind, position and a readable label (None for no step)."""

    step: int | None
    kind: str | None
    position: int | None
    node: str | None


@dataclass(frozen=True)
class MemoryTrace:
    """Device and host bytes at every step of one program (see the module docstring)."""

    kinds: list[str]
    positions: list[int]
    label_of: Callable[[int], str] = field(repr=False, compare=False)  # a step's readable name
    device: list[int]  # working set during each step
    device_in: list[int]  # alive when the step starts
    device_out: list[int]  # alive when the step ends
    host: list[int]  # host working set during each step
    resident_device: int  # weights resident on the device
    resident_host: int  # weights resident on the host

    @cached_property
    def labels(self) -> list[str]:
        """Every step's readable name (named when first asked: most runs read one or two)."""
        return [self.label_of(s) for s in range(len(self.kinds))]

    @cached_property
    def peak_step(self) -> int | None:
        return _argmax(self.device)

    @property
    def peak_bytes(self) -> int:
        s = self.peak_step
        return self.device[s] if s is not None else self.resident_device

    @property
    def host_peak_bytes(self) -> int:
        return max(self.host, default=self.resident_host)

    def at(self, step: int | None) -> StepAt:
        """Where a step is: step index, kind, position and a readable label."""
        if step is None:
            return {"step": None, "kind": None, "position": None, "node": None}
        return {"step": step, "kind": self.kinds[step], "position": self.positions[step], "node": self.label_of(step)}


def trace(program: Program, base: Base) -> MemoryTrace:
    """The memory of every step of ``program`` (device, host, live in and out)."""
    resident, spans = _intervals(program)
    steps = len(program.kinds)
    on_device = spans.place == DEVICE
    made = on_device & ~spans.from_start  # allocated by its step: not alive when that step starts
    freed = on_device & ~spans.to_end  # freed after its last step: not alive when that step ends
    alloc_at = np.zeros(steps, dtype=np.int64)
    free_at = np.zeros(steps, dtype=np.int64)
    np.add.at(alloc_at, spans.alloc[made], spans.size[made])
    np.add.at(free_at, spans.free[freed], spans.size[freed])
    device = _alive(program, resident, spans, DEVICE)
    return MemoryTrace(
        kinds=list(program.kinds),
        positions=list(program.positions),
        label_of=partial(program.label, base),
        device=device.tolist(),
        device_in=(device - alloc_at).tolist(),
        device_out=(device - free_at).tolist(),
        host=_alive(program, resident, spans, HOST).tolist(),
        resident_device=resident[DEVICE],
        resident_host=resident[HOST],
    )


def base_lower_bound(base: Base) -> tuple[int, int | None]:
    """`offloadctl.analysis.timeline.step_bound` of the base's original nodes: (bytes, position),
    computed once per base."""
    found = base.derived.get("lower bound")
    if found is None:
        found = base.derived["lower bound"] = _base_lower_bound(base)
    return found


def _base_lower_bound(base: Base) -> tuple[int, int | None]:
    positions: list[int] = []
    tensors: list[int] = []
    for p in range(base.n):
        touched = base.reads[p] + base.writes[p]
        positions += [p] * len(touched)
        tensors += touched
    is_input = [i and not w for i, w in zip(base.graph_input, base.weight)]
    inner = {p: b for p, b in enumerate(base.inner) if b}
    return step_bound(base.n, positions, tensors, base.sizes, is_input, base.graph_output, inner, base.subgraph_weights)


def lower_bound(analysis: Analysis) -> tuple[int, int | None]:
    """The largest single-step working set: (bytes, position), position num_positions = the end.

    A node's working set is the distinct tensors it reads (inputs, weights, outer-scope reads of
    its subgraphs) and writes, plus the graph inputs still to be read after it (they are never
    offloaded); the end of the run reads every graph output. No plan can bring the peak below it.
    None as position for a model without nodes or outputs.
    """
    return base_lower_bound(base_of(analysis))


def before_trace(base: Base) -> MemoryTrace:
    """The trace of the model as it is (every tensor on the device), made once per base."""
    found = base.derived.get("before trace")
    if not isinstance(found, MemoryTrace):
        found = base.derived["before trace"] = trace(before_program(base), base)
    return found


def resident_profile(analysis: Analysis) -> np.ndarray:
    """Device bytes at each step 0..n (step n: the end of the run) with nothing offloaded, as a new
    array: from the trace of the model as it is (each step's working set, then what is alive when
    the last step ends), made once per base, which a simulation of a plan then reuses; equal to
    `offloadctl.analysis.timeline.profile`, which gives it for a rewritten or placed model."""
    base = base_of(analysis)
    if base.rewritten or analysis.host or not base.n:
        return timeline.profile(analysis, None, prefetch_distance=0)
    before = before_trace(base)
    return np.array([*before.device, before.device_out[-1]], dtype=np.int64)


def peak_memory(analysis: Analysis, plan: Plan | None = None) -> tuple[int, int | None]:
    """Peak device bytes of the model with ``plan`` (None: without one), and where it occurs.

    Cheap enough to call in a loop: O(nodes + uses + copies) per call; the per-model part is
    computed once per `Analysis` object.

    Returns:
        (peak bytes, position): the position of the node at the peak, or for a copy step the
        position it is anchored to (D2H: the node it follows; H2D: the node it precedes, or
        num_positions at the end); None for a model without nodes.
    """
    _, program = program_for(analysis, plan, "plan")
    device = _working_sets(program)
    s = _argmax(device)
    if s is None:
        return _intervals(program)[0][DEVICE], None
    return device[s], program.positions[s]
