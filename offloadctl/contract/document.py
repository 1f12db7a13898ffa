"""The plan document: the JSON contract between stages, validated on every read and write.

A plan is a plain dict that follows ``schemas/plan.schema.json`` (JSON Schema 2020-12), typed as
`offloadctl.core.plantypes.Plan`. Stages are pure functions from one plan dict to a new one; this module
owns reading, writing and validating them, and checking that a plan belongs to a given model.
"""

from __future__ import annotations

import copy
import itertools
import json
import os
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from typing import Any, cast

import fastjsonschema
import jsonschema

from offloadctl._version import __version__
from offloadctl.core.bulk import paused_gc
from offloadctl.core.errors import OffloadError
from offloadctl.core.files import atomic_write, finite_json_float, read_json
from offloadctl.core.plantypes import Plan
from offloadctl.core.schemas import load_schema

__all__ = [
    "SCHEMA_VERSION",
    "STAGES",
    "plan_schema",
    "validate_plan",
    "read_plan",
    "write_plan",
    "dump_plan",
    "record_stage",
    "require_stage",
    "check_plan_model",
]

SCHEMA_VERSION = 1
STAGES = ("selected", "filtered", "scheduled")

_RECREATE = "fix that field or re-create the plan from the model with offloadctl plan"


def plan_schema() -> dict[str, Any]:
    """The plan schema (`offloadctl.core.schemas.load_schema`)."""
    return load_schema("plan.schema.json")


@lru_cache(maxsize=1)
def _validator() -> jsonschema.protocols.Validator:
    """jsonschema's validator for the plan schema (the schema itself is checked by the tests)."""
    schema = plan_schema()
    return jsonschema.validators.validator_for(schema)(schema)


@lru_cache(maxsize=1)
def _fast_check() -> Callable[[Any], bool]:
    """A compiled yes/no check of the plan schema, for speed on plans with many thousand entries.

    fastjsonschema compiles the schema to Python code (about 15x faster than jsonschema here);
    when it says "no", jsonschema runs to find the most relevant error and word the message, and
    jsonschema stays the reference: a plan it accepts is accepted. The ``rejected`` list (an entry
    for almost every tensor of a big model) is checked by `_flat_objects_check`, built from the
    schema's own item schema, and the rest of the plan by fastjsonschema.
    """
    schema = plan_schema()
    validate = fastjsonschema.compile(schema)
    entries = _rejected_check(schema)

    def check(plan: Any) -> bool:
        try:
            if entries is not None and type(plan) is dict and type(plan.get("rejected")) is list:
                if not entries(plan["rejected"]):
                    return False
                validate({**plan, "rejected": []})
            else:
                validate(plan)
        except fastjsonschema.JsonSchemaException:
            return False
        return True

    return check


# What `_rejected_check` understands: a schema using more keywords gets no flat check.
_PLAN_KEYWORDS = frozenset(
    {
        "$schema",
        "$id",
        "$comment",
        "title",
        "description",
        "type",
        "required",
        "additionalProperties",
        "properties",
        "$defs",
    }
)
_LIST_KEYWORDS = frozenset({"$comment", "title", "description", "type", "items"})
_OBJECT_KEYWORDS = frozenset(
    {"$comment", "title", "description", "type", "required", "additionalProperties", "properties"}
)
_VALUE_KEYWORDS = frozenset({"$comment", "title", "description", "type", "enum", "minimum"})
_VALUE_TYPES = frozenset({"string", "integer", "null"})


def _rejected_check(schema: dict[str, Any]) -> Callable[[list[Any]], bool] | None:
    """A check of the ``rejected`` list alone, when checking the plan with that list replaced by
    ``[]`` and the list on its own is the same as checking the plan: the plan schema ties nothing
    else to the list, and the list is only an array of `_flat_objects_check` items."""
    rejected = schema.get("properties", {}).get("rejected")
    if (
        set(schema) - _PLAN_KEYWORDS
        or not isinstance(rejected, dict)
        or set(rejected) - _LIST_KEYWORDS
        or rejected.get("type") != "array"
        or not isinstance(rejected.get("items"), dict)
    ):
        return None
    return _flat_objects_check(rejected["items"])


# (strings, integers, null allowed; the enum; the minimum) of one key of a flat object
_Rule = tuple[bool, bool, bool, "frozenset[str] | None", "int | float | None"]


