"""Rewrites on a real device provider: onnxruntime's WebGPU plugin, over Mesa's software Vulkan
driver on a machine without a GPU (docs/devices.md). There host and device are two memories, and
onnxruntime partitions the graph and inserts copies as it does for CUDA or CANN; the CPU provider
cannot show a copy that goes wrong.

For each sample, fp32 and fp16, weights and activations, under PRIORITY_BASED and DEFAULT: outputs
close to the original's on the same provider, every order pin held, and not one copy inserted by
onnxruntime (its own ``Memcpy`` nodes in the graph it runs).

The WebGPU provider needs onnxruntime >= 1.24.4 and onnxruntime-ep-webgpu, so these run from an
environment of their own, named by OFFLOADCTL_DEVICE_VENV (`make test-device` builds it, with the
software driver in its ``vulkan`` folder); planning and rewriting run here.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import onnx
import pytest

from conftest import SAMPLES
from models import (
    early_host_node_model,
    host_chain_model,
    host_nodes_model,
    idle_typed_model,
    old_pin_model,
    save,
    to_fp16,
)

pytestmark = pytest.mark.device

VENV = os.environ.get("OFFLOADCTL_DEVICE_VENV")
WHEEL_DATA = Path(onnx.__file__).parent / "backend" / "test" / "data"  # models the onnx wheel ships


def _device(*args: str | Path) -> subprocess.CompletedProcess:
    """``offloadctl ARGS`` in the device environment, with its software Vulkan driver when it has one."""
    assert VENV, "set OFFLOADCTL_DEVICE_VENV to an environment with onnxruntime-ep-webgpu (make test-device)"
    venv = Path(VENV).resolve()
    env_file = venv / "vulkan" / "env"
    command = " ".join(f"'{a}'" for a in [venv / "bin" / "offloadctl", *args])
    if env_file.exists():
        command = f". '{env_file}' && {command}"
    return subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=300)


def _run_json(model: Path, *args: str | Path) -> tuple[int, dict]:
    done = _device("run", model, "--device", "webgpu", "--json", "--repeat", "1", *args)
    assert done.stdout.strip(), done.stderr
    return done.returncode, json.loads(done.stdout)


def _sample(name: str, precision: str, folder: Path) -> Path:
    if precision == "fp32":
        return SAMPLES / f"{name}.onnx"
    path = folder / f"{name}.fp16.onnx"
    onnx.save(to_fp16(onnx.load(SAMPLES / f"{name}.onnx")), path)
    return path


CASES = [
    ("seed", ["--select-distance", "1", "--prefetch-distance", "2"]),
    ("mlp", ["--params", "--select-distance", "2"]),
    ("unet", ["--params", "--select-distance", "10", "--prefetch-distance", "3"]),
    ("transformer", ["--select-distance", "3", "--prefetch-distance", "1"]),
    ("training", ["--params", "--select-distance", "2", "--prefetch-distance", "1"]),
]


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize(("name", "options"), CASES, ids=[c[0] for c in CASES])
def test_rewrites_hold_on_the_device_provider(run_cli, tmp_path, name, options, precision):
    source = _sample(name, precision, tmp_path)
    plan, out = tmp_path / "plan.json", tmp_path / "model.offload.onnx"
    for order in ("priority", "default"):
        res = run_cli("plan", source, *options, "--execution-order", order, "-o", plan)
        assert res.exit_code in (0, 1) and plan.exists(), res.stderr
        doc = json.loads(plan.read_text())
        assert doc["offloads"], f"{name}: nothing offloaded"
        out.unlink(missing_ok=True)
        res = run_cli("apply", plan, "-o", out)
        assert res.exit_code == 0, res.stderr
        for run_order in ("priority", "default"):
            code, report = _run_json(
                out, "--compare-to", source, "--execution-order", run_order, "--opt-level", "disable",
                *(["--rtol", "1e-2", "--atol", "1e-2"] if precision == "fp16" else []),
            )  # fmt: skip
            where = f"{name} {precision}, planned {order}, run {run_order}"
            assert report["providers"][0] == "WebGpuExecutionProvider", where
            assert report["inserted_copies"] == [], f"{where}: {report['inserted_copies']}"
            assert report["original_inserted_copies"] == [], where
            assert report["plan_undone_by"] == [], where
            assert all(c["within_tolerance"] for c in report["comparison"].values()), where
            if report["order_pins"] is not None and run_order == order:
                assert report["order_pins"]["holds"], f"{where}: {report['order_pins']}"
            if run_order == order:  # the plan's peak is the device peak of the order that ran
                assert report["ran_peak_bytes"] == doc["summary"]["estimate"]["peak_bytes"]["after"], where
            assert code == 0, where


def test_a_host_tensor_read_on_the_device_is_reported_and_fails(tmp_path):
    """The pin form that reads the host tensor (Shape(host) into a view): onnxruntime copies the host
    tensor straight back to the device. `run` fails, naming the copy it inserted and the tensor."""
    path = save(old_pin_model(onnx.TensorProto.FLOAT), tmp_path / "undone.onnx")
    code, report = _run_json(path, "--opt-level", "disable")
    assert code == 1
    assert any(c["op"] == "MemcpyFromHost" and c["tensor"] == "h" for c in report["plan_undone_by"])
    done = _device("run", path, "--device", "webgpu", "--opt-level", "disable", "--repeat", "1")
    assert done.returncode == 1 and "'h'" in done.stderr and "Traceback" not in done.stderr


def test_memory_figures_are_refused_on_webgpu(tmp_path):
    done = _device("run", SAMPLES / "seed.onnx", "--device", "webgpu", "--measure-memory")
    assert done.returncode == 1
    assert "reports no byte counts" in done.stderr and "Traceback" not in done.stderr


SUM_MODEL = """<ir_version: 9, opset_import: ["" : 17]>
g (float[4,8] x) => (float[4,8] y) {
    a = Relu(x)
    s = Sum(a, x)
    b = Neg(s)
    c = Abs(b)
    d = Relu(c)
    e = Neg(d)
    f = Abs(e)
    g2 = Add(f, a)
    y = Add(g2, s)
}"""


def test_a_plan_for_the_device_keeps_what_it_runs_on_the_host(run_cli, tmp_path):
    """WebGPU has no Sum kernel: Sum runs on the CPU, so what it reads and makes is on the host. A
    plan that offloads them does not run there (a MemcpyToHost of a host tensor), and the message
    names the fix; `plan --device webgpu` finds the node with one run and keeps both tensors."""
    model = onnx.parser.parse_model(SUM_MODEL)
    for i, node in enumerate(model.graph.node):
        node.name = f"n{i}_{node.op_type}"
    source = save(model, tmp_path / "sum.onnx")
    plan, out = tmp_path / "plan.json", tmp_path / "out.onnx"
    options = ["--select-distance", "2", "--prefetch-distance", "0"]
    assert run_cli("plan", source, *options, "-o", plan).exit_code == 0
    assert {o["tensor"] for o in json.loads(plan.read_text())["offloads"]} == {"a", "s"}
    assert run_cli("apply", plan, "-o", out).exit_code == 0
    done = _device("run", out, "--device", "webgpu", "--opt-level", "disable", "--repeat", "1")
    assert done.returncode == 1 and "--device" in done.stderr and "Traceback" not in done.stderr

    plan.unlink()
    out.unlink()
    done = _device("plan", source, *options, "--device", "webgpu", "-o", plan)
    assert done.returncode == 0, done.stderr
    from offloadctl.contract.document import read_plan

    doc = read_plan(plan)
    assert doc["options"]["select"]["host_device"] == "webgpu (measured)"
    assert "n1_Sum" in doc["options"]["select"]["host_nodes"]
    kept = {r["tensor"] for r in doc["rejected"] if r["reason"] == "host-resident"}
    assert kept == {"a", "s"}


LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


@pytest.mark.parametrize("name", ["host-nodes", "shufflenet"])
def test_a_device_plan_quotes_the_peaks_the_device_runs(tmp_path, name):
    """Where WebGPU runs nodes on the CPU (Sum, ConstantOfShape: the onnx wheel's shufflenet makes all
    its weights so), onnxruntime inserts copies and runs two streams. `plan --device webgpu` quotes the
    peaks of the model and of its rewrite as placed and ordered there; `run` finds the order it predicts
    (copies and streams included) and those same peaks in the order that ran, in both orders."""
    if name == "host-nodes":
        source = save(host_nodes_model(), tmp_path / "m.onnx")
        options = ["--select-distance", "1", "--prefetch-distance", "0"]
    else:
        source, options = LIGHT / "light_shufflenet.onnx", ["--params", "--select-distance", "10"]
    plan, out = tmp_path / "plan.json", tmp_path / "out.onnx"
    for order in ("priority", "default"):
        done = _device("plan", source, *options, "--execution-order", order, "--device", "webgpu", "-o", plan)
        assert plan.exists(), done.stderr
        peak = json.loads(plan.read_text())["summary"]["estimate"]["peak_bytes"]
        assert peak["device"] == "webgpu" and "as webgpu runs it" in done.stdout + done.stderr
        out.unlink(missing_ok=True)
        assert _device("apply", plan, "-o", out).returncode == 0
        for model, figure in ((out, "after"), (source, "before")):
            code, report = _run_json(model, "--execution-order", order, "--opt-level", "disable")
            where = f"{name}, {order}, {figure}"
            assert code == 0 and report["order"]["matches"], f"{where}: {report['order']}"
            assert report["ran_peak_bytes"] == peak[figure], where
        if name == "shufflenet" and order == "default":  # every weight reaches the device before the first node
            assert peak["before"] > 2 * peak["planned_before"]


@pytest.mark.parametrize("name", ["early-host-node", "llama"])
def test_a_device_plans_pins_hold_where_onnxruntime_inserts_copies(tmp_path, name):
    """onnxruntime runs a node on the CPU (the Hardmax; Llama's attention-mask chain) and appends the
    copies it inserts after every node: under PRIORITY_BASED every weight's H2D ran first (Llama:
    14 of 18 pins broken, planned 753 -> 352 KiB, 785 KiB as it ran). The rewrite of a plan made with
    ``--device`` writes those copies where they are needed: none is inserted, the pins the plan counts
    hold in the order WebGPU runs, and the peak that runs is the plan's, in both orders."""
    if name == "llama":
        source, dims = _llm_case("llama")
        ranges = ["--value-range", "input_ids:0,100", "--value-range", "attention_mask:1,1"]
        options = ["--params", "--select-distance", "10", "--prefetch-distance", "2"]
    else:
        source, dims, ranges = save(early_host_node_model(), tmp_path / "m.onnx"), [], []
        options = ["--params", "--select-distance", "2", "--prefetch-distance", "1"]
    plan, out = tmp_path / "plan.json", tmp_path / "out.onnx"
    for order in ("priority", "default"):
        done = _device("plan", source, *dims, *options, "--device", "webgpu", "--execution-order", order, "-o", plan)
        assert plan.exists(), done.stderr
        peak = json.loads(plan.read_text())["summary"]["estimate"]["peak_bytes"]
        assert peak["pins_broken"] == 0 and peak["after"] < 0.6 * peak["before"], (order, peak)
        out.unlink(missing_ok=True)
        assert _device("apply", plan, "-o", out).returncode == 0
        code, report = _run_json(
            out, "--execution-order", order, "--opt-level", "disable", "--compare-to", source, *ranges
        )
        where = f"{name}, {order}"
        assert code == 0 and report["order"]["matches"], (where, report["order"])
        assert report["inserted_copies"] == [] and report["order_pins"]["holds"], (where, report["order_pins"])
        assert report["ran_peak_bytes"] == peak["after"], where
        assert all(c["identical"] for c in report["comparison"].values()), where
        plan.unlink()


