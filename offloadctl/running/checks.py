"""What a run is checked by: the order its nodes ran in against the order predicted for it
(`planned_order`, read back from onnxruntime's profile: `order_from_profile`, `compare_order`), and
its outputs against an original's (`compare_outputs`: bit-identical, or within tolerances).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

import numpy as np
import onnx

from offloadctl.analysis.order import expected_run_order
from offloadctl.running.replay import ran_nodes

__all__ = ["OrderCheck", "OutputComparison", "compare_order", "compare_outputs", "order_from_profile", "planned_order"]

# --------------------------------------------------------------------------------------------------
# Execution order


def planned_order(proto: onnx.ModelProto, order: str = "priority") -> list[str]:
    """The order onnxruntime runs the model in with PRIORITY_BASED (or ``order="default"``: its
    DEFAULT order): node names, Constant nodes and nodes onnxruntime replaces or removes excluded
    (`offloadctl.analysis.order.expected_run_order`).

    For a model rewritten by `offloadctl apply` the PRIORITY_BASED order is its file order. Nodes
    without a name, or whose name is not unique, cannot be matched with profiling events and are
    left out.
    """
    return expected_run_order(proto, order)


def order_from_profile(profile_path: str | os.PathLike[str]) -> list[str]:
    """Node names in the order they ran, from an onnxruntime profiling file (one run)."""
    return [node.name for node in ran_nodes(profile_path)]


class OrderCheckDoc(TypedDict):
    """The order check in a ``--json`` document (`OrderCheck.to_json`)."""

    planned_count: int
    ran_count: int
    mode: str
    matches: bool
    verdict: str
    first_differences: list[dict[str, Any]]
    missing_count: int
    missing: list[str]


@dataclass
class OrderCheck:
    """How the order nodes ran compares with the planned order."""

    planned_count: int
    ran_count: int
    exact: bool  # True: every planned node must run, in order; False: relative order of survivors
    matches: bool
    first_differences: list[dict[str, Any]]
    missing: list[str]  # planned nodes that did not run (removed or fused by optimizations)

    def to_json(self) -> OrderCheckDoc:
        return {
            "planned_count": self.planned_count,
            "ran_count": self.ran_count,
            "mode": "exact" if self.exact else "relative",
            "matches": self.matches,
            "verdict": "as planned" if self.matches else "differs from the plan",
            "first_differences": self.first_differences,
            "missing_count": len(self.missing),
            "missing": self.missing[:20],
        }


def compare_order(planned: Sequence[str], ran: Sequence[str], *, exact: bool, limit: int = 5) -> OrderCheck:
    """Compare the planned node order with the order that ran.

    Nodes that ran but were not planned (inserted by onnxruntime, unnamed, in subgraphs) are
    ignored. With ``exact`` every planned node must have run, in the planned order; otherwise
    only the relative order of planned nodes that still ran counts.
    """
    planned_set = set(planned)
    ran_planned = [n for n in ran if n in planned_set]
    ran_set = set(ran_planned)
    survivors = [n for n in planned if n in ran_set]
    missing = [n for n in planned if n not in ran_set]
    differences = []
    for i, (want, got) in enumerate(zip(survivors, ran_planned)):
        if want != got:
            differences.append({"index": i, "planned": want, "ran": got})
            if len(differences) >= limit:
                break
    matches = not differences and (not exact or not missing)
    return OrderCheck(len(planned), len(ran_planned), exact, matches, differences, missing)


# --------------------------------------------------------------------------------------------------
# Output comparison


class _ComparisonNote(TypedDict, total=False):
    note: str


class ComparisonDoc(_ComparisonNote):
    """One output's comparison in a ``--json`` document (`OutputComparison.to_json`)."""

    identical: bool
    max_abs: float | None
    max_rel: float | None
    within_tolerance: bool


@dataclass
class OutputComparison:
    """One output of the model against the same output of the original."""

    identical: bool
    max_abs: float | None
    max_rel: float | None
    within_tolerance: bool
    note: str | None = None

    def to_json(self) -> ComparisonDoc:
        doc: ComparisonDoc = {
            "identical": self.identical,
            "max_abs": self.max_abs,
            "max_rel": self.max_rel,
            "within_tolerance": self.within_tolerance,
        }
        if self.note:
            doc["note"] = self.note
        return doc


def _finite_or_none(x: float) -> float | None:
    return float(x) if np.isfinite(x) else None


def _compare_one(got: Any, want: Any, rtol: float, atol: float) -> OutputComparison:
    if not isinstance(got, np.ndarray) or not isinstance(want, np.ndarray):
        same = _equal_values(got, want)
        return OutputComparison(same, None, None, same, None if same else "non-tensor outputs differ")
    if got.shape != want.shape:
        return OutputComparison(False, None, None, False, f"shape {list(got.shape)} vs {list(want.shape)}")
    if got.dtype != want.dtype:
        return OutputComparison(False, None, None, False, f"dtype {got.dtype} vs {want.dtype}")
    if got.dtype.kind in "OSUV":
        same = bool(np.array_equal(got, want))
        return OutputComparison(same, None, None, same)
    identical = got.tobytes() == want.tobytes()
    if identical:
        return OutputComparison(True, 0.0, 0.0, True)
    if got.size == 0:
        return OutputComparison(True, 0.0, 0.0, True)
    wide = np.complex128 if got.dtype.kind == "c" else np.float64
    a, b = got.astype(wide), want.astype(wide)
    both_nan = np.isnan(a) & np.isnan(b)
    same = (a == b) | both_nan
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.where(same, 0.0, np.abs(a - b))
        max_abs = float(np.max(diff))
        nonzero = np.abs(b) > 0
        rel = np.where(nonzero & ~same, diff / np.where(nonzero, np.abs(b), 1.0), 0.0)
        max_rel = float(np.max(rel))
        ok = bool(np.all(same | (diff <= atol + rtol * np.abs(b))))
    note = None if np.isfinite(max_abs) else "NaN or infinity where the original has a different value"
    return OutputComparison(False, _finite_or_none(max_abs), _finite_or_none(max_rel), ok, note)


def _equal_arrays(a: Any, b: Any) -> bool:
    """Two arrays of the same shape, type and bytes (strings and objects compared as values)."""
    if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)) or a.shape != b.shape or a.dtype != b.dtype:
        return False
    return a.tobytes() == b.tobytes() if a.dtype.kind not in "OSUV" else bool(np.array_equal(a, b))


def _equal_values(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return _equal_arrays(a, b)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_equal_values(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal_values(a[k], b[k]) for k in a)
    return bool(a == b)


def compare_outputs(
    got: Mapping[str, Any], want: Mapping[str, Any], *, rtol: float, atol: float
) -> dict[str, OutputComparison]:
    """Compare every output in ``got`` with the output of the same name in ``want``.

    ``rtol = atol = 0`` demands bit equality. An output that the original lacks differs.
    """
    result = {}
    for name, value in got.items():
        if name not in want:
            result[name] = OutputComparison(False, None, None, False, "the original has no output of this name")
        else:
            result[name] = _compare_one(value, want[name], rtol, atol)
    return result
