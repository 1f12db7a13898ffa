"""Measured profiles: `offloadctl profile` and their use by simulate and plan (CPU only).

No test here checks a timing against a number: measurements only have to exist, be recorded with
what they belong to, and be used (or not) by the simulator as documented.
"""

from __future__ import annotations

import copy
import json
import subprocess

import jsonschema
import numpy as np
import onnx
import onnxruntime as ort
import pytest

from offloadctl.analysis.graph import analyse
from offloadctl.analysis.timeline import lower_bound
from offloadctl.core.errors import OffloadError
from offloadctl.core.files import sha256_file
from offloadctl.loading.model import load_model
from offloadctl.planning.make import scheduled_plan
from offloadctl.planning.request import PlanRequest
from offloadctl.rewriting.rewrite import apply_plan
from offloadctl.running import copies_in_model, profiler, timed
from offloadctl.running.fusions import attribute
from offloadctl.running.profiler import measure_profile
from offloadctl.simulation.profiles import list_profiles, load_profile, profile_from_dict, profile_schema, write_profile
from offloadctl.simulation.result import simulate

from conftest import FAST_PROFILER, SAMPLES, fast_profiler
from models import long_reuse_model, save

SEED = SAMPLES / "seed.onnx"
SEED_INPUTS = SAMPLES / "seed.inputs.npz"

FAST = FAST_PROFILER["offloadctl.running.profiler"]


@pytest.fixture(scope="module")
def fast():
    with pytest.MonkeyPatch.context() as mp:
        fast_profiler(mp)
        yield


@pytest.fixture(scope="module")
def seed_doc(fast):
    return measure_profile(str(SEED), "cpu", inputs=SEED_INPUTS, repeat=2)


@pytest.fixture
def seed_profile_file(seed_doc, tmp_path):
    path = tmp_path / "seed.profile.json"
    write_profile(path, seed_doc)
    return path


def _analysis(path):
    return analyse(load_model(path))


# ---------------------------------------------------------------------------------------------
# What `profile` measures and records


def test_measured_profile_validates_and_records_what_it_belongs_to(seed_doc):
    schema = profile_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.Draft202012Validator(schema).validate(seed_doc)
    measured = seed_doc["measured"]
    assert measured["model"]["sha256"] == sha256_file(SEED)
    model = onnx.load(str(SEED))
    assert set(measured["nodes"]) == {n.name for n in model.graph.node}
    by_name = {n.name: n for n in model.graph.node}
    for name, entry in measured["nodes"].items():
        assert entry["op_type"] == by_name[name].op_type
        assert entry["seconds"] >= 0  # profiling reports whole microseconds: a tiny node can take 0
        # seed: every tensor is float[4,8] but the scalar weight "two"
        assert entry["input_shapes"] == [[] if i == "two" else [4, 8] for i in by_name[name].input]
    device = measured["device"]
    assert device["provider"] == "CPUExecutionProvider" and device["providers"][0] == "CPUExecutionProvider"
    assert device["onnxruntime"] == ort.__version__ and device["name"]
    assert measured["session"]["execution_order"] == "PRIORITY_BASED"
    assert measured["model"]["inputs"]["x"]["source"] == "file"
    assert measured["executor"]["nodes_ran"] == 6
    # the node overhead closes the gap between the latency and the node times
    executor = measured["executor"]
    node_times = [max(e["seconds"] + executor["node_overhead_s"], 0) for e in measured["nodes"].values()]
    assert measured["latency_s"]["median"] == pytest.approx(executor["run_overhead_s"] + sum(node_times), rel=1e-6)
    t = simulate(_analysis(SEED), profile=profile_from_dict(seed_doc)).times
    assert t.baseline == pytest.approx(measured["latency_s"]["median"], rel=1e-6)
    in_model = measured["copies_in_model"]
    # every weight offloaded: "two" reloaded before each of its 4 uses; every activation: a D2H each for
    # m1, m3, m4, m5, m6 (not the graph output), an H2D before each of their 7 uses
    assert (in_model["h2d"]["copies"], in_model["h2d"]["rewrite_copies"]) == (4, 4)
    assert (in_model["d2h"]["copies"], in_model["d2h"]["rewrite_copies"]) == (5, 12)
    assert in_model["d2h"]["bytes"] == 5 * 128 and in_model["h2d"]["bytes"] == 4 * 4
    for direction in ("d2h", "h2d"):
        fit = measured["link"][direction]
        assert [p[0] for p in fit["points"]] == list(FAST["SWEEP_BYTES"])
        scale = in_model[direction]["scale"] or 1.0
        assert seed_doc["link"][direction] == pytest.approx(
            {"bandwidth": fit["bandwidth"] / scale, "latency_s": fit["latency_s"] * scale}
        )
        assert [p["bytes"] for p in measured["copy_sweep"][direction]] == list(FAST["SWEEP_BYTES"])
    assert all(isinstance(v, str) and v.startswith("measured") for v in seed_doc["source"].values())


