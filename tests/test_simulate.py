"""The simulator: hand-computed memory traces, an independent recomputation, plans, time figures, CLI."""

from __future__ import annotations

import copy
import itertools
import json
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from offloadctl.analysis.graph import analyse
from offloadctl.contract.document import write_plan
from offloadctl.core.errors import OffloadError
from offloadctl.loading.model import load_model
from offloadctl.planning.make import scheduled_plan
from offloadctl.planning.request import PlanRequest
from offloadctl.rewriting.rewrite import apply_plan
from offloadctl.rewriting.writing import write_model
from offloadctl.simulation.memory import peak_memory
from offloadctl.simulation.profiles import DEFAULT_PROFILE, list_profiles, load_profile, profile_from_dict
from offloadctl.simulation.result import simulate
from offloadctl.simulation.timing import node_flops

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_models"
SAMPLE_NAMES = ["seed", "unet", "transformer", "training", "mlp"]

SEED_TEXT = """
<ir_version: 10, opset_import: ["" : 17]>
seed (float[4,8] x) => (float[4,8] out)
<float two = {2.0}>
{
  [div] m1 = Div(x, two)
  [mul_m3] m3 = Mul(m1, two)
  [mul_m4] m4 = Mul(m3, two)
  [add_m5] m5 = Add(m3, m4)
  [mul_m6] m6 = Mul(m5, two)
  [sub_out] out = Sub(m6, m1)
}
"""

# a -> b -> c -> d = c + a: `a` is idle for one position before its last use
CHAIN_TEXT = """
<ir_version: 10, opset_import: ["" : 17]>
chain (float[256] x) => (float[256] d)
{
  a = Relu(x)
  b = Relu(a)
  c = Relu(b)
  d = Add(c, a)
}
"""


def _analysis(path):
    return analyse(load_model(path))


@pytest.fixture(scope="module")
def samples():
    return {name: _analysis(SAMPLES / f"{name}.onnx") for name in SAMPLE_NAMES}


# ---------------------------------------------------------------------------------------------
# Hand-computed example: every tensor 4x8 float = 128 B, the weight `two` 4 B.


def test_seed_every_step_before(write_model):
    result = simulate(_analysis(write_model(SEED_TEXT)), profile=None)
    before = result.before
    # div: x, m1 | mul_m3: m1, m3 | mul_m4: m1, m3, m4 | add: m1, m3, m4, m5 | mul_m6: m1, m5, m6 |
    # sub: m1, m6, out   (+4 B weight everywhere)
    assert before.device == [260, 260, 388, 516, 388, 388]
    assert before.device_in == [132, 132, 260, 388, 260, 260]  # x is live from the start
    assert before.device_out == [132, 260, 388, 260, 260, 132]  # out lives to the end
    assert before.host == [0] * 6
    assert (result.peak_before, before.peak_step, before.labels[3]) == (516, 3, "add_m5")
    assert result.peak_after == 516 and result.copies == {"d2h": 0, "h2d": 0}
    assert result.lower_bound_bytes == 384 and result.lower_bound_node == "add_m5"


def test_seed_every_step_after_plan(write_model):
    analysis = _analysis(write_model(SEED_TEXT))
    plan = scheduled_plan(analysis, PlanRequest.of_options(select_distance=1, prefetch_distance=0))
    result = simulate(analysis, plan, profile=None)
    after = result.after
    assert after.kinds == ["node", "d2h", "node", "node", "node", "node", "h2d", "node"]
    assert after.positions == [0, 0, 1, 2, 3, 4, 5, 5]
    assert after.labels[1] == "D2H(m1) after div" and after.labels[6] == "H2D(m1) before sub_out"
    # m1 is freed after mul_m3 (its last device use = release point); its copy lives H2D -> sub
    assert after.device == [260, 132, 260, 260, 388, 260, 260, 388]
    assert after.host == [0, 128, 128, 128, 128, 128, 128, 0]
    assert (result.peak_after, after.peak_step, after.positions[after.peak_step]) == (388, 4, 3)
    assert result.transfer_bytes == {"d2h": 128, "h2d": 128}
    assert result.copies == {"d2h": 1, "h2d": 1}
    assert result.after.host_peak_bytes == 128


def test_release_point_holds_the_device_buffer(write_model):
    analysis = _analysis(write_model(SEED_TEXT))
    plan = scheduled_plan(analysis, PlanRequest.of_options(select_distance=1, prefetch_distance=0, release_distance=3))
    assert plan["offloads"][0]["release_after"] == 4
    result = simulate(analysis, plan, profile=None)
    # m1 now stays on the device through mul_m6 (position 4, step 5)
    assert result.after.device == [260, 132, 260, 388, 516, 388, 260, 388]


