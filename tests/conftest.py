"""Shared fixtures: tiny models from ONNX text, the sample models, and a CLI runner."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner

from offloadctl.cli import cli

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_models"
SAMPLE_NAMES = ["seed", "unet", "transformer", "training", "mlp"]
#: the genai-builder Llama samples' dimensions: prefill of 16 tokens into a shared 256-token KV buffer
LLAMA_DIMS = ["--dim", "batch_size=1", "--dim", "sequence_length=16", "--dim", "past_sequence_length=256"]
LLAMA_DIMS += ["--dim", "total_sequence_length=256", "--dim", "kv_cache_dim=16"]
IR_VERSION = 10

# Measurement sizes of `offloadctl.running.profiler` small enough for the test suite (patched onto the module);
# the code paths are the ones `offloadctl profile` runs.
FAST_PROFILER = {  # module -> its timing constants, cut down so that a profile is measured in seconds
    "offloadctl.running.timed": {"MIN_SECONDS": 0.0},
    "offloadctl.running.profiler": {
        "_SWEEP_SECONDS": 0.1,
        "_CHAIN_REPEAT": 3,
        "_CALIBRATION_REPEAT": 1,
        "_MATMUL_N": 32,
        "_ADD_ELEMENTS": 1024,
        "SWEEP_BYTES": (4096, 65536, 262144),
        "_COPIES_MAX": 64,
    },
}


def fast_profiler(mp: pytest.MonkeyPatch) -> None:
    """Patch the profiler's timing constants (`FAST_PROFILER`) for the life of ``mp``."""
    for module, values in FAST_PROFILER.items():
        for name, value in values.items():
            mp.setattr(f"{module}.{name}", value)


@pytest.fixture
def write_model(tmp_path):
    """Parse ONNX text syntax, pin a supported IR version, save, and return the path."""

    def write(text: str, name: str = "model.onnx") -> Path:
        model = onnx.parser.parse_model(text)
        model.ir_version = IR_VERSION
        onnx.checker.check_model(model)
        path = tmp_path / name
        onnx.save(model, str(path))
        return path

    return write


@pytest.fixture
def seed_path() -> Path:
    return SAMPLES / "seed.onnx"


class CliResult:
    def __init__(self, result):
        self.exit_code = result.exit_code
        self.stdout = result.stdout
        self.stderr = result.stderr
        self.exception = result.exception

    def json(self):
        return json.loads(self.stdout)


@pytest.fixture
def run_cli():
    """Run the real `offloadctl` command in-process; returns exit code, stdout and stderr."""

    def run(*args: str | Path) -> CliResult:
        result = CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=True)
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            raise result.exception
        return CliResult(result)

    return run
