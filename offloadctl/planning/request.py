"""The planning options: one typed request, a part per stage, each option spelled once, checked once.

A stage reads its part: `SelectPart` (select), `FilterPart` (filter), `PrefetchPart` (prefetch),
`BudgetPart` (the budget planner and the trade-off). `PlanRequest` is all four together, what
``offloadctl plan`` and `offloadctl.make_plan` take; being each of its parts, it is handed to
every stage as it is. Every rule that combines options lives in the parts' ``__post_init__``,
so a request that exists is valid; a broken rule raises `RequestError`, which the command line
reports as a usage error (exit 2).

`taking` lets a function of an options object take the options as keyword arguments too, typed
from the options class itself (`select(analysis, select_distance=1)` is `select.run(analysis,
SelectPart(select_distance=1))`), so no function spells the options out again.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, ParamSpec, TypeVar

from offloadctl.core.errors import OffloadError
from offloadctl.core.units import parse_bytes
from offloadctl.loading.placed import HostCast, host_casts
from offloadctl.simulation.costs import (
    COPY_MODES,
    OBJECTIVES,
    STREAMS_NOTE,
    CopyCost,
    default_objective,
    linear_objective,
    optimal_refusal,
)
from offloadctl.simulation.profiles import DEFAULT_PROFILE, Profile, list_profiles, load_profile

__all__ = [
    "DEFAULT_MIN_BYTES",
    "DEFAULT_PREFETCH_DISTANCE",
    "DEFAULT_RELEASE_DISTANCE",
    "DEFAULT_SELECT_DISTANCE",
    "DEFAULT_SELECT_NUM",
    "DEFAULT_STREAM_DEPTH",
    "DEFAULT_TIME_LIMIT",
    "DEVICE_PROFILES",
    "BudgetPart",
    "FilterPart",
    "FilterRequest",
    "PlanRequest",
    "Progress",
    "PrefetchPart",
    "RequestError",
    "SelectPart",
    "WithOptions",
    "WithOptions2",
    "device_name",
    "runs_copy_streams",
    "evolve",
    "option",
    "profile_for",
    "recorded",
    "taking",
    "taking2",
]

logger = logging.getLogger(__name__)

# MindSpore's defaults (select distance 100, select num 100, prefetch distance 50, release distance 0)
DEFAULT_SELECT_DISTANCE = 100
DEFAULT_SELECT_NUM = 100
DEFAULT_MIN_BYTES = 0
DEFAULT_PREFETCH_DISTANCE = 50
DEFAULT_RELEASE_DISTANCE = 0
DEFAULT_STREAM_DEPTH = 1  # layer groups copied in ahead with --stream-weights
DEFAULT_TIME_LIMIT = 60.0  # seconds the exact search may take

#: The bundled profile a plan made for a device (``plan --device``) is estimated on when none is given:
#: a generic GPU on a PCIe 4.0 x16 link for CUDA and WebGPU, the Ascend NPU for CANN
DEVICE_PROFILES = {"cuda": "pcie-gen4-x16", "webgpu": "pcie-gen4-x16", "ascend": DEFAULT_PROFILE}


def profile_for(profile: str | None, device: str | None) -> str:
    """The profile to estimate on: ``profile`` when given, else that of the device a plan is made for
    (`DEVICE_PROFILES`; ``device`` as ``plan --device`` names it, None for none), else the default."""
    if profile is not None:
        return profile
    return DEVICE_PROFILES.get(device, DEFAULT_PROFILE) if device is not None else DEFAULT_PROFILE


class RequestError(OffloadError):
    """Options that do not go together, or a value out of range: a usage error."""


def option(default: Any, help: str, kind: str, **cli: Any) -> Any:
    """A part's field that is a command-line option, written once: its default, its help and its kind
    (``count``, ``bytes``, ``switch``, ``flag``, ``patterns``, ``choice``, ``seconds``, ``factor``,
    ``profile``), from which `offloadctl.cli.options.part_options` builds the option; ``cli`` adds
    ``choices``, and ``shown``, the default the option shows when the field's is None."""
    return field(default=default, metadata={"help": help, "kind": kind, **cli})


