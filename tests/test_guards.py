"""onnxruntime's multi-stream in-place defect (`offloadctl.rewriting.guards`): with two logic streams on one
device its planner lets a node overwrite, in place, an alias of a buffer other nodes still read. Each case
runs on the CPU provider, which plans memory for two streams as a GPU does: without the guards the outputs
(or the caller's input, or the next run) are wrong, with them they are bit-identical to the original's,
on negative inputs (a Relu in place changes only those) and on a second run."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from offloadctl.rewriting.guards import GUARD_PREFIX, guard_in_place, in_place_hazards
from offloadctl.rewriting.streams import EVENT_OPTIMIZERS, PARTITION_KEY

from conftest import IR_VERSION, ROOT

ORDERS = {"priority": "PRIORITY_BASED", "default": "DEFAULT"}

# the smallest case: Relu writes into t through its alias a, and Sub reads t after it
FIVE_NODES = {
    "neg1": "t = Neg(x)",
    "id": "a = Identity(t)",
    "relu": "r = Relu(a)",
    "neg2": "y1 = Neg(r)",
    "sub": "y2 = Sub(t, x)",
}


def _five_nodes(order: list[str]) -> onnx.ModelProto:
    body = "\n".join(f"{FIVE_NODES[name]}" for name in order)
    model = onnx.parser.parse_model(
        f"""<ir_version: {IR_VERSION}, opset_import: ["" : 17]>
        g (float[4] x) => (float[4] y1, float[4] y2) {{ {body} }}"""
    )
    for node, name in zip(model.graph.node, order):
        node.name = name
    return model


def _session(path: Path, order: str, partition: Path | None = None) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.execution_order = getattr(ort.ExecutionOrder, ORDERS[order])
    so.log_severity_level = 3
    if partition is not None:
        so.add_session_config_entry(PARTITION_KEY, str(partition))
        so.add_session_config_entry("optimization.disable_specified_optimizers", ";".join(EVENT_OPTIMIZERS))
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def _right(session: ort.InferenceSession, want: list[np.ndarray], feeds: dict[str, np.ndarray]) -> bool:
    """Two runs, each on its own copy of ``feeds``: both give ``want`` and leave the copy as it was."""
    for _ in range(2):
        given = {k: v.copy() for k, v in feeds.items()}
        got = session.run(None, given)
        if not all(np.array_equal(a, b) for a, b in zip(got, want)):
            return False
        if not all(np.array_equal(given[k], feeds[k]) for k in feeds):
            return False
    return True


def _two_streams(model: onnx.ModelProto, first: str, path: Path) -> Path:
    """A partition file with node ``first`` alone on the first stream and the rest on the second (Constant
    nodes become weights when the model loads: not nodes to list)."""
    names = [n.name for n in model.graph.node if n.op_type != "Constant"]
    partition = path.with_suffix(".streams.json")
    streams = [[first], [n for n in names if n != first]]
    partition.write_text(json.dumps({"type": "DeviceBasedPartitioner", "streams": streams, "devices": ["0", "0"]}))
    return partition


@pytest.mark.parametrize("file_order", [["neg1", "id", "relu", "neg2", "sub"], ["neg1", "sub", "id", "relu", "neg2"]])
def test_the_five_node_graph_is_wrong_on_two_streams_and_right_with_its_guard(tmp_path, file_order):
    model = _five_nodes(file_order)
    [hazard] = in_place_hazards(list(model.graph.node), model.graph)
    assert (hazard.node, hazard.value, hazard.root) == ("relu", "a", "t") and "sub reads it too" in hazard.because
    feeds = {"x": np.array([-1.5, 2.0, -3.0, 0.25], np.float32)}
    path = tmp_path / "five.onnx"
    onnx.save(model, str(path))
    want = _session(path, "priority").run(None, {"x": feeds["x"].copy()})
    partition = _two_streams(model, "neg1", path)
    unguarded = {order: _right(_session(path, order, partition), want, feeds) for order in ORDERS}
    assert not all(unguarded.values())  # onnxruntime's defect: one order or the other is wrong, by file order
    assert guard_in_place(model) and not in_place_hazards(list(model.graph.node), model.graph)
    guard = next(n for n in model.graph.node if n.name.startswith(GUARD_PREFIX))
    assert guard.op_type == "Identity" and list(guard.input) == ["a"] and guard.name == f"{GUARD_PREFIX}relu"
    onnx.save(model, str(path))
    partition = _two_streams(model, "neg1", path)
    for order in ORDERS:
        assert _right(_session(path, order, partition), want, feeds), order


def test_a_second_reader_or_a_shape_reader_is_no_hazard():
    """A second data reader of the alias makes the planner leave it alone; a reader of the root's shape
    alone (Shape, Size) needs nothing of its data; a root nobody else reads is the node's to overwrite."""
    model = _five_nodes(["neg1", "id", "relu", "neg2", "sub"])
    model.graph.node.append(onnx.helper.make_node("Neg", ["a"], ["a2"], name="second"))
    assert not in_place_hazards(list(model.graph.node), model.graph)
    alone = onnx.parser.parse_model(
        f"""<ir_version: {IR_VERSION}, opset_import: ["" : 17]>
        g (float[4] x) => (float[4] y, int64[1] s) {{ t = Neg(x) a = Identity(t) y = Relu(a) s = Shape(t) }}"""
    )
    assert not in_place_hazards(list(alone.graph.node), alone.graph)


