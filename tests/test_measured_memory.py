"""Memory figures against onnxruntime's own: its allocator statistics (C API), its arena limit, its
profiled DEFAULT order, on the samples (original and rewritten), a generated model and real models
that ship inside the onnx wheel."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest

from offloadctl.analysis.graph import analyse
from offloadctl.core.errors import OffloadError
from offloadctl.loading.model import load_model
from offloadctl.planning.make import scheduled_plan
from offloadctl.planning.request import PlanRequest
from offloadctl.rewriting.preview import cpu_figures, rewritten_analysis
from offloadctl.rewriting.rewrite import apply_plan
from offloadctl.running import allocator
from offloadctl.running.allocator import SessionSpec, measure_by_limit, measure_by_stats, node_scratch
from offloadctl.running.checks import order_from_profile
from offloadctl.running.inputs import generate_inputs, input_specs
from offloadctl.simulation.arena import Arena, ArenaConfig
from offloadctl.simulation.ortcpu import cpu_peak, declared_shapes
from offloadctl.simulation.timing import scratched_by_name

from conftest import SAMPLE_NAMES, SAMPLES

ort = pytest.importorskip("onnxruntime")

WHEEL_DATA = Path(onnx.__file__).parent / "backend" / "test" / "data"
#: Real architectures the onnx wheel ships (their weights are made at run time by ConstantOfShape).
LIGHT = sorted((WHEEL_DATA / "light").glob("light_*.onnx"))
#: Models the onnx wheel ships as converted from PyTorch modules.
CONVERTED = [
    WHEEL_DATA / "pytorch-converted" / name / "model.onnx"
    for name in ("test_PixelShuffle", "test_Softmin", "test_Linear_no_bias")
]
WHEEL_MODELS = [p for p in LIGHT + CONVERTED if p.exists()]
DISABLE = {"session.disable_prepacking": "1"}  # what offloadctl run --opt-level disable sets


def _feeds(path: Path) -> dict[str, np.ndarray]:
    npz = path.with_name(path.stem + ".inputs.npz")
    if npz.exists():
        return dict(np.load(npz))
    feeds, _ = generate_inputs(input_specs(onnx.load(str(path), load_external_data=False)), seed=0)
    return feeds


def _simulated(path: Path, feeds: dict[str, np.ndarray], order: str, config: ArenaConfig | None = None):
    """The CPU figure of ``path`` on ``feeds``, the kernel scratch counted from onnxruntime's node
    statistics (what a measured profile records)."""
    analysis = analyse(load_model(path, input_shapes={k: list(v.shape) for k, v in feeds.items()}), order=order)
    analysis = scratched_by_name(analysis, node_scratch(path, feeds, ort=ort, order=order))
    shapes = declared_shapes(onnx.load(str(path), load_external_data=False))
    return cpu_peak(analysis, shapes=shapes, config=config)


def _measured(path: Path, feeds: dict[str, np.ndarray]):
    (figure,) = measure_by_stats(SessionSpec(str(path), "cpu", config_entries=DISABLE), feeds, ort=ort)
    return figure


# ------------------------------------------------------------------------------------------ the arena


def test_arena_rounds_and_hands_out_whole_chunks():
    arena = Arena()
    a = arena.alloc(100)
    assert a.size == 256 and arena.in_use == 256
    arena.free(a)
    big = arena.alloc(600 << 10)  # the 1 MiB first region, not split: it is less than twice the request
    assert big.size == 1 << 20 and arena.in_use == 1 << 20
    arena.free(big)
    small = arena.alloc(100 << 10)  # a 1 MiB free chunk is split for a tenth of it
    assert small.size == 100 << 10
    assert arena.alloc(0) is None


def test_arena_coalesces_and_grows_by_doubling():
    arena = Arena()
    a, b = arena.alloc(256 << 10), arena.alloc(256 << 10)
    arena.free(a)
    arena.free(b)
    whole = arena.alloc(512 << 10)  # the two freed neighbours serve it together
    assert whole.addr == a.addr and arena.extensions == 1
    arena.alloc(4 << 20)  # beyond the region: the next one is a power of two large enough
    assert arena.extensions == 2 and arena.region_bytes == (1 << 20) + (4 << 20)
    arena.reserve(10)
    assert arena.in_use == (512 << 10) + (4 << 20) + 10


def test_arena_same_as_requested_takes_only_what_is_asked():
    arena = Arena(ArenaConfig(extend_strategy="kSameAsRequested"))
    arena.alloc(1000)
    assert arena.region_bytes == 1024 and arena.in_use == 1024


# ------------------------------------------------------------------------------------------ orders


@pytest.mark.parametrize("path", [SAMPLES / f"{n}.onnx" for n in SAMPLE_NAMES] + LIGHT, ids=lambda p: p.stem)
def test_default_order_is_the_one_onnxruntime_runs(path, tmp_path):
    feeds = _feeds(path)
    analysis = analyse(load_model(path, normalize=False), order="default")
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.execution_order = ort.ExecutionOrder.DEFAULT
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "p")
    session = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    session.run(None, feeds)
    ran = order_from_profile(session.end_profiling())
    # onnxruntime names a node without a name OpType_INDEX
    expected = [n.name or f"{n.op_type}_{i}" for n, i in zip(analysis.nodes, analysis.file_index)]
    assert len(ran) == len(expected) > 0
    assert ran == expected


# ------------------------------------------------------------------------------------------ the CPU figure


def _rewrites(name: str, tmp_path: Path) -> list[Path]:
    """The sample rewritten by a distance plan (weights too) and by a budget plan."""
    path = SAMPLES / f"{name}.onnx"
    analysis = analyse(load_model(path))
    written = []
    peak = cpu_figures(analysis, None, rewritten=False, profile=None).after.peak_bytes
    for label, plan in (
        ("distance", scheduled_plan(analysis, PlanRequest.of_options(select_distance=2, params=True))),
        ("budget", scheduled_plan(analysis, PlanRequest.of_options(budget=int(peak * 0.6), params=True))),
    ):
        out = tmp_path / f"{name}.{label}.onnx"
        onnx.save(apply_plan(plan, analysis), str(out))
        shutil.copy(SAMPLES / f"{name}.inputs.npz", tmp_path / f"{name}.{label}.inputs.npz")
        written.append(out)
    return written


@pytest.mark.parametrize("name", SAMPLE_NAMES)
def test_cpu_peak_is_the_arena_peak_for_samples_and_their_rewrites(name, tmp_path):
    """Within 2% of onnxruntime's MaxInUse (DEFAULT order, one run of a fresh session): the samples,
    original and rewritten, are exact to the byte (unet's Conv scratch counted)."""
    for path in [SAMPLES / f"{name}.onnx", *_rewrites(name, tmp_path)]:
        feeds = _feeds(path)
        measured = _measured(path, feeds)
        simulated = _simulated(path, feeds, "default")
        assert simulated.weight_bytes == measured.in_use_after_creation, path.name
        assert simulated.peak_bytes == measured.peak_bytes, path.name


@pytest.mark.parametrize("path", WHEEL_MODELS, ids=lambda p: p.parent.name if p.name == "model.onnx" else p.stem)
def test_cpu_peak_is_the_arena_peak_for_models_in_the_onnx_wheel(path, tmp_path):
    feeds = _feeds(path)
    measured = _measured(path, feeds)
    simulated = _simulated(path, feeds, "default")
    assert simulated.weight_bytes == measured.in_use_after_creation
    assert abs(simulated.peak_bytes - measured.peak_bytes) <= 0.02 * measured.peak_bytes


def test_at_least_ten_wheel_models_are_checked():
    assert len(WHEEL_MODELS) >= 10


@pytest.mark.parametrize("name", ["mlp", "transformer", "seed"])
def test_priority_order_figure_is_the_smallest_arena_that_runs(name, tmp_path):
    """At PRIORITY_BASED the C API cannot be used: the figure is the smallest arena limit (Python,
    kSameAsRequested) the run fits in, which the simulator's region total predicts."""
    path = SAMPLES / f"{name}.onnx"
    feeds = _feeds(path)
    measured = measure_by_limit(SessionSpec(str(path), "cpu", config_entries=DISABLE), feeds, ort=ort)
    simulated = _simulated(path, feeds, "priority", ArenaConfig(extend_strategy="kSameAsRequested"))
    assert measured.method == "arena-limit" and measured.execution_order == "priority"
    assert abs(simulated.arena_bytes - measured.peak_bytes) <= 0.02 * measured.peak_bytes


def test_simulate_after_is_the_rewritten_file_measured(tmp_path):
    """The "after" figure is the rewritten model's, as apply writes it (no kernel scratch in this sample)."""
    analysis = analyse(load_model(SAMPLES / "transformer.onnx"), order="default")
    plan = scheduled_plan(analysis, PlanRequest.of_options(select_distance=2, params=True))
    rewritten = rewritten_analysis(plan, analysis)
    copies = [n for n in rewritten.nodes if n.op_type in ("MemcpyToHost", "MemcpyFromHost")]
    assert len(copies) == sum(1 + len(o["reload_groups"]) for o in plan["offloads"] if o["kind"] == "activation") + sum(
        len(o["reload_groups"]) for o in plan["offloads"] if o["kind"] == "parameter"
    )
    figures = cpu_figures(analysis, plan, rewritten=False, profile=None)
    out = tmp_path / "rewritten.onnx"
    onnx.save(apply_plan(plan, analysis), str(out))
    feeds = _feeds(SAMPLES / "transformer.onnx")
    assert figures.after.peak_bytes == _measured(out, feeds).peak_bytes
    assert (
        figures.before is not None
        and figures.before.peak_bytes == _measured(SAMPLES / "transformer.onnx", feeds).peak_bytes
    )


# ------------------------------------------------------------------------------------------ commands


def test_run_measure_memory_json(run_cli):
    model = str(SAMPLES / "unet.onnx")
    inputs = str(SAMPLES / "unet.inputs.npz")
    doc = run_cli(
        "run",
        model,
        "--device",
        "cpu",
        "--inputs",
        inputs,
        "--repeat",
        "1",
        "--measure-memory",
        "--execution-order",
        "default",
        "--json",
    ).json()
    (entry,) = doc["measured_memory"]
    assert entry["allocator"] == "Cpu" and entry["device"] == "cpu" and entry["method"] == "allocator-stats"
    assert entry["peak_bytes"] == 786_640 and entry["in_use_after_creation"] == 491_728
    assert doc["execution_order"] == "default" and doc["session"]["execution_order"] == "DEFAULT"
    assert doc["order"]["matches"]
    doc = run_cli("run", model, "--device", "cpu", "--inputs", inputs, "--repeat", "1", "--json").json()
    assert doc["measured_memory"] is None
    shown = run_cli("run", model, "--device", "cpu", "--inputs", inputs, "--repeat", "1", "--measure-memory")
    assert "device and host are one memory" in " ".join(shown.stdout.split())  # which figure is the device's


def test_simulate_reports_the_cpu_figure(run_cli, tmp_path):
    model = str(SAMPLES / "transformer.onnx")
    doc = run_cli("simulate", model, "--execution-order", "default", "--json").json()
    assert doc["execution_order"] == "default"
    assert doc["cpu_peak_bytes"] == {"before": 1_135_404, "after": 1_135_404}
    assert doc["cpu_memory"]["after"]["weight_bytes"] == 807_724
    plan = tmp_path / "plan.json"
    run_cli("plan", model, "--select-distance", "2", "--execution-order", "default", "-o", str(plan))
    assert json.loads(plan.read_text())["model"]["execution_order"] == "default"
    doc = run_cli("simulate", model, "--plan", str(plan), "--json").json()
    assert doc["execution_order"] == "default"
    assert doc["cpu_peak_bytes"]["after"] > doc["cpu_peak_bytes"]["before"]
    bad = run_cli("simulate", model, "--plan", str(plan), "--execution-order", "priority")
    assert bad.exit_code == 1
    assert "counts positions in the default execution order" in bad.stderr


def test_old_onnxruntime_is_one_clear_error(monkeypatch, run_cli):
    monkeypatch.setattr(ort, "__version__", "1.22.1")
    result = run_cli(
        "run",
        str(SAMPLES / "seed.onnx"),
        "--device",
        "cpu",
        "--repeat",
        "1",
        "--measure-memory",
        "--execution-order",
        "default",
    )
    assert result.exit_code == 1
    assert "has no allocator statistics (AllocatorGetStats came in 1.23)" in result.stderr
    assert "Traceback" not in result.stderr


def test_missing_library_is_one_clear_error(monkeypatch, tmp_path):
    fake = tmp_path / "onnxruntime" / "__init__.py"
    fake.parent.mkdir()
    fake.write_text("")

    class Fake:
        __version__ = ort.__version__
        __file__ = str(fake)

    with pytest.raises(OffloadError, match="C library is not in"):
        allocator.capi_library(Fake)


def test_allocator_without_statistics_is_one_clear_error(monkeypatch):
    monkeypatch.setattr(allocator._StatsSession, "stats", lambda self, alloc: {})
    with pytest.raises(OffloadError, match="reports no statistics"):
        measure_by_stats(SessionSpec(str(SAMPLES / "seed.onnx"), "cpu"), _feeds(SAMPLES / "seed.onnx"), ort=ort)


def test_a_model_that_fails_is_reported_not_bisected():
    feeds = {"x": np.zeros((3, 3), np.float32)}  # the seed takes [4, 8]
    with pytest.raises(OffloadError, match="onnxruntime failed"):
        measure_by_limit(SessionSpec(str(SAMPLES / "seed.onnx"), "cpu"), feeds, ort=ort)
    with pytest.raises(OffloadError, match="onnxruntime failed in Run"):
        measure_by_stats(SessionSpec(str(SAMPLES / "seed.onnx"), "cpu"), feeds, ort=ort)


def test_load_config_from_model_is_reported(monkeypatch, run_cli):
    monkeypatch.setenv("ORT_LOAD_CONFIG_FROM_MODEL", "1")
    doc = run_cli("run", str(SAMPLES / "seed.onnx"), "--device", "cpu", "--repeat", "1", "--json").json()
    assert any("ORT_LOAD_CONFIG_FROM_MODEL=1 is set" in w for w in doc["warnings"])


def test_dimensions_onnx_invents_never_match(write_model):
    """onnx names a dimension it cannot relate ``unk__N``; onnxruntime leaves it unnamed and the
    planner never takes two such tensors for the same size. Named dimensions do match."""
    path = write_model(
        """<ir_version: 10, opset_import: ["" : 17]>
        g (float[N, 8] x) => (int64[2, M] y) {
            a = Relu(x)
            b = NonZero(a)
            c = NonZero(x)
            y = Add(b, c)
        }"""
    )
    shapes = declared_shapes(onnx.load(str(path)))
    assert shapes["a"] == (onnx.TensorProto.FLOAT, ("N", 8))
    assert shapes["b"][1][0] == 2 and shapes["b"][1][1] is None and shapes["c"][1][1] is None


def test_a_plans_cpu_figure_is_its_rewrite_as_written_with_symbolic_dimensions(tmp_path):
    """A model whose input dimensions are symbolic, planned at pinned shapes: the allocation planner
    of a session compares the shapes the rewrite declares as written (symbolic), so the replica of the
    plan's rewrite is that of the written file, not of the rewrite at its pinned shapes (which shares
    more buffers: PP-OCRv4 det's DEFAULT rewrite read 57.77 MB there, 61.03 MB measured)."""
    from offloadctl.rewriting.writing import write_model

    model = onnx.load(str(SAMPLES / "unet.onnx"))
    del model.graph.value_info[:]
    for value in [*model.graph.input, *model.graph.output]:
        for k, dim in enumerate(value.type.tensor_type.shape.dim):
            if k != 1:
                dim.dim_param = f"d{k}"
    source = tmp_path / "unet.onnx"
    onnx.save(model, str(source))
    pins = {"image": [1, 3, 32, 32]}
    analysis = analyse(load_model(source, input_shapes=pins), order="default")
    plan = scheduled_plan(analysis, PlanRequest.of_options(select_distance=2, params=True))
    figures = cpu_figures(analysis, plan, rewritten=False, profile=None)
    out = tmp_path / "unet.offload.onnx"
    write_model(apply_plan(plan, analysis), out, source_dir=tmp_path)
    written = analyse(load_model(out, input_shapes=pins), order="default")
    assert figures.after.peak_bytes == cpu_figures(written, None, rewritten=True, profile=None).after.peak_bytes
    assert figures.after.peak_bytes != cpu_peak(rewritten_analysis(plan, analysis)).peak_bytes


def test_under_priority_simulate_quotes_the_arena_limit_run_measures_there(run_cli):
    """At PRIORITY_BASED `run --measure-memory` finds the smallest arena limit a run fits in (regions of the
    requested size), not MaxInUse: simulate gives that figure beside the peak in use, and it is within 2%."""
    for name in ("unet", "transformer"):
        model = SAMPLES / f"{name}.onnx"
        simulated = run_cli("simulate", model, "--json").json()["cpu_memory"]
        limit = simulated["after_limit_bytes"]
        assert limit is not None and limit >= simulated["after"]["peak_bytes"]
        ran = run_cli("run", model, "--device", "cpu", "--measure-memory", "--repeat", "1",
                      "--inputs", SAMPLES / f"{name}.inputs.npz", "--json")  # fmt: skip
        assert ran.exit_code == 0, ran.stderr
        [measured] = [m for m in ran.json()["measured_memory"] if m["device"] == "cpu"]
        assert measured["method"] != "allocator-stats" and abs(limit / measured["peak_bytes"] - 1) <= 0.02, name
        assert (
            run_cli("simulate", model, "--execution-order", "default", "--json").json()["cpu_memory"][
                "after_limit_bytes"
            ]
            is None
        )  # DEFAULT: MaxInUse, which the peak is