def _set(part: Any, name: str, value: Any) -> None:
    object.__setattr__(part, name, value)  # a frozen dataclass normalising its own fields


@dataclass(frozen=True, kw_only=True)
class SelectPart:
    """The select stage's options.

    Attributes:
        select_distance: a gap between uses must be larger than this to open a reload group.
        activations: consider node outputs.
        params: consider weights (initializers, Constant nodes): they stay on the host.
        force: glob patterns of tensors to offload even without a long gap.
        never: glob patterns of tensors never to offload (wins over ``force``).
        fused: tensors onnxruntime's graph optimizations take in at the level the model is served at
            (a measured profile's ``fused``); they are not offloaded unless forced. A `PlanRequest`
            whose profile was measured above ``--opt-level disable`` takes them from the profile.
        host_nodes: nodes onnxruntime runs on the CPU on the device the plan is for (``plan
            --device``, `offloadctl.running.placement.host_nodes`); the tensors they make or read are
            not offloaded unless forced: they are not on the device there.
        host_device: the device ``host_nodes`` were found for, and how (``webgpu (measured)``).
        host_copies: the tensors onnxruntime copies between host and device memory there (found
            with ``host_nodes``): with them the plan's figures count the graph as that device runs it
            (`offloadctl.loading.placed`).
        host_casts: the Casts onnxruntime inserts there around float16 nodes the CPU has no float16
            kernel for (`offloadctl.loading.placed.HostCast`; found with ``host_nodes``): the figures
            count them too.
    """

    select_distance: int = option(
        DEFAULT_SELECT_DISTANCE,
        "A tensor is offloaded across gaps between uses larger than this many positions.",
        "count",
    )
    activations: bool = option(True, "Consider node outputs.", "switch")
    params: bool = option(
        False, "Consider weights (initializers, Constant nodes): they stay on the host and are streamed in.", "switch"
    )
    force: tuple[str, ...] = option((), "Offload tensors matching this glob even without a long gap.", "patterns")
    never: tuple[str, ...] = option((), "Never offload tensors matching this glob.", "patterns")
    fused: tuple[str, ...] = field(default=(), metadata={"omit_empty": True, "cli": False})
    host_nodes: tuple[str, ...] = field(default=(), metadata={"omit_empty": True, "cli": False})
    host_device: str = field(default="", metadata={"omit_empty": True, "cli": False})
    host_copies: tuple[str, ...] = field(default=(), metadata={"omit_empty": True, "cli": False})
    host_casts: tuple[HostCast, ...] = field(default=(), metadata={"omit_empty": True, "cli": False})

    @classmethod
    def of(cls, request: SelectPart, **changes: Any) -> SelectPart:
        """The select options alone, from any request that holds them, with ``changes``: checked, but
        none of the request's other parts (its profile is not read again)."""
        fields = {f.name: getattr(request, f.name) for f in dataclasses.fields(SelectPart) if f.init}
        return SelectPart(**{**fields, **changes})

    def __post_init__(self) -> None:
        _set(self, "force", tuple(self.force))
        _set(self, "never", tuple(self.never))
        _set(self, "fused", tuple(self.fused))
        _set(self, "host_nodes", tuple(self.host_nodes))
        _set(self, "host_copies", tuple(self.host_copies))
        _set(self, "host_casts", host_casts(self.host_casts))
        _at_least("select_distance", self.select_distance, 0)

    @property
    def device(self) -> str:
        """The device the plan is made for (``plan --device``), without how its host nodes were found;
        ``""`` for none."""
        return device_name(self.host_device)


def runs_copy_streams(device: str) -> bool:
    """Whether ``device``'s provider runs copies on a stream of their own: every one but WebGPU, which
    registers no streams (its copies run in line)."""
    return device_name(device) != "webgpu"


