"""Copies on a stream of their own (`offloadctl.rewriting.streams`, ``apply --copies streams``): the event
nodes, the partition file, and the rewrite run on the CPU provider with it (two logic streams, the same
executor, barriers and reuse planner a GPU runs)."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest

from offloadctl.contract.document import read_plan
from offloadctl.rewriting.streams import EVENT_OPTIMIZERS, PARTITION_KEY

from conftest import SAMPLE_NAMES, SAMPLES

COPY_OPS = ("MemcpyToHost", "MemcpyFromHost")


def _streams_rewrite(run_cli, tmp_path: Path, name: str) -> tuple[Path, Path]:
    plan, out = tmp_path / "plan.json", tmp_path / f"{name}.offload.onnx"
    made = run_cli("plan", SAMPLES / f"{name}.onnx", "-o", plan, "--select-distance", "2", "--prefetch-distance", "2",
                   "--params", "--copies", "streams")  # fmt: skip
    assert made.exit_code in (0, 1), made.stderr  # a plan that lowers the peak by little still writes the plan
    applied = run_cli("apply", plan, "-o", out, "--copies", "streams", "--json")
    assert applied.exit_code == 0, applied.stderr
    doc = applied.json()
    partition = tmp_path / f"{name}.offload.streams.json"
    assert doc["copy_mode"] == "streams" and doc["partition_file"] == str(partition)
    assert str(partition) in doc["files_written"]
    return out, partition


def test_apply_writes_the_events_and_a_partition_file_naming_every_node_once(run_cli, tmp_path):
    out, partition = _streams_rewrite(run_cli, tmp_path, "unet")
    model = onnx.load(str(out))
    doc = json.loads(partition.read_text())
    assert doc["type"] == "DeviceBasedPartitioner" and len(doc["streams"]) == 2 and len(doc["devices"]) == 2
    copy_stream, compute = doc["streams"]
    names = [n.name for n in model.graph.node if n.op_type != "Constant"]
    assert sorted(copy_stream + compute) == sorted(names)  # every node once
    copies = [n for n in model.graph.node if n.op_type in COPY_OPS]
    gates = [n for n in model.graph.node if n.name.startswith("offload/event/gate/")]
    fences = [n for n in model.graph.node if n.name.startswith("offload/event/fence/")]
    held = {g.name.removeprefix("offload/event/gate/") for g in gates}
    in_line = {n.name for n in copies if n.op_type == "MemcpyFromHost"} - held
    # every copy a gate holds, and every copy to host, on the copy stream, listed first; a load no gate holds
    # (one before any compute node, or one issued early that would raise the peak) in line, on compute
    assert copies and {n.name for n in copies} - in_line <= set(copy_stream) and in_line <= set(compute)
    first = next(k for k, n in enumerate(model.graph.node) if n.op_type not in (*COPY_OPS, "Constant"))
    at_start = {n.name for n in model.graph.node[:first] if n.op_type == "MemcpyFromHost"}  # issued at once
    assert at_start <= in_line and held <= {n.name for n in copies}
    assert len(fences) == sum(n.op_type == "MemcpyToHost" for n in copies) > 0
    assert all(n.op_type == "Identity" for n in gates + fences) and {n.name for n in fences} <= set(compute)
    index = {n.name: k for k, n in enumerate(model.graph.node)}
    for gate in gates:  # each gate right before its copy, in the file and so in the copy stream
        assert index[gate.name] + 1 == index[gate.name.removeprefix("offload/event/gate/")]
    meta = {
        p.key: json.loads(p.value)
        for p in model.metadata_props
        if p.key in ("offloadctl.streams", "offloadctl.session")
    }
    assert meta["offloadctl.streams"]["partition_file"] == partition.name
    assert meta["offloadctl.streams"]["session_config"][PARTITION_KEY] == partition.name
    assert meta["offloadctl.session"]["disabled_optimizers"] == list(EVENT_OPTIMIZERS)
    onnx.checker.check_model(model, full_check=True)


@pytest.mark.parametrize("name", [n for n in SAMPLE_NAMES if n != "seed"])
def test_the_streams_rewrite_runs_on_two_streams_in_the_predicted_order(run_cli, tmp_path, name):
    """On the CPU provider with its partition file, in both orders: the order onnxruntime's two-stream
    executor ran is the one predicted (copy stream first, each copy at its gate), the outputs are
    bit-identical, and --json stays one document although onnxruntime prints reuse notes on stdout."""
    out, partition = _streams_rewrite(run_cli, tmp_path, name)
    for order in ("priority", "default"):
        result = run_cli("run", out, "--device", "cpu", "--inputs", SAMPLES / f"{name}.inputs.npz",
                         "--compare-to", SAMPLES / f"{name}.onnx", "--repeat", "1", "--execution-order", order,
                         "--json")  # fmt: skip
        assert result.exit_code == 0, result.stderr
        doc = result.json()
        assert doc["copy_streams"]["partition_file"] == str(partition.resolve())
        assert doc["copy_streams"]["streams"] == 2
        assert doc["order"]["matches"], (order, doc["order"])
        assert all(c["identical"] for c in doc["comparison"].values())


def test_a_stale_missing_or_broken_partition_file_is_one_clear_error(run_cli, tmp_path):
    """From run and from simulate, which a CI job can run without onnxruntime's session."""
    out, partition = _streams_rewrite(run_cli, tmp_path, "mlp")
    good = partition.read_text()
    doc = json.loads(good)
    cases = {
        "renamed": {**doc, "streams": [doc["streams"][0], [*doc["streams"][1][:-1], "renamed_node"]]},
        "empty": {**doc, "streams": [doc["streams"][0] + doc["streams"][1], []]},
        "missing": None,
    }
    for case, broken in cases.items():
        if broken is None:
            partition.unlink()
        else:
            partition.write_text(json.dumps(broken))
        result = run_cli("run", out, "--device", "cpu", "--inputs", SAMPLES / "mlp.inputs.npz", "--repeat", "1")
        assert result.exit_code == 1, case
        message = " ".join(result.stderr.split())
        assert (
            str(partition) in message
            and "fix: write the rewrite again with offloadctl apply --copies streams" in message
        )
        assert "Traceback" not in result.stderr
        expected = {"renamed": "not in the model", "empty": "an empty one", "missing": "does not exist"}[case]
        assert expected in message, (case, message)
        checked = run_cli("simulate", out)  # the same check, for a CI job without onnxruntime's session
        assert checked.exit_code == 1 and expected in " ".join(checked.stderr.split()), case
    partition.write_text(good)
    fused = run_cli("run", out, "--device", "cpu", "--inputs", SAMPLES / "mlp.inputs.npz", "--opt-level", "all")
    assert fused.exit_code == 1 and "--opt-level disable" in " ".join(fused.stderr.split())


