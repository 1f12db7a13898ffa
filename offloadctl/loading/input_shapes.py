"""Pinning dynamic input dimensions: ``--input-shape`` (by input, patterns too) and ``--dim`` (by
dimension name) parsed, checked against what the model fixes, sums of dimensions (Optimum's
``past_sequence_length + sequence_length``) derived from their parts, and the pins written into the
model's inputs, outputs and value_info before shape inference runs.
"""

from __future__ import annotations

import ast
import fnmatch
import logging
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import onnx

from offloadctl.core.errors import OffloadError

if TYPE_CHECKING:
    pass


__all__ = [
    "MAX_DIM",
    "check_dims",
    "expand_patterns",
    "follows_from",
    "given_dims",
    "parse_dims",
    "parse_input_shapes",
    "pin_dims",
    "pin_input_shapes",
]

logger = logging.getLogger(__name__)

MAX_DIM = 2**63 - 1  # a dimension is an int64 in onnx


_SHAPE_EXAMPLE = "for example --input-shape input=1,3,224,224 (or input:1,3,224,224, or input:[1,3,224,224])"
_DIMS_RE = re.compile(r"(?P<name>.+?)[=:](?P<dims>\[?[0-9,\s]*\]?)")


def parse_input_shapes(specs: Sequence[str]) -> dict[str, list[int]]:
    """Parse ``--input-shape`` values: ``NAME=D0,D1,...``, ``NAME:D0,D1,...`` or ``NAME:[D0,D1,...]``.

    The last two are the forms Polygraphy and onnxsim take. A name may itself contain ``:`` or
    ``=`` (``input:0:[1,3]`` pins ``input:0``): the dimensions are what follows the last separator
    that leaves a list of integers. ``NAME=`` or ``NAME:[]`` pins a scalar.
    """
    shapes: dict[str, list[int]] = {}
    for spec in specs:
        match = _DIMS_RE.fullmatch(spec)
        if match is None:
            name, dims = _split_spec(spec)
            if not name:
                raise OffloadError(f"--input-shape {spec!r} is not NAME=D0,D1,...", hint=_SHAPE_EXAMPLE)
            try:
                negative = any(int(d) < 0 for d in dims.strip("[]").split(","))
            except ValueError:
                negative = False
            rule = "must be >= 0" if negative else "must be integers"
            hint = _SHAPE_EXAMPLE
            if "SIZE" in dims:  # pasted from a hint: the sizes are the user's to give
                hint = "replace each SIZE with the size that dimension has where the model runs"
            raise OffloadError(f"--input-shape {spec!r}: dimensions {rule}", hint=hint)
        name, dims = match.group("name"), match.group("dims").strip()
        if dims.startswith("[") != dims.endswith("]"):
            raise OffloadError(f"--input-shape {spec!r}: unbalanced brackets", hint=_SHAPE_EXAMPLE)
        dims = dims.strip("[]").strip()
        parts = [d.strip() for d in dims.split(",")] if dims else []
        if any(not d for d in parts):
            raise OffloadError(f"--input-shape {spec!r}: an empty dimension", hint=_SHAPE_EXAMPLE)
        values = [int(d) for d in parts]  # sizes beyond int64 are refused where they are pinned
        if name in shapes:
            raise OffloadError(
                f"--input-shape gives input {name!r} twice", hint=f"keep one --input-shape {name}=D0,D1,..."
            )
        shapes[name] = values
    return shapes


def _split_spec(spec: str) -> tuple[str, str]:
    """Name and dimensions of a spec that did not parse, for the error message."""
    cut = max(spec.rfind("="), spec.rfind(":"))
    return (spec[:cut], spec[cut + 1 :]) if cut > 0 else ("", spec)


def parse_dims(specs: Sequence[str]) -> dict[str, int]:
    """Parse ``--dim NAME=VALUE`` values: a symbolic dimension (dim_param) pinned by name."""
    dims: dict[str, int] = {}
    for spec in specs:
        name, sep, value = spec.rpartition("=")
        name = name.strip()
        if not sep or not name:
            raise OffloadError(f"--dim {spec!r} is not NAME=VALUE", hint="for example --dim batch=1")
        try:
            number = int(value)
        except ValueError:
            number = -1
        if number < 0 or number > MAX_DIM:
            hint = "for example --dim batch=1"
            if value.strip() == "SIZE":  # pasted from a hint: the size is the user's to give
                hint = f"replace SIZE with the size {name} has where the model runs: --dim {name}=512, say"
            raise OffloadError(f"--dim {spec!r}: the value must be an integer >= 0, not {value!r}", hint=hint)
        if name in dims and dims[name] != number:
            raise OffloadError(f"--dim gives {name!r} twice", hint=f"keep one --dim {name}=VALUE")
        dims[name] = number
    return dims