def test_peak_memory_is_the_cheap_form_of_simulate(write_model, samples):
    analysis = _analysis(write_model(SEED_TEXT))
    plan = scheduled_plan(analysis, PlanRequest.of_options(select_distance=1, prefetch_distance=0))
    assert peak_memory(analysis) == (516, 3)
    assert peak_memory(analysis, plan) == (388, 3)
    for analysis in samples.values():
        for kw in ({"select_distance": 1, "prefetch_distance": 0}, {"select_distance": 5, "params": True}):
            plan = scheduled_plan(analysis, PlanRequest.of_options(**kw))
            result = simulate(analysis, plan, profile=None)
            s = result.after.peak_step
            assert peak_memory(analysis, plan) == (result.peak_after, result.after.positions[s])


# ---------------------------------------------------------------------------------------------
# An independent, deliberately naive recomputation of the "before" working sets


def _naive_working_sets(analysis) -> list[int]:
    """O(n^2): for every step, scan every tensor and every node again."""
    nodes = analysis.nodes
    inputs = [list(node.input) for node in nodes]

    def size(name):
        info = analysis.infos.get(name)
        return info.bytes or 0 if info is not None else 0

    produced_at = {out: p for p, node in enumerate(nodes) for out in node.output if out}
    weights = set(analysis.weights)
    outputs = set(analysis.graph_outputs)
    tensors = weights | set(analysis.graph_inputs) | set(produced_at)
    sets = []
    for k in range(len(nodes)):
        total = 0
        for t in tensors:
            if t in weights:
                total += size(t)
                continue
            born = produced_at.get(t, 0)
            if born > k:
                continue
            readers = [p for p in range(len(nodes)) if t in inputs[p]]
            if t in outputs or k <= max([born] + readers):
                total += size(t)
        sets.append(total)
    return sets


@pytest.mark.parametrize("name", SAMPLE_NAMES)
def test_before_matches_naive_recomputation(samples, name):
    analysis = samples[name]
    naive = _naive_working_sets(analysis)
    result = simulate(analysis, profile=None)
    assert result.before.device == naive
    assert result.peak_before == max(naive)


# ---------------------------------------------------------------------------------------------
# Plans on the samples


@pytest.mark.parametrize("name", SAMPLE_NAMES)
def test_plan_offloading_nothing_keeps_the_peak(samples, name):
    analysis = samples[name]
    plan = scheduled_plan(analysis, PlanRequest.of_options(select_distance=10**6))
    assert plan["offloads"] == []
    result = simulate(analysis, plan, profile=None)
    assert result.peak_after == result.peak_before
    assert result.after.device == result.before.device
    assert result.copies == {"d2h": 0, "h2d": 0}


def test_unet_plan_lowers_the_peak(samples):
    analysis = samples["unet"]
    # the unplanned peak is the top-level Concat, which reads its skip input itself: activations alone
    # cannot lower it, streaming the weights does
    plan = scheduled_plan(analysis, PlanRequest.of_options(select_distance=5, prefetch_distance=2, params=True))
    result = simulate(analysis, plan, profile=None)
    assert result.peak_after < result.peak_before * 0.5
    assert result.before.labels[result.before.peak_step] == "cat0"


@pytest.mark.parametrize("name", ["transformer", "training"])
def test_activation_plan_lowers_the_peak(samples, name):
    analysis = samples[name]
    plan = scheduled_plan(analysis, PlanRequest.of_options(select_distance=1, prefetch_distance=0))
    assert all(o["kind"] == "activation" for o in plan["offloads"])
    result = simulate(analysis, plan, profile=None)
    assert result.peak_after < result.peak_before


WELL_PLACED = [
    {"select_distance": sd, "prefetch_distance": pf, "params": params}
    for sd, pf, params in itertools.product([1, 5, 10], [0, 2, 50], [False, True])
]


@pytest.mark.parametrize("name", SAMPLE_NAMES)
def test_lower_bound_after_before_and_time_order(samples, name):
    analysis = samples[name]
    for kw in WELL_PLACED:
        result = simulate(analysis, scheduled_plan(analysis, PlanRequest.of_options(release_distance=0, **kw)))
        assert result.lower_bound_bytes <= result.peak_after <= result.peak_before, kw
        t = result.times
        # on streams each copy also pays its event nodes (a gate; a D2H its fence too), which in line it does not
        events = sum(2 if k == "d2h" else 1 for k in result.after.kinds if k != "node")
        assert t.baseline <= t.overlapped <= t.serialized + events * result.profile.kernel_launch_s * (1 + 1e-9), kw
        assert t.serialized >= t.baseline
        copy_time = sum(
            (result.profile.h2d if k == "h2d" else result.profile.d2h).time(0)
            for k in result.after.kinds
            if k != "node"
        )
        moved = result.transfer_bytes
        expected = copy_time + moved["h2d"] / result.profile.h2d.bandwidth + moved["d2h"] / result.profile.d2h.bandwidth
        assert t.serialized - t.baseline == pytest.approx(expected, rel=1e-9)