def device_name(host_device: str) -> str:
    """The device of a ``host_device`` record (``webgpu (measured)`` -> ``webgpu``); ``""`` for none."""
    return host_device.split(maxsplit=1)[0] if host_device else ""


@dataclass(frozen=True, kw_only=True)
class FilterPart:
    """The filter stage's options.

    Attributes:
        select_num: keep at most this many offloads, in first-use order (the distance planner).
        min_bytes: drop candidates smaller than this (bytes, or text such as ``"64KiB"``). None: none
            for the distance plan (HyperOffload's exact semantics), and for a budget or a slowdown the
            smallest copy worth its cost (`offloadctl.planning.budget.candidates.copy_floor`).
    """

    select_num: int = option(DEFAULT_SELECT_NUM, "Keep at most this many offloads, in first-use order.", "count")
    min_bytes: int | str | None = option(
        None,
        "Drop candidates smaller than this (accepts 4096, 64KiB, 1MB). Default: none for the distance plan "
        "(HyperOffload's exact semantics); with --budget or --max-slowdown, the smallest copy worth its cost "
        "(the lesser of what the profile's link moves in one copy's fixed time and 0.1% of the peak).",
        "bytes",
        shown="auto",
    )

    def __post_init__(self) -> None:
        _at_least("select_num", self.select_num, 0)
        if self.min_bytes is not None:
            _set(self, "min_bytes", _bytes("min_bytes", self.min_bytes))

    @property
    def min_size(self) -> int:
        """``min_bytes`` in bytes (0 when it was not given)."""
        return int(self.min_bytes or 0)


@dataclass(frozen=True, kw_only=True)
class PrefetchPart:
    """The prefetch stage's options.

    Attributes:
        prefetch_distance: each host-to-device copy runs this many positions before its first use. With
            copies on streams a distance plan's copy runs at least this early, earlier where it needs the
            time to hide behind compute and the peak holds (`offloadctl.planning.prefetch.lead_by_time`);
            a budget plan's at most this early, as early as it needs.
        release_distance: positions after the last device use before an offloaded buffer is reused.
    """

    prefetch_distance: int = option(
        DEFAULT_PREFETCH_DISTANCE,
        "Move each host-to-device copy this many positions before its first use (with --copies streams: at least "
        "this early for a distance plan, earlier where the copy needs the time and the peak holds; at most this "
        "early for a budget plan).",
        "count",
    )
    release_distance: int = option(
        DEFAULT_RELEASE_DISTANCE,
        "Positions after the last device use before an offloaded buffer may be reused.",
        "count",
    )

    def __post_init__(self) -> None:
        _at_least("prefetch_distance", self.prefetch_distance, 0)
        _at_least("release_distance", self.release_distance, 0)


def _refuse_any(checks: Sequence[tuple[bool, str]], hint: str) -> None:
    """Raise the first of ``checks`` ((given, why)) that is given."""
    for given, why in checks:
        if given:
            raise RequestError(why, hint=hint)