_GLOB = frozenset("*?[")


def expand_patterns(
    proto: onnx.ModelProto, shapes: dict[str, list[int]], path: Path, source: str
) -> dict[str, list[int]]:
    """Input shapes whose name is a glob pattern (``past_key_values.*``) and no input's name stand for
    every input the pattern matches (a name given exactly wins); a pattern that matches nothing, or
    two patterns that give one input different shapes, are refused."""
    if not any(_GLOB & set(name) for name in shapes):
        return shapes
    initializers = {i.name for i in proto.graph.initializer}
    inputs = [i.name for i in proto.graph.input if i.name not in initializers]
    exact = {name: dims for name, dims in shapes.items() if name in inputs or not _GLOB & set(name)}
    expanded = dict(exact)
    given_by: dict[str, str] = {}
    for pattern, dims in shapes.items():
        if pattern in exact:
            continue
        for name in _matched(pattern, inputs, path, source):
            if name in exact:
                continue
            if name in expanded and expanded[name] != dims:
                raise OffloadError(
                    f"{source}: input {name!r} matches {given_by[name]!r} and {pattern!r}, which give it different "
                    "shapes",
                    hint=f"give it by name ({name}=D0,D1,...), which wins over the patterns, or make them disjoint",
                )
            expanded[name] = list(dims)
            given_by[name] = pattern
    return expanded


def _matched(pattern: str, inputs: list[str], path: Path, source: str) -> list[str]:
    """The inputs ``pattern`` matches; refused when it matches none."""
    matched = [name for name in inputs if fnmatch.fnmatchcase(name, pattern)]
    if not matched:
        raise OffloadError(
            f"{source} pattern {pattern!r} matches no input of {path}",
            hint=f"inputs are: {', '.join(inputs) or '(none)'}",
        )
    return matched


def pin_input_shapes(proto: onnx.ModelProto, shapes: dict[str, list[int]], path: Path, source: str) -> None:
    """Pin graph input dimensions; ``source`` names where the shapes come from, for messages."""
    initializer_names = {i.name for i in proto.graph.initializer}
    inputs = {i.name: i for i in proto.graph.input if i.name not in initializer_names}
    for name, dims in shapes.items():
        if name not in inputs:
            raise OffloadError(
                f"{source} names {name!r}, which is not an input of {path}",
                hint=f"inputs are: {', '.join(inputs) or '(none)'}",
            )
        value = inputs[name]
        tensor_type = value.type.tensor_type
        if not value.type.HasField("tensor_type"):
            raise OffloadError(
                f"input {name!r} of {path} is not a tensor; --input-shape cannot pin it",
                hint=f"drop {name} from {source}",
            )
        _check_pinned_dims(tensor_type, dims, f"{source} {name}")
        tensor_type.ClearField("shape")
        for d in dims:
            tensor_type.shape.dim.add().dim_value = d


def _check_pinned_dims(tensor_type: onnx.TypeProto.Tensor, dims: list[int], where: str) -> None:
    """Refuse pinned ``dims`` whose rank is not the declared one, that onnx cannot hold, or that change a
    dimension the model fixes (``where``: the option and the input, for messages)."""
    old = tensor_type.shape.dim if tensor_type.HasField("shape") else []
    if tensor_type.HasField("shape") and len(old) != len(dims):
        raise OffloadError(
            f"{where}: gave {len(dims)} dimensions, the model declares {len(old)}",
            hint=f"give exactly {len(old)} comma-separated dimensions",
        )
    for i, d in enumerate(dims):
        if d > MAX_DIM:
            raise OffloadError(
                f"{where}: dimension {i} is {d}, larger than onnx allows (at most {MAX_DIM})",
                hint="give the real size of that dimension",
            )
    for i, d in enumerate(old):
        if d.HasField("dim_value") and d.dim_value >= 0 and d.dim_value != dims[i]:
            raise OffloadError(
                f"{where}: dimension {i} is fixed to {d.dim_value} in the model, not {dims[i]}",
                hint="pin only the dynamic dimensions to other values",
            )