def test_holding_buffers_longer_can_raise_the_peak(samples):
    # not every plan is well placed: the simulator must show it
    analysis = samples["seed"]
    result = simulate(
        analysis,
        scheduled_plan(analysis, PlanRequest.of_options(select_distance=1, prefetch_distance=2, release_distance=2)),
    )
    assert result.peak_after > result.peak_before


# ---------------------------------------------------------------------------------------------
# Time model


TINY_PROFILE = {
    "name": "tiny",
    "peak_flops": 1e15,
    "mem_bandwidth": 1e9,
    "kernel_launch_s": 1e-6,
    "link": {"h2d": {"bandwidth": 1e8, "latency_s": 2e-6}, "d2h": {"bandwidth": 1e9, "latency_s": 1e-6}},
    "source": "made-up figures for the test",
}


def test_one_copy_arithmetic(write_model):
    analysis = _analysis(write_model(CHAIN_TEXT))
    plan = scheduled_plan(analysis, PlanRequest.of_options(select_distance=1, prefetch_distance=1))
    (off,) = plan["offloads"]
    assert off["tensor"] == "a" and off["reload_groups"][0]["h2d_before"] == 2 and off["release_after"] == 1
    profile = profile_from_dict(TINY_PROFILE)
    result = simulate(analysis, plan, profile=profile)
    relu = 2048 / 1e9 + 1e-6  # reads 1 KiB, writes 1 KiB
    add = 3072 / 1e9 + 1e-6
    d2h = 1e-6 + 1024 / 1e9
    h2d = 2e-6 + 1024 / 1e8
    t = result.times
    assert t.baseline == pytest.approx(3 * relu + add, rel=1e-12)
    assert t.serialized == pytest.approx(3 * relu + add + d2h + h2d, rel=1e-12)
    event = 1e-6  # an event node (gate, fence) costs a kernel launch on its stream
    # the D2H and its gate (3.0 us) hide behind the second Relu (3.05 us), but compute pays the fence
    # that waits for it at the release point; the H2D, issued after it, runs behind its gate during
    # the third Relu and the Add waits for it: 2 Relu + fence + gate + H2D + Add
    assert d2h + event < relu < h2d
    assert t.overlapped == pytest.approx(2 * relu + h2d + add + 2 * event, rel=1e-12)
    assert t.stall["overlapped"] == pytest.approx(h2d - relu + 2 * event, rel=1e-9)
    assert t.slowdown["serialized"] == pytest.approx(t.serialized / t.baseline)


def test_release_wait_exposes_the_d2h(write_model):
    # every use of `a` reloaded: its release point is the producer, so compute waits for the whole
    # D2H, and with prefetch 0 each H2D is waited for in full: nothing overlaps, and the events cost on top
    analysis = _analysis(write_model(CHAIN_TEXT))
    profile = profile_from_dict(TINY_PROFILE)
    plan = scheduled_plan(analysis, PlanRequest.of_options(select_distance=0, prefetch_distance=0, never=("b", "c")))
    (off,) = plan["offloads"]
    assert off["tensor"] == "a" and off["device_uses"] == [] and off["release_after"] == 0
    assert [g["h2d_before"] for g in off["reload_groups"]] == [1, 3]
    t = simulate(analysis, plan, profile=profile).times
    d2h = 1e-6 + 1024 / 1e9
    h2d = 2e-6 + 1024 / 1e8
    events = 4e-6  # the D2H's gate and fence, a gate before each H2D: a kernel launch each
    assert t.overlapped == pytest.approx(t.baseline + d2h + 2 * h2d + events, rel=1e-12)
    assert t.overlapped == pytest.approx(t.serialized + events, rel=1e-12)


def test_flop_counts(write_model):
    path = write_model(
        """
        <ir_version: 10, opset_import: ["" : 17]>
        g (float[2,3] a, float[3,4] b, float[1,3,8,8] x, float[5,3,3,3] w)
          => (float[2,4] y, float[2,4] z, float[1,5,6,6] c)
        {
          y = MatMul(a, b)
          z = Gemm(a, b)
          c = Conv(x, w)
        }
        """
    )
    analysis = _analysis(path)

    def shape_of(name):
        return tuple(analysis.infos[name].shape)

    flops = [node_flops(node, shape_of) for node in analysis.nodes]
    assert flops == [2 * 2 * 4 * 3, 2 * 2 * 4 * 3, 2 * (5 * 6 * 6) * (3 * 3 * 3)]


# ---------------------------------------------------------------------------------------------
# Profiles


def test_bundled_profiles_load_and_say_where_figures_come_from():
    names = list_profiles()
    assert {"ascend-910b", "pcie-gen4-x16", "pcie-gen5-x16", "cpu"} <= set(names)
    assert DEFAULT_PROFILE == "ascend-910b"
    for name in names:
        profile = load_profile(name)
        assert profile.name == name
        assert isinstance(profile.source, dict) and {"peak_flops", "mem_bandwidth", "link"} <= set(profile.source)
    assert load_profile("pcie-gen5-x16").h2d.bandwidth == 2 * load_profile("pcie-gen4-x16").h2d.bandwidth


