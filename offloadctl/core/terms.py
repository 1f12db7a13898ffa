"""The command line's options in the Python API's terms: an error raised through ``offloadctl.load``,
``make_plan``, ``apply``, ``simulate`` or ``run`` names keywords (``budget="96KiB"``,
``input_shapes={"x": [1, 3, 224, 224]}``), not flags (`in_python_terms`).

The library's errors are written once, for both callers, in the command line's words; this is where
they are said again for a caller of the library. A full command a hint gives (``offloadctl plan ...``)
stays as it is: it is one to run.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping

__all__ = ["in_python_terms", "RENAMED"]

#: options whose keyword is not the option's name with ``_`` for ``-``
RENAMED = {"input-shape": "input_shapes", "dim": "dims", "execution-order": "order"}
#: words after a flag that are the sentence going on, not the flag's value
_PROSE = frozenset({"or", "and", "to", "instead", "on", "in", "the", "a", "with", "for", "is", "at", "of", "(on"})
_FLAG = re.compile(r"--(?P<no>no-)?(?P<name>[a-z][a-z0-9-]*)(?:(?P<sep>[ =])(?P<value>[^\s;)]+))?")
_SHAPE = re.compile(r"(?P<name>[^\s=]+)=(?P<dims>[^\s;)]+)")


def in_python_terms(text: str, flags: Collection[str], renamed: Mapping[str, str] = RENAMED) -> str:
    """``text`` with each ``--option [VALUE]`` written as the keyword the Python API takes: ``name=VALUE``
    (a string quoted), ``name=True`` for one of ``flags`` (``--no-name``: ``False``), ``input_shapes={...}``
    and ``dims={...}`` for the pins. A clause that runs a command (``offloadctl ...``) is left alone."""
    return ";".join(
        part if "offloadctl " in part else _FLAG.sub(lambda m: _keyword(m, flags, renamed), part)
        for part in text.split(";")
    )


def _keyword(match: re.Match[str], flags: Collection[str], renamed: Mapping[str, str]) -> str:
    """One ``--option [VALUE]`` as a keyword (see `in_python_terms`)."""
    name, value, sep = match["name"], match["value"], match["sep"] or ""
    key = renamed.get(name, name.replace("-", "_"))
    rest = ""
    if value is not None and name != "input-shape" and "," in value:
        value, rest = value.split(",", 1)  # the sentence goes on after the value
        rest = "," + rest
    elif value is not None and value.endswith(","):  # a shape's dimensions hold commas; the sentence's last
        value, rest = value[:-1], ","
    return _written(match, key, name, value, sep, flags) + rest


def _written(match: re.Match[str], key: str, name: str, value: str | None, sep: str, flags: Collection[str]) -> str:
    if name in flags or match["no"]:
        tail = f"{sep}{value}" if value else ""
        return f"{key}={match['no'] is None}{tail}"
    if value is None or (sep == " " and value in _PROSE):
        tail = f"{sep}{value}" if value else ""
        return f"{key}=...{tail}"
    if name in ("input-shape", "dim") and (shape := _SHAPE.fullmatch(value)):
        if name == "dim":
            return f"{key}={{{shape['name']!r}: {_literal(shape['dims'])}}}"
        dims = [d for d in shape["dims"].strip("[]").split(",") if d]
        return f"{key}={{{shape['name']!r}: [{', '.join(_literal(d) for d in dims)}]}}"
    return f"{key}={_literal(value)}"


def _literal(value: str) -> str:
    """A value as Python source: a number as it is, a placeholder (``SIZE``, ``BYTES``, ``D0``, ``...``) bare,
    else a string."""
    if re.fullmatch(r"-?[0-9]+(\.[0-9]+)?(e-?[0-9]+)?|\.\.\.|[A-Z][A-Z0-9_.]*", value):
        return value
    if value.lower() in ("nan", "inf", "-inf"):
        return f"float({value.lower()!r})"
    return repr(value)
