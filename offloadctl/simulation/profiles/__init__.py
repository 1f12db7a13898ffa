"""Device profiles for the simulator's time model: bundled JSON data files, their loader and writer.

A profile is a JSON object (bundled here as ``<name>.json``, or a user's own file)::

    {"name": "...", "description": "...",
     "peak_flops": 3.2e14 | {"float16": 3.2e14, ..., "default": 3.2e14},   # FLOP/s
     "mem_bandwidth": 1.6e12,                                              # device memory, bytes/s
     "kernel_launch_s": 1e-05,                                             # per node
     "link": {"h2d": {"bandwidth": 2.5e10, "latency_s": 1e-05},            # bytes/s, seconds
              "d2h": {"bandwidth": 2.5e10, "latency_s": 1e-05}},
     "source": {"peak_flops": "where the number comes from", ...}}

``peak_flops`` is one figure or one per element type (the ONNX type name in lower case, e.g.
``float16``) with a ``default`` for the others. ``source`` says where each number comes from
(datasheet, measurement, assumption); it is required so figures never travel without their origin.
An optional ``run_overhead_s`` is the fixed cost of one session run (0 when absent).

A *measured* profile (written by ``offloadctl profile``, see `offloadctl.running.profiler`) has the same
keys, measured on the device, plus ``measured``: one model's node durations from onnxruntime's
profiling (keyed by node name, with the model's sha256, op types and input shapes), the executor's
per-run and per-node overheads, the copy-cost fit per direction and what it ran on. The whole
format is ``schemas/profile.schema.json``; every profile read is checked against it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema

from offloadctl.core.errors import OffloadError
from offloadctl.core.files import atomic_write_text, read_json
from offloadctl.core.schemas import load_schema

__all__ = [
    "DEFAULT_PROFILE",
    "PROFILE_SCHEMA_VERSION",
    "Profile",
    "Link",
    "NodeTime",
    "MeasuredTimes",
    "list_profiles",
    "load_profile",
    "profile_from_dict",
    "profile_schema",
    "validate_profile",
    "write_profile",
]

DEFAULT_PROFILE = "ascend-910b"
PROFILE_SCHEMA_VERSION = 1
_SCHEMA_FILE = "profile.schema.json"


def profile_schema() -> dict[str, Any]:
    """The profile schema (`offloadctl.core.schemas.load_schema`)."""
    return load_schema(_SCHEMA_FILE)


@lru_cache(maxsize=1)
def _validator() -> jsonschema.protocols.Validator:
    schema = profile_schema()
    return jsonschema.validators.validator_for(schema)(schema)


def validate_profile(data: Any, *, origin: str = "(dict)") -> None:
    """Raise OffloadError naming the first field of ``data`` that breaks the profile schema."""
    error = jsonschema.exceptions.best_match(_validator().iter_errors(data))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "(top level)"
        raise OffloadError(
            f"profile {origin} is not a valid profile: field {where}: {error.message}",
            hint="fix that field (schema: schemas/profile.schema.json) or measure it again with offloadctl profile",
        )


@dataclass(frozen=True)
class Link:
    """One direction of the host link."""

    bandwidth: float  # bytes per second
    latency_s: float  # fixed cost of one copy

    def time(self, nbytes: int) -> float:
        """Seconds to move ``nbytes`` in one copy."""
        return self.latency_s + nbytes / self.bandwidth


@dataclass(frozen=True)
class NodeTime:
    """One node's measured duration (median over the profiled runs) and what it computed."""

    op_type: str
    seconds: float
    input_shapes: tuple[tuple[int, ...] | None, ...] | None  # None: not recorded
    scratch_bytes: int = 0  # what the kernel allocated while it ran and freed before it returned
    ran: bool = True  # False: fused into another node or removed at the profile's optimization level


@dataclass(frozen=True, eq=False)
class MeasuredTimes:
    """The per-model part of a measured profile: node durations from onnxruntime's profiling.

    ``node_overhead_s`` is added to every duration read from profiling (see the schema); it can be
    negative. Compared by identity: a profile's node table can hold a hundred thousand entries.
    """

    model_path: str
    sha256: str
    node_overhead_s: float
    nodes: Mapping[str, NodeTime]
    opt_level: str = "disable"  # onnxruntime's graph optimization level of the timed runs
    fused: frozenset[str] = frozenset()  # tensors that level's rewrites took in (plans keep them)
    unfolded_s: float = 0.0  # what the run takes longer with ConstantFolding off, as every rewrite runs

    def __repr__(self) -> str:
        return f"MeasuredTimes(model={self.model_path!r}, sha256={self.sha256[:12]}, nodes={len(self.nodes)})"


