"""The Python API: the exported entry points, the example of docs/python-api.md, and the type-hint marker."""

from __future__ import annotations

import json
import re
import shutil

import pytest

import offloadctl
from offloadctl.contract.document import read_plan, validate_plan
from offloadctl.core.errors import OffloadError
from offloadctl.planning.budget.strategy import budget_filter
from offloadctl.planning.filter import filter_plan
from offloadctl.planning.prefetch import prefetch
from offloadctl.planning.request import FilterPart, PlanRequest, PrefetchPart, SelectPart
from offloadctl.planning.select import select
from offloadctl.simulation.memory import peak_memory
from tests.conftest import ROOT, SAMPLES


def test_the_entry_points_are_exported():
    for name in ("load", "analyse", "make_plan", "apply", "simulate", "run", "OffloadError"):
        assert name in offloadctl.__all__ and callable(getattr(offloadctl, name)), name
    assert (ROOT / "offloadctl" / "py.typed").is_file()
    import inspect

    from offloadctl.simulation.profiles import DEFAULT_PROFILE

    assert inspect.signature(offloadctl.simulate).parameters["profile"].default == DEFAULT_PROFILE


def test_the_functions_survive_importing_the_modules_and_the_package_stays_light():
    import subprocess
    import sys

    code = (
        "import sys, offloadctl\n"
        "light = 'onnx' not in sys.modules\n"
        "import offloadctl.rewriting.rewrite, offloadctl.simulation.result, offloadctl.running.runner\n"
        "print(light, offloadctl.apply.__module__, offloadctl.simulate.__module__,\n"
        "      offloadctl.ApplyResult.__module__, offloadctl.SimResult.__module__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["True", "offloadctl", "offloadctl", "offloadctl.rewriting.rewrite", "offloadctl.simulation.result"]


def test_the_readme_example_runs(tmp_path, monkeypatch):
    text = (ROOT / "docs" / "python-api.md").read_text(encoding="utf-8")
    code = re.search(r"<!-- example: python-api -->\s*```python\n(.*?)```", text, re.S).group(1)
    (tmp_path / "sample_models").mkdir()
    shutil.copy(SAMPLES / "transformer.onnx", tmp_path / "sample_models")
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "docs/python-api.md", "exec"), {})  # the example asserts its own results
    assert (tmp_path / "transformer.offload.onnx").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sample_models", "transformer.offload.onnx"]


def _planned(plan: dict) -> dict:
    """The planner's plan: a plan document less what the pipeline's later passes record in it (the
    events, the pins' layout, the figures apply quotes)."""
    summary = {k: v for k, v in plan.get("summary", {}).items() if k not in ("estimate", "pins", "events")}
    rest = {k: v for k, v in plan.items() if k != "summary"}
    return {**rest, "summary": summary} if summary else rest


def test_make_plan_with_a_budget_equals_the_stages_chained_by_hand():
    analysis = offloadctl.analyse(offloadctl.load(SAMPLES / "transformer.onnx"))
    budget = 800 * 1024
    plan = offloadctl.make_plan(analysis, budget="800KiB", prefetch_distance=5)
    # the budget strategy weighs every idle stretch: make_plan selects at distance 0 for it
    selected = select(analysis, SelectPart(select_distance=0))
    by_hand = prefetch(
        budget_filter(selected, analysis, PlanRequest.of_options(budget=budget, prefetch_distance=5)),
        PrefetchPart(prefetch_distance=5),
    )
    validate_plan(plan)
    strip = lambda p: {k: v for k, v in _planned(p).items() if k != "history"}  # noqa: E731
    assert strip(plan) == strip(by_hand)
    assert plan["strategy"] == "budget" and peak_memory(analysis, plan)[0] <= budget


def test_make_plan_without_a_budget_is_hyperoffload():
    analysis = offloadctl.analyse(SAMPLES / "seed.onnx")
    plan = offloadctl.make_plan(analysis, select_distance=1, prefetch_distance=0)
    assert _planned(plan) == prefetch(
        filter_plan(select(analysis, SelectPart(select_distance=1)), FilterPart()), PrefetchPart(prefetch_distance=0)
    )
    assert plan["strategy"] == "distance"


def test_make_plan_reports_its_stages_and_refuses_contradictions():
    analysis = offloadctl.analyse(SAMPLES / "transformer.onnx")
    seen: list[tuple[str, bool]] = []
    offloadctl.make_plan(analysis, budget=800 * 1024, progress=lambda text, new=True: seen.append((text, new)))
    stages = [text for text, new in seen if new]
    assert stages == [  # the pipeline's passes (the next step is the verdict's, not the document's)
        "selecting",
        "fitting the budget",
        "scheduling",
        "placing the events",
        "pinning the copies",
        "simulating peak memory and time",
    ]
    assert any(not new for _, new in seen)  # news from the budget search
    with pytest.raises(OffloadError, match="need the budget strategy"):
        offloadctl.make_plan(analysis, strategy="distance", budget=1024)
    with pytest.raises(OffloadError, match="below the lower bound"):
        offloadctl.make_plan(analysis, budget="1KiB")


