"""One command's work on one model: the files it reads, the outputs it may write, and the analysis.

A `Job` is opened from a model (`Job.of_model`) or from a plan (`Job.of_plan`, which finds the
plan's model by one rule, `plan_model`, and loads it with the plan's pins and sizes). It lists
every file the job reads (`reads`: the plan, the model and every external data file it names) and
refuses, before anything is written, an output that is or resolves to one of them or lands on
another output of the same job (`guard`). The commands and the Python API (`offloadctl.apply`) open
the same jobs, so they find models, check outputs and rewrite models by the same rules
(`write_rewrite`, the apply protocol).

The plan itself is made by `offloadctl.pipeline`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import stat
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from offloadctl.analysis.graph import Analysis, analyse
from offloadctl.contract.document import check_plan_model, read_plan
from offloadctl.core.errors import OffloadError
from offloadctl.core.files import (
    atomic_write_text,
    check_distinct_outputs,
    check_output_path,
    output_target,
    sha256_file,
    written_through,
)
from offloadctl.core.plantypes import Plan, SizesFromRun
from offloadctl.loading.model import LoadedModel, load_model
from offloadctl.planning.select import derive_from_the_graph
from offloadctl.rewriting.genai import GenaiFolder, check_genai_output, genai_folder, write_genai_folder
from offloadctl.rewriting.metadata import session_settings
from offloadctl.rewriting.modes import choose_copy_mode, plan_device
from offloadctl.rewriting.on_streams import on_streams
from offloadctl.rewriting.rewrite import ApplyResult, RewriteOptions, apply_plan, target_for
from offloadctl.rewriting.streams import StreamLayout, streams_file
from offloadctl.rewriting.writing import check_model_outputs, write_model
from offloadctl.running.sizes import measure_sizes

__all__ = ["Job", "PlanPins", "genai_output_folder", "genai_source", "plan_model"]

logger = logging.getLogger(__name__)

Step = Callable[..., None]


def _no_step(text: str, new: bool = True) -> None:
    """The progress callback when nobody watches."""


@dataclass(frozen=True)
class PlanPins:
    """What a plan's model is opened with, as the plan recorded it (the one place it is read): the input
    shapes and named dimensions it was pinned at, the sizes of one run (``--sizes-from-run``) when it took
    them, and the execution order its positions count in."""

    input_shapes: dict[str, list[int]]
    dims: dict[str, int]
    sizes: Any
    order: str

    @classmethod
    def of(cls, plan: Plan) -> PlanPins:
        info = plan["model"]
        return cls(
            dict(info["input_shapes"]),
            dict(info.get("dims") or {}),
            info.get("sizes_from_run"),
            info.get("execution_order", "priority"),
        )


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
            derive_from_the_graph(analysis)
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
        pins = PlanPins.of(plan)
        job = cls.of_model(
            path,
            input_shapes=pins.input_shapes,
            dims=pins.dims or None,
            sizes=pins.sizes,
            pins_from=f"model.input_shapes of plan {plan_path}",
            step=step,
            order=pins.order,
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
        source_model = genai_source(self.plan, loaded.path)
        genai = genai_folder(source_model)
        with genai_output_folder(source_model if genai is not None else None, output):
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
        if options is None:  # the plan decides how its copies run, and the pins' target
            options = RewriteOptions(copies=choose_copy_mode(self.plan).mode, target=target_for(plan_device(self.plan)))
        source = loaded.path.parent
        self.guard("the rewritten model", output)
        check_model_outputs(loaded.proto, output, source, self.reads, locations=loaded.data_locations)
        step(f"rewriting {loaded.path}")
        # the rewrite refers to the source's large weights, which the writer takes from there
        proto = apply_plan(self.plan, self.analysis, result=result, options=replace(options, share_weights=True))
        events, partition_path = None, None
        if options.copies == "streams":
            proto, events, partition_path = self._on_streams(proto, output, options, result)
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
            weights_from=loaded.proto,
        )
        if events is not None and partition_path is not None:
            written.append(_beside(partition_path, json.dumps(events.to_json(), indent=1) + "\n", output, written))
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

    def _on_streams(
        self, proto: Any, output: str | os.PathLike[str], options: RewriteOptions, result: ApplyResult | None
    ) -> tuple[Any, StreamLayout | None, Path | None]:
        """The rewrite with its copies on a stream of their own: (the model, its events, the partition
        file's path); the model written in line (no events, no partition file) where no gate holds a copy,
        or where on streams it would peak above in line and that was not asked for by name."""
        assert self.plan is not None
        if written_through(output):
            raise OffloadError(
                f"{output} is not a file, and copies on streams need their partition file beside the model",
                hint="write the rewrite to a file, or apply with --copies inline",
            )
        partition: Path | None = self.guard("the partition file", streams_file(output_target(output)))
        assert partition is not None
        written = on_streams(self.plan, self.analysis, proto, options, partition.name, result)
        if written.events is None:  # written in line: no partition file
            partition = None
            self.outputs = [o for o in self.outputs if o[0] != "the partition file"]
        return written.proto, written.events, partition


def _beside(path: Path, text: str, output: str | os.PathLike[str], written: list[Path]) -> Path:
    """Write ``text`` to ``path`` beside the rewrite; a failure removes what was written."""
    try:
        atomic_write_text(path, text)
    except BaseException:
        _remove_written([Path(output), *written])
        raise
    return path


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


def genai_source(plan: Plan, model: Path) -> Path:
    """The model whose onnxruntime-genai folder a rewrite of ``plan`` completes: the plan's model, or the
    model onnxruntime optimized it from (``plan --opt-level``), which is the one in the genai folder."""
    optimized = plan["model"].get("optimized")
    return Path(optimized["from"]) if optimized is not None else model


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
