"""The plan's types: the JSON document of ``schemas/plan.schema.json`` as typed dicts, and the one
constructor of each entry the stages write (an offload, a reload group, a rejection).

The schema stays the contract (`offloadctl.contract.document` validates every plan against it); these types let
the type checker see what the stages read and write, and a test checks that they name the same keys
and the same rejection reasons as the schema. The constructors fix the key order, which is the
order the plan file shows. Nothing here reads a model or validates a plan.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, TypedDict

__all__ = [
    "BudgetRecord",
    "Compared",
    "FilterOptions",
    "MaxSlowdown",
    "Objective",
    "OptimizedRecord",
    "Solver",
    "Kind",
    "ModelInfo",
    "Offload",
    "Plan",
    "Producer",
    "Rejection",
    "SizesFromRun",
    "RejectionReason",
    "RejectionStage",
    "ReloadGroup",
    "Stage",
    "Strategy",
    "Use",
    "offload",
    "rejection",
    "reload_group",
]

Stage = Literal["selected", "filtered", "scheduled"]
Strategy = Literal["distance", "budget"]
Kind = Literal["activation", "parameter"]
RejectionStage = Literal["select", "filter", "prefetch"]
#: Why a candidate is not offloaded; the select stage's reasons first, in the order it checks them.
RejectionReason = Literal[
    "unused",
    "disabled",
    "never",
    "short-gaps",
    "not-copyable",
    "unknown-size",
    "host-input",
    "host-resident",
    "prepacked",
    "fused",
    "graph-output-weight",
    "select-num",
    "min-bytes",
    "too-small",
    "budget-not-needed",
    "subgraph-only",
]


class Use(TypedDict):
    """One read of a tensor: by the node at ``position``, at ``input_index`` (None: inside a subgraph)."""

    position: int
    node: str
    input_index: int | None


class ReloadGroup(TypedDict):
    """Uses served by one host-to-device copy, placed before position ``h2d_before`` (None until prefetch)."""

    uses: list[Use]
    gap: int
    h2d_before: int | None


class Producer(TypedDict):
    position: int
    node: str


class _OffloadOptional(TypedDict, total=False):
    forced: bool


class Offload(_OffloadOptional):
    """One tensor the plan moves to the host, with where its copies run."""

    id: int
    tensor: str
    kind: Kind
    dtype: str
    shape: list[int]
    bytes: int
    producer: Producer | None
    d2h_after: int | None
    device_uses: list[Use]
    reload_groups: list[ReloadGroup]
    graph_output: bool
    output_h2d_before: int | None
    release_after: int | None
    prefetch_distance: int | None


class _RejectionOptional(TypedDict, total=False):
    max_gap: int | None


class Rejection(_RejectionOptional):
    """A candidate that is not offloaded, and the first reason that applies."""

    tensor: str
    kind: Kind
    bytes: int | None
    stage: RejectionStage
    reason: RejectionReason
    detail: str


class SizesFromRun(TypedDict):
    """Sizes read from one run: with these inputs (None: generated with ``seed`` at the pinned shapes)."""

    inputs: str | None
    seed: int


#: plan --opt-level: the graph onnxruntime optimized, from what (``from`` is a keyword, hence this form)
OptimizedRecord = TypedDict(
    "OptimizedRecord",
    {"from": str, "sha256": str, "opt_level": str, "device": str | None, "disabled_optimizers": list[str]},
)


class _ModelOptional(TypedDict, total=False):
    dims: dict[str, int]
    sizes_from_run: SizesFromRun
    execution_order: str
    optimized: OptimizedRecord


class ModelInfo(_ModelOptional):
    """The model a plan was made for."""

    path: str
    sha256: str
    num_positions: int
    input_shapes: dict[str, list[int]]


class Tool(TypedDict):
    name: str
    version: str


class HistoryEntry(TypedDict):
    stage: Stage
    tool_version: str
    options: dict[str, Any]


class _FilterOptional(TypedDict, total=False):
    strategy: Strategy
    budget_bytes: int | None
    profile: str | None
    objective: str
    copies: str
    max_slowdown: float | None
    optimal: bool
    time_limit_s: float | None


class FilterOptions(_FilterOptional):
    """The filter stage's recorded options (``options.filter``): the count and the floor, and for a budget
    plan what the budget planner searched with."""

    select_num: int
    min_bytes: int


class Options(TypedDict, total=False):
    """The options in force for each stage that has run."""

    select: dict[str, Any]
    filter: dict[str, Any]
    prefetch: dict[str, Any]


class _ObjectiveOptional(TypedDict, total=False):
    profile: str
    copies: str


class Objective(_ObjectiveOptional):
    """The budget record's ``objective``: what the search minimises, in what unit; for time, on which
    profile and with the copies run how (`offloadctl.simulation.costs.CopyCost.to_json`)."""

    objective: str
    unit: str


class Solver(TypedDict, total=False):
    """The budget record's ``solver``: what the exact search (HiGHS, ``--optimal``) did (the schema requires
    none of its keys; the search writes them all)."""

    name: str
    status: str
    seconds: float
    time_limit_s: float
    columns: int
    rows: int
    nonzeros: int
    answer: str


class Compared(TypedDict):
    """With the time objective: the stall of the plan it found and of the bytes objective's, and which is kept."""

    copies: str
    stall_s: dict[str, float]
    kept: str