def test_apply_never_writes_the_partition_file_over_an_input(run_cli, tmp_path):
    plan = tmp_path / "m.offload.streams.json"  # the name the partition file of m.offload.onnx would take
    made = run_cli("plan", SAMPLES / "mlp.onnx", "-o", plan, "--select-distance", "2", "--params", "--json")
    assert made.exit_code in (0, 1) and made.json()["offloads"]  # copies: a partition file to write
    before = plan.read_bytes()
    result = run_cli("apply", plan, "-o", tmp_path / "m.offload.onnx", "--copies", "streams")
    assert result.exit_code == 1 and "Traceback" not in result.stderr
    assert plan.read_bytes() == before and not (tmp_path / "m.offload.onnx").exists()


def test_inline_copies_write_no_partition_file(run_cli, tmp_path):
    plan, out = tmp_path / "plan.json", tmp_path / "m.offload.onnx"
    assert run_cli("plan", SAMPLES / "mlp.onnx", "-o", plan, "--select-distance", "2").exit_code in (0, 1)
    doc = run_cli("apply", plan, "-o", out, "--json").json()
    assert doc["copy_mode"] == "inline" and doc["partition_file"] is None
    assert not list(tmp_path.glob("*.streams.json"))
    assert "offloadctl.streams" not in {p.key for p in onnx.load(str(out)).metadata_props}


