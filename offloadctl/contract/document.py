"""The plan document: the JSON contract between stages, validated on every read and write.

A plan is a plain dict that follows ``schemas/plan.schema.json`` (JSON Schema 2020-12), typed as
`offloadctl.core.plantypes.Plan`. Stages are pure functions from one plan dict to a new one; this module
owns reading, writing and validating them, and checking that a plan belongs to a given model.

In memory a plan's ``rejected`` candidates are a list of entries, one dict each; its file holds
them as a table, one row each and every detail text once (`plan_document`, schema version 2),
which `read_plan` turns back into entries. The schema allows both forms, so a plan dict written as
it is reads too, and so do version 1 files (a list of entries), which are written again as version 2.
"""

from __future__ import annotations

import copy
import json
import operator
import os
from collections.abc import Callable, Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any, cast

import fastjsonschema
import jsonschema

from offloadctl._version import __version__
from offloadctl.contract.columns import ColumnCheck, column_check
from offloadctl.core.bulk import paused_gc
from offloadctl.core.errors import OffloadError
from offloadctl.core.files import atomic_write, finite_json_float, read_json
from offloadctl.core.plantypes import Plan
from offloadctl.core.schemas import load_schema

__all__ = [
    "SCHEMA_VERSION",
    "READ_VERSIONS",
    "STAGES",
    "plan_schema",
    "validate_plan",
    "plan_document",
    "REJECTED_COLUMNS",
    "read_plan",
    "write_plan",
    "dump_plan",
    "record_stage",
    "advance_stage",
    "require_stage",
    "check_plan_model",
]

SCHEMA_VERSION = 2  # what offloadctl writes
#: the versions it reads: 1 held ``rejected`` as a list of entries, which this version reads too
READ_VERSIONS = (1, 2)
STAGES = ("selected", "filtered", "scheduled")

_RECREATE = "fix that field or re-create the plan from the model with offloadctl plan"

