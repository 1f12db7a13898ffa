"""What a rewritten model records about itself in ``metadata_props``, and reading it back.

`offloadctl apply` writes these keys (replacing keys of the same name, keeping all others):

- ``offloadctl.version``: the offloadctl version that rewrote the model.
- ``offloadctl.plan_sha256``: sha256 of the canonical JSON of the plan less its ``rejected`` list
  (`plan_sha256`).
- ``offloadctl.offloads``: how many tensors are offloaded.
- ``offloadctl.session``: JSON of the session settings the model needs to keep its copies and
  run them where they were planned::

      {"execution_order": "PRIORITY_BASED",
       "graph_optimization_level": "ORT_DISABLE_ALL",   # plan --opt-level: the fusions are in the file
       "optimized": {"opt_level": "all", "device": "cuda", "sha256": "…"},
       "order_pins": true,                            # the DEFAULT order keeps the plan too
       "disabled_optimizers": ["ConstantFolding"],     # when weights are offloaded or pins added
       "cann": {"enable_cann_graph": "0"},
       "webgpu": {"preferredLayout": "NCHW"}}

  PRIORITY_BASED makes onnxruntime run the nodes in file order (the default order moves the
  copies unless order pins hold them), except on a device where it inserts copies of its own (see
  `PinCheck`); ConstantFolding would turn ``MemcpyFromHost(weight)`` back
  into a device weight and fold the order pins' Shape nodes away (it is disabled when either is
  there); the CANN graph mode compiles subgraphs, owns their memory and splits at every copy;
  the WebGPU provider's NHWC layout replaces every Conv and pool with a new node of a higher index,
  and both orders follow node indices.
- ``offloadctl.planned_at``: JSON of the shapes the plan's sizes hold for and the order its
  positions count in: ``{"input_shapes": {...}, "dims": {...}, "execution_order": "priority"}``
  (`offloadctl run` generates inputs at these shapes when none are given).
- ``offloadctl.order_pins``: JSON list of the order each pin guarantees, ``{"copy": NODE,
  "before": NODE}`` or ``{"copy": NODE, "after": NODE}`` (original nodes), with ``"order":
  "default"`` where it holds in the DEFAULT walk only; `offloadctl run` checks them against the
  order that ran.
- ``offloadctl.priority_based_only``: JSON list of the copies no order pin holds, and why: they
  keep their planned place only under PRIORITY_BASED.
- ``offloadctl.streams`` (``apply --copies streams``): JSON of the partition file that puts the
  copies on a stream of their own (a path relative to the model) and the session config entries a
  host sets to run it (`offloadctl.rewriting.streams`); ``offloadctl.session`` then names the file
  too (``streams.partition_file``) and the optimizers the events need disabled.
"""

from __future__ import annotations

import json
import mmap
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict, cast

import onnx

from offloadctl.analysis.order import EXECUTION_ORDERS
from offloadctl.core.errors import OffloadError
from offloadctl.core.files import json_sha256
from offloadctl.core.plantypes import Plan
from offloadctl.loading.placed import HostPlacement

__all__ = [
    "KEY_VERSION",
    "KEY_PLAN_SHA256",
    "KEY_OFFLOADS",
    "KEY_SESSION",
    "KEY_PLANNED_AT",
    "KEY_PINS",
    "KEY_UNPINNED",
    "KEY_STREAMS",
    "PinCheck",
    "check_pins",
    "metadata_json",
    "plan_sha256",
    "planned_at",
    "planned_device",
    "planned_execution_order",
    "planned_input_shapes",
    "planned_shapes",
    "SessionSettings",
    "make_session_settings",
    "set_metadata",
    "session_settings",
]

KEY_VERSION = "offloadctl.version"
KEY_PLAN_SHA256 = "offloadctl.plan_sha256"
KEY_OFFLOADS = "offloadctl.offloads"
KEY_SESSION = "offloadctl.session"
KEY_PLANNED_AT = "offloadctl.planned_at"
KEY_PINS = "offloadctl.order_pins"
#: the copies no order pin holds, and why: they keep their planned place only in PRIORITY_BASED order
KEY_UNPINNED = "offloadctl.priority_based_only"
KEY_STREAMS = "offloadctl.streams"


def plan_sha256(plan: Plan) -> str:
    """sha256 of the canonical JSON (sorted keys, no whitespace, UTF-8) of what the rewrite follows:
    the plan less its ``rejected`` list, which says why the other tensors stay where they are (on a
    big model it names every tensor, and hashing it took a tenth of ``apply``)."""
    return json_sha256({key: value for key, value in plan.items() if key != "rejected"})


class SessionSettings(TypedDict, total=False):
    """The session settings a rewritten model records (``offloadctl.session``; see the module docstring):
    onnxruntime's execution order by its own name, the optimization level and optimizers to leave off,
    the plan's optimized-graph record, whether order pins hold the copies and for which target, the copy
    stream's partition file, and the CANN and WebGPU provider options."""

    execution_order: str
    graph_optimization_level: str
    disabled_optimizers: list[str]
    optimized: dict[str, Any]
    order_pins: bool
    pins_for: str
    streams: dict[str, str]
    cann: dict[str, str]
    webgpu: dict[str, str]


