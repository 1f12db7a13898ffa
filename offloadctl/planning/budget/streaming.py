"""Weight streaming: weights stay on the host and come in by layer group, ``depth`` groups ahead
(see the package docstring for how groups are built)."""

from __future__ import annotations

import math
from typing import Any

from offloadctl.planning.budget.candidates import Cand, State

__all__ = ["stream_states"]


def _stream_groups(cands: list[Cand]) -> tuple[list[list[Cand]], list[int]]:
    """Pack weights (by first use) into layer groups; returns (groups, window start of each)."""
    weights = sorted((c for c in cands if not c.is_act), key=lambda c: (c.entries[0], c.name))
    if not weights:
        return [], []
    per_node: dict[int, int] = {}
    for c in weights:
        per_node[c.entries[0]] = per_node.get(c.entries[0], 0) + c.size
    cap = max(per_node.values())
    groups: list[list[Cand]] = []
    size = 0
    for c in weights:
        same_node = groups and groups[-1][-1].entries[0] == c.entries[0]
        if groups and (same_node or size + c.size <= cap):
            groups[-1].append(c)
            size += c.size
        else:
            groups.append([c])
            size = c.size
    starts = [g[0].entries[0] for g in groups]
    return groups, starts


def stream_states(cands: list[Cand], depth: int) -> tuple[dict[str, State], dict[str, Any]]:
    groups, starts = _stream_groups(cands)
    states: dict[str, State] = {}
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
            states[c.name] = State(True, frozenset(), c.entries[0] - load_at)
            kept += c.size
        group_bytes.append(kept)
    info = {
        "depth": depth,
        "groups": len(groups),
        "largest_group_bytes": max(group_bytes, default=0),
        "streamed_bytes": sum(group_bytes),
        "resident_shared": sorted(resident),
    }
    return states, info
