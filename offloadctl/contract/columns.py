"""Yes/no checks of long lists of JSON values against a JSON Schema, column by column.

A big model's plan holds a ``rejected`` entry for almost every tensor and thousands of ``offloads``
with their reload groups and uses. Checking them one value at a time (fastjsonschema's compiled
code) was a large part of writing and of reading such a plan. `column_check` compiles a schema into
a check of a whole list at once: the values of one key across every object, or the items of every
array, are gathered into one column and checked by the interpreter's builtins (``set``, ``map``,
``min``).

It understands these forms, with JSON Schema's meaning, and gives None for any other schema:

- ``{"$ref": "#/$defs/NAME"}``;
- objects: ``type: object``, ``required``, ``additionalProperties: false`` and ``properties``,
  with an ``if`` that bounds the length of some of its arrays (``maxItems``, ``minItems``) and a
  ``then`` of further ``properties``;
- ``properties`` alone (they constrain the keys an object has; any other value meets them);
- arrays: ``type: array``, ``items`` and ``minItems``; and rows of a table, ``prefixItems`` with
  ``items: false`` and ``minItems`` the number of cells (each cell checked as one column);
- scalars: ``type`` among string, integer, null and boolean, ``enum`` of strings, ``const`` (a
  string, boolean or null, or a list of strings), ``minimum`` and ``minLength``;
- ``oneOf`` whose branches each declare one type, no two the same;
- ``description``, ``title`` and ``$comment`` anywhere.

A check may say "no" where JSON Schema says "yes" only for values JSON never decodes to (a dict or
list subclass); callers then ask jsonschema, which stays the reference.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["ColumnCheck", "column_check"]

ColumnCheck = Callable[[Sequence[Any]], bool]

_ANNOTATIONS = frozenset({"$comment", "title", "description"})
_OBJECT = frozenset({"type", "required", "additionalProperties", "properties", "if", "then"})
_ARRAY = frozenset({"type", "items", "minItems", "prefixItems"})
_SCALAR = frozenset({"type", "enum", "const", "minimum", "minLength"})
_LENGTHS = frozenset({"maxItems", "minItems"})
_SCALAR_TYPES = {"string": str, "integer": int, "null": type(None), "boolean": bool}
_DEFS = "#/$defs/"
_ABSENT = object()


def column_check(schema: Any, defs: Mapping[str, Any], *, depth: int = 0) -> ColumnCheck | None:
    """A check that every value of a list meets ``schema`` (``defs``: the ``$defs`` its ``$ref``
    entries name), or None for a schema of another form (see the module docstring)."""
    if not isinstance(schema, dict) or depth > 16:
        return None
    keys = set(schema) - _ANNOTATIONS
    if "$ref" in keys:
        ref = schema["$ref"]
        if keys != {"$ref"} or not isinstance(ref, str) or not ref.startswith(_DEFS):
            return None
        return column_check(defs.get(ref[len(_DEFS) :]), defs, depth=depth + 1)
    if "oneOf" in keys:
        return _one_of(schema["oneOf"], defs, depth) if keys == {"oneOf"} else None
    kind = schema.get("type")
    if keys == {"properties"}:
        return _properties(schema["properties"], defs, depth)
    if kind == "object":
        return _objects(schema, defs, depth) if keys <= _OBJECT else None
    if kind == "array":
        return _arrays(schema, defs, depth) if keys <= _ARRAY else None
    return _scalars(schema) if keys <= _SCALAR else None


def _objects(schema: dict[str, Any], defs: Mapping[str, Any], depth: int) -> ColumnCheck | None:
    properties = schema.get("properties")
    required = schema.get("required", [])
    if schema.get("additionalProperties") is not False or not isinstance(properties, dict):
        return None
    if not isinstance(required, list) or not all(isinstance(k, str) for k in required):
        return None
    each = _properties(properties, defs, depth, present=frozenset(required))
    needed, allowed = frozenset(required), frozenset(properties)
    if each is None or not needed <= allowed or ("if" in schema) != ("then" in schema):
        return None
    condition = then = None
    if "if" in schema:
        condition, then = _lengths(schema["if"]), column_check(schema["then"], defs, depth=depth + 1)
        if condition is None or then is None:
            return None

    def check(values: Sequence[Any]) -> bool:
        if not set(map(type, values)) <= {dict}:
            return False
        if not all(needed <= keys <= allowed for keys in set(map(frozenset, values))):
            return False
        if not each(values):
            return False
        if condition is not None and then is not None:
            chosen = [v for v in values if condition(v)]
            return not chosen or then(chosen)
        return True

    return check


def _properties(
    properties: Any, defs: Mapping[str, Any], depth: int, *, present: frozenset[str] = frozenset()
) -> ColumnCheck | None:
    """``properties`` on their own: each key's values, where objects have the key, meet its schema
    (``present``: keys every object is known to have)."""
    if not isinstance(properties, dict):
        return None
    checks: dict[str, ColumnCheck] = {}
    for key, sub in properties.items():
        compiled = column_check(sub, defs, depth=depth + 1)
        if compiled is None:
            return None
        checks[key] = compiled

    def check(values: Sequence[Any]) -> bool:
        objects = values
        if not set(map(type, values)) <= {dict}:  # other values meet any properties
            objects = [v for v in values if type(v) is dict]
            if any(isinstance(v, dict) and type(v) is not dict for v in values):
                return False  # a dict subclass: left to jsonschema
        for key, meets in checks.items():
            if key in present:
                column = list(map(operator.itemgetter(key), objects))
            else:
                column = [
                    v
                    for v in map(dict.get, objects, itertools.repeat(key), itertools.repeat(_ABSENT))
                    if v is not _ABSENT
                ]
            if column and not meets(column):
                return False
        return True

    return check


def _lengths(schema: Any) -> Callable[[dict[str, Any]], bool] | None:
    """An ``if`` of the form ``{"properties": {KEY: {"maxItems": N, "minItems": M}}}``, as a test of
    one object (an absent key, or a value that is no array, meets it)."""
    if not isinstance(schema, dict) or set(schema) - _ANNOTATIONS != {"properties"}:
        return None
    bounds: dict[str, tuple[int, float]] = {}
    for key, sub in schema["properties"].items():
        if not isinstance(sub, dict) or not set(sub) - _ANNOTATIONS <= _LENGTHS:
            return None
        low, high = sub.get("minItems", 0), sub.get("maxItems", float("inf"))
        if any(isinstance(b, bool) or not isinstance(b, (int, float)) for b in (low, high)):
            return None
        bounds[key] = (low, high)

    def test(value: dict[str, Any]) -> bool:
        for key, (low, high) in bounds.items():
            found = value.get(key, _ABSENT)
            if isinstance(found, list) and not low <= len(found) <= high:
                return False
        return True

    return test


def _arrays(schema: dict[str, Any], defs: Mapping[str, Any], depth: int) -> ColumnCheck | None:
    least = schema.get("minItems", 0)
    if isinstance(least, bool) or not isinstance(least, int):
        return None
    if "prefixItems" in schema:
        return _rows(schema["prefixItems"], schema.get("items"), least, defs, depth)
    items = column_check(schema["items"], defs, depth=depth + 1) if "items" in schema else None
    if items is None:
        return None

    def check(values: Sequence[Any]) -> bool:
        if not set(map(type, values)) <= {list}:
            return False
        if least and values and min(map(len, values)) < least:
            return False
        column = list(itertools.chain.from_iterable(values))
        return not column or items(column)

    return check


def _rows(cells: Any, rest: Any, least: int, defs: Mapping[str, Any], depth: int) -> ColumnCheck | None:
    """Rows of a table: arrays of exactly ``len(cells)`` items (``items: false`` and a ``minItems`` of
    that many), the values of each cell checked together as one column."""
    if not isinstance(cells, list) or not cells or rest is not False or least != len(cells):
        return None
    found = [column_check(cell, defs, depth=depth + 1) for cell in cells]
    checks = [c for c in found if c is not None]
    if len(checks) != len(found):
        return None
    width = len(cells)

    def check(values: Sequence[Any]) -> bool:
        if not values:
            return True
        if not set(map(type, values)) <= {list} or set(map(len, values)) != {width}:
            return False
        cells = list(itertools.chain.from_iterable(values))  # every row is ``width`` long: column j is every width-th
        return all(meets(cells[j::width]) for j, meets in enumerate(checks))

    return check


def _scalars(schema: dict[str, Any]) -> ColumnCheck | None:
    kinds = schema.get("type")
    enum = schema.get("enum")
    if "const" in schema:
        const = schema["const"]
        if isinstance(const, list) and all(type(v) is str for v in const) and set(schema) - _ANNOTATIONS == {"const"}:
            return _const_strings(const)
        if enum is not None or not isinstance(const, (str, bool, type(None))):
            return None
        if kinds is None:
            kinds = {bool: "boolean", str: "string", type(None): "null"}[type(const)]
        return _const(const, _scalars({k: v for k, v in schema.items() if k != "const"} | {"type": kinds}))
    minimum, shortest = schema.get("minimum"), schema.get("minLength", 0)
    if kinds is None and enum is None:  # any value at all
        return None
    kinds = [kinds] if isinstance(kinds, str) else kinds if kinds is not None else ["string"]
    if (
        not isinstance(kinds, list)
        or not kinds
        or set(kinds) - set(_SCALAR_TYPES)
        or (enum is not None and not (isinstance(enum, list) and all(isinstance(v, str) for v in enum)))
        or (minimum is not None and (isinstance(minimum, bool) or not isinstance(minimum, (int, float))))
        or isinstance(shortest, bool)
        or not isinstance(shortest, int)
    ):
        return None
    allowed = {_SCALAR_TYPES[k] for k in kinds}
    integers = "integer" in kinds
    if integers:
        allowed.add(float)  # JSON may write 6 as 6.0: checked below
    strings = frozenset(enum) if enum is not None else None

    def check(values: Sequence[Any]) -> bool:
        found = set(map(type, values))
        if not found <= allowed:
            return False
        if strings is not None:
            return found <= {str} and set(values) <= strings
        if float in found and not all(v.is_integer() for v in values if type(v) is float):
            return False
        if minimum is not None and integers and found & {int, float}:
            numbers = values if found <= {int, float} else [v for v in values if type(v) is int or type(v) is float]
            if min(numbers) < minimum:
                return False
        if shortest and str in found:
            return min(len(v) for v in values if type(v) is str) >= shortest
        return True

    return check


def _const(const: str | bool | None, rest: ColumnCheck | None) -> ColumnCheck | None:
    """``const`` with the schema's other keywords (``rest``): the value itself, of its own type (JSON
    tells true from 1)."""
    if rest is None:
        return None

    def check(values: Sequence[Any]) -> bool:
        return rest(values) and all(type(v) is type(const) and v == const for v in values)

    return check


def _const_strings(const: list[str]) -> ColumnCheck:
    """``const``, a list of strings: the same list (its items strings, so JSON's equality is Python's)."""

    def check(values: Sequence[Any]) -> bool:
        return all(type(v) is list and v == const and all(type(x) is str for x in v) for v in values)

    return check


def _one_of(branches: Any, defs: Mapping[str, Any], depth: int) -> ColumnCheck | None:
    """``oneOf`` whose branches each declare one type, no two the same: a value can meet at most
    the branch of its own type, so each value is checked against that branch alone."""
    if not isinstance(branches, list) or not branches:
        return None
    by_type: dict[type, ColumnCheck] = {}
    for branch in branches:
        kind = branch.get("type") if isinstance(branch, dict) else None
        python = {"object": dict, "array": list, **_SCALAR_TYPES}.get(kind) if isinstance(kind, str) else None
        compiled = column_check(branch, defs, depth=depth + 1)
        if python is None or python in by_type or compiled is None or (python is int and float in by_type):
            return None
        by_type[python] = compiled
        if python is int:
            by_type[float] = compiled  # an integer written as 6.0

    def check(values: Sequence[Any]) -> bool:
        parts: dict[type, list[Any]] = {}
        for value in values:
            parts.setdefault(type(value), []).append(value)
        return all(t in by_type and by_type[t](part) for t, part in parts.items())

    return check
