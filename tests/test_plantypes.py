"""The plan's types say what the schema says: the same keys, the same required keys, the same reasons."""

from __future__ import annotations

import typing

import pytest

from offloadctl.contract.document import REJECTED_COLUMNS, plan_schema, validate_plan
from offloadctl.core import plantypes
from offloadctl.core.plantypes import offload, rejection, reload_group

SCHEMA = plan_schema()
DEFS = SCHEMA["$defs"]


def _object(schema: dict) -> tuple[set[str], set[str]]:
    """(every key, required keys) of an object schema."""
    return set(schema["properties"]), set(schema.get("required", ()))


OBJECTS = {
    "Plan": _object(SCHEMA),
    "ModelInfo": _object(SCHEMA["properties"]["model"]),
    "Tool": (set(SCHEMA["properties"]["tool"]["properties"]), set(SCHEMA["properties"]["tool"]["required"])),
    "HistoryEntry": _object(SCHEMA["properties"]["history"]["items"]),
    "Options": (set(SCHEMA["properties"]["options"]["properties"]), set()),
    "Offload": _object(DEFS["offload"]),
    "Producer": _object(DEFS["offload"]["properties"]["producer"]["oneOf"][1]),
    "ReloadGroup": _object(DEFS["reload_group"]),
    "Objective": _object(SCHEMA["properties"]["budget"]["properties"]["objective"]),
    "FilterOptions": _object(DEFS["filter_options"]),
    "Solver": (set(SCHEMA["properties"]["budget"]["properties"]["solver"]["properties"]), set()),
    "Use": _object(DEFS["use"]),
}
TABLE = SCHEMA["properties"]["rejected"]["oneOf"][0]["properties"]
LISTED = SCHEMA["properties"]["rejected"]["oneOf"][1]["items"]
COLUMNS = TABLE["columns"]["const"]
#: the rejected table's cells by column name
CELLS = dict(zip(COLUMNS, TABLE["rows"]["items"]["prefixItems"]))


@pytest.mark.parametrize("name", sorted(OBJECTS))
def test_each_typed_dict_has_the_schemas_keys(name):
    typed = getattr(plantypes, name)
    keys, required = OBJECTS[name]
    assert set(typed.__required_keys__) | set(typed.__optional_keys__) == keys
    assert set(typed.__required_keys__) == required


def test_a_rejection_has_the_columns_of_the_rejected_table():
    """An entry holds one cell of each column; a file's row gives max_gap (null), an entry may leave it out."""
    typed = plantypes.Rejection
    assert set(typed.__required_keys__) | set(typed.__optional_keys__) == set(COLUMNS)
    assert set(typed.__optional_keys__) == {"max_gap"}
    assert tuple(COLUMNS) == REJECTED_COLUMNS
    assert _object(LISTED) == (set(COLUMNS), set(COLUMNS) - {"max_gap"})  # a list of entries is read too
    for column, cell in CELLS.items():
        listed = dict(LISTED["properties"][column])
        assert {k: v for k, v in cell.items() if k != "description"} == (
            {"type": "integer", "minimum": 0} if column == "detail" else listed  # the detail: an index
        ), column


def test_the_literals_are_the_schemas_enums():
    rejected = CELLS
    assert set(typing.get_args(plantypes.RejectionReason)) == set(rejected["reason"]["enum"])
    assert len(typing.get_args(plantypes.RejectionReason)) == len(rejected["reason"]["enum"])
    assert set(typing.get_args(plantypes.RejectionStage)) == set(rejected["stage"]["enum"])
    assert (
        set(typing.get_args(plantypes.Kind))
        == set(rejected["kind"]["enum"])
        == set(DEFS["offload"]["properties"]["kind"]["enum"])
    )
    assert set(typing.get_args(plantypes.Stage)) == set(SCHEMA["properties"]["stage"]["enum"])
    assert set(typing.get_args(plantypes.Strategy)) == set(SCHEMA["properties"]["strategy"]["enum"])


def test_the_constructors_write_valid_entries_in_the_files_key_order():
    use = {"position": 3, "node": "n3", "input_index": 0}
    weight = offload(
        tensor="w",
        kind="parameter",
        dtype="float",
        shape=(4, 8),
        size=128,
        producer=None,
        device_uses=[],
        reload_groups=[reload_group([use], 3)],
        graph_output=False,
        output_h2d_before=None,
        forced=True,
    )
    assert list(weight) == [
        "id",
        "tensor",
        "kind",
        "dtype",
        "shape",
        "bytes",
        "producer",
        "d2h_after",
        "device_uses",
        "reload_groups",
        "graph_output",
        "output_h2d_before",
        "release_after",
        "prefetch_distance",
        "forced",
    ]
    assert (
        weight["shape"] == [4, 8] and weight["d2h_after"] is None and weight["reload_groups"][0]["h2d_before"] is None
    )
    act = offload(
        tensor="a",
        kind="activation",
        dtype="float",
        shape=[2],
        size=8,
        producer={"position": 1, "node": "n1"},
        device_uses=[],
        reload_groups=[reload_group([use], 2)],
        graph_output=False,
        output_h2d_before=None,
    )
    assert act["d2h_after"] == 1 and "forced" not in act
    rejected = rejection("b", "activation", None, "select", "unknown-size", "size unknown", 5)
    assert list(rejected) == ["tensor", "kind", "bytes", "stage", "reason", "detail", "max_gap"]
    plan = {
        "schema_version": 2,
        "stage": "selected",
        "tool": {"name": "offloadctl", "version": "0"},
        "model": {"path": "m.onnx", "sha256": "0" * 64, "num_positions": 6, "input_shapes": {}},
        "strategy": "distance",
        "options": {},
        "history": [],
        "offloads": [weight, act],
        "rejected": [rejected],
    }
    act["id"] = 1
    validate_plan(plan)
