"""The planning request (`offloadctl.planning.request`): plain composed data, a part per stage, each part
checked when it is made; text and names read only by `PlanRequest.of_options`, the Python API's form."""

from __future__ import annotations

import dataclasses

import pytest

from offloadctl.loading.placed import NO_HOST, HostCast, HostPlacement
from offloadctl.planning.request import (
    BudgetPart,
    FilterPart,
    PlanRequest,
    RequestError,
    SelectPart,
    device_profile,
    recorded,
)
from offloadctl.simulation.profiles import DEFAULT_PROFILE, MeasuredTimes, load_profile


def test_flat_options_are_read_into_their_parts():
    request = PlanRequest.of_options(budget="64KiB", force=["*w*"], min_bytes="4KiB", profile="pcie-gen4-x16")
    assert request.budget.budget == 64 * 1024 and request.filter.min_bytes == 4096
    assert request.select.force == ("*w*",)
    assert request.budget.device_profile.name == "pcie-gen4-x16"
    # without a profile, the device's bundled one; without either, the default
    assert PlanRequest.of_options(device="cuda").budget.device_profile.name == "pcie-gen4-x16"
    assert PlanRequest.of_options().budget.device_profile.name == DEFAULT_PROFILE


def test_a_part_holds_values_not_text_and_says_where_text_is_read():
    with pytest.raises(RequestError, match="budget must be a number of bytes") as caught:
        BudgetPart(budget="64KiB")  # type: ignore[arg-type]
    assert "of_options" in (caught.value.hint or "")
    with pytest.raises(RequestError, match="the profile must be loaded"):
        BudgetPart(profile="ascend-910b")  # type: ignore[arg-type]
    with pytest.raises(RequestError, match="force must be a tuple of glob patterns"):
        SelectPart(force=["*"])  # type: ignore[arg-type]
    with pytest.raises(RequestError, match="select_num must be an integer >= 0"):
        FilterPart(select_num=-1)


def test_a_part_given_as_a_flat_option_is_refused_by_name():
    with pytest.raises(TypeError, match="PlanRequest.budget is a BudgetPart.*PlanRequest.of_options"):
        PlanRequest(budget=1024)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="unexpected keyword argument 'budjet'"):
        PlanRequest.of_options(budjet=1024)


def test_a_changed_part_is_checked_again_and_nothing_else_is_read_again():
    profile = load_profile("pcie-gen4-x16")
    request = PlanRequest(budget=BudgetPart(budget=1 << 20, profile=profile))
    inline = request.with_copies("streams")
    assert inline.copies == "streams" and inline.budget.profile is profile  # the loaded profile is kept
    with pytest.raises(RequestError, match="alternatives"):
        dataclasses.replace(request.budget, max_slowdown=1.1)


def test_the_select_stage_reads_the_fusions_a_measured_profile_records():
    times = MeasuredTimes("m.onnx", "0" * 64, 0.0, {}, opt_level="all", fused=frozenset({"b", "a"}))
    measured = dataclasses.replace(load_profile(DEFAULT_PROFILE), measured=times)
    request = PlanRequest(budget=BudgetPart(profile=measured))
    assert request.select.fused == () and request.selecting.fused == ("a", "b")
    given = PlanRequest(select=SelectPart(fused=("c",)), budget=BudgetPart(profile=measured))
    assert given.selecting.fused == ("c",)  # fused tensors given win


def test_the_host_placement_is_one_value_a_plan_records_and_reads_back():
    host = HostPlacement("cuda (predicted: its provider does not run here)", ("n1",), ("t",), (HostCast("x", None),))
    assert host.name == "cuda" and NO_HOST.name == "" and NO_HOST.record() == {}
    entries = recorded(SelectPart(host=host))
    assert entries["host_device"] == host.device and entries["host_casts"] == [{"tensor": "x", "readers": None}]
    assert SelectPart.of_record(entries) == SelectPart(host=host)
    assert device_profile(None, host.name).name == "pcie-gen4-x16"