def test_a_device_plan_counts_the_casts_onnxruntime_inserts_around_a_float16_host_node(tmp_path):
    """The CPU has no float16 Hardmax: on WebGPU onnxruntime runs the float16 copy of the early host node
    model's Hardmax on the CPU in float32, between two Casts it appends after every node. Under
    PRIORITY_BASED they hold back the Hardmax, and every weight's H2D runs first: 15 of 15 pins broke
    and 131 KiB ran where the plan said 18 KiB. `plan --device webgpu` records the Casts
    (``options.select.host_casts``) and counts them: the peak it quotes and the pins it says break are
    those of the run, and under DEFAULT the pins hold at the plan's peak."""
    source = save(to_fp16(early_host_node_model()), tmp_path / "m.onnx")
    options = ["--params", "--select-distance", "3", "--prefetch-distance", "2"]
    plan, out = tmp_path / "plan.json", tmp_path / "out.onnx"
    for order in ("priority", "default"):
        done = _device("plan", source, *options, "--device", "webgpu", "--execution-order", order, "-o", plan)
        assert plan.exists(), done.stderr
        doc = json.loads(plan.read_text())
        casts = doc["options"]["select"]["host_casts"]
        assert casts == [{"tensor": "x", "readers": ["h"]}, {"tensor": "h", "readers": None}], casts
        peak = doc["summary"]["estimate"]["peak_bytes"]
        out.unlink(missing_ok=True)
        assert _device("apply", plan, "-o", out).returncode == 0
        code, report = _run_json(out, "--execution-order", order, "--opt-level", "disable")
        assert code == 0 and report["inserted_copies"] == [], (order, report["inserted_copies"])
        assert report["order"]["matches"], (order, report["order"])  # the Casts run where predicted
        pins = report["order_pins"]
        assert report["ran_peak_bytes"] == peak["after"], (order, report["ran_peak_bytes"], peak)
        assert peak["pins_broken"] == len(pins["violated"]) and peak["pins_checked"] == pins["checked"], (order, pins)
        if order == "priority":
            assert peak["pins_broken"] > 0 and "--execution-order default" in done.stderr, done.stderr
            assert peak["after"] > 4 * peak["planned_after"], peak
        else:
            assert pins["holds"] and peak["after"] < 0.2 * peak["before"], (pins, peak)
        plan.unlink()


