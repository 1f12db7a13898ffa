"""The plan's pipeline: HyperOffload's ``Run()`` as passes (`PIPELINE`), each a named step over one
`Planning` state that declares what it reads and writes, what must be in the state before it runs
(``requires``) and what it leaves there (``ensures``), and whether it changes the plan it is given in
place or hands back a new one (as onnx-ir's ``PassBase`` declares ``in_place``, ``requires`` and
``ensures``). The pipeline is the seed's steps and nothing else: the figures a plan quotes and a weak
plan's next step are a report made after it (`offloadctl.pipeline`), which needs the rewrite, a layer
above this one.

- `SELECT` (the seed's ``GenerateParameterOperations`` and ``GenerateActivationOperations``): every
  tensor's verdict, once per analysis and options (`offloadctl.planning.select.selection_for`).
- `FILTER` (``OffloadInfoFilterByNumber``; or the budget planner, or the trade-off): the offloads
  kept, a new "filtered" plan. A planner that places its own prefetches (the budget search with
  copies on streams, the trade-off) gives a "scheduled" plan, and the simulation it made.
- `PREFETCH` (``AdjustHyperOffloadNodePosition``): each H2D's place and each release point, on the
  filtered plan in place (the pipeline owns it); with copies on streams, each H2D then as early as its
  copy needs to hide behind compute, the peak never raised (`offloadctl.planning.prefetch.lead_by_time`).
- `EVENTS` (``AddEventNodes``): how the copies run, in line or on a copy stream with their gates and
  fences (`offloadctl.rewriting.streams` writes them), recorded in the plan's summary.
- `PINS` (``BuildExecutionOrder``): where the order pins go that hold each copy in place in the
  DEFAULT order, recorded in the plan (`offloadctl.contract.order_pins`).

`Pass.__call__` checks each declaration as it runs: a pass that reads or writes a field it does not
declare, or that declares ``in_place`` and hands back another plan (or the other way round), is a bug,
stopped with the field's name; a field it requires that no earlier pass wrote stops it before it runs
(`PreconditionError`, naming the pass that writes it), one it ensures but left empty after
(`PostconditionError`). A pass hands back ``state.replace(...)`` (or the state it was given).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

from offloadctl.analysis.graph import Analysis
from offloadctl.contract.order_pins import pin_layout, record_pins
from offloadctl.core.bulk import paused_gc
from offloadctl.core.plantypes import Plan
from offloadctl.planning.advice import NextStep
from offloadctl.planning.budget.strategy import BudgetSearch
from offloadctl.planning.planners import filtered_by_number
from offloadctl.planning.prefetch import lead_by_time, prefetch_own
from offloadctl.planning.request import NO_PROGRESS, PlanRequest, Progress, runs_copy_streams
from offloadctl.planning.select import Selection, selection_for
from offloadctl.planning.tradeoff import plan_within_slowdown
from offloadctl.simulation.base import is_rewritten
from offloadctl.simulation.costs import copy_timing
from offloadctl.simulation.result import SimResult

__all__ = [
    "EVENTS",
    "FILTER",
    "PINS",
    "PIPELINE",
    "PLANNER_PASSES",
    "PREFETCH",
    "SELECT",
    "Pass",
    "Planning",
    "PostconditionError",
    "PreconditionError",
    "copy_mode",
]


@dataclass(frozen=True)
class Planning:
    """What the passes share: the analysis and the request every pass reads, where long work says what it
    is doing (``progress``; the runner says each pass's name), and what the passes write."""

    analysis: Analysis
    request: PlanRequest
    progress: Progress = NO_PROGRESS
    selection: Selection | None = None  # SELECT: every tensor's verdict
    plan: Plan | None = None  # FILTER: "filtered" (or "scheduled"); PREFETCH: "scheduled"
    simulation: SimResult | None = None  # a planner's own simulation of the plan, or the report's
    next_step: NextStep | None = None  # the report's: a weak plan's better command (`offloadctl.pipeline`)

    def replace(self, **changes: Any) -> Planning:
        """The state with ``changes`` written (what a pass hands back)."""
        return dataclasses.replace(self, **changes)


_FIELDS = tuple(f.name for f in dataclasses.fields(Planning))


class PreconditionError(AssertionError):
    """A pass run on a state without a field it requires: the pipeline's order is wrong."""


class PostconditionError(AssertionError):
    """A pass that left empty a field it ensures."""


class _Declared:
    """The state as a pass sees it: the fields it declares it reads, and `Planning.replace`. Reading
    any other field is a bug in the pass, stopped where it happens."""

    __slots__ = ("_state", "_pass")

    def __init__(self, state: Planning, step: Pass) -> None:
        self._state, self._pass = state, step

    def __getattr__(self, name: str) -> Any:
        if name in _FIELDS and name not in self._pass.reads:
            raise AssertionError(
                f"pass {self._pass.name!r} read {name!r}, which it does not declare: add it to the pass's reads"
            )
        return getattr(self._state, name)

    def replace(self, **changes: Any) -> Planning:
        return self._state.replace(**changes)


@dataclass(frozen=True, kw_only=True)
class Pass:
    """One step of the plan: its name, the seed's step it mirrors, the fields of `Planning` it reads
    and writes, those of its reads that must be set before it runs (``requires``) and of its writes
    that it sets (``ensures``), and whether it changes the plan in place."""

    name: str
    seed: str
    reads: tuple[str, ...]
    writes: tuple[str, ...]
    in_place: bool
    run: Callable[[Planning], Planning]
    requires: tuple[str, ...] = ()
    ensures: tuple[str, ...] = ()
    #: what the progress display says while it runs, when it says more than the name
    describe: Callable[[Planning], str] | None = None

    def __post_init__(self) -> None:
        declared = (*self.reads, *self.writes, *self.requires, *self.ensures)
        unknown = sorted(set(declared) - set(_FIELDS))
        if unknown:
            raise ValueError(f"pass {self.name!r} declares {unknown}, which Planning has not: {list(_FIELDS)}")
        if not set(self.requires) <= set(self.reads) or not set(self.ensures) <= set(self.writes):
            raise ValueError(f"pass {self.name!r} requires what it does not read, or ensures what it does not write")

    def __call__(self, state: Planning) -> Planning:
        missing = [name for name in self.requires if getattr(state, name) is None]
        if missing:
            raise PreconditionError(
                f"pass {self.name!r} requires {missing}, which no pass before it wrote: run the passes that "
                "write them first (PIPELINE's order)"
            )
        state.progress.report(self.describe(state) if self.describe is not None else self.name)
        done = self.run(cast(Planning, _Declared(state, self)))
        if isinstance(done, _Declared):  # the state handed back as it was
            done = done._state
        self._check_writes(state, done)
        empty = [name for name in self.ensures if getattr(done, name) is None]
        if empty:
            raise PostconditionError(f"pass {self.name!r} ensures {empty}, but left them empty")
        return done

    def _check_writes(self, state: Planning, done: Planning) -> None:
        """Stop a pass that wrote a field it does not declare, or handed back the plan other than it declares."""
        for name in _FIELDS:
            if name not in self.writes and getattr(done, name) is not getattr(state, name):
                raise AssertionError(f"pass {self.name!r} wrote {name!r}, which it does not declare")
        if "plan" in self.writes and state.plan is not None and done.plan is not None:
            if (done.plan is state.plan) != self.in_place:
                how = "hands back another plan" if self.in_place else "changed the plan it was given"
                raise AssertionError(f"pass {self.name!r} {how}, against its declaration")


@paused_gc()
def _select(state: Planning) -> Planning:
    return state.replace(selection=selection_for(state.analysis, state.request.selecting))


def _filter(state: Planning) -> Planning:
    analysis, request, progress = state.analysis, state.request, state.progress
    selection = state.selection
    assert selection is not None  # (required)
    budget = request.budget
    if budget.max_slowdown is not None:
        outcome = plan_within_slowdown(analysis, request, selection=selection, progress=progress)
        return state.replace(plan=outcome.plan, simulation=outcome.simulation)
    if budget.uses_budget:
        search = BudgetSearch(analysis, request, request.selecting, selection=selection, progress=progress)
        found = search.found()
        if found.scheduled is not None:  # the search scheduled and simulated its plan itself
            return state.replace(plan=found.scheduled.plan, simulation=found.scheduled.simulation)
        return state.replace(plan=found.filtered, simulation=None)
    return state.replace(plan=filtered_by_number(analysis, request, selection))


def _filtering(request: PlanRequest) -> str:
    if request.budget.max_slowdown is not None:
        return "fitting the slowdown"
    return "fitting the budget" if request.budget.uses_budget else "filtering"


def _prefetch(state: Planning) -> Planning:
    plan = state.plan
    assert plan is not None  # (required)
    if plan["stage"] == "filtered":  # a planner that placed its own prefetches gave a scheduled plan
        prefetch_own(plan, state.request.prefetch)
        if copy_mode(state.request) == "streams" and not is_rewritten(state.analysis):  # each load by time
            timing = copy_timing(state.analysis, state.request.budget.device_profile)
            plan.setdefault("summary", {})["loads_led_by_time"] = lead_by_time(plan, state.analysis, timing)
    return state


def copy_mode(request: PlanRequest) -> str:
    """How the plan's copies run: the request's mode, in line on a provider without streams (WebGPU)."""
    if request.copies == "streams" and not runs_copy_streams(request.select.device):
        return "inline"
    return request.copies


def _events(state: Planning) -> Planning:
    plan = state.plan
    assert plan is not None
    mode = copy_mode(state.request)
    events: dict[str, Any] = {"copies": mode}
    if mode == "streams":  # a gate before each H2D, and after each D2H a gate and the fence compute waits at
        d2hs = sum(off["kind"] == "activation" for off in plan["offloads"])
        events["gates"] = sum(len(off["reload_groups"]) for off in plan["offloads"]) + d2hs
        events["fences"] = d2hs
    plan.setdefault("summary", {})["events"] = events
    return state


def _pins(state: Planning) -> Planning:
    plan = state.plan
    assert plan is not None
    if not is_rewritten(state.analysis):  # (a model with copies already gets none)
        record_pins(plan, pin_layout(plan, state.analysis))  # apply builds them without shape inference
    return state


SELECT = Pass(
    name="selecting",
    seed="GenerateParameterOperations, GenerateActivationOperations",
    reads=("analysis", "request"),
    writes=("selection",),
    ensures=("selection",),
    in_place=False,
    run=_select,
)
FILTER = Pass(
    name="filtering",
    seed="OffloadInfoFilterByNumber (or a budget, or a slowdown)",
    reads=("analysis", "request", "progress", "selection"),
    writes=("plan", "simulation"),
    requires=("selection",),
    ensures=("plan",),
    in_place=False,
    run=_filter,
    describe=lambda state: _filtering(state.request),
)
PREFETCH = Pass(
    name="scheduling",
    seed="AdjustHyperOffloadNodePosition",
    reads=("analysis", "request", "plan"),
    writes=("plan",),
    requires=("plan",),
    in_place=True,
    run=_prefetch,
)
EVENTS = Pass(
    name="placing the events",
    seed="AddEventNodes",
    reads=("request", "plan"),
    writes=("plan",),
    requires=("plan",),
    in_place=True,
    run=_events,
)
PINS = Pass(
    name="pinning the copies",
    seed="BuildExecutionOrder",
    reads=("analysis", "plan"),
    writes=("plan",),
    requires=("plan",),
    in_place=True,
    run=_pins,
)

#: the plan's passes, HyperOffload's ``Run()`` in its order
PIPELINE: tuple[Pass, ...] = (SELECT, FILTER, PREFETCH, EVENTS, PINS)
#: the passes that make the scheduled plan, in order (the planner's plan alone, `offloadctl.planning.make`)
PLANNER_PASSES: tuple[Pass, ...] = PIPELINE[:3]
