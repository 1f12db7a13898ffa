"""The command line as a whole: entry points, help, exit statuses."""

from __future__ import annotations

import contextlib
import subprocess
import sys

from offloadctl._version import __version__


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
        capture_output=True,
        text=True,
    )
    assert result.returncode == 1
    assert "missing.onnx" in result.stderr and "does not exist" in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""
    assert not (tmp_path / "p.json").exists()


def _terminals(monkeypatch, *, stdout: bool, stderr: bool) -> None:
    from rich.console import Console

    from offloadctl.cli import ui

    monkeypatch.setattr(
        ui,
        "_consoles",
        {
            "out": Console(file=sys.stdout, force_terminal=stdout),
            "err": Console(file=sys.stderr, force_terminal=stderr),
        },
    )


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


def test_output_that_is_not_a_terminal_is_not_wrapped(run_cli, tmp_path, monkeypatch):
    import onnx
    from onnx import helper

    monkeypatch.delenv("COLUMNS", raising=False)
    name = "encoder.layers.0.self_attention.query_key_value.output_after_a_very_long_exported_name_" * 2
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], [name], name="relu"), helper.make_node("Neg", [name], ["y"], name="neg")],
        "g",
        [helper.make_tensor_value_info("x", 1, [4, 8])],
        [helper.make_tensor_value_info("y", 1, [4, 8])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    folder = tmp_path / ("a_folder_with_a_long_name_" * 4)
    folder.mkdir()
    path = folder / "model.onnx"
    onnx.save(model, str(path))
    result = run_cli("inspect", path)
    assert result.exit_code == 0, result.stderr
    row = next(line for line in result.stdout.splitlines() if name in line)
    assert "128 B" in row  # the whole row, name and cells, on one line
    assert any(str(path) in line for line in result.stdout.splitlines())
    assert max(len(line) for line in result.stdout.splitlines()) > 200


def test_warnings_on_a_pipe_are_plain_lines(run_cli, tmp_path):
    from tests.conftest import SAMPLES

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
    warning = next(line for line in result.stderr.splitlines() if "over 1.5x" in line)
    assert warning.startswith("WARNING  the estimated slowdown") and warning == warning.rstrip()


def test_onnxruntime_log_lines_do_not_leak_above_the_error(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    # Gather with an index out of range: onnxruntime logs the failure itself, then raises it.
    graph = helper.make_graph(
        [
            helper.make_node("Relu", ["x"], ["a"], name="relu"),
            helper.make_node("Gather", ["a", "idx"], ["y"], name="g"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        initializer=[helper.make_tensor("idx", TensorProto.INT64, [1], [9])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    path = tmp_path / "bad_index.onnx"
    onnx.save(model, str(path))
    result = subprocess.run(
        [sys.executable, "-m", "offloadctl", "run", str(path), "--device", "cpu"], capture_output=True, text=True
    )
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert lines[0].startswith("error: onnxruntime failed running") and "indices element out of data bounds" in lines[0]
    assert lines[1].lstrip().startswith("fix:") and len(lines) == 2, result.stderr
    assert "onnxruntime:" not in result.stderr.split("error:")[0]
