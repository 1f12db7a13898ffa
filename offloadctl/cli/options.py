"""Option groups shared by several subcommands (defined once, reused).

A group of options reaches its command as one object in one keyword argument, rather than as one
argument per option: the planning stages' groups as the request parts the stages take
(`offloadctl.planning.request.SelectPart`, `FilterPart`, `PrefetchPart`, checked as they are made:
a broken rule is a usage error), and `BudgetPart`: one group per part, which the plan and filter commands put
together with `PlanRequest.of` and `FilterRequest.of` (each part checked once, when it is made);
the loading options as `ShapeOptions` and `SizesOptions`. Single options stay plain arguments.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import click

from offloadctl.analysis.order import EXECUTION_ORDERS
from offloadctl.cli.ui import BytesParam, FiniteFloatRange
from offloadctl.core.plantypes import SizesFromRun
from offloadctl.planning.request import (
    BudgetPart,
    FilterPart,
    PlanRequest,
    PrefetchPart,
    RequestError,
    SelectPart,
    device_profile,
)
from offloadctl.running.sessions import OPT_LEVELS

__all__ = [
    "ep_option",
    "inputs_option",
    "ShapeOptions",
    "SizesOptions",
    "sizes_option",
    "usage",
    "explain_option",
    "model_argument",
    "input_shape_option",
    "json_option",
    "max_peak_option",
    "report_option",
    "profile_option",
    "select_options",
    "filter_options",
    "budget_options",
    "filter_budget_options",
    "field_option",
    "part_options",
    "objective_option",
    "prefetch_options",
    "opt_level_option",
    "output_option",
    "plan_device_option",
    "plan_request",
    "strict_option",
]

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


def _compose(*decorators: Decorator) -> Decorator:
    def apply(f: Callable[..., Any]) -> Callable[..., Any]:
        for d in reversed(decorators):
            f = d(f)
        return f

    return apply


def _group(argument: str, options: type, *decorators: Decorator, make: Callable[..., Any] | None = None) -> Decorator:
    """Click options whose values reach the command as one ``options`` object, in ``argument`` (made by
    ``make`` from the options' values when given: what the group reads before its part holds it).

    The options keep their flags, help and order; the command's keyword arguments named after the
    dataclass's fields are replaced by the object (a field marked ``cli: False`` has no flag: it
    keeps its default, or what the request derives for it).
    """
    names = [f.name for f in dataclasses.fields(options) if f.init and f.metadata.get("cli", True)]
    # (a field without an option among ``decorators`` keeps its default: filter has no --max-slowdown)

    def apply(f: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(f)
        def command(*args: Any, **kwargs: Any) -> Any:
            values = {name: kwargs.pop(name) for name in names if name in kwargs}
            kwargs[argument] = usage(make or options, **values)
            return f(*args, **kwargs)

        return _compose(*decorators)(command)

    return apply


@dataclass(frozen=True)
class ShapeOptions:
    """``--input-shape`` and ``--dim`` as given (parsed when the model is loaded)."""

    input_shape: tuple[str, ...]
    dim: tuple[str, ...]


@dataclass(frozen=True)
class SizesOptions:
    """``--sizes-from-run`` and ``--inputs``: read every size from one run on onnxruntime's CPU provider."""

    sizes_from_run: bool
    inputs: str | None

    def request(self) -> SizesFromRun | None:
        """The `offloadctl.core.plantypes.SizesFromRun` record, or None to infer sizes (``--inputs`` implies
        ``--sizes-from-run``)."""
        if not self.sizes_from_run and self.inputs is None:
            return None
        return {"inputs": self.inputs, "seed": 0}


T = TypeVar("T")


def usage(make: Callable[..., T], /, **options: Any) -> T:
    """``make(**options)`` (a request or one of its parts), a broken rule reported as a usage error."""
    try:
        return make(**options)
    except RequestError as exc:
        raise click.UsageError(exc.message + (f" ({exc.hint})" if exc.hint else "")) from None


model_argument = click.argument("model", type=click.Path(dir_okay=True, path_type=str))

input_shape_option = _group(
    "shapes",
    ShapeOptions,
    click.option(
        "--input-shape",
        "input_shape",
        multiple=True,
        metavar="NAME=D0,D1,...",
        help="Pin every dimension of a graph input (repeatable); NAME:D0,D1,... and NAME:[D0,D1,...] work too. A "
        "NAME with * ? or [ ] that is no input's name pins every input it matches: 'past_key_values.*=1,4,127,16' "
        "pins each past input of a dynamo export, whose dimensions all have their own names.",
    ),
    click.option(
        "--dim",
        "dim",
        multiple=True,
        metavar="NAME=VALUE",
        help="Pin a named dynamic dimension wherever the inputs use it, e.g. --dim batch=1 (repeatable).",
    ),
)

