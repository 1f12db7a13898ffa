"""The device peak of a run as it ran: the model placed as onnxruntime placed it, in the profiled order.

A profiled run names, for each kernel it ran, the node, its provider and onnxruntime's node index
(`ran_nodes`); the graph onnxruntime saved while making the session holds the copies it inserted
(`offloadctl.running.placement.inserted_copies`). `ran_peak` rebuilds that placed graph from the model
(`offloadctl.loading.placed`, the copies under onnxruntime's own names, the nodes the CPU provider ran
on the host) and simulates it in the order the profile shows, counting device memory only: what the
CPU provider makes lives in host memory, each inserted copy to the device is a device buffer from
when it runs. The plan's own device figure (`offloadctl.rewriting.preview.device_result`) is built the
same way from the order onnxruntime's executor is predicted to run, so the two compare like for like.
`predicted_order` is that prediction for the run's own placement, which `run` checks the profiled
order against on a device.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from offloadctl.analysis.graph import analyse
from offloadctl.core.errors import OffloadError
from offloadctl.loading.model import LoadedModel
from offloadctl.loading.placed import HostCast, Placement, placed
from offloadctl.running.placement import InsertedCopy

__all__ = ["CPU_PROVIDER", "RanNode", "predicted_order", "ran_nodes", "ran_peak"]

CPU_PROVIDER = "CPUExecutionProvider"
_KERNEL_SUFFIX = "_kernel_time"


@dataclass(frozen=True)
class RanNode:
    """One node a profiled run ran: its name, its provider and onnxruntime's index of it."""

    name: str
    provider: str | None
    index: int | None


def ran_nodes(profile_path: str | os.PathLike[str]) -> list[RanNode]:
    """The nodes of an onnxruntime profiling file (one run), in the order they ran."""
    with open(profile_path, encoding="utf-8") as f:
        events = json.load(f)
    kernels = [
        e
        for e in events
        if isinstance(e, dict) and e.get("cat") == "Node" and str(e.get("name", "")).endswith(_KERNEL_SUFFIX)
    ]
    kernels.sort(key=lambda e: e.get("ts", 0))
    found, seen = [], set()
    for e in kernels:
        name = e["name"][: -len(_KERNEL_SUFFIX)]
        if name in seen:
            continue
        seen.add(name)
        args: dict[str, Any] = e.get("args") or {}
        index = str(args.get("node_index", ""))
        found.append(RanNode(name, args.get("provider"), int(index) if index.isdigit() else None))
    return found


def ran_peak(
    loaded: LoadedModel,
    order: str,
    ran: Sequence[RanNode],
    inserted: Sequence[InsertedCopy],
    casts: Sequence[HostCast] = (),
) -> int | None:
    """The device peak of ``loaded`` (the model as run, shapes pinned) placed as the profiled run
    placed it (the copies and Casts onnxruntime inserted) and simulated in the order it ran; None when
    the run cannot be matched to the model."""
    from offloadctl.simulation.result import simulate

    if not ran:
        return None
    model, host, sequence = _as_ran(loaded, ran, inserted, casts)
    try:
        return simulate(analyse(model, order=order, sequence=sequence, host=host), None, profile=None).peak_after
    except OffloadError:
        return None


def predicted_order(
    loaded: LoadedModel,
    order: str,
    ran: Sequence[RanNode],
    inserted: Sequence[InsertedCopy],
    casts: Sequence[HostCast] = (),
) -> list[str]:
    """The names of the nodes in the order onnxruntime's executor is predicted to run ``loaded`` placed
    as the profiled run placed it (`offloadctl.analysis.order.executor_order`), its inserted copies
    and Casts under their own names: what the profiled order is checked against on a device (empty when the run
    cannot be matched to the model)."""
    model, host, _ = _as_ran(loaded, ran, inserted, casts)
    try:
        return [node.name for node in analyse(model, order=order, host=host).nodes if node.name]
    except OffloadError:
        return []


def _as_ran(
    loaded: LoadedModel, ran: Sequence[RanNode], inserted: Sequence[InsertedCopy], casts: Sequence[HostCast] = ()
) -> tuple[LoadedModel, frozenset[int], list[int]]:
    """(``loaded`` with the copies and Casts onnxruntime inserted, under its names; the ``graph.node`` indices of
    the nodes the CPU provider ran; the profiled order as ``graph.node`` indices)."""
    nodes = loaded.proto.graph.node
    where = _Matcher(loaded)
    found = [(n, where(n)) for n in ran]
    host = frozenset(nodes[k].output[0] for n, k in found if k is not None and n.provider == CPU_PROVIDER)
    copies = {c.tensor: c.node for c in inserted}
    proto, on_host = placed(
        loaded.proto, Placement(host, tuple(copies), tuple(casts)), copy_names=copies, pins_by_inputs=False
    )
    added = {node.name: k for k, node in enumerate(proto.graph.node) if k >= len(nodes)}
    sequence = [k for n, mine in found if (k := added.get(n.name, mine)) is not None]
    return replace(loaded, proto=proto, sizes_from_run=None), on_host, sequence


class _Matcher:
    """The ``graph.node`` index of a profiled node: by onnxruntime's node index (it numbers the nodes in
    file order, Constant nodes left out: they become initializers) where the names agree or the model's
    node has none, else by name; None for a node the model does not have (a copy onnxruntime inserted)."""

    def __init__(self, loaded: LoadedModel) -> None:
        self.nodes = loaded.proto.graph.node
        self.numbered = [k for k, node in enumerate(self.nodes) if node.op_type != "Constant"]
        self.by_name = {node.name: k for k, node in enumerate(self.nodes) if node.name and node.output}

    def __call__(self, node: RanNode) -> int | None:
        if node.index is not None and node.index < len(self.numbered):
            k = self.numbered[node.index]
            if self.nodes[k].name in ("", node.name) and self.nodes[k].output:
                return k
        return self.by_name.get(node.name)
