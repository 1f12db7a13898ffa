"""The command line as a whole: entry points, help, exit statuses."""

from __future__ import annotations

import subprocess
import sys

from offloadctl import __version__


def test_python_dash_m_and_version():
    result = subprocess.run([sys.executable, "-m", "offloadctl", "--version"], capture_output=True, text=True)
    assert result.returncode == 0
    assert __version__ in result.stdout


def test_help_lists_the_pipeline_commands(run_cli):
    result = run_cli("--help")
    assert result.exit_code == 0
    for command in ("inspect", "select", "filter", "prefetch", "plan"):
        assert command in result.stdout


def test_bad_usage_exits_2(run_cli, seed_path):
    assert run_cli("select", seed_path).exit_code == 2  # -o is required
    assert run_cli("select", seed_path, "-o", "x.json", "--select-distance", "-3").exit_code == 2


def test_user_error_exits_1_without_traceback(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "offloadctl", "plan", str(tmp_path / "missing.onnx"), "-o", str(tmp_path / "p.json")],
        capture_output=True, text=True,
    )
    assert result.returncode == 1
    assert "missing.onnx" in result.stderr and "does not exist" in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""
    assert not (tmp_path / "p.json").exists()
