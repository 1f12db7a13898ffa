"""The models that ship inside the onnx wheel, rewritten and run against the outputs shipped beside them.

onnx's backend test data holds about 140 small models exported by others (PyTorch layers and
operators converted at opsets 6 to 9, sequence graphs, gradient graphs), each with its inputs and
expected outputs: ground truth nobody here wrote. Each model is planned with every tensor it lets
offload (select distance 0, weights, ``--force '*'``), rewritten, and run on onnxruntime's CPU
provider with the shipped inputs: the outputs must be bit-identical to the original's and match the
shipped ones as onnx's own backend tests check them. A model onnxruntime cannot load (operators of
opsets it has dropped, training operators) or cannot run here (a locale this machine lacks) must
still plan and rewrite, and `run` must refuse the rewrite as it refuses the original, and say,
given the original to compare with, that the rewrite is not the cause.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import offloadctl
from offloadctl.core.errors import OffloadError

DATA = Path(onnx.__file__).parent / "backend" / "test" / "data"
FOLDERS = sorted(p.parent for p in DATA.glob("*/*/model.onnx") if (p.parent / "test_data_set_0").is_dir())
OFFLOAD_ALL = {"select_distance": 0, "params": True, "force": ["*"]}


def _refusal(error: OffloadError) -> tuple[str, str]:
    """What `run` says onnxruntime did (could not load, or failed running) and its status, without
    the model's path or node names."""
    status = re.search(r"\[ONNXRuntimeError\] : \d+ : \w+", error.message)
    verb = re.match(r"onnxruntime (cannot load|failed running)", error.message)
    return (verb.group(1) if verb else error.message, status.group(0) if status else "")


def _shipped_outputs(data_set: Path) -> list[np.ndarray]:
    """The expected outputs shipped in an onnx test-data folder, in output order (every model here
    returns tensors)."""
    count = len(list(data_set.glob("output_*.pb")))
    return [
        numpy_helper.to_array(onnx.TensorProto.FromString((data_set / f"output_{k}.pb").read_bytes()))
        for k in range(count)
    ]


def test_the_wheel_ships_the_models():
    assert len(FOLDERS) >= 100, f"onnx's backend test data has {len(FOLDERS)} models with data under {DATA}"


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_wheel_model_with_every_offload_gives_the_shipped_outputs(folder, tmp_path):
    original = folder / "model.onnx"
    analysis = offloadctl.analyse(offloadctl.load(original))
    plan = offloadctl.make_plan(analysis, **OFFLOAD_ALL)
    rewritten = tmp_path / "rewritten.onnx"
    offloadctl.apply(plan, analysis, rewritten)
    data_set = folder / "test_data_set_0"
    try:
        offloadctl.run(original, "cpu", inputs=data_set, repeat=1, opt_level="disable")
    except OffloadError as refused:  # an operator onnxruntime dropped, or one this machine cannot run
        with pytest.raises(OffloadError) as also:
            offloadctl.run(rewritten, "cpu", inputs=data_set, repeat=1, opt_level="disable")
        assert _refusal(also.value) == _refusal(refused)
        with pytest.raises(OffloadError, match="refuses the original .* too, so the rewrite is not the cause"):
            offloadctl.run(rewritten, "cpu", inputs=data_set, compare_to=str(original), repeat=1, opt_level="disable")
        return
    report = offloadctl.run(rewritten, "cpu", inputs=data_set, compare_to=str(original), repeat=1, opt_level="disable")
    assert report.comparison is not None
    assert all(c.identical for c in report.comparison.values()), report.comparison
    got = list(report.output_values.values())
    for value, want in zip(got, _shipped_outputs(data_set), strict=True):
        _matches(value, want)


def _matches(value: np.ndarray, want: np.ndarray) -> None:
    """onnx's backend tests' check: numbers within rtol 1e-3, atol 1e-7; strings and bools equal."""
    if want.dtype.kind in "OUSb":
        np.testing.assert_array_equal(value, want)
    else:
        np.testing.assert_allclose(value, want, rtol=1e-3, atol=1e-7)
