"""Scale: the large-model generator, planning without weight bytes, and the fast paths of planning.

The benchmark itself (bench/bench_scale.py) measures time and memory; these tests check, on small
models and without timing, that what makes planning fast does not change its results: analysis
equals a plain re-statement of the PRIORITY_BASED order and of producers and uses, the compiled plan
check never accepts a plan jsonschema rejects, plan copies equal ``copy.deepcopy``, and planning
never reads the weights' data file.
"""

from __future__ import annotations

import builtins
import copy
import importlib.util
import io
import json
import os
import sys
from pathlib import Path

import jsonschema
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto

from offloadctl.analysis.graph import analyse
from offloadctl.contract import document as plan_module
from offloadctl.contract.document import dump_plan, plan_document, plan_schema, read_plan, validate_plan
from offloadctl.core.errors import OffloadError
from offloadctl.core.onnxutil import is_constant_node, subgraph_outer_names
from offloadctl.loading.model import load_model
from offloadctl.planning.make import scheduled_plan
from offloadctl.planning.request import PlanRequest

ROOT = Path(__file__).resolve().parent.parent


def _bench(name: str, *, register: bool = False):
    """The script ``bench/NAME.py`` as a module (``register``: also as ``sys.modules[NAME]``, for the
    scripts that import it)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    if register:
        sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


gen_large = _bench("gen_large", register=True)


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    folder = tmp_path_factory.mktemp("large")
    config = gen_large.LargeModelConfig(layers=6, hidden=8, nodes_per_layer=20, seq=4, fill="pattern")
    return gen_large.generate(folder / "model.onnx", config)


def test_generator_writes_a_checked_model_with_the_requested_size_and_external_weights(small_model):
    gen = small_model
    onnx.checker.check_model(str(gen.path))
    model = onnx.load(str(gen.path), load_external_data=False)
    assert model.ir_version == 10 and [(o.domain, o.version) for o in model.opset_import] == [("", 17)]
    assert len(model.graph.node) == gen.config.num_nodes == 2 + 6 * 20 == gen.num_nodes
    layers = {n.name.split("/")[0] for n in model.graph.node if n.name.startswith("layer")}
    assert layers == {f"layer{i}" for i in range(6)}
    for i in range(6):
        assert sum(n.name.startswith(f"layer{i}/") for n in model.graph.node) == 20
    assert model.graph.initializer and all(t.data_location == TensorProto.EXTERNAL for t in model.graph.initializer)
    assert not any(t.HasField("raw_data") for t in model.graph.initializer)
    assert gen.data_path.stat().st_size == gen.weight_bytes == gen.config.weight_bytes
    # The weights load back from the data file with the bytes written.
    full = onnx.load(str(gen.path))
    w = next(t for t in full.graph.initializer if t.name == "layer0/wq")
    assert list(w.dims) == [8, 8] and len(w.raw_data) == 8 * 8 * 4
    onnx.checker.check_model(full, full_check=True)


def test_generator_derives_layers_from_a_node_count(tmp_path):
    assert gen_large.layers_for_nodes(1000) == 59
    assert gen_large.LargeModelConfig(layers=59).num_nodes >= 1000
    with pytest.raises(ValueError):
        gen_large.LargeModelConfig(layers=2, nodes_per_layer=gen_large.BASE_NODES_PER_LAYER - 1)
    gen_large.main([str(tmp_path / "cli.onnx"), "--nodes", "60", "--hidden", "4", "--check"])
    assert len(onnx.load(str(tmp_path / "cli.onnx"), load_external_data=False).graph.node) == 70


def test_planning_a_generated_model_gives_a_schema_valid_plan(small_model):
    analysis = analyse(load_model(small_model.path))
    plan = scheduled_plan(analysis, PlanRequest.of_options(select_distance=10, params=True, prefetch_distance=3))
    validate_plan(plan)
    assert not list(jsonschema.Draft202012Validator(plan_schema()).iter_errors(plan_document(plan)))
    assert plan["offloads"], "the shared memory tensor and the weights have gaps over 10 positions"
    assert any(o["tensor"] == "embed/out" and o["kind"] == "activation" for o in plan["offloads"])
    assert json.loads(dump_plan(plan)) == plan_document(plan)


def test_planning_never_reads_the_weights_data_file(small_model, tmp_path, monkeypatch):
    # A copy of the model whose data file holds nothing: planning must not notice.
    model = tmp_path / "model.onnx"
    model.write_bytes(small_model.path.read_bytes())
    data = tmp_path / small_model.data_path.name
    data.write_bytes(b"")
    opened: list[str] = []
    real_open, real_io_open, real_os_open = builtins.open, io.open, os.open

    def spy(real):
        def wrapped(file, *args, **kwargs):
            if str(file).endswith(".data"):
                opened.append(str(file))
            return real(file, *args, **kwargs)

        return wrapped

    monkeypatch.setattr(builtins, "open", spy(real_open))
    monkeypatch.setattr(io, "open", spy(real_io_open))
    monkeypatch.setattr(os, "open", spy(real_os_open))
    plan = scheduled_plan(analyse(load_model(model)), PlanRequest.of_options(select_distance=10, params=True))
    monkeypatch.undo()
    assert opened == []
    reference = scheduled_plan(
        analyse(load_model(small_model.path)), PlanRequest.of_options(select_distance=10, params=True)
    )
    for key in ("offloads", "rejected"):
        assert plan[key] == reference[key]


def _reference_analysis(model: onnx.ModelProto):
    """Order, producers and uses computed the plain way: quadratic scans, no shortcuts."""
    graph = model.graph
    nodes = [(i, n) for i, n in enumerate(graph.node) if not is_constant_node(n)]
    available = {i.name for i in graph.input} | {t.name for t in graph.initializer}
    available |= {n.output[0] for n in graph.node if is_constant_node(n)}

    def reads(node):
        return [x for x in node.input if x] + sorted(subgraph_outer_names(node))

    done: set[str] = set(available)
    order: list[int] = []
    left = list(range(len(nodes)))
    while left:
        ready = [k for k in left if all(r in done for r in reads(nodes[k][1]))]
        pick = min(ready, key=lambda k: (0 if nodes[k][1].op_type in ("Shape", "Size") else 1, k))
        order.append(pick)
        left.remove(pick)
        done.update(nodes[pick][1].output)
    ordered = [nodes[k][1] for k in order]
    producer = {out: pos for pos, n in enumerate(ordered) for out in n.output if out}
    names = sorted({x for n in ordered for x in reads(n)})
    uses = {}
    for name in names:
        found = []
        for pos, n in enumerate(ordered):
            found += [(pos, k) for k, x in enumerate(n.input) if x == name]
            if name in subgraph_outer_names(n):
                found.append((pos, None))
        uses[name] = found
    return [nodes[k][0] for k in order], producer, uses


@pytest.mark.parametrize("shuffle", [False, True])
def test_analysis_equals_a_plain_reference(small_model, tmp_path, shuffle):
    model = onnx.load(str(small_model.path), load_external_data=False)
    if shuffle:  # not topologically sorted: analysis must sort it like onnxruntime
        reordered = list(model.graph.node)[::-1]
        del model.graph.node[:]
        model.graph.node.extend(reordered)
    path = tmp_path / "model.onnx"
    path.write_bytes(model.SerializeToString())
    (tmp_path / small_model.data_path.name).write_bytes(b"")
    analysis = analyse(load_model(path))
    file_index, producer, uses = _reference_analysis(model)
    assert analysis.file_index == file_index
    assert analysis.was_sorted is (not shuffle)
    assert analysis.producer == producer
    got = {name: [(u.position, u.input_index) for u in lst] for name, lst in analysis.uses.items()}
    assert got == uses
    assert analysis.attributed == [p for p, node in enumerate(analysis.nodes) if node.attribute]


def _sample_plans() -> list[dict]:
    plans = []
    for name in ("seed", "unet", "transformer", "training"):
        analysis = analyse(load_model(ROOT / "sample_models" / f"{name}.onnx"))
        plans.append(
            scheduled_plan(analysis, PlanRequest.of_options(select_distance=1, params=True, prefetch_distance=2))
        )
    return plans


SAMPLE_PLANS = _sample_plans()
SAMPLE_DOCUMENTS = [plan_document(p) for p in SAMPLE_PLANS]  # as their files hold them
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.floats(-2, 2) | st.sampled_from(["", "x", "activation"]),
    lambda children: (
        st.lists(children, max_size=2) | st.dictionaries(st.sampled_from(["a", "tensor"]), children, max_size=2)
    ),
    max_leaves=4,
)


def _paths(doc, prefix=()):
    yield prefix
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _paths(v, prefix + (i,))


def test_the_compiled_plan_check_covers_the_schema_and_accepts_valid_plans():
    check = plan_module._fast_check()
    for document in SAMPLE_DOCUMENTS:
        assert check(document)
        assert check(json.loads(json.dumps(document)))


@settings(max_examples=300, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_compiled_plan_check_never_accepts_what_jsonschema_rejects(data):
    plan = copy.deepcopy(data.draw(st.sampled_from(SAMPLE_DOCUMENTS)))
    paths = [p for p in _paths(plan) if p]
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(paths))
        parent = plan
        try:
            for key in path[:-1]:
                parent = parent[key]
            action = data.draw(st.sampled_from(["replace", "delete", "add"]))
            if action == "replace":
                parent[path[-1]] = data.draw(JSON_VALUES)
            elif action == "delete":
                del parent[path[-1]]
            elif isinstance(parent, dict):
                parent[data.draw(st.sampled_from(["extra", "tensor", "kind", "gap"]))] = data.draw(JSON_VALUES)
        except (KeyError, IndexError, TypeError):
            continue
    schema_valid = not list(jsonschema.Draft202012Validator(plan_schema()).iter_errors(plan))
    assert plan_module._fast_check()(plan) == schema_valid


ENTRY_VALUES = [
    None,
    True,
    False,
    0,
    -1,
    7,
    2.0,
    -2.0,
    2.5,
    float("nan"),
    float("inf"),
    1e300,
    "",
    "x",
    "select",
    "filter",
    "parameter",
    "activation",
    "short-gaps",
    "min-bytes",
    [],
    {},
    ["x"],
    {"tensor": "x"},
]


def test_the_check_of_the_rejected_table_agrees_with_jsonschema():
    """Every cell of a row set to every kind of value, removed, or joined by another; the row, the
    columns and a detail text replaced: the compiled check and jsonschema agree on each plan file."""
    base = next(d for d in SAMPLE_DOCUMENTS if d["rejected"]["rows"])
    validator = jsonschema.Draft202012Validator(plan_schema())
    check = plan_module._fast_check()
    row = base["rejected"]["rows"][0]
    changes = [("rows", 0, cell, value) for cell in range(len(row)) for value in ENTRY_VALUES]
    changes += [("rows", 0, cell, "delete") for cell in range(len(row))] + [("rows", 0, None, v) for v in ENTRY_VALUES]
    changes += [("rows", 0, "append", v) for v in ENTRY_VALUES] + [("details", 0, None, v) for v in ENTRY_VALUES]
    changes += [("columns", i, None, v) for i in (0, 6) for v in ENTRY_VALUES]
    changes += [("columns", None, None, v) for v in ENTRY_VALUES] + [("details", None, None, v) for v in ENTRY_VALUES]
    changes += [("rows", None, None, v) for v in ENTRY_VALUES] + [(None, None, None, v) for v in ENTRY_VALUES]
    verdicts = set()
    for part, item, cell, value in changes:
        table = copy.deepcopy(base["rejected"])
        if part is None:
            table = value
        elif item is None:
            table[part] = value
        elif cell is None:
            table[part][item] = value
        elif cell == "append":
            table[part][item].append(value)
        elif value == "delete":
            del table[part][item][cell]
        else:
            table[part][item][cell] = value
        plan = {**base, "rejected": table}
        valid = validator.is_valid(plan)
        assert check(plan) == valid, (part, item, cell, value)
        verdicts.add(valid)
    assert verdicts == {True, False}


def test_a_plans_rejected_entries_are_checked_by_entry_and_key():
    """A plan in memory holds its rejections as entries: a wrong one is named by its place and key."""
    base = next(p for p in SAMPLE_PLANS if p["rejected"])
    entry = base["rejected"][0]
    cases = [
        (dict(entry, reason="bogus"), "field rejected/0/reason"),
        (dict(entry, bytes=-1), "field rejected/0/bytes"),
        (dict(entry, detail=3), "field rejected/0/detail"),
        ({k: v for k, v in entry.items() if k != "stage"}, "field rejected/0: 'stage' is a required property"),
        (dict(entry, extra=1), "field rejected/0: Additional properties are not allowed"),
        ("x", "field rejected/0: 'x' is not of type 'object'"),
    ]
    for bad, message in cases:
        with pytest.raises(OffloadError, match=message):
            validate_plan({**base, "rejected": [bad, *base["rejected"][1:]]})
    validate_plan({**base, "rejected": [{k: v for k, v in entry.items() if k != "max_gap"}]})  # max_gap may be left out


def test_the_long_lists_have_their_own_checks_only_while_the_schema_ties_nothing_else_to_them():
    schema = plan_schema()
    plan_module._fast_check()  # compiling the rest of the schema leaves the shared schema as it is
    assert schema == json.loads((ROOT / "schemas" / "plan.schema.json").read_text(encoding="utf-8"))
    checks = plan_module._list_checks(schema)
    assert set(checks) == {"offloads", "rejected"}
    assert all(checks[key]([d[key]]) for d in SAMPLE_DOCUMENTS for key in checks)
    table, listed = plan_schema()["properties"]["rejected"]["oneOf"]
    assert table["type"] == "object" and listed["type"] == "array"
    rows = lambda s: s["properties"]["rejected"]["oneOf"][0]["properties"]["rows"]["items"]  # noqa: E731
    entry = lambda s: s["properties"]["rejected"]["oneOf"][1]["items"]  # noqa: E731
    for key, change in (
        ("rejected", lambda s: s["properties"]["rejected"]["oneOf"][0].update(minProperties=1)),
        ("rejected", lambda s: rows(s)["prefixItems"][0].update(maxLength=3)),
        ("rejected", lambda s: rows(s).update(items=True)),
        ("rejected", lambda s: rows(s).update(minItems=6)),
        ("rejected", lambda s: rows(s)["prefixItems"][2].update(type=["number"])),
        ("rejected", lambda s: s["properties"]["rejected"]["oneOf"][0]["properties"]["columns"].update(const=[1])),
        ("rejected", lambda s: entry(s)["properties"]["detail"].update(maxLength=3)),
        ("rejected", lambda s: entry(s).update(additionalProperties=True)),
        ("rejected", lambda s: s["properties"]["rejected"]["oneOf"].append({"type": "array"})),
        ("offloads", lambda s: s["$defs"]["offload"]["if"]["properties"]["reload_groups"].update(uniqueItems=True)),
        ("offloads", lambda s: s["$defs"]["offload"]["then"]["properties"]["graph_output"].update(const=1)),
        ("offloads", lambda s: s["$defs"]["offload"]["properties"]["producer"]["oneOf"].append({"type": "null"})),
        ("offloads", lambda s: s["$defs"]["use"]["properties"]["node"].update(pattern="^x")),
        ("offloads", lambda s: s["$defs"].update(use={"$ref": "#/$defs/use"})),
    ):
        other = copy.deepcopy(schema)
        change(other)
        assert set(plan_module._list_checks(other)) == {"offloads", "rejected"} - {key}, key
    other = copy.deepcopy(schema)
    other.update(allOf=[{"required": ["budget"]}])
    assert plan_module._list_checks(other) == {}


def test_the_check_of_the_offloads_agrees_with_jsonschema():
    """Every key of an offload, of its producer, of a reload group and of a use set to every kind of
    value, removed, or joined by another key; each of them replaced: the compiled check and
    jsonschema agree on each plan."""
    base = max(
        SAMPLE_DOCUMENTS,
        key=lambda p: sum(bool(o["device_uses"]) + (o["producer"] is not None) for o in p["offloads"]),
    )
    activation = next(i for i, o in enumerate(base["offloads"]) if o["producer"] is not None and o["device_uses"])
    validator = jsonschema.Draft202012Validator(plan_schema())
    check = plan_module._fast_check()
    places = [
        ("offloads", activation),
        ("offloads", activation, "producer"),
        ("offloads", activation, "reload_groups", 0),
        ("offloads", activation, "reload_groups", 0, "uses", 0),
        ("offloads", activation, "device_uses", 0),
    ]
    verdicts = set()
    for place in places:
        target = base
        for step in place:
            target = target[step]
        changes = [(key, value) for key in [*target, "extra"] for value in [*ENTRY_VALUES, [{}], [[]]]]
        changes += [(key, "delete") for key in target] + [(None, value) for value in ENTRY_VALUES]
        for key, value in changes:
            plan = copy.deepcopy(base)
            parent = plan
            for step in place[:-1]:
                parent = parent[step]
            if key is None:
                parent[place[-1]] = value
            elif value == "delete":
                del parent[place[-1]][key]
            else:
                parent[place[-1]][key] = value
            valid = validator.is_valid(plan)
            assert check(plan) == valid, (place, key, value)
            verdicts.add(valid)
    assert verdicts == {True, False}


def test_validating_a_valid_plan_does_not_run_jsonschema(monkeypatch):
    def refuse():
        raise AssertionError("jsonschema ran on a valid plan")

    monkeypatch.setattr(plan_module, "_validator", refuse)
    for plan in SAMPLE_PLANS:
        validate_plan(plan)


def test_plan_copies_equal_deepcopy_and_keep_shared_objects_shared():
    for plan in SAMPLE_PLANS:
        new = plan_module._copy_json(plan, {})
        assert new == copy.deepcopy(plan) and new is not plan
        assert new["options"]["select"] is new["history"][0]["options"]
        assert plan["options"]["select"] is plan["history"][0]["options"]
        new["offloads"][0]["tensor"] = "changed"
        assert plan["offloads"][0]["tensor"] != "changed"
    doc = {"t": (1, [2]), "s": {1, 2}}
    assert plan_module._copy_json(doc, {}) == copy.deepcopy(doc)


def test_write_plan_streams_exactly_the_dumped_text(tmp_path):
    gen = gen_large.generate(tmp_path / "m.onnx", gen_large.LargeModelConfig(layers=200, hidden=4, seq=2))
    plan = scheduled_plan(
        analyse(load_model(gen.path)), PlanRequest.of_options(select_distance=10, params=True, select_num=10**6)
    )
    text = dump_plan(plan)
    assert text.count("\n") > 1 << 16  # more pieces than one buffered write
    plan_module.write_plan(tmp_path / "plan.json", plan)
    assert (tmp_path / "plan.json").read_text(encoding="utf-8") == text
    assert json.loads(text) == plan_document(plan)
    assert read_plan(tmp_path / "plan.json") == plan


def test_plan_text_writes_one_line_per_rejected_row_whatever_the_names(tmp_path):
    plan = copy.deepcopy(SAMPLE_PLANS[1])
    tricky = ['a], ["b', '], ["', 'q"uote', "back\\slash\\", "new\nline", "ünï", "", 'x], ["tensor", "y']
    template = plan["rejected"][0]
    plan["rejected"] = [dict(template, tensor=name, detail=name) for name in tricky] + plan["rejected"]
    text = dump_plan(plan)
    document = plan_document(plan)
    assert json.loads(text) == document
    (tmp_path / "plan.json").write_text(text, encoding="utf-8")
    assert read_plan(tmp_path / "plan.json") == plan
    lines = text.splitlines()
    start = lines.index('  "rows": [')
    rows = document["rejected"]["rows"]
    listed = lines[start + 1 : start + 1 + len(rows)]
    assert [json.loads(line.strip().rstrip(",")) for line in listed] == rows
    assert lines[start + 1 + len(rows)] == "  ]"
    start = lines.index('  "details": [')
    details = document["rejected"]["details"]
    assert [json.loads(line.strip().rstrip(",")) for line in lines[start + 1 : start + 1 + len(details)]] == details
    assert len(details) < len(rows)  # a text the rows share is written once


def test_tensor_infos_do_not_depend_on_lookup_order_and_weights_need_no_inference(small_model, monkeypatch):
    reference = analyse(load_model(small_model.path))
    everything = {name: reference.infos[name] for name in reference.infos}
    assert set(everything) >= set(reference.producer) | reference.weights

    analysis = analyse(load_model(small_model.path))

    def refuse(*args, **kwargs):
        raise AssertionError("shape inference ran for a weight lookup")

    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", refuse)
    for name in sorted(analysis.weights, reverse=True):
        assert analysis.infos[name] == everything[name]
    monkeypatch.undo()
    for name in sorted(analysis.producer, reverse=True):
        assert analysis.infos.get(name) == everything[name]
    assert analysis.infos.get("no such tensor") is None and "no such tensor" not in analysis.infos
    with pytest.raises(KeyError):
        analysis.infos["no such tensor"]


def test_the_plan_schema_is_a_valid_draft_2020_12_schema():
    schema = plan_schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)


def test_apply_walks_the_models_tensors_once_and_its_output_reads_the_same_data_files(
    small_model, tmp_path, run_cli, monkeypatch
):
    from offloadctl.loading import model as model_module
    from offloadctl.rewriting.writing import external_locations

    plan = tmp_path / "plan.json"
    assert run_cli("plan", small_model.path, "-o", plan, "--params", "--select-distance", "10").exit_code == 0
    walks: list[int] = []
    real = model_module.iter_tensor_protos

    def counted(graph):
        walks.append(1)
        return real(graph)

    monkeypatch.setattr(model_module, "iter_tensor_protos", counted)
    out = tmp_path / "elsewhere" / "model.offload.onnx"
    out.parent.mkdir()
    assert run_cli("apply", plan, "-o", out).exit_code == 0
    assert len(walks) == 1, "loading lists the data files; checking and writing the output reuse that list"
    monkeypatch.undo()
    loaded = load_model(small_model.path)
    rewritten = onnx.load(str(out), load_external_data=False)
    assert loaded.data_locations == (small_model.data_path.name,)
    assert tuple(external_locations(rewritten)) == loaded.data_locations == tuple(external_locations(loaded.proto))
    assert (out.parent / small_model.data_path.name).read_bytes() == small_model.data_path.read_bytes()
    onnx.checker.check_model(onnx.load(str(out)), full_check=True)  # the weights load from the copied file


def test_write_model_given_the_locations_writes_what_it_writes_without_them(small_model, tmp_path):
    from offloadctl.rewriting.rewrite import apply_plan
    from offloadctl.rewriting.writing import write_model

    analysis = analyse(load_model(small_model.path))
    proto = apply_plan(scheduled_plan(analysis, PlanRequest.of_options(select_distance=10, params=True)), analysis)
    written = {}
    for name, locations in (("looked-up", None), ("given", analysis.loaded.data_locations)):
        out = tmp_path / name / "out.onnx"
        out.parent.mkdir()
        files = write_model(proto, out, source_dir=small_model.path.parent, locations=locations)
        written[name] = ([f.name for f in files], out.read_bytes())
    assert written["given"] == written["looked-up"]
    assert written["given"][0] == [small_model.data_path.name]


def _all_names(analysis) -> list[str]:
    return list(dict.fromkeys([*analysis.graph_inputs, *analysis.producer, *sorted(analysis.weights)]))


@pytest.mark.parametrize("name", ["generated", "seed", "unet", "transformer", "training", "mlp"])
def test_converting_every_tensor_at_once_gives_what_lookups_give(small_model, name):
    path = small_model.path if name == "generated" else ROOT / "sample_models" / f"{name}.onnx"
    looked_up = analyse(load_model(path))
    reference = {n: looked_up.infos.get(n) for n in reversed(_all_names(looked_up))}
    converted = analyse(load_model(path))
    left = converted.infos.convert(_all_names(converted))
    assert {n: converted.infos.get(n) for n in _all_names(converted)} == reference
    # what it converted has a known size; what it left keeps the callers' order
    assert all(reference[n] is not None and reference[n].bytes is not None for n in set(reference) - set(left))
    assert left == [n for n in _all_names(converted) if n in set(left)]
    assert set(converted.infos) == set(looked_up.infos)


def test_converting_at_once_refuses_nothing_that_is_not_looked_up(tmp_path):
    from offloadctl.core.errors import OffloadError

    from models import IR_VERSION, OPSET

    # a = Relu(x) is 2**60 elements: absurd, refused when looked up, never while converting
    nodes = [
        onnx.helper.make_node("Relu", ["x"], ["a"], name="relu"),
        onnx.helper.make_node("ReduceSum", ["a"], ["y"], name="sum", keepdims=0),
    ]
    x = onnx.helper.make_tensor_value_info("x", TensorProto.FLOAT, [2**30, 2**30])
    y = onnx.helper.make_tensor_value_info("y", TensorProto.FLOAT, [])
    graph = onnx.helper.make_graph(nodes, "g", [x], [y])
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    onnx.save(model, str(tmp_path / "m.onnx"))
    analysis = analyse(load_model(tmp_path / "m.onnx"))
    analysis.infos.convert(["x", "a", "y"])
    assert analysis.infos.get("y").bytes == 4
    with pytest.raises(OffloadError, match="more than any device holds"):
        analysis.infos.get("a")


def test_the_producer_map_finds_the_same_stale_declarations_as_a_walk_over_every_node(tmp_path):
    """Declared shapes that shape inference must not see are found through analyse's map of
    producers; a walk over every node (tensor_infos without it) finds the same ones."""
    from offloadctl.loading.tensors import tensor_infos

    from models import IR_VERSION, OPSET, chain_nodes

    nodes = chain_nodes() + [onnx.helper.make_node("Custom", ["y"], ["z"], domain="my.ops", name="custom")]
    x = onnx.helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])
    outputs = [onnx.helper.make_tensor_value_info(n, TensorProto.FLOAT, [9, 9]) for n in ("y", "z")]
    stale = [onnx.helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 2]) for n in ("a", "c")]
    graph = onnx.helper.make_graph(nodes, "g", [x], outputs, value_info=stale)
    model = onnx.helper.make_model(
        graph, opset_imports=[onnx.helper.make_opsetid("", OPSET), onnx.helper.make_opsetid("my.ops", 1)]
    )
    model.ir_version = IR_VERSION
    onnx.save(model, str(tmp_path / "m.onnx"))
    loaded = load_model(tmp_path / "m.onnx")
    analysis = analyse(loaded)
    walked = tensor_infos(loaded)
    sizes = {n: analysis.infos[n].bytes for n in "abcdyz"}
    assert sizes == {n: walked[n].bytes for n in "abcdyz"}
    assert sizes == {"a": 128, "b": 128, "c": 128, "d": 128, "y": 128, "z": 9 * 9 * 4}


@pytest.mark.parametrize(
    "name", ["plain", "caf\u00e9", "\u4e2d\u6587", "tab\there", "ctl\x01", "back\\u00e9slash", "\u2028"]
)
def test_the_plan_hash_is_that_of_the_canonical_utf8_text_whatever_the_names(name):
    import hashlib

    from offloadctl.rewriting.metadata import plan_sha256

    plan = copy.deepcopy(SAMPLE_PLANS[0])
    plan["model"]["path"] = f"models/{name}.onnx"
    followed = {key: value for key, value in plan.items() if key != "rejected"}
    text = json.dumps(followed, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert plan_sha256(plan) == hashlib.sha256(text.encode("utf-8")).hexdigest()
    # the rejected list does not count; what the rewrite follows does
    plan["rejected"].append({**plan["rejected"][0], "tensor": name, "detail": f"detail of {name}"})
    assert plan_sha256(plan) == hashlib.sha256(text.encode("utf-8")).hexdigest()
    plan["model"]["path"] += "x"
    assert plan_sha256(plan) != hashlib.sha256(text.encode("utf-8")).hexdigest()


def test_a_pause_of_the_collector_nests_and_restores_it():
    import gc

    from offloadctl.core.bulk import paused_gc

    assert gc.isenabled()
    with paused_gc():
        assert not gc.isenabled()
        with paused_gc():
            assert not gc.isenabled()
        assert not gc.isenabled(), "only the outermost pause switches the collector back on"
    assert gc.isenabled()

    @paused_gc()
    def build() -> bool:
        return gc.isenabled()

    assert build() is False and gc.isenabled()
    gc.disable()
    try:
        with paused_gc():
            pass
        assert not gc.isenabled(), "a collector that was off stays off"
    finally:
        gc.enable()
    with pytest.raises(ValueError):
        with paused_gc():
            raise ValueError
    assert gc.isenabled()


_FREEZES = """
import gc, sys
import offloadctl.core.bulk as bulk
from offloadctl._entry import main
with bulk.paused_gc():
    kept = [[i] for i in range(1000)]
