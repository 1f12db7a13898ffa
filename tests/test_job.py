"""One job object: every command finds a plan's model by one rule, and guards its outputs the same way."""

from __future__ import annotations

import json
import shutil

import pytest

import offloadctl
from offloadctl.core.errors import OffloadError
from offloadctl.job import Job, plan_model

from conftest import SAMPLES


def _plan_elsewhere(run_cli, tmp_path, monkeypatch):
    """A plan made in ``made/`` for ``made/seed.onnx``, then moved to ``moved/`` with its model beside it,
    its recorded path (relative, ``seed.onnx``) no longer valid from the current folder."""
    made = tmp_path / "made"
    made.mkdir()
    shutil.copyfile(SAMPLES / "seed.onnx", made / "seed.onnx")
    monkeypatch.chdir(made)
    assert run_cli("select", "seed.onnx", "-o", "sel.json", "--select-distance", "1").exit_code == 0
    assert run_cli("plan", "seed.onnx", "-o", "plan.json", "--select-distance", "1").exit_code == 0
    moved = tmp_path / "moved"
    shutil.copytree(made, moved)
    shutil.rmtree(made)
    monkeypatch.chdir(tmp_path)
    return moved


def test_every_command_finds_a_moved_plans_model_beside_it(run_cli, tmp_path, monkeypatch):
    moved = _plan_elsewhere(run_cli, tmp_path, monkeypatch)
    assert json.loads((moved / "plan.json").read_text())["model"]["path"] == "seed.onnx"
    applied = run_cli("apply", moved / "plan.json", "-o", tmp_path / "out.onnx")
    assert applied.exit_code == 0, applied.stderr
    # the budget filter reads the selected plan's model by the same rule
    filtered = run_cli("filter", moved / "sel.json", "-o", tmp_path / "f.json", "--budget", "400")
    assert filtered.exit_code == 0, filtered.stderr
    assert plan_model(json.loads((moved / "sel.json").read_text()), moved / "sel.json") == moved / "seed.onnx"


def test_model_overrides_the_plans_record_and_a_missing_model_names_every_place_looked(tmp_path):
    plan = {"model": {"path": "nowhere/m.onnx"}}
    with pytest.raises(OffloadError, match=r"looked for nowhere/m.onnx and .*nowhere/m.onnx and .*m.onnx"):
        plan_model(plan, tmp_path / "p.json")  # type: ignore[arg-type]
    assert plan_model(plan, tmp_path / "p.json", SAMPLES / "seed.onnx") == SAMPLES / "seed.onnx"  # type: ignore[arg-type]
    with pytest.raises(OffloadError, match="is a directory"):
        plan_model(plan, tmp_path / "p.json", tmp_path)  # type: ignore[arg-type]


def test_a_job_lists_what_it_reads_and_guards_its_outputs(tmp_path):
    plan = offloadctl.make_plan(offloadctl.analyse(SAMPLES / "seed.onnx"), select_distance=1)
    (tmp_path / "p.json").write_text(json.dumps(plan))
    job = Job.of_plan(tmp_path / "p.json", stages=("scheduled",), model=SAMPLES / "seed.onnx")
    assert job.reads == (tmp_path / "p.json", SAMPLES / "seed.onnx")
    with pytest.raises(OffloadError, match="same file as the input"):
        job.guard("the rewritten model", SAMPLES / "seed.onnx")
    job.guard("the rewritten model", tmp_path / "out.onnx")
    with pytest.raises(OffloadError, match="would both be written to"):
        job.guard("the plot", tmp_path / "out.onnx")


def test_the_api_and_the_command_write_the_same_rewrite(run_cli, tmp_path):
    analysis = offloadctl.analyse(SAMPLES / "seed.onnx")
    plan = offloadctl.make_plan(analysis, select_distance=1, prefetch_distance=0)
    offloadctl.apply(plan, analysis, tmp_path / "api.onnx")
    (tmp_path / "p.json").write_text(json.dumps(plan))
    assert run_cli("apply", tmp_path / "p.json", "-o", tmp_path / "cli.onnx").exit_code == 0
    assert (tmp_path / "api.onnx").read_bytes() == (tmp_path / "cli.onnx").read_bytes()