def test_written_profile_reads_back(seed_profile_file):
    profile = load_profile(str(seed_profile_file))
    assert profile.measured is not None and profile.measured.sha256 == sha256_file(SEED)
    assert len(profile.measured.nodes) == 6
    text = seed_profile_file.read_text()
    lines = text.splitlines()
    for name in profile.measured.nodes:  # one line per node
        assert sum(1 for line in lines if line.strip().startswith(f'"{name}": {{"op_type"')) == 1
    assert len(lines) < 200  # lists of numbers on one line each
    assert json.loads(text)["measured"]["nodes"] == json.loads(json.dumps(profile_to_nodes(profile)))


def profile_to_nodes(profile):
    return {
        name: {"op_type": t.op_type, "seconds": t.seconds, "input_shapes": [list(s) for s in t.input_shapes]}
        for name, t in profile.measured.nodes.items()
    }


def test_bundled_profiles_follow_the_schema():
    validator = jsonschema.Draft202012Validator(profile_schema())
    for name in list_profiles():
        path = SAMPLES.parent / "offloadctl" / "simulation" / "profiles" / f"{name}.json"
        validator.validate(json.loads(path.read_text()))


def test_generated_inputs_take_pinned_shapes(fast, tmp_path):
    path = save(long_reuse_model(dynamic=True), tmp_path / "dynamic.onnx")
    doc = measure_profile(str(path), "cpu", input_shapes={"x": [3, 8]}, repeat=1, threads=1)
    assert doc["measured"]["model"]["inputs"]["x"] == {"dtype": "float32", "shape": [3, 8], "source": "generated"}
    assert doc["measured"]["session"]["intra_op_num_threads"] == 1
    assert doc["measured"]["nodes"]["relu"]["input_shapes"] == [[3, 8]]


# ---------------------------------------------------------------------------------------------
# simulate with a measured profile


def _known_times(doc, seconds=1e-3, node_overhead=1e-4, run_overhead=5e-3):
    doc = copy.deepcopy(doc)
    for entry in doc["measured"]["nodes"].values():
        entry["seconds"] = seconds
    doc["measured"]["executor"]["node_overhead_s"] = node_overhead
    doc["run_overhead_s"] = run_overhead
    return doc


def test_simulate_uses_measured_times_when_the_profile_has_the_model(seed_doc):
    profile = profile_from_dict(_known_times(seed_doc))
    t = simulate(_analysis(SEED), profile=profile).times
    assert t.nodes == 6 and t.measured_nodes == 6
    assert t.baseline == pytest.approx(5e-3 + 6 * (1e-3 + 1e-4), rel=1e-12)


def test_simulate_falls_back_to_the_roofline_for_another_model(seed_doc):
    doc = _known_times(seed_doc)
    roofline_only = {k: v for k, v in doc.items() if k != "measured"}
    analysis = _analysis(SAMPLES / "mlp.onnx")
    t = simulate(analysis, profile=profile_from_dict(doc)).times
    assert t.measured_nodes == 0 and t.nodes == 16
    assert t.baseline == simulate(analysis, profile=profile_from_dict(roofline_only)).times.baseline


