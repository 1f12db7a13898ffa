"""The budget search: its recorded bound and gap, the exact mode (HiGHS), and the time objective.

- Every budget plan records what it costs, a proven lower bound on what any plan must cost, and
  the gap; ``plan`` prints them.
- ``--optimal`` proves the optimum on every sample (budgets at 1.1x the lower bound and halfway to
  the peak), beats the greedy where the greedy is not optimal, and every solver answer is checked
  in exact integer bytes before it is trusted.
- ``--objective time`` prices each copy by its time in line on a device profile: with a slow-to-
  start link it prefers one large tensor to several small ones that move fewer bytes.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from offloadctl.analysis.graph import analyse
from offloadctl.analysis.timeline import lower_bound
from offloadctl.loading.model import load_model
from offloadctl.planning.budget import optimal as optimal_module
from offloadctl.planning.budget.build import bytes_moved
from offloadctl.planning.budget.strategy import budget_filter
from offloadctl.planning.prefetch import prefetch
from offloadctl.planning.request import PlanRequest, PrefetchPart, SelectPart
from offloadctl.planning.select import select
from offloadctl.simulation.costs import BytesMoved, InlineTime, make_cost, plan_cost
from offloadctl.simulation.memory import peak_memory
from offloadctl.simulation.profiles import profile_from_dict
from offloadctl.simulation.result import simulate

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_models"

# At the Relus making p2 and p3 the peak is 6128 bytes; `big` (1 KiB) or the four `s` (252 bytes
# each) idle across both steps, nothing else does. Budget 5128: 1000 bytes must go. The four small
# tensors move 2016 bytes (a D2H and an H2D each), `big` moves 2048, but with 8 copies instead of 2.
BIG_OR_SMALL = """
<ir_version: 10, opset_import: ["" : 17]>
g (float[256] xb, float[63] x1, float[63] x2, float[63] x3, float[63] x4, float[256] xp) => (float y) {
    big = Neg(xb)
    s1 = Neg(x1)
    s2 = Neg(x2)
    s3 = Neg(x3)
    s4 = Neg(x4)
    p1 = Concat <axis = 0> (xp, xp)
    p2 = Relu(p1)
    p3 = Relu(p2)
    rb = ReduceSum <keepdims = 0> (big)
    r1 = ReduceSum <keepdims = 0> (s1)
    r2 = ReduceSum <keepdims = 0> (s2)
    r3 = ReduceSum <keepdims = 0> (s3)
    r4 = ReduceSum <keepdims = 0> (s4)
    rp = ReduceSum <keepdims = 0> (p3)
    y = Sum(rb, r1, r2, r3, r4, rp)
}
"""

SLOW_START = {
    "name": "slow-start",
    "description": "a link where every copy costs a millisecond before the first byte",
    "peak_flops": 1e12,
    "mem_bandwidth": 1e11,
    "kernel_launch_s": 1e-6,
    "link": {"h2d": {"bandwidth": 1e9, "latency_s": 1e-3}, "d2h": {"bandwidth": 1e9, "latency_s": 1e-3}},
    "source": "a test profile",
}


def _analysis(path: Path):
    return analyse(load_model(path))


def _plan(analysis, budget, **kw):
    selected = select(analysis, SelectPart(select_distance=0, params=kw.pop("params", True)))
    return prefetch(
        budget_filter(selected, analysis, PlanRequest.of_options(budget=budget, prefetch_distance=0, **kw)),
        PrefetchPart(prefetch_distance=0),
    )


def _words(text: str) -> str:
    """Output with rich's line wrapping undone."""
    return " ".join(text.split())