# --------------------------------------------------------------------------------------------------
# The pattern in models offloadctl plans and applies with --copies streams

ALIASES = {
    "Identity": ("a = Identity({src})", "[1,4,4]"),
    "Reshape": ("a = Reshape({src}, shp)", "[1,4,4]"),
    "Squeeze": ("a = Squeeze({src}, ax)", "[1,4,4]"),
    "Unsqueeze": ("a = Unsqueeze({src}, ax)", "[1,1,4,4]"),
}
CONSUMERS = {
    "Relu": "r0 = Relu(a)",
    "Cast": "r0i = Cast<to=6>(a)\n r0 = Cast<to=1>(r0i)",  # float -> int32: the same size, so in place
    "Add": "r0 = Add(a, one)",
}
ROOTS = {"input": "x", "computed": "t", "weight": "w"}
PATTERNS = [("Reshape", "Add"), ("Squeeze", "Cast"), ("Unsqueeze", "Relu"), ("Identity", "Relu")]


def _pattern(alias: str, consumer: str, root: str) -> str:
    """``alias`` of the root buffer read only by ``consumer``; the root read again after it. ``e`` idles
    across the chain in both orders, so a plan copies it, and the model has copies on streams."""
    src = ROOTS[root]
    line, out = ALIASES[alias]
    chain = " ".join(f"r{i + 1} = Sin({'n' if i == 0 else f'r{i}'})" for i in range(8))
    w = ",".join(f"{v:.3f}" for v in np.linspace(-2, 2, 16))
    return f"""<ir_version: {IR_VERSION}, opset_import: ["" : 17]>
    g (float[1,4,4] x) => (float{out} y)
    <float[1,4,4] w = {{{w}}}, int64[2] shp = {{4,4}}, int64[1] ax = {{0}}, float one = {{1.0}}> {{
        t = Neg(x)
        e = Cos(x)
        {line.format(src=src)}
        {CONSUMERS[consumer]}
        m = Add(r0, {src})
        n = Mul(m, e)
        {chain}
        y = Add(r8, e)
    }}"""


def _negative_inputs() -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(7).uniform(-2.0, 0.5, (1, 4, 4)).astype(np.float32)}


def _plan_and_apply(run_cli, source: Path, order: str, out: Path) -> dict:
    plan = out.with_suffix(".plan.json")
    made = run_cli("plan", source, "-o", plan, "--select-distance", "1", "--prefetch-distance", "0",
                   "--copies", "streams", "--execution-order", order, "--profile", "cpu")  # fmt: skip
    # (the cpu profile's copies need no lead: each load stays at its use, where the pattern needs it)
    assert made.exit_code in (0, 1), made.stderr
    applied = run_cli("apply", plan, "-o", out, "--copies", "streams", "--json")  # (however little they gain here)
    assert applied.exit_code == 0, applied.stderr
    doc = applied.json()
    assert doc["copy_mode"] == "streams", doc  # copies to put on a stream
    return doc


