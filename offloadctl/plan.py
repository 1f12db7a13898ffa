"""The plan document: the JSON contract between stages, validated on every read and write.

A plan is a plain dict that follows ``schemas/plan.schema.json`` (JSON Schema 2020-12). Stages are
pure functions from one plan dict to a new one; this module owns reading, writing and validating
them, and checking that a plan belongs to a given model.
"""

from __future__ import annotations

import copy
import json
import numbers
import os
import re
from collections.abc import Callable
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema

from offloadctl import __version__
from offloadctl.errors import OffloadError
from offloadctl.files import atomic_write

__all__ = [
    "SCHEMA_VERSION",
    "STAGES",
    "plan_schema",
    "validate_plan",
    "read_plan",
    "write_plan",
    "dump_plan",
    "record_stage",
    "check_plan_model",
]

SCHEMA_VERSION = 1
STAGES = ("selected", "filtered", "scheduled")
Plan = dict[str, Any]
_RECREATE = "fix that field or re-create the plan from the model with offloadctl plan"


@lru_cache(maxsize=1)
def plan_schema() -> dict[str, Any]:
    """The plan schema, from the installed package or, in a source checkout, from ``schemas/``."""
    packaged = resources.files("offloadctl").joinpath("_schemas", "plan.schema.json")
    if packaged.is_file():
        return json.loads(packaged.read_text(encoding="utf-8"))
    source = Path(__file__).resolve().parent.parent / "schemas" / "plan.schema.json"
    return json.loads(source.read_text(encoding="utf-8"))


@lru_cache(maxsize=1)
def _validator() -> jsonschema.protocols.Validator:
    schema = plan_schema()
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


# A compiled yes/no check of the plan schema, for speed on plans with many thousand entries. It
# handles the keywords the schema uses and is never more lenient than jsonschema: when it says "no",
# jsonschema runs and produces the message; on a keyword it does not know it is not used at all.
_Check = Callable[[Any], bool]
_FAST_ANNOTATIONS = frozenset({"$schema", "$id", "$defs", "$comment", "title", "description", "default", "examples"})
_FAST_TYPES: dict[str, _Check] = {
    "object": lambda x: isinstance(x, dict),
    "array": lambda x: isinstance(x, list),
    "string": lambda x: isinstance(x, str),
    "integer": lambda x: (isinstance(x, int) and not isinstance(x, bool)) or (isinstance(x, float) and x.is_integer()),
    "number": lambda x: isinstance(x, (int, float)) and not isinstance(x, bool),
    "boolean": lambda x: isinstance(x, bool),
    "null": lambda x: x is None,
}


class _Unsupported(Exception):
    """The schema uses something the compiled check does not handle."""


def _json_equal(a: Any, b: Any) -> bool:
    """Equality as JSON Schema's enum/const see it: True is not 1, lists and objects compare deeply."""
    if a is b:
        return True
    if isinstance(a, str) or isinstance(b, str):
        return a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (list, dict, tuple)) or isinstance(b, (list, dict, tuple)):
        return False  # mixed containers: let jsonschema decide
    return a == b


_FAST_BOUNDS = {"minimum": "<", "maximum": ">", "exclusiveMinimum": "<=", "exclusiveMaximum": ">="}
_FAST_TYPE_EXPR = {
    "object": "isinstance({x}, dict)",
    "array": "isinstance({x}, list)",
    "string": "isinstance({x}, str)",
    "integer": "(type({x}) is int or (isinstance({x}, int) and not isinstance({x}, bool)) "
    "or (isinstance({x}, float) and {x}.is_integer()))",
    "number": "(isinstance({x}, (int, float)) and not isinstance({x}, bool))",
    "boolean": "isinstance({x}, bool)",
    "null": "{x} is None",
}