def test_the_python_code_in_the_streams_page_runs_the_rewrite(run_cli, tmp_path, monkeypatch):
    """docs/streams.md's Python block, as a reader copies it, in a folder holding the rewrite it names."""
    import re

    import numpy as np

    out, _ = _streams_rewrite(run_cli, tmp_path, "mlp")
    assert out.name == "mlp.offload.onnx"  # the name the page uses
    page = (Path(__file__).resolve().parent.parent / "docs" / "streams.md").read_text()
    (code,) = [block for block in re.findall(r"```python\n(.*?)```", page, flags=re.S) if "mlp.offload.onnx" in block]
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(code, "docs/streams.md", "exec"), scope)  # noqa: S102 - the page's own example
    session = scope["session"]
    feeds = dict(np.load(SAMPLES / "mlp.inputs.npz"))
    assert session.run(None, feeds)


def _default_streams_rewrite(run_cli, tmp_path: Path, name: str) -> Path:
    plan, out = tmp_path / "default.plan.json", tmp_path / f"{name}.default.offload.onnx"
    made = run_cli("plan", SAMPLES / f"{name}.onnx", "-o", plan, "--execution-order", "default", "--params",
                   "--select-distance", "10")  # fmt: skip
    assert made.exit_code in (0, 1), made.stderr
    applied = run_cli("apply", plan, "-o", out, "--copies", "streams")
    assert applied.exit_code == 0, applied.stderr
    return out


@pytest.mark.parametrize("name, planner_matters", [("transformer", True), ("training", False)])
def test_simulate_replays_the_reuse_plan_onnxruntime_makes_for_two_streams(run_cli, tmp_path, name, planner_matters):
    """The CPU arena figure of a streams rewrite is onnxruntime's own (C API MaxInUse, DEFAULT order) within
    2%: two streams on one device get the multi-stream reuse plan, which one stream's replay misses by more
    on the transformer (on the training step the two plans come within 2% of each other). (The unet's
    convolutions take kernel scratch the replica counts from a measured profile only.)"""
    from offloadctl.analysis.graph import analyse
    from offloadctl.loading.model import load_model
    from offloadctl.simulation.ortcpu import cpu_peak, declared_shapes

    out = _default_streams_rewrite(run_cli, tmp_path, name)
    ran = run_cli("run", out, "--device", "cpu", "--inputs", SAMPLES / f"{name}.inputs.npz", "--execution-order",
                  "default", "--measure-memory", "--repeat", "1", "--json")  # fmt: skip
    assert ran.exit_code == 0, ran.stderr
    (measured,) = [m["peak_bytes"] for m in ran.json()["measured_memory"] if m["method"] == "allocator-stats"]
    simulated = run_cli("simulate", out, "--execution-order", "default", "--json")
    assert simulated.exit_code == 0, simulated.stderr
    replica = simulated.json()["cpu_peak_bytes"]["after"]
    assert abs(replica / measured - 1) <= 0.02, (replica, measured)
    proto = onnx.load(str(out), load_external_data=False)
    one_stream = cpu_peak(analyse(load_model(out), order="default"), shapes=declared_shapes(proto)).peak_bytes
    assert (abs(one_stream / measured - 1) > 0.02) == planner_matters, (one_stream, measured)


