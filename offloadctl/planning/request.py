"""The planning options: one typed request made of a part per stage, each option spelled once, checked once.

A stage reads its part: `SelectPart` (select), `FilterPart` (filter), `PrefetchPart` (prefetch),
`BudgetPart` (the budget planner and the trade-off). `PlanRequest` holds the four as fields
(``request.select``, ``request.filter``, ``request.prefetch``, ``request.budget``): what ``offloadctl
plan`` and `offloadctl.make_plan` take; `FilterRequest` holds the three the budget filter reads of a
selected plan. Each part checks its own rules when it is made, so a part that exists is valid; a
broken rule raises `RequestError`, which the command line reports as a usage error (exit 2).

A part holds values, not text: bytes as ints, patterns as tuples, the device profile as a loaded
`offloadctl.simulation.profiles.Profile` (None: the default one). `PlanRequest.of_options` reads the
flat keywords the Python API takes (``budget="1.5GiB"``, ``profile="ascend-910b"``) into the parts.
What a device runs on the host is one value, `offloadctl.loading.placed.HostPlacement`
(``request.select.host``). Progress is not an option: it is its own argument (`Progress`).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from offloadctl.core.errors import OffloadError
from offloadctl.core.units import parse_bytes
from offloadctl.loading.placed import NO_HOST, HostPlacement, device_name
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
    "NO_PROGRESS",
    "BudgetPart",
    "FilterPart",
    "FilterRequest",
    "PlanRequest",
    "Progress",
    "PrefetchPart",
    "RequestError",
    "SelectPart",
    "device_profile",
    "runs_copy_streams",
    "option",
    "option_fields",
    "profile_for",
    "recorded",
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


def device_profile(profile: Profile | str | Path | None, device: str | None = None) -> Profile:
    """The profile a request is estimated on, loaded: ``profile`` (a `Profile`, a bundled profile's name
    or a JSON file), else the bundled profile of the device a plan is made for (`profile_for`)."""
    if isinstance(profile, Profile):
        return profile
    return load_profile(profile_for(None if profile is None else str(profile), device))


def _at_least(name: str, value: int, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise RequestError(f"{name} must be an integer >= {low}, not {value!r}", hint=f"give {name}={low} or more")


def _byte_count(name: str, value: int | None) -> None:
    """``value``, a number of bytes (None: not given); text is read where the options are (`PlanRequest.of_options`)."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise RequestError(
            f"{name} must be a number of bytes >= 0, not {value!r}",
            hint=f'give {name}=65536, or PlanRequest.of_options({name}="64KiB") to read it from text',
        )


def _patterns(name: str, value: tuple[str, ...]) -> None:
    if not isinstance(value, tuple) or not all(isinstance(v, str) for v in value):
        raise RequestError(f"{name} must be a tuple of glob patterns, not {value!r}", hint=f'give {name}=("*w*",)')


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
            whose profile was measured above ``--opt-level disable`` takes them from the profile
            (`PlanRequest.selecting`).
        host: where the device the plan is made for (``plan --device``) runs the graph
            (`offloadctl.loading.placed.HostPlacement`): the tensors its host nodes make or read are
            not offloaded unless forced (they are not on the device there), and the plan's figures
            count the copies and Casts onnxruntime inserts there (`offloadctl.loading.placed`).
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
    host: HostPlacement = field(default=NO_HOST, metadata={"cli": False})

    def __post_init__(self) -> None:
        _at_least("select_distance", self.select_distance, 0)
        for name in ("force", "never", "fused"):
            _patterns(name, getattr(self, name))

    @classmethod
    def of_record(cls, recorded: Mapping[str, Any]) -> SelectPart:
        """The select options a plan records (``options.select``, `recorded`)."""
        host = HostPlacement.of_record(recorded)
        names = {f.name for f in dataclasses.fields(cls)} - {"host"}
        values: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in recorded.items() if k in names}
        return cls(**values, host=host)

    @property
    def device(self) -> str:
        """The device the plan is made for (``plan --device``), without how its host nodes were found;
        ``""`` for none."""
        return self.host.name


def runs_copy_streams(device: str) -> bool:
    """Whether ``device``'s provider runs copies on a stream of their own: every one but WebGPU, which
    registers no streams (its copies run in line)."""
    return device_name(device) != "webgpu"