@dataclass(frozen=True)
class Profile:
    """The figures the time model needs, with where they come from."""

    name: str
    description: str
    peak_flops: dict[str, float]  # element type -> FLOP/s; always has "default"
    mem_bandwidth: float
    kernel_launch_s: float
    h2d: Link
    d2h: Link
    source: dict[str, str] | str
    run_overhead_s: float = 0.0
    measured: MeasuredTimes | None = field(default=None, compare=False)

    def flops_for(self, dtype: str) -> float:
        """Peak FLOP/s for an element type name such as ``float16``."""
        return self.peak_flops.get(dtype, self.peak_flops["default"])

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "peak_flops": dict(self.peak_flops),
            "mem_bandwidth": self.mem_bandwidth,
            "kernel_launch_s": self.kernel_launch_s,
            "link": {
                "h2d": {"bandwidth": self.h2d.bandwidth, "latency_s": self.h2d.latency_s},
                "d2h": {"bandwidth": self.d2h.bandwidth, "latency_s": self.d2h.latency_s},
            },
            "run_overhead_s": self.run_overhead_s,
            "source": self.source,
            "measured": None
            if self.measured is None
            else {
                "model": self.measured.model_path,
                "sha256": self.measured.sha256,
                "nodes": len(self.measured.nodes),
                "node_overhead_s": self.measured.node_overhead_s,
                "opt_level": self.measured.opt_level,
                "fused": len(self.measured.fused),
            },
        }


def list_profiles() -> list[str]:
    """Names of the bundled profiles."""
    folder = resources.files(__name__)
    return sorted(p.name[: -len(".json")] for p in folder.iterdir() if p.name.endswith(".json"))


def _number(value: Any, where: str, origin: str, *, zero_ok: bool) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and (value >= 0 if zero_ok else value > 0)
    if not ok:
        need = "a number >= 0" if zero_ok else "a number > 0"
        raise OffloadError(
            f"profile {origin}: {where} must be {need}, got {value!r}",
            hint="fix that field; see a bundled profile (offloadctl/simulation/profiles/*.json) for the format",
        )
    return float(value)


def profile_from_dict(data: Any, *, origin: str = "(dict)") -> Profile:
    """Validate a profile document and return it.

    Raises:
        OffloadError: a required key is missing or a figure is not a positive number.
    """
    hint = "see a bundled profile (offloadctl/simulation/profiles/*.json) for the format"
    if not isinstance(data, dict):
        raise OffloadError(f"profile {origin} must be a JSON object, got {type(data).__name__}", hint=hint)
    required = ("name", "peak_flops", "mem_bandwidth", "kernel_launch_s", "link", "source")
    missing = [k for k in required if k not in data]
    if missing:
        raise OffloadError(f"profile {origin} lacks required key(s): {', '.join(missing)}", hint=hint)
    if not isinstance(data["name"], str) or not data["name"]:
        raise OffloadError(f"profile {origin}: name must be a non-empty string", hint=hint)
    flops = data["peak_flops"]
    if isinstance(flops, dict):
        if "default" not in flops:
            raise OffloadError(f"profile {origin}: peak_flops needs a 'default' entry", hint=hint)
        peak = {str(k): _number(v, f"peak_flops.{k}", origin, zero_ok=False) for k, v in flops.items()}
    else:
        peak = {"default": _number(flops, "peak_flops", origin, zero_ok=False)}
    link = data["link"]
    if not isinstance(link, dict):
        raise OffloadError(f"profile {origin}: link must be an object with h2d and d2h", hint=hint)
    links = {}
    for direction in ("h2d", "d2h"):
        entry = link.get(direction)
        if not isinstance(entry, dict) or "bandwidth" not in entry or "latency_s" not in entry:
            raise OffloadError(
                f"profile {origin}: link.{direction} must be an object with bandwidth and latency_s", hint=hint
            )
        links[direction] = Link(
            _number(entry["bandwidth"], f"link.{direction}.bandwidth", origin, zero_ok=False),
            _number(entry["latency_s"], f"link.{direction}.latency_s", origin, zero_ok=True),
        )
    source = data["source"]
    if not (isinstance(source, str) and source) and not (
        isinstance(source, dict) and source and all(isinstance(v, str) for v in source.values())
    ):
        raise OffloadError(
            f"profile {origin}: source must say where the figures come from (a string, or an object of strings)",
            hint=hint,
        )
    mem_bandwidth = _number(data["mem_bandwidth"], "mem_bandwidth", origin, zero_ok=False)
    kernel_launch_s = _number(data["kernel_launch_s"], "kernel_launch_s", origin, zero_ok=True)
    validate_profile(data, origin=origin)  # the rest of the format, the measured part included
    return Profile(
        name=data["name"],
        description=str(data.get("description", "")),
        peak_flops=peak,
        mem_bandwidth=mem_bandwidth,
        kernel_launch_s=kernel_launch_s,
        h2d=links["h2d"],
        d2h=links["d2h"],
        source=source,
        run_overhead_s=float(data.get("run_overhead_s", 0.0)),
        measured=_measured(data["measured"]) if "measured" in data else None,
    )