def _value_rule(rule: Any) -> _Rule | None:
    """The `_Rule` of a value schema `_flat_objects_check` understands, or None."""
    if not isinstance(rule, dict) or set(rule) - _VALUE_KEYWORDS:
        return None
    enum = rule.get("enum")
    if "type" not in rule and enum is None:  # any value at all
        return None
    kinds = rule.get("type", ["string"])  # an enum of strings admits strings only
    kinds = [kinds] if isinstance(kinds, str) else kinds
    minimum = rule.get("minimum")
    if (
        not isinstance(kinds, list)
        or set(kinds) - _VALUE_TYPES
        or (enum is not None and not (isinstance(enum, list) and all(isinstance(v, str) for v in enum)))
        or (minimum is not None and (isinstance(minimum, bool) or not isinstance(minimum, (int, float))))
    ):
        return None
    return ("string" in kinds, "integer" in kinds, "null" in kinds, None if enum is None else frozenset(enum), minimum)


def _flat_objects_check(items: dict[str, Any]) -> Callable[[list[Any]], bool] | None:
    """A yes/no check of a list of objects against ``items`` with JSON Schema's meaning, for an
    object schema with required keys, no other keys, and values described by ``type`` (string,
    integer, null), ``enum`` (of strings) and ``minimum`` alone; None for any other schema.

    It may say "no" where JSON Schema says "yes" only for values JSON never decodes to (a dict
    subclass): callers then ask jsonschema.
    """
    if (
        set(items) - _OBJECT_KEYWORDS
        or items.get("type") != "object"
        or items.get("additionalProperties") is not False
        or not isinstance(items.get("properties"), dict)
    ):
        return None
    rules: dict[str, _Rule] = {}
    for key, schema in items["properties"].items():
        rule = _value_rule(schema)
        if rule is None:
            return None
        rules[key] = rule
    required = frozenset(items.get("required", ()))
    allowed = frozenset(rules)
    if not required <= allowed:
        return None

    def check(entries: list[Any]) -> bool:
        # column by column, so that the loops over a big plan's entries run inside the interpreter's
        # builtins (set, map, min)
        if not set(map(type, entries)) <= {dict}:
            return False
        if not all(required <= keys <= allowed for keys in set(map(frozenset, entries))):
            return False
        count = len(entries)
        for key, rule in rules.items():
            column = list(map(dict.get, entries, itertools.repeat(key, count), itertools.repeat(_ABSENT, count)))
            if key not in required:
                column = [v for v in column if v is not _ABSENT]
            if not _column_ok(column, rule):
                return False
        return True

    return check


_ABSENT = object()


def _column_ok(values: list[Any], rule: _Rule) -> bool:
    """Whether every value meets ``rule``: a str (of the enum, if any); None where null is allowed
    and there is no enum; an int, or a float with an integer value (JSON may write 6 as 6.0), where
    integers are allowed, there is no enum, and at or above the minimum. Never a bool, another
    number, a list or an object."""
    strings, integers, null, enum, minimum = rule
    kinds = set(map(type, values))
    allowed: set[type] = {str} if strings else set()
    if enum is None:
        allowed |= {type(None)} if null else set()
        allowed |= {int, float} if integers else set()
    if not kinds <= allowed:
        return False
    if enum is not None:
        return set(values) <= enum
    if float in kinds and not all(v.is_integer() for v in values if type(v) is float):
        return False
    if minimum is not None and kinds & {int, float}:
        return min(v for v in values if type(v) is int or type(v) is float) >= minimum
    return True


def _schema_error(plan: Any) -> jsonschema.ValidationError | None:
    """The most relevant schema violation of ``plan``, or None; fast for valid plans."""
    if _fast_check()(plan):
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
    _check_rules(cast(Plan, plan), source)  # the schema holds: the plan has the typed shape


def _whole_numbers(plan: Plan, source: str) -> None:
    """Refuse a position, index or size written as a non-integer number (``6.0``).

    JSON Schema counts 6.0 as an integer, but these fields index the model's nodes and inputs.
    `read_plan` turns whole numbers written with a fraction into integers first; a plan built in
    memory must use ints.
    """

    def check(value: Any, where: str) -> None:
        if value is not None and (type(value) is not int):
            raise OffloadError(
                f"{source}: field {where} is {value!r}, not an integer",
                hint="write positions, indices and sizes as whole numbers (6, not 6.0)",
            )

    check(plan["model"]["num_positions"], "model/num_positions")
    for i, off in enumerate(plan["offloads"]):
        at = f"offloads/{i}"
        for key in ("id", "bytes", "d2h_after", "output_h2d_before", "release_after", "prefetch_distance"):
            check(off.get(key), f"{at}/{key}")
        if off["producer"] is not None:
            check(off["producer"]["position"], f"{at}/producer/position")
        for k, use in enumerate(off["device_uses"]):
            check(use["position"], f"{at}/device_uses/{k}/position")
            check(use["input_index"], f"{at}/device_uses/{k}/input_index")
        for g, group in enumerate(off["reload_groups"]):
            check(group["h2d_before"], f"{at}/reload_groups/{g}/h2d_before")
            check(group["gap"], f"{at}/reload_groups/{g}/gap")
            for k, use in enumerate(group["uses"]):
                check(use["position"], f"{at}/reload_groups/{g}/uses/{k}/position")
                check(use["input_index"], f"{at}/reload_groups/{g}/uses/{k}/input_index")