def make_session_settings(
    *, weights_offloaded: bool, pinned: bool = False, optimized: Mapping[str, Any] | None = None
) -> SessionSettings:
    """The session settings an offloaded model needs (see the module docstring); ``optimized``, the plan's
    ``model.optimized`` record when its model is a graph onnxruntime already optimized (``plan --opt-level``)."""
    settings: SessionSettings = {"execution_order": EXECUTION_ORDERS["priority"]}  # onnxruntime's name, for hosts
    if optimized is not None:  # its fusions are in the file: optimizing again would rename what the plan names
        settings["graph_optimization_level"] = "ORT_DISABLE_ALL"
        keys = ("opt_level", "device", "sha256")  # the sha256 of the model it was optimized from
        settings["optimized"] = {key: optimized[key] for key in keys}
    if pinned:
        settings["order_pins"] = True  # the copies are held in place in the DEFAULT order too
    if weights_offloaded or pinned:
        settings["disabled_optimizers"] = ["ConstantFolding"]
    settings["cann"] = {"enable_cann_graph": "0"}
    settings["webgpu"] = {"preferredLayout": "NCHW"}  # NHWC replaces nodes, and both orders follow node indices
    return settings


def set_metadata(model: onnx.ModelProto, values: dict[str, str]) -> None:
    """Set ``metadata_props`` entries in place: same keys replaced, other keys kept in order."""
    kept = [(p.key, p.value) for p in model.metadata_props if p.key not in values]
    del model.metadata_props[:]
    for key, value in kept + list(values.items()):
        entry = model.metadata_props.add()
        entry.key = key
        entry.value = value


def metadata_json(model: onnx.ModelProto, key: str) -> Any:
    """The JSON value of metadata entry ``key`` (None when absent or not valid JSON)."""
    for prop in model.metadata_props:
        if prop.key == key:
            try:
                return json.loads(prop.value)
            except (json.JSONDecodeError, RecursionError):
                return None
    return None


def session_settings(model: onnx.ModelProto) -> SessionSettings | None:
    """The session settings recorded by `offloadctl apply`, or None for a model it did not rewrite.

    Raises:
        OffloadError: the ``offloadctl.session`` entry exists but is not a JSON object.
    """
    for prop in model.metadata_props:
        if prop.key == KEY_SESSION:
            try:
                value = json.loads(prop.value)
            except json.JSONDecodeError as exc:
                raise OffloadError(
                    f"model metadata {KEY_SESSION!r} is not valid JSON ({exc.msg})",
                    hint="re-create the model with offloadctl apply",
                ) from None
            except RecursionError:
                raise OffloadError(
                    f"model metadata {KEY_SESSION!r} is not valid: its JSON is nested too deeply",
                    hint="re-create the model with offloadctl apply",
                ) from None
            if not isinstance(value, dict):
                raise OffloadError(
                    f"model metadata {KEY_SESSION!r} is not a JSON object",
                    hint="re-create the model with offloadctl apply",
                )
            return cast(SessionSettings, value)  # (a record apply wrote; its entries are read as they are)
    return None


class PinCheckDoc(TypedDict):
    """The order pins checked against the order that ran, in a ``--json`` document (`PinCheck.to_json`)."""

    checked: int
    holds: bool
    violated: list[dict[str, str]]
    unchecked: int


@dataclass
class PinCheck:
    """Whether every copy ran on the side of its original node that the model's order pins ask.

    onnxruntime appends the copies it inserts between host and device after every node; under
    PRIORITY_BASED the nodes that wait for them are held back while every ready node runs, a
    weight's H2D among them, so on such a device pins break in the order that runs
    (`offloadctl.rewriting.preview.pins_in_order` predicts which)."""

    checked: int
    violated: list[dict[str, str]]
    unchecked: int  # constraints whose nodes did not both run (fused, removed, unnamed)

    @property
    def holds(self) -> bool:
        return not self.violated

    def to_json(self) -> PinCheckDoc:
        return {
            "checked": self.checked,
            "holds": self.holds,
            "violated": self.violated[:20],
            "unchecked": self.unchecked,
        }


def check_pins(constraints: Sequence[Mapping[str, str]], ran: Sequence[str], order: str | None = None) -> PinCheck:
    """Check ``{"copy": C, "before": N}`` / ``{"copy": C, "after": N}`` against the order nodes ran in,
    ``order``; a constraint that names another order (``"order": "default"``: it holds in the DEFAULT
    walk only) is left out."""
    at = {name: k for k, name in enumerate(ran)}
    violated = []
    checked = unchecked = 0
    for c in constraints:
        if order is not None and c.get("order", order) != order:
            continue
        copy, other = c.get("copy", ""), c.get("before", c.get("after", ""))
        if copy not in at or other not in at:
            unchecked += 1
            continue
        checked += 1
        ok = at[copy] < at[other] if "before" in c else at[copy] > at[other]
        if not ok:
            violated.append(dict(c))
    return PinCheck(checked, violated, unchecked)


