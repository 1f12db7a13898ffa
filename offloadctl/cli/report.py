"""A Markdown report of what a plan does, to attach to a pull request or a CI job.

`markdown_report` turns a simulation (`offloadctl.simulation.result.SimResult`) and, when there is one, the
plan it simulated into Markdown: the peak device memory before and after, the lower bound, what
moved and why, and the estimated time, with the memory timeline plot beside it. `write_report`
writes the report and its plot (``report.md`` and ``report.png`` or ``.svg``), atomically. Nothing
here edits a model or a plan.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

from offloadctl._version import __version__
from offloadctl.cli.plot import plot_timeline
from offloadctl.core.errors import OffloadError
from offloadctl.core.files import atomic_write_text
from offloadctl.core.plantypes import Plan
from offloadctl.core.units import fmt_bytes
from offloadctl.planning.explain import explain_rows
from offloadctl.simulation.costs import STREAMS_NOTE
from offloadctl.simulation.result import SimResult

__all__ = ["markdown_report", "write_report", "report_plot_path", "MAX_ROWS"]

#: Offloaded tensors listed one per row; the rest are summed up in one line.
MAX_ROWS = 50

SLOWDOWN_WARNING = 1.5


def _cell(text: Any) -> str:
    """Text safe inside a Markdown table cell."""
    return str(text).replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def _pct(before: int, after: int) -> str:
    return f"{100.0 * (after - before) / before:+.1f}%" if before else ""


def _where(trace_at: dict[str, Any]) -> str:
    if trace_at["step"] is None:
        return "-"
    return f"#{trace_at['position']} {trace_at['node']}"


def report_plot_path(report: str | os.PathLike[str], fmt: str = "png") -> Path:
    """Where the plot beside a report goes: ``plan.md`` -> ``plan.png``."""
    path = Path(report)
    return path.with_name(f"{path.stem}.{fmt}" if path.suffix else f"{path.name}.{fmt}")


def markdown_report(
    result: SimResult,
    plan: Plan | None = None,
    *,
    plot: str | os.PathLike[str] | None = None,
    plot_note: str | None = None,
) -> str:
    """The report as Markdown text.

    Args:
        result: the simulation (`offloadctl.simulation.result.simulate`) of the model with ``plan``, or of a
            rewritten model.
        plan: the scheduled plan simulated, if any: its offloads are listed with the reason each
            was chosen, and its rejected candidates counted by reason.
        plot: the timeline image, as the link the report should carry (relative to the report).
        plot_note: said instead of the image when there is none (e.g. matplotlib is missing).
    """
    doc = result.to_json(timeline_limit=0)
    peak = doc["peak_bytes"]
    lines: list[str] = [f"# offloadctl report: {Path(result.model).name}", ""]
    facts = [("model", f"`{result.model}`")]
    if result.plan_path or plan is not None:
        facts.append(("plan", f"`{result.plan_path}`" if result.plan_path else "(in memory)"))
    if plan is not None:
        facts.append(("strategy", plan.get("strategy", "distance")))
    elif result.rewritten:
        facts.append(("plan", "already applied (the model contains copies)"))
    facts.append(("offloadctl", __version__))
    lines += ["| | |", "|---|---|", *(f"| {k} | {_cell(v)} |" for k, v in facts), ""]

    lines += ["## Peak device memory", ""]
    lines += [
        "| | before | after | change |",
        "|---|---:|---:|---|",
        f"| peak | {fmt_bytes(peak['before'])} | {fmt_bytes(peak['after'])} | {_pct(peak['before'], peak['after'])} |",
        f"| peak at | {_cell(_where(doc['peak_at']['before']))} | {_cell(_where(doc['peak_at']['after']))} | |",
        f"| resident weights | {fmt_bytes(doc['resident_weight_bytes']['before'])} | "
        f"{fmt_bytes(doc['resident_weight_bytes']['after'])} | |",
        "",
    ]
    lb = doc["lower_bound_at"]
    lines.append(
        f"Lower bound: **{fmt_bytes(doc['lower_bound_bytes'])}**, the largest working set of a single step "
        f"(#{lb['position']} {_cell(lb['node'])}); no plan can go below it."
    )
    if result.unknown_tensors:
        lines.append(
            f"{len(result.unknown_tensors)} tensor(s) have an unknown size and count as 0 bytes in every figure "
            "(pin dynamic inputs with `--input-shape` or `--dim`)."
        )
    lines.append("")
    if plot is not None:
        lines += [f"![device memory before and after, per step]({Path(plot).as_posix()})", ""]
    elif plot_note:
        lines += [f"_{plot_note}_", ""]

    lines += _time_section(result, doc)
    lines += _moves_section(result, doc, plan)
    return "\n".join(lines).rstrip() + "\n"


def _time_section(result: SimResult, doc: dict[str, Any]) -> list[str]:
    if result.times is None or result.profile is None:
        return []
    t, stall, slow = doc["time_s"], doc["stall_s"], doc["slowdown"]
    lines = [
        f"## Estimated time (profile {result.profile.name})",
        "",
        "| | time | stall | slowdown |",
        "|---|---:|---:|---:|",
        f"| baseline (no copies) | {t['baseline'] * 1e3:.3f} ms | | 1.00x |",
        f"| copies in line (what onnxruntime runs today) | {t['serialized'] * 1e3:.3f} ms | "
        f"{stall['serialized'] * 1e3:.3f} ms | {slow['serialized']:.2f}x |",
        f"| copies on copy streams ({STREAMS_NOTE}) | {t['overlapped'] * 1e3:.3f} ms | "
        f"{stall['overlapped'] * 1e3:.3f} ms | {slow['overlapped']:.2f}x |",
        "",
        "Estimates from the device profile's figures, not measurements.",
    ]
    if slow["serialized"] > SLOWDOWN_WARNING:
        lines.append(
            f"**Warning:** the estimated slowdown with copies in line is {slow['serialized']:.2f}x "
            f"(over {SLOWDOWN_WARNING}x)."
        )
    return lines + [""]


def _moves_section(result: SimResult, doc: dict[str, Any], plan: Plan | None) -> list[str]:
    moved, copies = doc["transfer_bytes"], doc["copies"]
    lines = [
        "## What moved and why",
        "",
        f"{copies['d2h']} device-to-host copies moving {fmt_bytes(moved['d2h'])}, {copies['h2d']} host-to-device "
        f"copies moving {fmt_bytes(moved['h2d'])}; host memory peak {fmt_bytes(doc['host_peak_bytes'])}.",
        "",
    ]
    if plan is None:
        return lines
    budget = plan.get("budget")
    if budget:
        req = budget.get("requested_bytes")
        objective = (budget.get("objective") or {}).get("objective", "bytes")
        copies = budget.get("copies") or "inline"
        mode = "copies in line" if copies == "inline" else f"copies on streams ({STREAMS_NOTE})"
        lines += [
            f"Budget {fmt_bytes(req) if req is not None else '(none)'}: predicted peak "
            f"{fmt_bytes(budget.get('predicted_peak_bytes'))}, bytes moved {fmt_bytes(budget.get('bytes_moved'))}; "
            f"objective {objective}, {mode}.",
            "",
        ]
        within = budget.get("max_slowdown")
        if within:
            if within["within"]:
                lines += [
                    f"Max slowdown {within['requested']:g}x: the budget {fmt_bytes(within['budget_bytes'])} gives the "
                    f"lowest peak of {within['budgets_tried']} budgets tried, "
                    f"at an estimated {within['slowdown']:.3f}x the baseline (profile {within['profile']}).",
                    "",
                ]
            else:
                lines += [
                    f"Max slowdown {within['requested']:g}x: no cut in peak memory stays within it "
                    f"({within['budgets_tried']} budgets tried); the plan offloads nothing.",
                    "",
                ]
    rows = [r for r in explain_rows(plan) if r["status"] == "offloaded"]
    if rows:
        lines += ["| tensor | kind | bytes | reloads | why |", "|---|---|---:|---:|---|"]
        for r in rows[:MAX_ROWS]:
            lines.append(
                f"| `{_cell(r['tensor'])}` | {r['kind']} | {fmt_bytes(r['bytes'])} | {r['reload_groups']} | "
                f"{_cell(r['reason'] + ': ' + r['detail'])} |"
            )
        if len(rows) > MAX_ROWS:
            rest = rows[MAX_ROWS:]
            lines.append(f"| … {len(rest)} more | | {fmt_bytes(sum(r['bytes'] or 0 for r in rest))} | | |")
        lines.append("")
    else:
        lines += ["The plan offloads nothing.", ""]
    reasons = Counter(r["reason"] for r in plan["rejected"])
    if reasons:
        lines += [
            "Not offloaded: " + ", ".join(f"{n} {reason}" for reason, n in sorted(reasons.items())) + ".",
            "",
        ]
    return lines


def write_report(
    path: str | os.PathLike[str],
    result: SimResult,
    plan: Plan | None = None,
    *,
    plot: str | os.PathLike[str] | None = None,
    plot_format: str = "png",
) -> list[Path]:
    """Write the Markdown report and the timeline plot beside it; return the files written.

    Args:
        path: the report (``.md``).
        result, plan: as for `markdown_report`.
        plot: an image already drawn for this result (e.g. by ``simulate --plot``) to link to;
            otherwise the plot is drawn beside the report (`report_plot_path`).
        plot_format: ``png`` or ``svg`` for a plot drawn here.

    When matplotlib is missing the report is written without the plot and says how to get it.
    """
    out = Path(path)
    written: list[Path] = []
    note = None
    if plot is None:
        drawn = report_plot_path(out, plot_format)
        try:
            plot_timeline(result, str(drawn))
        except OffloadError as exc:
            if "matplotlib" not in exc.message:
                raise
            note = "No timeline plot: matplotlib is not installed (pip install 'offloadctl[plot]')."
        else:
            plot = drawn
            written.append(drawn)
    link = None
    if plot is not None:
        link = os.path.relpath(Path(plot).resolve(), out.resolve().parent)
    atomic_write_text(out, markdown_report(result, plan, plot=link, plot_note=note))
    return [out, *written]
