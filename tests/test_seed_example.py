"""The HyperOffload worked example from the seed document, planned exactly as docs/plan-file.md says."""

from __future__ import annotations

from offloadctl.analysis.graph import analyse
from offloadctl.loading.model import load_model
from offloadctl.planning.make import scheduled_plan
from offloadctl.planning.request import PlanRequest


def _plan(path, **kw):
    return scheduled_plan(analyse(load_model(path)), PlanRequest.of_options(**kw))


def test_select_distance_1_offloads_m1_with_h2d_before_sub(seed_path):
    plan = _plan(seed_path, select_distance=1, prefetch_distance=0)
    assert [o["tensor"] for o in plan["offloads"]] == ["m1"]
    (m1,) = plan["offloads"]
    assert m1["d2h_after"] == 0  # right after Div
    assert m1["producer"]["node"] == "div"
    assert [u["node"] for u in m1["device_uses"]] == ["mul_m3"]
    (group,) = m1["reload_groups"]
    assert [u["node"] for u in group["uses"]] == ["sub_out"]
    assert group["h2d_before"] == 5  # just before Sub


def test_prefetch_2_moves_h2d_before_add(seed_path):
    plan = _plan(seed_path, select_distance=1, prefetch_distance=2)
    (m1,) = plan["offloads"]
    assert m1["reload_groups"][0]["h2d_before"] == 3  # Add sits at position 3


def test_default_distance_offloads_nothing(seed_path):
    plan = _plan(seed_path)
    assert plan["offloads"] == []
    assert {r["tensor"]: r["reason"] for r in plan["rejected"]}["m1"] == "short-gaps"
