"""--report: Markdown that renders, with a valid timeline plot beside it."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from markdown_it import MarkdownIt

from offloadctl.cli import report as report_module
from offloadctl.core.errors import OffloadError
from tests.conftest import SAMPLES

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _parse(path: Path):
    """Tokens of a Markdown file (CommonMark with tables, as GitHub renders pull requests)."""
    return MarkdownIt("commonmark").enable("table").parse(path.read_text(encoding="utf-8"))


def _headings(tokens) -> list[str]:
    return [tokens[i + 1].content for i, t in enumerate(tokens) if t.type == "heading_open"]


def _images(tokens) -> list[str]:
    return [c.attrs["src"] for t in tokens if t.type == "inline" for c in t.children or () if c.type == "image"]


def _table_rows(tokens) -> list[list[str]]:
    rows, row = [], None
    for i, t in enumerate(tokens):
        if t.type == "tr_open":
            row = []
        elif t.type in ("td_open", "th_open") and row is not None:
            row.append(tokens[i + 1].content if tokens[i + 1].type == "inline" else "")
        elif t.type == "tr_close":
            rows.append(row)
    return rows


def test_plan_report_renders_with_a_png_plot(run_cli, tmp_path):
    report = tmp_path / "plan.md"
    result = run_cli(
        "plan", SAMPLES / "transformer.onnx", "-o", tmp_path / "plan.json", "--budget", "800KiB", "--report", report
    )
    assert result.exit_code == 0, result.stderr
    assert f"wrote {tmp_path / 'plan.json'}, {report}, {tmp_path / 'plan.png'}" in result.stdout
    tokens = _parse(report)
    assert _headings(tokens)[1:] == ["Peak device memory", "Estimated time (profile ascend-910b)", "What moved and why"]
    (image,) = _images(tokens)
    assert image == "plan.png"
    assert (tmp_path / image).read_bytes()[:8] == PNG_MAGIC
    rows = _table_rows(tokens)
    assert ["peak", "964.04 KiB", "788.04 KiB", "-18.3%"] in rows
    plan = json.loads((tmp_path / "plan.json").read_text())
    moved = {r[0].strip("`") for r in rows if r[1:2] in (["parameter"], ["activation"])}
    assert moved == {o["tensor"] for o in plan["offloads"]}
    assert all("needed to fit the budget" in r[4] for r in rows if r[1:2] == ["parameter"])
    assert any(r[0].startswith("copies in line") for r in rows)
    text = report.read_text()
    assert "Lower bound: **144.00 KiB**" in text and "Budget 800.00 KiB" in text


def test_simulate_report_links_its_svg_plot(run_cli, tmp_path):
    plan = tmp_path / "plan.json"
    assert run_cli("plan", SAMPLES / "seed.onnx", "-o", plan, "--select-distance", "1").exit_code == 0
    (tmp_path / "out").mkdir()
    report, plot = tmp_path / "out" / "sim.md", tmp_path / "timeline.svg"
    result = run_cli("simulate", SAMPLES / "seed.onnx", "--plan", plan, "--plot", plot, "--report", report, "--json")
    assert result.exit_code == 0, result.stderr
    assert json.loads(result.stdout)["files_written"] == [str(plot), str(report)]
    (image,) = _images(_parse(report))
    assert image == "../timeline.svg" and (report.parent / image).resolve() == plot.resolve()
    root = ET.parse(plot).getroot()
    assert root.tag.endswith("svg")
    assert not (tmp_path / "out" / "sim.png").exists()  # the --plot image is reused, not drawn twice


def test_report_of_a_rewritten_model_and_without_matplotlib(run_cli, tmp_path, monkeypatch):
    plan, out = tmp_path / "plan.json", tmp_path / "out.onnx"
    args = ("--select-distance", "1", "--prefetch-distance", "0")
    assert run_cli("plan", SAMPLES / "seed.onnx", "-o", plan, *args).exit_code == 0
    assert run_cli("apply", plan, "-o", out).exit_code == 0

    def no_matplotlib(result, path, **kwargs):
        raise OffloadError("--plot needs matplotlib, which is not installed", hint="pip install 'offloadctl[plot]'")

    monkeypatch.setattr(report_module, "plot_timeline", no_matplotlib)
    report = tmp_path / "r.md"
    result = run_cli("simulate", out, "--report", report)
    assert result.exit_code == 0, result.stderr
    tokens = _parse(report)
    assert _images(tokens) == [] and "matplotlib is not installed" in report.read_text()
    assert ["peak", "516 B", "388 B", "-24.8%"] in _table_rows(tokens)
    assert "already applied" in report.read_text()


def test_report_never_overwrites_an_input(run_cli, tmp_path):
    model = tmp_path / "m.onnx"
    model.write_bytes((SAMPLES / "seed.onnx").read_bytes())
    for report in (model, tmp_path / "m.md"):  # m.md would draw m.png: fine; m.onnx is the model
        result = run_cli("plan", model, "-o", tmp_path / "p.json", "--report", report)
        if report == model:
            assert result.exit_code == 1 and "same file as the input" in result.stderr
            assert not (tmp_path / "p.json").exists()
        else:
            assert result.exit_code == 0, result.stderr
    clash = run_cli("plan", model, "-o", tmp_path / "r.png", "--report", tmp_path / "r.md")
    assert clash.exit_code == 1 and "r.png" in clash.stderr  # the plot beside r.md would overwrite the plan


def test_markdown_cells_are_escaped():
    assert report_module._cell("a|b\nc") == "a\\|b c"


@pytest.mark.parametrize("fmt", ["png", "svg"])
def test_write_report_draws_either_format(tmp_path, fmt):
    import offloadctl

    analysis = offloadctl.analyse(SAMPLES / "mlp.onnx")
    result = offloadctl.simulate(analysis, offloadctl.make_plan(analysis, select_distance=1))
    written = report_module.write_report(tmp_path / "r.md", result, plot_format=fmt)
    assert written == [tmp_path / "r.md", tmp_path / f"r.{fmt}"]
    data = written[1].read_bytes()
    assert data[:8] == PNG_MAGIC if fmt == "png" else ET.fromstring(data).tag.endswith("svg")


def test_peak_labels_never_overlap_when_the_peaks_sit_close():
    """A plan that leaves the peak where it was puts both peak labels on one point: the after label
    moves below it."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    import offloadctl
    from offloadctl.cli.plot import timeline_figure

    analysis = offloadctl.analyse(SAMPLES / "seed.onnx")
    plan = offloadctl.make_plan(analysis, select_distance=1, prefetch_distance=2)
    result = offloadctl.simulate(analysis, plan)
    assert result.peak_before == result.peak_after  # the seed's peak stays where it is
    fig = timeline_figure(result, Figure)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    labels = [t for t in fig.axes[0].texts if "peak" in t.get_text()]
    assert len(labels) == 2
    first, second = (t.get_window_extent(renderer) for t in labels)
    assert not first.overlaps(second)