def test_a_default_order_streams_rewrite_holds_its_copies_at_their_pins(run_cli, tmp_path):
    """Under DEFAULT a gate before a copy in the file is a leaf the walk reaches last: each H2D order pin's
    Shape reads a gate on the copy stream instead, which comes right before the copy there and holds it
    until the pinned node has run (without it, 10 of the transformer's copies ran early)."""
    out = _default_streams_rewrite(run_cli, tmp_path, "transformer")
    model = onnx.load(str(out), load_external_data=False)
    gated = [n for n in model.graph.node if n.op_type == "Shape" and n.input[0].endswith("__event_gate")]
    assert gated
    copy_stream = set(json.loads(out.with_name(out.stem + ".streams.json").read_text())["streams"][0])
    made = {o: n for n in model.graph.node for o in n.output}
    assert all(made[n.input[0]].name in copy_stream for n in gated)
    result = run_cli("run", out, "--device", "cpu", "--inputs", SAMPLES / "transformer.inputs.npz",
                     "--execution-order", "default", "--compare-to", SAMPLES / "transformer.onnx", "--repeat", "1",
                     "--json")  # fmt: skip
    assert result.exit_code == 0, result.stderr
    doc = result.json()
    assert doc["order"]["matches"] and doc["order_pins"]["checked"] > 0
    assert doc["order_pins"]["holds"] and not doc["order_pins"]["violated"], doc["order_pins"]
    assert all(c["identical"] for c in doc["comparison"].values())


def test_an_exported_bert_streams_rewrite_holds_its_pins_in_the_default_order(run_cli, tmp_path):
    """An exported BERT's DEFAULT plan pins an H2D whose pin node came before the copy in the planned
    order: the file puts it after the copy, so its gate follows the copy in the DEFAULT walk and every
    pin holds on onnxruntime's two-stream executor (before, one copy ran on the wrong side)."""
    bert = SAMPLES / "bert" / "model.onnx"
    plan, out = tmp_path / "bert.plan.json", tmp_path / "bert.offload.onnx"
    made = run_cli("plan", bert, "-o", plan, "--execution-order", "default", "--params", "--select-distance", "10")
    assert made.exit_code in (0, 1), made.stderr
    assert run_cli("apply", plan, "-o", out, "--copies", "streams").exit_code == 0
    result = run_cli("run", out, "--device", "cpu", "--execution-order", "default", "--compare-to", bert,
                     "--repeat", "1", "--json")  # fmt: skip
    assert result.exit_code == 0, result.stderr
    doc = result.json()
    assert doc["order_pins"]["checked"] > 0 and doc["order_pins"]["holds"], doc["order_pins"]
    assert not doc["order_pins"]["violated"] and all(c["identical"] for c in doc["comparison"].values())


