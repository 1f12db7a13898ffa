"""Selection, filter and prefetch rules (docs/plan-file.md, "How a plan is made"), and the plan contract."""

from __future__ import annotations

import json
import operator
from pathlib import Path

import pytest

from offloadctl.analysis.graph import analyse
from offloadctl.contract.document import read_plan, validate_plan
from offloadctl.core.errors import OffloadError
from offloadctl.loading.model import load_model
from offloadctl.loading.placed import HostPlacement
from offloadctl.planning.filter import filter_plan
from offloadctl.planning.make import scheduled_plan
from offloadctl.planning.prefetch import prefetch
from offloadctl.planning.request import FilterPart, PlanRequest, PrefetchPart, SelectPart
from offloadctl.planning.select import select
from tests.models import COMPUTED_RESHAPE

# x -> a -> chain of 8 Relus; `a` is read at positions 1, 4 and 8 (two long gaps), `b` is a graph output
# that is read far away again, and `w` is a weight read at positions 1 and 8.
TWO_GAPS = """
<ir_version: 10, opset_import: ["" : 17]>
g (float[4] x) => (float[4] y, float[4] b) <float[4] w = {1.0, 2.0, 3.0, 4.0}> {
    a = Neg(x)
    r1 = Add(a, w)
    r2 = Relu(r1)
    b = Relu(r2)
    r4 = Add(b, a)
    r5 = Relu(r4)
    r6 = Relu(r5)
    r7 = Add(r6, b)
    y = Add(r7, a)
    z = Mul(y, w)
}
"""


def _analysis(path, **shapes):
    return analyse(load_model(path, input_shapes=shapes or None))


def _by_tensor(plan):
    return {o["tensor"]: o for o in plan["offloads"]}


def test_two_long_gaps_give_two_reload_groups(write_model):
    plan = scheduled_plan(
        _analysis(write_model(TWO_GAPS)), PlanRequest.of_options(select_distance=2, prefetch_distance=0)
    )
    a = _by_tensor(plan)["a"]
    assert a["d2h_after"] == 0
    assert a["device_uses"] == [{"position": 1, "node": a["device_uses"][0]["node"], "input_index": 0}]
    assert [[u["position"] for u in g["uses"]] for g in a["reload_groups"]] == [[4], [8]]
    assert [g["gap"] for g in a["reload_groups"]] == [3, 4]
    assert [g["h2d_before"] for g in a["reload_groups"]] == [4, 8]


def test_gap_equal_to_select_distance_does_not_qualify(write_model):
    plan = scheduled_plan(
        _analysis(write_model(TWO_GAPS)), PlanRequest.of_options(select_distance=4, prefetch_distance=0)
    )
    assert "a" not in _by_tensor(plan)  # gaps 1, 3, 4: none is > 4
    rejected = {r["tensor"]: r for r in plan["rejected"]}
    assert rejected["a"]["reason"] == "short-gaps"
    assert rejected["a"]["max_gap"] == 4


def test_offloaded_graph_output_gets_a_reload_at_the_end(write_model):
    plan = scheduled_plan(
        _analysis(write_model(TWO_GAPS)), PlanRequest.of_options(select_distance=2, prefetch_distance=1)
    )
    b = _by_tensor(plan)["b"]
    assert b["graph_output"] is True
    assert b["output_h2d_before"] == plan["model"]["num_positions"]  # at the end, not prefetched
    assert [[u["position"] for u in g["uses"]] for g in b["reload_groups"]] == [[7]]


def test_weight_used_far_apart_gets_one_h2d_per_reload_group(write_model):
    plan = scheduled_plan(
        _analysis(write_model(TWO_GAPS)), PlanRequest.of_options(select_distance=3, prefetch_distance=0, params=True)
    )
    w = _by_tensor(plan)["w"]
    assert w["kind"] == "parameter"
    assert w["producer"] is None and w["d2h_after"] is None and w["release_after"] is None
    assert w["device_uses"] == []
    assert [[u["position"] for u in g["uses"]] for g in w["reload_groups"]] == [[1], [9]]
    assert [g["h2d_before"] for g in w["reload_groups"]] == [1, 9]


def test_weights_off_by_default_and_rejected_with_reason(write_model):
    plan = scheduled_plan(_analysis(write_model(TWO_GAPS)), PlanRequest.of_options(select_distance=3))
    assert "w" not in _by_tensor(plan)
    assert {r["tensor"]: r["reason"] for r in plan["rejected"]}["w"] == "disabled"