def _planned_at(model: str | os.PathLike[str]) -> tuple[onnx.ModelProto | None, Any]:
    """The model without its weights and its ``offloadctl.planned_at`` metadata; (None, None) for a
    file that does not hold the metadata's key, which is then not parsed (the commands that ask load
    the model right after: an original model is read once)."""
    try:
        if not _holds(model, KEY_PLANNED_AT.encode()):
            return None, None
        header = onnx.load(str(model), load_external_data=False)
    except Exception:  # noqa: BLE001 - load_model reports a bad file clearly
        return None, None
    return header, metadata_json(header, KEY_PLANNED_AT)


def _holds(path: str | os.PathLike[str], key: bytes) -> bool:
    """Whether the file's bytes hold ``key``: a metadata key is stored as it is spelt, in the binary
    format and in the text ones."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return False
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return data.find(key) >= 0


def planned_execution_order(model: str | os.PathLike[str]) -> str | None:
    """The execution order a rewritten model's plan counted positions in (``priority`` or ``default``,
    from its ``offloadctl.planned_at`` metadata); None for any other model."""
    _, recorded = _planned_at(model)
    order = recorded.get("execution_order") if isinstance(recorded, dict) else None
    return order if order in EXECUTION_ORDERS else None


def planned_device(proto: onnx.ModelProto) -> HostPlacement | None:
    """Where the device a rewritten model's plan was made for (``plan --device``) runs it, as its
    ``offloadctl.planned_at`` records it (``host_device``, ``host_nodes``, ``host_copies``, ``host_casts``);
    None for a plan made for no device, or any other model."""
    recorded = metadata_json(proto, KEY_PLANNED_AT)
    device = recorded.get("device") if isinstance(recorded, dict) else None
    if not (isinstance(device, dict) and isinstance(device.get("host_device"), str)):
        return None
    return HostPlacement.of_record(device)


def planned_at(model: str | os.PathLike[str]) -> tuple[dict[str, list[int]], dict[str, int], str | None]:
    """What a rewritten model records of its plan (``offloadctl.planned_at``), read once: the input shapes
    and dims it was made at (`planned_shapes`) and its execution order (`planned_execution_order`); empty
    and None for any other model."""
    header, recorded = _planned_at(model)
    if header is None or not isinstance(recorded, dict):
        return {}, {}, None
    shapes, dims = recorded.get("input_shapes") or {}, recorded.get("dims") or {}
    order = recorded.get("execution_order")
    pins = (
        _pins_of_inputs(header.graph, shapes, dims) if isinstance(shapes, dict) and isinstance(dims, dict) else ({}, {})
    )
    return pins[0], pins[1], order if order in EXECUTION_ORDERS else None


def planned_shapes(model: str | os.PathLike[str]) -> tuple[dict[str, list[int]], dict[str, int]]:
    """The input shapes and dims a rewritten model's plan was made at (its ``offloadctl.planned_at``
    metadata), for generated inputs; empty for any other model."""
    header, recorded = _planned_at(model)
    shapes: Any = recorded.get("input_shapes") or {} if isinstance(recorded, dict) else None
    dims: Any = recorded.get("dims") or {} if isinstance(recorded, dict) else None
    if header is None or not isinstance(shapes, dict) or not isinstance(dims, dict):
        return {}, {}
    return _pins_of_inputs(header.graph, shapes, dims)


def planned_input_shapes(model: str | os.PathLike[str]) -> dict[str, list[int | None]]:
    """Each graph input's shape at the point a rewritten model's plan was made (its ``offloadctl.planned_at``
    pins on the dimensions it declares; None where neither pins nor declares a size); empty for any other
    model."""
    header, recorded = _planned_at(model)
    if header is None or not isinstance(recorded, dict):
        return {}
    shapes, dims = _pins_of_inputs(header.graph, recorded.get("input_shapes") or {}, recorded.get("dims") or {})
    planned: dict[str, list[int | None]] = {}
    for value in header.graph.input:
        if value.name in shapes:
            planned[value.name] = list(shapes[value.name])
        elif value.type.HasField("tensor_type") and value.type.tensor_type.HasField("shape"):
            declared = value.type.tensor_type.shape.dim
            planned[value.name] = [dims.get(d.dim_param) if d.dim_param else (d.dim_value or None) for d in declared]
    return planned


def _pins_of_inputs(
    graph: onnx.GraphProto, shapes: dict[str, Any], dims: dict[str, Any]
) -> tuple[dict[str, list[int]], dict[str, int]]:
    """The recorded ``shapes`` of the graph's inputs and ``dims`` of their dimensions, as numbers."""
    known = {i.name for i in graph.input}
    names = {d.dim_param for i in graph.input for d in i.type.tensor_type.shape.dim if d.dim_param}
    return (
        {k: [int(x) for x in v] for k, v in shapes.items() if k in known and isinstance(v, list)},
        {k: int(v) for k, v in dims.items() if k in names and isinstance(v, int)},
    )