def test_a_streams_rewrite_is_never_worse_than_the_same_plan_in_line(run_cli, tmp_path):
    """Under DEFAULT the walk runs a load in line right before its reader, and the copy stream as its gate
    opens: the loads that would be alive, issued so early, where the streams rewrite holds more than in line
    go in line too (apply names them), so that the device peak is the in-line rewrite's. The CPU figures of
    both are onnxruntime's own (C API MaxInUse, DEFAULT order) within 2%. The mlp's DEFAULT plan loads every
    weight before any compute node: no gate can hold one, so apply writes it in line and says so."""
    for name in ("unet", "transformer"):
        plan = tmp_path / f"{name}.plan.json"
        made = run_cli("plan", SAMPLES / f"{name}.onnx", "-o", plan, "--execution-order", "default", "--params",
                       "--select-distance", "10")  # fmt: skip
        assert made.exit_code in (0, 1), made.stderr
        streams, inline = tmp_path / f"{name}.streams.onnx", tmp_path / f"{name}.inline.onnx"
        applied = run_cli("apply", plan, "-o", streams, "--copies", "streams", "--json")
        assert applied.exit_code == 0, applied.stderr
        doc = applied.json()
        assert doc["copy_mode"] == "streams" and doc["loads_in_line"]
        assert run_cli("apply", plan, "-o", inline, "--copies", "inline").exit_code == 0
        peaks = {r: run_cli("simulate", r, "--json").json()["peak_bytes"]["after"] for r in (streams, inline)}
        assert peaks[streams] <= peaks[inline], peaks
        cost = doc["streams_cpu_peak"]
        if name == "unet":  # its convolutions' kernel scratch: the replica counts it from a measured profile
            continue
        for rewrite, figure in ((streams, cost["streams_bytes"]), (inline, cost["inline_bytes"])):
            ran = run_cli("run", rewrite, "--device", "cpu", "--inputs", SAMPLES / f"{name}.inputs.npz",
                          "--execution-order", "default", "--measure-memory", "--repeat", "1", "--json")  # fmt: skip
            assert ran.exit_code == 0, ran.stderr
            (measured,) = [m["peak_bytes"] for m in ran.json()["measured_memory"] if m["method"] == "allocator-stats"]
            assert abs(figure / measured - 1) <= 0.02, (rewrite.name, figure, measured)
    plan, out = tmp_path / "mlp.plan.json", tmp_path / "mlp.offload.onnx"
    made = run_cli("plan", SAMPLES / "mlp.onnx", "-o", plan, "--execution-order", "default", "--params",
                   "--select-distance", "10")  # fmt: skip
    assert made.exit_code in (0, 1), made.stderr
    applied = run_cli("apply", plan, "-o", out, "--copies", "streams")
    said = " ".join(applied.stderr.split()) + " ".join(applied.stdout.split())
    assert applied.exit_code == 0 and "copies written inline: no copy a gate holds" in said
    assert not out.with_name("mlp.offload.streams.json").exists()


def test_the_two_stream_replay_is_the_figure_simulate_reports(run_cli, tmp_path):
    """`offloadctl.simulation.ortstreams.cpu_peak_on_streams` over a streams rewrite and its partition is
    the figure `simulate` gives it, and the one-stream replay of the same file is another."""
    from offloadctl.analysis.graph import analyse
    from offloadctl.loading.model import load_model
    from offloadctl.rewriting.streams import checked_streams
    from offloadctl.simulation.ortcpu import cpu_peak, declared_shapes
    from offloadctl.simulation.ortstreams import cpu_peak_on_streams

    out = _default_streams_rewrite(run_cli, tmp_path, "unet")
    proto = onnx.load(str(out), load_external_data=False)
    _, streams = checked_streams(out, proto, "default")
    analysis = analyse(load_model(out), order="default")
    replayed = cpu_peak_on_streams(analysis, streams, shapes=declared_shapes(proto)).peak_bytes
    simulated = run_cli("simulate", out, "--execution-order", "default", "--json").json()["cpu_peak_bytes"]["after"]
    assert replayed == simulated != cpu_peak(analysis, shapes=declared_shapes(proto)).peak_bytes


def test_a_default_order_streams_rewrite_has_no_event_the_walk_reaches_last(run_cli, tmp_path):
    """Under DEFAULT a node nobody reads runs after the rest of the graph: a gate there holds nothing and
    a fence keeps its tensor on the device to the end of the run. Every event is read by a pin instead,
    and onnxruntime's own arena for the streams rewrite is no larger than for the same plan in line (it
    was 22% larger with the events as leaves)."""
    out = _default_streams_rewrite(run_cli, tmp_path, "transformer")
    model = onnx.load(str(out), load_external_data=False)
    read = {name for node in model.graph.node for name in node.input}
    events = [n for n in model.graph.node if n.name.startswith("offload/event/")]
    assert {n.name.split("/")[2] for n in events} == {"gate", "copied", "fence"}
    assert [n.name for n in events if n.output[0] not in read] == []
    inline = tmp_path / "inline.onnx"
    assert run_cli("apply", tmp_path / "default.plan.json", "-o", inline).exit_code == 0
    measured = {}
    for rewrite in (out, inline):
        ran = run_cli("run", rewrite, "--device", "cpu", "--inputs", SAMPLES / "transformer.inputs.npz",
                      "--execution-order", "default", "--measure-memory", "--repeat", "1", "--json",
                      "--compare-to", SAMPLES / "transformer.onnx")  # fmt: skip
        assert ran.exit_code == 0, ran.stderr
        doc = ran.json()
        assert doc["order"]["matches"] and all(c["identical"] for c in doc["comparison"].values())
        (measured[rewrite],) = [m["peak_bytes"] for m in doc["measured_memory"] if m["method"] == "allocator-stats"]
    assert measured[out] <= measured[inline], measured


