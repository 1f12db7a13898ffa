"""Time-aware plans: the objective's default, copies on streams, --max-slowdown and the frontier.

- With a measured profile the budget strategy minimises time unless told otherwise; with a
  datasheet profile, bytes. The plan and the command line say which.
- ``--copies streams`` prices a copy by what compute does not hide, places prefetches for a link
  the copies share, and is labelled as the mode apply writes, not yet timed on a device.
- At the same budget the time objective never gives a longer estimated time than the bytes
  objective, in either copy mode.
- ``--max-slowdown 1.05`` stays within 5% of the baseline and cuts the peak below the HyperOffload
  default plan's wherever the frontier shows a plan that does so within 5%.
- ``offloadctl frontier`` gives the points from the peak down to the lower bound, for CI and as a plot.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from onnx import helper, numpy_helper

from offloadctl.analysis.graph import analyse
from offloadctl.analysis.timeline import lower_bound
from offloadctl.contract.document import read_plan
from offloadctl.core.errors import OffloadError
from offloadctl.loading.model import load_model
from offloadctl.planning.budget.strategy import budget_filter
from offloadctl.planning.make import scheduled_plan
from offloadctl.planning.prefetch import prefetch
from offloadctl.planning.request import PlanRequest, PrefetchPart, SelectPart
from offloadctl.planning.select import select
from offloadctl.planning.tradeoff import Tradeoff, budget_grid, dominated
from offloadctl.running import profiler
from offloadctl.simulation.costs import CopyTiming, StreamStall, default_objective, make_cost
from offloadctl.simulation.memory import peak_memory
from offloadctl.simulation.profiles import load_profile, profile_from_dict, write_profile
from offloadctl.simulation.result import simulate

from conftest import SAMPLES, fast_profiler
from models import make_model, save, tensor

MODELS = ["unet", "transformer", "training", "mlp"]


def two_weights_model():
    """Ten Relus (1 us each on FAST_LINK), then a = r10 + w1 (1.5 us) and b = a + w2 (1.5 us).

    A 4 KiB copy takes 2.5 us: w2 alone needs two nodes of lead (a and r10), w1 alone three, but the
    link carries one copy at a time, so w1 must be issued early enough to be done before w2 starts:
    four nodes.
    """
    nodes = [helper.make_node("Relu", [f"r{k}" if k else "x"], [f"r{k + 1}"], name=f"relu{k + 1}") for k in range(10)]
    nodes += [
        helper.make_node("Add", ["r10", "w1"], ["a"], name="add_a"),
        helper.make_node("Add", ["a", "w2"], ["b"], name="add_b"),
    ]
    weights = [
        numpy_helper.from_array(np.full(1024, v, dtype=np.float32), name) for name, v in (("w1", 0.5), ("w2", 0.25))
    ]
    return make_model(nodes, [tensor("x", (1024,))], [tensor("b", (1024,))], initializers=weights)


FAST_LINK = {
    "name": "fast-link",
    "description": "nodes priced by bytes: a 4 KiB Relu takes 1 us; a 4 KiB copy 2.5 us",
    "peak_flops": 1e15,
    "mem_bandwidth": 8.192e9,
    "kernel_launch_s": 0.0,
    "link": {
        "h2d": {"bandwidth": 4096 / 2.5e-6, "latency_s": 0.0},
        "d2h": {"bandwidth": 4096 / 2.5e-6, "latency_s": 0.0},
    },
    "source": "a test profile",
}


def _analysis(name: str):
    return analyse(load_model(SAMPLES / f"{name}.onnx"))


def _words(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(scope="module")
def measured_profile(tmp_path_factory):
    """A profile measured on CPU for the training sample, with the measurement sizes cut short."""
    with pytest.MonkeyPatch.context() as mp:
        fast_profiler(mp)
        doc = profiler.measure_profile(
            str(SAMPLES / "training.onnx"), "cpu", inputs=SAMPLES / "training.inputs.npz", repeat=2
        )
    path = tmp_path_factory.mktemp("profile") / "training.profile.json"
    write_profile(path, doc)
    return path


# ---------------------------------------------------------------------------------------------------
# prices
# ---------------------------------------------------------------------------------------------------


def test_a_copy_on_streams_costs_what_compute_does_not_hide():
    profile = profile_from_dict(FAST_LINK)
    timing = CopyTiming(profile, np.arange(13, dtype=np.float64) * 1e-6)  # 12 nodes of 1 us each
    cost = StreamStall(timing)
    assert not cost.linear and cost.copies == "streams"
    t = 2.5e-6
    share = 1e-3 * t
    # an H2D issued 3 nodes before its use hides behind 3 us: nothing left but its share of the link
    assert cost.h2d_at(4096, 5, 8) == pytest.approx(share)
    assert cost.h2d_at(4096, 7, 8) == pytest.approx(1.5e-6 + share)  # one node hides 1 us of 2.5
    assert cost.h2d_at(4096, 8, 8) == pytest.approx(t + share)  # no lead: all of it
    # a D2H the compute stream waits for right after its producer hides behind nothing
    assert cost.d2h_at(4096, 2, 2) == pytest.approx(t + share)
    assert cost.d2h_at(4096, 2, 4) == pytest.approx(0.5e-6 + share)  # released two nodes later
    inline = make_cost("time", profile)
    assert inline.linear and inline.h2d(4096) == pytest.approx(t) and inline.h2d_at(4096, 5, 8) == pytest.approx(t)
    with pytest.raises(ValueError):
        make_cost("time", profile, copies="streams")  # the stall needs the model's node times


def test_the_objective_defaults_to_time_with_a_measured_profile(measured_profile):
    assert default_objective(load_profile("ascend-910b")) == "bytes"
    assert default_objective(load_profile(str(measured_profile))) == "time"


def test_plan_says_which_objective_it_used(run_cli, measured_profile, tmp_path):
    model = SAMPLES / "training.onnx"
    budget = (lower_bound(_analysis("training"))[0] + peak_memory(_analysis("training"))[0]) // 2
    out = tmp_path / "plan.json"
    measured = run_cli("plan", model, "-o", out, "--budget", budget, "--params", "--profile", measured_profile)
    assert measured.exit_code == 0, measured.stderr
    assert "objective time, the default with a measured profile; copies in line" in _words(measured.stdout)
    doc = json.loads(out.read_text())
    assert doc["options"]["filter"]["objective"] == "time" and doc["budget"]["objective"]["objective"] == "time"
    assert doc["budget"]["compared"]["kept"] in ("time", "bytes")
    datasheet = run_cli("plan", model, "-o", out, "--budget", budget, "--params", "--json")
    assert datasheet.exit_code == 0, datasheet.stderr
    got = datasheet.json()
    assert got["objective"] == "bytes" and got["objective_default"] is True and got["copy_mode"] == "inline"
    assert json.loads(out.read_text())["options"]["filter"]["objective"] == "bytes"
    explicit = run_cli(
        "plan", model, "-o", out, "--budget", budget, "--params", "--profile", measured_profile, "--objective", "bytes"
    )
    assert explicit.exit_code == 0 and "objective bytes; copies in line" in _words(explicit.stdout)


# ---------------------------------------------------------------------------------------------------
# copies on streams
# ---------------------------------------------------------------------------------------------------


def test_streams_places_prefetches_for_a_shared_link(tmp_path):
    analysis = analyse(load_model(save(two_weights_model(), tmp_path / "two.onnx")))
    profile = profile_from_dict(FAST_LINK)
    selected = select(analysis, SelectPart(select_distance=0, params=True, force=("w1", "w2")))
    plan = prefetch(
        budget_filter(selected, analysis, PlanRequest.of_options(budget=None, profile=profile, copies="streams")),
        PrefetchPart(),
    )
    leads = {o["tensor"]: o["prefetch_distance"] for o in plan["offloads"]}
    assert leads == {"w1": 4, "w2": 2}
    times = simulate(analysis, plan, profile=profile).times
    assert times.overlapped == pytest.approx(times.baseline, rel=1e-12)  # both copies hidden
    # with the lead w1 needs on a link of its own, w2's copy queues behind it and the run waits
    for off in plan["offloads"]:
        if off["tensor"] == "w1":
            off["prefetch_distance"] = 3
    alone = simulate(analysis, prefetch(_unscheduled(plan), PrefetchPart()), profile=profile).times
    assert alone.overlapped > times.baseline + 0.4e-6
    # inline placement keeps the longest lead the budget allows: both from the start of the run
    inline = prefetch(
        budget_filter(selected, analysis, PlanRequest.of_options(budget=None, profile=profile, copies="inline")),
        PrefetchPart(),
    )
    assert {o["tensor"]: o["reload_groups"][0]["h2d_before"] for o in inline["offloads"]} == {"w1": 0, "w2": 0}


def _unscheduled(plan):
    """A scheduled plan taken back to stage 'filtered', keeping its per-tensor prefetch distances."""
    plan = json.loads(json.dumps(plan))
    plan["stage"] = "filtered"
    del plan["options"]["prefetch"]
    plan["history"].pop()
    for off in plan["offloads"]:
        off["release_after"] = None
        for group in off["reload_groups"]:
            group["h2d_before"] = None
    return plan


def test_optimal_takes_only_linear_objectives(run_cli, tmp_path, measured_profile):
    analysis = _analysis("training")
    budget = (lower_bound(analysis)[0] + peak_memory(analysis)[0]) // 2
    selected = select(analysis, SelectPart(select_distance=0, params=True))
    with pytest.raises(OffloadError, match="supports only the linear objectives"):
        budget_filter(
            selected, analysis, PlanRequest.of_options(budget=budget, objective="time", copies="streams", optimal=True)
        )
    out = tmp_path / "plan.json"
    model = SAMPLES / "training.onnx"
    result = run_cli(
        "plan", model, "-o", out, "--budget", budget, "--objective", "time", "--copies", "streams", "--optimal"
    )
    assert result.exit_code == 2 and "--optimal supports only the linear objectives" in _words(result.stderr)
    # the measured profile's default objective (time) says so too
    result = run_cli(
        "plan", model, "-o", out, "--budget", budget, "--copies", "streams", "--optimal", "--profile", measured_profile
    )
    assert result.exit_code == 2 and "the default with a measured profile" in _words(result.stderr)
    assert not out.exists()
    ok = run_cli("plan", model, "-o", out, "--budget", budget, "--copies", "streams", "--optimal", "--time-limit", "20")
    assert ok.exit_code == 0, ok.stderr  # bytes stays linear on streams


def test_streams_are_labelled_as_what_apply_writes_not_yet_timed_everywhere(run_cli, tmp_path):
    model = SAMPLES / "transformer.onnx"
    out, report = tmp_path / "plan.json", tmp_path / "plan.md"
    result = run_cli(
        "plan", model, "-o", out, "--budget", "600KiB", "--objective", "time", "--copies", "streams", "--report", report
    )
    assert result.exit_code == 0, result.stderr
    text = _words(result.stdout)
    label = "copies on streams, as apply --copies streams writes them, one copy stream and its event nodes"
    assert f"{label}; not yet timed on a device" in text
    assert "est. slowdown" in text and f"({label}; not yet timed on a device, profile" in text
    doc = read_plan(out)
    assert doc["options"]["filter"]["copies"] == "streams" and doc["budget"]["copies"] == "streams"
    assert doc["summary"]["estimate"]["copy_mode"] == "streams"
    assert "copies on streams (as apply --copies streams writes them" in report.read_text()
    got = run_cli("plan", model, "-o", out, "--budget", "600KiB", "--copies", "streams", "--json").json()
    assert got["copy_mode"] == "streams"
    applied = run_cli("apply", out, "-o", tmp_path / "m.onnx")
    assert applied.exit_code == 0 and f"{label}; not yet timed on a device" in _words(applied.stdout)


# ---------------------------------------------------------------------------------------------------
# the time objective against the bytes objective
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", MODELS)
def test_the_time_objective_is_never_slower_than_the_bytes_objective(name):
    analysis = _analysis(name)
    lb, peak = lower_bound(analysis)[0], peak_memory(analysis)[0]
    shorter = 0
    for budget in (lb + (peak - lb) * k // 10 for k in (2, 5, 8)):
        for copies, key in (("inline", "serialized"), ("streams", "overlapped")):
            by_bytes = scheduled_plan(
                analysis, PlanRequest.of_options(budget=budget, params=True, objective="bytes", copies=copies)
            )
            by_time = scheduled_plan(
                analysis, PlanRequest.of_options(budget=budget, params=True, objective="time", copies=copies)
            )
            t_bytes = getattr(simulate(analysis, by_bytes).times, key)
            t_time = getattr(simulate(analysis, by_time).times, key)
            assert t_time <= t_bytes * (1 + 1e-12), (budget, copies)
            assert peak_memory(analysis, by_time)[0] <= budget
            compared = by_time["budget"]["compared"]
            assert compared["copies"] == copies
            assert min(compared["stall_s"].values()) == pytest.approx(
                t_time - simulate(analysis).times.baseline, abs=1e-12
            )
            shorter += t_time < t_bytes * (1 - 1e-9)
    if name in ("unet", "training"):
        assert shorter  # where it matters, time-priced plans are faster


# ---------------------------------------------------------------------------------------------------
# --max-slowdown and the frontier
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", MODELS)
def test_max_slowdown_stays_within_and_beats_the_default_plan_where_the_frontier_can(name):
    analysis = _analysis(name)
    default_peak = simulate(analysis, scheduled_plan(analysis, PlanRequest())).peak_after
    frontier = Tradeoff(analysis, PlanRequest.of_options(strategy="frontier", params=True)).frontier()
    for copies, key in (("inline", "serialized"), ("streams", "overlapped")):
        plan = scheduled_plan(analysis, PlanRequest.of_options(max_slowdown=1.05, params=True, copies=copies))
        result = simulate(analysis, plan)
        assert getattr(result.times, key) <= 1.05 * result.times.baseline * (1 + 1e-9)
        within = [p for p in frontier[copies] if p.slowdown <= 1.05]
        assert within  # the peak itself, at 1.00x
        assert result.peak_after <= min(p.peak_bytes for p in within)
        if any(p.peak_bytes < default_peak for p in within):
            assert result.peak_after < default_peak
        info = plan["budget"]["max_slowdown"]
        assert info["copies"] == copies and info["slowdown"] == pytest.approx(
            getattr(result.times, key) / result.times.baseline
        )
        assert info["peak_bytes"] == result.peak_after and info["within"] == (
            result.peak_after < info["peak_before_bytes"]
        )


def test_max_slowdown_on_the_command_line(run_cli, tmp_path):
    model = SAMPLES / "training.onnx"
    out, report = tmp_path / "plan.json", tmp_path / "plan.md"
    result = run_cli("plan", model, "-o", out, "--max-slowdown", "1.05", "--params", "--report", report)
    assert result.exit_code == 0, result.stderr
    doc = read_plan(out)  # validated against the schema
    info = doc["budget"]["max_slowdown"]
    assert doc["options"]["filter"]["max_slowdown"] == 1.05 and info["requested"] == 1.05
    assert (
        info["within"] and info["slowdown"] <= 1.05 and info["budget_bytes"] == doc["options"]["filter"]["budget_bytes"]
    )
    assert info["peak_bytes"] < info["peak_before_bytes"] and info["budgets_tried"] >= 16
    text = _words(result.stdout)
    assert "max slowdown 1.05x (copies in line, profile ascend-910b): budget" in text
    assert "Max slowdown 1.05x" in report.read_text()
    for args in (("--budget", "700KiB"), ("--stream-weights",), ("--strategy", "distance"), ("--optimal",)):
        bad = run_cli("plan", model, "-o", tmp_path / "bad.json", "--max-slowdown", "1.05", *args)
        assert bad.exit_code == 2, args
    assert run_cli("plan", model, "-o", tmp_path / "bad.json", "--max-slowdown", "0.9").exit_code == 2
    assert not (tmp_path / "bad.json").exists()


def test_max_slowdown_with_nothing_within_offloads_nothing(run_cli, tmp_path):
    # the seed's copies cost more than 5% of its six tiny nodes whatever is offloaded
    out = tmp_path / "plan.json"
    result = run_cli("plan", SAMPLES / "seed.onnx", "-o", out, "--max-slowdown", "1.01", "--params")
    assert result.exit_code == 0, result.stderr
    info = read_plan(out)["budget"]["max_slowdown"]
    assert not info["within"] and info["budget_bytes"] is None and info["slowdown"] == 1.0
    assert "no cut in peak memory" in result.stderr and "offloads nothing" in _words(result.stdout)


def test_budget_grid_runs_from_the_peak_to_the_lower_bound():
    assert budget_grid(1000, 100, 4) == [1000, 700, 400, 100]
    assert budget_grid(1000, 1000, 16) == [1000]
    assert budget_grid(103, 100, 16) == [103, 102, 101, 100]


def test_frontier_json_and_plot(run_cli, tmp_path):
    model = SAMPLES / "unet.onnx"
    plot = tmp_path / "frontier.png"
    result = run_cli("frontier", model, "--params", "--points", "6", "--plot", plot, "--json")
    assert result.exit_code == 0, result.stderr
    doc = result.json()
    analysis = _analysis("unet")
    lb, peak = lower_bound(analysis)[0], peak_memory(analysis)[0]
    assert doc["command"] == "frontier" and doc["passed"] is True and doc["files_written"] == [str(plot)]
    assert doc["peak_bytes"] == peak and doc["lower_bound_bytes"] == lb and doc["objective"] == "bytes"
    assert set(doc["modes"]) == {"inline", "streams"}
    for mode in doc["modes"].values():
        points = mode["points"]
        # the lower bound itself is out of reach here: the sweep ends at the best peak reachable
        grid = budget_grid(peak, lb, 6)
        assert [p["budget_bytes"] for p in points[:-1]] == grid[:-1] and grid[-2] > points[-1]["budget_bytes"] > lb
        assert points[0]["peak_bytes"] == peak and points[0]["slowdown"] == 1.0 and points[0]["bytes_moved"] == 0
        assert all(lb <= p["peak_bytes"] <= p["budget_bytes"] for p in points)
        assert all({"budget_bytes", "peak_bytes", "time_s", "bytes_moved", "dominated"} <= set(p) for p in points)
    assert (
        "only" not in doc["modes"]["streams"]["label"]
        and "not yet timed on a device" in doc["modes"]["streams"]["label"]
    )
    assert doc["default_plan"]["peak_bytes"] == peak and doc["default_plan"]["offloads"] == 0
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert result.stderr.strip().splitlines()[-1].startswith("PASSED | frontier")
    text = run_cli("frontier", model, "--copies", "inline", "--points", "3")
    assert text.exit_code == 0 and "copies in line (what onnxruntime runs today)" in _words(text.stdout)
    assert "copies on streams" not in text.stdout.split("PASSED")[0]


def test_frontier_never_overwrites_an_input(run_cli, tmp_path):
    model = tmp_path / "unet.onnx"
    model.write_bytes((SAMPLES / "unet.onnx").read_bytes())
    before = model.read_bytes()
    for target in (model, tmp_path / "unet.svg"):
        if target.suffix == ".svg":
            target.symlink_to(model)
        result = run_cli("frontier", model, "--plot", target, "--points", "2")
        assert result.exit_code == 1 and "error:" in result.stderr
    assert model.read_bytes() == before
    bad = run_cli("frontier", model, "--plot", tmp_path / "f.jpg", "--points", "2")
    assert bad.exit_code == 1 and ".png or .svg" in bad.stderr and not (tmp_path / "f.jpg").exists()
    # a model already rewritten has no frontier and no --max-slowdown
    plan, rewritten = tmp_path / "plan.json", tmp_path / "unet.offload.onnx"
    assert run_cli("plan", model, "-o", plan, "--params", "--select-distance", "10").exit_code == 0
    assert run_cli("apply", plan, "-o", rewritten).exit_code == 0
    for args in (("frontier", rewritten), ("plan", rewritten, "-o", tmp_path / "again.json", "--max-slowdown", "1.05")):
        result = run_cli(*args)
        assert result.exit_code == 1 and "already contains copies" in result.stderr, args
    assert not (tmp_path / "again.json").exists()


def test_dominated_points():
    trade = Tradeoff(_analysis("mlp"), PlanRequest.of_options(strategy="frontier", params=True))
    trade_points = trade.frontier(("inline",), 6)["inline"]
    flags = dominated(trade_points)
    front = [p for p, d in zip(trade_points, flags) if not d]
    assert front  # the lowest peak is never dominated on peak
    for p, d in zip(trade_points, flags):
        if d:
            assert any(q.peak_bytes <= p.peak_bytes and q.time_s <= p.time_s for q in front)