library = gc.get_freeze_count()
try:
    main(sys.argv[1:])
except SystemExit:
    pass
with bulk.paused_gc():
    built = [[i] for i in range(1000)]
print(library, gc.get_freeze_count() >= 1000 + len(built))
"""


def test_only_the_console_script_keeps_what_it_builds_from_later_collections(tmp_path):
    import subprocess

    script = tmp_path / "freezes.py"
    script.write_text(_FREEZES)
    done = subprocess.run([sys.executable, str(script), "--version"], capture_output=True, text=True, check=True)
    assert done.stdout.split()[-2:] == ["0", "True"]


def test_apply_of_a_weights_only_plan_runs_no_shape_inference(small_model, tmp_path, run_cli, monkeypatch):
    plan = tmp_path / "plan.json"
    args = ("--params", "--no-activations", "--select-distance", "10")
    assert run_cli("plan", small_model.path, "-o", plan, *args).exit_code == 0
    assert {o["kind"] for o in json.loads(plan.read_text())["offloads"]} == {"parameter"}

    def refuse(*args, **kwargs):
        raise AssertionError("shape inference ran")

    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", refuse)
    result = run_cli("apply", plan, "-o", tmp_path / "out.onnx")
    assert result.exit_code == 0, result.stderr


def _load_bench_scale():
    return _bench("bench_scale")


def test_bench_scale_against_refuses_a_revision_the_checkout_does_not_have(capsys):
    bench = _load_bench_scale()
    with pytest.raises(SystemExit) as exc:
        bench.main(["--quick", "--against", "no-such-revision-here"])
    message = str(exc.value)
    assert "--against no-such-revision-here" in message and "not a commit" in message
    assert "give a commit, tag or branch" in message


def test_bench_scale_against_extracts_the_revision_tree_and_compares_the_same_rounds(tmp_path):
    bench = _load_bench_scale()
    tree, commit = bench._revision_tree(tmp_path, "HEAD")
    assert len(commit) == 40 and tree.parent == tmp_path
    assert (tree / "offloadctl" / "__init__.py").is_file() and (tree / "schemas" / "plan.schema.json").is_file()
    rounds = [{"seconds": 3.0, "cpu_seconds": 2.5, "peak": 7}, {"seconds": 3.5, "cpu_seconds": 2.0, "peak": 8}]
    fastest = bench._fastest(rounds)  # the fastest round, with the least CPU time of all rounds
    assert fastest == {"seconds": 3.0, "cpu_seconds": 2.0, "peak": 7}
    row = {
        "floor": {"seconds": 2.0},
        "plan_cli": fastest,
        "apply": {"seconds": 1.0, "cpu_seconds": 1.0},
        "against_plan_cli": {"seconds": 6.0, "cpu_seconds": 2.0},
        "against_apply": {"seconds": 2.0, "cpu_seconds": 2.0},
    }
    figures = bench._against_figures(row)  # a row without the budget path: its figures are left out
    assert figures["plan_cli_ratio"] == 0.5 and figures["apply_ratio"] == 0.5
    assert figures["plan_cli_cpu_ratio"] == 1.0 and figures["apply_cpu_ratio"] == 0.5
    assert figures["both_ratio"] == 0.5 and figures["both_cpu_ratio"] == 0.75
    assert figures["plan_cli_plus_apply_over_floor"] == 4.0
    assert "budget_both_ratio" not in figures
    row |= {
        "plan_budget": {"seconds": 4.0, "cpu_seconds": 4.0},
        "apply_budget": {"seconds": 4.0, "cpu_seconds": 2.0},
        "against_plan_budget": {"seconds": 4.0, "cpu_seconds": 2.0},
        "against_apply_budget": {"seconds": 2.0, "cpu_seconds": 2.0},
    }
    figures = bench._against_figures(row)
    assert figures["plan_budget_ratio"] == 1.0 and figures["apply_budget_ratio"] == 2.0
    assert figures["budget_both_ratio"] == 8.0 / 6.0 and figures["budget_both_cpu_ratio"] == 1.5
    assert figures["plan_budget_plus_apply_over_floor"] == 3.0 and figures["both_ratio"] == 0.5
    assert "both_paired_cpu_ratios" not in figures  # no rounds kept

    # the rounds kept: each round's path ratio, the two sides of that round (CPU time), sorted
    def runs(*cpu):
        return [{"seconds": c, "cpu_seconds": c, "peak": 1} for c in cpu]

    row["rounds"] = {
        "plan_cli": runs(2.0, 3.0, 1.0),
        "apply": runs(1.0, 1.0, 1.0),
        "against_plan_cli": runs(2.0, 1.0, 3.0),
        "against_apply": runs(1.0, 1.0, 1.0),
        "plan_budget": runs(1.0, 1.0, 1.0),
        "apply_budget": runs(1.0, 1.0, 1.0),
        "against_plan_budget": runs(3.0, 1.0, 1.0),
        "against_apply_budget": runs(1.0, 1.0, 1.0),
    }
    figures = bench._against_figures(row)
    assert figures["both_paired_cpu_ratios"] == [0.5, 1.0, 2.0]
    assert figures["budget_both_paired_cpu_ratios"] == [0.5, 1.0, 1.0]


def test_plan_file_writes_both_forms_of_the_same_plan_and_the_table_is_smaller(tmp_path):
    bench = _bench("plan_file")
    model = gen_large.generate(tmp_path / "model.onnx", gen_large.LargeModelConfig(layers=6, hidden=8)).path
    work = tmp_path / "work"
    work.mkdir()
    result = bench.measure(model, work, repeat=1)  # it checks that both files read back as the same plan
    forms = result["forms"]
    assert result["rejected"] > 100 and set(forms) == {"table", "entries"}
    assert forms["table"]["bytes"] < forms["entries"]["bytes"]
    assert all(f["write_s"] > 0 and f["read_s"] > 0 for f in forms.values())
    entries = json.loads((work / "entries.json").read_text())
    assert entries["schema_version"] == 1 and len(entries["rejected"]) == result["rejected"]  # one object each


def test_plan_phases_times_the_next_steps_parts_and_puts_the_planner_back(tmp_path):
    phases = _bench("plan_phases")
    # six plain layers: the distance plan lowers the peak by 2.3%, so the command makes a next step
    model = gen_large.generate(tmp_path / "model.onnx", gen_large.LargeModelConfig(layers=6, hidden=8)).path
    before = {name: getattr(holder, name) for _, holder, name in phases.NEXT_STEP_PARTS}
    marks = phases.phases(model, tmp_path / "plan.json")
    labels = [what for what, _ in marks]
    parts = [f"  {label}" for label, _, _ in phases.NEXT_STEP_PARTS]
    assert labels == ["load and analyse", "distance plan", "verdict simulation", "write the plan", "next step", *parts]
    seconds = dict(marks)
    assert all(s >= 0 for s in seconds.values())
    # the generated model's distance plan is weak, so the next step ran its budget planner inside the timers
    assert seconds["  selection"] > 0 and seconds["  search"] > 0 and seconds["  simulating it"] > 0
    assert sum(seconds[p] for p in parts) <= seconds["next step"]
    assert {name: getattr(holder, name) for _, holder, name in phases.NEXT_STEP_PARTS} == before


_SCALAR_SCHEMAS = st.one_of(
    st.fixed_dictionaries(
        {"type": st.sampled_from(["string", "integer", "null", "boolean", ["integer", "null"], ["string", "null"]])},
        optional={"minimum": st.integers(-1, 2), "minLength": st.integers(0, 2)},
    ),
    st.fixed_dictionaries({"enum": st.lists(st.sampled_from(["", "a", "ab"]), min_size=1, max_size=2, unique=True)}),
    st.fixed_dictionaries({"const": st.sampled_from([True, False, None, "a"])}),
    st.fixed_dictionaries({"const": st.sampled_from([["a"], ["a", "ab"], []])}),
)


def _column_schemas(children):
    keys = st.sampled_from(["a", "b", "c"])
    objects = st.dictionaries(keys, children, max_size=3).flatmap(
        lambda props: st.fixed_dictionaries(
            {
                "type": st.just("object"),
                "additionalProperties": st.just(False),
                "properties": st.just(props),
                "required": st.lists(st.sampled_from(sorted(props) or ["a"]), unique=True).map(
                    lambda req: [k for k in req if k in props]
                ),
            },
            optional={"description": st.just("a note")},
        )
    )
    # an object whose "a" is an array, and whose other keys must meet more when "a" is empty
    listed = objects.map(
        lambda obj: {**obj, "properties": {**obj["properties"], "a": {"type": "array", "items": {"type": "integer"}}}}
    )
    bounded = objects | listed.flatmap(
        lambda obj: st.fixed_dictionaries(
            {
                "if": st.just({"properties": {"a": {"maxItems": 0}}}),
                "then": st.fixed_dictionaries(
                    {
                        "properties": st.dictionaries(
                            st.sampled_from(sorted(obj["properties"])), _SCALAR_SCHEMAS, max_size=2
                        )
                    },
                    optional={"description": st.just("a note")},
                ),
            }
        ).map(lambda extra: {**obj, **extra})
    )
    arrays = st.fixed_dictionaries(
        {"type": st.just("array"), "items": children}, optional={"minItems": st.integers(0, 2)}
    )
    null_or_object = objects.map(lambda obj: {"oneOf": [{"type": "null"}, obj]})
    # rows of a table: arrays of exactly as many cells as the schema lists
    rows = st.lists(children, min_size=1, max_size=3).map(
        lambda cells: {"type": "array", "prefixItems": cells, "items": False, "minItems": len(cells)}
    )
    return bounded | arrays | null_or_object | rows


COLUMN_SCHEMAS = st.recursive(_SCALAR_SCHEMAS, _column_schemas, max_leaves=5)
COLUMN_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-2, 3)
    | st.sampled_from([0.0, 1.0, 1.5, -1.0])
    | st.sampled_from(["", "a", "ab"]),
    lambda children: (
        st.lists(children, max_size=2) | st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), children, max_size=3)
    ),
    max_leaves=6,
)


_SCALARS = [None, True, False, 0, 1, 2, -1, 0.0, 1.0, 1.5, -1.0, "", "a", "ab", [], {}]


def _near(schema):
    """Values close to ``schema``: most meet it or miss it by one value, some are anything at all."""
    if "oneOf" in schema:
        inner = st.one_of(*[_near(branch) for branch in schema["oneOf"]])
    elif schema.get("type") == "object":
        props, then = schema["properties"], schema.get("then", {}).get("properties", {})

        def value(key):
            return st.one_of(_near(props[key]), *([_near(then[key])] if key in then else []))

        inner = st.fixed_dictionaries(
            {k: value(k) for k in schema["required"]},
            optional={k: value(k) for k in props if k not in schema["required"]},
        )
    elif schema.get("type") == "array" and "prefixItems" in schema:
        cells = [_near(cell) for cell in schema["prefixItems"]]
        inner = st.tuples(*cells).map(list) | st.tuples(*cells[:-1]).map(list) | st.tuples(*cells, *cells[:1]).map(list)
    elif schema.get("type") == "array":
        inner = st.lists(_near(schema["items"]), max_size=3)
    elif "const" in schema and isinstance(schema["const"], list):
        inner = st.sampled_from([schema["const"], schema["const"][:-1], [*schema["const"], "a"], [1], "a"])
    else:
        inner = st.sampled_from(_SCALARS)
    return st.one_of(inner, inner, inner, COLUMN_VALUES)


@settings(max_examples=500, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), schema=COLUMN_SCHEMAS)
def test_a_column_check_agrees_with_jsonschema_on_every_form_it_compiles(data, schema):
    """`offloadctl.contract.columns.column_check` says "every value meets the schema" exactly when
    jsonschema finds no error in any of them, for schemas built from the forms it understands."""
    from offloadctl.contract.columns import column_check

    check = column_check(schema, {})
    assert check is not None, schema
    validator = jsonschema.Draft202012Validator(schema)
    values = data.draw(st.lists(_near(schema), min_size=1, max_size=4))
    assert check(values) == all(validator.is_valid(v) for v in values), (schema, values)


@pytest.mark.parametrize(
    "rule",
    [
        {"type": kind, **extra}
        for kind in ("string", "integer", "null", "boolean", ["integer", "null"], ["string", "null"])
        for extra in ({}, {"minimum": 0}, {"minimum": 1}, {"minLength": 1}, {"minimum": 1, "minLength": 2})
    ]
    + [{"enum": ["a"]}, {"enum": ["", "ab"]}, {"type": ["string", "null"], "enum": ["a"]}]
    + [{"const": c} for c in (True, False, None, "a")]
    + [{"type": "integer", "const": True}],
)
def test_a_column_check_of_scalars_agrees_with_jsonschema_value_by_value_and_pair_by_pair(rule):
    from offloadctl.contract.columns import column_check

    check = column_check(rule, {})
    assert check is not None
    valid = {i: jsonschema.Draft202012Validator(rule).is_valid(v) for i, v in enumerate(_SCALARS)}
    for i, a in enumerate(_SCALARS):
        assert check([a]) == valid[i], (rule, a)
        for j, b in enumerate(_SCALARS):
            assert check([a, b]) == (valid[i] and valid[j]), (rule, a, b)


def test_a_column_check_applies_then_exactly_where_if_holds():
    from offloadctl.contract.columns import column_check

    schema = {
        "type": "object",
        "required": ["a"],
        "additionalProperties": False,
        "properties": {"a": {"type": "array", "items": {"type": "integer"}}, "b": {"type": ["integer", "boolean"]}},
        "if": {"properties": {"a": {"maxItems": 0}}},
        "then": {"properties": {"b": {"const": True}}},
    }
    check = column_check(schema, {})
    validator = jsonschema.Draft202012Validator(schema)
    values = [{"a": a, **b} for a in ([], [1], [1, 2]) for b in ({}, {"b": True}, {"b": False}, {"b": 1}, {"b": 0})]
    verdicts = {validator.is_valid(v) for v in values}
    assert verdicts == {True, False}
    for value in values:
        assert check([value]) == validator.is_valid(value), value
        assert check([{"a": [3]}, value]) == validator.is_valid(value), value


def test_what_if_drops_the_next_step_and_the_rejected_list_only_in_its_what_ifs(tmp_path):
    what_if = _bench("what_if")
    # at 3,000 nodes the distance plan lowers the peak by under 5%, so the command gives a next step
    config = gen_large.LargeModelConfig(layers=gen_large.layers_for_nodes(3000), hidden=8)
    model = gen_large.generate(tmp_path / "model.onnx", config).path
    result = what_if.measure(model, 1, what_if.Console(file=io.StringIO()))
    assert {task: len(runs) for task, runs in result["runs_s"].items()} == dict.fromkeys(what_if.TASKS, 1)
    assert all(seconds > 0 for runs in result["runs_s"].values() for seconds in runs)
    assert result["rejected_entries"] > 0 and result["rejected_entries_what_if"] == 0
    given = result["next_step_given"]
    assert given["plan-no-next-step"] is False and given["plan-no-rejected"] is False
    assert given["plan"] is True
    floor = result["fastest"]["floor_s"]
    rows = {row["path"]: row for row in result["fastest"]["paths"]}
    assert list(rows) == [path for path, _, _ in what_if.PATHS]
    for row in rows.values():
        assert row["over_floor"] == (row["plan_s"] + row["apply_s"]) / floor
    assert rows["as it is"]["apply_s"] == rows["without the weak plan's next step"]["apply_s"]


def _twice(x: int) -> int:
    return 2 * x


def _fails(x: int) -> int:
    raise ValueError(x)


def test_work_ahead_hands_back_the_result_or_nothing_and_stops_a_child_it_does_not_read():
    from offloadctl.core.ahead import Ahead

    done = Ahead.start(_twice, 21)
    assert done is not None and done.result() == 42
    assert done.result() is None  # read once
    failed = Ahead.start(_fails, 1)  # the caller works inline then, with the error raised to it
    assert failed is not None and failed.result() is None
    dropped = Ahead.start(os.kill, os.getpid(), 0)
    assert dropped is not None
    pid = dropped._pid
    dropped.cancel()
    with pytest.raises(ProcessLookupError):  # killed and collected: nothing left of it
        os.kill(pid, 0)
    assert dropped.result() is None


def test_work_ahead_writes_no_warning_or_log_line_of_the_child(tmp_path):
    """In a process of its own (no test harness catching warnings), a child that warns and logs
    delivers its result and leaves the process's stderr as it was: the caller warns and logs for it."""
    import subprocess

    script = (
        "import logging, warnings\n"
        "from offloadctl.core.ahead import Ahead\n"
        "def noisy(x):\n"
        "    warnings.warn('a warning from the child', RuntimeWarning)\n"
        "    logging.getLogger('offloadctl').warning('a log line from the child')\n"
        "    return x + 1\n"
        "print(Ahead.start(noisy, 1).result())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.stdout.strip() == "2" and "from the child" not in done.stderr


def test_work_ahead_delivers_where_the_host_process_has_its_children_collected_for_it():
    import signal

    from offloadctl.core.ahead import Ahead

    previous = signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # as some servers set it: waitpid finds no child
    try:
        done = Ahead.start(_twice, 5)
        assert done is not None and done.result() == 10
        failed = Ahead.start(_fails, 5)
        assert failed is not None and failed.result() is None
    finally:
        signal.signal(signal.SIGCHLD, previous)


def test_work_ahead_is_not_forked_where_fork_is_not_safe(monkeypatch):
    from offloadctl.core.ahead import Ahead

    monkeypatch.setattr(sys, "platform", "darwin")
    assert Ahead.start(_twice, 1) is None


def test_work_ahead_that_the_system_refuses_a_child_leaves_the_work_to_the_caller(small_model, monkeypatch):
    import errno

    from offloadctl.core.ahead import Ahead
    from offloadctl.loading import inference

    def refuse():
        raise OSError(errno.ENOMEM, "Cannot allocate memory")

    opened = []
    real_pipe = os.pipe
    monkeypatch.setattr(os, "pipe", lambda: opened.extend(real_pipe()) or tuple(opened[-2:]))
    monkeypatch.setattr(os, "fork", refuse)
    assert Ahead.start(_twice, 1) is None
    for fd in opened:  # the pipe went with the refused child
        with pytest.raises(OSError):
            os.fstat(fd)
    monkeypatch.setattr(inference, "AHEAD_MIN_NODES", 0)
    analysis = analyse(load_model(small_model.path), infer_ahead=True)  # infers in the process instead
    assert all(analysis.infos.get(name) is not None for name in analysis.producer)


@pytest.mark.parametrize("name", ["generated", "shuffled", "seed", "unet", "transformer", "training", "mlp"])
def test_shape_inference_ahead_gives_what_inference_in_the_process_gives(small_model, tmp_path, name, monkeypatch):
    from offloadctl.core.ahead import Ahead
    from offloadctl.loading import inference, tensors

    path = small_model.path if name in ("generated", "shuffled") else ROOT / "sample_models" / f"{name}.onnx"
    if name == "shuffled":  # nodes out of order: inference runs on the sorted copy in the process
        model = onnx.load(str(path), load_external_data=False)
        reordered = list(model.graph.node)[::-1]
        del model.graph.node[:]
        model.graph.node.extend(reordered)
        path = tmp_path / "shuffled.onnx"
        onnx.save(model, str(path))
        (tmp_path / small_model.data_path.name).write_bytes(b"")  # shapes need no weight bytes
    reference = analyse(load_model(path))
    expected = {n: reference.infos.get(n) for n in _all_names(reference)}
    monkeypatch.setattr(inference, "AHEAD_MIN_NODES", 0)
    cancelled = []
    real_cancel = Ahead.cancel
    monkeypatch.setattr(Ahead, "cancel", lambda self: cancelled.append(self) or real_cancel(self))
    ahead = analyse(load_model(path), infer_ahead=True)
    in_process = []
    real_run = tensors.TensorInfos._run_inference
    monkeypatch.setattr(tensors.TensorInfos, "_run_inference", lambda self: in_process.append(1) or real_run(self))
    assert {n: ahead.infos.get(n) for n in _all_names(ahead)} == expected
    assert set(ahead.infos) == set(reference.infos)
    # the child's inference was used, except for a file whose order is not the one inference walks
    assert (in_process, len(cancelled)) == (([1], 1) if name == "shuffled" else ([], 0))


def test_load_model_starts_the_inference_that_the_analysis_takes(small_model, monkeypatch):
    """``load_model(infer_ahead=True)`` starts the child as soon as the graph is final; the analysis of
    that model takes its types (no inference in the process), and a copy with another proto has none."""
    import dataclasses

    from offloadctl.loading import inference, tensors

    reference = analyse(load_model(small_model.path))
    expected = {n: reference.infos.get(n) for n in _all_names(reference)}
    monkeypatch.setattr(inference, "AHEAD_MIN_NODES", 0)
    loaded = load_model(small_model.path, infer_ahead=True)
    assert loaded.inference is not None and load_model(small_model.path).inference is None
    in_process = []
    real_run = tensors.TensorInfos._run_inference
    monkeypatch.setattr(tensors.TensorInfos, "_run_inference", lambda self: in_process.append(1) or real_run(self))
    analysis = analyse(loaded)
    assert {n: analysis.infos.get(n) for n in _all_names(analysis)} == expected
    assert in_process == []
    other = dataclasses.replace(loaded, proto=onnx.ModelProto())
    assert other.inference is None and other.path == loaded.path


def test_a_command_derives_what_the_graph_decides_while_the_sizes_are_inferred(small_model, monkeypatch):
    """With shape inference in its child, opening a model also derives the simulation's tensor ids and
    the select stage's candidates (no size needed), before any size is read; without a child, nothing."""
    import numpy as np

    from offloadctl.job import Job
    from offloadctl.loading import inference
    from offloadctl.planning.select import _candidate_uses, candidate_uses
    from offloadctl.simulation.base import _plain_ids, plain_ids

    monkeypatch.setattr(inference, "AHEAD_MIN_NODES", 0)
    analysis = Job.of_model(small_model.path, infer_ahead=True).analysis
    assert analysis.loaded.inference is not None and analysis.loaded.inference.unread  # no size read yet
    assert {"simulation ids", "select candidates"} <= set(analysis.derived)
    assert plain_ids(analysis) == _plain_ids(analysis)
    (acts, weights, arrays), (acts2, weights2, arrays2) = candidate_uses(analysis), _candidate_uses(analysis)
    assert (acts, weights) == (acts2, weights2) and all(map(np.array_equal, arrays, arrays2))
    monkeypatch.setattr(inference, "AHEAD_MIN_NODES", 10**9)
    assert not Job.of_model(small_model.path, infer_ahead=True).analysis.derived


def test_shape_inference_that_fails_ahead_fails_again_in_the_process_and_says_so_once(small_model, monkeypatch, caplog):
    from offloadctl.loading import inference

    monkeypatch.setattr(inference, "AHEAD_MIN_NODES", 0)

    def refuse(*args, **kwargs):
        raise RuntimeError("no inference today")

    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", refuse)
    analysis = analyse(load_model(small_model.path), infer_ahead=True)
    with caplog.at_level("WARNING"):
        name = next(iter(analysis.producer))
        analysis.infos.get(name)
    failures = [r for r in caplog.records if "shape inference failed" in r.getMessage()]
    assert len(failures) == 1 and "no inference today" in failures[0].getMessage()


def test_plan_with_inference_ahead_writes_the_plan_it_writes_without(small_model, tmp_path, run_cli, monkeypatch):
    from offloadctl.loading import inference

    args = ("--params", "--select-distance", "3")
    assert run_cli("plan", small_model.path, "-o", tmp_path / "inline.json", *args).exit_code == 0
    monkeypatch.setattr(inference, "AHEAD_MIN_NODES", 0)
    assert run_cli("plan", small_model.path, "-o", tmp_path / "ahead.json", *args).exit_code == 0
    assert (tmp_path / "ahead.json").read_text() == (tmp_path / "inline.json").read_text()


def test_inference_ahead_forks_beside_a_live_progress_display(small_model, tmp_path, run_cli, monkeypatch):
    """On a terminal, onnx's shape inference forks its child while the progress display's refresh
    thread runs: the child delivers its types, and the plan is the one made without either."""
    import threading

    from rich.live import _RefreshThread

    from offloadctl.cli import ui
    from offloadctl.core.ahead import Ahead
    from offloadctl.loading import inference

    args = ("--params", "--select-distance", "3")
    assert run_cli("plan", small_model.path, "-o", tmp_path / "plain.json", *args).exit_code == 0
    monkeypatch.setattr(ui, "_interactive", lambda: True)  # the display draws, as on a terminal
    monkeypatch.setattr(inference, "AHEAD_MIN_NODES", 0)
    beside_display, delivered = [], []
    real_start, real_result = Ahead.start, Ahead.result

    def start(cls, function, *a):
        beside_display.append(any(isinstance(t, _RefreshThread) for t in threading.enumerate()))
        return real_start.__func__(cls, function, *a)

    def result(self):
        found = real_result(self)
        delivered.append(found is not None)
        return found

    monkeypatch.setattr(Ahead, "start", classmethod(start))
    monkeypatch.setattr(Ahead, "result", result)
    done = run_cli("plan", small_model.path, "-o", tmp_path / "display.json", *args)
    assert done.exit_code == 0, done.stderr
    assert beside_display == [True] and delivered == [True]
    assert (tmp_path / "display.json").read_text() == (tmp_path / "plain.json").read_text()


def _plan_json(run_cli, model, out, *args):
    res = run_cli("plan", model, "-o", out, "--params", "--json", *args)
    assert res.exit_code == 0, res.stderr
    return json.loads(res.stdout), out.read_text()


def test_a_weak_plans_next_step_gives_its_figures_on_a_graph_up_to_the_size_limit(tmp_path, run_cli, monkeypatch):
    """A weak plan's next step is a budget plan made and simulated in the process (no child is forked);
    above `NEXT_STEP_FIGURES_MAX_POSITIONS` positions only its command is given, without figures."""
    from offloadctl import pipeline

    # six plain layers: the distance plan lowers the peak by 2.3%, so the command makes a next step
    model = gen_large.generate(tmp_path / "model.onnx", gen_large.LargeModelConfig(layers=6, hidden=8)).path
    made_here = []
    real_step = pipeline._budget_step
    monkeypatch.setattr(pipeline, "_budget_step", lambda *args: made_here.append(os.getpid()) or real_step(*args))
    full, full_plan = _plan_json(run_cli, model, tmp_path / "full.json")
    step = full["next_step"]
    assert made_here == [os.getpid()]
    assert step is not None and step["peak_bytes"]["after"] < 0.95 * step["peak_bytes"]["before"]
    assert step["slowdown"] is not None and "--budget" in step["command"]
    monkeypatch.setattr(pipeline, "NEXT_STEP_FIGURES_MAX_POSITIONS", 10)
    short, short_plan = _plan_json(run_cli, model, tmp_path / "short.json")
    assert made_here == [os.getpid()]  # no budget plan this time
    assert short["next_step"] == {**step, "peak_bytes": {**step["peak_bytes"], "after": None}, "slowdown": None}
    assert short_plan.replace("short.json", "full.json") == full_plan.replace("short.json", "full.json")
    result = run_cli("plan", model, "-o", tmp_path / "text.json", "--params")
    assert "run it for its figures" in " ".join(result.stderr.split())


def test_a_plan_that_helps_makes_no_next_step(small_model, tmp_path, run_cli, monkeypatch):
    from offloadctl import pipeline

    made = []
    monkeypatch.setattr(pipeline, "_budget_step", lambda *args: made.append(args))
    doc, _ = _plan_json(run_cli, small_model.path, tmp_path / "p.json")  # lowers the peak by 16.6%
    assert doc["next_step"] is None and doc["peak_bytes"]["saved"] > 0.05 * doc["peak_bytes"]["before"]
    assert _plan_json(run_cli, small_model.path, tmp_path / "b.json", "--budget", "15KiB")[0]["next_step"] is None
    assert made == []  # nor does a budget plan


def test_a_plan_scheduled_in_place_is_the_plan_the_prefetch_stage_copies():
    from offloadctl.planning.budget.strategy import BudgetSearch
    from offloadctl.planning.prefetch import prefetch, prefetch_own
    from offloadctl.planning.request import PlanRequest, PrefetchPart

    analysis = analyse(load_model(ROOT / "sample_models" / "transformer.onnx"))
    request = PlanRequest.of_options(budget=800 * 1024, params=True, prefetch_distance=2)
    filtered = BudgetSearch(analysis, request, request.select).filter()
    kept = copy.deepcopy(filtered)
    options = PrefetchPart(prefetch_distance=2, release_distance=1)
    copied = prefetch(filtered, options)
    assert filtered == kept  # the stage copies
    owned = copy.deepcopy(filtered)
    assert prefetch_own(owned, options) is owned
    assert owned == copied and owned["offloads"] and owned["stage"] == "scheduled"


def test_a_simulation_of_a_plan_made_here_skips_only_the_check_of_its_facts(monkeypatch):
    from offloadctl.contract import check
    from offloadctl.planning.request import PlanRequest
    from offloadctl.simulation import program
    from offloadctl.simulation.result import simulate

    analysis = analyse(load_model(ROOT / "sample_models" / "unet.onnx"))
    plan = scheduled_plan(analysis, PlanRequest.of_options(budget=400 * 1024, params=True))
    checked = simulate(analysis, plan)
    calls = []
    monkeypatch.setattr(program, "check_plan_for_model", lambda *a: calls.append(a) or check.check_plan_for_model(*a))
    trusted = simulate(analysis, plan, planned_here=True)
    assert calls == [] and trusted.to_json() == checked.to_json()
    simulate(analysis, plan)
    assert len(calls) == 1
