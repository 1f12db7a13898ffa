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
    DEFAULT_MIN_BYTES,
    DEFAULT_PREFETCH_DISTANCE,
    DEFAULT_RELEASE_DISTANCE,
    DEFAULT_SELECT_DISTANCE,
    DEFAULT_SELECT_NUM,
    DEFAULT_STREAM_DEPTH,
    DEFAULT_TIME_LIMIT,
    BudgetPart,
    FilterPart,
    PrefetchPart,
    RequestError,
    SelectPart,
)
from offloadctl.running.runner import OPT_LEVELS
from offloadctl.simulation.costs import COPY_MODES, OBJECTIVES, STREAMS_NOTE
from offloadctl.simulation.profiles import DEFAULT_PROFILE, list_profiles

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
    "copies_option",
    "objective_option",
    "max_slowdown_option",
    "prefetch_options",
    "opt_level_option",
    "output_option",
    "plan_device_option",
    "strict_option",
]

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


def _compose(*decorators: Decorator) -> Decorator:
    def apply(f: Callable[..., Any]) -> Callable[..., Any]:
        for d in reversed(decorators):
            f = d(f)
        return f

    return apply


def _group(argument: str, options: type, *decorators: Decorator) -> Decorator:
    """Click options whose values reach the command as one ``options`` object, in ``argument``.

    The options keep their flags, help and order; the command's keyword arguments named after the
    dataclass's fields are replaced by the object (a field marked ``cli: False`` has no flag: it
    keeps its default, or what the request derives for it).
    """
    names = [f.name for f in dataclasses.fields(options) if f.init and f.metadata.get("cli", True)]
    # (a field without an option among ``decorators`` keeps its default: filter has no --max-slowdown)

    def apply(f: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(f)
        def command(*args: Any, **kwargs: Any) -> Any:
            kwargs[argument] = usage(options, **{name: kwargs.pop(name) for name in names if name in kwargs})
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

profile_option = click.option(
    "--profile",
    default=DEFAULT_PROFILE,
    show_default=True,
    metavar="NAME|FILE.json",
    help=f"Device profile for the time estimate: {', '.join(list_profiles())}, or a JSON file of your own.",
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
    "host-resident). Found with one run on the device where its provider runs here, predicted for cuda and ascend "
    "otherwise.",
)


def output_option(what: str) -> Decorator:
    return click.option("-o", "--output", required=True, type=click.Path(path_type=str), help=f"Where to write {what}.")


select_options = _compose(
    _group(
        "selecting",
        SelectPart,
        click.option(
            "--select-distance",
            type=click.IntRange(min=0),
            default=DEFAULT_SELECT_DISTANCE,
            show_default=True,
            help="A tensor is offloaded across gaps between uses larger than this many positions.",
        ),
        click.option("--activations/--no-activations", default=True, show_default=True, help="Consider node outputs."),
        click.option(
            "--params/--no-params",
            default=False,
            show_default=True,
            help="Consider weights (initializers, Constant nodes): they stay on the host and are streamed in.",
        ),
        click.option(
            "--force",
            multiple=True,
            metavar="PATTERN",
            help="Offload tensors matching this glob even without a long gap.",
        ),
        click.option("--never", multiple=True, metavar="PATTERN", help="Never offload tensors matching this glob."),
    ),
    input_shape_option,
)

filter_options = _group(
    "filtering",
    FilterPart,
    click.option(
        "--select-num",
        type=click.IntRange(min=0),
        default=DEFAULT_SELECT_NUM,
        show_default=True,
        help="Keep at most this many offloads, in first-use order.",
    ),
    click.option(
        "--min-bytes",
        type=BytesParam(),
        default=DEFAULT_MIN_BYTES,
        show_default=True,
        help="Drop candidates smaller than this (accepts 4096, 64KiB, 1MB).",
    ),
)

_BUDGET_FLAGS = (
    click.option(
        "--strategy",
        type=click.Choice(["distance", "budget"]),
        default=None,
        help="distance: HyperOffload's rule (the default); budget: fit --budget at the least bytes moved.",
    ),
    click.option(
        "--budget",
        "budget",
        type=BytesParam(),
        default=None,
        help="Peak device memory to fit (accepts 1.5GiB, 800MB); implies --strategy budget.",
    ),
    click.option(
        "--stream-weights",
        is_flag=True,
        default=False,
        help="Keep weights on the host and stream them in by layer group (implies --strategy budget).",
    ),
    click.option(
        "--stream-depth",
        type=click.IntRange(min=0),
        default=DEFAULT_STREAM_DEPTH,
        show_default=True,
        help="With --stream-weights: how many layer groups ahead weights are copied in.",
    ),
    click.option(
        "--optimal",
        is_flag=True,
        default=False,
        help="Also solve the exact program (HiGHS) from the greedy's plan; the plan records the proven gap.",
    ),
    click.option(
        "--time-limit",
        type=FiniteFloatRange(min=0, min_open=True),
        default=DEFAULT_TIME_LIMIT,
        show_default=True,
        metavar="SECONDS",
        help="With --optimal: stop the exact search after this long and keep the best plan found.",
    ),
)

objective_option = click.option(
    "--objective",
    type=click.Choice(list(OBJECTIVES)),
    default=None,
    help="What the budget strategy minimises: bytes moved, or the estimated time the copies add on --profile "
    "under --copies. Default: time with a measured profile (offloadctl profile), bytes otherwise.",
)

copies_option = click.option(
    "--copies",
    type=click.Choice(list(COPY_MODES)),
    default="inline",
    show_default=True,
    help="How copies run in the time estimates: inline on the compute stream (what onnxruntime runs today), "
    f"or on separate copy streams, hidden behind compute where the window allows ({STREAMS_NOTE}).",
)

max_slowdown_option = click.option(
    "--max-slowdown",
    type=FiniteFloatRange(min=1.0),
    default=None,
    metavar="X",
    help="Instead of --budget: the largest cut in peak memory whose estimated time (--copies, --profile) "
    "stays within X times the baseline, e.g. 1.05.",
)

#: the budget planner's options (`BudgetPart`), for plan; filter's lack --max-slowdown (a plan-level search)
budget_options = _group(
    "budgeting", BudgetPart, *_BUDGET_FLAGS, objective_option, copies_option, profile_option, max_slowdown_option
)
filter_budget_options = _group("budgeting", BudgetPart, *_BUDGET_FLAGS, objective_option, copies_option, profile_option)

explain_option = click.option(
    "--explain", is_flag=True, default=False, help="Print every candidate, chosen or not, and why."
)

execution_order_option = click.option(
    "--execution-order",
    "execution_order",
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

prefetch_options = _group(
    "prefetching",
    PrefetchPart,
    click.option(
        "--prefetch-distance",
        type=click.IntRange(min=0),
        default=DEFAULT_PREFETCH_DISTANCE,
        show_default=True,
        help="Move each host-to-device copy this many positions before its first use.",
    ),
    click.option(
        "--release-distance",
        type=click.IntRange(min=0),
        default=DEFAULT_RELEASE_DISTANCE,
        show_default=True,
        help="Positions after the last device use before an offloaded buffer may be reused.",
    ),
)