@pytest.mark.parametrize("name", ["early-host-node", "host-chain", "host-chain-read-on-device", "shufflenet"])
def test_the_casts_predicted_for_cuda_and_cann_are_those_onnxruntime_inserts(tmp_path, name):
    """`plan --device cuda` and `--device ascend` predict the Casts onnxruntime's float16 fallback
    inserts on the CPU (`offloadctl.running.placement.predicted_casts`); on WebGPU the same code of
    onnxruntime runs, and `plan --device webgpu` records the Casts it inserted. With the host nodes
    WebGPU measured, the prediction is what onnxruntime did: the entries and their order, for a lone
    Hardmax, two in a row (no Cast between them), two in a row whose first output the device reads too,
    and the onnx wheel's shufflenet (13 Sum nodes that run in float32, 39 Casts)."""
    from offloadctl.analysis.graph import analyse
    from offloadctl.loading.model import load_model
    from offloadctl.running.residency import casts_for

    models = {
        "early-host-node": early_host_node_model,
        "host-chain": host_chain_model,
        "host-chain-read-on-device": lambda: host_chain_model(read_on_device=True),
        "shufflenet": lambda: onnx.load(LIGHT / "light_shufflenet.onnx"),
    }
    source = save(to_fp16(models[name]()), tmp_path / "m.onnx")
    plan = tmp_path / "plan.json"
    done = _device("plan", source, "--params", "--device", "webgpu", "-o", plan)
    assert plan.exists(), done.stderr
    select = json.loads(plan.read_text())["options"]["select"]
    measured = select.get("host_casts", [])
    assert measured, select
    predicted = casts_for(analyse(load_model(source)), select["host_nodes"])
    assert [c.to_json() for c in predicted] == measured