@dataclass(frozen=True, kw_only=True)
class FilterPart:
    """The filter stage's options.

    Attributes:
        select_num: keep at most this many offloads, in first-use order (the distance planner).
        min_bytes: drop candidates smaller than this many bytes. None: none for the distance plan
            (HyperOffload's exact semantics), and for a budget or a slowdown the smallest copy worth its
            cost (`offloadctl.planning.budget.candidates.copy_floor`).
    """

    select_num: int = option(DEFAULT_SELECT_NUM, "Keep at most this many offloads, in first-use order.", "count")
    min_bytes: int | None = option(
        None,
        "Drop candidates smaller than this (accepts 4096, 64KiB, 1MB). Default: none for the distance plan "
        "(HyperOffload's exact semantics); with --budget or --max-slowdown, the smallest copy worth its cost "
        "(the lesser of what the profile's link moves in one copy's fixed time and 0.1% of the peak).",
        "bytes",
        shown="auto",
    )

    def __post_init__(self) -> None:
        _at_least("select_num", self.select_num, 0)
        _byte_count("min_bytes", self.min_bytes)

    @property
    def min_size(self) -> int:
        """``min_bytes`` in bytes (0 when it was not given)."""
        return self.min_bytes or 0


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
        budget: peak device memory to fit, in bytes.
        stream_weights: keep weights on the host and stream them in by layer group.
        stream_depth: with ``stream_weights``, how many layer groups ahead weights come in.
        objective: what the budget search minimises: ``"bytes"`` moved, ``"time"`` the copies add
            on ``profile``, or a `offloadctl.simulation.costs.CopyCost`; None: time with a measured
            profile, bytes otherwise.
        profile: the device profile of time objectives and estimates, loaded by the caller
            (`device_profile`); None: the default one.
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
    budget: int | None = option(
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
    profile: Profile | None = option(
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

    def __post_init__(self) -> None:
        self._check_values()
        self._check_alternatives()
        if self.objective is not None and self.objective not in ("bytes", "time"):
            if not isinstance(self.objective, CopyCost):
                raise RequestError(f"unknown objective {self.objective!r}", hint="use 'bytes' or 'time'")
        if self.optimal and not linear_objective(self.search_objective, self.copies):
            message, fix = optimal_refusal(" (the default with a measured profile)" if self.objective is None else "")
            raise RequestError(message, hint=fix)

    def _check_values(self) -> None:
        """Each option's value on its own: the budget in bytes, a known strategy and copy mode, a loaded
        profile, a depth and a time limit in range."""
        _byte_count("budget", self.budget)
        if self.strategy not in (None, "distance", "budget", "frontier"):
            raise RequestError(f"unknown strategy {self.strategy!r}", hint="use 'distance' or 'budget'")
        if self.copies not in COPY_MODES:
            raise RequestError(f"unknown copy mode {self.copies!r}", hint=f"use one of {', '.join(COPY_MODES)}")
        if self.profile is not None and not isinstance(self.profile, Profile):
            raise RequestError(
                f"the profile must be loaded, not {self.profile!r}",
                hint="give device_profile(NAME_OR_FILE), or PlanRequest.of_options(profile=...) to load it",
            )
        _at_least("stream_depth", self.stream_depth, 0)
        if not (math.isfinite(self.time_limit) and self.time_limit > 0):
            raise RequestError(
                f"the exact search's time limit {self.time_limit} is not a finite number of seconds above 0",
                hint="for example --time-limit 60",
            )

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
    def device_profile(self) -> Profile:
        """``profile``, or the default profile when none was given."""
        return self.profile if self.profile is not None else device_profile(None)

    @property
    def search_objective(self) -> str | CopyCost:
        """What the budget search minimises: ``objective``, or the profile's default without one."""
        return self.objective if self.objective is not None else default_objective(self.device_profile)

    @property
    def objective_name(self) -> str:
        """The search objective's name (``bytes`` or ``time``), a cost object's own when one was given."""
        objective = self.search_objective
        return objective.objective if isinstance(objective, CopyCost) else str(objective)

    @property
    def objective_defaulted(self) -> bool:
        """True when the search objective is the profile's default rather than one asked for."""
        return self.objective is None


@dataclass(frozen=True)
class Progress:
    """Where a long piece of work says what it is doing: ``step``, called with the name of each stage as
    it starts (``step("scheduling")``), and with ``new=False`` for news from a long search. Not an
    option: the planner takes it as an argument of its own (`NO_PROGRESS`: say nothing)."""

    step: Callable[..., None] | None = field(default=None, compare=False, repr=False)

    def report(self, text: str, new: bool = True) -> None:
        """Tell ``step`` (when given) what is happening."""
        if self.step is not None:
            self.step(text, new=new)


#: progress that says nothing
NO_PROGRESS = Progress()


@dataclass(frozen=True, kw_only=True)
class FilterRequest:
    """What the budget filter reads of a selected plan (its select options are the plan's own): the
    filter's, the budget planner's, and the prefetch distances it plans for."""

    filter: FilterPart = FilterPart()
    budget: BudgetPart = BudgetPart()
    prefetch: PrefetchPart = PrefetchPart()


@dataclass(frozen=True, kw_only=True)
class PlanRequest(FilterRequest):
    """Every planning option, a part per stage: what ``offloadctl plan`` and `offloadctl.make_plan` take.
    Each part was checked when it was made; `of_options` makes a request from flat keywords."""

    select: SelectPart = SelectPart()

    def __post_init__(self) -> None:
        for name, part in _PARTS.items():
            if not isinstance(getattr(self, name), part):
                raise TypeError(
                    f"PlanRequest.{name} is a {part.__name__}, not {getattr(self, name)!r}: "
                    f"flat options such as {name}=... go to PlanRequest.of_options"
                )

    @classmethod
    def of_options(cls, *, device: str | None = None, **options: Any) -> PlanRequest:
        """The request of the flat keywords the Python API takes, each a field of one part (documented
        there): bytes as numbers or text (``budget="1.5GiB"``), patterns as any sequence, ``profile`` as
        a `Profile`, a bundled profile's name or a JSON file (without one, that of ``device``, the device
        the plan is made for: `DEVICE_PROFILES`), ``host`` a `HostPlacement`.

        Raises:
            TypeError: an option no part has.
            RequestError: a value out of range, or options that do not go together.
        """
        parts: dict[str, dict[str, Any]] = {name: {} for name in _PARTS}
        for key, value in options.items():
            name = _PART_OF.get(key)
            if name is None:  # as a constructor says it
                raise TypeError(f"PlanRequest.of_options() got an unexpected keyword argument {key!r}")
            parts[name][key] = _read(key, value)
        parts["budget"]["profile"] = device_profile(options.get("profile"), device)
        return cls(**{name: _PARTS[name](**values) for name, values in parts.items()})

    @property
    def selecting(self) -> SelectPart:
        """The select options as the select stage reads them: with a profile measured at a level that
        fuses, and no fused tensors given, those the profile's fusions take in."""
        measured = self.budget.device_profile.measured
        if self.select.fused or measured is None or not measured.fused:
            return self.select
        return dataclasses.replace(self.select, fused=tuple(sorted(measured.fused)))

    @property
    def copies(self) -> str:
        """How the plan's copies run (``budget.copies``), a rule every stage after the filter reads."""
        return self.budget.copies

    def with_copies(self, copies: str) -> PlanRequest:
        """This request with its copies run ``copies``."""
        return dataclasses.replace(self, budget=dataclasses.replace(self.budget, copies=copies))

    def with_host(self, host: HostPlacement) -> PlanRequest:
        """This request for a plan made for the device ``host`` describes."""
        return dataclasses.replace(self, select=dataclasses.replace(self.select, host=host))


_PARTS: dict[str, type] = {"select": SelectPart, "filter": FilterPart, "prefetch": PrefetchPart, "budget": BudgetPart}
_PART_OF = {f.name: name for name, part in _PARTS.items() for f in dataclasses.fields(part)}


def option_fields() -> list[dataclasses.Field[Any]]:
    """Every part's fields that are options (``offloadctl plan``'s), in the parts' order."""
    return [f for part in _PARTS.values() for f in dataclasses.fields(part) if "kind" in f.metadata]


def _read(key: str, value: Any) -> Any:
    """A flat keyword's value as its part holds it: text bytes read, sequences as tuples."""
    if key in ("budget", "min_bytes") and isinstance(value, str):
        return parse_bytes(value)
    if key in ("force", "never", "fused") and isinstance(value, Sequence) and not isinstance(value, str):
        return tuple(value)
    return value


def recorded(part: Any) -> dict[str, Any]:
    """The options of one part, as a plan records them (``options.select`` ...): lists for tuples; a
    field marked ``omit_empty`` only when it holds something; the host placement as its entries
    (`offloadctl.loading.placed.HostPlacement.record`)."""
    options: dict[str, Any] = {}
    for f in dataclasses.fields(part):
        value = getattr(part, f.name)
        if isinstance(value, HostPlacement):
            options.update(value.record())
        elif value or not f.metadata.get("omit_empty"):
            options[f.name] = list(value) if isinstance(value, tuple) else value
    return options