@pytest.mark.parametrize(
    "content, words",
    [
        ({k: v for k, v in TINY_PROFILE.items() if k != "link"}, ["lacks", "link"]),
        ({**TINY_PROFILE, "mem_bandwidth": 0}, ["mem_bandwidth", "> 0"]),
        ({**TINY_PROFILE, "link": {"h2d": {"bandwidth": 1e9}}}, ["link.h2d"]),
        ({**TINY_PROFILE, "source": ""}, ["source"]),
        ("not json", ["not JSON"]),
    ],
)
def test_bad_profile_file_exits_1(run_cli, tmp_path, seed_path, content, words):
    bad = tmp_path / "bad.json"
    bad.write_text(content if isinstance(content, str) else json.dumps(content))
    result = run_cli("simulate", seed_path, "--profile", bad)
    assert result.exit_code == 1
    assert result.stdout == ""
    assert str(bad) in result.stderr
    for word in words:
        assert word in result.stderr
    assert "Traceback" not in result.stderr


def test_unknown_profile_name_exits_1(run_cli, seed_path):
    result = run_cli("simulate", seed_path, "--profile", "tpu-v9")
    assert result.exit_code == 1
    assert "ascend-910b" in result.stderr  # lists the bundled ones


def test_user_profile_file_is_used(run_cli, tmp_path, seed_path):
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(TINY_PROFILE))
    doc = run_cli("simulate", seed_path, "--profile", path, "--json").json()
    assert doc["profile"]["name"] == "tiny"
    # bytes read and written: Div/Mul/Mul/Mul 128 + 4 + 128 each, Add/Sub 3 x 128 each
    assert doc["time_s"]["baseline"] == pytest.approx((4 * 260 + 2 * 384) / 1e9 + 6 * 1e-6, rel=1e-12)


# ---------------------------------------------------------------------------------------------
# Command line


JSON_KEYS = {
    "peak_bytes",
    "peak_at",
    "lower_bound_bytes",
    "transfer_bytes",
    "copies",
    "host_peak_bytes",
    "time_s",
    "stall_s",
    "slowdown",
    "profile",
    "timeline",
    "unknown_size",
}


def test_json_document(run_cli, tmp_path, seed_path):
    plan_path = tmp_path / "plan.json"
    write_plan(
        plan_path, scheduled_plan(_analysis(seed_path), PlanRequest.of_options(select_distance=1, prefetch_distance=0))
    )
    result = run_cli("simulate", seed_path, "--plan", plan_path, "--json")
    assert result.exit_code == 0, result.stderr
    doc = result.json()
    assert JSON_KEYS <= set(doc)
    assert doc["peak_bytes"]["before"] == 516 and doc["peak_bytes"]["after"] < 516
    assert set(doc["peak_at"]["before"]) >= {"position", "node"} and set(doc["peak_at"]["after"]) >= {
        "position",
        "node",
    }
    assert doc["transfer_bytes"] == {"d2h": 128, "h2d": 128} and doc["copies"] == {"d2h": 1, "h2d": 1}
    assert set(doc["time_s"]) == {"baseline", "serialized", "overlapped"}
    assert doc["profile"]["name"] == "ascend-910b"
    assert doc["plan"] == str(plan_path)
    rows = doc["timeline"]
    assert len(rows) == 8 and {"position", "node", "before", "after"} <= set(rows[0])
    assert max(r["after"] for r in rows) == doc["peak_bytes"]["after"]
    assert max(r["before"] for r in rows if r["before"] is not None) == doc["peak_bytes"]["before"]
    limited = run_cli("simulate", seed_path, "--json", "--timeline-limit", "3").json()
    assert limited["timeline"] is None and "timeline_omitted" in limited


def test_terminal_report(run_cli, tmp_path, seed_path):
    plan_path = tmp_path / "plan.json"
    write_plan(
        plan_path, scheduled_plan(_analysis(seed_path), PlanRequest.of_options(select_distance=1, prefetch_distance=0))
    )
    result = run_cli("simulate", seed_path, "--plan", plan_path, "--profile", "pcie-gen4-x16")
    assert result.exit_code == 0, result.stderr
    for text in ("516 B", "388 B", "add_m5", "lower bound", "1 D2H", "pcie-gen4-x16", "copy streams"):
        assert text in result.stdout


