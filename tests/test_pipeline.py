"""The plan's declared pipeline (`offloadctl.pipeline`, `offloadctl.planning.passes`): HyperOffload's
``Run()`` order, each pass held to what it declares, and one document for the library and the command."""

from __future__ import annotations

import dataclasses
import json

import onnx
import pytest

import offloadctl
from offloadctl.pipeline import DOCUMENT_PASSES, PIPELINE, planned
from offloadctl.planning.passes import FILTER, PINS, SELECT, Pass, Planning
from offloadctl.planning.request import PlanRequest

from conftest import SAMPLES


def test_the_passes_run_in_the_seeds_order():
    seeds = [p.seed for p in PIPELINE]
    order = ["GenerateParameterOperations", "OffloadInfoFilterByNumber", "AdjustHyperOffloadNodePosition",
             "AddEventNodes", "BuildExecutionOrder"]  # fmt: skip
    assert [next(i for i, s in enumerate(seeds) if s.startswith(name)) for name in order] == [0, 1, 2, 3, 4]
    assert [p.name for p in PIPELINE][-2:] == ["simulating peak memory and time", "the next step"]
    for p in PIPELINE:  # what each declares is a field of the state
        fields = {f.name for f in dataclasses.fields(Planning)}
        assert set(p.reads) <= fields and set(p.writes) <= fields and p.writes, p.name


@pytest.mark.parametrize(
    "options",
    [
        {"select_distance": 2, "params": True},
        {"budget": "700KiB", "params": True},
        {"budget": "700KiB", "params": True, "copies": "streams", "objective": "time"},
        {"max_slowdown": 1.2, "params": True},
    ],
)
def test_every_pass_keeps_its_declaration_in_a_real_run(options):
    """`Pass.__call__` checks each declaration as it runs: a whole pipeline over every strategy runs
    clean, and leaves a scheduled plan with its events, pins and figures recorded."""
    analysis = offloadctl.analyse(SAMPLES / "transformer.onnx")
    done = planned(analysis, PlanRequest(**options))
    plan = done.plan
    assert plan["stage"] == "scheduled" and done.simulation is not None
    assert {"events", "pins", "estimate"} <= set(plan["summary"])
    assert plan["summary"]["events"]["copies"] == options.get("copies", "inline")


def test_a_pass_that_breaks_its_declaration_is_stopped():
    analysis = offloadctl.analyse(SAMPLES / "mlp.onnx")
    state = planned(analysis, PlanRequest(params=True, select_distance=2), PIPELINE[:3])
    plan_pass = {"seed": "-", "reads": ("plan",), "writes": ("plan",)}
    sneaky = Pass(name="sneaky", **plan_pass, in_place=True, run=lambda s: s.replace(next_step={}))
    with pytest.raises(AssertionError, match="wrote 'next_step', which it does not declare"):
        sneaky(state)
    copying = dataclasses.replace(PINS, run=lambda s: s.replace(plan=json.loads(json.dumps(s.plan))))
    with pytest.raises(AssertionError, match="hands back another plan, against its declaration"):
        copying(state)
    in_place = Pass(name="filter", **plan_pass, in_place=False, run=lambda s: s)
    with pytest.raises(AssertionError, match="changed the plan it was given, against its declaration"):
        in_place(state.replace(plan=state.plan))
    peeking = Pass(name="peeking", **plan_pass, in_place=True, run=lambda s: s if s.simulation is None else s)
    with pytest.raises(AssertionError, match="'peeking' read 'simulation', which it does not declare: add it"):
        peeking(state)
    with pytest.raises(ValueError, match="declares \\['selections'\\], which Planning has not"):
        Pass(name="typo", seed="-", reads=("selections",), writes=(), in_place=False, run=lambda s: s)


def test_the_document_is_every_pass_but_the_next_step_wherever_it_stands():
    assert DOCUMENT_PASSES == tuple(p for p in PIPELINE if p.name != "the next step")
    assert [p.name for p in PIPELINE][-1] == "the next step"  # the verdict's: after every pass of the document


def test_the_events_pass_records_what_apply_writes(run_cli, tmp_path):
    """``summary.events`` of a plan made for copies on streams: a gate for each copy and a fence for each
    D2H, as `apply --copies streams` writes them (a copy issued before any compute node needs no gate)."""
    plan, out = tmp_path / "plan.json", tmp_path / "unet.offload.onnx"
    args = ("--params", "--select-distance", "2", "--copies", "streams")
    made = run_cli("plan", SAMPLES / "unet.onnx", "-o", plan, *args)
    assert made.exit_code in (0, 1), made.stderr
    events = json.loads(plan.read_text())["summary"]["events"]
    assert events["copies"] == "streams"
    assert run_cli("apply", plan, "-o", out, "--copies", "streams").exit_code == 0
    names = [n.name for n in onnx.load(str(out), load_external_data=False).graph.node]
    fences = sum(n.startswith("offload/event/fence/") for n in names)
    gates = sum(n.startswith(("offload/event/gate/", "offload/event/copied/")) for n in names)
    assert events["fences"] == fences > 0
    assert 0 < gates <= events["gates"]


@pytest.mark.parametrize("options", [{"budget": 40_000}, {"max_slowdown": 1.5}], ids=["budget", "slowdown"])
def test_filter_plans_from_the_selection_select_put_in_the_state(options, monkeypatch):
    """SELECT's selection reaches every planner through the state: the budget search and the trade-off
    make none of their own (`selection_for` is not called again)."""
    import offloadctl.planning.budget.prepared as prepared

    analysis = offloadctl.analyse(SAMPLES / "mlp.onnx")
    state = SELECT(Planning(analysis, PlanRequest(params=True, **options)))
    assert state.selection is not None

    def made_again(*_args, **_kwargs):
        raise AssertionError("the planner made a selection of its own")

    monkeypatch.setattr(prepared, "selection_for", made_again)
    done = FILTER(state)
    assert done.plan is not None and done.selection is state.selection