def _compile_schema(root: dict[str, Any]) -> _Check:
    """Turn the schema into Python source, one function per subschema, and compile it."""
    namespace: dict[str, Any] = {"_json_equal": _json_equal, "_Number": numbers.Number}
    functions: list[str] = []
    by_ref: dict[str, str] = {}

    def const(value: Any) -> str:
        name = f"_c{len(namespace)}"
        namespace[name] = value
        return name

    def resolve(ref: str) -> str:
        if ref in by_ref:
            return by_ref[ref]
        if not ref.startswith("#/") or "%" in ref:
            raise _Unsupported(ref)
        node: Any = root
        for part in ref[2:].split("/"):
            part = part.replace("~1", "/").replace("~0", "~")
            if not isinstance(node, dict) or part not in node:
                raise _Unsupported(ref)
            node = node[part]
        name = f"_f{len(functions)}"
        functions.append("")  # reserve the slot: the subschema may refer to itself
        by_ref[ref] = name
        compile_(node, name)
        return name

    def compile_(schema: Any, name: str | None = None) -> str:
        if name is None:
            name = f"_f{len(functions)}"
            functions.append("")
        slot = int(name[2:])
        if schema is True or schema is False:
            functions[slot] = f"def {name}(x):\n    return {schema}\n"
            return name
        if not isinstance(schema, dict) or (schema is not root and "$id" in schema):
            raise _Unsupported(repr(schema))
        lines: list[str] = []
        for key, value in schema.items():
            if key not in _FAST_ANNOTATIONS:
                lines += keyword(key, value, schema)
        body = "".join(f"    {line}\n" for line in lines)
        functions[slot] = f"def {name}(x):\n{body}    return True\n"
        return name

    def keyword(key: str, value: Any, schema: dict[str, Any]) -> list[str]:
        if key == "$ref":
            if not isinstance(value, str):
                raise _Unsupported(key)
            return [f"if not {resolve(value)}(x): return False"]
        if key == "type":
            names = [value] if isinstance(value, str) else value
            if not isinstance(names, list) or not names or not all(n in _FAST_TYPES for n in names):
                raise _Unsupported(key)
            return [f"if not ({' or '.join(_FAST_TYPE_EXPR[n].format(x='x') for n in names)}): return False"]
        if key == "properties":
            if not isinstance(value, dict):
                raise _Unsupported(key)
            lines = ["if isinstance(x, dict):"]
            for prop, sub in value.items():
                p = const(prop)
                lines.append(f"    if {p} in x and not {compile_(sub)}(x[{p}]): return False")
            return lines if len(lines) > 1 else []
        if key == "additionalProperties":
            if "patternProperties" in schema:
                raise _Unsupported(key)
            known = const(frozenset(schema.get("properties", {})))
            if value is False:
                return [f"if isinstance(x, dict) and not {known}.issuperset(x): return False"]
            sub = compile_(value)
            return [
                "if isinstance(x, dict):",
                "    for k, v in x.items():",
                f"        if k not in {known} and not {sub}(v): return False",
            ]
        if key == "required":
            if not isinstance(value, list) or not all(isinstance(n, str) for n in value):
                raise _Unsupported(key)
            if not value:
                return []
            names = " or ".join(f"{const(n)} not in x" for n in value)
            return [f"if isinstance(x, dict) and ({names}): return False"]
        if key == "items":
            if "prefixItems" in schema or isinstance(value, list):
                raise _Unsupported(key)
            sub = compile_(value)
            return ["if isinstance(x, list):", "    for v in x:", f"        if not {sub}(v): return False"]
        if key in ("minItems", "minLength", "maxItems", "maxLength"):
            if not isinstance(value, int) or isinstance(value, bool):
                raise _Unsupported(key)
            kind = "list" if key.endswith("Items") else "str"
            compare = "<" if key.startswith("min") else ">"
            return [f"if isinstance(x, {kind}) and len(x) {compare} {value}: return False"]
        if key == "pattern":
            regex = const(re.compile(value))
            return [f"if isinstance(x, str) and {regex}.search(x) is None: return False"]
        if key in _FAST_BOUNDS:
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise _Unsupported(key)
            bad = _FAST_BOUNDS[key]
            return [
                f"if (type(x) is int or type(x) is float or (isinstance(x, _Number) and not isinstance(x, bool))) "
                f"and x {bad} {const(value)}: return False"
            ]
        if key == "enum":
            if not isinstance(value, list):
                raise _Unsupported(key)
            if all(isinstance(v, str) for v in value):
                return [f"if not (isinstance(x, str) and x in {const(frozenset(value))}): return False"]
            return [f"if not any(_json_equal(x, o) for o in {const(list(value))}): return False"]
        if key == "const":
            if isinstance(value, str):
                return [f"if not (isinstance(x, str) and x == {const(value)}): return False"]
            return [f"if not _json_equal(x, {const(value)}): return False"]
        if key in ("oneOf", "anyOf", "allOf"):
            if not isinstance(value, list) or not value:
                raise _Unsupported(key)
            subs = ", ".join(compile_(sub) for sub in value)
            test = {"oneOf": "sum(1 for f in ({subs},) if f(x)) != 1", "anyOf": "not any(f(x) for f in ({subs},))",
                    "allOf": "not all(f(x) for f in ({subs},))"}[key]
            return [f"if {test.format(subs=subs)}: return False"]
        if key == "not":
            return [f"if {compile_(value)}(x): return False"]
        if key == "if":
            test = compile_(value)
            then = compile_(schema["then"]) if "then" in schema else None
            else_ = compile_(schema["else"]) if "else" in schema else None
            lines = []
            if then is not None:
                lines.append(f"if {test}(x) and not {then}(x): return False")
            if else_ is not None:
                lines.append(f"if not {test}(x) and not {else_}(x): return False")
            return lines
        if key in ("then", "else"):
            return []  # applied by "if"; without "if" they do nothing
        raise _Unsupported(key)

    entry = compile_(root)
    exec(compile("".join(functions), "<plan schema check>", "exec"), namespace)  # noqa: S102 - source built above
    return namespace[entry]