@pytest.mark.parametrize("change", ["op_type", "input_shapes"])
def test_a_node_that_differs_is_estimated(seed_doc, change):
    doc = _known_times(seed_doc)
    name = next(iter(doc["measured"]["nodes"]))
    entry = doc["measured"]["nodes"][name]
    if change == "op_type":
        entry["op_type"] = "Tanh"
    else:
        entry["input_shapes"] = [[7, 7]] * len(entry["input_shapes"])
    t = simulate(_analysis(SEED), profile=profile_from_dict(doc)).times
    assert t.measured_nodes == 5
    assert t.baseline != pytest.approx(5e-3 + 6 * 1.1e-3)


def test_rewritten_model_takes_its_original_node_times_and_the_link_fit(seed_doc, tmp_path):
    profile = profile_from_dict(_known_times(seed_doc))
    analysis = _analysis(SEED)
    plan = scheduled_plan(analysis, PlanRequest.of_options(select_distance=1, prefetch_distance=0))
    assert plan["offloads"]
    rewritten_path = tmp_path / "seed.offload.onnx"
    onnx.save(apply_plan(plan, analysis), str(rewritten_path))
    result = simulate(_analysis(rewritten_path), profile=profile)
    t = result.times
    assert t.nodes == 6 and t.measured_nodes == 6  # the copies are not nodes of the original
    assert t.baseline == pytest.approx(5e-3 + 6 * 1.1e-3, rel=1e-12)
    copies = [(k, result.after.positions[s]) for s, k in enumerate(result.after.kinds) if k != "node"]
    assert len(copies) == 2
    link = {"d2h": profile.d2h, "h2d": profile.h2d}
    m1_bytes = 4 * 8 * 4
    # each node of the order pins costs what one more trivial node adds to a run (the profile's measure)
    pins = _analysis(rewritten_path).num_positions - 6 - len(copies)  # the nodes neither original nor copies
    assert pins > 0
    copies_s = sum(link[k].time(m1_bytes) for k, _ in copies)
    assert t.serialized - t.baseline == pytest.approx(copies_s + pins * profile.kernel_launch_s, rel=1e-9)
    planned = simulate(analysis, plan, profile=profile).times
    assert planned.serialized == pytest.approx(t.serialized, rel=1e-12)  # the plan's pins are priced the same


def test_simulate_cli_says_how_many_nodes_were_measured(run_cli, seed_profile_file):
    result = run_cli("simulate", SEED, "--profile", seed_profile_file, "--json")
    assert result.exit_code == 0, result.stderr
    doc = result.json()
    assert doc["time_nodes"] == {"total": 6, "measured": 6, "estimated": 0}
    assert doc["profile"]["measured"]["sha256"] == sha256_file(SEED)
    table = run_cli("simulate", SEED, "--profile", seed_profile_file)
    assert "6 of 6 measured" in table.stdout
    other = run_cli("simulate", SAMPLES / "mlp.onnx", "--profile", seed_profile_file, "--json")
    assert other.json()["time_nodes"] == {"total": 16, "measured": 0, "estimated": 16}
    assert "no node of" in other.stderr and "seed.onnx" in other.stderr
    datasheet = run_cli("simulate", SEED, "--profile", "cpu")
    assert "all 6 estimated" in datasheet.stdout


def test_plan_cli_reports_the_estimate_with_a_measured_profile(run_cli, seed_profile_file, tmp_path):
    out = tmp_path / "plan.json"
    result = run_cli("plan", SEED, "-o", out, "--select-distance", "1", "--profile", seed_profile_file)
    assert result.exit_code == 0, result.stderr
    assert "6 of 6 node times measured" in result.stdout
    assert "with copies in line" in result.stdout
    bad = run_cli("plan", SEED, "-o", tmp_path / "other.json", "--profile", tmp_path / "missing.json")
    assert bad.exit_code == 1 and "missing.json" in bad.stderr
    assert not (tmp_path / "other.json").exists()