@dataclass(frozen=True, kw_only=True)
class BudgetPart:
    """The budget planner's options (and the trade-off's, ``max_slowdown``).

    Attributes:
        strategy: ``"distance"`` (HyperOffload's) or ``"budget"``; None picks budget when a budget,
            weight streaming or a slowdown limit is asked for. ``"frontier"`` asks for budget plans
            at every budget from the peak down to the lower bound (`offloadctl.planning.tradeoff`,
            ``offloadctl frontier``), not for one plan.
        budget: peak device memory to fit, in bytes or as text (``"1.5GiB"``).
        stream_weights: keep weights on the host and stream them in by layer group.
        stream_depth: with ``stream_weights``, how many layer groups ahead weights come in.
        objective: what the budget search minimises: ``"bytes"`` moved, ``"time"`` the copies add
            on ``profile``, or a `offloadctl.simulation.costs.CopyCost`; None: time with a measured
            profile, bytes otherwise.
        profile: the device profile (name, file or `Profile`) of time objectives and estimates.
        copies: ``"inline"`` (copies on the compute stream, what onnxruntime runs) or ``"streams"``
            (an estimate for copy streams): what the time objective and ``max_slowdown`` estimate.
        optimal: also solve the exact covering program (HiGHS) from the greedy's plan.
        time_limit: seconds the exact program may take.
        max_slowdown: instead of a budget, the largest cut in peak memory whose estimated time
            stays within this multiple of the baseline.
    """

    strategy: str | None = option(
        None,
        "distance: HyperOffload's rule (the default); budget: fit --budget at the least bytes moved.",
        "choice",
        choices=("distance", "budget"),
    )
    budget: int | str | None = option(
        None, "Peak device memory to fit (accepts 1.5GiB, 800MB); implies --strategy budget.", "bytes"
    )
    stream_weights: bool = option(
        False, "Keep weights on the host and stream them in by layer group (implies --strategy budget).", "flag"
    )
    stream_depth: int = option(
        DEFAULT_STREAM_DEPTH, "With --stream-weights: how many layer groups ahead weights are copied in.", "count"
    )
    objective: str | CopyCost | None = option(
        None,
        "What the budget strategy minimises: bytes moved, or the estimated time the copies add on --profile under "
        "--copies. Default: time with a measured profile (offloadctl profile), bytes otherwise.",
        "choice",
        choices=OBJECTIVES,
    )
    profile: Profile | str | None = option(
        None,
        f"Device profile for the time estimate: {', '.join(list_profiles())}, or a JSON file of your own.",
        "profile",
        shown=f"{DEFAULT_PROFILE}, or a plan's device's: pcie-gen4-x16 for --device cuda and webgpu",
    )
    copies: str = option(
        "inline",
        "How copies run in the time estimates: inline on the compute stream (what onnxruntime runs today), or on "
        f"separate copy streams, hidden behind compute where the window allows ({STREAMS_NOTE}).",
        "choice",
        choices=COPY_MODES,
    )
    optimal: bool = option(
        False, "Also solve the exact program (HiGHS) from the greedy's plan; the plan records the proven gap.", "flag"
    )
    time_limit: float = option(
        DEFAULT_TIME_LIMIT,
        "With --optimal: stop the exact search after this long and keep the best plan found.",
        "seconds",
    )
    max_slowdown: float | None = option(
        None,
        "Instead of --budget: the largest cut in peak memory whose estimated time (--copies, --profile) stays within X "
        "times the baseline, e.g. 1.05.",
        "factor",
    )
    # resolved when the options are checked (the fields above keep what was asked for)
    _profile: Profile | None = field(default=None, init=False, repr=False, compare=False)
    _objective: str | CopyCost | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._check_values()
        self._check_alternatives()
        profile = self.profile if isinstance(self.profile, Profile) else load_profile(self.profile or DEFAULT_PROFILE)
        _set(self, "_profile", profile)
        defaulted = self.objective is None
        if self.objective is not None and self.objective not in ("bytes", "time"):
            if not isinstance(self.objective, CopyCost):
                raise RequestError(f"unknown objective {self.objective!r}", hint="use 'bytes' or 'time'")
        objective = default_objective(profile) if defaulted else self.objective
        assert objective is not None
        _set(self, "_objective", objective)
        if self.optimal and not linear_objective(objective, self.copies):
            message, fix = optimal_refusal(" (the default with a measured profile)" if defaulted else "")
            raise RequestError(message, hint=fix)

    def _check_values(self) -> None:
        """Each option's value on its own: the budget in bytes, a known strategy and copy mode, a depth
        and a time limit in range."""
        if self.budget is not None:
            _set(self, "budget", _bytes("budget", self.budget))
        if self.strategy not in (None, "distance", "budget", "frontier"):
            raise RequestError(f"unknown strategy {self.strategy!r}", hint="use 'distance' or 'budget'")
        if self.copies not in COPY_MODES:
            raise RequestError(f"unknown copy mode {self.copies!r}", hint=f"use one of {', '.join(COPY_MODES)}")
        _at_least("stream_depth", self.stream_depth, 0)
        if not (math.isfinite(self.time_limit) and self.time_limit > 0):
            raise RequestError(
                f"the exact search's time limit {self.time_limit} is not a finite number of seconds above 0",
                hint="for example --time-limit 60",
            )

    def for_device(self, device: str | None) -> BudgetPart:
        """These options for a plan made for ``device`` (``plan --device``): without a profile of their
        own, estimated on the device's bundled one (`DEVICE_PROFILES`)."""
        if device is None or self.profile is not None:
            return self
        return dataclasses.replace(self, profile=profile_for(None, device))

    def _check_alternatives(self) -> None:
        if self.strategy == "frontier":
            _refuse_any(
                (
                    (self.budget is not None, "a frontier sweeps every budget: drop --budget"),
                    (self.stream_weights, "a frontier sweeps budget plans: drop --stream-weights"),
                    (self.optimal, "a frontier sweeps budgets with the greedy: drop --optimal"),
                    (self.max_slowdown is not None, "a frontier shows every slowdown: drop --max-slowdown"),
                ),
                "offloadctl frontier MODEL [--objective ...] [--params]",
            )
            return
        if self.max_slowdown is not None:
            if not (math.isfinite(self.max_slowdown) and self.max_slowdown >= 1):
                raise RequestError(
                    f"--max-slowdown {self.max_slowdown} is not a finite number of at least 1",
                    hint="give 1.05 for at most 5% slower",
                )
            _refuse_any(
                (
                    (self.budget is not None, "--max-slowdown and --budget are alternatives: give one of them"),
                    (self.stream_weights, "--max-slowdown chooses what to offload itself: drop --stream-weights"),
                    (self.strategy == "distance", "--max-slowdown needs the budget strategy, not --strategy distance"),
                    (
                        self.optimal,
                        "--optimal needs --budget BYTES; --max-slowdown searches many budgets with the greedy",
                    ),
                ),
                "give either --max-slowdown X or --budget BYTES",
            )
            return
        self._check_budget_options()

    def _check_budget_options(self) -> None:
        """The options of a budget (or distance) request that need one another."""
        if self.strategy == "distance" and (self.budget is not None or self.stream_weights):
            raise RequestError(
                "--budget and --stream-weights need the budget strategy, not --strategy distance",
                hint="drop --strategy distance (or the budget)",
            )
        if self.strategy == "budget" and self.budget is None and not self.stream_weights:
            raise RequestError(
                "--strategy budget needs --budget BYTES (or --stream-weights, or --max-slowdown X)",
                hint="give --budget BYTES",
            )
        if self.optimal and self.budget is None:
            raise RequestError(
                "--optimal needs --budget BYTES (it finds the cheapest plan that fits the budget)",
                hint="give --budget BYTES",
            )
        if self.objective is not None and not self.uses_budget:
            raise RequestError(
                "--objective is the budget strategy's: give --budget BYTES (or --stream-weights, --max-slowdown)",
                hint="drop --objective, or give a budget",
            )

    @property
    def uses_budget(self) -> bool:
        """True when the budget planner (or the trade-off) makes the plan."""
        return (
            self.strategy == "budget" or self.budget is not None or self.stream_weights or self.max_slowdown is not None
        )

    @property
    def budget_bytes(self) -> int | None:
        """``budget`` in bytes."""
        return None if self.budget is None else int(self.budget)

    @property
    def device_profile(self) -> Profile:
        """``profile``, loaded (the default profile when none was given)."""
        assert self._profile is not None  # loaded in __post_init__
        return self._profile

    @property
    def search_objective(self) -> str | CopyCost:
        """What the budget search minimises: ``objective``, or the profile's default without one."""
        assert self._objective is not None  # resolved in __post_init__
        return self._objective

    @property
    def objective_name(self) -> str:
        """The search objective's name (``bytes`` or ``time``), a cost object's own when one was given."""
        objective = self.search_objective
        return objective.objective if isinstance(objective, CopyCost) else str(objective)

    @property
    def objective_defaulted(self) -> bool:
        """True when the search objective is the profile's default rather than one asked for."""
        return self.objective is None


