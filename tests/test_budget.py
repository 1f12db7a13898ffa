"""The budget strategy: fits the budget at the least bytes moved, agrees with the simulator, runs identically."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from offloadctl.analysis.graph import analyse
from offloadctl.analysis.timeline import lower_bound
from offloadctl.contract.document import read_plan
from offloadctl.core.errors import OffloadError
from offloadctl.core.units import parse_bytes
from offloadctl.loading.model import load_model
from offloadctl.planning.budget.build import bytes_moved
from offloadctl.planning.budget.strategy import budget_filter, plan_peak
from offloadctl.planning.explain import explain_rows
from offloadctl.planning.filter import filter_plan
from offloadctl.planning.make import scheduled_plan
from offloadctl.planning.prefetch import prefetch
from offloadctl.planning.request import FilterPart, PlanRequest, PrefetchPart, Progress, SelectPart
from offloadctl.planning.select import select
from offloadctl.rewriting.rewrite import apply_plan
from offloadctl.rewriting.writing import write_model
from offloadctl.simulation.memory import peak_memory
from offloadctl.simulation.result import simulate

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_models"
SAMPLE_NAMES = ["seed", "unet", "transformer", "training", "mlp"]

# `s` (4 bytes) is read early (position 1) and at the very end (10): a gap of 9. `b` (1 KiB) is read at
# 3 and 8: a gap of 5. The peak (4100 bytes: b, s, t1, t2, t3 at position 6) lies inside b's gap;
# the lower bound is 3072 bytes (three 1 KiB tensors at Add t3 and at Add u).
TWO_CANDIDATES = """
<ir_version: 10, opset_import: ["" : 17]>
g (float[1] xs, float[256] xb) => (float[256] y) {
    s = Neg(xs)
    s1 = Abs(s)
    b = Neg(xb)
    b1 = Abs(b)
    t1 = Relu(b1)
    t2 = Relu(t1)
    t3 = Add(t1, t2)
    t4 = Relu(t3)
    u = Add(t4, b)
    v = Relu(u)
    y = Add(v, s)
}
"""


def _analysis(path: Path):
    return analyse(load_model(path))


def _budget_plan(analysis, budget, *, prefetch_distance=50, release_distance=0, **select_kw):
    selected = select(analysis, SelectPart(**select_kw))
    filtered = budget_filter(
        selected,
        analysis,
        PlanRequest.of_options(budget=budget, prefetch_distance=prefetch_distance, release_distance=release_distance),
    )
    scheduled = prefetch(filtered, PrefetchPart(prefetch_distance=prefetch_distance, release_distance=release_distance))
    return filtered, scheduled


def _feeds(name: str) -> dict:
    with np.load(SAMPLES / f"{name}.inputs.npz") as data:
        return {k: data[k] for k in data.files}


def _run(path: Path, feeds: dict, *, weights: bool) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    disabled = ["ConstantFolding"] if weights else []
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"], disabled_optimizers=disabled)
    return sess.run(None, feeds)


# ---------------------------------------------------------------------------------------------


def test_budget_beats_distance_with_the_same_number_of_offloads(write_model):
    analysis = _analysis(write_model(TWO_CANDIDATES))
    assert plan_peak(analysis)[0] == peak_memory(analysis)[0] == 4100
    assert lower_bound(analysis) == (3072, 6)
    budget = 3100
    filtered, scheduled = _budget_plan(analysis, budget)
    assert [o["tensor"] for o in scheduled["offloads"]] == ["b"]
    assert peak_memory(analysis, scheduled)[0] <= budget
    # The distance strategy with one offload: whatever the select and prefetch distances, it
    # keeps the first candidate in first-use order (s), and that does not fit.
    best = min(
        peak_memory(
            analysis,
            scheduled_plan(analysis, PlanRequest.of_options(select_distance=sd, select_num=1, prefetch_distance=pd)),
        )[0]
        for sd in range(0, 12)
        for pd in (0, 1, 2, 50)
    )
    assert best > budget


def test_budget_moves_fewer_bytes_than_offloading_everything(write_model):
    analysis = _analysis(write_model(TWO_CANDIDATES))
    _, scheduled = _budget_plan(analysis, 3100)
    everything = scheduled_plan(analysis, PlanRequest.of_options(select_distance=0, prefetch_distance=0))
    assert peak_memory(analysis, everything)[0] <= 3100
    assert bytes_moved(scheduled) < bytes_moved(everything)
    assert scheduled["budget"]["bytes_moved"] == bytes_moved(scheduled) == 2 * 1024


def test_prefetch_distance_is_cut_to_keep_the_budget(write_model):
    analysis = _analysis(write_model(TWO_CANDIDATES))
    _, scheduled = _budget_plan(analysis, 3100, prefetch_distance=4)
    b = scheduled["offloads"][0]
    # prefetching b by 1 puts its reload at position 7 (t3, t4, b: 3076 bytes, fits); by 2 at 6 (too much)
    assert b["prefetch_distance"] == 1
    assert b["reload_groups"][0]["h2d_before"] == 7
    assert peak_memory(analysis, scheduled)[0] <= 3100
    _, roomy = _budget_plan(analysis, 4099, prefetch_distance=4)
    assert peak_memory(analysis, roomy)[0] <= 4099


def test_budget_met_without_offload_offloads_nothing(write_model):
    analysis = _analysis(write_model(TWO_CANDIDATES))
    filtered, scheduled = _budget_plan(analysis, 5000)
    assert scheduled["offloads"] == []
    reasons = {r["tensor"]: r["reason"] for r in scheduled["rejected"]}
    assert reasons["b"] == reasons["s"] == "budget-not-needed"
    assert scheduled["strategy"] == "budget"
    assert scheduled["options"]["filter"]["strategy"] == "budget"
    assert scheduled["options"]["filter"]["budget_bytes"] == 5000


def test_never_and_force_are_respected(write_model):
    analysis = _analysis(write_model(TWO_CANDIDATES))
    with pytest.raises(OffloadError, match=r"best peak reachable is 4.00 KiB \(4096 bytes"):
        _budget_plan(analysis, 3100, never=("b",))
    _, scheduled = _budget_plan(analysis, 3100, force=("s",))
    by = {o["tensor"]: o for o in scheduled["offloads"]}
    assert set(by) == {"b", "s"}
    assert by["s"].get("forced") is True and "forced" not in by["b"]
    assert peak_memory(analysis, scheduled)[0] <= 3100
    # forced even when nothing is needed
    _, roomy = _budget_plan(analysis, 5000, force=("s",))
    assert [o["tensor"] for o in roomy["offloads"]] == ["s"]


def test_never_respected_on_a_sample_model():
    analysis = _analysis(SAMPLES / "unet.onnx")
    lb, _ = lower_bound(analysis)
    budget = (lb + peak_memory(analysis)[0]) // 2
    free, _ = _budget_plan(analysis, budget, params=True)
    target = max(free["offloads"], key=lambda o: o["bytes"])["tensor"]
    _, plan = _budget_plan(analysis, budget, params=True, never=(target,))
    assert target not in {o["tensor"] for o in plan["offloads"]}
    assert {r["tensor"]: r["reason"] for r in plan["rejected"]}[target] == "never"
    assert peak_memory(analysis, plan)[0] <= budget


def test_budget_below_lower_bound_fails_without_output(run_cli, write_model, tmp_path):
    model = write_model(TWO_CANDIDATES)
    out = tmp_path / "plan.json"
    result = run_cli("plan", model, "-o", out, "--budget", "3000")
    assert result.exit_code == 1
    assert "lower bound 3.00 KiB (3072 bytes)" in result.stderr
    assert "give --budget 3.00KiB or more" in result.stderr  # the units of the tables, pasteable
    assert not out.exists()


def test_unreachable_budget_gives_best_peak(run_cli, write_model, tmp_path):
    model = write_model(TWO_CANDIDATES)
    out = tmp_path / "plan.json"
    result = run_cli("plan", model, "-o", out, "--budget", "3100", "--never", "b")
    assert result.exit_code == 1
    assert "best peak reachable is 4.00 KiB (4096 bytes" in result.stderr and "lower bound 3.00 KiB" in result.stderr
    assert "at least 4.00KiB" in result.stderr
    assert not out.exists()


def test_cli_plan_and_filter_record_the_budget(run_cli, write_model, tmp_path):
    model = write_model(TWO_CANDIDATES)
    out = tmp_path / "plan.json"
    result = run_cli("plan", model, "-o", out, "--budget", "3.1KB", "--explain")
    assert result.exit_code == 0, result.stderr
    plan = json.loads(out.read_text())
    assert plan["strategy"] == "budget"
    assert plan["budget"]["requested_bytes"] == 3100
    assert plan["budget"]["lower_bound_bytes"] == 3072
    assert plan["budget"]["predicted_peak_bytes"] <= 3100
    assert plan["budget"]["bytes_moved"] == 2048
    assert "budget-not-needed" in result.stdout and "offloaded" in result.stdout

    selected = tmp_path / "selected.json"
    filtered = tmp_path / "filtered.json"
    assert run_cli("select", model, "-o", selected).exit_code == 0
    result = run_cli("filter", selected, "-o", filtered, "--budget", "3100", "--explain")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(filtered.read_text())
    assert doc["stage"] == "filtered" and [o["tensor"] for o in doc["offloads"]] == ["b"]
    assert doc["offloads"][0]["prefetch_distance"] == 1  # safe with any later global distance
    assert "candidates (budget strategy" in result.stdout


def test_strategy_option_conflicts_are_usage_errors(run_cli, write_model, tmp_path):
    model = write_model(TWO_CANDIDATES)
    out = tmp_path / "plan.json"
    assert run_cli("plan", model, "-o", out, "--strategy", "distance", "--budget", "1MB").exit_code == 2
    assert run_cli("plan", model, "-o", out, "--strategy", "budget").exit_code == 2
    assert not out.exists()


def test_distance_stays_the_default(write_model):
    analysis = _analysis(write_model(TWO_CANDIDATES))
    plan = scheduled_plan(analysis, PlanRequest.of_options(select_distance=2))
    assert plan["strategy"] == "distance" and "budget" not in plan
    assert plan == prefetch(filter_plan(select(analysis, SelectPart(select_distance=2)), FilterPart()), PrefetchPart())


@pytest.mark.parametrize("name", SAMPLE_NAMES)
def test_sample_budgets_fit_and_match_the_simulator(name):
    analysis = _analysis(SAMPLES / f"{name}.onnx")
    lb, _ = lower_bound(analysis)
    before = peak_memory(analysis)[0]
    assert before == plan_peak(analysis)[0]
    fitted = 0
    for frac in np.linspace(0.0, 1.0, 5):
        budget = int(1.1 * lb + frac * (before - 1.1 * lb))
        for pd, rd in ((50, 0), (3, 1)):
            try:
                filtered, scheduled = _budget_plan(analysis, budget, prefetch_distance=pd, release_distance=rd)
            except OffloadError as exc:
                # a failure must say what is reachable, and be above the budget
                best = int(re.search(r"best peak reachable is [^(]*\((\d+) bytes", str(exc)).group(1))
                assert best > budget
                # with release distance 0 every budget from 1.1x the lower bound must fit
                assert rd > 0
                continue
            sim = peak_memory(analysis, scheduled)[0]
            assert sim <= budget
            assert filtered["budget"]["predicted_peak_bytes"] == sim  # internal accounting == simulator
            assert plan_peak(analysis, scheduled)[0] == sim
            fitted += 1
    assert fitted >= 4


def test_weight_streaming_keeps_depth_plus_one_groups(write_model):
    analysis = _analysis(SAMPLES / "transformer.onnx")
    weights = sum(analysis.infos[w].bytes or 0 for w in analysis.weights if w in analysis.uses)
    for depth in (0, 1, 2):
        selected = select(analysis, SelectPart(params=True))
        filtered = budget_filter(
            selected, analysis, PlanRequest.of_options(budget=None, stream_weights=True, stream_depth=depth)
        )
        scheduled = prefetch(filtered, PrefetchPart())
        info = filtered["budget"]["stream_weights"]
        assert info["groups"] > 3 and info["depth"] == depth
        streamed = {o["tensor"] for o in scheduled["offloads"] if o["kind"] == "parameter"}
        assert streamed
        before = simulate(analysis, profile=None)
        after = simulate(analysis, scheduled, profile=None)
        resident = weights - info["streamed_bytes"]
        assert after.after.resident_device == resident
        activations_peak = before.peak_before - weights
        assert after.peak_after <= resident + (depth + 1) * info["largest_group_bytes"] + activations_peak
        assert after.peak_after < before.peak_before


def test_weight_streaming_with_a_budget(run_cli, tmp_path):
    analysis = _analysis(SAMPLES / "mlp.onnx")
    lb, _ = lower_bound(analysis)
    budget = int(lb * 1.5)
    selected = select(analysis, SelectPart())
    filtered = budget_filter(selected, analysis, PlanRequest.of_options(budget=budget, stream_weights=True))
    scheduled = prefetch(filtered, PrefetchPart())
    assert scheduled["budget"]["predicted_peak_bytes"] <= budget
    # the planner's own peak is the timeline's (which the simulator follows)
    assert scheduled["budget"]["predicted_peak_bytes"] == plan_peak(analysis, scheduled, prefetch_distance=0)[0]
    out = tmp_path / "plan.json"
    result = run_cli("plan", SAMPLES / "mlp.onnx", "-o", out, "--stream-weights", "--stream-depth", "2")
    assert result.exit_code == 0, result.stderr
    assert json.loads(out.read_text())["budget"]["stream_weights"]["depth"] == 2


@pytest.mark.parametrize("name", ["unet", "transformer", "training"])
def test_budget_plans_run_bit_identical_on_cpu(name, tmp_path):
    path = SAMPLES / f"{name}.onnx"
    analysis = _analysis(path)
    lb, _ = lower_bound(analysis)
    budget = int(lb * 1.3)
    _, scheduled = _budget_plan(analysis, budget, prefetch_distance=3)
    assert scheduled["offloads"]
    out = tmp_path / f"{name}.budget.onnx"
    write_model(apply_plan(scheduled, analysis), out, source_dir=path.parent)
    feeds = _feeds(name)
    weights = any(o["kind"] == "parameter" for o in scheduled["offloads"])
    want = _run(path, feeds, weights=False)
    got = _run(out, feeds, weights=weights)
    assert len(want) == len(got)
    for w, g in zip(want, got):
        assert np.array_equal(w, g)


@pytest.mark.parametrize(
    "text, expected",
    [("1.5GiB", 1610612736), ("800MB", 800_000_000), ("4096", 4096), ("64KiB", 65536), ("3.1KB", 3100)],
)
def test_byte_sizes_parse(text, expected):
    assert parse_bytes(text) == expected


def test_bad_byte_size_is_a_usage_error(run_cli, write_model, tmp_path):
    result = run_cli("plan", write_model(TWO_CANDIDATES), "-o", tmp_path / "p.json", "--budget", "lots")
    assert result.exit_code == 2
    assert "not a byte size" in result.stderr


def test_filter_finds_the_model_beside_the_plan(run_cli, write_model, tmp_path, monkeypatch):
    model = write_model(TWO_CANDIDATES)
    selected = tmp_path / "selected.json"
    assert run_cli("select", model, "-o", selected).exit_code == 0
    plan = json.loads(selected.read_text())
    plan["model"]["path"] = "elsewhere/model.onnx"
    selected.write_text(json.dumps(plan))
    monkeypatch.chdir(tmp_path.parent)
    result = run_cli("filter", selected, "-o", tmp_path / "filtered.json", "--budget", "3100")
    assert result.exit_code == 0, result.stderr
    other = write_model(TWO_CANDIDATES.replace("Relu(u)", "Sigmoid(u)"), name="other.onnx")
    plan["model"]["path"] = str(other)
    selected.write_text(json.dumps(plan))
    result = run_cli("filter", selected, "-o", tmp_path / "f2.json", "--budget", "3100")
    assert result.exit_code == 1 and "sha256" in result.stderr
    assert not (tmp_path / "f2.json").exists()


def test_explain_lists_distance_rejections(run_cli, write_model, tmp_path):
    result = run_cli(
        "plan", write_model(TWO_CANDIDATES), "-o", tmp_path / "p.json", "--select-distance", "6", "--explain"
    )
    assert result.exit_code == 0, result.stderr
    assert "offloaded" in result.stdout and "rejected" in result.stdout
    rows = {r["tensor"]: r for r in explain_rows(read_plan(tmp_path / "p.json"))}
    assert rows["s"]["status"] == "offloaded" and rows["s"]["detail"].startswith(
        "largest idle stretch 9 > select distance 6"
    )
    assert rows["b"]["status"] == "rejected" and rows["b"]["reason"] == "short-gaps" and rows["b"]["max_gap"] == 5


def test_graph_outputs_nobody_reads_are_offloaded_over_their_trailing_stretch(tmp_path):
    """Training graphs: gradients are graph outputs made early and read by nobody."""
    from offloadctl.simulation.memory import lower_bound

    model = SAMPLES / "training.onnx"
    analysis = analyse(load_model(model))
    lb, at = lower_bound(analysis)
    assert at == analysis.num_positions  # all gradients on the device at the end
    budget = int(1.1 * lb)
    selected = select(analysis, SelectPart(select_distance=100))
    plan = prefetch(
        budget_filter(selected, analysis, PlanRequest.of_options(budget=budget, prefetch_distance=0)),
        PrefetchPart(prefetch_distance=0),
    )
    tails = [o for o in plan["offloads"] if not o["reload_groups"]]
    assert tails and all(o["graph_output"] and o["output_h2d_before"] == analysis.num_positions for o in tails)
    names = [o["tensor"] for o in plan["offloads"]]
    assert not {r["tensor"] for r in plan["rejected"]} & set(names)  # never both chosen and rejected
    assert peak_memory(analysis, plan)[0] <= budget
    rewritten = tmp_path / "training.offload.onnx"
    write_model(apply_plan(plan, analysis), rewritten, source_dir=model.parent)
    so = ort.SessionOptions()
    so.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    inputs = dict(np.load(SAMPLES / "training.inputs.npz"))
    want = ort.InferenceSession(str(model), so, providers=["CPUExecutionProvider"]).run(None, inputs)
    got = ort.InferenceSession(str(rewritten), so, providers=["CPUExecutionProvider"]).run(None, inputs)
    assert all(np.array_equal(a, b) for a, b in zip(want, got))


def test_budget_with_dynamic_inputs_not_pinned_is_refused(run_cli, write_model, tmp_path):
    path = write_model("""
    <ir_version: 10, opset_import: ["" : 17]>
    g (float[N, 64] x) => (float[N, 64] y) {
        a = Neg(x)
        b = Relu(a)
        c = Relu(b)
        y = Add(c, a)
    }
    """)
    result = run_cli("plan", path, "-o", tmp_path / "p.json", "--budget", "1KiB")
    assert result.exit_code == 1
    assert "dynamic" in result.stderr and "--input-shape" in result.stderr
    assert not (tmp_path / "p.json").exists()
    pinned = run_cli("plan", path, "-o", tmp_path / "p.json", "--budget", "2KiB", "--input-shape", "x=2,64")
    assert pinned.exit_code == 0, pinned.stderr


def test_the_budget_search_reports_the_peak_left_to_fit():
    analysis = _analysis(SAMPLES / "transformer.onnx")
    lb, _ = lower_bound(analysis)
    before, _ = plan_peak(analysis, None)
    lines: list[str] = []
    budget = int(lb * 1.1)
    assert budget < before
    budget_filter(
        select(analysis, SelectPart()),
        analysis,
        PlanRequest.of_options(budget=budget),
        Progress(lambda text, new=True: lines.append(text)),
    )
    searching = [line for line in lines if "peak" in line]
    assert searching and all(f"budget {budget / 2**20:.1f} MiB" in line for line in searching)
    assert f"peak {before / 2**20:.1f} MiB" in searching[0]
    assert lines[-2:] == [
        "fitting the budget: dropping offloads it does not need",
        "fitting the budget: placing prefetches",
    ]


@pytest.mark.parametrize("name", SAMPLE_NAMES)
@pytest.mark.parametrize("min_bytes", [0, 1024, 65536])
def test_a_plan_for_its_figures_alone_offloads_what_the_budget_plan_offloads(name, min_bytes):
    """`budget_figures` (what a weak plan's next step runs) lists no rejections and takes the same
    offloads, so the peak and time it quotes are the plan's."""
    from offloadctl.planning.budget.strategy import BudgetUnreachable, budget_figures, budget_plan
    from offloadctl.planning.request import PlanRequest

    analysis = _analysis(SAMPLES / f"{name}.onnx")
    lb, _ = lower_bound(analysis)
    budget = (lb + plan_peak(analysis, None)[0]) // 2
    request = PlanRequest.of_options(budget=budget, params=True, min_bytes=min_bytes)
    try:
        full = budget_plan(analysis, request).plan
    except BudgetUnreachable as unreachable:  # too few candidates over --min-bytes: the same for both
        with pytest.raises(BudgetUnreachable) as also:
            budget_figures(analysis, request)
        assert also.value.reachable == unreachable.reachable
        return
    alone = budget_figures(analysis, request).plan
    assert full["offloads"] and alone["offloads"] == full["offloads"]
    assert alone["rejected"] == [] and len(full["rejected"]) > 0
    assert plan_peak(analysis, alone) == plan_peak(analysis, full)


@pytest.mark.parametrize("name", SAMPLE_NAMES)
@pytest.mark.parametrize("weights", [True, False])
def test_the_budget_planners_selection_is_the_select_stage_at_distance_0_without_uses(name, weights):
    """`Selection` keeps its chosen tensors as records and builds their entries only on demand: its
    plan, records and rejections are those of ``select`` at distance 0, uses and ids left out."""
    from offloadctl.planning.request import SelectPart
    from offloadctl.planning.select import Selection, chosen_entry

    analysis = analyse(load_model(SAMPLES / f"{name}.onnx"))
    selected = select(analysis, SelectPart(select_distance=0, params=weights))
    selection = Selection(analysis, SelectPart(select_distance=0, params=weights))
    plan = selection.plan(weights=weights)
    bare = [{**entry, "id": 0, "device_uses": [], "reload_groups": []} for entry in selected["offloads"]]
    assert plan["offloads"] == bare and plan["offloads"]
    assert [c.tensor for c in selection.chosen(weights=weights)] == [e["tensor"] for e in selected["offloads"]]
    assert plan["offloads"] == [chosen_entry(analysis, c) for c in selection.chosen(weights=weights)]
    assert plan["rejected"] == selected["rejected"] == selection.rejected(weights=weights)
    header = selection.header(weights=weights)
    assert header == {**plan, "offloads": [], "rejected": []}


def test_budget_plans_copy_no_tensor_too_small_to_be_worth_a_copy(run_cli, tmp_path):
    """A copy costs a launch and a wait whatever its size: the BERT sample's plan at 65 KiB once copied
    eight 4-byte scalars to reach the budget. Now every copy is at least the floor (the lesser of the
    link's bytes in one copy's fixed time and 0.1% of the peak), the smaller ones are rejected as
    too-small, and --min-bytes 0 gives the exact search back."""
    from offloadctl.planning.budget.candidates import copy_floor
    from offloadctl.simulation.profiles import load_profile

    bert = SAMPLES / "bert" / "model.onnx"
    made = run_cli("plan", bert, "--params", "--budget", "65KiB", "-o", tmp_path / "p.json", "--json")
    assert made.exit_code == 0, made.stderr
    plan = read_plan(tmp_path / "p.json")
    peak = made.json()["peak_bytes"]["before"]
    floor = copy_floor(load_profile("ascend-910b"), peak)
    assert floor == peak // 1000 == plan["options"]["filter"]["min_bytes"]  # 0.1% of the peak: below 250,000
    assert plan["offloads"] and min(o["bytes"] for o in plan["offloads"]) >= floor
    assert made.json()["peak_bytes"]["after"] <= 65 * 1024
    small = [r for r in plan["rejected"] if r["reason"] == "too-small"]
    assert small and all(r["bytes"] < floor for r in small)
    assert any(r["tensor"].endswith("intermediate_act_fn/Constant_2_output_0") for r in small)
    exact = run_cli("plan", bert, "--params", "--budget", "65KiB", "--min-bytes", "0", "-o", tmp_path / "e.json")
    assert exact.exit_code == 0
    assert min(o["bytes"] for o in json.loads((tmp_path / "e.json").read_text())["offloads"]) == 4
    distance = run_cli("plan", bert, "--params", "--select-distance", "2", "-o", tmp_path / "d.json")
    assert distance.exit_code == 0  # HyperOffload's exact semantics: no size threshold by default
    assert min(o["bytes"] for o in json.loads((tmp_path / "d.json").read_text())["offloads"]) == 4


def test_the_copy_floor_is_the_links_own_on_a_big_model():
    from offloadctl.planning.budget.candidates import copy_floor
    from offloadctl.simulation.profiles import load_profile

    assert copy_floor(load_profile("ascend-910b"), 64 << 30) == 250_000  # 10 us at 25 GB/s
    assert copy_floor(load_profile("pcie-gen5-x16"), 64 << 30) == 500_000
    assert copy_floor(load_profile("ascend-910b"), 50_000) == 50


def test_a_budget_that_needs_copies_under_the_floor_gets_them_and_says_so(run_cli, tmp_path):
    """On a model of many tiny weights every copy is under the floor (0.1% of the peak): a budget plan
    would reach nothing. When the budget cannot be reached otherwise the floor is dropped, with a
    warning; --min-bytes given by name is kept, and the error then names the peak it can reach."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    count = 1200
    weights = [numpy_helper.from_array(np.full((4, 4), i / count, np.float32), f"w{i}") for i in range(count)]
    nodes = [helper.make_node("Add", ["x" if i == 0 else f"a{i - 1}", f"w{i}"], [f"a{i}"]) for i in range(count)]
    nodes[-1].output[0] = "y"
    graph = helper.make_graph(
        nodes, "tiny_weights", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 4])], weights,
    )  # fmt: skip
    model = tmp_path / "tiny.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(model))

    made = run_cli("plan", model, "--params", "--budget", "40KiB", "-o", tmp_path / "p.json", "--json")
    assert made.exit_code == 0, made.stderr
    assert "the budget needs copies smaller than a copy is worth here" in made.stderr
    doc = made.json()
    assert doc["peak_bytes"]["before"] > 75 * 1024 and doc["peak_bytes"]["after"] <= 40 * 1024
    plan = read_plan(tmp_path / "p.json")
    assert min(o["bytes"] for o in plan["offloads"]) == 64 < plan["options"]["filter"]["min_bytes"]
    kept = run_cli("plan", model, "--params", "--budget", "40KiB", "--min-bytes", "1KiB", "-o", tmp_path / "k.json")
    assert kept.exit_code == 1 and "cannot fit" in kept.stderr and not (tmp_path / "k.json").exists()


def test_the_exact_search_takes_linear_objectives_only_and_says_so_once():
    """``--optimal`` needs a linear objective (`linear_objective`): the time objective on streams and a cost
    object that is not linear are refused when the request is made, with the one message."""
    from offloadctl.planning.request import PlanRequest, RequestError
    from offloadctl.simulation.costs import CopyCost, linear_objective, optimal_refusal

    class Positional(CopyCost):
        linear = False

    assert linear_objective("bytes", "streams") and linear_objective("time", "inline")
    assert not linear_objective("time", "streams") and not linear_objective(Positional(), "inline")
    for objective, copies in (("time", "streams"), (Positional(), "inline")):
        with pytest.raises(RequestError) as refused:
            PlanRequest.of_options(budget=1 << 20, optimal=True, objective=objective, copies=copies)
        assert refused.value.message == optimal_refusal()[0] and refused.value.hint == optimal_refusal()[1]
    PlanRequest.of_options(budget=1 << 20, optimal=True, objective="time", copies="inline")  # linear: accepted
