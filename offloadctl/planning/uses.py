"""A tensor's uses as the select stage reads them: its reload groups at a select distance
(`split_reload_groups`), its longest idle stretch (`longest_gap`), and, for a big model's candidates at
once, its uses as flat arrays (`UseArrays`).
"""

from __future__ import annotations

import itertools
import operator
from typing import Any, NamedTuple

import numpy as np

from offloadctl.analysis.graph import Use, use_key

__all__ = ["UseArrays", "input_bits", "longest_gap", "sort_key", "split_reload_groups", "weight_idle_end"]


def split_reload_groups(
    start: int, uses: list[Use], select_distance: int, *, first_group_at_start: bool = False
) -> tuple[list[Use], list[tuple[int, list[Use]]]]:
    """Split ``uses`` (sorted) by gaps larger than ``select_distance``.

    Args:
        start: position of the producer (activations) or of the run's start (weights: 0).
        uses: the tensor's uses in execution order.
        select_distance: a gap must be strictly larger to open a reload group.
        first_group_at_start: weights: the first use always opens a group.

    Returns:
        (device_uses, groups): the uses before the first qualifying gap, and each reload group as
        (gap before it, its uses).
    """
    device: list[Use] = []
    groups: list[tuple[int, list[Use]]] = []
    prev = start
    for k, use in enumerate(uses):
        gap = use.position - prev
        if (first_group_at_start and k == 0) or gap > select_distance:
            groups.append((gap, [use]))
        elif groups:
            groups[-1][1].append(use)
        else:
            device.append(use)
        prev = use.position
    return device, groups


def sort_key(use: Use) -> tuple[int, int]:
    """`Use.sort_key`, without the property call (once per candidate of a big graph)."""
    return use_key(use[0], use[1])


class UseArrays(NamedTuple):
    """The uses of a list of tensors as flat arrays, tensor after tensor (each tensor's in execution order)."""

    counts: np.ndarray  # uses per tensor
    offsets: np.ndarray  # where each tensor's uses start in the flat arrays
    positions: np.ndarray  # each use's position
    indices: np.ndarray  # each use's input index; -1 for a read inside a subgraph

    @classmethod
    def of(cls, lists: list[list[Use]]) -> UseArrays:
        counts = np.fromiter(map(len, lists), dtype=np.int64, count=len(lists))
        flat = list(itertools.chain.from_iterable(lists))
        positions = np.fromiter(map(operator.itemgetter(0), flat), dtype=np.int64, count=len(flat))
        indices = np.fromiter(
            (-1 if i is None else i for i in map(operator.itemgetter(1), flat)), dtype=np.int64, count=len(flat)
        )
        return cls(counts, np.cumsum(counts) - counts, positions, indices)

    def steps(self, starts: np.ndarray) -> np.ndarray:
        """The distance from each use back to the one before it, or for a tensor's first use back to
        its start (``starts``: one per tensor)."""
        has = self.counts > 0
        before = np.empty_like(self.positions)
        before[1:] = self.positions[:-1]
        before[self.offsets[has]] = starts[has]
        return self.positions - before

    def last(self) -> np.ndarray:
        """The position of each tensor's last use (-1: none)."""
        found = np.full(len(self.counts), -1, dtype=np.int64)
        has = self.counts > 0
        found[has] = self.positions[self.offsets[has] + self.counts[has] - 1]
        return found

    def max_gaps(self, steps: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """`longest_gap` of each tensor (``steps``: `steps`; ``ends``: its end, or -1 for none); 0 for a
        tensor without uses."""
        has = self.counts > 0
        gaps = np.zeros(len(self.counts), dtype=np.int64)
        if has.any():
            gaps[has] = np.maximum.reduceat(steps, self.offsets[has])
        tail = np.where(ends >= 0, ends - self.last(), 0)
        return np.maximum(np.maximum(gaps, tail), 0) * has

    def any(self, flags: np.ndarray) -> np.ndarray:
        """For each tensor, whether the flag of any of its uses is set (``flags``: one per use)."""
        found = np.zeros(len(self.counts), dtype=bool)
        has = self.counts > 0
        if has.any():
            found[has] = np.logical_or.reduceat(flags, self.offsets[has])
        return found


def input_bits(n: int, table: dict[int, frozenset[int]]) -> np.ndarray:
    """Per position, the input indices ``table`` gives it, as bits (indices above 62 are never listed)."""
    bits = np.zeros(n, dtype=np.int64)
    for position, indices in table.items():
        bits[position] = sum(1 << i for i in indices if i < 63)
    return bits


def weight_idle_end(num_positions: int, last_use: Any) -> Any:
    """Where a weight's last idle stretch ends: a weight stays resident for the whole run, so it idles from
    its last use to the run's last position (the one place this rule is stated: the select stage's gaps,
    the disabled weights' and `explain`'s use it). ``last_use``: a position, or an array of them."""
    return np.maximum(num_positions - 1, last_use)


def longest_gap(start: int, uses: list[Use], end: int | None = None) -> int:
    """The largest distance between consecutive entries of [start] + use positions (+ [end])."""
    best = 0
    prev = start
    for use in uses:
        position = use[0]
        if position - prev > best:
            best = position - prev
        prev = position
    if end is not None and end - prev > best:
        best = end - prev
    return best
