"""Human units for byte sizes, shared by messages, tables and reports."""

from __future__ import annotations

__all__ = ["fmt_bytes"]


def fmt_bytes(n: int | float | None) -> str:
    """``1536`` -> ``'1.50 KiB'``; None -> ``'?'``."""
    if n is None:
        return "?"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        if abs(value) < 1024 or unit == "EiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    return f"{value:.2f} EiB"  # pragma: no cover