def _check_rules(plan: Plan, source: str) -> None:
    """Rules JSON Schema cannot express: whole numbers, unique tensors, positions in range, ordered groups."""
    _whole_numbers(plan, source)
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
                d2h_after = off["d2h_after"]
                low = d2h_after + 1 if is_act and d2h_after is not None else 0
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
        producer = off["producer"]
        if is_act and positions and producer is not None and producer["position"] >= positions[0]:
            raise OffloadError(f"{source}: {where} is used before it is produced", hint=_RECREATE)
        for key, value in (("release_after", off["release_after"]), ("output_h2d_before", off["output_h2d_before"])):
            if value is not None and value > n:
                raise OffloadError(
                    f"{source}: {where} {key}={value} is beyond the model's {n} positions", hint=_RECREATE
                )


def _number(text: str) -> int | float:
    """A JSON number with a fraction or exponent: an int when it is whole (``6.0`` -> 6)."""
    value = finite_json_float(text)
    return int(value) if value.is_integer() else value


@paused_gc()
def read_plan(path: str | os.PathLike[str], *, stages: tuple[str, ...] = STAGES) -> Plan:
    """Read and validate a plan file whose stage is one of ``stages``."""
    p = Path(path)
    plan = read_json(
        p,
        "plan file",
        fix="pass a plan written by offloadctl select, filter, prefetch or plan (an .onnx model is not a plan)",
        missing="check the path or create it with offloadctl select/plan",
        parse_float=_number,
    )
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


_REJECTED_SLOT = "\u0000rejected"


def _plan_text(plan: Plan) -> str:
    """The plan as JSON: indented, with one line per rejected candidate.

    A big model has a rejected entry for almost every tensor; one compact line each keeps the file
    readable. The list is encoded in one call of json's C encoder (indented output does not use it)
    and then broken into lines between entries: entries are flat objects of scalars (the schema
    says so, and the plan is validated before this runs), and a string value cannot contain the
    characters ``}, {"`` (its quotes are escaped), so that sequence occurs only between entries.
    """
    text = json.dumps({**plan, "rejected": _REJECTED_SLOT}, indent=1)
    rejected = plan.get("rejected") or []
    listing = "[\n  " + json.dumps(rejected)[1:-1].replace('}, {"', '},\n  {"') + "\n ]" if rejected else "[]"
    return text.replace(json.dumps(_REJECTED_SLOT), listing, 1) + "\n"


@paused_gc()
def dump_plan(plan: Plan) -> str:
    """Validate and serialize a plan deterministically."""
    validate_plan(plan, source="plan being written")
    return _plan_text(plan)


def write_plan(path: str | os.PathLike[str], plan: Plan) -> None:
    """Validate and write a plan atomically (the text of ``dump_plan``)."""
    text = dump_plan(plan)
    atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def require_stage(plan: Plan, stage: str, step: str) -> None:
    """Refuse a plan that is not at ``stage``, the stage ``step`` (a stage function) reads.

    A stage run on a plan of another stage would carry stale fields forward (a filter of a
    scheduled plan keeps its h2d_before positions).
    """
    have = plan.get("stage")
    if have != stage:
        raise OffloadError(
            f"{step} reads a plan at stage {stage!r}, but this plan is at stage {have!r}",
            hint=_stage_hint(have, (stage,))
            if have in STAGES
            else "pass a plan written by offloadctl select, filter or prefetch",
        )


def record_stage(plan: Plan, stage: str, options_key: str, options: dict[str, Any]) -> Plan:
    """Return a copy of ``plan`` advanced to ``stage`` with its options recorded.

    Everything is copied deeply except the entries of ``rejected``, which no stage changes: the
    new plan shares them (a big model has one for almost every tensor) in a list of its own.
    """
    memo: dict[int, Any] = {}
    doc = cast(dict[str, Any], plan)
    new: Any = {k: list(v) if k == "rejected" else _copy_json(v, memo) for k, v in doc.items()}
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
