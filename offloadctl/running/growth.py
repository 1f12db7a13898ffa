"""Whether a rewrite's measured memory is what its copies explain (`MemoryGrowth`, what ``offloadctl run
--measure-memory --compare-to ORIGINAL`` checks).

On the CPU provider device and host are one memory: the arena of a rewrite holds its host copies as
well as what stays on the device, so it may stand above the original's by up to the bytes its copies
write. The arena also rounds buffers up, as the replica counts it (`arena_rounding`): with onnxruntime's
default ``kNextPowerOfTwo`` regions a large copy can take a region twice its size (ddddocr's 32 MiB
weight copy took one of 64 MiB), which ``arena_extend_strategy=kSameAsRequested`` avoids. More than
both is memory the plan never counted: the order that ran keeps more alive than the original's (pins
that moved the DEFAULT walk, a ``Shape`` of a pin run late), and the rewrite does not keep its
promise. `memory_growth` compares the two figures and names the original nodes whose place in the
order that ran differs from the original's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

import numpy as np
import onnx

from offloadctl.analysis.graph import Analysis, analyse
from offloadctl.analysis.order import expected_run_order
from offloadctl.core.onnxutil import copy_kind
from offloadctl.loading.model import LoadedModel, load_model
from offloadctl.rewriting.streams import PARTITION_KEY
from offloadctl.running.allocator import AllocatorFigure, measure_memory
from offloadctl.running.inputs import session_feeds
from offloadctl.running.sessions import SessionConfig, _has_memcpy_nodes

__all__ = [
    "SLACK",
    "MemoryGrowth",
    "arena_rounding",
    "copy_bytes",
    "measured_growth",
    "memory_growth",
    "moved_nodes",
]

#: the share of the original's peak the arena may stand above what the copies explain (its 256-byte
#: rounding and the order of frees make a few kilobytes either way)
SLACK = 0.01


class GrowthDoc(TypedDict):
    """The measured growth in a ``--json`` document (`MemoryGrowth.to_json`)."""

    original_bytes: int
    rewrite_bytes: int
    copy_bytes: int | None
    rounding_bytes: int
    excess_bytes: int | None
    explained: bool | None
    moved_nodes: int
    first_moved: list[str]


@dataclass(frozen=True)
class MemoryGrowth:
    """The original's and the rewrite's measured peaks, and what the rewrite's copies account for."""

    original_bytes: int
    rewrite_bytes: int
    copy_bytes: int | None  # the buffers the rewrite's copies write (None: a size is unknown)
    moved: list[str] = field(default_factory=list)  # original nodes that ran elsewhere among the original nodes
    # what the arena's rounding adds to the rewrite beyond the original's, as the replica counts it (`arena_rounding`)
    rounding_bytes: int = 0

    @property
    def excess_bytes(self) -> int | None:
        """Bytes above the original's peak that neither the copies nor the arena's rounding account for (None:
        unknown)."""
        if self.copy_bytes is None:
            return None
        return self.rewrite_bytes - self.original_bytes - self.copy_bytes - self.rounding_bytes

    @property
    def explained(self) -> bool | None:
        """Whether the copies account for the growth (None: a copy's size is unknown)."""
        excess = self.excess_bytes
        return None if excess is None else excess <= SLACK * self.original_bytes

    def to_json(self) -> GrowthDoc:
        return {
            "original_bytes": self.original_bytes,
            "rewrite_bytes": self.rewrite_bytes,
            "copy_bytes": self.copy_bytes,
            "rounding_bytes": self.rounding_bytes,
            "excess_bytes": self.excess_bytes,
            "explained": self.explained,
            "moved_nodes": len(self.moved),
            "first_moved": self.moved[:10],
        }


def copy_bytes(analysis: Analysis) -> int | None:
    """The bytes the copies of a rewritten model write, at the sizes ``analysis`` (the rewrite loaded with
    its dimensions pinned) gives them (None: one is unknown)."""
    total = 0
    for node in analysis.nodes:
        if copy_kind(node) is None:
            continue
        info = analysis.infos.get(node.output[0]) or analysis.infos.get(node.input[0])
        if info is None or info.bytes is None:
            return None
        total += info.bytes
    return total


