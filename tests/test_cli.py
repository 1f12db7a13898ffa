"""The command line as a whole: entry points, help, exit statuses."""

from __future__ import annotations

import contextlib
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


def _terminals(monkeypatch, *, stdout: bool, stderr: bool) -> None:
    from rich.console import Console

    from offloadctl.cli import ui

    monkeypatch.setattr(ui, "_consoles", {
        "out": Console(file=sys.stdout, force_terminal=stdout),
        "err": Console(file=sys.stderr, force_terminal=stderr),
    })


def test_progress_is_drawn_only_when_stdout_and_stderr_are_terminals(monkeypatch):
    from offloadctl.cli import ui

    for stdout, stderr in ((False, True), (True, False), (False, False)):
        _terminals(monkeypatch, stdout=stdout, stderr=stderr)
        with ui.progress() as bar:
            assert bar is None
        with ui.steps(total=2) as step:
            step("loading")  # does nothing, draws nothing
    _terminals(monkeypatch, stdout=True, stderr=True)
    with ui.progress(enabled=False) as bar:
        assert bar is None
    with ui.progress() as bar:
        assert bar is not None


def test_steps_count_the_steps_done(monkeypatch):
    from offloadctl.cli import ui

    _terminals(monkeypatch, stdout=True, stderr=True)
    seen = []
    real = ui.progress

    @contextlib.contextmanager
    def spy(enabled=True):
        with real(enabled) as bar:
            seen.append(bar)
            yield bar

    monkeypatch.setattr(ui, "progress", spy)
    with ui.steps(total=3) as step:
        step("one")
        step("two")
        (task,) = seen[0].tasks
        assert (task.description, task.completed, task.total) == ("two", 1, 3)