def _llm_case(name: str) -> tuple[Path, list[str]]:
    if name == "llama":
        dims = {"batch_size": 1, "sequence_length": 16, "past_sequence_length": 256}
        dims |= {"total_sequence_length": 256, "kv_cache_dim": 16}
        return SAMPLES / "genai" / "llama-fp32" / "model.onnx", [
            a for k, v in dims.items() for a in ("--dim", f"{k}={v}")
        ]
    return SAMPLES / "bert" / "model.onnx", []


@pytest.mark.parametrize("name", ["llama", "bert"])
def test_language_model_rewrites_load_and_run_on_the_device(tmp_path, name):
    """The genai builder's Llama (GroupQueryAttention, its sequence lengths read on the host) and a
    BERT export (Constant-node weights, an int64 mask chain the provider runs on the CPU), weights
    and activations offloaded: both loaded and ran bit-identical before, and failed on WebGPU
    ("Duplicate definition of name ...__offloadN_dev0")."""
    source, dims = _llm_case(name)
    ranges = ["--value-range", "input_ids:0,100", "--value-range", "attention_mask:1,1"]
    for order in ("priority", "default"):
        plan, out = tmp_path / f"{order}.plan.json", tmp_path / f"{order}.onnx"
        done = _device(
            "plan", source, *dims, "--params", "--select-distance", "10", "--device", "webgpu",
            "--execution-order", order, "-o", plan,
        )  # fmt: skip
        assert plan.exists(), done.stderr
        assert json.loads(plan.read_text())["offloads"]
        done = _device("apply", plan, "-o", out)
        assert done.returncode == 0, done.stderr
        code, report = _run_json(
            out, "--compare-to", source, "--execution-order", order, "--opt-level", "disable", *ranges
        )
        assert code == 0, report["warnings"]
        assert report["plan_undone_by"] == []
        assert all(c["identical"] for c in report["comparison"].values())


