"""Property-based tests: random DAG models x random plan options.

The strategy builds models from elementwise Add/Mul/Sub/Relu/Neg, MatMul with compatible shapes,
Concat and Split (several outputs), with random fan-out and long-distance reuse (any earlier tensor
may be read again), graph outputs taken from the middle, and optional weights. For each model and
option set, ``make_plan`` must give a schema-valid plan that obeys the HyperOffload rules, checked
against an independent re-statement of docs/plan-file.md (not against the stages' own helpers); and the model
rewritten by ``apply`` must pass ``onnx.checker`` (full check), give bit-identical outputs on
onnxruntime's CPU provider (ORT_DISABLE_ALL, PRIORITY_BASED) and run in the planned (file) order.

Examples are generated deterministically (``derandomize=True``), so CI sees the same cases every run.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from offloadctl.analysis.graph import Analysis, analyse
from offloadctl.contract.document import validate_plan
from offloadctl.loading.model import load_model
from offloadctl.planning.make import scheduled_plan
from offloadctl.planning.request import PlanRequest, SelectPart
from offloadctl.planning.select import select
from offloadctl.rewriting.rewrite import RewriteOptions, apply_plan
from offloadctl.rewriting.writing import write_model

from models import make_model, tensor

settings.register_profile(
    "offloadctl-properties",
    max_examples=60,
    deadline=None,
    derandomize=True,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
PROPERTIES = settings.get_profile("offloadctl-properties")

DIMS = (1, 2, 3, 4)
MAX_DIM = 8
ELEMENTWISE = ("Add", "Mul", "Sub")
UNARY = ("Relu", "Neg")


@dataclass
class RandomModel:
    """A generated model, inputs to run it with, and a one-line description for failure reports."""

    model: onnx.ModelProto
    feeds: dict[str, np.ndarray]
    ops: list[str] = field(default_factory=list)

    def __repr__(self) -> str:
        return f"RandomModel({onnx.printer.to_text(self.model.graph)})"


@st.composite
def dag_models(draw: st.DrawFn) -> RandomModel:
    """A random DAG over 2-D float tensors (see the module docstring)."""
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    use_weights = draw(st.booleans())
    pool: list[tuple[str, tuple[int, int]]] = []
    inputs, inits, nodes, ops = [], [], [], []
    feeds: dict[str, np.ndarray] = {}
    consumed: set[str] = set()

    def values(shape) -> np.ndarray:
        return rng.uniform(-1.0, 1.0, size=shape).astype(np.float32)

    def weight(shape: tuple[int, int]) -> str:
        name = f"w{len(inits)}"
        inits.append(numpy_helper.from_array(values(shape), name))
        return name

    def pick(shape_ok=lambda s: True) -> tuple[str, tuple[int, int]] | None:
        candidates = [t for t in pool if shape_ok(t[1])]
        return draw(st.sampled_from(candidates)) if candidates else None

    for i in range(draw(st.integers(1, 2))):
        shape = (draw(st.sampled_from(DIMS)), draw(st.sampled_from(DIMS)))
        inputs.append(tensor(f"in{i}", shape))
        feeds[f"in{i}"] = values(shape)
        pool.append((f"in{i}", shape))

    for k in range(draw(st.sampled_from(range(4, 25)))):
        op = draw(st.sampled_from(ELEMENTWISE + UNARY + ("MatMul", "Concat", "Split")))
        a, a_shape = pick()
        out = f"t{k}"
        if op in ELEMENTWISE:
            if use_weights and draw(st.booleans()):
                b = weight(a_shape)
            else:
                b, _ = pick(lambda s: s == a_shape)  # noqa: B023 (called at once)
            node = helper.make_node(op, [a, b], [out])
            outs = [(out, a_shape)]
        elif op == "MatMul":
            other = pick(lambda s: s[0] == a_shape[1])  # noqa: B023 (called at once)
            if other is None or (use_weights and draw(st.booleans())):
                b_shape = (a_shape[1], draw(st.sampled_from(DIMS)))
                b = weight(b_shape)
            else:
                b, b_shape = other
            node = helper.make_node("MatMul", [a, b], [out])
            outs = [(out, (a_shape[0], b_shape[1]))]
        elif op == "Concat":
            axis = draw(st.integers(0, 1))
            other = pick(lambda s: s[1 - axis] == a_shape[1 - axis] and s[axis] + a_shape[axis] <= MAX_DIM)  # noqa: B023
            if other is None:
                op, node, outs = "Relu", helper.make_node("Relu", [a], [out]), [(out, a_shape)]
            else:
                b, b_shape = other
                shape = list(a_shape)
                shape[axis] += b_shape[axis]
                node = helper.make_node("Concat", [a, b], [out], axis=axis)
                outs = [(out, tuple(shape))]
        elif op == "Split":
            axis = draw(st.integers(0, 1))
            if a_shape[axis] < 2:
                op, node, outs = "Neg", helper.make_node("Neg", [a], [out]), [(out, a_shape)]
            else:
                parts = draw(st.integers(2, min(3, a_shape[axis])))
                cuts = sorted(draw(st.sets(st.integers(1, a_shape[axis] - 1), min_size=parts - 1, max_size=parts - 1)))
                sizes = [b - a_ for a_, b in zip([0, *cuts], [*cuts, a_shape[axis]])]
                split = f"split{k}"
                inits.append(numpy_helper.from_array(np.array(sizes, np.int64), split))
                names = [f"{out}_{j}" for j in range(len(sizes))]
                node = helper.make_node("Split", [a, split], names, axis=axis)
                outs = []
                for name, size in zip(names, sizes):
                    shape = list(a_shape)
                    shape[axis] = size
                    outs.append((name, tuple(shape)))
        else:
            node = helper.make_node(op, [a], [out])
            outs = [(out, a_shape)]
        node.name = f"n{k}_{op.lower()}"
        nodes.append(node)
        ops.append(op)
        consumed.update(node.input)
        pool.extend(outs)

    produced = [(name, shape) for name, shape in pool if not name.startswith("in")]
    leaves = [t for t in produced if t[0] not in consumed]
    middle = [t for t in produced if t[0] in consumed]
    extra = draw(st.lists(st.sampled_from(middle), unique=True, max_size=3)) if middle else []
    outputs = [tensor(name, shape) for name, shape in leaves + extra]
    return RandomModel(make_model(nodes, inputs, outputs, initializers=inits), feeds, ops)


plan_options = st.fixed_dictionaries(
    {
        "select_distance": st.integers(0, 5),
        "prefetch_distance": st.integers(0, 5),
        "release_distance": st.integers(0, 2),
        "params": st.booleans(),
        "select_num": st.sampled_from([100, 100, 100, 0, 1, 2, 3, 5]),
    }
)


# ---------------------------------------------------------------------------------------------------
# An independent statement of the rules (docs/plan-file.md, "How a plan is made")
# ---------------------------------------------------------------------------------------------------


def _pos(use: dict) -> tuple[int, int | None]:
    return (use["position"], use["input_index"])


def _first_use_key(off: dict) -> tuple[int, int]:
    first = (off["device_uses"] or off["reload_groups"][0]["uses"])[0]
    return (first["position"], 1 << 30 if first["input_index"] is None else first["input_index"])


def _expected_split(start: int, uses: list[tuple[int, int | None]], distance: int):
    """Rule 2 (select): gaps > distance open reload groups; earlier uses keep reading the device tensor."""
    device, groups, prev = [], [], start
    for use in uses:
        if use[0] - prev > distance:
            groups.append([use])
        elif groups:
            groups[-1].append(use)
        else:
            device.append(use)
        prev = use[0]
    return device, groups


def check_plan(analysis: Analysis, plan: dict, opts: dict) -> None:
    validate_plan(plan)
    assert plan["stage"] == "scheduled"
    n = analysis.num_positions
    sd, pd, rd = opts["select_distance"], opts["prefetch_distance"], opts["release_distance"]

    # every activation is either offloaded or rejected with a reason, exactly once
    named = [o["tensor"] for o in plan["offloads"]] + [r["tensor"] for r in plan["rejected"]]
    assert len(named) == len(set(named))
    assert set(analysis.producer) <= set(named)
    assert all(r["reason"] and r["detail"] for r in plan["rejected"])

    # select_num: exactly min(select_num, candidates), the first ones in first-use order
    candidates = select(analysis, SelectPart(select_distance=sd, params=opts["params"]))["offloads"]
    want = sorted(candidates, key=_first_use_key)[: opts["select_num"]]
    assert len(plan["offloads"]) == min(opts["select_num"], len(candidates))
    assert sorted(o["tensor"] for o in plan["offloads"]) == sorted(o["tensor"] for o in want)
    dropped = {r["tensor"] for r in plan["rejected"] if r["reason"] == "select-num"}
    assert dropped == {o["tensor"] for o in candidates} - {o["tensor"] for o in want}

    for off in plan["offloads"]:
        name, is_act = off["tensor"], off["kind"] == "activation"
        uses = [(u.position, u.input_index) for u in analysis.uses[name]]
        groups = off["reload_groups"]
        # no use is lost or invented: device uses + reload groups are exactly the tensor's uses
        assert [_pos(u) for u in off["device_uses"]] + [_pos(u) for g in groups for u in g["uses"]] == uses
        assert off["bytes"] == analysis.infos[name].bytes
        if is_act:
            start = analysis.producer[name]
            assert off["d2h_after"] == start and off["producer"]["position"] == start
            device, expected_groups = _expected_split(start, uses, sd)
            assert [_pos(u) for u in off["device_uses"]] == device
            assert [[_pos(u) for u in g["uses"]] for g in groups] == expected_groups
            last_device = off["device_uses"][-1]["position"] if off["device_uses"] else start
            assert off["release_after"] == min(last_device + rd, max(n - 1, 0))
            assert off["output_h2d_before"] == (n if name in analysis.graph_outputs else None)
        else:
            assert name in analysis.weights and off["d2h_after"] is None and off["device_uses"] == []
            points = [0] + [u[0] for u in uses] + [max(n - 1, uses[-1][0])]
            assert max(b - a for a, b in zip(points, points[1:])) > sd  # it idles somewhere
        prev = off["device_uses"][-1]["position"] if off["device_uses"] else (off["d2h_after"] if is_act else 0)
        low = off["d2h_after"] + 1 if is_act else 0
        for k, group in enumerate(groups):
            positions = [u["position"] for u in group["uses"]]
            first = positions[0]
            assert group["gap"] == first - prev
            if is_act or k > 0:
                assert group["gap"] > sd  # the group's first use follows a long idle stretch
            assert all(b - a <= sd for a, b in zip(positions, positions[1:]))  # the group holds no long gap
            assert low <= group["h2d_before"] <= first
            assert group["h2d_before"] == max(low, first - pd)
            prev = positions[-1]

    for rej in plan["rejected"]:
        if rej["reason"] == "short-gaps" and rej["kind"] == "activation":
            uses = [(u.position, u.input_index) for u in analysis.uses[rej["tensor"]]]
            assert _expected_split(analysis.producer[rej["tensor"]], uses, sd)[1] == []


def check_rewrite(analysis: Analysis, plan: dict, rewritten: onnx.ModelProto) -> None:
    """Each copy sits where the plan says, and exactly the planned uses read the reloaded tensor."""
    nodes = list(rewritten.graph.node)
    by_name = {n.name: n for n in nodes}
    index = {n.name: i for i, n in enumerate(nodes)}
    original = [n.name for n in nodes if n.op_type not in ("MemcpyToHost", "MemcpyFromHost")]
    assert original == analysis.node_names  # original nodes keep their planned order

    def slot(i: int) -> int:
        """How many original nodes run before file index i."""
        return sum(1 for n in nodes[:i] if n.op_type not in ("MemcpyToHost", "MemcpyFromHost"))

    for off in plan["offloads"]:
        name = off["tensor"]
        host = device = name
        if off["kind"] == "activation":
            # the producer may write under a new name (an offloaded graph output is fed by a reload)
            producer = analysis.nodes[off["d2h_after"]]
            device = by_name[producer.name].output[list(producer.output).index(name)]
            (d2h,) = [n for n in nodes if n.op_type == "MemcpyToHost" and n.input[0] == device]
            assert slot(index[d2h.name]) == off["d2h_after"] + 1  # right after the producer
            host = d2h.output[0]
        reloads = [n for n in nodes if n.op_type == "MemcpyFromHost" and n.input[0] == host]
        for use in off["device_uses"]:
            assert by_name[use["node"]].input[use["input_index"]] == device
        for group in off["reload_groups"]:
            readers = {by_name[u["node"]].input[u["input_index"]] for u in group["uses"]}
            (reloaded,) = readers
            (h2d,) = [n for n in reloads if n.output[0] == reloaded]
            assert slot(index[h2d.name]) == group["h2d_before"]
        assert len(reloads) >= len(off["reload_groups"])


# ---------------------------------------------------------------------------------------------------
# Tests
# ---------------------------------------------------------------------------------------------------


def _analyse(random_model: RandomModel, folder: Path) -> Analysis:
    path = folder / "model.onnx"
    onnx.save(random_model.model, str(path))
    return analyse(load_model(path))


@PROPERTIES
@given(random_model=dag_models(), opts=plan_options)
def test_random_plans_obey_the_rules(random_model: RandomModel, opts: dict) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        analysis = _analyse(random_model, Path(tmp))
    check_plan(analysis, scheduled_plan(analysis, PlanRequest.of_options(**opts)), opts)


def _session(path: Path, *, profile_prefix: Path | None = None, prepacking: bool = True, order: str = "PRIORITY_BASED"):
    """A CPU session at ORT_DISABLE_ALL in PRIORITY_BASED order (or ``order``).

    ``prepacking=False`` stops MatMul/Gemm/Conv from pre-packing constant weights: an offloaded
    weight reaches its consumer through MemcpyFromHost, is no longer constant and is never
    pre-packed, and the pre-packed kernels round differently (last bit). The original must then
    run without pre-packing too for its outputs to be comparable bit for bit.
    """
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.execution_order = getattr(ort.ExecutionOrder, order)
    so.log_severity_level = 3
    if not prepacking:
        so.add_session_config_entry("session.disable_prepacking", "1")
    if profile_prefix is not None:
        so.enable_profiling = True
        so.profile_file_prefix = str(profile_prefix)
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


@settings(PROPERTIES, max_examples=60)
@given(random_model=dag_models(), opts=plan_options)
def test_random_rewrites_check_run_identically_and_in_order(random_model: RandomModel, opts: dict) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        analysis = _analyse(random_model, folder)
        plan = scheduled_plan(analysis, PlanRequest.of_options(**opts))
        rewritten = apply_plan(plan, analysis, options=RewriteOptions(order_pins=False))  # the bare encoding
        event(f"offloads: {min(len(plan['offloads']), 3)}{'+' if len(plan['offloads']) >= 3 else ''}")
        event(f"weights offloaded: {any(o['kind'] == 'parameter' for o in plan['offloads'])}")
        event(f"nodes: {'<8' if analysis.num_positions < 8 else '8+'}")
        onnx.checker.check_model(rewritten, full_check=True)

        copies = [n for n in rewritten.graph.node if n.op_type in ("MemcpyToHost", "MemcpyFromHost")]
        activations = [o for o in plan["offloads"] if o["kind"] == "activation"]
        reloads = sum(len(o["reload_groups"]) for o in plan["offloads"])
        assert sum(n.op_type == "MemcpyToHost" for n in copies) == len(activations)
        h2d = sum(n.op_type == "MemcpyFromHost" for n in copies)
        assert reloads <= h2d <= reloads + sum(o["graph_output"] for o in activations)
        assert [o.name for o in rewritten.graph.output] == [o.name for o in random_model.model.graph.output]

        check_rewrite(analysis, plan, rewritten)

        out = folder / "model.offload.onnx"
        write_model(rewritten, out, source_dir=folder)
        prepacking = not any(o["kind"] == "parameter" for o in plan["offloads"])
        want = _session(folder / "model.onnx", prepacking=prepacking).run(None, random_model.feeds)
        session = _session(out, profile_prefix=folder / "profile", prepacking=prepacking)
        got = session.run(None, random_model.feeds)
        for w, g in zip(want, got, strict=True):
            assert w.dtype == g.dtype and w.shape == g.shape
            assert np.array_equal(w, g, equal_nan=True)

        events = json.loads(Path(session.end_profiling()).read_text())
        kernels = sorted(
            (e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")), key=lambda e: e["ts"]
        )
        ran = [e["name"][: -len("_kernel_time")] for e in kernels]
        assert ran == [n.name for n in rewritten.graph.node]


@settings(PROPERTIES, max_examples=40)
@given(random_model=dag_models(), opts=plan_options)
def test_random_pinned_rewrites_keep_the_plan_in_the_default_order(random_model: RandomModel, opts: dict) -> None:
    """With order pins (what apply writes): bit-identical outputs in both orders, the file order is the
    PRIORITY_BASED order, and every pinned copy runs on its side of its node in the DEFAULT order."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        analysis = _analyse(random_model, folder)
        plan = scheduled_plan(analysis, PlanRequest.of_options(**opts))
        rewritten = apply_plan(plan, analysis)
        onnx.checker.check_model(rewritten, full_check=True)
        out = folder / "model.offload.onnx"
        write_model(rewritten, out, source_dir=folder)
        prepacking = not any(o["kind"] == "parameter" for o in plan["offloads"])
        want = _session(folder / "model.onnx", prepacking=prepacking).run(None, random_model.feeds)
        for order, prefix in (("PRIORITY_BASED", "p"), ("DEFAULT", "d")):
            session = _session(out, profile_prefix=folder / prefix, prepacking=prepacking, order=order)
            got = session.run(None, random_model.feeds)
            for w, g in zip(want, got, strict=True):
                assert np.array_equal(w, g, equal_nan=True)
            events = json.loads(Path(session.end_profiling()).read_text())
            kernels = sorted(
                (e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")),
                key=lambda e: e["ts"],
            )
            ran = [e["name"][: -len("_kernel_time")] for e in kernels]
            if order == "PRIORITY_BASED":
                assert ran == [n.name for n in rewritten.graph.node]
            else:
                pins = json.loads(
                    dict((p.key, p.value) for p in rewritten.metadata_props).get("offloadctl.order_pins", "[]")
                )
                at = {name: k for k, name in enumerate(ran)}
                for c in pins:
                    if "before" in c:
                        assert at[c["copy"]] < at[c["before"]]
                    else:
                        assert at[c["copy"]] > at[c["after"]]


def test_the_strategy_covers_every_operator_and_reuse() -> None:
    """The generator is not degenerate: over a fixed sample it emits every operator, Split with several
    outputs, weights, reuse at a distance of several positions, and outputs from the middle."""
    seen_ops: set[str] = set()
    long_reuse = split_outputs = weights = middle_outputs = 0

    @settings(PROPERTIES, max_examples=60, database=None)
    @given(dag_models())
    def collect(random_model: RandomModel) -> None:
        nonlocal long_reuse, split_outputs, weights, middle_outputs
        graph = random_model.model.graph
        seen_ops.update(random_model.ops)
        produced_at = {out: k for k, node in enumerate(graph.node) for out in node.output}
        for k, node in enumerate(graph.node):
            long_reuse += any(k - produced_at.get(i, k) >= 3 for i in node.input)
            split_outputs += node.op_type == "Split" and len(node.output) >= 2
        weights += any(init.data_type == TensorProto.FLOAT for init in graph.initializer)
        read = {i for node in graph.node for i in node.input}
        middle_outputs += any(o.name in read for o in graph.output)

    collect()
    assert seen_ops == {"Add", "Mul", "Sub", "Relu", "Neg", "MatMul", "Concat", "Split"}
    assert long_reuse and split_outputs and weights and middle_outputs


@st.composite
def _sorted_graphs(draw) -> list[onnx.NodeProto]:
    """Nodes in a topological order: each reads graph inputs or earlier nodes' outputs; some are
    Shape/Size (onnxruntime runs a ready one first), some read a Shape's output."""
    count = draw(st.integers(min_value=1, max_value=40))
    nodes: list[onnx.NodeProto] = []
    made = ["x"]
    for i in range(count):
        op = draw(st.sampled_from(["Relu", "Add", "Shape", "Size", "Neg", "Concat"]))
        arity = {"Add": 2, "Concat": 3}.get(op, 1)
        inputs = [draw(st.sampled_from(made)) for _ in range(arity)]
        nodes.append(helper.make_node(op, inputs, [f"t{i}"], name=f"n{i}"))
        made.append(f"t{i}")
    return nodes


@given(_sorted_graphs())
def test_the_one_pass_priority_order_is_kahns(nodes):
    """`sorted_priority_order` (what apply orders a rewritten model by) gives what Kahn's algorithm
    over the graph's edges gives, for any topological order with Shape/Size nodes in it."""
    from offloadctl.analysis.order import execution_order, sorted_priority_order

    expected, _ = execution_order(nodes, {"x"})
    assert sorted_priority_order(nodes) == expected
    event(f"moved {sum(1 for k, i in enumerate(expected) if k != i) > 0}")