def test_plan_must_be_scheduled_and_for_this_model(run_cli, tmp_path, seed_path):
    analysis = _analysis(seed_path)
    plan = scheduled_plan(analysis, PlanRequest.of_options(select_distance=1))
    other = tmp_path / "other.json"
    write_plan(other, plan)
    mlp = SAMPLES / "mlp.onnx"
    result = run_cli("simulate", mlp, "--plan", other)
    assert result.exit_code == 1 and "sha256" in result.stderr
    unscheduled = copy.deepcopy(plan)
    unscheduled["stage"] = "filtered"
    for off in unscheduled["offloads"]:
        for group in off["reload_groups"]:
            group["h2d_before"] = None
    path = tmp_path / "filtered.json"
    write_plan(path, unscheduled)
    result = run_cli("simulate", seed_path, "--plan", path)
    assert result.exit_code == 1 and "scheduled" in result.stderr
    with pytest.raises(OffloadError, match="scheduled"):
        simulate(analysis, unscheduled)


@pytest.mark.parametrize("h2d_before", [None, 0, 6])  # missing, with the D2H, after the first use
def test_a_plan_in_memory_with_a_misplaced_h2d_is_refused_by_apply_and_simulate(seed_path, h2d_before):
    analysis = _analysis(seed_path)
    plan = scheduled_plan(analysis, PlanRequest.of_options(select_distance=1, prefetch_distance=0))
    (off,) = plan["offloads"]  # m1: D2H after position 0, its group's first use at position 5
    assert off["d2h_after"] == 0 and off["reload_groups"][0]["uses"][0]["position"] == 5
    off["reload_groups"][0]["h2d_before"] = h2d_before
    for refuse in (
        lambda: simulate(analysis, plan),
        lambda: peak_memory(analysis, plan),
        lambda: apply_plan(plan, analysis),
    ):
        with pytest.raises(OffloadError, match=r"reload group 0 of tensor 'm1'.*\[1, 5\]"):
            refuse()


def test_unknown_sizes_are_counted_and_listed(run_cli, write_model):
    path = write_model(
        """
        <ir_version: 10, opset_import: ["" : 17]>
        g (float[N,8] x) => (float[N,8] y)
        {
          h = Relu(x)
          y = Relu(h)
        }
        """
    )
    result = run_cli("simulate", path, "--json")
    assert result.exit_code == 0
    doc = result.json()
    assert doc["unknown_size"]["count"] == 3 and set(doc["unknown_size"]["tensors"]) == {"x", "h", "y"}
    assert doc["unknown_size"]["counted_as_bytes"] == 0
    assert "unknown size" in result.stderr
    pinned = run_cli("simulate", path, "--json", "--input-shape", "x=2,8").json()
    assert pinned["unknown_size"]["count"] == 0 and pinned["peak_bytes"]["before"] == 128


def test_plan_input_shapes_are_used(run_cli, tmp_path, write_model):
    path = write_model(
        """
        <ir_version: 10, opset_import: ["" : 17]>
        g (float[N,8] x) => (float[N,8] y)
        {
          a = Relu(x)
          b = Relu(a)
          c = Relu(b)
          y = Add(c, a)
        }
        """
    )
    analysis = analyse(load_model(path, input_shapes={"x": [2, 8]}))
    plan_path = tmp_path / "plan.json"
    write_plan(plan_path, scheduled_plan(analysis, PlanRequest.of_options(select_distance=1, prefetch_distance=0)))
    doc = run_cli("simulate", path, "--plan", plan_path, "--json").json()
    assert doc["unknown_size"]["count"] == 0 and doc["copies"] == {"d2h": 1, "h2d": 1}


@pytest.mark.parametrize("suffix, magic", [(".png", b"\x89PNG"), (".svg", b"<?xml")])
def test_plot(run_cli, tmp_path, seed_path, suffix, magic):
    plan_path = tmp_path / "plan.json"
    write_plan(
        plan_path, scheduled_plan(_analysis(seed_path), PlanRequest.of_options(select_distance=1, prefetch_distance=0))
    )
    out = tmp_path / f"memory{suffix}"
    result = run_cli("simulate", seed_path, "--plan", plan_path, "--plot", out, "--json")
    assert result.exit_code == 0, result.stderr
    assert out.read_bytes().startswith(magic)
    assert result.json()["peak_bytes"]["after"] == 388  # stdout is still one JSON document
    assert not list(tmp_path.glob(".memory*"))  # no temporary left behind


def test_plot_refuses_other_formats(run_cli, tmp_path, seed_path):
    result = run_cli("simulate", seed_path, "--plot", tmp_path / "memory.pdf")
    assert result.exit_code == 1 and ".png or .svg" in result.stderr
    assert not (tmp_path / "memory.pdf").exists()


