"""CI use: one-line verdicts, --json documents, the --max-peak gate and the CI example of docs/ci.md."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, SAMPLES

SEED = SAMPLES / "seed.onnx"
SEED_PLAN = ("--select-distance", "1", "--prefetch-distance", "0")  # 516 B -> 388 B


def _verdict(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    assert lines, "no output"
    return lines[-1]


def test_every_command_ends_with_a_passed_verdict(run_cli, tmp_path):
    sel, fil, plan, out = (tmp_path / n for n in ("s.json", "f.json", "p.json", "out.onnx"))
    steps = {
        "inspect": ("inspect", SEED),
        "select": ("select", SEED, "-o", sel, "--select-distance", "1"),
        "filter": ("filter", sel, "-o", fil),
        "prefetch": ("prefetch", fil, "-o", plan, "--prefetch-distance", "0"),
        "plan": ("plan", SEED, "-o", tmp_path / "p2.json", *SEED_PLAN),
        "apply": ("apply", tmp_path / "p2.json", "-o", out),
        "run": ("run", out, "--device", "cpu", "--repeat", "1", "--compare-to", SEED),
        "simulate": ("simulate", SEED, "--plan", plan),
    }
    verdicts = {}
    for name, args in steps.items():
        result = run_cli(*args)
        assert result.exit_code == 0, (name, result.stderr)
        verdicts[name] = _verdict(result.stdout)
        assert verdicts[name].startswith(f"PASSED | {name} "), verdicts[name]
    assert "peak 516 B -> 388 B (-24.8%)" in verdicts["plan"]
    assert re.search(r"est\. slowdown \d+\.\d\dx \(copies in line, profile ascend-910b\)", verdicts["plan"])
    assert verdicts["plan"].endswith(f"wrote {tmp_path / 'p2.json'}")
    assert "peak 516 B -> 388 B" in verdicts["apply"] and f"wrote {out}" in verdicts["apply"]
    assert "1 D2H + 1 H2D copies" in verdicts["apply"]
    # a plan made stage by stage carries no estimate: apply says where to get the figures
    staged = run_cli("apply", plan, "-o", tmp_path / "staged.onnx")
    assert _verdict(staged.stdout).endswith(
        f"peak and time: offloadctl simulate {tmp_path / 'staged.onnx'} | wrote {tmp_path / 'staged.onnx'}"
    )
    assert "peak 516 B -> 388 B" in verdicts["simulate"] and "est. slowdown" in verdicts["simulate"]
    assert "order as planned" in verdicts["run"] and f"bit-identical to {SEED}" in verdicts["run"]
    assert "1 candidate(s), 128 B" in verdicts["select"] and verdicts["select"].endswith(f"wrote {sel}")
    assert "6 nodes | activations 768 B | weights 4 B" in verdicts["inspect"]


@pytest.mark.parametrize("command", ["select", "filter", "prefetch", "plan", "apply"])
def test_json_is_one_document_with_figures_and_files_written(run_cli, tmp_path, command):
    sel, fil, plan, out = (tmp_path / n for n in ("s.json", "f.json", "p.json", "out.onnx"))
    assert run_cli("select", SEED, "-o", sel, "--select-distance", "1").exit_code == 0
    assert run_cli("filter", sel, "-o", fil).exit_code == 0
    assert run_cli("prefetch", fil, "-o", plan, "--prefetch-distance", "0").exit_code == 0
    args = {
        "select": ("select", SEED, "-o", tmp_path / "s2.json", "--select-distance", "1"),
        "filter": ("filter", sel, "-o", tmp_path / "f2.json"),
        "prefetch": ("prefetch", fil, "-o", tmp_path / "p2.json"),
        "plan": ("plan", SEED, "-o", tmp_path / "p2.json", *SEED_PLAN),
        "apply": ("apply", tmp_path / "p3.json", "-o", out),
    }[command]
    if command == "apply":
        assert run_cli("plan", SEED, "-o", tmp_path / "p3.json", *SEED_PLAN).exit_code == 0
    result = run_cli(*args, "--json")
    assert result.exit_code == 0, result.stderr
    doc = json.loads(result.stdout)  # the whole of stdout is one document
    assert doc["command"] == command and doc["passed"] is True
    assert doc["files_written"] == [str(args[3])] and Path(args[3]).is_file()
    assert _verdict(result.stderr).startswith(f"PASSED | {command}")  # the verdict goes to stderr
    if command in ("plan", "apply"):
        figures = doc if command == "plan" else doc["estimate"]  # apply quotes what plan recorded
        assert figures["peak_bytes"] == {"before": 516, "after": 388, "saved": 128}
        assert figures["slowdown"]["serialized"] >= 1.0 and figures["profile"] == "ascend-910b"
        assert figures["lower_bound_bytes"] == 384
    else:
        assert doc["offloads"]["count"] == 1 and doc["offloads"]["bytes"] == 128


@pytest.mark.parametrize("command", ["plan", "simulate"])
def test_max_peak_gate_passes_under_and_fails_over(run_cli, tmp_path, command):
    plan = tmp_path / "p.json"
    if command == "plan":
        base = ("plan", SEED, "-o", plan, *SEED_PLAN)
    else:
        assert run_cli("plan", SEED, "-o", plan, *SEED_PLAN).exit_code == 0
        base = ("simulate", SEED, "--plan", plan)
    under = run_cli(*base, "--max-peak", "388")
    assert under.exit_code == 0, under.stderr
    assert _verdict(under.stdout).startswith(f"PASSED | {command}")
    over = run_cli(*base, "--max-peak", "387")
    assert over.exit_code == 1
    lines = over.stderr.strip().splitlines()
    assert len(lines) == 1, over.stderr  # one line: the reason
    assert lines[0].startswith(f"FAILED | {command} ")
    assert "peak after the plan 388 B (388 bytes) is above --max-peak 387 B (387 bytes)" in lines[0]
    assert "PASSED" not in over.stdout
    json_over = run_cli(*base, "--max-peak", "0.3KiB", "--json")
    assert json_over.exit_code == 1 and json.loads(json_over.stdout)["passed"] is False


def test_max_peak_on_a_model_without_a_plan_checks_its_own_peak(run_cli):
    assert run_cli("simulate", SEED, "--max-peak", "516").exit_code == 0
    over = run_cli("simulate", SEED, "--max-peak", "515")
    assert over.exit_code == 1 and "| peak 516 B (516 bytes) is above --max-peak" in over.stderr


def test_plan_prints_the_slowdown_next_to_the_peak_and_warns_above_1_5x(run_cli, tmp_path):
    # UNet with every weight streamed in, over a CPU-speed link: far more than 1.5x in line
    result = run_cli(
        "plan",
        SAMPLES / "unet.onnx",
        "-o",
        tmp_path / "p.json",
        "--params",
        "--select-distance",
        "10",
        "--prefetch-distance",
        "3",
    )
    assert result.exit_code == 0, result.stderr
    line = next(x for x in result.stdout.splitlines() if x.startswith("simulated peak device memory"))
    assert re.search(
        r"-> \S+ \S+ after \(-\d+\.\d%.*\); estimated time (\d+\.\d\d)x the baseline with copies in line", line
    )
    slowdown = float(re.search(r"estimated time (\d+\.\d\d)x", line).group(1))
    assert slowdown > 1.5
    assert "estimated slowdown with copies in line" in result.stderr and "over 1.5x" in result.stderr
    # a budget plan that moves a few weights stays under 1.5x: no warning
    cheap = run_cli("plan", SAMPLES / "transformer.onnx", "-o", tmp_path / "q.json", "--budget", "800KiB", "--json")
    assert cheap.exit_code == 0, cheap.stderr
    assert cheap.json()["slowdown"]["serialized"] < 1.5 and "over 1.5x" not in cheap.stderr


def test_plan_takes_a_profile(run_cli, tmp_path):
    docs = {
        name: run_cli("plan", SEED, "-o", tmp_path / "p.json", *SEED_PLAN, "--json", "--profile", name).json()
        for name in ("ascend-910b", "cpu")
    }
    assert docs["cpu"]["profile"] == "cpu" and docs["cpu"]["time_s"] != docs["ascend-910b"]["time_s"]


# ---------------------------------------------------------------------------------------------
# The CI example of docs/ci.md, run as written


def _ci_block(marker: str) -> str:
    text = (ROOT / "docs" / "ci.md").read_text(encoding="utf-8")
    match = re.search(rf"<!-- example: {marker} -->\s*```\w*\n(.*?)```", text, re.S)
    assert match, f"docs/ci.md has no example marked {marker}"
    return match.group(1)


def _ci_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["MODEL"] = "model.onnx"
    env.update(extra)
    return env


@pytest.fixture
def ci_script(tmp_path):
    if shutil.which("bash") is None:  # pragma: no cover - every CI image has bash
        pytest.fail("bash is needed to run the CI example of docs/ci.md")
    script = tmp_path / "ci.sh"
    script.write_text(_ci_block("ci"), encoding="utf-8")
    shutil.copy(SAMPLES / "transformer.onnx", tmp_path / "model.onnx")
    return script


def test_the_readme_ci_example_passes_on_a_sample(tmp_path, ci_script):
    assert shutil.which("offloadctl", path=str(Path(sys.executable).parent)), "offloadctl is not installed"
    result = subprocess.run(
        ["bash", str(ci_script)], cwd=tmp_path, env=_ci_env(tmp_path), capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr
    passed = [line for line in result.stdout.splitlines() if line.startswith("PASSED | ")]
    assert [line.split()[2] for line in passed] == ["plan", "apply", "run"]
    assert "bit-identical" in passed[-1]
    assert (tmp_path / "plan.json").is_file() and (tmp_path / "model.offload.onnx").is_file()
    assert (tmp_path / "plan.md").is_file() and (tmp_path / "plan.png").is_file()


def test_the_readme_ci_example_fails_the_job_on_a_regression(tmp_path, ci_script):
    # A budget the plan cannot meet (below the lower bound): the job stops at the plan step, exit 1.
    result = subprocess.run(
        ["bash", str(ci_script)], cwd=tmp_path, env=_ci_env(tmp_path, BUDGET="100KiB"), capture_output=True, text=True
    )
    assert result.returncode == 1, result.stdout + result.stderr
    assert "below the lower bound" in result.stderr
    assert not (tmp_path / "model.offload.onnx").exists()


def test_a_recorded_estimate_holds_only_while_the_offloads_are_unchanged(run_cli, tmp_path):
    from offloadctl.simulation.estimate import recorded_estimate

    path = tmp_path / "p.json"
    assert run_cli("plan", SEED, "-o", path, *SEED_PLAN).exit_code == 0
    plan = json.loads(path.read_text())
    assert recorded_estimate(plan).peak.after == 388
    plan["offloads"][0]["reload_groups"][0]["h2d_before"] -= 1  # an edit: the figures no longer hold
    assert recorded_estimate(plan) is None
    path.write_text(json.dumps(plan))
    result = run_cli("apply", path, "-o", tmp_path / "out.onnx", "--json")
    assert result.exit_code == 0, result.stderr
    assert result.json()["estimate"] is None and "peak and time: offloadctl simulate" in result.stderr
