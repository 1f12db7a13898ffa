"""`offloadctl apply PLAN.json -o OUT.onnx [--model MODEL]`: rewrite a model by a scheduled plan."""

from __future__ import annotations

import stat
from pathlib import Path

import click

from offloadctl.cli.common import (
    finish,
    low_figures_text,
    peak_text,
    plan_effect,
    plan_pins,
    print_estimate,
    slowdown_text,
)
from offloadctl.cli.options import json_option, output_option
from offloadctl.cli.ui import out_console, steps
from offloadctl.contract.document import check_plan_model, read_plan
from offloadctl.contract.types import Plan
from offloadctl.core.errors import OffloadError
from offloadctl.core.files import check_output_path, sha256_file
from offloadctl.loading.model import load_model
from offloadctl.rewriting.rewrite import ApplyResult, apply_plan, check_model_outputs, write_model
from offloadctl.running.sizes import analysed
from offloadctl.simulation.estimate import recorded_estimate

__all__ = ["COMMANDS", "find_model"]


def find_model(plan: Plan, plan_path: str, model: str | None) -> Path:
    """The model a plan applies to: ``model`` if given, else the plan's model.path as given
    (relative to the current folder), else relative to the plan file's folder."""
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
    candidates = [recorded]
    if not recorded.is_absolute():
        candidates.append(Path(plan_path).parent / recorded)
    for path in candidates:
        if path.is_file():
            return path
    looked = " and ".join(str(p) for p in dict.fromkeys(candidates))
    raise OffloadError(
        f"the model of plan {plan_path} was not found (looked for {looked})",
        hint="pass the model with --model MODEL",
    )


@click.command("apply")
@click.argument("plan_path", metavar="PLAN", type=click.Path(path_type=str))
@output_option("the rewritten model")
@click.option(
    "--model",
    type=click.Path(path_type=str),
    default=None,
    help="The model the plan was made for (default: the plan's model.path).",
)
@json_option
def apply(plan_path: str, output: str, model: str | None, as_json: bool) -> None:
    """Insert the copies of a scheduled plan into its model and write OUT.onnx.

    The input model is not modified. Run the result with `offloadctl run`, or in your own
    onnxruntime session with the settings recorded in its metadata (offloadctl.session):
    PRIORITY_BASED execution order, ConstantFolding disabled when weights are offloaded.
    The peak and time figures are those `offloadctl plan` recorded in the plan (`simulate OUT`
    computes them for the rewritten model).
    """
    plan = read_plan(plan_path, stages=("scheduled",))
    model_path = find_model(plan, plan_path, model)
    check_output_path(output, plan_path, model_path)
    check_plan_model(plan, sha256_file(model_path), model_path)
    result = ApplyResult()
    with steps(not as_json, total=4) as step:
        step(f"loading {model_path}")
        loaded = load_model(model_path, **plan_pins(plan), input_shapes_from=f"model.input_shapes of plan {plan_path}")
        reads = (Path(plan_path), *loaded.files)
        check_output_path(output, *reads)
        check_model_outputs(loaded.proto, output, model_path.parent, reads, locations=loaded.data_locations)
        step(f"analysing {model_path}")
        analysis = analysed(loaded)
        step(f"rewriting {model_path}")
        proto = apply_plan(plan, analysis, result=result)
        step(f"writing {output}")
        # the rewrite refers to the data files of its source, which loading has listed already
        extra = write_model(
            proto,
            output,
            source_dir=model_path.parent,
            protected=reads,
            locations=loaded.data_locations,
            mode=stat.S_IMODE(model_path.stat().st_mode),  # a rewrite is as private as its source
        )
    figures = recorded_estimate(plan)
    if not as_json:
        console = out_console()
        console.print(
            f"inserted {result.d2h} device-to-host and {result.h2d} host-to-device copies "
            f"({result.activations} activation(s), {result.parameters} weight(s) offloaded)",
            soft_wrap=True,
        )
        for path in extra:
            console.print(f"placed data file {path}", soft_wrap=True)
        if figures is not None:
            print_estimate(figures, what="planned")
    parts: list[str | None] = [f"{model_path} -> {output}", f"{result.d2h} D2H + {result.h2d} H2D copies"]
    if figures is not None:
        words, raised = plan_effect(figures)
        parts += [
            peak_text(figures),
            words or (raised and "the plan raises the peak"),
            slowdown_text(figures),
            low_figures_text(figures.get("unknown_size_tensors", 0)),
        ]
    else:
        parts.append(f"peak and time: offloadctl simulate {output}")
    finish(
        "apply",
        plan_path,
        parts,
        [output, *extra],
        as_json=as_json,
        doc={
            "model": str(model_path),
            "plan": plan_path,
            "output": output,
            "copies": {"d2h": result.d2h, "h2d": result.h2d},
            "offloaded": {"activations": result.activations, "parameters": result.parameters},
            "data_files": [str(p) for p in extra],
            "estimate": figures,  # recorded by `offloadctl plan`; None for a plan made otherwise
        },
    )


COMMANDS = [apply]
