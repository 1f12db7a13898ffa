"""The filter stage: cap the number of offloads (HyperOffload OffloadInfoFilterByNumber).

Candidates are taken in first-use order (position of the tensor's first use, then the input index
there) and the first ``select_num`` are kept. MindSpore's loop keeps N-1; offloadctl keeps exactly
N. Candidates smaller than ``min_bytes`` are dropped first (they do not use up the count). Forced
candidates (``--force``) are always kept and do not count. Every dropped candidate is moved to
``rejected`` with its reason.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from offloadctl.analysis.graph import use_key
from offloadctl.contract.document import record_stage, require_stage
from offloadctl.core.bulk import paused_gc
from offloadctl.core.plantypes import Offload, Plan, Rejection, RejectionReason, rejection
from offloadctl.core.units import fmt_bytes
from offloadctl.planning.request import FilterPart, recorded

__all__ = ["filter_plan", "filtered", "first_use_key", "verdicts"]


def first_use_key(offload: Offload) -> tuple[int, int]:
    """(position, input index) of the offload's first use; subgraph reads sort after inputs.

    A graph output that no node reads sorts at its final reload (the end of the run).
    """
    if offload["device_uses"]:
        first = offload["device_uses"][0]
    elif offload["reload_groups"]:
        first = offload["reload_groups"][0]["uses"][0]
    else:
        end = offload["output_h2d_before"]
        assert end is not None  # an entry no node reads is a graph output, copied back at the end
        return (end, 0)
    return use_key(first["position"], first["input_index"])


def _rejection(off: Offload, reason: RejectionReason, detail: str) -> Rejection:
    gaps = [g["gap"] for g in off["reload_groups"]]
    return rejection(off["tensor"], off["kind"], off["bytes"], "filter", reason, detail, max(gaps) if gaps else None)


def verdicts(
    candidates: Iterable[tuple[bool, int]], options: FilterPart
) -> Iterator[tuple[RejectionReason, str] | None]:
    """The filter's verdict on each candidate, given as (forced, bytes) in first-use order: None to
    keep it, else why it is dropped."""
    select_num, min_bytes = options.select_num, options.min_size
    count = 0
    for forced, size in candidates:
        if forced:
            yield None
        elif size < min_bytes:
            yield "min-bytes", f"{fmt_bytes(size)} < --min-bytes {fmt_bytes(min_bytes)}"
        elif count < select_num:
            count += 1
            yield None
        else:
            yield "select-num", f"beyond the first {select_num} candidates in first-use order"


def filtered(selected: Plan, dropped: list[Rejection], options: FilterPart) -> Plan:
    """The "filtered" plan of a "selected" plan that holds only the offloads the filter keeps, and of
    the rejections of those it dropped (listed after the select stage's)."""
    new = record_stage(selected, "filtered", "filter", {**recorded(options), "min_bytes": options.min_size})
    new["rejected"] += dropped
    return new


@paused_gc()
def filter_plan(plan: Plan, options: FilterPart) -> Plan:
    """Return a "filtered" plan keeping the first ``select_num`` candidates in first-use order
    (``options``: `FilterPart`)."""
    require_stage(plan, "selected", "filter")
    ordered = sorted(plan["offloads"], key=first_use_key)
    kept: list[Offload] = []
    dropped: list[Rejection] = []
    for off, verdict in zip(ordered, verdicts(((bool(o.get("forced")), o["bytes"]) for o in ordered), options)):
        if verdict is None:
            kept.append(off)
        else:
            dropped.append(_rejection(off, *verdict))
    # only the kept candidates are copied into the new plan (the input plan is left as it was)
    return filtered({**plan, "offloads": kept}, dropped, options)