def _feed_inputs(proto: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    initializer_names = {i.name for i in proto.graph.initializer}
    return [i for i in proto.graph.input if i.name not in initializer_names]


def _expression(text: str) -> ast.expr | None:
    """A dimension name that is arithmetic over other names (``past_sequence_length + sequence_length``,
    ``2 * batch``), parsed; None for a plain name or anything else."""
    try:
        tree = ast.parse(text, mode="eval").body
    except SyntaxError:
        return None
    if isinstance(tree, ast.Name):
        return None
    for node in ast.walk(tree):
        if not isinstance(node, (ast.BinOp, ast.Name, ast.Constant, ast.Add, ast.Sub, ast.Mult, ast.Load)):
            return None
        if isinstance(node, ast.Constant) and not isinstance(node.value, int):
            return None
    return tree


def follows_from(name: str, dims: Mapping[str, int]) -> bool:
    """Whether the dimension ``name`` is arithmetic over others that ``dims`` all give (Optimum's
    ``past_sequence_length + sequence_length`` with both parts pinned), so that `load_model` makes it
    from them: a plain name (``batch-size`` too) or an expression it cannot evaluate (``n / 2``)
    does not follow and must be pinned itself."""
    tree = _expression(name)
    return tree is not None and _evaluate(tree, {k: v for k, v in dims.items() if k != name}) is not None


def given_dims(dims: Mapping[str, int]) -> dict[str, int]:
    """The pins of ``dims`` a command line needs: those that do not follow from the others (a
    derived dimension that its parts make, `follows_from`, is left out)."""
    given = {}
    for name, value in dims.items():
        tree = _expression(name)
        if tree is None or _evaluate(tree, dict(dims)) != value:
            given[name] = value
    return given


def _evaluate(tree: ast.expr, dims: dict[str, int]) -> int | None:
    if isinstance(tree, ast.Constant):
        return tree.value if isinstance(tree.value, int) else None
    if isinstance(tree, ast.Name):
        return dims.get(tree.id)
    if isinstance(tree, ast.BinOp):
        a, b = _evaluate(tree.left, dims), _evaluate(tree.right, dims)
        if a is None or b is None:
            return None
        return a + b if isinstance(tree.op, ast.Add) else a - b if isinstance(tree.op, ast.Sub) else a * b
    return None


def _derived_dims(where: dict[str, list[tuple[str, int]]], dims: dict[str, int], path: Path) -> None:
    """Dimensions named by arithmetic over others (Optimum's ``past_sequence_length +
    sequence_length``) follow from their parts: pinned when the parts are, and refused when given a
    size their parts contradict."""
    for name in where:
        tree = _expression(name)
        if tree is None:
            continue
        value = _evaluate(tree, dims)
        if value is None:
            continue
        if name in dims and dims[name] != value:
            raise OffloadError(
                f"--dim {name}={dims[name]} contradicts its parts, which make it {value}",
                hint=f"drop --dim {name!r} (it follows from its parts) or give parts that make it {dims[name]}",
            )
        dims[name] = value


def check_dims(proto: onnx.ModelProto, dims: dict[str, int], pinned: dict[str, list[int]], path: Path) -> None:
    """Every --dim name is a dimension of an input, and agrees with any --input-shape of it; a dimension
    that is a sum or product of named ones follows from them (`_derived_dims`, which fills ``dims``)."""
    where: dict[str, list[tuple[str, int]]] = {}
    for value in _feed_inputs(proto):
        if value.type.HasField("tensor_type") and value.type.tensor_type.HasField("shape"):
            for i, d in enumerate(value.type.tensor_type.shape.dim):
                if d.WhichOneof("value") == "dim_param" and d.dim_param:
                    where.setdefault(d.dim_param, []).append((value.name, i))
    given = dict(dims)
    _derived_dims(where, dims, path)
    for name in given:
        if name not in where:
            raise OffloadError(
                f"--dim names {name!r}, which is not a dimension of any input of {path}",
                hint=f"named dimensions of its inputs: {', '.join(sorted(where)) or '(none)'}",
            )
    for name, size in dims.items():
        for input_name, i in where[name]:
            shape = pinned.get(input_name)
            if shape is not None and i < len(shape) and shape[i] != size:
                raise OffloadError(
                    f"--dim {name}={size} contradicts --input-shape {input_name}, which gives {name} "
                    f"(dimension {i}) as {shape[i]}",
                    hint="give each dimension one size",
                )


def pin_dims(proto: onnx.ModelProto, dims: dict[str, int]) -> None:
    graph = proto.graph
    for value in (*graph.input, *graph.output, *graph.value_info):
        if value.type.HasField("tensor_type") and value.type.tensor_type.HasField("shape"):
            for d in value.type.tensor_type.shape.dim:
                if d.WhichOneof("value") == "dim_param" and d.dim_param in dims:
                    d.dim_value = dims[d.dim_param]  # clears dim_param (a oneof)
