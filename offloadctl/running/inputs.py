"""Inputs of a model run: what a model must be fed, read from files or generated, and its outputs saved.

`input_specs` lists the inputs a caller must feed; `load_inputs` reads them from an ``.npz`` file,
a folder of ``.npy`` files or onnx's test-data layout and checks them against the model;
`generate_inputs` makes them from a seed and value ranges, never with invented sizes (dynamic
dimensions must be pinned), and with values a language model accepts where the input's name says
what it is (`LLM_INPUTS`); `save_outputs` writes outputs atomically.
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from offloadctl.core.errors import OffloadError
from offloadctl.core.files import atomic_write

__all__ = [
    "session_feeds",
    "InputSpec",
    "input_specs",
    "load_inputs",
    "parse_value_ranges",
    "generate_inputs",
    "llm_values",
    "LLM_INPUTS",
    "save_outputs",
    "own_copies",
]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class InputSpec:
    """A graph input the caller must feed (inputs that are also initializers excluded)."""

    name: str
    elem_type: int | None  # None for non-tensor inputs
    shape: tuple[int | str | None, ...] | None

    @property
    def dtype(self) -> np.dtype | None:
        if self.elem_type is None:
            return None
        try:
            return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(self.elem_type))
        except (KeyError, TypeError, ValueError):
            return None

    def describe(self) -> str:
        dims = "?" if self.shape is None else ",".join("?" if d is None else str(d) for d in self.shape)
        return f"{self.dtype if self.dtype is not None else 'non-tensor'}[{dims}]"


def input_specs(proto: onnx.ModelProto) -> list[InputSpec]:
    """The inputs a caller must feed, in graph order."""
    initializers = {i.name for i in proto.graph.initializer} | {i.values.name for i in proto.graph.sparse_initializer}
    specs = []
    for value in proto.graph.input:
        if value.name in initializers:
            continue
        if not value.type.HasField("tensor_type"):
            specs.append(InputSpec(value.name, None, None))
            continue
        tt = value.type.tensor_type
        shape = None
        if tt.HasField("shape"):
            shape = tuple(
                d.dim_value if d.HasField("dim_value") and d.dim_value >= 0 else (d.dim_param or None)
                for d in tt.shape.dim
            )
        specs.append(InputSpec(value.name, tt.elem_type or None, shape))
    return specs


def load_inputs(path: str | os.PathLike[str], specs: Sequence[InputSpec], model: str) -> dict[str, np.ndarray]:
    """Read inputs and check them against the model's inputs.

    ``path`` is an ``.npz`` file (``numpy.savez``), a folder of ``NAME.npy`` files, or a folder in
    onnx's test-data layout (``input_0.pb``, ``input_1.pb``, ... serialized TensorProtos, matched by
    their name or else by their number in the model's input order); a folder holding only
    ``test_data_set_*`` folders stands for the first of them.

    Raises:
        OffloadError: the inputs cannot be read, or an input is missing, extra, or has the wrong
            dtype or shape.
    """
    source = Path(path)
    if source.is_dir():
        arrays = _read_input_folder(source, specs)
    elif source.is_file():
        arrays = _read_npz(source)
    else:
        raise OffloadError(
            f"inputs {source} do not exist",
            hint="give an .npz file (numpy.savez), a folder of NAME.npy files, "
            "or an onnx test-data folder (input_0.pb ...)",
        )
    _check_inputs(arrays, specs, source, model)
    return arrays


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    try:
        data = np.load(path, allow_pickle=False)
        if isinstance(data, np.ndarray):
            raise ValueError("one unnamed .npy array, not an .npz archive of named arrays")
        with data as npz:
            return {name: npz[name] for name in npz.files}
    except (OSError, ValueError, EOFError) as exc:
        raise OffloadError(
            f"inputs file {path} is not a readable .npz file ({exc})",
            hint="write it with numpy.savez(path, name=array, ...)",
        ) from None


_PB_INPUT = re.compile(r"input_(\d+)\.pb")


def _read_input_folder(folder: Path, specs: Sequence[InputSpec]) -> dict[str, np.ndarray]:
    files = sorted(p for p in folder.iterdir() if p.is_file())
    pbs = sorted(((int(m.group(1)), p) for p in files if (m := _PB_INPUT.fullmatch(p.name))), key=lambda t: t[0])
    npys = [p for p in files if p.suffix == ".npy"]
    if pbs:
        return _read_pb_inputs(folder, pbs, specs)
    if npys:
        arrays = {}
        for p in npys:
            try:
                arrays[p.stem] = np.load(p, allow_pickle=False)
            except (OSError, ValueError, EOFError) as exc:
                raise OffloadError(
                    f"input file {p} is not a readable .npy file ({exc})", hint="write it with numpy.save(path, array)"
                ) from None
        return arrays
    data_sets = sorted(p for p in folder.iterdir() if p.is_dir() and p.name.startswith("test_data_set_"))
    if data_sets:
        logger.info("reading inputs from %s", data_sets[0])
        return _read_input_folder(data_sets[0], specs)
    raise OffloadError(
        f"input folder {folder} holds no NAME.npy files and no input_0.pb ...",
        hint="save one NAME.npy per model input (numpy.save), or use onnx's test-data layout (input_0.pb, ...)",
    )


def _read_pb_inputs(folder: Path, pbs: list[tuple[int, Path]], specs: Sequence[InputSpec]) -> dict[str, np.ndarray]:
    from onnx import numpy_helper

    arrays: dict[str, np.ndarray] = {}
    for index, p in pbs:
        tensor = onnx.TensorProto()
        try:
            tensor.ParseFromString(p.read_bytes())
            value = numpy_helper.to_array(tensor)
        except Exception as exc:  # protobuf and onnx raise several types for a bad file
            raise OffloadError(
                f"input file {p} is not a serialized onnx TensorProto ({type(exc).__name__})",
                hint="write it with "
                "open(path, 'wb').write(onnx.numpy_helper.from_array(array, name).SerializeToString())",
            ) from None
        name = tensor.name
        if not name:
            if index >= len(specs):
                raise OffloadError(
                    f"input file {p} has no name and the model has only {len(specs)} input(s)",
                    hint="number the files input_0.pb ... in the model's input order, or name the tensors",
                )
            name = specs[index].name
        if name in arrays:
            raise OffloadError(f"input {name!r} is given twice in {folder}", hint="keep one file per input")
        arrays[name] = value
    return arrays


def _check_inputs(arrays: Mapping[str, np.ndarray], specs: Sequence[InputSpec], path: Path, model: str) -> None:
    by_name = {s.name: s for s in specs}
    expected = ", ".join(f"{s.name} {s.describe()}" for s in specs) or "(none)"
    what = f"inputs {'folder' if path.is_dir() else 'file'} {path}"
    extra = [n for n in arrays if n not in by_name]
    if extra:
        raise OffloadError(
            f"{what} has {', '.join(repr(n) for n in extra)}, which {'is' if len(extra) == 1 else 'are'} "
            f"not an input of {model}",
            hint=f"the model's inputs are: {expected}",
        )
    missing = [s for s in specs if s.name not in arrays]
    if missing:
        raise OffloadError(
            f"{what} lacks input {', '.join(repr(s.name) for s in missing)} of {model} "
            f"({', '.join(s.describe() for s in missing)})",
            hint=f"save every input: numpy.savez({path.name!r}, {', '.join(f'{s.name}=...' for s in specs)})",
        )
    for spec in specs:
        array = arrays[spec.name]
        if spec.dtype is not None and array.dtype != spec.dtype:
            raise OffloadError(
                f"input {spec.name!r} in {path} has dtype {array.dtype}, {model} expects {spec.dtype}",
                hint=f"convert it before saving: array.astype(numpy.{spec.dtype.name})",
            )
        if spec.shape is not None:
            fixed = [d if isinstance(d, int) else None for d in spec.shape]
            if array.ndim != len(fixed) or any(d is not None and d != a for d, a in zip(fixed, array.shape)):
                raise OffloadError(
                    f"input {spec.name!r} in {path} has shape {list(array.shape)}, {model} expects {spec.describe()}",
                    hint="save an array of the model's input shape (? marks a free dimension)",
                )


def parse_value_ranges(specs: Sequence[str]) -> dict[str, tuple[float, float]]:
    """Parse ``--value-range`` values: ``LOW,HIGH`` (every input), ``NAME:[LOW,HIGH]`` or ``NAME=LOW,HIGH``.

    Returns a map from input name ("" for every input without its own range) to (low, high).
    """
    ranges: dict[str, tuple[float, float]] = {}
    example = "for example --value-range 0,1 or --value-range input:[0,255]"
    for spec in specs:
        match = re.fullmatch(r"(?:(?P<name>.+?)[=:])?\[?(?P<low>[^,\[\]]+),(?P<high>[^,\[\]]+)\]?", spec.strip())
        if match is None:
            raise OffloadError(f"--value-range {spec!r} is not [NAME:]LOW,HIGH", hint=example)
        try:
            low, high = float(match.group("low")), float(match.group("high"))
        except ValueError:
            raise OffloadError(f"--value-range {spec!r}: LOW and HIGH must be numbers", hint=example) from None
        if not (math.isfinite(low) and math.isfinite(high)) or low > high:
            raise OffloadError(f"--value-range {spec!r}: need finite numbers with LOW <= HIGH", hint=example)
        name = match.group("name") or ""
        if name in ranges:
            raise OffloadError(f"--value-range gives {name or 'the default range'!r} twice", hint="keep one")
        ranges[name] = (low, high)
    return ranges


def _generated_shape(spec: InputSpec) -> list[int]:
    """The shape an input is generated at: every dimension known.

    Raises:
        OffloadError: the input's type or rank is unknown, or a dimension is dynamic.
    """
    dtype = spec.dtype
    if dtype is None or spec.shape is None or dtype.kind not in "fiub":
        why = "its rank is unknown" if spec.shape is None and dtype is not None else f"its type is {spec.describe()}"
        raise OffloadError(
            f"cannot generate input {spec.name!r}: {why}",
            hint="give the inputs with --inputs FILE.npz (or a folder of .npy files, or input_0.pb ...)",
        )
    dynamic = [(i, d) for i, d in enumerate(spec.shape) if not isinstance(d, int)]
    if dynamic:
        raise _dynamic_error(spec, dynamic)
    return [int(d) for d in spec.shape]  # type: ignore[arg-type]


def _dynamic_error(spec: InputSpec, dynamic: list[tuple[int, Any]]) -> OffloadError:
    """The error for an input to generate whose ``dynamic`` dimensions ((index, name or None)) have no size."""
    assert spec.shape is not None
    which = ", ".join(f"{i} ({d or '?'})" for i, d in dynamic)
    example = ",".join(str(d) if isinstance(d, int) else (d or f"D{i}") for i, d in enumerate(spec.shape))
    named = [d for _, d in dynamic if d]
    return OffloadError(
        f"cannot generate input {spec.name!r} ({spec.describe()}): dimension(s) {which} are dynamic, "
        "and offloadctl does not invent sizes",
        hint=f"give the sizes to run with: --input-shape {spec.name}={example} with numbers for "
        f"{', '.join(str(d or f'D{i}') for i, d in dynamic)}"
        + (f", or --dim {named[0]}=SIZE" if named else "")
        + "; or give real inputs with --inputs",
    )


def _random_values(
    rng: np.random.Generator, dtype: np.dtype, shape: list[int], low_high: tuple[float, float] | None, name: str
) -> np.ndarray:
    """Random values of ``dtype`` and ``shape``: within ``low_high`` when given (see `generate_inputs`).

    Raises:
        OffloadError: a range that holds no integer of ``dtype``.
    """
    if low_high is None:
        if dtype.kind == "f":
            return rng.standard_normal(shape)
        if dtype.kind in "iu":
            return rng.integers(0, 4, size=shape)
        return rng.random(shape) < 0.5
    low, high = low_high
    if dtype.kind == "f":
        return rng.uniform(low, high, size=shape)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        lo, hi = max(math.ceil(low), int(info.min)), min(math.floor(high), int(info.max))
        if lo > hi:
            raise OffloadError(
                f"--value-range {low:g},{high:g} holds no {dtype} value for input {name!r}",
                hint="give a range that contains an integer the type can hold",
            )
        return rng.integers(lo, hi, size=shape, endpoint=True)
    return rng.random(shape) < 0.5


def generate_inputs(
    specs: Sequence[InputSpec],
    *,
    seed: int = 0,
    value_ranges: Mapping[str, tuple[float, float]] | None = None,
) -> tuple[dict[str, np.ndarray], list[str]]:
    """Random inputs from ``numpy.random.default_rng(seed)``, respecting dtype and shape.

    Without a range floats are standard normal, integers small non-negative (0..3), booleans
    random; inputs a language model reads get the values it expects from their names
    (`llm_values`: attention masks all ones, position ids a range after the past, and so on). A
    range (``value_ranges[name]``, or ``value_ranges[""]`` for every input without a rule of its
    own) draws floats uniformly from [low, high) and integers from low..high (both included).
    Sizes are never invented: every dimension must be known (pin dynamic ones first, see
    `run_model`).

    Returns:
        (inputs, warnings).

    Raises:
        OffloadError: an input that cannot be generated (non-tensor, string, unknown rank, a
            dynamic dimension), or a range that names no input or holds no integer.
    """
    ranges = dict(value_ranges or {})
    unknown = [n for n in ranges if n and n not in {s.name for s in specs}]
    if unknown:
        raise OffloadError(
            f"--value-range names {', '.join(map(repr, unknown))}, which is not an input",
            hint=f"inputs are: {', '.join(s.name for s in specs) or '(none)'}",
        )
    rng = np.random.default_rng(seed)
    inputs: dict[str, np.ndarray] = {}
    shapes: dict[str, list[int]] = {}
    for spec in specs:
        shapes[spec.name] = shape = _generated_shape(spec)
        dtype = spec.dtype
        assert dtype is not None  # `_generated_shape` refuses an input without one
        value = _random_values(rng, dtype, shape, ranges.get(spec.name, ranges.get("")), spec.name)
        inputs[spec.name] = np.asarray(value).astype(dtype)  # rank 0 gives a scalar: keep an array
    for name, value in llm_values(shapes).items():
        if name not in ranges:  # a range the user gave for this input wins
            inputs[name] = value.astype(inputs[name].dtype)
    return inputs, []


#: Input names whose values a language model constrains (exported by onnxruntime-genai's builder,
#: Hugging Face Optimum, torch): what `llm_values` gives each.
LLM_INPUTS = {
    "attention_mask": "all ones",
    "position_ids": "past length + 0, 1, 2, ... along the sequence",
    "cache_position": "past length + 0, 1, 2, ...",
    "seqlens_k": "total length - 1 (GroupQueryAttention)",
    "total_sequence_length": "total length (GroupQueryAttention)",
    "use_cache_branch": "true when there is a past (Optimum's merged decoder)",
}

_PAST = re.compile(r"(^|[._])past($|[._])|past_key_values|^cache[._]")


def llm_values(shapes: Mapping[str, Sequence[int]]) -> dict[str, np.ndarray]:
    """Values for the inputs `LLM_INPUTS` names, from the shapes of every input.

    Random values there make a decoder wrong, not just different: an attention mask of 0..3 makes
    GroupQueryAttention nondeterministic, position ids out of order or beyond the past change the
    result. The lengths come from the shapes: the sequence from ``input_ids`` (else
    ``position_ids``), the total from the attention mask (else past + sequence), the past from a
    rank-4 past key/value input (its third dimension). With a shared KV buffer (the past as long as
    the whole context) the attention mask, not the buffer, says how much is past.
    """
    lower = {name.lower(): name for name in shapes}

    def named(key: str) -> str | None:
        return lower.get(key) or next((n for low, n in lower.items() if low.endswith("." + key)), None)

    seq_name = named("input_ids") or named("position_ids")
    seq = shapes[seq_name][-1] if seq_name and shapes[seq_name] else None
    past_inputs = [n for n in shapes if _PAST.search(n.lower()) and len(shapes[n]) == 4]
    past = shapes[past_inputs[0]][2] if past_inputs else 0
    mask = named("attention_mask")
    total = shapes[mask][-1] if mask and shapes[mask] else (past + seq if seq is not None else None)
    offset = max(total - seq, 0) if total is not None and seq is not None else past
    values: dict[str, np.ndarray] = {}
    for key in LLM_INPUTS:
        name = named(key)
        if name is None:
            continue
        shape = list(shapes[name])
        if key == "attention_mask":
            values[name] = np.ones(shape)
        elif key in ("position_ids", "cache_position"):
            length = shape[-1] if shape else 1
            values[name] = np.broadcast_to(np.arange(offset, offset + length), shape) if shape else np.array(offset)
        elif key == "seqlens_k" and total is not None:
            values[name] = np.full(shape, total - 1)
        elif key == "total_sequence_length" and total is not None:
            values[name] = np.full(shape, total)
        elif key == "use_cache_branch":
            values[name] = np.full(shape, past > 0 or offset > 0)
    return values


def save_outputs(path: str | os.PathLike[str], outputs: Mapping[str, Any]) -> list[str]:
    """Write the tensor outputs to an .npz file atomically; return the names left out (non-tensors)."""
    arrays = {name: value for name, value in outputs.items() if isinstance(value, np.ndarray)}
    skipped = [name for name in outputs if name not in arrays]

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as f:  # a file object: numpy.savez would append .npz to a path
            np.savez(f, **arrays)

    atomic_write(path, write)
    return skipped


def own_copies(feeds: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of every input array (other values as they are): what one run is given, so that a run that
    writes into its inputs changes no array another run or another model reads."""
    return {name: np.array(v, copy=True) if isinstance(v, np.ndarray) else v for name, v in feeds.items()}


def session_feeds(proto: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The feeds a session of ``proto`` takes: its graph inputs that are not weights with defaults."""
    weights = {t.name for t in proto.graph.initializer}
    return {i.name: feeds[i.name] for i in proto.graph.input if i.name in feeds and i.name not in weights}