@pytest.mark.parametrize("root", list(ROOTS))
@pytest.mark.parametrize("alias,consumer", PATTERNS)
def test_streams_rewrites_of_the_pattern_are_bit_identical_in_both_orders(
    run_cli, write_model, tmp_path, alias, consumer, root
):
    source = write_model(_pattern(alias, consumer, root))
    feeds = _negative_inputs()
    for order in ORDERS:
        out = tmp_path / f"{order}.offload.onnx"
        doc = _plan_and_apply(run_cli, source, order, out)
        want = _session(source, order).run(None, {"x": feeds["x"].copy()})
        assert _right(_session(out, order, Path(doc["partition_file"])), want, feeds), order
        written = onnx.load(str(out))
        assert not in_place_hazards(list(written.graph.node), written.graph)
        guards = [n for n in written.graph.node if n.name.startswith(GUARD_PREFIX)]
        meta = json.loads({p.key: p.value for p in written.metadata_props}["offloadctl.streams"])
        assert meta["guards"] == len(guards)
        if root != "computed" and consumer != "Add":  # Add overwrites nothing on the CPU; a computed root
            assert guards  # here has a D2H whose fence comes before the consumer in both orders


@pytest.mark.parametrize("root", ["input", "weight"])
def test_without_the_guards_the_same_rewrites_are_wrong(run_cli, write_model, tmp_path, monkeypatch, root):
    """The check above can fail: with the guard left out, onnxruntime overwrites the caller's input (a graph
    input) or the weight (the second run), in both orders; `run` names the input, or the defect."""
    monkeypatch.setattr("offloadctl.rewriting.streams.in_place_hazards", lambda nodes, graph: [])
    source = write_model(_pattern("Unsqueeze", "Relu", root))
    feeds = _negative_inputs()
    np.savez(tmp_path / "inputs.npz", **feeds)
    for order in ORDERS:
        out = tmp_path / f"{order}.offload.onnx"
        doc = _plan_and_apply(run_cli, source, order, out)
        want = _session(source, order).run(None, {"x": feeds["x"].copy()})
        assert not _right(_session(out, order, Path(doc["partition_file"])), want, feeds), order
        ran = run_cli("run", out, "--device", "cpu", "--execution-order", order, "--inputs", tmp_path / "inputs.npz",
                      "--compare-to", source)  # fmt: skip
        said = " ".join(ran.stderr.split())
        assert ran.exit_code == 1 and "Traceback" not in ran.stderr
        if root == "input":
            assert f"running {out} changed its input 'x'" in said
        else:
            assert "differ from" in said
        assert "multi-stream planner can let a node overwrite a buffer other nodes still read" in said


# --------------------------------------------------------------------------------------------------
# A real model: silero-vad's openvino export, whose stateN the defect gets wrong

SILERO = ("silero-vad==6.2.3", "silero_vad/data/silero_vad_openvino_16k.onnx")


def _silero(cache: Path) -> Path:
    """silero-vad's openvino export, from its wheel (downloaded once into bench/.cache)."""
    path = cache / Path(SILERO[1]).name
    if not path.exists():
        cache.mkdir(parents=True, exist_ok=True)
        wheel = next(cache.glob("silero_vad-6.2.3-*.whl"), None)
        if wheel is None:
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(cache), SILERO[0]],
                           check=True, capture_output=True)  # fmt: skip
            wheel = next(cache.glob("silero_vad-6.2.3-*.whl"))
        with zipfile.ZipFile(wheel) as archive:
            path.write_bytes(archive.read(SILERO[1]))
    return path


def test_silero_vads_state_is_wrong_on_two_streams_and_right_with_its_guard(tmp_path):
    source = _silero(ROOT / "bench" / ".cache")
    model = onnx.load(str(source))
    [hazard] = in_place_hazards(list(model.graph.node), model.graph)
    assert hazard.node.endswith("/decoder/Cast_1") and hazard.root.endswith("/decoder/rnn/LSTM_output_1")
    rng = np.random.default_rng(0)
    feeds = {"input": rng.standard_normal((1, 576)).astype(np.float32),
             "state": rng.standard_normal((2, 1, 128)).astype(np.float32)}  # fmt: skip
    want = _session(source, "priority").run(None, {k: v.copy() for k, v in feeds.items()})
    path = tmp_path / "silero.onnx"
    onnx.save(model, str(path))
    first = next(n.name for n in model.graph.node if n.op_type != "Constant")
    assert not _right(_session(path, "default", _two_streams(model, first, path)), want, feeds)
    guard_in_place(model)
    onnx.save(model, str(path))
    for order in ORDERS:
        assert _right(_session(path, order, _two_streams(model, first, path)), want, feeds), order