def test_simulate_refuses_a_cpu_figure_for_another_onnxruntime():
    """The device environment has onnxruntime 1.32, which keeps weights outside its arena: the CPU
    replica (which models 1.24) gives no figure there, and says why."""
    done = _device("simulate", SAMPLES / "unet.onnx", "--json")
    assert done.returncode == 0, done.stderr
    cpu = json.loads(done.stdout)["cpu_peak_bytes"]
    replica = json.loads(done.stdout)["cpu_replica"]
    assert cpu["after"] is None and replica["onnxruntime"] == "1.24" and "1.32" in replica["refused"]


def test_a_profile_is_measured_on_the_device_and_plans_take_it(run_cli, tmp_path):
    profile, plan = tmp_path / "webgpu.json", tmp_path / "plan.json"
    done = _device("profile", SAMPLES / "seed.onnx", "--device", "webgpu", "--repeat", "3", "-o", profile)
    assert done.returncode == 0, done.stderr
    doc = json.loads(profile.read_text())
    assert doc["measured"]["device"]["provider"] == "WebGpuExecutionProvider"
    assert doc["measured"]["memory"] is None  # the provider reports no byte counts
    res = run_cli("plan", SAMPLES / "seed.onnx", "--select-distance", "1", "--profile", profile, "-o", plan)
    assert res.exit_code == 0, res.stderr
    assert "profile measured webgpu" in res.stdout + res.stderr


# onnx's backend test models (tests/test_wheel_models.py), one of each kind: convolutions of three
# ranks, a transposed one, an embedding, a matrix product, an index; most have one node, so only
# --force offloads their weights; PixelShuffle's Reshape shapes stay on the host unforced
FORCE_ALL = ["--force", "*"]
WHEEL_MODELS = [
    ("test_Conv1d_groups", FORCE_ALL),
    ("test_Conv2d_depthwise_padded", FORCE_ALL),
    ("test_Conv3d_dilated_strided", FORCE_ALL),
    ("test_ConvTranspose2d", FORCE_ALL),
    ("test_Embedding", FORCE_ALL),
    ("test_Linear_no_bias", FORCE_ALL),
    ("test_operator_index", FORCE_ALL),
    ("test_PixelShuffle", []),
]