inputs_option = click.option(
    "--inputs",
    "inputs",
    type=click.Path(path_type=str),
    default=None,
    metavar="FILE.npz|FOLDER",
    help="The model's inputs: an .npz file (numpy.savez), a folder of NAME.npy files, or an onnx test-data folder "
    "(input_0.pb, ...). run and profile: random inputs (seed 0, --seed) if omitted; the planning commands read "
    "every size from one run on them (implies --sizes-from-run).",
)

sizes_option = _group(
    "sizes",
    SizesOptions,
    click.option(
        "--sizes-from-run",
        is_flag=True,
        default=False,
        help="Read every tensor's size from one run on onnxruntime's CPU provider (inputs generated at the pinned "
        "shapes, or --inputs): exact where shape inference leaves sizes unknown. Takes one run's time and host memory.",
    ),
    inputs_option,
)

json_option = click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print one JSON document on stdout (figures, files written) and nothing else.",
)

ep_option = click.option(
    "--ep-option",
    "ep_option",
    multiple=True,
    metavar="KEY=VALUE",
    help="Execution provider option for CANN or CUDA (repeatable); overrides what the model's settings ask for "
    "(on CANN enable_cann_graph=0 and arena_extend_strategy=kSameAsRequested).",
)

max_peak_option = click.option(
    "--max-peak",
    type=BytesParam(),
    default=None,
    metavar="BYTES",
    help="A CI gate: exit 1 when the peak device memory (after the plan) is above this (accepts 1.5GiB, 800MB).",
)

report_option = click.option(
    "--report",
    type=click.Path(dir_okay=False, path_type=str),
    default=None,
    metavar="FILE.md",
    help="Write a Markdown report (peaks, lower bound, what moved and why, estimated time) with the "
    "timeline plot beside it (FILE.png).",
)


def opt_level_option(help: str) -> Decorator:
    """``--opt-level``: onnxruntime's graph optimization level, ``disable`` unless given."""
    return click.option(
        "--opt-level", type=click.Choice(list(OPT_LEVELS)), default="disable", show_default=True, help=help
    )


#: plan --device (offloadctl.running.residency.HOST_DEVICES; spelled here so the command line starts
#: without importing onnxruntime)
PLAN_DEVICES = ("webgpu", "cuda", "ascend")

plan_device_option = click.option(
    "--device",
    "device",
    type=click.Choice(PLAN_DEVICES),
    default=None,
    help="Plan for this device: the tensors that nodes it runs on the CPU make or read are kept (reason "
    "host-resident), and the peaks quoted are those of the model and its rewrite as that device runs them (the "
    "copies onnxruntime inserts, both providers' streams). Found with one run on the device where its provider "
    "runs here, predicted for cuda and ascend otherwise. Without --profile, the estimate takes the device's bundled "
    "profile: pcie-gen4-x16 for cuda and webgpu, ascend-910b for ascend.",
)


def output_option(what: str) -> Decorator:
    return click.option("-o", "--output", required=True, type=click.Path(path_type=str), help=f"Where to write {what}.")


def _kind(kind: str, f: dataclasses.Field[Any]) -> dict[str, Any]:
    """click's settings for a field of this kind (`offloadctl.planning.request.option`)."""
    if kind == "count":
        return {"type": click.IntRange(min=0), "show_default": True}
    if kind == "bytes":
        return {"type": BytesParam(), "show_default": f.metadata.get("shown", f.default is not None)}
    if kind in ("switch", "flag"):
        return {"show_default": kind == "switch"} if kind == "switch" else {"is_flag": True}
    if kind == "patterns":
        return {"multiple": True, "metavar": "PATTERN"}
    if kind == "choice":
        return {"type": click.Choice(list(f.metadata["choices"])), "show_default": f.default is not None}
    if kind == "seconds":
        return {"type": FiniteFloatRange(min=0, min_open=True), "show_default": True, "metavar": "SECONDS"}
    if kind == "factor":
        return {"type": FiniteFloatRange(min=1.0), "metavar": "X"}
    if kind == "profile":  # None: the default the request picks, which the field shows
        return {"show_default": f.metadata["shown"], "metavar": "NAME|FILE.json"}
    raise ValueError(f"unknown option kind {kind!r} of {f.name}")  # pragma: no cover - a field written wrong