def test_activations_can_be_switched_off(write_model):
    plan = scheduled_plan(
        _analysis(write_model(TWO_GAPS)), PlanRequest.of_options(select_distance=2, activations=False, params=True)
    )
    assert {o["kind"] for o in plan["offloads"]} == {"parameter"}


def test_select_num_keeps_exactly_n_in_first_use_order(write_model):
    analysis = _analysis(write_model(TWO_GAPS))
    selected = select(analysis, SelectPart(select_distance=1, params=True))
    assert len(selected["offloads"]) >= 3
    order = [o["tensor"] for o in selected["offloads"]]
    for n in range(len(order) + 1):
        kept = filter_plan(selected, FilterPart(select_num=n))
        assert [o["tensor"] for o in kept["offloads"]] == order[:n]
        dropped = [r for r in kept["rejected"] if r["reason"] == "select-num"]
        assert [r["tensor"] for r in dropped] == order[n:]


def test_first_use_order_breaks_ties_by_input_index(write_model):
    # Both `p` and `q` are first read by the same node; `q` sits at input 0, `p` at input 1.
    text = """
    <ir_version: 10, opset_import: ["" : 17]>
    g (float[2] x) => (float[2] y) {
        p = Neg(x)
        q = Relu(x)
        s = Sub(q, p)
        t1 = Relu(s)
        t2 = Relu(t1)
        t3 = Relu(t2)
        u = Add(t3, p)
        y = Add(u, q)
    }
    """
    selected = select(_analysis(write_model(text)), SelectPart(select_distance=2))
    assert [o["tensor"] for o in selected["offloads"]] == ["q", "p"]
    assert [o["tensor"] for o in filter_plan(selected, FilterPart(select_num=1))["offloads"]] == ["q"]


def test_min_bytes_drops_small_candidates(write_model):
    selected = select(_analysis(write_model(TWO_GAPS)), SelectPart(select_distance=2))
    kept = filter_plan(selected, FilterPart(min_bytes=17))  # every tensor here is 16 bytes
    assert kept["offloads"] == []
    assert {r["reason"] for r in kept["rejected"] if r["stage"] == "filter"} == {"min-bytes"}


def test_prefetch_clamps_at_the_d2h_and_at_zero_for_weights(write_model):
    plan = scheduled_plan(
        _analysis(write_model(TWO_GAPS)), PlanRequest.of_options(select_distance=2, prefetch_distance=50, params=True)
    )
    for off in plan["offloads"]:
        low = off["d2h_after"] + 1 if off["kind"] == "activation" else 0
        assert [g["h2d_before"] for g in off["reload_groups"]] == [low] * len(off["reload_groups"])


def test_per_tensor_prefetch_override_wins(write_model):
    analysis = _analysis(write_model(TWO_GAPS))
    filtered = filter_plan(select(analysis, SelectPart(select_distance=2)), FilterPart())
    for off in filtered["offloads"]:
        if off["tensor"] == "a":
            off["prefetch_distance"] = 1
    plan = prefetch(filtered, PrefetchPart(prefetch_distance=0))
    a = _by_tensor(plan)["a"]
    assert [g["h2d_before"] for g in a["reload_groups"]] == [3, 7]
    assert all(
        g["h2d_before"] == g["uses"][0]["position"]
        for o in plan["offloads"]
        if o["tensor"] != "a"
        for g in o["reload_groups"]
    )


def test_release_point_is_last_device_use_plus_release_distance(write_model):
    analysis = _analysis(write_model(TWO_GAPS))
    a = _by_tensor(scheduled_plan(analysis, PlanRequest.of_options(select_distance=2, release_distance=2)))["a"]
    assert a["release_after"] == 1 + 2
    b = _by_tensor(scheduled_plan(analysis, PlanRequest.of_options(select_distance=2, release_distance=100)))["b"]
    assert b["release_after"] == analysis.num_positions - 1


def test_subgraph_read_is_a_use_at_the_parent_position(write_model):
    text = """
    <ir_version: 10, opset_import: ["" : 17]>
    g (float[2] x, bool c) => (float[2] y) {
        a = Neg(x)
        b1 = Relu(a)
        b2 = Relu(b1)
        b3 = Relu(b2)
        b4 = Relu(b3)
        y = If(c) <then_branch = g1 () => (float[2] o1) { o1 = Add(a, b4) },
                   else_branch = g2 () => (float[2] o2) { o2 = Sub(b4, x) }>
    }
    """
    analysis = _analysis(write_model(text))
    assert [(u.position, u.input_index) for u in analysis.uses["a"]] == [(1, 0), (5, None)]
    a = _by_tensor(scheduled_plan(analysis, PlanRequest.of_options(select_distance=2, prefetch_distance=0)))["a"]
    assert a["reload_groups"][0]["uses"] == [{"position": 5, "node": analysis.node_names[5], "input_index": None}]