@lru_cache(maxsize=1)
def _fast_check() -> _Check | None:
    """The compiled check of the plan schema, or None when the schema needs full jsonschema."""
    _validator()  # checks the schema itself first
    schema = plan_schema()
    if schema.get("$schema", "https://json-schema.org/draft/2020-12/schema") != (
        "https://json-schema.org/draft/2020-12/schema"
    ):
        return None
    try:
        return _compile_schema(schema)
    except _Unsupported:
        return None


def _schema_error(plan: Any) -> jsonschema.ValidationError | None:
    """The most relevant schema violation of ``plan``, or None; fast for valid plans."""
    check = _fast_check()
    if check is not None and check(plan):
        return None
    return jsonschema.exceptions.best_match(_validator().iter_errors(plan))


_SCALAR_TYPES = frozenset({str, int, float, bool, type(None)})


def _copy_json(value: Any, memo: dict[int, Any]) -> Any:
    """Deep copy of a JSON-like document; same result as copy.deepcopy, shared objects stay shared."""
    if isinstance(value, (str, int, float, type(None))):
        return value
    found = memo.get(id(value))
    if found is not None:
        return found
    scalar = _SCALAR_TYPES
    if type(value) is dict:
        new: Any = {}
        memo[id(value)] = new
        for k, v in value.items():
            new[k] = v if type(v) in scalar else _copy_json(v, memo)
        return new
    if type(value) is list:
        new = []
        memo[id(value)] = new
        for v in value:
            new.append(v if type(v) in scalar else _copy_json(v, memo))
        return new
    return copy.deepcopy(value, memo)


def _where(error: jsonschema.ValidationError) -> str:
    parts = [str(p) for p in error.absolute_path]
    return "/".join(parts) if parts else "(top level)"


def validate_plan(plan: Any, *, source: str = "plan") -> None:
    """Raise OffloadError naming the first offending field if ``plan`` breaks the schema or its rules."""
    if not isinstance(plan, dict):
        raise OffloadError(
            f"{source} is not a plan: expected a JSON object, got {type(plan).__name__}",
            hint="pass a plan written by offloadctl select, filter, prefetch or plan",
        )
    version = plan.get("schema_version")
    if isinstance(version, int) and not isinstance(version, bool) and version != SCHEMA_VERSION:
        raise OffloadError(
            f"{source} has schema_version {version}; this offloadctl {__version__} reads version {SCHEMA_VERSION}",
            hint="re-create the plan with this version of offloadctl",
        )
    error = _schema_error(plan)
    if error is not None:
        raise OffloadError(
            f"{source} is not a valid plan: field {_where(error)}: {error.message}",
            hint="fix that field (schema: schemas/plan.schema.json) or re-create the plan",
        )
    _check_rules(plan, source)


def _check_rules(plan: Plan, source: str) -> None:
    """Rules JSON Schema cannot express: unique tensors, positions in range, ordered groups."""
    n = plan["model"]["num_positions"]
    seen: set[str] = set()
    scheduled = plan["stage"] == "scheduled"
    for i, off in enumerate(plan["offloads"]):
        where = f"field offloads/{i} (tensor {off['tensor']!r})"
        if off["tensor"] in seen:
            raise OffloadError(f"{source}: {where} offloads the same tensor twice", hint="keep one entry per tensor")
        seen.add(off["tensor"])
        is_act = off["kind"] == "activation"
        if is_act and (off["producer"] is None or off["d2h_after"] is None):
            raise OffloadError(f"{source}: {where} is an activation without producer/d2h_after", hint=_RECREATE)
        if not is_act and (off["producer"] is not None or off["d2h_after"] is not None):
            raise OffloadError(
                f"{source}: {where} is a parameter and must have producer and d2h_after null", hint=_RECREATE
            )
        positions = [u["position"] for u in off["device_uses"]]
        for g, group in enumerate(off["reload_groups"]):
            positions += [u["position"] for u in group["uses"]]
            h2d = group["h2d_before"]
            if scheduled and h2d is None:
                raise OffloadError(
                    f"{source}: {where} reload_groups/{g}/h2d_before is null in a scheduled plan",
                    hint="give it a position or re-run offloadctl prefetch",
                )
            if h2d is not None:
                first = group["uses"][0]["position"]
                low = off["d2h_after"] + 1 if is_act else 0
                if not low <= h2d <= first:
                    raise OffloadError(
                        f"{source}: {where} reload_groups/{g}/h2d_before={h2d} must lie in [{low}, {first}] "
                        "(after the D2H, not after the group's first use)",
                        hint="edit the position or re-run offloadctl prefetch",
                    )
        if any(p >= n for p in positions) or positions != sorted(positions):
            raise OffloadError(
                f"{source}: {where} has uses out of order or beyond the model's {n} positions",
                hint="re-create the plan from the model",
            )
        if is_act and positions and off["producer"]["position"] >= positions[0]:
            raise OffloadError(f"{source}: {where} is used before it is produced", hint=_RECREATE)
        for key in ("release_after", "output_h2d_before"):
            if off[key] is not None and off[key] > n:
                raise OffloadError(f"{source}: {where} {key}={off[key]} is beyond the model's {n} positions", hint=_RECREATE)