@dataclass(frozen=True, kw_only=True)
class Progress:
    """``step``, which is not an option: called with the name of each stage as it starts
    (``step("scheduling")``), and with ``new=False`` for news from a long search."""

    step: Callable[..., None] | None = field(default=None, compare=False, repr=False)

    def report(self, text: str, new: bool = True) -> None:
        """Tell ``step`` (when given) what is happening."""
        if self.step is not None:
            self.step(text, new=new)


Part = TypeVar("Part")


def _of_parts(cls: type[Part], parts: tuple[Any, ...], step: Callable[..., None] | None) -> Part:
    """An instance of ``cls`` holding the fields of ``parts`` (each already checked), not checked again:
    ``__post_init__`` does not run, so no part's rule runs twice and no profile is read twice."""
    made = object.__new__(cls)
    for part in parts:
        for f in dataclasses.fields(part):
            object.__setattr__(made, f.name, getattr(part, f.name))
    object.__setattr__(made, "step", step)
    return made


def evolve(request: Part, **changes: Any) -> Part:
    """A copy of a checked part or request with fields that no rule reads set (``step``, the progress
    callback; ``host_nodes``, ``host_copies``, ``host_casts`` and ``host_device``, what ``plan --device``
    finds), not checked again."""
    unchecked = {"step", "host_nodes", "host_copies", "host_casts", "host_device"}
    if not set(changes) <= unchecked:
        raise ValueError(f"evolve sets only {sorted(unchecked)}, not {sorted(set(changes) - unchecked)}")
    made = copy.copy(request)
    for name, value in changes.items():
        if name == "host_casts":
            value = host_casts(value)
        object.__setattr__(made, name, tuple(value) if name in ("host_nodes", "host_copies") else value)
    return made