def test_apply_refuses_to_overwrite_its_model(tmp_path):
    shutil.copy(SAMPLES / "seed.onnx", tmp_path / "seed.onnx")
    analysis = offloadctl.analyse(tmp_path / "seed.onnx")
    plan = offloadctl.make_plan(analysis, select_distance=1)
    before = (tmp_path / "seed.onnx").read_bytes()
    with pytest.raises(OffloadError, match="same file as the input"):
        offloadctl.apply(plan, analysis, tmp_path / "seed.onnx")
    assert (tmp_path / "seed.onnx").read_bytes() == before
    proto = offloadctl.apply(plan, analysis)  # in memory only
    assert any(n.op_type == "MemcpyToHost" for n in proto.graph.node)


def test_apply_and_simulate_check_a_plan_handed_over_in_memory():
    analysis = offloadctl.analyse(offloadctl.load(SAMPLES / "transformer.onnx"))
    plan = offloadctl.make_plan(analysis, select_distance=3)
    offloadctl.simulate(analysis, plan)
    broken = {**plan, "offloads": [{**plan["offloads"][0], "bytes": "many"}]}
    for call in (offloadctl.apply, lambda p, a: offloadctl.simulate(a, p)):
        with pytest.raises(OffloadError, match="not a valid plan"):
            call(broken, analysis)
        with pytest.raises(OffloadError, match="at stage 'selected'"):
            call({**offloadctl.make_plan(analysis), "stage": "selected"}, analysis)
    other = offloadctl.analyse(offloadctl.load(SAMPLES / "mlp.onnx"))
    with pytest.raises(OffloadError, match="the plan was made for"):
        offloadctl.apply(plan, other)


@pytest.mark.parametrize("order", ["priority", "default"])
def test_the_api_and_the_command_line_make_the_same_plan(run_cli, tmp_path, order):
    """One path makes a plan: `offloadctl.make_plan` returns the document `offloadctl plan` writes
    for the same request, field by field, the figures apply quotes and the pins' layout included."""
    from offloadctl.analysis.graph import analyse
    from offloadctl.loading.model import load_model

    model = SAMPLES / "unet.onnx"
    path = tmp_path / "plan.json"
    res = run_cli("plan", model, "--params", "--select-distance", "10", "--execution-order", order, "-o", path)
    assert res.exit_code == 0, res.stderr
    written = read_plan(path)
    plan = offloadctl.make_plan(analyse(load_model(model), order=order), params=True, select_distance=10)
    made = json.loads(json.dumps(plan))
    assert set(made) == set(written)
    for key in written:
        assert made[key] == written[key], key
    assert made["summary"]["estimate"] and made["summary"]["pins"]


def test_api_errors_are_said_in_keywords_not_flags(tmp_path):
    """A caller of the library reads keywords: a misspelt one is refused with the close ones (a TypeError
    too, as Python raises), and a hint the command line words with flags names the keywords instead."""
    import onnx

    import offloadctl
    from offloadctl.core.errors import UnknownOption

    analysis = offloadctl.analyse(SAMPLES / "transformer.onnx")
    with pytest.raises(UnknownOption, match="make_plan\\(\\) got an unknown keyword 'budjet'") as caught:
        offloadctl.make_plan(analysis, budjet="800KiB")
    assert isinstance(caught.value, TypeError) and caught.value.hint.startswith("did you mean budget?")
    with pytest.raises(TypeError, match="did you mean input_shapes"):
        offloadctl.load(SAMPLES / "mlp.onnx", input_shape={"x": [1, 4]})
    with pytest.raises(TypeError, match="did you mean repeat"):
        offloadctl.run(SAMPLES / "mlp.onnx", "cpu", repeats=3)
    with pytest.raises(offloadctl.OffloadError) as low:
        offloadctl.make_plan(analysis, budget="1B", params=True)
    assert low.value.hint.startswith("give budget='144.00KiB' or more") and "--" not in low.value.hint
    dynamic = onnx.parser.parse_model(
        """<ir_version: 10, opset_import: ["" : 17]>
        g (float[N, 4] x) => (float[N, 4] y) { a = Relu(x) b = Sin(a) y = Add(b, a) }"""
    )
    onnx.save(dynamic, str(tmp_path / "dyn.onnx"))
    with pytest.raises(offloadctl.OffloadError) as pins:
        offloadctl.make_plan(offloadctl.analyse(tmp_path / "dyn.onnx"), budget="1KiB")
    assert "pin them with input_shapes={'NAME': [D0, D1, ...]} where the model is loaded" in str(pins.value)
