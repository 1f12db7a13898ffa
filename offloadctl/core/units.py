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
from typing import NoReturn

from offloadctl.core.errors import OffloadError

__all__ = ["MAX_BYTES", "fmt_bytes", "byte_arg", "parse_bytes"]

MAX_BYTES = 2**63 - 1  # sizes are 64-bit integers everywhere (onnxruntime, numpy, the plan)

_BINARY = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")

#: the units a size may carry, spelled as the standards write them: SI (kB or KB, MB, GB, TB, PB: powers of
#: 1000) and IEC (KiB, MiB, GiB, TiB, PiB: powers of 1024, in any case: the i says binary)
_SI = {"B": 1, "kB": 1000, "KB": 1000, "MB": 1000**2, "GB": 1000**3, "TB": 1000**4, "PB": 1000**5}
_IEC = {"kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4, "pib": 1024**5}
#: the prefixes a bare or lower-case unit is taken for (``8M``, ``8mb``, ``8k``): ambiguous, refused
_PREFIXES = {"k": "k", "m": "M", "g": "G", "t": "T", "p": "P"}


def _unit(unit: str) -> int | None:
    """The bytes one ``unit`` stands for, or None for a unit this module does not take."""
    if unit == "":
        return 1
    if unit in _SI:
        return _SI[unit]
    return _IEC.get(unit.lower())


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

    kB (or KB), MB, GB, TB, PB are powers of 1000 (SI); KiB, MiB, GiB, TiB, PiB powers of 1024 (IEC).
    A unit that could mean either (``8M``, ``8mb``, ``8k``, ``8Gb``) is refused with both readings.

    Raises:
        OffloadError: the text is not a byte size, its unit is ambiguous, or it is more than `MAX_BYTES`.
    """
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", text)
    if not match:
        raise OffloadError(f"{text!r} is not a byte size", hint="write it like 4096, 800MB or 1.5GiB")
    number, unit = match.groups()
    scale = _unit(unit)
    if scale is None:
        _refuse_unit(text, number, unit)
    value = int(Fraction(number) * scale)
    if value > MAX_BYTES:
        raise OffloadError(
            f"{text!r} is more bytes than any device has (at most {MAX_BYTES} bytes, 8 EiB)",
            hint="write it like 4096, 800MB or 1.5GiB",
        )
    return value


def _refuse_unit(text: str, number: str, unit: str) -> NoReturn:
    """Refuse an unknown unit, and an ambiguous one (a bare prefix, or a prefix and a b in the wrong
    case: ``M``, ``mb``, ``Gb``) with both of its readings."""
    bare = unit.lower() in _PREFIXES or (len(unit) == 2 and unit[0].lower() in _PREFIXES and unit[1] in "bB")
    if not bare:
        raise OffloadError(f"{text!r} is not a byte size", hint="write it like 4096, 800MB or 1.5GiB")
    prefix = _PREFIXES[unit[0].lower()]
    si, iec = f"{prefix}B", f"{prefix.upper()}iB"
    decimal, binary = int(Fraction(number) * _SI[si]), int(Fraction(number) * _IEC[iec.lower()])
    raise OffloadError(
        f"{text!r} is ambiguous: {unit} could mean {si} (powers of 1000) or {iec} (powers of 1024)",
        hint=f"write {number}{si} for {decimal:,} bytes or {number}{iec} for {binary:,} bytes",
    )