def test_a_fence_in_a_file_out_of_order_is_held_without_a_cycle(run_cli, tmp_path):
    """The training sample's file is not in a topological order: the node after a fence in the file can
    lead to the fenced tensor. The fence's pin goes on a node the walk runs after it instead."""
    out = _default_streams_rewrite(run_cli, tmp_path, "training")
    model = onnx.load(str(out), load_external_data=False)
    read = {name for node in model.graph.node for name in node.input}
    fences = [n for n in model.graph.node if n.name.startswith("offload/event/fence/")]
    assert fences and all(f.output[0] in read for f in fences)


def test_simulate_counts_a_streams_rewrite_as_its_executor_runs_the_two_streams(run_cli, tmp_path):
    """The device figures of a streams rewrite follow the order onnxruntime's executor runs its streams in
    (the order `run` checks the profile against), an event's output is the tensor it reads (no buffer of
    its own), and plan, apply and simulate quote the same peak and time."""
    from offloadctl.analysis.graph import analyse
    from offloadctl.loading.model import load_model
    from offloadctl.rewriting.streams import checked_streams, stream_order
    from offloadctl.simulation.base import base_of
    from offloadctl.simulation.ortstreams import executor_analysis
    from offloadctl.simulation.program import program_for

    plan, out = tmp_path / "plan.json", tmp_path / "transformer.offload.onnx"
    made = run_cli("plan", SAMPLES / "transformer.onnx", "-o", plan, "--execution-order", "priority", "--params",
                   "--select-distance", "50", "--copies", "streams", "--json")  # fmt: skip
    assert made.exit_code == 0, made.stderr
    doc = made.json()
    assert doc["streams_declined"] is None and doc["slowdown"]["overlapped"] < doc["slowdown"]["serialized"]
    planned = doc["peak_bytes"]
    assert planned["run_by"] == "the two-stream executor"
    applied = run_cli("apply", plan, "-o", out, "--json")  # the plan's own mode: streams
    assert applied.exit_code == 0 and applied.json()["copy_mode"] == "streams"
    assert applied.json()["estimate"]["peak_bytes"]["run_by"] == "the two-stream executor"
    simulated = run_cli("simulate", out, "--json")
    assert simulated.exit_code == 0, simulated.stderr
    assert simulated.json()["peak_bytes"]["after"] == planned["after"]
    assert simulated.json()["slowdown"]["overlapped"] == pytest.approx(doc["slowdown"]["overlapped"], rel=0.01)
    analysis = analyse(load_model(out), order="priority")
    _, streams = checked_streams(out, analysis.loaded.proto, "priority")
    ran = executor_analysis(analysis, streams)
    assert ran.node_names == stream_order(analysis.loaded.proto, "priority")
    assert ran.node_names != analysis.node_names  # the copy stream runs ahead: not the one-stream walk
    _, program = program_for(ran, None, "the rewrite")
    events = {n.output[0] for n in ran.nodes if n.name.startswith("offload/event/")}
    assert events and not events & set(program.names)  # no event output is a tensor of its own
    assert base_of(ran).n == base_of(analysis).n