def test_plot_without_matplotlib(run_cli, tmp_path, seed_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # import fails as if not installed
    out = tmp_path / "memory.png"
    result = run_cli("simulate", seed_path, "--plot", out)
    assert result.exit_code == 1
    assert "pip install 'offloadctl[plot]'" in result.stderr
    assert not out.exists()


# ---------------------------------------------------------------------------------------------
# Rewritten models


def _rewrite(analysis, plan, out: Path):
    write_model(apply_plan(plan, analysis), out, source_dir=SAMPLES)
    return _analysis(out)


@pytest.mark.parametrize("name", SAMPLE_NAMES)
def test_rewritten_model_simulates_like_original_with_plan(samples, tmp_path, name):
    analysis = samples[name]
    for kw in (
        {"select_distance": 1, "prefetch_distance": 0},
        {"select_distance": 5, "prefetch_distance": 2, "params": True},
    ):
        plan = scheduled_plan(analysis, PlanRequest.of_options(**kw))
        planned = simulate(analysis, plan)
        rewritten = simulate(_rewrite(analysis, plan, tmp_path / f"{name}.offload.onnx"))
        assert rewritten.rewritten == bool(plan["offloads"])
        assert rewritten.peak_after == planned.peak_after
        assert rewritten.peak_before == planned.peak_before
        assert rewritten.after.device == planned.after.device
        assert rewritten.after.kinds == planned.after.kinds
        assert rewritten.after.host_peak_bytes == planned.after.host_peak_bytes
        assert rewritten.copies == planned.copies and rewritten.transfer_bytes == planned.transfer_bytes
        assert rewritten.times.overlapped == pytest.approx(planned.times.overlapped, rel=1e-12)


def test_rewritten_model_refuses_a_plan(samples, tmp_path):
    analysis = samples["seed"]
    plan = scheduled_plan(analysis, PlanRequest.of_options(select_distance=1, prefetch_distance=0))
    rewritten = _rewrite(analysis, plan, tmp_path / "seed.offload.onnx")
    with pytest.raises(OffloadError, match="already contains"):
        simulate(rewritten, plan)


def test_cli_rewritten_model_refuses_a_plan(run_cli, tmp_path, seed_path):
    analysis = _analysis(seed_path)
    plan = scheduled_plan(analysis, PlanRequest.of_options(select_distance=1, prefetch_distance=0))
    plan_path = tmp_path / "plan.json"
    write_plan(plan_path, plan)
    _rewrite(analysis, plan, tmp_path / "seed.offload.onnx")
    result = run_cli("simulate", tmp_path / "seed.offload.onnx", "--plan", plan_path)
    assert result.exit_code == 1 and "already contains" in result.stderr
    doc = run_cli("simulate", tmp_path / "seed.offload.onnx", "--json").json()
    assert doc["rewritten"] and doc["peak_bytes"] == {"before": 516, "after": 388, "saved": 128}
    assert doc["peak_at"]["after"]["node"] == "add_m5"


@pytest.mark.parametrize("name", ["seed", "training"])
def test_simulated_order_is_the_order_onnxruntime_runs(samples, tmp_path, name):
    analysis = samples[name]
    plan = scheduled_plan(analysis, PlanRequest.of_options(select_distance=1, prefetch_distance=2, params=True))
    out = tmp_path / f"{name}.offload.onnx"
    result = simulate(_rewrite(analysis, plan, out), profile=None)
    assert result.copies["d2h"] > 0 and result.copies["h2d"] > 0
    so = ort.SessionOptions()
    so.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "prof")
    so.log_severity_level = 3
    session = ort.InferenceSession(str(out), so, providers=["CPUExecutionProvider"])
    feeds = dict(np.load(SAMPLES / f"{name}.inputs.npz"))
    session.run(None, feeds)
    events = json.loads(Path(session.end_profiling()).read_text())
    kernels = sorted(
        (e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")), key=lambda e: e["ts"]
    )
    ran = [e["name"][: -len("_kernel_time")] for e in kernels]
    # an order pin's nodes move no data and are not steps of the simulation
    pins = {n.name for n in onnx.load(str(out)).graph.node if n.name.startswith("offload/pin/")}
    assert pins and [name for name in ran if name not in pins] == result.after.labels


def test_plan_command_prints_the_simulated_peak(run_cli, tmp_path, seed_path):
    result = run_cli(
        "plan", seed_path, "-o", tmp_path / "plan.json", "--select-distance", "1", "--prefetch-distance", "0"
    )
    assert result.exit_code == 0, result.stderr
    assert "simulated peak device memory: 516 B before -> 388 B after (-24.8%" in result.stdout


def test_lower_bound_counts_the_graph_outputs_at_the_end():
    from offloadctl.analysis.graph import analyse
    from offloadctl.loading.model import load_model
    from offloadctl.simulation.memory import lower_bound
    from offloadctl.simulation.result import simulate
    from tests.conftest import SAMPLES

    analysis = analyse(load_model(SAMPLES / "training.onnx"))
    outputs = sum(analysis.infos[o].bytes for o in analysis.graph_outputs)
    bound, at = lower_bound(analysis)
    assert bound >= outputs and at == analysis.num_positions  # the gradients dominate: all outputs at the end
    result = simulate(analysis)
    assert result.lower_bound_bytes == bound and result.lower_bound_node == "end of run (graph outputs)"


def test_a_rewritten_model_is_simulated_and_inspected_at_the_shapes_it_was_planned_at(run_cli, tmp_path):
    """simulate and inspect of a rewritten model read the shapes its plan was made at
    (offloadctl.planned_at), as run does: the same peak as the plan, no tensor of unknown size (an
    order pin's tensors hold no bytes of their own)."""
    from models import long_reuse_model, save

    source = save(long_reuse_model(dynamic=True), tmp_path / "dyn.onnx")
    plan, out = tmp_path / "plan.json", tmp_path / "out.onnx"
    assert run_cli("plan", source, "--input-shape", "x=64,8", "--select-distance", "1", "-o", plan).exit_code == 0
    assert run_cli("apply", plan, "-o", out).exit_code == 0
    planned = json.loads(plan.read_text())["summary"]["estimate"]["peak_bytes"]["after"]
    simulated = run_cli("simulate", out, "--json").json()
    assert simulated["peak_bytes"]["after"] == planned and not simulated["figures_low"]
    assert run_cli("inspect", out, "--json").json()["unknown_size"]["count"] == 0


def test_a_model_without_the_planned_at_entry_is_parsed_once_by_the_plan_command(run_cli, tmp_path, monkeypatch):
    """Only a file that holds the ``offloadctl.planned_at`` key is parsed for the shapes it records:
    ``plan`` of an original model parses it once, and of a rewritten model reads its shapes."""
    import onnx

    from models import long_reuse_model, save

    source = save(long_reuse_model(dynamic=True), tmp_path / "dyn.onnx")
    plan, out = tmp_path / "plan.json", tmp_path / "out.onnx"
    parsed = []
    real_load = onnx.load
    monkeypatch.setattr(onnx, "load", lambda f, *a, **k: parsed.append(str(f)) or real_load(f, *a, **k))
    assert run_cli("plan", source, "--input-shape", "x=64,8", "--select-distance", "1", "-o", plan).exit_code == 0
    assert parsed.count(str(source)) == 1
    assert run_cli("plan", source, "--select-distance", "1", "-o", tmp_path / "again.json").exit_code == 0
    assert parsed.count(str(source)) == 2  # no pins given: it still is parsed once
    assert run_cli("apply", plan, "-o", out).exit_code == 0
    parsed.clear()
    replanned = run_cli("plan", out, "-o", tmp_path / "re.json", "--json")
    assert replanned.exit_code == 0 and parsed.count(str(out)) == 2  # the recorded shapes, then the model
    assert json.loads((tmp_path / "re.json").read_text())["model"]["input_shapes"] == {"x": [64, 8]}


# ---------------------------------------------------------------------------------------------
# The program and the time model against step-by-step walks


def _walked_program(base, plan):
    """The steps of ``plan``'s program laid out position by position, as (kind, position, reads,
    writes, inner) rows: each copy where the program puts it (`_plan_program` takes the nodes
    between copies a stretch at a time)."""
    program = _program_of(base, plan)
    pre, post, swapped = {}, {}, {}
    for s, kind in enumerate(program.kinds):
        row = (kind, program.positions[s], program.reads[s], program.writes[s], 0)
        if kind == "h2d":
            pre.setdefault(program.positions[s], []).append(row)
        elif kind == "d2h":
            post.setdefault(program.positions[s], []).append(row)
        elif program.reads[s] != base.reads[program.positions[s]]:
            swapped[program.positions[s]] = program.reads[s]
    rows = []
    for q in range(base.n + 1):
        rows += pre.get(q, [])
        if q == base.n:
            break
        rows.append(("node", q, swapped.get(q, base.reads[q]), base.writes[q], base.inner[q]))
        rows += post.get(q, [])
    return rows


def _program_of(base, plan):
    from offloadctl.simulation.program import _plan_program

    return _plan_program(base, plan)


def _walked_times(program, costs, profile):
    """(baseline, serialized, overlapped) of the time model walked step by step, every node included."""
    links = {"h2d": profile.h2d, "d2h": profile.d2h}
    waits = {}
    for after, wait_for in program.waits:
        waits.setdefault(after, []).append(wait_for)
    end, copy_of, copy_free = {}, {}, 0.0  # one copy stream; each event node costs a kernel launch
    event = profile.kernel_launch_s
    compute = baseline = serialized = 0.0
    for s, kind in enumerate(program.kinds):
        ready = max((end[copy_of[t]] for t in program.reads[s] if t in copy_of), default=0.0)
        if kind == "node":
            cost = costs.seconds[program.positions[s]]
            baseline += cost
            serialized += cost
            compute = end[s] = max(compute, ready) + cost
        else:
            cost = links[kind].time(program.sizes[program.reads[s][0]])
            serialized += cost
            end[s] = copy_free = max(compute, copy_free, ready) + event + cost
            copy_of.update(dict.fromkeys(program.writes[s], s))
        for wait_for in waits.get(s, ()):
            compute = max(compute, end[wait_for]) + event
    fixed = profile.run_overhead_s  # (the bundled profiles measured no run: nothing is unfolded)
    return baseline + fixed, serialized + fixed, max(compute, copy_free) + fixed


PROGRAM_PLANS = [
    {"select_distance": sd, "prefetch_distance": pf, "params": params, "release_distance": rd}
    for sd, pf, params, rd in itertools.product([1, 5], [0, 3], [False, True], [0, 2])
]


@pytest.mark.parametrize("name", SAMPLE_NAMES)
def test_a_plans_program_and_time_are_those_of_a_step_by_step_walk(samples, name):
    from offloadctl.simulation.base import base_of
    from offloadctl.simulation.timing import node_costs, times

    analysis = samples[name]
    base = base_of(analysis)
    copied = 0
    for kw in PROGRAM_PLANS:
        plan = scheduled_plan(analysis, PlanRequest.of_options(**kw))
        program = _program_of(base, plan)
        rows = list(zip(program.kinds, program.positions, program.reads, program.writes, program.inner))
        assert rows == _walked_program(base, plan)
        copied += sum(kind != "node" for kind in program.kinds)
        for profile in ("ascend-910b", "pcie-gen4-x16"):
            prof = load_profile(profile)
            found = times(program, node_costs(base, prof), prof)
            assert (found.baseline, found.serialized, found.overlapped) == _walked_times(
                program, node_costs(base, prof), prof
            )
    assert copied > 0


def _walked_costs(base, profile):
    """Each node's seconds priced one node at a time: measured where the profile has the node, else
    its bytes at memory speed or its FLOPs at peak, whichever is slower, plus one launch."""
    from offloadctl.simulation.timing import FLOP_OPS, _dims, _measured_match

    def shape_of(name):
        return _dims(base.infos, name) or _dims(base.infos, base.canon(name))

    table = profile.measured.nodes if profile.measured is not None else {}
    seconds, count = [], 0
    for p, node in enumerate(base.nodes):
        hit = table.get(node.name)
        if hit is not None and _measured_match(hit, node, shape_of):
            seconds.append(max(hit.seconds + profile.measured.node_overhead_s, 0.0) if hit.ran else 0.0)
            count += 1
            continue
        moved = sum(base.sizes[t] for t in base.reads[p]) + sum(base.sizes[t] for t in base.writes[p])
        cost = moved / profile.mem_bandwidth
        flops = node_flops(node, shape_of) if node.op_type in FLOP_OPS else None
        if flops:
            info = base.infos.get(next(i for i in node.input if i))
            cost = max(cost, flops / profile.flops_for(info.dtype if info is not None else "default"))
        seconds.append(cost + profile.kernel_launch_s)
    return seconds, count


@pytest.mark.parametrize("name", SAMPLE_NAMES)
def test_node_costs_are_those_priced_one_node_at_a_time(samples, name):
    """The time model prices the nodes' bytes as array operations and looks at the FLOP ops and the
    measured nodes one by one: the same floats as pricing each node on its own, measured profile or not."""
    import dataclasses

    from offloadctl.simulation.base import base_of
    from offloadctl.simulation.profiles import MeasuredTimes, NodeTime
    from offloadctl.simulation.timing import node_costs

    base = base_of(samples[name])
    # every other node measured: some with their own op type, some with another (not a match), some not run
    table = {
        node.name: NodeTime(node.op_type if p % 4 else "Other", 1e-5 * p, None, ran=p % 6 != 2)
        for p, node in enumerate(base.nodes[::2])
        if node.name
    }
    measured = MeasuredTimes("m.onnx", "0" * 64, -2e-6, table)
    profiles = [load_profile(p) for p in ("ascend-910b", "pcie-gen4-x16", "cpu")]
    profiles.append(dataclasses.replace(load_profile("cpu"), measured=measured))
    for profile in profiles:
        costs = node_costs(base, profile)
        assert (costs.seconds, costs.measured) == _walked_costs(base, profile)
    assert 0 < costs.measured < base.n


def test_a_datasheet_profile_leaves_the_order_pins_uncounted(samples, monkeypatch):
    """Only a measured profile prices the order pins' nodes, so only it has them counted: the pin
    layout (which may need shape inference on the whole graph) is not worked out for the others."""
    import offloadctl.simulation.program as program_module

    analysis = samples["transformer"]
    plan = scheduled_plan(analysis, PlanRequest.of_options(select_distance=1, prefetch_distance=0))
    assert plan["offloads"]
    expected = simulate(analysis, plan, profile="ascend-910b").times

    def refuse(*args, **kwargs):
        raise AssertionError("the pin layout was worked out")

    monkeypatch.setattr(program_module, "pin_layout", refuse)
    assert simulate(analysis, plan, profile="ascend-910b").times == expected
    assert simulate(analysis, plan, profile=None).peak_after < simulate(analysis, None, profile=None).peak_before