def _budgets(analysis):
    lb, _ = lower_bound(analysis)
    peak = peak_memory(analysis)[0]
    return [b for b in (int(1.1 * lb), (lb + peak) // 2) if b < peak]


# ---------------------------------------------------------------------------------------------------
# cost, bound and gap
# ---------------------------------------------------------------------------------------------------


def test_the_plan_records_its_cost_a_proven_bound_and_the_gap(write_model):
    analysis = _analysis(write_model(BIG_OR_SMALL))
    assert peak_memory(analysis)[0] == 6128 and lower_bound(analysis)[0] == 4096
    plan = _plan(analysis, 5128)
    info = plan["budget"]
    assert sorted(o["tensor"] for o in plan["offloads"]) == ["s1", "s2", "s3", "s4"]
    assert info["search"] == "greedy" and info["objective"] == {"objective": "bytes", "unit": "bytes"}
    assert info["cost"] == bytes_moved(plan) == info["bytes_moved"] == 2016
    # freeing 1000 bytes at the peak step costs at least 2 bytes moved per byte (a D2H and an H2D)
    assert info["bound_source"] == "steps" and info["cost_bound"] == 2000
    assert info["gap"] == pytest.approx(16 / 2016)
    assert info["optimal"] is False and info["solver"] is None


@pytest.mark.parametrize("name", ["seed", "unet", "transformer", "training", "mlp"])
def test_the_recorded_bound_never_exceeds_the_proven_optimum(name):
    analysis = _analysis(SAMPLES / f"{name}.onnx")
    for budget in _budgets(analysis):
        greedy = _plan(analysis, budget)["budget"]
        exact = _plan(analysis, budget, optimal=True)["budget"]
        assert exact["optimal"] is True, exact["solver"]
        assert greedy["cost_bound"] <= exact["cost"] <= greedy["cost"]


# ---------------------------------------------------------------------------------------------------
# the exact search
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["seed", "unet", "transformer", "training", "mlp"])
def test_optimal_proves_the_optimum_on_every_sample(name):
    analysis = _analysis(SAMPLES / f"{name}.onnx")
    budgets = _budgets(analysis)
    assert budgets
    for budget in budgets:
        plan = _plan(analysis, budget, optimal=True)
        info = plan["budget"]
        assert info["search"] == "exact" and info["optimal"] is True
        assert info["solver"]["status"] == "optimal" and info["solver"]["seconds"] < 60
        assert info["gap"] == 0 and info["cost_bound"] == info["cost"] == bytes_moved(plan)
        assert simulate(analysis, plan, profile=None).peak_after <= budget


def test_optimal_beats_the_greedy_where_it_can():
    """On the training sample at 1.1x its lower bound the greedy moves 4.5% more than it must."""
    analysis = _analysis(SAMPLES / "training.onnx")
    budget = int(1.1 * lower_bound(analysis)[0])
    greedy = _plan(analysis, budget)
    exact = _plan(analysis, budget, optimal=True)
    assert exact["budget"]["solver"]["answer"] == "accepted"
    assert bytes_moved(exact) == 720896 < bytes_moved(greedy) == 753664
    assert greedy["budget"]["cost_bound"] <= 720896
    assert peak_memory(analysis, exact)[0] <= budget


def test_a_solver_answer_that_breaks_the_budget_is_set_aside(monkeypatch):
    """Solver tolerances can hide a few bytes over the budget: the answer is checked in integers."""
    analysis = _analysis(SAMPLES / "training.onnx")
    budget = int(1.1 * lower_bound(analysis)[0])
    real = optimal_module.solve_cover

    def off_by_one_interval(problem, **kw):
        found = real(problem, **kw)
        values = found.values.copy()
        chosen = [c for c, v in enumerate(values) if v > 0.5 and problem.cost[c] > 0 and problem.lower[c] == 0]
        values[chosen[0]] = 0.0  # one interval fewer: cheaper, and over the budget
        found.values = values
        return found

    monkeypatch.setattr(optimal_module, "solve_cover", off_by_one_interval)
    plan = _plan(analysis, budget, optimal=True)
    info = plan["budget"]
    assert info["solver"]["answer"].startswith("rejected: its plan peaks at")
    assert info["optimal"] is False
    assert bytes_moved(plan) == 753664  # the greedy's plan
    assert simulate(analysis, plan, profile=None).peak_after <= budget


def test_optimal_with_a_release_distance_fits_and_is_no_worse():
    analysis = _analysis(SAMPLES / "unet.onnx")
    lb, _ = lower_bound(analysis)
    budget = (lb + peak_memory(analysis)[0]) // 2
    selected = select(analysis, SelectPart(select_distance=0, params=True))
    costs = []
    for optimal in (False, True):
        filtered = budget_filter(
            selected, analysis, PlanRequest.of_options(budget=budget, release_distance=2, optimal=optimal)
        )
        plan = prefetch(filtered, PrefetchPart(release_distance=2))
        assert simulate(analysis, plan, profile=None).peak_after == plan["budget"]["predicted_peak_bytes"] <= budget
        costs.append(plan["budget"]["cost"])
    assert costs[1] <= costs[0]


def test_the_time_limit_holds_and_keeps_the_best_plan_found():
    analysis = _analysis(SAMPLES / "transformer.onnx")
    budget = (lower_bound(analysis)[0] + peak_memory(analysis)[0]) // 2
    plan = _plan(analysis, budget, optimal=True, time_limit=0.01)
    info = plan["budget"]
    assert info["solver"]["time_limit_s"] == 0.01 and info["solver"]["seconds"] < 5
    assert peak_memory(analysis, plan)[0] <= budget


# ---------------------------------------------------------------------------------------------------
# the time objective
# ---------------------------------------------------------------------------------------------------


def test_the_time_objective_prefers_fewer_copies_on_a_slow_starting_link(write_model):
    analysis = _analysis(write_model(BIG_OR_SMALL))
    profile = profile_from_dict(SLOW_START)
    for optimal in (False, True):
        by_bytes = _plan(analysis, 5128, optimal=optimal)
        by_time = _plan(analysis, 5128, objective="time", profile=profile, optimal=optimal)
        assert sorted(o["tensor"] for o in by_bytes["offloads"]) == ["s1", "s2", "s3", "s4"]
        assert [o["tensor"] for o in by_time["offloads"]] == ["big"]
        info = by_time["budget"]
        assert info["objective"] == {
            "objective": "time",
            "unit": "seconds",
            "profile": "slow-start",
            "copies": "inline",
        }
        assert (
            info["cost"]
            == pytest.approx(plan_cost(by_time, InlineTime(profile)))
            == pytest.approx(2 * (1e-3 + 1024 / 1e9))
        )
        # the simulator's serialized time adds exactly these copies to the baseline
        times = simulate(analysis, by_time, profile=profile).times
        assert times.serialized - times.baseline == pytest.approx(info["cost"])
        assert info["cost_bound"] <= info["cost"]


def test_costs_price_copies():
    profile = profile_from_dict(SLOW_START)
    assert make_cost("bytes") == BytesMoved() and BytesMoved().d2h(100) == 100
    assert make_cost("time", profile).h2d(1000) == pytest.approx(1e-3 + 1e-6)
    with pytest.raises(ValueError):
        make_cost("energy")


# ---------------------------------------------------------------------------------------------------
# the command line
# ---------------------------------------------------------------------------------------------------


def test_plan_prints_and_records_the_gap(run_cli, write_model, tmp_path):
    model = write_model(BIG_OR_SMALL)
    out = tmp_path / "plan.json"
    result = run_cli("plan", model, "-o", out, "--budget", "5128", "--prefetch-distance", "0")
    assert result.exit_code == 0, result.stderr
    text = _words(result.stdout)
    assert (
        "budget search (greedy, objective bytes, the default with a datasheet profile; copies in line): "
        "the plan moves 1.97 KiB; proven bound 1.95 KiB" in text
    )
    assert "gap 0.8%" in text
    doc = json.loads(out.read_text())
    assert doc["budget"]["gap"] == pytest.approx(16 / 2016)
    result = run_cli("plan", model, "-o", out, "--budget", "5128", "--optimal", "--time-limit", "30")
    assert result.exit_code == 0, result.stderr
    assert "the plan moves 1.97 KiB, proven optimal; HiGHS: optimal" in _words(result.stdout)
    assert "budget search (exact, objective bytes" in _words(result.stdout)
    doc = json.loads(out.read_text())
    assert doc["budget"]["optimal"] is True and doc["options"]["filter"]["optimal"] is True
    assert doc["options"]["filter"]["time_limit_s"] == 30


def test_time_objective_on_the_command_line(run_cli, write_model, tmp_path):
    model = write_model(BIG_OR_SMALL)
    profile = tmp_path / "slow.json"
    profile.write_text(json.dumps(SLOW_START))
    out = tmp_path / "plan.json"
    result = run_cli("plan", model, "-o", out, "--budget", "5128", "--objective", "time", "--profile", profile)
    assert result.exit_code == 0, result.stderr
    assert "the plan's copies take 2.002 ms in line (profile slow-start)" in _words(result.stdout)
    doc = json.loads(out.read_text())
    assert [o["tensor"] for o in doc["offloads"]] == ["big"]
    assert doc["options"]["filter"]["objective"] == "time" and doc["options"]["filter"]["profile"] == "slow-start"
    selected = tmp_path / "selected.json"
    assert run_cli("select", model, "-o", selected).exit_code == 0
    filtered = tmp_path / "filtered.json"
    result = run_cli(
        "filter", selected, "-o", filtered, "--budget", "5128", "--objective", "time", "--profile", profile
    )
    assert result.exit_code == 0, result.stderr
    assert [o["tensor"] for o in json.loads(filtered.read_text())["offloads"]] == ["big"]


@pytest.mark.parametrize(
    "args",
    [
        ("--optimal",),
        ("--objective", "time"),
        ("--optimal", "--strategy", "distance"),
        ("--budget", "5128", "--time-limit", "0"),
    ],
)
def test_search_options_without_a_budget_are_usage_errors(run_cli, write_model, tmp_path, args):
    out = tmp_path / "plan.json"
    result = run_cli("plan", write_model(BIG_OR_SMALL), "-o", out, *args)
    assert result.exit_code == 2
    assert not out.exists()


def test_an_unknown_profile_is_a_clear_error(run_cli, write_model, tmp_path):
    out = tmp_path / "plan.json"
    result = run_cli(
        "plan",
        write_model(BIG_OR_SMALL),
        "-o",
        out,
        "--budget",
        "5128",
        "--objective",
        "time",
        "--profile",
        "no-such-device",
    )
    assert result.exit_code == 1 and "error:" in result.stderr and "no-such-device" in result.stderr
    assert not out.exists()


def test_the_bound_is_proven_for_random_budgets():
    """The greedy's recorded bound is never above the cost of the optimum HiGHS proves."""
    analysis = _analysis(SAMPLES / "unet.onnx")
    lb, _ = lower_bound(analysis)
    peak = peak_memory(analysis)[0]
    for fraction in np.linspace(0.05, 0.95, 5):
        budget = int(lb + fraction * (peak - lb))
        greedy = _plan(analysis, budget)["budget"]
        exact = _plan(analysis, budget, optimal=True)["budget"]
        assert exact["optimal"] and greedy["cost_bound"] <= exact["cost"] <= greedy["cost"]
