"""Rewrites on a real device provider: onnxruntime's WebGPU plugin, over Mesa's software Vulkan
driver on a machine without a GPU (README, Devices). There host and device are two memories, and
onnxruntime partitions the graph and inserts copies as it does for CUDA or CANN; the CPU provider
cannot show a copy that goes wrong.

For each sample, fp32 and fp16, weights and activations, under PRIORITY_BASED and DEFAULT: outputs
close to the original's on the same provider, every order pin held, and not one copy inserted by
onnxruntime (its own ``Memcpy`` nodes in the graph it runs).

The WebGPU provider needs onnxruntime >= 1.24.4 and onnxruntime-ep-webgpu, so these run from an
environment of their own, named by OFFLOADCTL_DEVICE_VENV (`make test-device` builds it, with the
software driver in its ``vulkan`` folder); planning and rewriting run here.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import onnx
import pytest

from conftest import SAMPLES
from models import old_pin_model, save, to_fp16

pytestmark = pytest.mark.device

VENV = os.environ.get("OFFLOADCTL_DEVICE_VENV")


def _device(*args: str | Path) -> subprocess.CompletedProcess:
    """``offloadctl ARGS`` in the device environment, with its software Vulkan driver when it has one."""
    assert VENV, "set OFFLOADCTL_DEVICE_VENV to an environment with onnxruntime-ep-webgpu (make test-device)"
    venv = Path(VENV).resolve()
    env_file = venv / "vulkan" / "env"
    command = " ".join(f"'{a}'" for a in [venv / "bin" / "offloadctl", *args])
    if env_file.exists():
        command = f". '{env_file}' && {command}"
    return subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=300)


def _run_json(model: Path, *args: str | Path) -> tuple[int, dict]:
    done = _device("run", model, "--device", "webgpu", "--json", "--repeat", "1", *args)
    assert done.stdout.strip(), done.stderr
    return done.returncode, json.loads(done.stdout)


def _sample(name: str, precision: str, folder: Path) -> Path:
    if precision == "fp32":
        return SAMPLES / f"{name}.onnx"
    path = folder / f"{name}.fp16.onnx"
    onnx.save(to_fp16(onnx.load(SAMPLES / f"{name}.onnx")), path)
    return path


CASES = [
    ("seed", ["--select-distance", "1", "--prefetch-distance", "2"]),
    ("mlp", ["--params", "--select-distance", "2"]),
    ("unet", ["--params", "--select-distance", "10", "--prefetch-distance", "3"]),
    ("transformer", ["--select-distance", "3", "--prefetch-distance", "1"]),
    ("training", ["--params", "--select-distance", "2", "--prefetch-distance", "1"]),
]


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
@pytest.mark.parametrize(("name", "options"), CASES, ids=[c[0] for c in CASES])
def test_rewrites_hold_on_the_device_provider(run_cli, tmp_path, name, options, precision):
    source = _sample(name, precision, tmp_path)
    plan, out = tmp_path / "plan.json", tmp_path / "model.offload.onnx"
    for order in ("priority", "default"):
        res = run_cli("plan", source, *options, "--execution-order", order, "-o", plan)
        assert res.exit_code in (0, 1) and plan.exists(), res.stderr
        doc = json.loads(plan.read_text())
        assert doc["offloads"], f"{name}: nothing offloaded"
        out.unlink(missing_ok=True)
        res = run_cli("apply", plan, "-o", out)
        assert res.exit_code == 0, res.stderr
        for run_order in ("priority", "default"):
            code, report = _run_json(
                out, "--compare-to", source, "--execution-order", run_order, "--opt-level", "disable",
                *(["--rtol", "1e-2", "--atol", "1e-2"] if precision == "fp16" else []),
            )  # fmt: skip
            where = f"{name} {precision}, planned {order}, run {run_order}"
            assert report["providers"][0] == "WebGpuExecutionProvider", where
            assert report["inserted_copies"] == [], f"{where}: {report['inserted_copies']}"
            assert report["original_inserted_copies"] == [], where
            assert report["plan_undone_by"] == [], where
            assert all(c["within_tolerance"] for c in report["comparison"].values()), where
            if report["order_pins"] is not None and run_order == order:
                assert report["order_pins"]["holds"], f"{where}: {report['order_pins']}"
            assert code == 0, where


def test_a_host_tensor_read_on_the_device_is_reported_and_fails(tmp_path):
    """The pin form that reads the host tensor (Shape(host) into a view): onnxruntime copies the host
    tensor straight back to the device. `run` fails, naming the copy it inserted and the tensor."""
    path = save(old_pin_model(onnx.TensorProto.FLOAT), tmp_path / "undone.onnx")
    code, report = _run_json(path, "--opt-level", "disable")
    assert code == 1
    assert any(c["op"] == "MemcpyFromHost" and c["tensor"] == "h" for c in report["plan_undone_by"])
    done = _device("run", path, "--device", "webgpu", "--opt-level", "disable", "--repeat", "1")
    assert done.returncode == 1 and "'h'" in done.stderr and "Traceback" not in done.stderr


def test_memory_figures_are_refused_on_webgpu(tmp_path):
    done = _device("run", SAMPLES / "seed.onnx", "--device", "webgpu", "--measure-memory")
    assert done.returncode == 1
    assert "reports no byte counts" in done.stderr and "Traceback" not in done.stderr