def test_apply_guards_what_onnxruntimes_multi_stream_planner_would_overwrite_and_says_so(run_cli, tmp_path):
    """The training step's Relus read pin views of tensors their copies still read: with two streams
    onnxruntime's planner would let them write in place (`offloadctl.rewriting.guards`). apply guards each,
    says how many, and the rewrite runs bit-identical in both orders (no warning about DEFAULT left)."""
    for order in ("priority", "default"):
        plan, out = tmp_path / f"{order}.plan.json", tmp_path / f"{order}.offload.onnx"
        made = run_cli("plan", SAMPLES / "training.onnx", "-o", plan, "--execution-order", order, "--params",
                       "--select-distance", "10", "--copies", "streams")  # fmt: skip
        assert made.exit_code in (0, 1), made.stderr
        applied = run_cli("apply", plan, "-o", out, "--copies", "streams", "--json")
        assert applied.exit_code == 0 and "DEFAULT order for some models" not in applied.stderr
        guards = applied.json()["guards"]
        assert guards and all(g.startswith("offload/event/guard/") for g in guards)
        shown = run_cli("apply", plan, "-o", tmp_path / f"{order}.again.onnx", "--copies", "streams")
        assert f"guarded {len(guards)} node(s) that onnxruntime's multi-stream planner" in " ".join(
            shown.stdout.split()
        )
        ran = run_cli("run", out, "--device", "cpu", "--execution-order", order, "--compare-to",
                      SAMPLES / "training.onnx", "--inputs", SAMPLES / "training.inputs.npz")  # fmt: skip
        assert ran.exit_code == 0 and "outputs bit-identical" in ran.stdout, ran.stderr


def test_a_float16_streams_rewrite_on_a_provider_without_float16_kernels_is_one_clear_error(run_cli, tmp_path):
    """The CPU provider has no float16 MatMul: onnxruntime casts around it with nodes of its own, which no
    partition file can list, and refuses the file. `run` says so and how to go on."""
    from models import to_fp16

    source = tmp_path / "mlp16.onnx"
    onnx.save(to_fp16(onnx.load(str(SAMPLES / "mlp.onnx"))), str(source))
    plan, out = tmp_path / "plan.json", tmp_path / "mlp16.offload.onnx"
    made = run_cli("plan", source, "-o", plan, "--params", "--select-distance", "2", "--prefetch-distance", "2")
    assert made.exit_code in (0, 1)  # (loads a gate holds: there is a partition file)
    assert run_cli("apply", plan, "-o", out, "--copies", "streams").exit_code == 0
    ran = run_cli("run", out, "--device", "cpu")
    message = " ".join(ran.stderr.split())
    assert ran.exit_code == 1 and "Traceback" not in ran.stderr
    assert "with its partition file: it inserted node 'InsertedPrecisionFreeCast_" in message
    assert "fix: apply the plan with --copies inline" in message