@pytest.mark.parametrize(
    "damage, words",
    [
        (lambda d: d["measured"]["nodes"]["div"].pop("seconds"), ["measured/nodes/div", "seconds"]),
        (lambda d: d["measured"]["model"].update(sha256="abc"), ["measured/model/sha256"]),
        (lambda d: d["measured"]["link"]["h2d"].update(bandwidth=0), ["measured/link/h2d/bandwidth"]),
        (lambda d: d["measured"].pop("executor"), ["measured", "executor"]),
    ],
)
def test_damaged_measured_profile_exits_1_naming_the_field(run_cli, seed_doc, tmp_path, damage, words):
    doc = copy.deepcopy(seed_doc)
    damage(doc)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    result = run_cli("simulate", SEED, "--profile", path)
    assert result.exit_code == 1 and result.stdout == ""
    for word in [str(path), *words]:
        assert word in result.stderr
    assert "Traceback" not in result.stderr


# ---------------------------------------------------------------------------------------------
# The command line


def test_profile_cli_writes_the_profile_and_one_json_document(run_cli, fast, tmp_path):
    out = tmp_path / "seed.profile.json"
    result = run_cli("profile", SEED, "--device", "cpu", "--inputs", SEED_INPUTS, "--repeat", "2", "-o", out, "--json")
    assert result.exit_code == 0, result.stderr
    doc = result.json()
    assert doc["command"] == "profile" and doc["passed"] is True and doc["files_written"] == [str(out)]
    assert doc["output"] == str(out) and doc["sha256"] == sha256_file(SEED)
    assert doc["intra_op_num_threads"] == 0
    assert doc["nodes"] == {"model": 6, "measured": 6}
    assert doc["device"]["provider"] == "CPUExecutionProvider"
    assert set(doc["link"]) == {"d2h", "h2d"}
    assert load_profile(str(out)).measured.sha256 == sha256_file(SEED)
    human = run_cli("profile", SEED, "--device", "cpu", "--repeat", "1", "-o", out)
    assert human.exit_code == 0, human.stderr
    assert "MemcpyFromHost" in human.stdout
    assert human.stdout.splitlines()[-1].startswith(f"PASSED | profile {SEED} | latency ")
    assert human.stdout.splitlines()[-1].endswith(f"wrote {out}")


@pytest.mark.parametrize(
    "device, provider",
    [("cuda", "CUDAExecutionProvider"), ("ascend", "CANNExecutionProvider")],
)
def test_profile_on_a_missing_device_exits_1_and_keeps_the_output(run_cli, tmp_path, device, provider):
    # this machine has neither a GPU nor the Ascend toolkit: onnxruntime lacks the provider or
    # falls back to the CPU, and profile must say so instead of measuring the CPU
    out = tmp_path / "profile.json"
    out.write_text("previous")
    result = run_cli("profile", SEED, "--device", device, "-o", out)
    assert result.exit_code == 1
    assert provider in result.stderr and f"--device {device}" in result.stderr
    assert "fix:" in result.stderr and "Traceback" not in result.stderr
    assert out.read_text() == "previous"


def test_profile_cli_bad_input(run_cli, tmp_path, write_model):
    out = tmp_path / "p.json"
    both = run_cli("profile", SEED, "--device", "cpu", "--inputs", SEED_INPUTS, "--input-shape", "x=2,3", "-o", out)
    assert both.exit_code == 2 and "exclude" in both.stderr
    missing = run_cli("profile", tmp_path / "nope.onnx", "--device", "cpu", "-o", out)
    assert missing.exit_code == 1 and "nope.onnx" in missing.stderr
    same = run_cli("profile", SEED, "--device", "cpu", "-o", SEED)
    assert same.exit_code == 1 and "same file" in same.stderr
    wrong = tmp_path / "wrong.npz"
    np.savez(wrong, y=np.zeros((2, 3), np.float32))
    bad_inputs = run_cli("profile", SEED, "--device", "cpu", "--inputs", wrong, "-o", out)
    assert bad_inputs.exit_code == 1 and "'y'" in bad_inputs.stderr
    no_folder = run_cli("profile", SEED, "--device", "cpu", "-o", tmp_path / "no" / "p.json")
    assert no_folder.exit_code == 1 and "does not exist" in no_folder.stderr
    for result in (missing, same, bad_inputs, no_folder):
        assert "Traceback" not in result.stderr and result.stdout == ""
    assert not out.exists()