@dataclass(frozen=True, kw_only=True)
class FilterRequest(FilterPart, BudgetPart, PrefetchPart, Progress):
    """What the filter stage takes with a budget (the select options are those of the selected plan):
    the budget planner's options, and the prefetch distances it plans for."""

    def __post_init__(self) -> None:
        FilterPart.__post_init__(self)
        PrefetchPart.__post_init__(self)
        BudgetPart.__post_init__(self)
        self._across_parts()

    @classmethod
    def of(
        cls,
        filtering: FilterPart,
        budgeting: BudgetPart,
        prefetching: PrefetchPart,
        *,
        step: Callable[..., None] | None = None,
    ) -> FilterRequest:
        """The request made of its parts, each checked when it was made: only the rules across parts run."""
        made = _of_parts(cls, (filtering, budgeting, prefetching), step)
        made._across_parts()
        return made

    def _across_parts(self) -> None:
        if self.uses_budget and self.select_num != DEFAULT_SELECT_NUM:
            logger.warning(
                "--select-num %d is not used by the budget strategy (it fits the budget instead)", self.select_num
            )


@dataclass(frozen=True, kw_only=True)
class PlanRequest(SelectPart, FilterRequest):
    """Every planning option (see each part), what ``offloadctl plan`` and `offloadctl.make_plan`
    take. A request is checked once, when it is made (from keywords, or with `of` from its parts)."""

    def __post_init__(self) -> None:
        SelectPart.__post_init__(self)
        FilterRequest.__post_init__(self)

    @classmethod
    def of(  # type: ignore[override]  # one part more than the filter request
        cls,
        selecting: SelectPart,
        filtering: FilterPart,
        budgeting: BudgetPart,
        prefetching: PrefetchPart,
        *,
        step: Callable[..., None] | None = None,
    ) -> PlanRequest:
        """The request made of its parts, each checked when it was made: only the rules across parts run."""
        made = _of_parts(cls, (selecting, filtering, budgeting, prefetching), step)
        made._across_parts()
        return made

    def _across_parts(self) -> None:
        FilterRequest._across_parts(self)
        measured = self.device_profile.measured
        if not self.fused and measured is not None and measured.fused:
            # a profile measured at a level that fuses: keep what those fusions take in
            _set(self, "fused", tuple(sorted(measured.fused)))


