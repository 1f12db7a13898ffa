"""The plots the command line draws: the memory timeline of a simulation (``simulate --plot`` and
``--report``) and the frontier of peak memory against estimated time (``frontier --plot``).

Both are written atomically as PNG or SVG with matplotlib (the ``plot`` extra); without it, or for
another file type, they raise `OffloadError`. Nothing here computes a figure: the simulator
(`offloadctl.simulation`) and the frontier (`offloadctl.planning.tradeoff`) do.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from offloadctl.core.errors import OffloadError
from offloadctl.core.files import atomic_write
from offloadctl.planning.tradeoff import Point, dominated

if TYPE_CHECKING:
    from offloadctl.simulation.memory import MemoryTrace
    from offloadctl.simulation.result import SimResult

__all__ = ["plot_frontier", "plot_timeline"]


def _figure_class(out: Path, example: str) -> tuple[str, Any]:
    """(the file type, matplotlib's Figure) for a plot written to ``out``.

    Raises:
        OffloadError: matplotlib is missing or the file type is not .png/.svg.
    """
    fmt = out.suffix.lower().lstrip(".")
    if fmt not in ("png", "svg"):
        raise OffloadError(f"plot file {out} must end in .png or .svg", hint=f"for example --plot {example}")
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise OffloadError(
            "--plot needs matplotlib, which is not installed", hint="pip install 'offloadctl[plot]'"
        ) from None
    return fmt, Figure


def plot_timeline(result: SimResult, path: str, *, title: str | None = None) -> None:
    """Write the device memory timeline before and after as PNG or SVG (needs matplotlib).

    Raises:
        OffloadError: matplotlib is missing or the file type is not .png/.svg.
    """
    out = Path(path)
    fmt, Figure = _figure_class(out, "memory.png")
    fig = timeline_figure(result, Figure, title=title)
    atomic_write(out, lambda tmp: fig.savefig(tmp, format=fmt))


def timeline_figure(result: SimResult, Figure: Any, *, title: str | None = None) -> Any:
    """The figure `plot_timeline` writes (``Figure``: matplotlib's class)."""
    before, after = result.before, result.after
    scale, unit = _plot_unit(max(before.peak_bytes, after.peak_bytes, 1))
    fig = Figure(figsize=(11, 5.2), dpi=110, layout="constrained")
    ax = fig.add_subplot()
    n = len(before.kinds)
    # copies sit between nodes: a D2H after p at p+0.5, H2Ds before q just before q (spread in the gap)
    xs_after = _after_x(after)
    ax.step(
        range(n), [b / scale for b in before.device], where="mid", color="#888888", lw=1.6, label="before (no plan)"
    )
    ax.fill_between(range(n), [b / scale for b in before.device], step="mid", color="#bbbbbb", alpha=0.35)
    if after is not before:
        ax.step(
            xs_after, [b / scale for b in after.device], where="mid", color="#1f77b4", lw=1.8, label="after (with plan)"
        )
    ax.axhline(
        result.lower_bound_bytes / scale, color="#d62728", ls="--", lw=1, label="lower bound (largest single step)"
    )
    labels = []
    for trace, xs, color, name in (
        (before, list(range(n)), "#555555", "before"),
        (after, xs_after, "#1f77b4", "after"),
    ):
        s = trace.peak_step
        if s is None or (name == "after" and after is before):
            continue
        ax.plot([xs[s]], [trace.device[s] / scale], "o", color=color, ms=6, zorder=5)
        right = xs[s] > 0.6 * n
        labels.append(
            ax.annotate(
                f"{name} peak {trace.device[s] / scale:.2f} {unit}\nat #{trace.positions[s]} {trace.labels[s]}",
                (xs[s], trace.device[s] / scale),
                textcoords="offset points",
                xytext=(-8 if right else 8, 8),
                ha="right" if right else "left",
                va="bottom",
                fontsize=8,
                color=color,
            )
        )
    h2d = [x for x, k in zip(xs_after, after.kinds) if k == "h2d"]
    d2h = [x for x, k in zip(xs_after, after.kinds) if k == "d2h"]
    if d2h:
        ax.plot(d2h, [0] * len(d2h), "v", color="#ff7f0e", ms=5, clip_on=False, label=f"D2H copies ({len(d2h)})")
    if h2d:
        ax.plot(h2d, [0] * len(h2d), "^", color="#2ca02c", ms=5, clip_on=False, label=f"H2D copies ({len(h2d)})")
    ax.set_xlabel("position in execution order (node)")
    ax.set_ylabel(f"device working set ({unit})")
    top = max(before.peak_bytes, after.peak_bytes, result.lower_bound_bytes) / scale
    ax.set_ylim(0, top * 1.18 if top > 0 else 1)
    ax.set_xlim(-0.5, max(n - 0.5, 0.5))
    ax.grid(True, alpha=0.3)
    saved = before.peak_bytes - after.peak_bytes
    pct = 100.0 * saved / before.peak_bytes if before.peak_bytes else 0.0
    ax.set_title(
        title
        or f"{Path(result.model).name}: peak {before.peak_bytes / scale:.2f} -> {after.peak_bytes / scale:.2f} {unit} "
        f"({pct:.0f}% less)",
        fontsize=11,
    )
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=5, fontsize=8, frameon=False)
    _apart(fig, labels)
    return fig


def _apart(fig: Any, labels: list[Any]) -> None:
    """Move the second peak label (after) below its point when it would cover the first (before)."""
    if len(labels) < 2:
        return
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()  # the layout is settled when the figure is drawn
    renderer = canvas.get_renderer()
    first, second = (label.get_window_extent(renderer) for label in labels[:2])
    if first.overlaps(second):
        x, _ = labels[1].get_position()
        labels[1].set_position((x, -12))
        labels[1].set_verticalalignment("top")


def _plot_unit(peak: int) -> tuple[float, str]:
    for scale, unit in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if peak >= 2 * scale:
            return float(scale), unit
    return 1.0, "B"


def _after_x(trace: MemoryTrace) -> list[float]:
    """x coordinate of each step: nodes at their position, copies in the gaps next to them."""
    xs: list[float] = []
    steps = len(trace.kinds)
    s = 0
    while s < steps:
        kind, pos = trace.kinds[s], trace.positions[s]
        if kind == "node":
            xs.append(float(pos))
            s += 1
            continue
        # a run of copies in the same gap: spread them over (gap start, gap end)
        run = s
        while run < steps and trace.kinds[run] != "node":
            run += 1
        gap_end = float(trace.positions[run]) if run < steps else float(pos) + 0.5
        gap_start = gap_end - 1.0 if run < steps else float(pos) - 0.5
        count = run - s
        for k in range(count):
            xs.append(gap_start + (k + 1) / (count + 1))
        s = run
    return xs


def plot_frontier(
    frontier: dict[str, list[Point]],
    path: str | Path,
    *,
    peak_bytes: int,
    lower_bound_bytes: int,
    default: dict[str, Point] | None = None,
    title: str = "",
) -> None:
    """Draw peak memory against estimated slowdown, one line per copy mode, as PNG or SVG (needs matplotlib).

    Raises:
        OffloadError: matplotlib is missing or the file type is not .png/.svg.
    """
    out = Path(path)
    fmt, Figure = _figure_class(out, "frontier.png")
    scale, unit = _plot_unit(max(peak_bytes, 1))
    fig = Figure(figsize=(8, 5), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    styles = {
        "inline": ("#1f77b4", "-", "o", "copies in line (onnxruntime today)"),
        "streams": ("#ff7f0e", "--", "s", "copies on streams (estimate, not yet timed on a device)"),
    }
    for mode, pts in frontier.items():
        if not pts:
            continue
        color, line, marker, label = styles[mode]
        flags = dominated(pts)
        front = sorted((p for p, d in zip(pts, flags) if not d), key=lambda p: p.peak_bytes)
        ax.plot(
            [p.peak_bytes / scale for p in front],
            [p.slowdown for p in front],
            line,
            marker=marker,
            ms=4,
            color=color,
            label=label,
            drawstyle="steps-post",
        )
        others = [p for p, d in zip(pts, flags) if d]
        if others:
            ax.plot(
                [p.peak_bytes / scale for p in others],
                [p.slowdown for p in others],
                marker,
                ms=4,
                color=color,
                markerfacecolor="none",
                alpha=0.6,
            )
        if default and mode in default:
            d = default[mode]
            ax.plot([d.peak_bytes / scale], [d.slowdown], "*", ms=14, color=color, markeredgecolor="black", zorder=5)
    if default:
        ax.plot(
            [], [], "*", ms=12, color="white", markeredgecolor="black", label="HyperOffload default plan (plan MODEL)"
        )
    ax.plot([], [], "o", ms=4, color="#555555", markerfacecolor="none", label="dominated (a lower peak is as fast)")
    ax.axvline(lower_bound_bytes / scale, color="#d62728", ls=":", lw=1, label="lower bound")
    ax.axvline(peak_bytes / scale, color="#888888", ls=":", lw=1, label="peak without offload")
    ax.set_xlabel(f"peak device memory ({unit})")
    ax.set_ylabel("estimated time (x baseline)")
    ax.grid(True, alpha=0.3)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="upper right")
    atomic_write(out, lambda tmp: fig.savefig(tmp, format=fmt))