def test_device_names_are_read_for_cuda_and_ascend(monkeypatch):
    def fake(outputs):
        def run(cmd, **kwargs):
            if cmd[0] not in outputs:
                raise FileNotFoundError(cmd[0])
            return subprocess.CompletedProcess(cmd, 0, stdout=outputs[cmd[0]], stderr="")

        return run

    npu = (
        "+------------------------------------------------------------------------------------+\n"
        "| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|\n"
        "+===========================+===============+====================================================+\n"
        "| 0     910B3               | OK            | 93.6        45                0    / 0             |\n"
        "| 1     910B3               | OK            | 90.1        44                0    / 0             |\n"
    )
    monkeypatch.setattr(subprocess, "run", fake({"nvidia-smi": "NVIDIA H200\n", "npu-smi": npu}))
    assert profiler._device_name("cuda", {}) == "NVIDIA H200"
    assert profiler._device_name("ascend", {"device_id": "1"}) == "910B3"
    monkeypatch.setattr(subprocess, "run", fake({}))
    assert profiler._device_name("cuda", {}) == "unknown"
    assert profiler._device_name("ascend", {}) == "unknown"


# ---------------------------------------------------------------------------------------------------
# profiles measured above --opt-level disable: fused nodes' times go to the original's nodes
# ---------------------------------------------------------------------------------------------------

MLP = SAMPLES / "mlp.onnx"
MLP_INPUTS = SAMPLES / "mlp.inputs.npz"

_CHAIN = """
<ir_version: 8, opset_import: ["" : 17]>
g (float[2, 4] x) => (float[2, 4] z)
<float[4, 4] w = {1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0},
 float[4] b = {1.0, 2.0, 3.0, 4.0}>
{
  [mm] h = MatMul(x, w)
  [add] y = Add(h, b)
  [relu] z = Relu(y)
  [tail] t = Relu(z)
}
"""


