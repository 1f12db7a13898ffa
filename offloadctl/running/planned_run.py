"""How a run differs from what its rewrite was planned for: shapes other than the planned ones
(`other_shapes`), another execution order and what that costs (`other_order`), and the level the
original of a comparison runs at when the rewrite is of a graph onnxruntime optimized (`original_level`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from offloadctl.analysis.graph import analyse
from offloadctl.analysis.order import EXECUTION_ORDERS
from offloadctl.core.files import sha256_file
from offloadctl.core.units import fmt_bytes
from offloadctl.loading.model import LoadedModel
from offloadctl.rewriting.metadata import planned_execution_order, planned_input_shapes
from offloadctl.running.sessions import OPT_LEVELS

__all__ = ["original_level", "other_order", "other_shapes"]


def other_shapes(model: str, feeds: Mapping[str, Any]) -> list[str]:
    """A warning when a rewrite runs at shapes other than those its plan was made at (its
    ``offloadctl.planned_at``): the figures its plan quotes are those of the planned shapes."""
    differ = {
        name: want
        for name, want in planned_input_shapes(model).items()
        if isinstance(array := feeds.get(name), np.ndarray)
        and len(want) == array.ndim
        and any(w is not None and w != n for w, n in zip(want, array.shape))
    }
    if not differ:
        return []

    def shape(dims: Sequence[Any]) -> str:
        return ",".join("?" if d is None else str(d) for d in dims)

    made = ", ".join(f"{name}={shape(want)}" for name, want in differ.items())
    ran = ", ".join(f"{name}={shape(feeds[name].shape)}" for name in differ)
    pins = " ".join(f"--input-shape {name}={shape(feeds[name].shape)}" for name in differ)
    return [
        f"{model} was planned at {made} and runs at {ran} here: the peak and time its plan quotes are those of the "
        f"planned shapes; plan again with {pins} for the figures of this run"
    ]


def other_order(model: str, loaded: LoadedModel, order: str) -> list[str]:
    """A warning when a rewrite runs in another execution order than its plan counted positions in (its
    ``offloadctl.planned_at``), with what that costs: the rewrite's simulated device peak in both."""
    planned = planned_execution_order(model)
    if planned is None or planned == order:
        return []
    from offloadctl.simulation.result import simulate

    peaks = {o: simulate(analyse(loaded, order=o), None, profile=None).peak_after for o in (planned, order)}
    cost = peaks[order] - peaks[planned]
    change = f"{'+' if cost >= 0 else '-'}{fmt_bytes(abs(cost))}"
    return [
        f"{model} was planned for the {EXECUTION_ORDERS[planned]} order and runs in {EXECUTION_ORDERS[order]} here: "
        f"its simulated device peak is {fmt_bytes(peaks[order])} in this order against {fmt_bytes(peaks[planned])} "
        f"as planned ({change}); plan again with --execution-order {order} for a plan made for this order"
    ]


def original_level(compare_to: str | None, settings: Mapping[str, Any], opt_level: str) -> str:
    """The level the original of a comparison runs at: that of the rewrite, except for a rewrite of the graph
    onnxruntime optimized from it (``plan --opt-level``), which is held to the original at that level."""
    optimized = settings.get("optimized")
    if compare_to is None or not isinstance(optimized, Mapping) or optimized.get("opt_level") not in OPT_LEVELS:
        return opt_level
    return str(optimized["opt_level"]) if sha256_file(compare_to) == optimized.get("sha256") else opt_level