class MaxSlowdown(TypedDict):
    """``--max-slowdown``: the budget searched for, and the figures of the plan chosen."""

    requested: float
    copies: str
    profile: str
    baseline_s: float
    time_s: float
    slowdown: float
    within: bool
    budget_bytes: int | None
    peak_before_bytes: int
    peak_bytes: int
    budgets_tried: int


class _BudgetOptional(TypedDict, total=False):
    stream_weights: dict[str, Any]
    compared: Compared
    max_slowdown: MaxSlowdown


class BudgetRecord(_BudgetOptional):
    """The plan's ``budget`` record, written by the budget planner: what was asked, what the planner
    predicts, what the plan costs and how far from the best plan it can be."""

    requested_bytes: int | None
    lower_bound_bytes: int
    lower_bound_position: int | None
    peak_before_bytes: int
    predicted_peak_bytes: int
    predicted_peak_position: int
    bytes_moved: int
    assumed_prefetch_distance: int
    assumed_release_distance: int
    weights_added_by_budget: bool
    search: str
    objective: Objective
    copies: str
    cost: float
    cost_bound: float | None
    gap: float | None
    bound_source: str | None
    optimal: bool
    solver: Solver | None
    chosen: dict[str, str]


class _PlanOptional(TypedDict, total=False):
    budget: BudgetRecord
    summary: dict[str, Any]


class Plan(_PlanOptional):
    """The plan document passed between the stages and read by apply and simulate."""

    schema_version: int
    stage: Stage
    tool: Tool
    model: ModelInfo
    strategy: Strategy
    options: Options
    history: list[HistoryEntry]
    offloads: list[Offload]
    rejected: list[Rejection]


def rejection(
    tensor: str,
    kind: Kind,
    size: int | None,
    stage: RejectionStage,
    reason: RejectionReason,
    detail: str,
    max_gap: int | None,
) -> Rejection:
    """A ``rejected`` entry: ``size`` is the tensor's bytes (None: unknown), ``max_gap`` its longest
    idle stretch (None: no gap)."""
    return {
        "tensor": tensor,
        "kind": kind,
        "bytes": size,
        "stage": stage,
        "reason": reason,
        "detail": detail,
        "max_gap": max_gap,
    }


def reload_group(uses: list[Use], gap: int, h2d_before: int | None = None) -> ReloadGroup:
    """A reload group; its H2D position is filled in by the prefetch stage."""
    return {"uses": uses, "gap": gap, "h2d_before": h2d_before}


def offload(
    *,
    tensor: str,
    kind: Kind,
    dtype: str,
    shape: Sequence[int],
    size: int,
    producer: Producer | None,
    device_uses: list[Use],
    reload_groups: list[ReloadGroup],
    graph_output: bool,
    output_h2d_before: int | None,
    prefetch_distance: int | None = None,
    forced: bool = False,
) -> Offload:
    """An ``offloads`` entry before the prefetch stage: its D2H right after the producer
    (activations), no release point yet, id 0 until the plan numbers its entries; ``forced`` is
    written only when set."""
    entry: Offload = {
        "id": 0,
        "tensor": tensor,
        "kind": kind,
        "dtype": dtype,
        "shape": list(shape),
        "bytes": size,
        "producer": producer,
        "d2h_after": producer["position"] if producer is not None else None,
        "device_uses": device_uses,
        "reload_groups": reload_groups,
        "graph_output": graph_output,
        "output_h2d_before": output_h2d_before,
        "release_after": None,
        "prefetch_distance": prefetch_distance,
    }
    if forced:
        entry["forced"] = True
    return entry