def test_a_fused_nodes_time_goes_to_the_original_node_that_writes_its_output(tmp_path):
    original = onnx.parser.parse_model(_CHAIN.replace("=> (float[2, 4] z)", "=> (float[2, 4] t)"))
    analysis = _analysis(save(original, tmp_path / "chain.onnx"))
    optimized = onnx.parser.parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17, "com.microsoft" : 1]>
        g (float[2, 4] x) => (float[2, 4] t)
        <float[4, 4] w = {1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0},
         float[4] b = {1.0, 2.0, 3.0, 4.0}>
        {
          [gemm_fused] z = com.microsoft.FusedGemm <activation = "Relu"> (x, w, b)
          [tail] t = Relu(z)
        }
        """
    )
    measured = {
        "gemm_fused": {"op_type": "FusedGemm", "seconds": 3e-6, "input_shapes": [[2, 4], [4, 4], [4]]},
        "tail": {"op_type": "Relu", "seconds": 1e-6, "input_shapes": [[2, 4]], "scratch_bytes": 64},
    }
    found = attribute(analysis, optimized, measured)
    assert found.nodes == {
        "mm": {"op_type": "MatMul", "seconds": 0.0, "ran": False},
        "add": {"op_type": "Add", "seconds": 0.0, "ran": False},
        "relu": {"op_type": "Relu", "seconds": 3e-6, "input_shapes": [[2, 4]]},
        "tail": {"op_type": "Relu", "seconds": 1e-6, "input_shapes": [[2, 4]], "scratch_bytes": 64},
    }
    # the tensors the fusion took in, and the weights a rewritten node reads (constants it needs)
    assert found.fused == ["h", "y", "b", "w"]
    assert found.unattributed_s == 0.0
    # an optimized node that writes no original tensor takes the next original writer downstream
    chained = onnx.parser.parse_model(
        """
        <ir_version: 8, opset_import: ["" : 17]>
        g (float[2, 4] x) => (float[2, 4] t)
        <float[4, 4] w = {1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0},
         float[4] b = {1.0, 2.0, 3.0, 4.0}>
        {
          [reorder] r = Identity(x)
          [gemm] z = Gemm(r, w, b)
          [tail] t = Relu(z)
        }
        """
    )
    found = attribute(analysis, chained, {"reorder": {"op_type": "Identity", "seconds": 2e-6}, **measured})
    assert found.nodes["relu"]["seconds"] == pytest.approx(2e-6)  # reorder -> gemm writes z -> relu
    assert "gemm_fused" not in found.nodes and found.unattributed_s == pytest.approx(3e-6)


def test_a_profile_at_opt_level_all_prices_the_fused_model_and_plans_keep_what_fusions_took_in(fast, tmp_path):
    doc = measure_profile(str(MLP), "cpu", inputs=MLP_INPUTS, repeat=2, opt_level="all")
    measured = doc["measured"]
    assert measured["session"]["opt_level"] == "all"
    analysis = _analysis(MLP)
    # onnxruntime fuses each Gemm + Relu of the MLP into one FusedGemm: the Gemm outputs are gone
    gemms = [n.output[0] for n in analysis.nodes if n.op_type == "Gemm"]
    assert gemms and set(gemms) <= set(measured["fused"])
    not_run = [name for name, e in measured["nodes"].items() if e.get("ran") is False]
    assert not_run and all(measured["nodes"][name]["seconds"] == 0.0 for name in not_run)
    ran = [e for e in measured["nodes"].values() if e.get("ran", True)]
    assert sum(e["seconds"] for e in ran) == pytest.approx(
        sum(e["seconds"] for e in measured["nodes"].values()), rel=1e-12
    )
    path = tmp_path / "mlp.all.json"
    write_profile(path, doc)
    profile = load_profile(str(path))
    assert profile.measured is not None and profile.measured.opt_level == "all"
    assert profile.measured.fused == frozenset(measured["fused"])
    # the fused-away nodes cost nothing: the baseline is the optimized run's latency
    t = simulate(analysis, profile=profile).times
    assert t.baseline == pytest.approx(measured["latency_s"]["median"], rel=1e-6)
    plan = scheduled_plan(analysis, PlanRequest.of_options(select_distance=1, params=True, profile=profile))
    kept = {r["tensor"] for r in plan["rejected"] if r["reason"] == "fused"}
    assert kept and kept <= profile.measured.fused
    assert not {o["tensor"] for o in plan["offloads"]} & profile.measured.fused
    assert plan["options"]["select"]["fused"] == sorted(profile.measured.fused)
    # a model with copies runs without ConstantFolding: the estimate pays, once, what the profile
    # measured that to cost the model at this level
    assert measured["copies_in_model"].get("unfolded_s", 0.0) >= 0.0
    assert profile.measured.unfolded_s == measured["copies_in_model"].get("unfolded_s", 0.0)
    with_copies = scheduled_plan(analysis, PlanRequest.of_options(select_distance=1, params=True))
    assert with_copies["offloads"]
    priced = []
    for unfolded in (0.0, 1e-3):
        doc_u = copy.deepcopy(doc)
        doc_u["measured"]["copies_in_model"]["unfolded_s"] = unfolded
        prof_u = profile_from_dict(doc_u)
        priced.append(simulate(analysis, with_copies, profile=prof_u).times)
        assert simulate(analysis, profile=prof_u).times.serialized == pytest.approx(t.serialized, rel=1e-9)
    assert priced[1].serialized - priced[0].serialized == pytest.approx(1e-3, rel=1e-9)
    assert priced[1].baseline == pytest.approx(priced[0].baseline, rel=1e-12)
    # a budget the kept tensors put out of reach says why
    with pytest.raises(OffloadError, match="stay on the device for onnxruntime's fusions") as caught:
        scheduled_plan(analysis, PlanRequest.of_options(budget=lower_bound(analysis)[0], params=True, profile=profile))
    assert "reason fused" in (caught.value.hint or "")
    # at --opt-level disable nothing is fused, and plans record no such list
    assert (
        "fused"
        not in scheduled_plan(analysis, PlanRequest.of_options(select_distance=1, params=True))["options"]["select"]
    )


def test_profile_cli_at_opt_level_all_and_an_unsaveable_graph(run_cli, fast, tmp_path, monkeypatch):
    out = tmp_path / "mlp.profile.json"
    result = run_cli("profile", MLP, "--device", "cpu", "--repeat", "1", "--opt-level", "all", "-o", out, "--json")
    assert result.exit_code == 0, result.stderr
    doc = result.json()
    assert doc["opt_level"] == "all" and doc["fused"] > 0
    human = run_cli("profile", MLP, "--device", "cpu", "--repeat", "1", "--opt-level", "all", "-o", out)
    assert "graph optimizations at all" in human.stdout and "taken in by onnxruntime's rewrites" in human.stdout
    # a plan made without it offloads what the fusions take in: simulate with the profile says so
    plan = tmp_path / "plan.json"
    assert run_cli("plan", MLP, "-o", plan, "--params", "--select-distance", "1").exit_code == 0
    simulated = run_cli("simulate", MLP, "--plan", plan, "--profile", out)
    assert simulated.exit_code == 0, simulated.stderr
    assert "take in at the profile's --opt-level all" in simulated.stderr and f"--profile {out}" in simulated.stderr
    kept = tmp_path / "kept.json"
    assert run_cli("plan", MLP, "-o", kept, "--params", "--select-distance", "1", "--profile", out).exit_code == 0
    assert "fusions take in" not in run_cli("simulate", MLP, "--plan", kept, "--profile", out).stderr
    # a provider whose optimized graph onnxruntime cannot save (CANN graph mode): one error, nothing written
    real = timed.Device.runner

    def refuse(self, *args, **kwargs):
        if kwargs.get("optimized") is not None:
            raise OffloadError("Unable to serialize model as it contains compiled nodes", hint="-")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(timed.Device, "runner", refuse)
    out.write_text("previous")
    failed = run_cli("profile", MLP, "--device", "cpu", "--repeat", "1", "--opt-level", "all", "-o", out)
    assert failed.exit_code == 1 and "Traceback" not in failed.stderr
    assert "--opt-level all" in failed.stderr and "compiled nodes" in failed.stderr and "fix:" in failed.stderr
    assert out.read_text() == "previous"


def test_a_model_too_big_to_rewrite_still_times_constant_folding_off(fast, monkeypatch):
    """Over the external-data limit the in-model rewrites are skipped, but above --opt-level disable the
    model alone is still timed with ConstantFolding off, which every rewrite of it runs with."""
    monkeypatch.setattr(copies_in_model, "IN_MODEL_DATA_MAX", -1)
    doc = measure_profile(str(MLP), "cpu", inputs=MLP_INPUTS, repeat=2, opt_level="all")
    in_model = doc["measured"]["copies_in_model"]
    assert "not copied to time rewrites" in in_model["note"] and in_model["unfolded_s"] >= 0.0
    assert in_model["d2h"] is None and in_model["h2d"] is None
    assert (
        "unfolded_s" not in measure_profile(str(MLP), "cpu", inputs=MLP_INPUTS, repeat=2)["measured"]["copies_in_model"]
    )


def test_a_budget_plan_counts_the_kernel_scratch_a_measured_profile_records(fast, tmp_path):
    """The budget planner fits the peak simulate reports: the measured kernel scratch included."""
    unet = SAMPLES / "unet.onnx"
    path = tmp_path / "unet.profile.json"
    write_profile(path, measure_profile(str(unet), "cpu", inputs=SAMPLES / "unet.inputs.npz", repeat=2))
    assert any(e.get("scratch_bytes") for e in json.loads(path.read_text())["measured"]["nodes"].values())
    analysis = _analysis(unet)
    before = simulate(analysis, None, profile=str(path))
    assert before.peak_before > simulate(_analysis(unet), None).peak_before  # the scratch counts
    # ... in the simulation's own analysis: the one given never changes (nothing derived from it is cleared)
    assert analysis.scratch == {} and lower_bound(analysis) == lower_bound(_analysis(unet))
    assert simulate(analysis, None, profile=str(path)).peak_before == before.peak_before
    budget = (lower_bound(analysis)[0] + before.peak_before) // 2
    plan = scheduled_plan(_analysis(unet), PlanRequest.of_options(budget=budget, params=True, profile=str(path)))
    after = simulate(_analysis(unet), plan, profile=str(path))
    assert after.peak_after <= budget
    assert plan["budget"]["predicted_peak_bytes"] == after.peak_after


def test_under_a_measured_profile_the_time_objective_compares_plans_with_their_pins(fast, tmp_path):
    """The time in line of a plan includes its order pins' nodes under a measured profile: the budget
    search compares the two objectives' plans as the simulator prices them, and keeps the faster."""
    unet = SAMPLES / "unet.onnx"
    path = tmp_path / "unet.profile.json"
    write_profile(path, measure_profile(str(unet), "cpu", inputs=SAMPLES / "unet.inputs.npz", repeat=2))
    analysis = _analysis(unet)
    budget = (lower_bound(analysis)[0] + simulate(analysis, None, profile=str(path)).peak_before) // 2
    by_time = scheduled_plan(
        analysis, PlanRequest.of_options(budget=budget, params=True, objective="time", profile=str(path))
    )
    by_bytes = scheduled_plan(
        analysis, PlanRequest.of_options(budget=budget, params=True, objective="bytes", profile=str(path))
    )
    t_time = simulate(analysis, by_time, profile=str(path)).times
    t_bytes = simulate(analysis, by_bytes, profile=str(path)).times
    assert t_time.serialized <= t_bytes.serialized * (1 + 1e-12)
    compared = by_time["budget"]["compared"]
    assert min(compared["stall_s"].values()) == pytest.approx(t_time.serialized - t_time.baseline, abs=1e-12)


