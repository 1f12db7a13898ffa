"""One memory model: every consumer of `offloadctl.analysis.timeline` agrees with a naive recomputation.

On random DAG models (the strategy of test_properties.py) and random plans — distance plans with
random select, prefetch and release distances, and budget plans at random budgets between the
lower bound and the peak (release distance 0 and not) — the device bytes at every step are
recomputed here from the rules as docs/plan-file.md states them, tensor by tensor and step by step, and
compared with:

- the timeline's profile (what the budget strategy and its final check use),
- the simulator (its program has copies as steps of their own: its peak must be the same),
- the budget strategy's own accounting (the peak it records while it searches),
- the prefetch stage's H2D positions and release points,
- the lower bound (the timeline's and the simulator's).

The incremental `WorkingSet` is checked against plain arrays under random additions.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import onnx
from hypothesis import given, settings
from hypothesis import strategies as st

from offloadctl.analysis.graph import Analysis, analyse
from offloadctl.analysis.timeline import WorkingSet, lower_bound, profile
from offloadctl.core.errors import OffloadError
from offloadctl.loading.model import load_model
from offloadctl.planning.budget.strategy import budget_filter
from offloadctl.planning.make import scheduled_plan
from offloadctl.planning.prefetch import prefetch
from offloadctl.planning.request import PlanRequest, PrefetchPart, SelectPart
from offloadctl.planning.select import select
from offloadctl.simulation.memory import lower_bound as simulator_lower_bound
from offloadctl.simulation.memory import peak_memory
from offloadctl.simulation.result import simulate

from test_properties import PROPERTIES, RandomModel, dag_models

# ---------------------------------------------------------------------------------------------------
# The rules, restated naively
# ---------------------------------------------------------------------------------------------------


def _size(analysis: Analysis, name: str) -> int:
    info = analysis.infos.get(name)
    return (info.bytes or 0) if info is not None else 0


def naive_profile(analysis: Analysis, plan: dict | None) -> list[int]:
    """Device bytes at steps 0..n of a scheduled plan, one tensor and one step at a time."""
    n = analysis.num_positions
    offloads = {o["tensor"]: o for o in (plan["offloads"] if plan else [])}
    names = set(analysis.graph_inputs) | set(analysis.producer) | set(analysis.weights)
    out = [0] * (n + 1)
    for name in names:
        size = _size(analysis, name)
        uses = [u.position for u in analysis.uses.get(name, [])]
        output = name in analysis.graph_outputs
        off = offloads.get(name)
        for s in range(n + 1):
            if off is None:
                if name in analysis.weights:
                    alive = bool(uses) or output  # onnxruntime drops an initializer nothing reads
                else:
                    start = analysis.producer.get(name, 0)
                    end = n if output else (max(uses) if uses else start)
                    alive = start <= s <= end
                out[s] += size * alive
                continue
            copies = 0
            if off["kind"] == "activation":
                last = off["device_uses"][-1]["position"] if off["device_uses"] else off["d2h_after"]
                copies += off["producer"]["position"] <= s <= max(last, off["release_after"])
                if off["graph_output"] and off["output_h2d_before"] is not None:
                    copies += s >= off["output_h2d_before"]
            for group in off["reload_groups"]:
                copies += group["h2d_before"] <= s <= group["uses"][-1]["position"]
            out[s] += size * copies
    return out


def naive_positions(plan: dict, prefetch_distance: int, release_distance: int) -> None:
    """The prefetch stage's H2D positions and release points, by rule 4 of docs/plan-file.md (prefetch,
    release distance)."""
    n = plan["model"]["num_positions"]
    for off in plan["offloads"]:
        d = off["prefetch_distance"] if off["prefetch_distance"] is not None else prefetch_distance
        floor = off["d2h_after"] + 1 if off["kind"] == "activation" else 0
        for group in off["reload_groups"]:
            assert group["h2d_before"] == max(floor, group["uses"][0]["position"] - d)
        if off["kind"] == "activation":
            last = off["device_uses"][-1]["position"] if off["device_uses"] else off["d2h_after"]
            assert off["release_after"] == min(last + release_distance, n - 1)


def naive_lower_bound(analysis: Analysis) -> int:
    n = analysis.num_positions
    inputs = set(analysis.graph_inputs)
    best = sum(_size(analysis, o) for o in set(analysis.graph_outputs))
    for p in range(n):
        names = {name for name, uses in analysis.uses.items() if any(u.position == p for u in uses)}
        names |= {o for o in analysis.nodes[p].output if o}
        live = {name for name in inputs if any(u.position >= p for u in analysis.uses.get(name, []))}
        best = max(best, sum(_size(analysis, t) for t in (names - inputs) | live))
    return best


# ---------------------------------------------------------------------------------------------------
# Consumers against the naive rules
# ---------------------------------------------------------------------------------------------------


def _analyse(random_model: RandomModel, folder: Path) -> Analysis:
    path = folder / "model.onnx"
    onnx.save(random_model.model, str(path))
    return analyse(load_model(path))


def _agree(analysis: Analysis, plan: dict, pd: int, rd: int) -> int:
    naive = naive_profile(analysis, plan)
    naive_positions(plan, pd, rd)
    assert profile(analysis, plan, prefetch_distance=pd, release_distance=rd).tolist() == naive
    peak = max(naive)
    assert peak_memory(analysis, plan)[0] == peak
    assert simulate(analysis, plan, profile=None).peak_after == peak
    return peak


budget_options = st.fixed_dictionaries(
    {
        "fraction": st.floats(0.0, 1.0),
        "prefetch_distance": st.integers(0, 5),
        "release_distance": st.sampled_from([0, 0, 1, 3]),
        "params": st.booleans(),
    }
)


@settings(PROPERTIES, max_examples=40)
@given(
    random_model=dag_models(),
    sd=st.integers(0, 5),
    pd=st.integers(0, 5),
    rd=st.integers(0, 3),
    params=st.booleans(),
)
def test_distance_plans_agree_with_the_naive_rules(
    random_model: RandomModel, sd: int, pd: int, rd: int, params: bool
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        analysis = _analyse(random_model, Path(tmp))
    assert _agree(analysis, scheduled_plan(analysis, PlanRequest.of_options(params=False)), 0, 0) == max(
        naive_profile(analysis, None)
    )
    plan = scheduled_plan(
        analysis, PlanRequest.of_options(select_distance=sd, prefetch_distance=pd, release_distance=rd, params=params)
    )
    _agree(analysis, plan, pd, rd)
    assert lower_bound(analysis) == simulator_lower_bound(analysis)
    assert lower_bound(analysis)[0] == naive_lower_bound(analysis)


@settings(PROPERTIES, max_examples=40)
@given(random_model=dag_models(), opts=budget_options)
def test_budget_plans_agree_with_the_naive_rules(random_model: RandomModel, opts: dict) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        analysis = _analyse(random_model, Path(tmp))
    pd, rd = opts["prefetch_distance"], opts["release_distance"]
    bound, _ = lower_bound(analysis)
    before = max(naive_profile(analysis, None))
    budget = int(bound + opts["fraction"] * (before - bound))
    selected = select(analysis, SelectPart(select_distance=0, params=opts["params"]))
    try:
        filtered = budget_filter(
            selected, analysis, PlanRequest.of_options(budget=budget, prefetch_distance=pd, release_distance=rd)
        )
    except OffloadError as exc:
        assert "best peak reachable" in exc.message
        return
    plan = prefetch(filtered, PrefetchPart(prefetch_distance=pd, release_distance=rd))
    peak = _agree(analysis, plan, pd, rd)
    assert plan["budget"]["predicted_peak_bytes"] == peak  # the search's own accounting
    assert peak <= budget


@settings(PROPERTIES, max_examples=60)
@given(
    values=st.lists(st.integers(-1000, 1000), min_size=1, max_size=90),
    block=st.integers(1, 12),
    changes=st.lists(st.tuples(st.integers(0, 89), st.integers(0, 89), st.integers(-500, 500)), max_size=30),
)
def test_the_working_set_matches_plain_arrays(values: list[int], block: int, changes: list) -> None:
    ws = WorkingSet(np.asarray(values), block=block)
    plain = np.asarray(values, dtype=np.int64)
    n = len(values)
    for first, last, delta in changes:
        first, last = first % n, last % n
        ws.add(first, last, delta)
        plain[first : last + 1] += delta
        assert ws.peak() == (int(plain.max()), int(np.argmax(plain)))
        lo, hi = min(first, last), max(first, last)
        assert ws.max(lo, hi) == int(plain[lo : hi + 1].max())
        assert ws.window(lo, hi).tolist() == plain[lo : hi + 1].tolist()
    many = [(first % n, last % n, d) for first, last, d in changes]
    if many:
        ws.add_many(*zip(*many))
        for first, last, d in many:
            plain[first : last + 1] += d
    assert ws.values().tolist() == plain.tolist()
