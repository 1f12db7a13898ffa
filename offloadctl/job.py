"""One command's work on one model: the files it reads, the outputs it may write, and the analysis.

A `Job` is opened from a model (`Job.of_model`) or from a plan (`Job.of_plan`, which finds the
plan's model by one rule, `plan_model`, and loads it with the plan's pins and sizes). It lists
every file the job reads (`reads`: the plan, the model and every external data file it names) and
refuses, before anything is written, an output that is or resolves to one of them or lands on
another output of the same job (`guard`). The commands and the Python API (`offloadctl.apply`) open
the same jobs, so they find models, check outputs and rewrite models by the same rules
(`write_rewrite`, the apply protocol).

`make_plan` is the plan document `offloadctl plan` writes and `offloadctl.make_plan` returns: the
planner's plan with the figures apply quotes (``summary.estimate``; under the DEFAULT order the peak
of the rewrite as that walk runs it) and the order pins' layout (``summary.pins``).
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from shlex import quote
from typing import Any

from offloadctl.analysis.graph import Analysis, analyse
from offloadctl.contract.document import check_plan_model, read_plan
from offloadctl.contract.order_pins import pin_layout, record_pins
from offloadctl.core.ahead import Ahead
from offloadctl.core.bulk import paused_gc
from offloadctl.core.errors import OffloadError
from offloadctl.core.files import atomic_write_text, check_distinct_outputs, check_output_path, sha256_file
from offloadctl.core.plantypes import Plan, SizesFromRun
from offloadctl.core.units import fmt_bytes
from offloadctl.loading.input_shapes import given_dims
from offloadctl.loading.model import LoadedModel, load_model
from offloadctl.planning.budget.strategy import BudgetUnreachable, budget_figures
from offloadctl.planning.make import plan_for
from offloadctl.planning.request import PlanRequest, evolve, taking
from offloadctl.planning.select import candidate_uses
from offloadctl.rewriting.genai import GenaiFolder, check_genai_output, genai_folder, write_genai_folder
from offloadctl.rewriting.metadata import session_settings
from offloadctl.rewriting.preview import device_result, placement_of, run_order_result
from offloadctl.rewriting.rewrite import (
    ApplyResult,
    RewriteOptions,
    apply_plan,
    check_model_outputs,
    target_for,
    write_model,
)
from offloadctl.rewriting.streams import streams_file, with_events
from offloadctl.running.sizes import measure_sizes
from offloadctl.simulation.base import is_rewritten, plain_ids
from offloadctl.simulation.estimate import (
    estimate_figures,
    record_estimate,
    recorded_estimate,
    with_device_peaks,
    with_run_order_peak,
)
from offloadctl.simulation.result import SimResult, simulate

__all__ = ["Job", "plan_model"]

Step = Callable[..., None]


def _no_step(text: str, new: bool = True) -> None:
    """The progress callback when nobody watches."""


def plan_model(plan: Plan, plan_path: str | os.PathLike[str], model: str | os.PathLike[str] | None = None) -> Path:
    """The model a plan was made for: ``model`` if given; else the plan's ``model.path`` as recorded
    (from the current folder), then relative to the plan file's folder, then the file of that name
    beside the plan.

    Raises:
        OffloadError: ``model`` is not a file, or no candidate exists.
    """
    if model is not None:
        path = Path(model)
        if path.is_dir():
            raise OffloadError(
                f"--model {path} is a directory", hint="give the path of the .onnx model the plan was made for"
            )
        if not path.is_file():
            raise OffloadError(f"model file {path} does not exist", hint="check the --model path")
        return path
    recorded = Path(plan["model"]["path"])
    folder = Path(plan_path).parent
    candidates = [recorded]
    if not recorded.is_absolute():
        candidates.append(folder / recorded)
    candidates.append(folder / recorded.name)
    for path in candidates:
        if path.is_file():
            return path
    looked = " and ".join(str(p) for p in dict.fromkeys(candidates))
    raise OffloadError(
        f"the model of plan {plan_path} was not found (looked for {looked})",
        hint="pass the model with --model MODEL, or run the command from the folder the plan was made in",
    )


def _remove_written(paths: list[Path]) -> None:
    for path in paths:
        with contextlib.suppress(OSError):
            path.unlink()


@dataclass
class Job:
    """The analysis a command works on, the plan it read (if any), and every file it reads."""

    analysis: Analysis
    plan: Plan | None = None
    plan_path: Path | None = None
    outputs: list[tuple[str, Path]] = field(default_factory=list)  # guarded so far: (what, path)

    @property
    def model_path(self) -> Path:
        return self.analysis.loaded.path

    @property
    def reads(self) -> tuple[Path, ...]:
        """Every file the job reads: the plan file, the model and each external data file it names."""
        plan = (self.plan_path,) if self.plan_path is not None else ()
        return (*plan, *self.analysis.loaded.files)

    @classmethod
    def of_model(
        cls,
        model: str | os.PathLike[str],
        *,
        input_shapes: Mapping[str, Sequence[int]] | None = None,
        dims: Mapping[str, int] | None = None,
        sizes: SizesFromRun | None = None,
        pins_from: str = "--input-shape",
        step: Step = _no_step,
        order: str = "priority",
        infer_ahead: bool = False,
    ) -> Job:
        """Load ``model`` (weights stay on disk) with its pins and analyse it in execution ``order``;
        ``sizes`` reads every size from one run (`analysed`); ``infer_ahead``, for a caller that
        looks up sizes, runs shape inference beside the analysis."""
        step(f"loading {model}")
        loaded = load_model(
            model,
            input_shapes=input_shapes,
            dims=dims,
            input_shapes_from=pins_from,
            sizes_from_run=sizes,
            infer_ahead=infer_ahead,
        )
        step(f"analysing {model}" + (" (sizes from one run on the CPU provider)" if sizes else ""))
        analysis = analysed(loaded, order=order)
        if loaded.inference is not None and loaded.inference.unread:
            _derive_from_the_graph(analysis)
        return cls(analysis)

    @classmethod
    def of_plan(
        cls,
        plan_path: str | os.PathLike[str],
        *,
        stages: tuple[str, ...],
        model: str | os.PathLike[str] | None = None,
        step: Step = _no_step,
        plan: Plan | None = None,
    ) -> Job:
        """Read a plan at one of ``stages`` (unless the caller has read it: ``plan``), find its model
        (`plan_model`), check that the plan was made for it, and load it with the plan's pins and
        sizes."""
        if plan is None:
            plan = read_plan(plan_path, stages=stages)
        path = plan_model(plan, plan_path, model)
        check_plan_model(plan, sha256_file(path), path)
        info = plan["model"]
        job = cls.of_model(
            path,
            input_shapes=info["input_shapes"],
            dims=info.get("dims") or None,
            sizes=info.get("sizes_from_run"),
            pins_from=f"model.input_shapes of plan {plan_path}",
            step=step,
            order=info.get("execution_order", "priority"),
        )
        job.plan, job.plan_path = plan, Path(plan_path)
        return job

    def with_plan(self, plan: Plan, plan_path: str | os.PathLike[str] | None = None) -> Job:
        """This job with a plan for its model (checked to be one: same file)."""
        check_plan_model(plan, self.analysis.loaded.sha256, self.model_path)
        self.plan, self.plan_path = plan, None if plan_path is None else Path(plan_path)
        return self

    def guard(self, what: str, path: str | os.PathLike[str]) -> Path:
        """Refuse an output that would overwrite a file the job reads or another of its outputs, or
        that cannot be written; remember it. Returns it as a Path."""
        out = check_output_path(path, *self.reads)
        check_distinct_outputs([*self.outputs, (what, out)])
        self.outputs.append((what, out))
        return out

    def write_rewrite(
        self,
        output: str | os.PathLike[str],
        *,
        result: ApplyResult | None = None,
        step: Step = _no_step,
        options: RewriteOptions | None = None,
    ) -> tuple[Any, list[Path]]:
        """The apply protocol: insert the job's scheduled plan into its model and write it to ``output``
        atomically, with the source model's permission bits, the data files it names copied beside
        it when it goes to another folder (never over a file the job reads). Returns the rewritten
        model and the data files written."""
        assert self.plan is not None  # a job that rewrites has a plan
        loaded = self.analysis.loaded
        genai = genai_folder(loaded.path)
        with genai_output_folder(loaded.path if genai is not None else None, output):
            return self._write_rewrite(output, loaded, genai, result=result, step=step, options=options)

    def _write_rewrite(
        self,
        output: str | os.PathLike[str],
        loaded: LoadedModel,
        genai: GenaiFolder | None,
        *,
        result: ApplyResult | None,
        step: Step,
        options: RewriteOptions | None,
    ) -> tuple[Any, list[Path]]:
        assert self.plan is not None
        source = loaded.path.parent
        self.guard("the rewritten model", output)
        check_model_outputs(loaded.proto, output, source, self.reads, locations=loaded.data_locations)
        step(f"rewriting {loaded.path}")
        proto = apply_plan(self.plan, self.analysis, result=result, options=options)
        events = None
        if options is not None and options.copies == "streams":
            partition_path = self.guard("the partition file", streams_file(output))
            events = with_events(proto, partition_path.name, self.analysis.order)
        if genai is not None:
            check_genai_output(genai, Path(output))
        step(f"writing {output}")
        written = write_model(
            proto,
            output,
            source_dir=source,
            protected=self.reads,
            locations=loaded.data_locations,
            mode=stat.S_IMODE(loaded.path.stat().st_mode),  # a rewrite is as private as its source
        )
        if events is not None:
            try:
                atomic_write_text(partition_path, json.dumps(events.to_json(), indent=1) + "\n")
            except BaseException:
                _remove_written([Path(output), *written])
                raise
            written.append(partition_path)
        if genai is not None:
            step(f"completing the onnxruntime-genai folder {Path(output).parent}")
            try:
                settings = session_settings(proto) or {}
                written += write_genai_folder(
                    genai, Path(output), settings, written=[Path(output), *written], protected=self.reads
                )
            except BaseException:
                _remove_written([Path(output), *written])
                raise
        return proto, written


def _derive_from_the_graph(analysis: Analysis) -> None:
    """Derive what later stages derive from the graph alone (the simulation's tensor ids, the select
    stage's candidates and their uses), while onnx's shape inference still runs in its child: on a
    big model it takes longer than the analysis, so this costs no time, and the work after the sizes
    arrive starts further on."""
    with paused_gc():
        plain_ids(analysis)
        candidate_uses(analysis)


def analysed(loaded: LoadedModel, *, order: str = "priority") -> Analysis:
    """The analysis of a loaded model in ``order`` (`offloadctl.analysis.graph.analyse`), its sizes
    read from one run on onnxruntime's CPU provider when the model asks for that
    (``loaded.sizes_from_run``, from ``--sizes-from-run`` or a plan made with it:
    `offloadctl.running.sizes.measure_sizes`)."""
    analysis = analyse(loaded, order=order)
    run = loaded.sizes_from_run
    if run is not None:
        analysis.infos.use_measured(measure_sizes(loaded.path, loaded.proto, inputs=run["inputs"], seed=run["seed"]))
    return analysis


@contextlib.contextmanager
def genai_output_folder(model: str | os.PathLike[str] | None, output: str | os.PathLike[str]) -> Iterator[None]:
    """A rewrite of a model in an onnxruntime-genai folder goes to a new genai folder: make it when it
    does not exist yet and its parent does (one level, as ``mkdir OUT``), and remove it again if the
    work inside fails and leaves it empty. No-op for other models and folders that exist."""
    folder = Path(output).parent
    made = False
    if model is not None and genai_folder(Path(model)) is not None and str(folder) not in ("", "."):
        if not folder.exists() and folder.parent.is_dir():
            with contextlib.suppress(OSError):  # (unwritable parent, a race): the output checks report it
                folder.mkdir()
                made = True
    try:
        yield
    except BaseException:
        if made and not any(folder.iterdir()):
            folder.rmdir()
        raise


# --------------------------------------------------------------------------------------------------
# The plan document


@dataclass(frozen=True)
class Planned:
    """A finished plan document and the simulation its figures come from (None for a model that
    already holds copies: simulate the rewritten model instead)."""

    plan: Plan
    result: SimResult | None


def planned(analysis: Analysis, request: PlanRequest) -> Planned:
    """Plan ``request`` for ``analysis`` (`offloadctl.planning.make.plan_for`), simulate it (unless the
    planner did) and record in it the figures ``apply`` quotes and the pins' layout it builds from."""
    try:
        outcome = plan_for(analysis, request)
    except BudgetUnreachable as exc:
        if not request.host_device:
            raise
        raise _as_the_device_runs(exc, analysis, request) from None
    plan = outcome.plan
    if is_rewritten(analysis):
        return Planned(plan, None)
    request.report("simulating peak memory and time")
    with paused_gc():
        result = outcome.simulation or simulate(analysis, plan, profile=request.device_profile)
    record_estimate(plan, run_order_figures(plan, analysis, result, request))  # apply quotes it
    record_pins(plan, pin_layout(plan, analysis))  # and builds these pins without shape inference
    return Planned(plan, result)


def _as_the_device_runs(exc: BudgetUnreachable, analysis: Analysis, request: PlanRequest) -> BudgetUnreachable:
    """``exc`` for a plan made for a device (``plan --device``), saying what its figures count: a budget
    counts every node on the device, while the device runs some on the host, whose tensors are not in
    its memory, so the model's peak as the device runs it is another figure."""
    device = request.host_device.split()[0]
    placement = placement_of(analysis, request.host_nodes, request.host_copies, request.host_casts)
    with paused_gc():
        as_run, _ = device_result(None, analysis, placement, target=target_for(device))
    return BudgetUnreachable(
        f"{exc.message}. A budget counts every node on the device; {device} runs {len(request.host_nodes)} of "
        f"them on the host, whose tensors it keeps in host memory, so the model as {device} runs it peaks at "
        f"{fmt_bytes(as_run.peak_after)}",
        hint=exc.hint,
        reachable=exc.reachable,
    )


@taking(PlanRequest)
def make_plan(analysis: Analysis, request: PlanRequest) -> Plan:
    """The plan document ``offloadctl plan`` writes for the same request: `planned`'s plan.

    Takes a `PlanRequest`'s fields as keywords, as `offloadctl.planning.make.make_plan` does (which
    returns the planner's plan alone, without the recorded figures).
    """
    return planned(analysis, request).plan


def run_order_figures(plan: Plan, analysis: Analysis, result: SimResult, request: PlanRequest) -> dict[str, Any]:
    """The plan's figures (`as_run_figures` of the simulation's, for the request's device)."""
    return as_run_figures(
        plan,
        analysis,
        estimate_figures(result, request.copies),
        host_device=request.host_device,
        host_nodes=request.host_nodes,
        host_copies=request.host_copies,
        host_casts=request.host_casts,
        report=request.report,
    )


def as_run_figures(
    plan: Plan,
    analysis: Analysis,
    figures: dict[str, Any],
    *,
    host_device: str = "",
    host_nodes: Sequence[str] = (),
    host_copies: Sequence[str] = (),
    host_casts: Sequence[Any] = (),
    report: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """``figures`` (`estimate_figures` of the plan's simulation) with the peaks of what runs: for a plan
    made for a device (``plan --device``: ``host_device``, the nodes it runs on the host and the copies
    and Casts onnxruntime inserts there), the model's and the rewrite's as that device runs them, in either order
    (`device_figures`); else under the DEFAULT order the peak after of the rewrite as the walk over it
    runs (`offloadctl.rewriting.preview`: pins and copies reorder it), not of the planned sequence.
    PRIORITY_BASED on one device runs the planned sequence itself."""
    if host_device:
        return device_figures(plan, analysis, figures, host_device, host_nodes, host_copies, host_casts)
    if analysis.order != "default" or not plan["offloads"]:
        return figures
    if report is not None:
        report("replaying the rewrite in onnxruntime's DEFAULT order")
    with paused_gc():
        replayed = run_order_result(plan, analysis)
    return with_run_order_peak(figures, replayed, analysis.order)


def device_figures(
    plan: Plan,
    analysis: Analysis,
    figures: dict[str, Any],
    host_device: str,
    host_nodes: Sequence[str] = (),
    host_copies: Sequence[str] = (),
    host_casts: Sequence[Any] = (),
) -> dict[str, Any]:
    """``figures`` with the peaks of the model and of ``plan``'s rewrite as the device the plan was made
    for runs them (``plan --device``: ``host_device``, the nodes it runs on the host, the tensors
    onnxruntime copies there and the Casts it inserts, as `SelectPart` records them), in the order its
    executor runs the two providers' streams in (`offloadctl.rewriting.preview.device_result`)."""
    device = host_device.split()[0]
    placement = placement_of(analysis, host_nodes, host_copies, host_casts)
    target = target_for(device)  # the pins `apply --target` writes for it
    with paused_gc():
        before, _ = device_result(None, analysis, placement, target=target)
        after, pins = device_result(plan, analysis, placement, target=target) if plan["offloads"] else (before, None)
    checked = None if pins is None else (pins.checked, len(pins.violated))
    return with_device_peaks(figures, before, after, device, analysis.order, checked)


#: a plan that lowers the peak by less than this fraction gets a computed next step
HELPFUL_CUT = 0.05


def suggested_budget(lower_bound: int, peak: int) -> int:
    """The budget a weak plan's next step plans at: halfway between the lower bound and the peak, in
    whole KiB (so the command it prints says what was planned)."""
    budget = max(lower_bound, (lower_bound + peak) // 2)
    return -(-budget // 1024) * 1024


#: Graphs with fewer positions make a weak plan's next step in a fraction of a second: no child is
#: worth forking for it (`next_step_ahead`).
NEXT_STEP_AHEAD_MIN_POSITIONS = 20_000

#: What the next step's budget plan gives (`_budget_step`): the budget it was made at, and its peak as
#: the plan would say it and its estimated slowdown; the peak None when no budget plan can be made.
_BudgetStep = tuple[int, int | None, float | None]


def next_step_ahead(analysis: Analysis, request: PlanRequest) -> Ahead[_BudgetStep] | None:
    """Start the budget plan of a weak plan's next step (`next_step`) in a forked child
    (`offloadctl.core.ahead`), for a caller that makes, simulates and writes its plan meanwhile: on
    a big model the next step takes about as long as the rest of planning.

    The plan is not made yet, so the child may work for nothing: `next_step` cancels it when the
    plan turns out not to be weak. Simulates the model without a plan first (its peak and lower
    bound set the budget; the plan's simulation then reuses that work). None when no next step can
    follow (a budget request, a rewritten model, a peak no budget lowers), for a small graph, or
    where no child can be forked; `next_step` then works inline.
    """
    if request.uses_budget or analysis.num_positions < NEXT_STEP_AHEAD_MIN_POSITIONS or is_rewritten(analysis):
        return None
    try:
        with paused_gc():
            model = simulate(analysis, None, profile=request.device_profile)
    except OffloadError:  # the plan's own simulation says what is wrong, where it did before
        return None
    budget = suggested_budget(model.lower_bound_bytes, model.peak_before)
    if model.peak_before <= 0 or budget >= model.peak_before:
        return None
    return Ahead.start(_budget_step, analysis, budget, evolve(request, step=None))  # the child reports nothing


@paused_gc()  # in a child too, where a collection would also copy every page it walks
def _budget_step(analysis: Analysis, budget: int, request: PlanRequest) -> _BudgetStep:
    """The budget plan at ``budget`` that a weak plan's next step gives, made and simulated: its
    figures alone (nothing is written, so no rejections are listed)."""
    try:
        outcome = budget_figures(
            analysis,
            PlanRequest(
                budget=budget,
                params=True,
                profile=request.device_profile,  # loaded once, by the request
                host_nodes=request.host_nodes,
                host_copies=request.host_copies,
                host_casts=request.host_casts,
                host_device=request.host_device,
            ),
        )
    except OffloadError:
        return budget, None, None
    better = outcome.plan  # its figures only: no estimate or pins are recorded in it
    sim = outcome.simulation or simulate(analysis, better, profile=request.device_profile, planned_here=True)
    peak = run_order_figures(better, analysis, sim, request)["peak_bytes"]["after"]  # as the plan would say
    return budget, peak, sim.times.slowdown["serialized"] if sim.times is not None else None


def next_step(
    analysis: Analysis,
    plan: Plan,
    result: SimResult,
    request: PlanRequest,
    *,
    ahead: Ahead[_BudgetStep] | None = None,
) -> dict[str, Any] | None:
    """For a plan that lowers the peak by under 5% (not itself a budget plan): the budget plan halfway
    between the lower bound and the peak, made and simulated here (or taken from ``ahead``, started
    by `next_step_ahead`, which is cancelled when it is not needed), as a copy-pasteable command with
    the figures it gives (the model's own pins and dims in it); None otherwise or when it does no better."""
    recorded = (recorded_estimate(plan) or {}).get("peak_bytes") or {}
    before, after = result.peak_before, recorded.get("after", result.peak_after)  # as the verdict says it
    budget = suggested_budget(result.lower_bound_bytes, before)
    if before <= 0 or before - after >= HELPFUL_CUT * before or request.uses_budget or budget >= before:
        if ahead is not None:
            ahead.cancel()
        return None
    request.report("finding a plan that helps")
    found = ahead.result() if ahead is not None else None
    if found is None or found[0] != budget:  # no child, or it delivered nothing: made here
        found = _budget_step(analysis, budget, request)
    _, peak, slowdown = found
    if peak is None or peak >= min(after, (1 - HELPFUL_CUT) * before):  # it must help: below the plan's peak, and by 5%
        return None
    loaded = analysis.loaded
    flags = [f"--input-shape {quote(f'{n}=' + ','.join(map(str, s)))}" for n, s in loaded.input_shapes.items()]
    flags += [f"--dim {quote(f'{n}={v}')}" for n, v in given_dims(loaded.dims).items()]  # sums follow
    if analysis.order != "priority":
        flags.append(f"--execution-order {analysis.order}")
    if request.host_device:
        flags.append(f"--device {request.host_device.split()[0]}")
    command = " ".join(
        ["offloadctl plan", quote(str(loaded.path)), "--params", f"--budget {budget // 1024}KiB", *flags]
    )
    return {
        "command": command + " -o PLAN.json",
        "budget_bytes": budget,
        "peak_bytes": {"before": before, "after": peak},
        "slowdown": slowdown,
    }