def _measured(doc: dict[str, Any]) -> MeasuredTimes:
    """The node table of a (schema-valid) ``measured`` section."""

    def shapes(entry: dict[str, Any]) -> tuple[tuple[int, ...] | None, ...] | None:
        got = entry.get("input_shapes")
        return None if got is None else tuple(None if s is None else tuple(s) for s in got)

    return MeasuredTimes(
        model_path=doc["model"]["path"],
        sha256=doc["model"]["sha256"],
        node_overhead_s=float(doc["executor"]["node_overhead_s"]),
        nodes={
            name: NodeTime(
                entry["op_type"],
                float(entry["seconds"]),
                shapes(entry),
                int(entry.get("scratch_bytes", 0)),
                bool(entry.get("ran", True)),
            )
            for name, entry in doc["nodes"].items()
        },
        opt_level=doc["session"]["opt_level"],
        fused=frozenset(doc.get("fused", ())),
        unfolded_s=float(doc["copies_in_model"].get("unfolded_s", 0.0)),
    )


def load_profile(name_or_path: str | os.PathLike[str] = DEFAULT_PROFILE) -> Profile:
    """Load a bundled profile by name, or a user's JSON file by path.

    Raises:
        OffloadError: unknown name, unreadable or invalid file.
    """
    text = str(name_or_path)
    bundled = resources.files(__name__).joinpath(f"{text}.json")
    if os.sep not in text and not text.endswith(".json") and bundled.is_file():
        return profile_from_dict(json.loads(bundled.read_text(encoding="utf-8")), origin=text)
    path = Path(text)
    if not path.is_file():
        raise OffloadError(
            f"profile {text!r} is neither a bundled profile nor a file",
            hint=f"use one of {', '.join(list_profiles())} or the path of a profile JSON file",
        )
    data = read_json(
        path,
        "profile file",
        fix="see a bundled profile (offloadctl/simulation/profiles/*.json) for the format, or measure one",
    )
    return profile_from_dict(data, origin=f"file {path}")


def write_profile(path: str | os.PathLike[str], doc: Mapping[str, Any]) -> None:
    """Validate a profile document and write it atomically.

    Indented JSON, except that each node of ``measured.nodes`` and each list of numbers (the runs,
    the sweep's points) takes one line: a big model has one entry per node.
    """
    validate_profile(doc, origin="being written")
    compact: dict[str, str] = {}

    def slot(value: Any) -> str:
        key = f"\u0000{len(compact)}"
        compact[key] = json.dumps(value)
        return key

    def shrink(value: Any, nodes: bool = False) -> Any:
        if isinstance(value, dict):
            if nodes:
                return {k: slot(v) for k, v in value.items()}
            return {k: shrink(v, nodes=k == "nodes" and isinstance(v, dict)) for k, v in value.items()}
        if isinstance(value, list):
            if all(isinstance(v, (int, float)) or isinstance(v, list) for v in value) and value:
                return slot(value)
            return [shrink(v) for v in value]
        return value

    text = json.dumps(shrink(dict(doc)), indent=1)
    for key, value in compact.items():
        text = text.replace(json.dumps(key), value, 1)
    atomic_write_text(path, text + "\n")