def test_constant_nodes_take_no_position_and_count_as_weights(write_model):
    text = """
    <ir_version: 10, opset_import: ["" : 17]>
    g (float[2] x) => (float[2] y) {
        k = Constant<value = float[2] {3.0, 4.0}>()
        a = Mul(x, k)
        b = Relu(a)
        c = Relu(b)
        d = Relu(c)
        y = Add(d, k)
    }
    """
    analysis = _analysis(write_model(text))
    assert analysis.num_positions == 5
    assert analysis.kind("k") == "parameter"
    k = _by_tensor(
        scheduled_plan(analysis, PlanRequest.of_options(select_distance=2, prefetch_distance=0, params=True))
    )["k"]
    assert [[u["position"] for u in g["uses"]] for g in k["reload_groups"]] == [[0], [4]]


def test_execution_order_sorts_unsorted_files_and_runs_shape_first(write_model, tmp_path):
    import onnx
    from onnx import TensorProto, helper

    nodes = [
        helper.make_node("Relu", ["a"], ["b"], name="relu_b"),  # listed before its producer
        helper.make_node("Neg", ["x"], ["a"], name="neg_a"),
        helper.make_node("Shape", ["a"], ["s"], name="shape_a"),
        helper.make_node("Reshape", ["b", "s"], ["y"], name="reshape"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    path = tmp_path / "unsorted.onnx"
    onnx.save(model, str(path))
    analysis = _analysis(path)
    assert analysis.was_sorted is False
    # After Neg both Relu (file index 0) and Shape (index 2) are ready: Shape runs first.
    assert [n.name for n in analysis.nodes] == ["neg_a", "shape_a", "relu_b", "reshape"]


def test_unknown_sizes_are_excluded_with_a_reason_and_pinned_by_input_shape(write_model):
    text = """
    <ir_version: 10, opset_import: ["" : 17]>
    g (float[N, 4] x) => (float[N, 4] y) {
        a = Neg(x)
        b = Relu(a)
        c = Relu(b)
        d = Relu(c)
        y = Add(d, a)
    }
    """
    path = write_model(text)
    plan = scheduled_plan(_analysis(path), PlanRequest.of_options(select_distance=2))
    assert plan["offloads"] == []
    reasons = {r["tensor"]: r for r in plan["rejected"]}
    assert reasons["a"]["reason"] == "unknown-size" and reasons["a"]["bytes"] is None
    assert "--input-shape" in reasons["a"]["detail"]
    pinned = scheduled_plan(_analysis(path, x=[3, 4]), PlanRequest.of_options(select_distance=2))
    assert _by_tensor(pinned)["a"]["bytes"] == 3 * 4 * 4
    assert pinned["model"]["input_shapes"] == {"x": [3, 4]}


def test_plan_pins_the_model_and_records_every_stage(seed_path):
    from offloadctl._version import __version__
    from offloadctl.core.files import sha256_file

    plan = scheduled_plan(_analysis(seed_path), PlanRequest.of_options(select_distance=1))
    assert plan["model"]["sha256"] == sha256_file(seed_path)
    assert plan["stage"] == "scheduled"
    assert [h["stage"] for h in plan["history"]] == ["selected", "filtered", "scheduled"]
    assert all(h["tool_version"] == __version__ for h in plan["history"])
    assert set(plan["options"]) == {"select", "filter", "prefetch"}


def test_every_sample_plans_to_a_schema_valid_plan():
    from tests.conftest import SAMPLE_NAMES, SAMPLES

    for name in SAMPLE_NAMES:
        plan = scheduled_plan(
            _analysis(SAMPLES / f"{name}.onnx"), PlanRequest.of_options(select_distance=5, params=True)
        )
        validate_plan(plan)
        assert plan["model"]["num_positions"] > 0


def test_mlp_sample_offloads_nothing_with_defaults():
    from tests.conftest import SAMPLES

    plan = scheduled_plan(_analysis(SAMPLES / "mlp.onnx"), PlanRequest.of_options(params=True))
    assert plan["offloads"] == []


# --- command line ---------------------------------------------------------------------------------


def test_plan_equals_chained_stages(run_cli, tmp_path):
    from tests.conftest import SAMPLES

    model = SAMPLES / "transformer.onnx"
    opts = ["--select-distance", "7", "--params"]
    assert run_cli("select", model, "-o", tmp_path / "s.json", *opts).exit_code == 0
    assert run_cli("filter", tmp_path / "s.json", "-o", tmp_path / "f.json", "--select-num", "9").exit_code == 0
    assert (
        run_cli("prefetch", tmp_path / "f.json", "-o", tmp_path / "p.json", "--prefetch-distance", "3").exit_code == 0
    )
    result = run_cli(
        "plan", model, "-o", tmp_path / "plan.json", *opts, "--select-num", "9", "--prefetch-distance", "3"
    )
    assert result.exit_code == 0, result.stderr
    chained = json.loads((tmp_path / "p.json").read_text())
    direct = json.loads((tmp_path / "plan.json").read_text())
    chained.pop("summary", None), direct.pop("summary", None)
    assert chained == direct
    assert len(direct["offloads"]) == 9


def test_edited_plan_is_honoured_by_a_later_stage(run_cli, tmp_path, seed_path):
    assert run_cli("select", seed_path, "-o", tmp_path / "s.json", "--select-distance", "1").exit_code == 0
    assert run_cli("filter", tmp_path / "s.json", "-o", tmp_path / "f.json").exit_code == 0
    filtered = json.loads((tmp_path / "f.json").read_text())
    filtered["offloads"][0]["prefetch_distance"] = 3
    (tmp_path / "f.json").write_text(json.dumps(filtered))
    assert (
        run_cli("prefetch", tmp_path / "f.json", "-o", tmp_path / "p.json", "--prefetch-distance", "0").exit_code == 0
    )
    plan = read_plan(tmp_path / "p.json")
    assert plan["offloads"][0]["reload_groups"][0]["h2d_before"] == 2


def test_invalid_plan_is_refused_naming_the_field(run_cli, tmp_path, seed_path):
    assert run_cli("select", seed_path, "-o", tmp_path / "s.json", "--select-distance", "1").exit_code == 0
    plan = json.loads((tmp_path / "s.json").read_text())
    plan["offloads"][0]["bytes"] = "lots"
    (tmp_path / "bad.json").write_text(json.dumps(plan))
    result = run_cli("filter", tmp_path / "bad.json", "-o", tmp_path / "f.json")
    assert result.exit_code == 1
    assert "offloads/0/bytes" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert not (tmp_path / "f.json").exists()


def test_wrong_stage_is_refused_with_the_next_step(run_cli, tmp_path, seed_path):
    assert run_cli("select", seed_path, "-o", tmp_path / "s.json").exit_code == 0
    result = run_cli("prefetch", tmp_path / "s.json", "-o", tmp_path / "p.json")
    assert result.exit_code == 1
    assert "stage 'selected'" in result.stderr and "offloadctl filter" in result.stderr


def test_validate_rejects_h2d_before_its_d2h(seed_path):
    plan = scheduled_plan(_analysis(seed_path), PlanRequest.of_options(select_distance=1))
    plan["offloads"][0]["reload_groups"][0]["h2d_before"] = 0
    with pytest.raises(OffloadError, match="h2d_before"):
        validate_plan(plan)


def test_inspect_json_reports_sizes_and_idle_tensors(run_cli):
    from tests.conftest import SAMPLES

    result = run_cli("inspect", SAMPLES / "unet.onnx", "--json")
    assert result.exit_code == 0
    report = result.json()
    assert report["nodes"] > 30
    assert report["weights"]["bytes"] > 0 and report["activations"]["bytes"] > 0
    gaps = [t["max_gap"] for t in report["longest_idle"]]
    assert gaps == sorted(gaps, reverse=True) and gaps[0] > 20  # the first skip connection


def test_schema_ships_inside_the_wheel(tmp_path):
    import subprocess
    import sys
    import zipfile

    from tests.conftest import ROOT

    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("offloadctl-*.whl")
    assert "offloadctl/_schemas/plan.schema.json" in zipfile.ZipFile(wheel).namelist()


# A weight ("shape") read only as Reshape's shape input, 5 positions after the start.
RESHAPE_BY_WEIGHT = """
<ir_version: 10, opset_import: ["" : 17]>
g (float[2, 3] x) => (float[3, 2] y) <int64[2] shape = {3, 2}> {
    a = Neg(x)
    b = Relu(a)
    c = Relu(b)
    d = Relu(c)
    e = Add(d, a)
    y = Reshape(e, shape)
}
"""


def test_tensors_read_as_shape_inputs_stay_where_onnxruntime_wants_them(write_model):
    plan = scheduled_plan(
        _analysis(write_model(RESHAPE_BY_WEIGHT)),
        PlanRequest.of_options(select_distance=1, params=True, prefetch_distance=0),
    )
    rejected = {r["tensor"]: r for r in plan["rejected"]}
    assert rejected["shape"]["reason"] == "host-input"
    assert "Reshape" in rejected["shape"]["detail"]
    assert "a" in _by_tensor(plan)


def test_forcing_a_tensor_read_on_the_host_offloads_it_with_a_warning_naming_it(write_model, caplog):
    """--force wins over host-input, but the plan says so: on a device provider such a copy goes
    straight back, or the rewrite does not load (onnxruntime's WebGPU: a duplicate definition)."""
    analysis = _analysis(write_model(RESHAPE_BY_WEIGHT))
    with caplog.at_level("WARNING"):
        plan = scheduled_plan(analysis, PlanRequest.of_options(select_distance=1, params=True, force=("*",)))
    assert "shape" in _by_tensor(plan)
    (warning,) = [r.getMessage() for r in caplog.records if "--force'd" in r.getMessage()]
    assert "1 --force'd tensor(s)" in warning and "'shape': read as input 1 of Reshape" in warning
    caplog.clear()
    with caplog.at_level("WARNING"):
        scheduled_plan(
            _analysis(write_model(RESHAPE_BY_WEIGHT)),
            PlanRequest.of_options(select_distance=1, params=True, force=("a",)),
        )
    assert not [r for r in caplog.records if "--force'd" in r.getMessage()]  # "a" is read on the device


SMALL_INDEX_WEIGHT = """
<ir_version: 10, opset_import: ["" : 17]>
g (int64[2] i) => (int64[2] y) <int64[2] k = {1, 2}> {
    a = Neg(i)
    b = Abs(a)
    c = Neg(b)
    d = Abs(c)
    y = Add(d, k)
}
"""


def test_a_forced_small_index_tensor_is_named_without_the_advice_to_force_it(write_model, caplog):
    """The rejection of a small index tensor ends with the advice to --force it; the warning for one
    that was forced gives the reason alone."""
    plan = scheduled_plan(
        _analysis(write_model(SMALL_INDEX_WEIGHT)), PlanRequest.of_options(select_distance=1, params=True)
    )
    detail = {r["tensor"]: r for r in plan["rejected"]}["k"]["detail"]
    assert detail.startswith("a small int64 tensor") and detail.endswith("--force it to offload it anyway")
    with caplog.at_level("WARNING"):
        plan = scheduled_plan(
            _analysis(write_model(SMALL_INDEX_WEIGHT)),
            PlanRequest.of_options(select_distance=1, params=True, force=("k",)),
        )
    assert "k" in _by_tensor(plan)
    (warning,) = [r.getMessage() for r in caplog.records if "--force'd" in r.getMessage()]
    assert "'k': a small int64 tensor (16 B)" in warning and "--force it to offload" not in warning


def test_a_rejected_tensor_gets_the_first_reason_in_the_documented_order(write_model):
    analysis = _analysis(write_model(RESHAPE_BY_WEIGHT))
    # The weight "shape" is idle for 5 positions before its only use and is read on the host: with
    # gaps too short to qualify, short-gaps is the reason; with qualifying gaps, host-input.
    short = {
        r["tensor"]: r
        for r in scheduled_plan(analysis, PlanRequest.of_options(select_distance=5, params=True))["rejected"]
    }
    assert short["shape"]["reason"] == "short-gaps" and short["shape"]["max_gap"] == 5
    assert short["a"]["reason"] == "short-gaps"
    long = {
        r["tensor"]: r
        for r in scheduled_plan(analysis, PlanRequest.of_options(select_distance=4, params=True))["rejected"]
    }
    assert long["shape"]["reason"] == "host-input"
    disabled = {
        r["tensor"]: r
        for r in scheduled_plan(analysis, PlanRequest.of_options(select_distance=5, params=False))["rejected"]
    }
    assert disabled["shape"]["reason"] == "disabled"  # before short-gaps
    never = {
        r["tensor"]: r
        for r in scheduled_plan(analysis, PlanRequest.of_options(select_distance=5, never=("a",)))["rejected"]
    }
    assert never["a"]["reason"] == "never"  # before short-gaps


def test_sizes_behind_computed_reshape_shapes_are_known(write_model):
    analysis = _analysis(write_model(COMPUTED_RESHAPE))
    assert analysis.infos["r"].bytes == 1 * 8 * 40 * 4
    assert analysis.infos["r"].shape == (1, 40, 8)


def test_unsorted_files_get_shapes_in_execution_order(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    nodes = [
        helper.make_node("Relu", ["a"], ["b"], name="relu_b"),
        helper.make_node("Neg", ["x"], ["a"], name="neg_a"),
        helper.make_node("Add", ["b", "a"], ["y"], name="add"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    path = tmp_path / "unsorted.onnx"
    onnx.save(model, str(path))
    analysis = _analysis(path)
    assert [analysis.infos[t].bytes for t in ("a", "b", "y")] == [24, 24, 24]


def test_a_weak_plan_gives_the_next_command_with_the_figures_it_gives(run_cli, tmp_path):
    """A plan that lowers the peak by under 5% (DenseNet-121 from the onnx wheel, --params
    --select-distance 10: +0.0%) ends with a computed next step: a budget plan's command, its peak
    and slowdown, which that command then gives."""
    import shlex

    import onnx

    model = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / "light_densenet121.onnx"
    res = run_cli("plan", model, "--params", "--select-distance", "10", "-o", tmp_path / "p.json", "--json")
    step = json.loads(res.stdout)["next_step"]
    assert step is not None and step["peak_bytes"]["after"] < 0.95 * step["peak_bytes"]["before"]
    assert "next: offloadctl plan" in res.stderr
    args = shlex.split(step["command"].replace("PLAN.json", str(tmp_path / "next.json")))[2:]
    done = run_cli("plan", *args, "--json")
    assert done.exit_code == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["peak_bytes"]["after"] == step["peak_bytes"]["after"]
    assert doc["slowdown"]["serialized"] == pytest.approx(step["slowdown"])
    assert doc["next_step"] is None


def test_the_next_step_pins_the_dims_a_user_gives_not_the_sums_that_follow(run_cli, tmp_path):
    """A model with a dimension named by a sum of others (Optimum's ``past_sequence_length +
    sequence_length``, here ``n + 1``): the next step's command leaves the sum out (it follows from its parts; as one
    --dim it would not even split into arguments), quotes what it names, and gives the figures it
    quotes."""
    import shlex

    import onnx
    from onnx import TensorProto, helper

    nodes = [
        helper.make_node("Neg", ["z"], ["w"]),  # made first, read by nobody: offloadable until the end
        helper.make_node("Neg", ["xs"], ["s"]),
        helper.make_node("Abs", ["s"], ["s1"]),
        helper.make_node("Neg", ["xb"], ["b"]),
        helper.make_node("Abs", ["b"], ["b1"]),
        helper.make_node("Relu", ["b1"], ["t1"]),
        helper.make_node("Relu", ["t1"], ["t2"]),
        helper.make_node("Add", ["t1", "t2"], ["t3"]),
        helper.make_node("Relu", ["t3"], ["t4"]),
        helper.make_node("Add", ["t4", "b"], ["u"]),
        helper.make_node("Relu", ["u"], ["v"]),
        helper.make_node("Add", ["v", "s"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "sums",
        [
            helper.make_tensor_value_info("xs", TensorProto.FLOAT, [1]),
            helper.make_tensor_value_info("xb", TensorProto.FLOAT, ["n"]),
            helper.make_tensor_value_info("z", TensorProto.FLOAT, ["n + 1"]),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n"]),
            helper.make_tensor_value_info("w", TensorProto.FLOAT, ["n + 1"]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    folder = tmp_path / "a folder"
    folder.mkdir()
    path = folder / "sums.onnx"
    onnx.save(model, str(path))
    res = run_cli("plan", path, "--dim", "n=256", "-o", tmp_path / "p.json", "--json")
    assert res.exit_code == 0, res.stderr
    step = json.loads(res.stdout)["next_step"]
    assert step is not None and "--dim n=256" in step["command"] and "n + 1" not in step["command"]
    args = shlex.split(step["command"].replace("PLAN.json", str(tmp_path / "next.json")))
    assert args[2] == str(path)  # the folder's space is quoted
    done = run_cli("plan", *args[2:], "--json")
    assert done.exit_code == 0, done.stderr
    assert json.loads(done.stdout)["peak_bytes"]["after"] == step["peak_bytes"]["after"]


# a weight read by the only node (its longest idle stretch is 0), and activations of unknown size
ONE_NODE = """
<ir_version: 10, opset_import: ["" : 17]>
g (float[4] x) => (float[4] y) <float[4] w = {1.0, 2.0, 3.0, 4.0}> {
    y = Add(x, w)
}
"""
DYNAMIC = """
<ir_version: 10, opset_import: ["" : 17]>
g (float[N] x) => (float[N] y) {
    a = Neg(x)
    b = Relu(a)
    c = Relu(b)
    y = Add(c, a)
}
"""


@pytest.mark.parametrize(
    "model", [TWO_GAPS, RESHAPE_BY_WEIGHT, COMPUTED_RESHAPE, ONE_NODE, DYNAMIC, "IF_MODEL", "WHOLE_IF_MODEL"]
)
@pytest.mark.parametrize("params", [True, False])
@pytest.mark.parametrize("force", [(), ("a", "b", "w")])
def test_one_selection_serves_every_select_distance(write_model, model, params, force):
    """`select` reads one pass made at select distance 0 (`selection_for`, shared with the budget
    planner): at each distance its plan gives every tensor the verdict a pass made at that distance
    gives it, whatever distances were selected at before on the same analysis."""
    from offloadctl.planning.request import SelectPart
    from offloadctl.planning.select import _Selector, selection_for
    from tests import test_subgraphs

    path = write_model(getattr(test_subgraphs, model, model))  # a subgraph model by name (read only inside a body)
    shared = _analysis(path)
    for distance in (5, 0, 1, 3, 2, 4):
        options = SelectPart(select_distance=distance, params=params, force=force)
        plan = select(shared, options)
        fresh = _analysis(path)
        direct = _Selector(fresh, options)  # the stage's rules applied at this distance, tensor by tensor
        for name in fresh.producer:
            direct.consider(name, "activation")
        for name in sorted(fresh.weights):
            if name in fresh.uses:
                direct.consider(name, "parameter")
        assert plan["rejected"] == [entry for _, entry in sorted(direct.rejected, key=lambda item: item[0])]
        assert [o["tensor"] for o in plan["offloads"]] == [c.tensor for _, c in sorted(direct.chosen)]
        assert plan == select(fresh, options)  # the same plan from an analysis nothing was selected on
    assert selection_for(shared, SelectPart(select_distance=7, params=params)) is selection_for(shared, SelectPart())


def _one_by_one(analysis, options):
    """A `_Selector` that considered every candidate one by one, in the select stage's order."""
    from offloadctl.planning.select import _Selector

    direct = _Selector(analysis, options)
    for name in analysis.producer:
        direct.consider(name, "activation")
    for name in analysis.sorted_weights:
        if name in analysis.uses:
            direct.consider(name, "parameter")
    return direct


# "big", 8 KiB of int64 (not small index arithmetic), ends only at Reshape's shape, through a Gather
SHAPE_FEEDER = """
<ir_version: 10, opset_import: ["" : 17]>
g (float[2, 3] x, int64[1024] ids) => (float[3, 2] y) <int64[2] pick = {0, 1}> {
    big = Add(ids, ids)
    a = Neg(x)
    b = Relu(a)
    c = Relu(b)
    d = Relu(c)
    dims = Gather(big, pick)
    y = Reshape(d, dims)
}
"""


# "lo" is read only inside a branch, as Clip's min, which onnxruntime reads in host memory
HOST_READ_IN_BODY = """
<ir_version: 10, opset_import: ["" : 17]>
g (float[4, 8] x, bool c) => (float[4, 8] y) {
    lo = ReduceMin <keepdims = 0> (x)
    a = Neg(x)
    b = Relu(a)
    d = Relu(b)
    y = If(c) <
        then_branch = then_g () => (float[4, 8] t_out) {
            t_out = Clip(d, lo)
        },
        else_branch = else_g () => (float[4, 8] e_out) {
            e_out = Neg(d)
        }
    >
}
"""


def _selection_models(write_model):
    from tests.conftest import SAMPLE_NAMES, SAMPLES
    from tests.test_subgraphs import IF_MODEL, LOOP_MODEL, NESTED_MODEL

    texts = [TWO_GAPS, RESHAPE_BY_WEIGHT, COMPUTED_RESHAPE, ONE_NODE, DYNAMIC, SHAPE_FEEDER, IF_MODEL, LOOP_MODEL]
    texts += [NESTED_MODEL, HOST_READ_IN_BODY]
    return [
        *(SAMPLES / f"{name}.onnx" for name in SAMPLE_NAMES),
        SAMPLES / "bert" / "model.onnx",
        SAMPLES / "genai" / "llama-int4" / "model.onnx",  # MatMulNBits packs its weights
        *(write_model(text, f"text{k}.onnx") for k, text in enumerate(texts)),
    ]


def test_the_selection_pass_gives_each_tensor_the_verdict_of_the_per_tensor_rules(write_model):
    """The select stage's pass (`consider_all`, which `Selection` runs) decides the candidates no
    reason applies to all at once and sends the others through `consider`: on models with host
    reads, shape arithmetic, packed weights, subgraph reads, unknown sizes and graph outputs, and
    with every option that changes a verdict, its records are the ones `consider` makes tensor by
    tensor."""
    from offloadctl.planning.request import SelectPart
    from offloadctl.planning.select import _Selector

    chosen_somewhere = set()
    for path in _selection_models(write_model):
        analysis = _analysis(path)
        nodes = analysis.node_names
        some = sorted(analysis.producer)[::3]
        for options in (
            SelectPart(params=True, select_distance=0),
            SelectPart(params=True, select_distance=2),
            SelectPart(params=False, select_distance=1, force=("*1*",)),
            SelectPart(params=True, activations=False, never=("*0*",), force=("*a*", "*w*")),
            SelectPart(params=True, fused=tuple(some)),
            SelectPart(params=True, host=HostPlacement("webgpu (measured)", tuple(nodes[::4]))),
        ):
            selector = _Selector(analysis, options)
            selector.consider_all(
                list(analysis.producer), [name for name in analysis.sorted_weights if name in analysis.uses]
            )
            direct = _one_by_one(analysis, options)
            assert sorted(selector.chosen) == sorted(direct.chosen), (path, options)
            by_key = operator.itemgetter(0)
            assert sorted(selector.rejected, key=by_key) == sorted(direct.rejected, key=by_key)
            assert selector.gaps == direct.gaps and selector.index == direct.index and selector.forced == direct.forced
            assert selector.forced_on_host == direct.forced_on_host
            chosen_somewhere.add(len(direct.chosen) > 0)
    assert chosen_somewhere == {True, False}  # the models give both verdicts


def test_reload_gaps_are_the_largest_gap_before_a_reload_group_of_each_entry(write_model):
    """`Selection.reload_gaps` (what the filter records of a tensor it drops) is, for every chosen
    tensor, forced or not, weight or activation, the largest gap before a reload group of the entry
    `select` builds for it at that select distance."""
    from offloadctl.planning.request import SelectPart
    from offloadctl.planning.select import Selection, _reload_split

    checked = 0
    for path in _selection_models(write_model):
        analysis = _analysis(path)
        for force in ((), ("*",)):
            selection = Selection(analysis, SelectPart(params=True, force=force))
            for distance in (0, 1, 2, 3, 5):
                gaps = selection.reload_gaps(distance)
                chosen, _ = selection.at_distance(distance, weights=True)
                for record in chosen:
                    groups = _reload_split(analysis, record, distance)[1]
                    assert gaps[selection.numbers[record.tensor]] == max(gap for gap, _ in groups), (path, record)
                    checked += 1
    assert checked > 1000


@pytest.mark.parametrize("sample", ["seed", "transformer", "unet", "training"])
def test_the_distance_planner_makes_the_plan_of_the_three_stages_chained(sample):
    """`distance_plan` filters the select stage's records before it builds entries: its plan is the
    one `select`, `filter_plan` and `prefetch` give one after the other, whatever the filter keeps
    (forced tensors, --min-bytes, --select-num) and whatever order the requests come in."""
    from offloadctl.planning.planners import distance_plan
    from offloadctl.planning.request import PlanRequest
    from tests.conftest import SAMPLES

    analysis = _analysis(SAMPLES / f"{sample}.onnx")
    requests = [
        PlanRequest(),
        PlanRequest.of_options(select_distance=0, select_num=3),
        PlanRequest.of_options(select_distance=1, params=True, select_num=5, min_bytes=1024),
        PlanRequest.of_options(select_distance=2, params=True, select_num=0, force=("*",)),
        PlanRequest.of_options(
            select_distance=0, params=True, select_num=2, force=("*w*", "*weight*"), min_bytes="4KiB"
        ),
        PlanRequest.of_options(select_distance=3, params=True, select_num=10**6, prefetch_distance=1),
    ]
    dropped = set()
    for request in requests:
        chained = prefetch(filter_plan(select(analysis, request.select), request.filter), request.prefetch)
        assert distance_plan(analysis, request).plan == chained
        dropped |= {r["reason"] for r in chained["rejected"] if r["stage"] == "filter"}
    assert dropped == {"select-num", "min-bytes"}  # the requests make the filter drop for both reasons