def field_option(part: type, name: str) -> Decorator:
    """The command-line option of one field of a request part, built from the field itself: its
    default (or the one it shows), help and kind (`offloadctl.planning.request.option`)."""
    f = next(f for f in dataclasses.fields(part) if f.name == name)
    kind = f.metadata["kind"]
    flag = "--" + name.replace("_", "-")
    decls = [f"{flag}/--no-{name.replace('_', '-')}", name] if kind == "switch" else [flag, name]
    return click.option(*decls, default=f.default, help=f.metadata["help"], **_kind(kind, f))


def part_options(
    argument: str, part: type, *, leave_out: tuple[str, ...] = (), make: Callable[..., Any] | None = None
) -> Decorator:
    """One option group per request part: an option per field (`field_option`, in the fields' order;
    those in ``leave_out``, and fields that are no option, keep their defaults), reaching the command
    as the checked part, in ``argument`` (``make``: what builds it from the options, the part itself by
    default)."""
    names = [f.name for f in dataclasses.fields(part) if "kind" in f.metadata and f.name not in leave_out]
    return _group(argument, part, *(field_option(part, name) for name in names), make=make)


def _budget_part(*, profile: str | None = None, **options: Any) -> BudgetPart:
    """The budget part of ``--budget`` ... ``--profile``: the profile named or given as a file loaded here
    (an unknown one is an error naming it), None when not given (the default, or the plan's device's)."""
    return BudgetPart(profile=None if profile is None else device_profile(profile), **options)


select_options = _compose(part_options("selecting", SelectPart), input_shape_option)
filter_options = part_options("filtering", FilterPart)
prefetch_options = part_options("prefetching", PrefetchPart)
#: the budget planner's options (`BudgetPart`), for plan; filter's lack --max-slowdown (a plan-level search)
budget_options = part_options("budgeting", BudgetPart, make=_budget_part)
filter_budget_options = part_options("budgeting", BudgetPart, leave_out=("max_slowdown",), make=_budget_part)


def plan_request(f: Callable[..., Any]) -> Callable[..., Any]:
    """The plan command's request group: below its part groups (``selecting``, ``filtering``,
    ``budgeting``, ``prefetching``), it puts them together as one `PlanRequest`, in ``request``, made for
    ``--device`` (estimated on the device's bundled profile when no ``--profile`` is given). ``device``
    stays an argument of its own: the model group places the graph for it."""

    @functools.wraps(f)
    def command(*args: Any, **kwargs: Any) -> Any:
        budget = kwargs.pop("budgeting")
        if budget.profile is None and kwargs.get("device") is not None:
            budget = dataclasses.replace(budget, profile=device_profile(None, kwargs["device"]))
        kwargs["request"] = PlanRequest(
            select=kwargs.pop("selecting"),
            filter=kwargs.pop("filtering"),
            prefetch=kwargs.pop("prefetching"),
            budget=budget,
        )
        return f(*args, **kwargs)

    return command


#: single options of the budget part that other commands take too (simulate, frontier)
profile_option = field_option(BudgetPart, "profile")
objective_option = field_option(BudgetPart, "objective")

explain_option = click.option(
    "--explain", is_flag=True, default=False, help="Print every candidate, chosen or not, and why."
)

execution_order_option = click.option(
    "--execution-order",
    "order",  # the name it has down to the planner (`offloadctl.analysis.graph.analyse`)
    type=click.Choice(list(EXECUTION_ORDERS)),
    default=None,
    help="The onnxruntime execution order: priority (PRIORITY_BASED, what Python sets; the file order is the plan) "
    "or default (onnxruntime's DEFAULT, the only order C, C++, C#, Java, onnxruntime-genai and Triton hosts run). "
    "Default: the order the plan (or the rewritten model) was made for, else priority.",
)

shape_point_option = click.option(
    "--shape-point",
    "shape_points",
    multiple=True,
    metavar="NAME=VALUE[,NAME=VALUE...]",
    help="Also check at this shape point (repeatable): dimensions over --dim's, e.g. prefill and decode, or "
    "sequence lengths 1, 512 and 4096. The peak and slowdown are shown per point; --budget and --max-peak must "
    "hold at every one.",
)

strict_option = click.option(
    "--strict",
    is_flag=True,
    default=False,
    help="Fail when a figure would count a tensor of unknown size as 0 bytes.",
)
