"""A fresh virtual environment with `pip install '.[cpu]'` gives the figures of the default install.

This installs packages (about a minute), so it is not part of the default run: `make test-install`
(run by CI after `make test`) selects it with ``-m install``. The unit suite checks the cheap part
(sympy is a dependency, the symbolic shape inference imports: `tests/test_packaging.py`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import onnx
import pytest

import offloadctl
from tests.conftest import IR_VERSION, ROOT, SAMPLE_NAMES, SAMPLES
from tests.models import COMPUTED_RESHAPE

pytestmark = pytest.mark.install


def _figures(doc: dict) -> tuple:
    return (
        doc["peak_bytes"]["before"],
        doc["peak_bytes"]["after"],
        doc["lower_bound_bytes"],
        doc["unknown_size"]["count"] if "unknown_size" in doc else doc["unknown_size_tensors"],
    )


def test_a_fresh_cpu_install_gives_the_same_figures(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", f"{ROOT}[cpu]"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert install.returncode == 0, install.stderr[-3000:]
    probe = subprocess.run(
        [
            str(python),
            "-c",
            "import onnxruntime, sympy; from onnxruntime.tools.symbolic_shape_infer import "
            "SymbolicShapeInference; print(onnxruntime.__file__)",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert probe.returncode == 0, probe.stderr
    assert str(venv) in probe.stdout  # the fresh environment's onnxruntime, not this one's

    model = onnx.parser.parse_model(COMPUTED_RESHAPE)
    model.ir_version = IR_VERSION
    symbolic = tmp_path / "symbolic.onnx"
    onnx.save(model, str(symbolic))
    cases = [(SAMPLES / f"{name}.onnx", ("--params", "--select-distance", "10")) for name in SAMPLE_NAMES]
    cases.append((symbolic, ("--select-distance", "0")))
    offloadctl_cli = venv / "bin" / "offloadctl"
    for path, options in cases:
        plan = tmp_path / f"{path.stem}.plan.json"
        fresh = subprocess.run(
            [str(offloadctl_cli), "plan", str(path), "-o", str(plan), *options, "--json"],
            capture_output=True,
            text=True,
            env=env,
            cwd=tmp_path,
        )
        assert fresh.returncode == 0, fresh.stderr
        doc = json.loads(fresh.stdout)
        analysis = offloadctl.analyse(path)
        here = offloadctl.simulate(
            analysis,
            offloadctl.make_plan(
                analysis,
                params="--params" in options,
                select_distance=int(options[options.index("--select-distance") + 1]),
            ),
        )
        assert _figures(doc) == (here.peak_before, here.peak_after, here.lower_bound_bytes, 0), path.name
        assert doc["rejected"].get("unknown-size", 0) == 0, path.name
