"""The plan's declared pipeline (`offloadctl.pipeline`, `offloadctl.planning.passes`): HyperOffload's
``Run()`` order, each pass held to what it declares, and one document for the library and the command."""

from __future__ import annotations

import dataclasses
import json

import onnx
import pytest

import offloadctl
from offloadctl.analysis.graph import analyse
from offloadctl.loading.model import load_model
from offloadctl.pipeline import REPORT, STEPS, planned, planned_document
from offloadctl.planning.make import run_passes
from offloadctl.planning.passes import (
    FILTER,
    PINS,
    PIPELINE,
    PREFETCH,
    SELECT,
    Pass,
    Planning,
    PostconditionError,
    PreconditionError,
)
from offloadctl.planning.request import PlanRequest
from offloadctl.simulation.result import simulate

from conftest import SAMPLES


def test_the_pipeline_is_the_seeds_steps_in_the_seeds_order_and_nothing_else():
    seeds = [p.seed for p in PIPELINE]
    order = ["GenerateParameterOperations", "OffloadInfoFilterByNumber", "AdjustHyperOffloadNodePosition",
             "AddEventNodes", "BuildExecutionOrder"]  # fmt: skip
    assert [next(i for i, s in enumerate(seeds) if s.startswith(name)) for name in order] == [0, 1, 2, 3, 4]
    assert len(PIPELINE) == len(order)  # the figures and the next step are the report's, after it
    assert STEPS == len(PIPELINE) + len(REPORT)
    for p in PIPELINE:  # what each declares is a field of the state
        fields = {f.name for f in dataclasses.fields(Planning)}
        assert set(p.reads) <= fields and set(p.writes) <= fields and p.writes, p.name
        assert "next_step" not in p.writes  # no pass writes the report's fields


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
    done = planned(analysis, PlanRequest.of_options(**options))
    plan = done.plan
    assert plan["stage"] == "scheduled" and done.simulation is not None
    assert {"events", "pins", "estimate"} <= set(plan["summary"])
    assert plan["summary"]["events"]["copies"] == options.get("copies", "inline")


def test_a_pass_that_breaks_its_declaration_is_stopped():
    analysis = offloadctl.analyse(SAMPLES / "mlp.onnx")
    state = run_passes(analysis, PlanRequest.of_options(params=True, select_distance=2), PIPELINE[:3])
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
    with pytest.raises(ValueError, match="requires what it does not read"):
        Pass(name="odd", seed="-", reads=(), writes=(), requires=("plan",), in_place=False, run=lambda s: s)


def test_a_pass_run_out_of_order_names_what_it_requires_and_one_that_leaves_it_empty_is_stopped():
    analysis = offloadctl.analyse(SAMPLES / "mlp.onnx")
    bare = Planning(analysis, PlanRequest())
    with pytest.raises(PreconditionError, match="'filtering' requires \\['selection'\\], which no pass before"):
        FILTER(bare)
    with pytest.raises(PreconditionError, match="'scheduling' requires \\['plan'\\]"):
        PREFETCH(SELECT(bare))
    lazy = dataclasses.replace(SELECT, run=lambda s: s)
    with pytest.raises(PostconditionError, match="'selecting' ensures \\['selection'\\], but left them empty"):
        lazy(bare)


def test_the_document_is_the_plan_and_its_figures_without_the_next_step():
    analysis = offloadctl.analyse(SAMPLES / "mlp.onnx")
    request = PlanRequest()  # HyperOffload's defaults: a weak plan here, which gets a next step
    done = planned(analysis, request)
    assert done.plan is not None and "estimate" in done.plan["summary"]  # the report's figures, recorded
    assert done.next_step is not None
    assert planned_document(analysis, request) == done.plan
    assert planned(analysis, request, next_step=False).next_step is None


def test_the_events_pass_records_what_apply_writes(run_cli, tmp_path):
    """``summary.events`` of a plan made for copies on streams: a gate for each copy and a fence for each
    D2H, as `apply --copies streams` writes them (a copy issued before any compute node needs no gate)."""
    plan, out = tmp_path / "plan.json", tmp_path / "transformer.offload.onnx"
    args = ("--params", "--select-distance", "50", "--copies", "streams", "--execution-order", "priority")
    made = run_cli("plan", SAMPLES / "transformer.onnx", "-o", plan, *args)
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
    state = SELECT(Planning(analysis, PlanRequest.of_options(params=True, **options)))
    assert state.selection is not None

    def made_again(*_args, **_kwargs):
        raise AssertionError("the planner made a selection of its own")

    monkeypatch.setattr(prepared, "selection_for", made_again)
    done = FILTER(state)
    assert done.plan is not None and done.selection is state.selection


@pytest.mark.parametrize("order", ["priority", "default"])
def test_a_streams_plan_issues_each_load_by_time_without_raising_the_peak(order):
    """With copies on streams a distance plan's loads go as early as their copies need to hide behind
    compute (never later than the prefetch distance put them, never above the in-line placement's peak),
    and the estimate on streams drops; in line the distance places them, as HyperOffload does."""
    from offloadctl.analysis import timeline

    analysis = analyse(load_model(SAMPLES / "unet.onnx"), order=order)
    options = {"params": True, "select_distance": 10, "prefetch_distance": 2}
    inline = run_passes(analysis, PlanRequest.of_options(**options, copies="inline"), PIPELINE).plan
    streams = run_passes(analysis, PlanRequest.of_options(**options, copies="streams"), PIPELINE).plan  # as planned
    placed = {(o["tensor"], k): g["h2d_before"] for o in inline["offloads"] for k, g in enumerate(o["reload_groups"])}
    led = {(o["tensor"], k): g["h2d_before"] for o in streams["offloads"] for k, g in enumerate(o["reload_groups"])}
    assert placed.keys() == led.keys() and all(led[key] <= placed[key] for key in placed)
    moved = sum(led[key] < placed[key] for key in placed)
    assert moved == streams["summary"]["loads_led_by_time"] >= 5 and "loads_led_by_time" not in inline["summary"]
    peak = timeline.peak_of(timeline.profile(analysis, inline, prefetch_distance=2))[0]
    assert timeline.peak_of(timeline.profile(analysis, streams, prefetch_distance=2))[0] <= peak
    unled = json.loads(json.dumps(streams))
    for off in unled["offloads"]:
        for k, group in enumerate(off["reload_groups"]):
            group["h2d_before"] = placed[(off["tensor"], k)]
    request = PlanRequest.of_options(**options, copies="streams")
    times = [simulate(analysis, p, profile=request.budget.device_profile).times for p in (streams, unled)]
    assert times[0].overlapped < times[1].overlapped  # the copies hide behind more compute