def recorded(part_type: type, request: Any) -> dict[str, Any]:
    """The options of one part, as a plan records them (``options.select`` ...): lists for tuples; a
    field marked ``omit_empty`` only when it holds something."""
    options: dict[str, Any] = {}
    for f in dataclasses.fields(part_type):
        value = getattr(request, f.name)
        if value or not f.metadata.get("omit_empty"):
            if isinstance(value, tuple):  # entries with a JSON form of their own (`HostCast`) take it
                value = [v.to_json() if hasattr(v, "to_json") else v for v in value]
            options[f.name] = value
    return options


def _at_least(name: str, value: int, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise RequestError(f"{name} must be an integer >= {low}, not {value!r}", hint=f"give {name}={low} or more")


def _bytes(name: str, value: int | str) -> int:
    if isinstance(value, str):
        return parse_bytes(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise RequestError(f"{name} must be a number of bytes >= 0, not {value!r}", hint=f'give {name}="64KiB"')
    return value


P = ParamSpec("P")
T = TypeVar("T")
X = TypeVar("X")
R = TypeVar("R")


class WithOptions(Generic[X, T, P, R]):
    """A function of ``(first, options)`` that also takes the options as keywords: ``f(first, **options)``
    builds the options object (so it is checked), ``f.run(first, options)`` takes one ready-made."""

    def __init__(self, options: Callable[P, T], function: Callable[[X, T], R]) -> None:
        self._options = options
        self.run = function
        self.__name__ = function.__name__
        self.__qualname__ = function.__qualname__
        self.__module__ = function.__module__
        self.__doc__ = function.__doc__
        first = next(iter(inspect.signature(function).parameters.values()))
        keywords = list(inspect.signature(options).parameters.values())
        self.__signature__ = inspect.Signature([first.replace(kind=first.POSITIONAL_ONLY), *keywords])

    def __call__(self, first: X, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.run(first, self._options(*args, **kwargs))


def taking(options: Callable[P, T]) -> Callable[[Callable[[X, T], R]], WithOptions[X, T, P, R]]:
    """Decorate ``function(first, options)`` so that it takes ``options``'s fields as keywords too."""

    def decorate(function: Callable[[X, T], R]) -> WithOptions[X, T, P, R]:
        return WithOptions(options, function)

    return decorate


# the keyword form of a function of two leading arguments (the budget filter: a plan and its analysis)
Y = TypeVar("Y")


class WithOptions2(Generic[X, Y, T, P, R]):
    """`WithOptions` for a function of ``(first, second, options)``."""

    def __init__(self, options: Callable[P, T], function: Callable[[X, Y, T], R]) -> None:
        self._options = options
        self.run = function
        self.__name__ = function.__name__
        self.__module__ = function.__module__
        self.__doc__ = function.__doc__

    def __call__(self, first: X, second: Y, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.run(first, second, self._options(*args, **kwargs))


def taking2(options: Callable[P, T]) -> Callable[[Callable[[X, Y, T], R]], WithOptions2[X, Y, T, P, R]]:
    """`taking` for a function of two leading arguments."""

    def decorate(function: Callable[[X, Y, T], R]) -> WithOptions2[X, Y, T, P, R]:
        return WithOptions2(options, function)

    return decorate