def read_plan(path: str | os.PathLike[str], *, stages: tuple[str, ...] = STAGES) -> Plan:
    """Read and validate a plan file whose stage is one of ``stages``."""
    p = Path(path)
    if p.is_dir():
        raise OffloadError(f"plan path {p} is a directory", hint="give the path of a plan .json file")
    if not p.is_file():
        raise OffloadError(f"plan file {p} does not exist", hint="check the path or create it with offloadctl select/plan")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise OffloadError(
            f"plan file {p} is not a JSON text file (it is not UTF-8 text)",
            hint="pass a plan written by offloadctl select, filter, prefetch or plan (an .onnx model is not a plan)",
        ) from None
    except OSError as exc:
        raise OffloadError(f"cannot read plan file {p}: {exc.strerror or exc}", hint="check the file's permissions") from None
    try:
        plan = json.loads(text)
    except json.JSONDecodeError as exc:
        raise OffloadError(
            f"plan file {p} is not JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})",
            hint="fix the syntax or re-create the plan",
        ) from None
    validate_plan(plan, source=f"plan file {p}")
    if plan["stage"] not in stages:
        wanted = " or ".join(repr(s) for s in stages)
        raise OffloadError(
            f"plan file {p} is at stage {plan['stage']!r}; this command needs stage {wanted}",
            hint=_stage_hint(plan["stage"], stages),
        )
    return plan


def _stage_hint(have: str, want: tuple[str, ...]) -> str:
    steps = {"selected": "offloadctl filter", "filtered": "offloadctl prefetch"}
    if STAGES.index(have) < min(STAGES.index(s) for s in want):
        return f"run {steps[have]} on it first (or offloadctl plan to do every stage)"
    return "re-run the stage on the earlier plan, or pass the plan to the next command"


def dump_plan(plan: Plan) -> str:
    """Serialize a validated plan deterministically."""
    validate_plan(plan, source="plan being written")
    return json.dumps(plan, indent=1, sort_keys=False) + "\n"


def write_plan(path: str | os.PathLike[str], plan: Plan) -> None:
    """Validate and write a plan atomically; the same text as ``dump_plan``, streamed in pieces."""
    validate_plan(plan, source="plan being written")

    def write(tmp: Path) -> None:
        with open(tmp, "w", encoding="utf-8") as f:
            pieces: list[str] = []
            for piece in json.JSONEncoder(indent=1, sort_keys=False).iterencode(plan):
                pieces.append(piece)
                if len(pieces) >= 1 << 16:
                    f.write("".join(pieces))
                    pieces.clear()
            pieces.append("\n")
            f.write("".join(pieces))

    atomic_write(path, write)


def record_stage(plan: Plan, stage: str, options_key: str, options: dict[str, Any]) -> Plan:
    """Return a deep copy of ``plan`` advanced to ``stage`` with its options recorded."""
    new = _copy_json(plan, {})
    new["stage"] = stage
    new["tool"] = {"name": "offloadctl", "version": __version__}
    new["options"][options_key] = dict(options)
    new["history"].append({"stage": stage, "tool_version": __version__, "options": dict(options)})
    return new


def check_plan_model(plan: Plan, sha256: str, model_path: str | os.PathLike[str]) -> None:
    """Refuse a plan made for another model (compared by the model file's sha256)."""
    if plan["model"]["sha256"] != sha256:
        raise OffloadError(
            f"the plan was made for {plan['model']['path']} (sha256 {plan['model']['sha256'][:12]}…), "
            f"not for {model_path} (sha256 {sha256[:12]}…)",
            hint="re-create the plan for this model with offloadctl plan, or pass the model the plan was made for",
        )