def moved_nodes(original: Sequence[str], ran: Sequence[str]) -> list[str]:
    """The nodes of ``original`` (the original's order) that ran at another place among them in ``ran``
    (the rewrite's order, copies and pins included): names compared place by place."""
    names = set(original)
    kept = [name for name in ran if name in names]
    return [b for a, b in zip(original, kept) if a != b]


def arena_rounding(rewrite: Analysis, original: Analysis) -> int:
    """What onnxruntime's CPU arena adds to the rewrite's peak by rounding its buffers up beyond what it adds
    to the original's (`offloadctl.simulation.ortcpu.cpu_peak` with the default ``kNextPowerOfTwo`` regions
    against ``kSameAsRequested``); 0 when it adds nothing more."""
    from offloadctl.simulation.arena import ArenaConfig
    from offloadctl.simulation.ortcpu import cpu_peak

    exact = ArenaConfig(extend_strategy="kSameAsRequested")

    def rounding(analysis: Analysis) -> int:
        return cpu_peak(analysis).peak_bytes - cpu_peak(analysis, config=exact).peak_bytes

    return max(0, rounding(rewrite) - rounding(original))


def memory_growth(
    original_bytes: int,
    rewrite_bytes: int,
    analysis: Analysis,
    original: Sequence[str],
    ran: Sequence[str],
    *,
    rounding_bytes: int = 0,
) -> MemoryGrowth:
    """The `MemoryGrowth` of a rewrite (``analysis``) measured at ``rewrite_bytes`` against its original at
    ``original_bytes``; ``original`` and ``ran`` the orders the two ran their nodes in; ``rounding_bytes``
    what the arena's rounding adds (`arena_rounding`)."""
    return MemoryGrowth(
        original_bytes, rewrite_bytes, copy_bytes(analysis), moved_nodes(original, ran), rounding_bytes=rounding_bytes
    )


def measured_growth(
    loaded: LoadedModel,
    compare_to: str | None,
    config: SessionConfig,
    device: str,
    feeds_all: Mapping[str, np.ndarray],
    measured: list[AllocatorFigure] | None,
    ran: list[str],
    order: str,
    ort: Any,
) -> MemoryGrowth | None:
    """A rewrite's measured peak on ``device`` against its original's, ``compare_to``, measured in a
    session made the same way (`offloadctl.running.growth`); None without both, for a model without
    copies, or when no figure is of that device."""
    if not measured or compare_to is None or not _has_memcpy_nodes(loaded.proto):
        return None
    mine = next((f for f in measured if f.device == device), None)
    if mine is None:
        return None
    original = onnx.load(compare_to, load_external_data=False)
    spec = config.spec(compare_to, device)  # the same session, less the rewrite's partition file
    spec = dataclasses.replace(
        spec, config_entries={k: v for k, v in (spec.config_entries or {}).items() if k != PARTITION_KEY}
    )
    figures = measure_memory(spec, session_feeds(original, feeds_all), order=order, ort=ort)
    theirs = next((f for f in figures if f.device == device), None)
    if theirs is None:
        return None
    rewrite = analyse(loaded, order=order)
    grown = mine.peak_bytes - theirs.peak_bytes
    rounding = _rounding(rewrite, compare_to, original, feeds_all, order, grown) if device == "cpu" else 0
    if rounding <= SLACK * theirs.peak_bytes:  # the arena's own noise: nothing to name
        rounding = 0
    return memory_growth(
        theirs.peak_bytes, mine.peak_bytes, rewrite, expected_run_order(original, order), ran, rounding_bytes=rounding
    )


def _rounding(
    rewrite: Analysis,
    compare_to: str,
    original: onnx.ModelProto,
    feeds_all: Mapping[str, np.ndarray],
    order: str,
    grown: int,
) -> int:
    """Of a CPU arena that ``grown`` more than the rewrite's copies explain, what its rounding adds to the
    rewrite beyond the original (as the CPU replica counts it), no more than it has to explain; 0 when the
    copies explain it."""
    copies = copy_bytes(rewrite)
    if copies is None or grown <= copies:
        return 0
    pins = {name: list(a.shape) for name, a in session_feeds(original, feeds_all).items()}
    return min(arena_rounding(rewrite, analyse(load_model(compare_to, input_shapes=pins), order=order)), grown - copies)