def test_silero_vads_streams_rewrite_is_bit_identical_in_both_orders(run_cli, tmp_path):
    source = _silero(ROOT / "bench" / ".cache")
    rng = np.random.default_rng(1)
    feeds = {"input": -np.abs(rng.standard_normal((1, 576))).astype(np.float32),
             "state": rng.standard_normal((2, 1, 128)).astype(np.float32)}  # fmt: skip
    np.savez(tmp_path / "inputs.npz", **feeds)
    for order in ORDERS:
        plan, out = tmp_path / f"{order}.plan.json", tmp_path / f"{order}.offload.onnx"
        made = run_cli("plan", source, "-o", plan, "--params", "--select-distance", "10", "--copies", "streams",
                       "--execution-order", order)  # fmt: skip
        assert made.exit_code in (0, 1), made.stderr
        assert run_cli("apply", plan, "-o", out, "--copies", "streams").exit_code == 0
        ran = run_cli("run", out, "--device", "cpu", "--execution-order", order, "--inputs", tmp_path / "inputs.npz",
                      "--compare-to", source, "--json")  # fmt: skip
        assert ran.exit_code == 0, ran.stderr
        assert ran.json()["copy_streams"] is not None


def test_the_reproducer_in_the_docs_prints_what_the_docs_say(tmp_path, monkeypatch, capfd):
    """docs/streams.md's reproducer, ready for an upstream report, run as a reader copies it: it prints the
    wrong answers the page shows, on the onnxruntime installed here."""
    import re

    page = (ROOT / "docs" / "streams.md").read_text()
    part = page[page.index("**A reproducer for an upstream report.**") :]
    code = re.search(r"```python\n(.*?)```", part, flags=re.S)[1]
    shown = re.search(r"```text\n(.*?)```", part, flags=re.S)[1]
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "docs/streams.md", "exec"), {})  # noqa: S102 - the page's own example
    printed = [line for line in capfd.readouterr().out.splitlines() if "reused by" not in line]
    assert printed[0].startswith(f"onnxruntime {ort.__version__} | ")
    assert [printed[0].split(" | ", 1)[1], *printed[1:]] == shown.strip().splitlines()


def test_a_streams_plan_whose_rewrite_would_peak_above_in_line_is_written_in_line_unless_asked(run_cli, tmp_path):
    """Never worse than in line: silero-vad's DEFAULT plan on streams peaks 256.50 KiB above the same plan in line
    (its events move the walk); the plan says so and is planned in line, apply writes it so, and --copies streams
    writes it on streams, with the warning."""
    source = _silero(ROOT / "bench" / ".cache")
    plan = tmp_path / "plan.json"
    made = run_cli("plan", source, "-o", plan, "--params", "--select-distance", "10", "--copies", "streams",
                   "--execution-order", "default", "--profile", "cpu", "--json")  # fmt: skip
    assert made.exit_code == 0, made.stderr
    peaks = made.json()["streams_declined"]["peaks"]
    assert peaks["streams"] - peaks["inline"] == 256.5 * 1024 and made.json()["copy_mode"] == "inline"
    assert "so the copies are planned in line" in " ".join(made.stderr.split())
    done = run_cli("apply", plan, "-o", tmp_path / "plan.offload.onnx", "--json")
    assert done.exit_code == 0, done.stderr
    doc = done.json()
    assert doc["planned_copy_mode"] == doc["copy_mode"] == "inline" and doc["partition_file"] is None
    assert doc["estimate"]["peak_bytes"]["after"] == peaks["inline"]
    asked = run_cli("apply", plan, "-o", tmp_path / "asked.offload.onnx", "--copies", "streams", "--json")
    assert asked.exit_code == 0 and asked.json()["copy_mode"] == "streams" and asked.json()["written_in_line"] is None
    assert "apply with --copies inline to keep the lower peak" in asked.stderr
    inline = run_cli("simulate", tmp_path / "plan.offload.onnx", "--json").json()["peak_bytes"]["after"]
    streams = run_cli("simulate", tmp_path / "asked.offload.onnx", "--json").json()["peak_bytes"]["after"]
    assert streams - inline == 256.5 * 1024
