"""Streamed weights from page-locked memory (`offloadctl.running.pinned`): which weights a rewrite
streams, the zero-copy hand-over to a session, and the one-line refusal where no device runtime is."""

from __future__ import annotations

import ctypes
import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from offloadctl.running.pinned import HostAllocator, hand_over, runtime_allocator, streamed_weights

from conftest import SAMPLES


def _libc_allocator() -> tuple[HostAllocator, list[int]]:
    """Host buffers from libc (the CPU's stand-in for cudaHostAlloc), recording what is freed."""
    libc = ctypes.CDLL(None)
    freed: list[int] = []

    def alloc(nbytes: int) -> int:
        ptr = ctypes.c_void_p()
        assert libc.posix_memalign(ctypes.byref(ptr), ctypes.c_size_t(4096), ctypes.c_size_t(nbytes)) == 0
        return int(ptr.value)

    def free(address: int) -> None:
        freed.append(address)
        libc.free(ctypes.c_void_p(address))

    return HostAllocator("posix_memalign (libc)", alloc, free), freed


@pytest.fixture
def rewrite(run_cli, tmp_path):
    plan, out = tmp_path / "plan.json", tmp_path / "mlp.offload.onnx"
    made = run_cli("plan", SAMPLES / "mlp.onnx", "-o", plan, "--params", "--select-distance", "2")
    assert made.exit_code in (0, 1), made.stderr
    assert run_cli("apply", plan, "-o", out).exit_code == 0
    return out, json.loads(plan.read_text())


def _session(path, so=None):
    so = so or ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def test_the_streamed_weights_are_the_weights_the_plan_offloads(rewrite):
    out, plan = rewrite
    offloaded = {o["tensor"] for o in plan["offloads"] if o["kind"] == "parameter"}
    assert offloaded and set(streamed_weights(onnx.load(str(out)))) == offloaded


def test_weights_are_handed_over_zero_copy_and_the_outputs_stay_bit_identical(rewrite):
    out, _ = rewrite
    proto = onnx.load(str(out))
    feeds = dict(np.load(SAMPLES / "mlp.inputs.npz"))
    want = _session(SAMPLES / "mlp.onnx").run(None, feeds)
    allocator, freed = _libc_allocator()
    so = ort.SessionOptions()
    locked = hand_over(proto, so, allocator, ort=ort, base_dir=out.parent)
    names = streamed_weights(proto)
    assert locked.refused is None and locked.weights == len(names) > 0
    assert locked.nbytes == sum(
        onnx.numpy_helper.to_array(i).nbytes for i in proto.graph.initializer if i.name in names
    )
    session = _session(out, so)
    got = session.run(None, feeds)
    assert all(np.array_equal(a, b) for a, b in zip(got, want))
    buffer = locked._buffers[0][1][
        1
    ]  # the session reads the page-locked buffer itself: change it, and the output moves
    buffer[...] = 0
    assert not all(np.array_equal(a, b) for a, b in zip(session.run(None, feeds), want))
    del session
    locked.close()
    assert len(freed) == locked.weights


def test_no_runtime_or_a_failing_one_is_one_line_and_nothing_is_handed_over(rewrite):
    out, _ = rewrite
    proto = onnx.load(str(out))
    why = runtime_allocator("ascend")  # no CANN runtime on this machine
    assert isinstance(why, str) and "libascendcl" in why
    locked = hand_over(proto, ort.SessionOptions(), why, ort=ort)
    assert locked.weights == 0 and "\n" not in locked.refused
    assert locked.refused.startswith(f"could not page-lock the {len(streamed_weights(proto))} streamed weight(s)")

    def refuse(nbytes: int) -> int:
        raise OSError("cudaHostAlloc failed with error 35 (no CUDA driver, or one older than the runtime)")

    allocator, freed = _libc_allocator()
    calls = iter([allocator.alloc, refuse])  # the first buffer is made, the second refused: the first goes back
    failing = HostAllocator("cudaHostAlloc (test)", lambda n: next(calls)(n), allocator.free)
    so = ort.SessionOptions()
    locked = hand_over(proto, so, failing, ort=ort)
    assert locked.weights == 0 and "error 35" in locked.refused and len(freed) == 1
    session = _session(out, so)  # nothing was added: the session reads the weights from the model
    feeds = dict(np.load(SAMPLES / "mlp.inputs.npz"))
    want = _session(SAMPLES / "mlp.onnx").run(None, feeds)
    assert all(np.array_equal(a, b) for a, b in zip(session.run(None, feeds), want))


def test_run_on_the_cpu_hands_nothing_over(run_cli, rewrite):
    out, _ = rewrite
    result = run_cli("run", out, "--device", "cpu", "--inputs", SAMPLES / "mlp.inputs.npz", "--repeat", "1", "--json")
    assert result.exit_code == 0, result.stderr
    assert result.json()["page_locked_weights"] is None


def test_run_gives_the_buffers_back_after_its_sessions_and_when_it_fails(rewrite, monkeypatch):
    """`run_model` frees every page-locked buffer it made, on success and when the run fails after the
    hand-over (here the CPU stands in for CUDA, with libc's allocator in place of cudaHostAlloc)."""
    from offloadctl.core.errors import OffloadError
    from offloadctl.running import runner

    out, _ = rewrite
    allocator, freed = _libc_allocator()
    handed = []

    def page_locked(model, proto, config, device, ort):
        handed.append(hand_over(proto, config.sess_options, allocator, ort=ort, base_dir=out.parent))
        return handed[-1]

    monkeypatch.setattr(runner, "_page_locked", page_locked)
    report = runner.run_model(str(out), "cpu", inputs=str(SAMPLES / "mlp.inputs.npz"), repeat=1)
    assert report.page_locked.weights > 0 and len(freed) == report.page_locked.weights

    def fails(*args, **kwargs):
        raise OffloadError("the session could not be made")

    monkeypatch.setattr(runner, "_timed_runs", fails)
    with pytest.raises(OffloadError):
        runner.run_model(str(out), "cpu", inputs=str(SAMPLES / "mlp.inputs.npz"), repeat=1)
    assert len(handed) == 2 and len(freed) == 2 * handed[1].weights