#: The cells of a row of a plan file's ``rejected`` table, in order (its ``columns``); a row's
#: detail is an index into the table's ``details``.
REJECTED_COLUMNS = ("tensor", "kind", "bytes", "stage", "reason", "max_gap", "detail")
_DETAIL = len(REJECTED_COLUMNS) - 1
_ENTRY_REQUIRED = frozenset(REJECTED_COLUMNS) - {"max_gap"}
_ENTRY_ALLOWED = frozenset(REJECTED_COLUMNS)
_CELLS = operator.itemgetter("tensor", "kind", "bytes", "stage", "reason")


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
    jsonschema stays the reference: a plan it accepts is accepted. The ``offloads`` list and the
    ``rejected`` table (thousands of offloads, a row for almost every tensor of a big model) are
    checked column by column (`offloadctl.contract.columns`), and the rest of the plan by
    fastjsonschema.
    """
    schema = plan_schema()
    lists = _list_checks(schema)
    rest = copy.deepcopy(schema)  # fastjsonschema rewrites the $ref entries of what it is given
    for key in lists:
        rest["properties"][key] = {}  # any value: the column check checks it
    validate = fastjsonschema.compile(rest)

    def check(plan: Any) -> bool:
        if type(plan) is dict:
            for key, meets in lists.items():
                if key in plan and not meets([plan[key]]):
                    return False
        try:
            validate(plan)
        except fastjsonschema.JsonSchemaException:
            return False
        return True

    return check


# The plan schema's own keywords that tie no property to another: a schema using more gets no list checks.
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


def _list_checks(schema: dict[str, Any]) -> dict[str, ColumnCheck]:
    """Column checks of the plan's ``offloads`` list and ``rejected`` table, for those whose check
    on its own is the same as their part of checking the plan: the plan schema ties nothing else
    to them, and `offloadctl.contract.columns.column_check` understands their schema."""
    properties = schema.get("properties")
    if set(schema) - _PLAN_KEYWORDS or not isinstance(properties, dict):
        return {}
    defs = schema.get("$defs", {})
    found = {}
    for key in ("offloads", "rejected"):
        check = column_check(properties.get(key), defs)
        if check is not None:
            found[key] = check
    return found


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


def _where(error: jsonschema.ValidationError, entries: bool = False) -> str:
    """The path of ``error``'s field; a cell of the ``rejected`` table is named by its column, and
    (``entries``: the table was made from a plan's entries) as ``rejected/ENTRY/KEY``."""
    parts = [str(p) for p in error.absolute_path]
    if parts[:2] == ["rejected", "rows"] and len(parts) == 4 and parts[3].isdigit() and int(parts[3]) <= _DETAIL:
        column = REJECTED_COLUMNS[int(parts[3])]
        return f"rejected/{parts[2]}/{column}" if entries else f"{'/'.join(parts)} ({column})"
    return "/".join(parts) if parts else "(top level)"


def validate_plan(plan: Any, *, source: str = "plan") -> None:
    """Raise OffloadError naming the first offending field if ``plan`` breaks the schema or its rules
    (its ``rejected`` candidates a list of entries, as the stages build them, or a file's table)."""
    _validate(plan, source)


def _validate_version(plan: Any, source: str) -> None:
    """Refuse what is not a plan at all, and a plan of a schema version this offloadctl does not read."""
    if not isinstance(plan, dict):
        raise OffloadError(
            f"{source} is not a plan: expected a JSON object, got {type(plan).__name__}",
            hint="pass a plan written by offloadctl select, filter, prefetch or plan",
        )
    version = plan.get("schema_version")
    if isinstance(version, int) and not isinstance(version, bool) and version not in READ_VERSIONS:
        readable = " and ".join(map(str, READ_VERSIONS))
        raise OffloadError(
            f"{source} has schema_version {version}; this offloadctl {__version__} reads versions {readable}",
            hint="re-create the plan with this version of offloadctl",
        )


def _validate(plan: Any, source: str, *, entries: bool = False) -> None:
    """`validate_plan` (``entries``: a ``rejected`` table made from entries by `plan_document`, whose
    cells are named by entry and key)."""
    _validate_version(plan, source)
    error = _schema_error(plan)
    if error is not None:
        raise OffloadError(
            f"{source} is not a valid plan: field {_where(error, entries)}: {error.message}",
            hint="fix that field (schema: schemas/plan.schema.json) or re-create the plan",
        )
    table = plan["rejected"]
    if isinstance(table, dict) and table["rows"]:
        details = len(table["details"])
        if max(row[-1] for row in table["rows"]) >= details:
            at = next(i for i, row in enumerate(table["rows"]) if row[-1] >= details)
            raise OffloadError(
                f"{source}: field rejected/rows/{at}/{_DETAIL} (detail) is {table['rows'][at][-1]}, past the {details} "
                "texts of rejected/details",
                hint=_RECREATE,
            )
    _check_rules(cast(Plan, plan), source)  # the schema holds: the plan has the typed shape


def plan_document(plan: Plan) -> Any:
    """``plan`` as offloadctl writes it, schema version 2: its ``rejected`` entries as a table, one row
    of `REJECTED_COLUMNS` each, the detail texts listed once (a big model rejects almost every
    tensor, for a few reasons). A plan whose entries are not all dicts of the right keys with a
    string detail keeps them as they are, for `validate_plan` to name what is wrong."""
    if not isinstance(plan, dict):
        return plan
    document: dict[str, Any] = dict(plan)
    version = plan.get("schema_version")
    if type(version) is int and version in READ_VERSIONS:  # a plan read from a version 1 file is written as 2
        document["schema_version"] = SCHEMA_VERSION
    entries = plan.get("rejected")
    if (
        isinstance(entries, list)
        and set(map(type, entries)) <= {dict}
        and all(_ENTRY_REQUIRED <= keys <= _ENTRY_ALLOWED for keys in set(map(frozenset, entries)))
        and set(map(type, map(operator.itemgetter("detail"), entries))) <= {str}
    ):
        details: dict[str, int] = {}
        number = details.setdefault
        rows = [[*_CELLS(e), e.get("max_gap"), number(e["detail"], len(details))] for e in entries]
        document["rejected"] = {"columns": list(REJECTED_COLUMNS), "details": list(details), "rows": rows}
    return document


def _plan_of(document: dict[str, Any]) -> Plan:
    """The plan a valid plan file holds, its ``rejected`` candidates as entries (a table's rows
    turned back into the entries `plan_document` made them from)."""
    table = document["rejected"]
    if isinstance(table, list):
        return cast(Plan, document)
    details = table["details"]
    rejected = [
        {"tensor": t, "kind": k, "bytes": b, "stage": s, "reason": r, "detail": details[d], "max_gap": g}
        for t, k, b, s, r, g, d in table["rows"]
    ]
    return cast(Plan, {**document, "rejected": rejected})


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
    document = read_json(
        p,
        "plan file",
        fix="pass a plan written by offloadctl select, filter, prefetch or plan (an .onnx model is not a plan)",
        missing="check the path or create it with offloadctl select/plan",
        parse_float=_number,
    )
    validate_plan(document, source=f"plan file {p}")
    plan = _plan_of(document)
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


def _plan_text(document: dict[str, Any]) -> str:
    """A plan file's text (``document``: `plan_document`'s): indented, with one line per row of the
    ``rejected`` table and per detail text.

    A big model has a row for almost every tensor; one compact line each keeps the file readable.
    The rows are encoded in one call of json's C encoder (indented output does not use it) and then
    broken into lines between rows: rows are flat arrays of scalars that start with a string (the
    schema says so, and the plan is validated before this runs), and a string value cannot contain
    the characters ``], ["`` (its quotes are escaped), so that sequence occurs only between rows.
    """
    text = json.dumps({**document, "rejected": _REJECTED_SLOT}, indent=1)
    table = document["rejected"]
    rows, details = table["rows"], table["details"]
    listed = "[\n   " + ",\n   ".join(map(json.dumps, details)) + "\n  ]" if details else "[]"
    lines = "[\n   " + json.dumps(rows)[1:-1].replace('], ["', '],\n   ["') + "\n  ]" if rows else "[]"
    tabled = f'{{\n  "columns": {json.dumps(table["columns"])},\n  "details": {listed},\n  "rows": {lines}\n }}'
    return text.replace(json.dumps(_REJECTED_SLOT), tabled, 1) + "\n"


@paused_gc()
def dump_plan(plan: Plan) -> str:
    """Validate a plan and serialize it deterministically, as its file holds it (`plan_document`)."""
    _validate_version(plan, "plan being written")
    document = plan_document(plan)  # malformed entries stay a list, for the check to name
    _validate(document, "plan being written", entries=isinstance(plan.get("rejected"), list))
    return _plan_text(document)


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


def record_stage(plan: Plan, stage: str, options_key: str, options: Mapping[str, Any]) -> Plan:
    """Return a copy of ``plan`` advanced to ``stage`` with its options recorded.

    Everything is copied deeply except the entries of ``rejected``, which no stage changes: the
    new plan shares them (a big model has one for almost every tensor) in a list of its own.
    """
    memo: dict[int, Any] = {}
    doc = cast(dict[str, Any], plan)
    new: Any = {k: list(v) if k == "rejected" else _copy_json(v, memo) for k, v in doc.items()}
    advance_stage(new, stage, options_key, options)
    return new


def advance_stage(plan: Plan, stage: str, options_key: str, options: Mapping[str, Any]) -> None:
    """Advance ``plan`` itself to ``stage`` with its options recorded (`record_stage` without the copy,
    for a plan its caller owns)."""
    doc = cast(dict[str, Any], plan)
    doc["stage"] = stage
    doc["tool"] = {"name": "offloadctl", "version": __version__}
    doc["options"] = {**doc["options"], options_key: dict(options)}
    doc["history"] = [*doc["history"], {"stage": stage, "tool_version": __version__, "options": dict(options)}]


def check_plan_model(plan: Plan, sha256: str, model_path: str | os.PathLike[str]) -> None:
    """Refuse a plan made for another model (compared by the model file's sha256)."""
    optimized = plan["model"].get("optimized")
    if plan["model"]["sha256"] != sha256 and optimized is not None and optimized["sha256"] == sha256:
        raise OffloadError(
            f"the plan is of the graph onnxruntime made of {model_path} at --opt-level {optimized['opt_level']} "
            f"(plan --opt-level), {plan['model']['path']}, not of {model_path} itself",
            hint=f"pass {plan['model']['path']}, the model the plan was made for",
        )
    if plan["model"]["sha256"] != sha256:
        raise OffloadError(
            f"the plan was made for {plan['model']['path']} (sha256 {plan['model']['sha256'][:12]}…), "
            f"not for {model_path} (sha256 {sha256[:12]}…)",
            hint="re-create the plan for this model with offloadctl plan, or pass the model the plan was made for",
        )