def test_the_gpu_streams_check_dry_runs_on_the_cpu(capsys):
    """bench/streams_check.py, the five setups and the race check a GPU run of bench/device_check.sh makes,
    runs here on the CPU provider at small sizes: every setup gives the resident model's outputs, the
    page-locked one hands its weights over, the race check counts its runs, and the fused graph and the
    in-place pattern, written on streams, pass `run --compare-to` in both orders."""
    import importlib.util

    path = Path(__file__).resolve().parent.parent / "bench" / "streams_check.py"
    spec = importlib.util.spec_from_file_location("streams_check", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--device", "cpu", "--small", "--repeat", "2", "--race-runs", "2"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if " wall " in line]
    assert [r.split(" wall ")[0].strip() for r in rows] == [
        "weights resident", "copies in line", "streams, pageable", "streams, page-locked", "streams, compute first",
    ]  # fmt: skip
    assert all(r.endswith("max diff 0") for r in rows), rows
    assert "handed to onnxruntime from page-locked memory" in out
    extras = [line for line in out.splitlines() if line.startswith(("fused graph (", "in-place pattern ("))]
    assert len(extras) == 4
    assert all(": PASSED | run " in line and "copies on their own stream" in line for line in extras), extras
    assert "race check: " in out and "of 2 runs wrong without the fences" in out


@pytest.mark.parametrize("device", [None, "cuda", "ascend"])
@pytest.mark.parametrize("order", ["priority", "default"])
def test_plan_apply_and_simulate_of_the_rewrite_quote_one_device_peak(run_cli, tmp_path, device, order):
    """For a plan made for copies on streams, on every device setting and in both orders, the peak and time
    plan and apply quote are those simulate gives of the rewrite apply writes by the plan (the device's
    placement recorded in it, the copy stream run as the executor runs it): on streams where the executor's
    run of them gains time, else in line (the plan says its events cost more than they hide)."""
    written = {}
    for name, distance in (("unet", "10"), ("transformer", "50")):
        plan, out = tmp_path / f"{name}.plan.json", tmp_path / f"{name}.offload.onnx"
        extra = ("--device", device) if device else ()
        made = run_cli("plan", SAMPLES / f"{name}.onnx", "-o", plan, "--params", "--select-distance", distance,
                       "--copies", "streams", "--execution-order", order, *extra, "--json")  # fmt: skip
        if made.exit_code != 0:  # a plan that raises the peak (written, refused): nothing to apply
            assert made.json()["passed"] is False
            continue
        doc = made.json()
        planned, slow = doc["peak_bytes"]["after"], doc["slowdown"]
        target = ("--target", "ascend") if device == "ascend" else ()
        applied = run_cli("apply", plan, "-o", out, *target, "--json")
        assert applied.exit_code == 0, applied.stderr
        written[name] = mode = applied.json()["copy_mode"]
        assert mode == doc["copy_mode"] == ("inline" if doc["streams_declined"] else "streams")
        assert mode == "inline" or slow["overlapped"] < slow["serialized"]
        assert applied.json()["estimate"]["peak_bytes"]["after"] == planned
        simulated = run_cli("simulate", out, "--json").json()
        assert abs(simulated["peak_bytes"]["after"] - planned) <= 0.02 * planned, (name, planned, simulated)
        if mode == "streams":  # (in line, a device rewrite's simulate also prices the copies onnxruntime inserts)
            assert simulated["slowdown"]["overlapped"] == pytest.approx(slow["overlapped"], rel=0.02), name
        assert simulated.get("device") == device
    if order == "priority" and device != "ascend":  # the transformer's weight loads hide behind its compute
        assert written["transformer"] == "streams"


def test_a_streams_plan_whose_events_cost_more_than_they_hide_is_written_in_line(run_cli, tmp_path):
    """A streams rewrite never holds less than the same plan in line: where, as the executor runs its two
    streams, it gains no time either (the mlp's weights, read right after they load, hide nothing), the
    request is planned in line, plan says so and apply writes the copies in line; asked for streams, apply
    writes them so and says why it would not."""
    plan = tmp_path / "plan.json"
    made = run_cli("plan", SAMPLES / "mlp.onnx", "-o", plan, "--params", "--select-distance", "2",
                   "--prefetch-distance", "2", "--copies", "streams", "--json")  # fmt: skip
    declined = made.json()["streams_declined"]
    assert made.exit_code == 0 and declined["streams"] >= declined["inline"] == made.json()["slowdown"]["serialized"]
    assert made.json()["copy_mode"] == "inline"
    assert "their events cost more than the overlap hides, so the copies are planned in line" in " ".join(
        made.stderr.split()
    )
    events = read_plan(plan)["summary"]["events"]
    assert events["copies"] == "inline" and events["streams_declined"] == declined
    applied = run_cli("apply", plan, "-o", tmp_path / "a.onnx", "--json")
    assert applied.exit_code == 0 and applied.json()["copy_mode"] == "inline"
    assert not (tmp_path / "a.streams.json").exists()
    asked = run_cli("apply", plan, "-o", tmp_path / "b.onnx", "--copies", "streams", "--json")
    assert asked.exit_code == 0 and asked.json()["copy_mode"] == "streams"
    assert "written on streams as asked" in " ".join(asked.stderr.split())
