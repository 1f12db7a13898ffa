"""Byte sizes for people: the one formatter and parser every message, table and report uses.

`fmt_bytes` writes a size in binary units (``9.57 MiB``), the units the tables use; `byte_arg`
writes a size a user can paste back into an option (``--budget 9.58MiB``), rounded up so that it
is never below the size it stands for; `parse_bytes` reads what users type (``1.5GiB``, ``800MB``,
``4096``), exactly. Library code (planning stages, reports) and the command line share them, so an
error and a table never disagree on units.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

from offloadctl.core.errors import OffloadError

__all__ = ["MAX_BYTES", "fmt_bytes", "byte_arg", "parse_bytes"]

MAX_BYTES = 2**63 - 1  # sizes are 64-bit integers everywhere (onnxruntime, numpy, the plan)

_BINARY = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "p": 1000**5,
    "pb": 1000**5,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
    "pib": 1024**5,
}


def _scaled(n: float) -> tuple[float, str]:
    value = float(n)
    for unit in _BINARY:
        if abs(value) < 1024 or unit == _BINARY[-1]:
            return value, unit
        value /= 1024
    raise AssertionError("unreachable")  # pragma: no cover


def fmt_bytes(n: int | float | None, *, round_up: bool = False) -> str:
    """``1536`` -> ``"1.50 KiB"``; ``None`` (unknown) -> ``"?"``.

    Bytes are whole (``"512 B"``); larger units carry two decimals. With ``round_up`` the last
    decimal is rounded up, for "at least" figures (a lower bound, a budget to give).
    """
    if n is None:
        return "?"
    value, unit = _scaled(n)
    if unit == "B":
        return f"{math.ceil(value) if round_up else round(value):.0f} B"
    if round_up:
        value = math.ceil(value * 100 - 1e-9) / 100
    return f"{value:.2f} {unit}"


def byte_arg(n: int) -> str:
    """A size to paste after an option (``9.58MiB``): `parse_bytes` of it is at least ``n``."""
    text = fmt_bytes(n, round_up=True).replace(" ", "")
    try:
        if parse_bytes(text) >= n:
            return text
    except OffloadError:  # a unit parse_bytes does not take (EiB): say it in bytes
        pass
    return str(int(n))


def parse_bytes(text: str) -> int:
    """Parse ``'1.5GiB'``, ``'800MB'``, ``'4096'`` into bytes, exactly (no floating-point rounding).

    KB/MB/GB/TB/PB are powers of 1000, KiB/MiB/GiB/TiB/PiB powers of 1024.

    Raises:
        OffloadError: the text is not a byte size, or more than `MAX_BYTES`.
    """
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", text)
    if not match or match.group(2).lower() not in _UNITS:
        raise OffloadError(f"{text!r} is not a byte size", hint="write it like 4096, 800MB or 1.5GiB")
    value = int(Fraction(match.group(1)) * _UNITS[match.group(2).lower()])
    if value > MAX_BYTES:
        raise OffloadError(
            f"{text!r} is more bytes than any device has (at most {MAX_BYTES} bytes, 8 EiB)",
            hint="write it like 4096, 800MB or 1.5GiB",
        )
    return value