def test_copies_noise_hid_are_timed_once_more_and_then_refused(fast, monkeypatch):
    """A sweep whose larger copies timed no slower (noise on a loaded machine) is timed again, twice as
    long; noise both times is one clear error."""
    real = profiler._sweep
    calls: list[tuple[str, float]] = []

    def noisy_once(dev, folder, direction, sizes, footprint, repeat, min_seconds, rng):
        calls.append((direction, min_seconds))
        points, doc = real(dev, folder, direction, sizes, footprint, repeat, min_seconds, rng)
        if sum(d == direction for d, _ in calls) == 1:
            points = [(b, 0.0) for b, _ in points]  # what noise looks like: no copy cost anything
        return points, doc

    monkeypatch.setattr(profiler, "_sweep", noisy_once)
    doc = measure_profile(str(MLP), "cpu", inputs=MLP_INPUTS, repeat=2)
    assert [d for d, _ in calls] == ["d2h", "d2h", "h2d", "h2d"]
    assert calls[1][1] == 2 * calls[0][1]
    assert doc["link"]["d2h"]["bandwidth"] > 0

    def always_noisy(dev, folder, direction, sizes, footprint, repeat, min_seconds, rng):
        points, doc = real(dev, folder, direction, sizes, footprint, repeat, min_seconds, rng)
        return [(b, 0.0) for b, _ in points], doc

    monkeypatch.setattr(profiler, "_sweep", always_noisy)
    with pytest.raises(OffloadError, match="noise exceeded what the copies cost"):
        measure_profile(str(MLP), "cpu", inputs=MLP_INPUTS, repeat=2)