@pytest.mark.parametrize(("name", "options"), WHEEL_MODELS, ids=[m[0] for m in WHEEL_MODELS])
def test_the_onnx_wheels_models_hold_on_the_device_provider(tmp_path, name, options):
    """Models exported by others, planned for WebGPU with every tensor select lets offload, rewritten
    and run there on the inputs shipped with them: not one copy inserted by onnxruntime, and the
    outputs the original gives on the same provider."""
    folder = next(p.parent for p in WHEEL_DATA.glob(f"*/{name}/model.onnx"))
    source, plan, out = folder / "model.onnx", tmp_path / "plan.json", tmp_path / "out.onnx"
    done = _device("plan", source, "--select-distance", "0", "--params", *options, "--device", "webgpu", "-o", plan)
    assert plan.exists(), done.stderr
    assert json.loads(plan.read_text())["offloads"], name
    assert "--force'd" not in done.stderr  # none of them is read on the host
    assert _device("apply", plan, "-o", out).returncode == 0
    data = folder / "test_data_set_0"
    code, report = _run_json(out, "--inputs", data, "--compare-to", source, "--opt-level", "disable")
    assert report["providers"][0] == "WebGpuExecutionProvider"
    assert report["inserted_copies"] == [] and report["plan_undone_by"] == [], report["inserted_copies"]
    assert all(c["within_tolerance"] for c in report["comparison"].values()), report["comparison"]
    assert code == 0, report["warnings"]


def test_forcing_a_host_read_is_warned_at_plan_and_named_when_the_device_refuses_it(tmp_path):
    """PixelShuffle's Reshape shapes are weights onnxruntime reads in host memory. ``--force '*'`` offloads
    them anyway: plan warns, naming them; WebGPU cannot load the rewrite (a duplicate definition in
    the graph onnxruntime builds), and `run` says to leave them out of --force."""
    folder = next(p.parent for p in WHEEL_DATA.glob("*/test_PixelShuffle/model.onnx"))
    source, plan, out = folder / "model.onnx", tmp_path / "plan.json", tmp_path / "out.onnx"
    args = ["--select-distance", "0", "--params", "--force", "*", "--device", "webgpu", "-o", plan]
    done = _device("plan", source, *args)
    assert plan.exists(), done.stderr
    assert "--force'd tensor(s) are read where onnxruntime keeps them in host memory" in done.stderr
    assert "read as input 1 of Reshape" in done.stderr
    assert _device("apply", plan, "-o", out).returncode == 0
    done = _device("run", out, "--device", "webgpu", "--repeat", "1", "--inputs", folder / "test_data_set_0")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "onnxruntime cannot load" in done.stderr and "leave them out of --force" in done.stderr


def test_a_bfloat16_activation_webgpu_keeps_on_the_host_is_not_offloaded(tmp_path):
    """WebGPU has no bfloat16 kernels, so it runs the Cast that makes an idle bfloat16 activation on the
    CPU: a plan for it keeps that activation where it is (host-resident) and its rewrite runs with the
    original's outputs in both orders, while a plan made without --device copies it, and WebGPU
    refuses that rewrite with the fix (plan with --device). On the CPU provider the bfloat16 rewrite
    runs, its D2H unpinned (test_apply's per-type test)."""
    source = idle_typed_model(onnx.TensorProto.BFLOAT16, tmp_path / "bf16.onnx")
    plan, out = tmp_path / "plan.json", tmp_path / "bf16.offload.onnx"
    options = ("--select-distance", "3", "--prefetch-distance", "0", "--min-bytes", "0", "-o", plan)
    made = _device("plan", source, *options, "--device", "webgpu", "--json")
    assert made.returncode == 0, made.stderr
    doc = json.loads(made.stdout)
    assert doc["offloads"]["count"] == 0 and doc["rejected"].get("host-resident") == 1
    assert _device("apply", plan, "-o", out).returncode == 0
    for order in ("priority", "default"):
        code, report = _run_json(out, "--compare-to", source, "--execution-order", order)
        assert code == 0 and all(c["identical"] for c in report["comparison"].values()), order
    plain = tmp_path / "plain.json"
    assert _device("plan", source, *options[:-1], plain).returncode == 0
    out.unlink()
    assert _device("apply", plain, "-o", out).returncode == 0
    refused = _device("run", out, "--device", "webgpu", "--compare-to", source, "--repeat", "1")
    assert refused.returncode == 1 and "plan again with --device" in " ".join(refused.stderr.split())
