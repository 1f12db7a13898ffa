"""Output paths that are not regular files (`offloadctl.core.files.output_target`): a character device or a
FIFO is written through, a symlink is written through to its target (atomically, the link kept), and a
block device or a socket is refused before any work, for every option that writes. The device nodes are
made with mknod in a temporary folder; the real /dev is never touched."""

from __future__ import annotations

import json
import os
import socket
import stat
import threading
from pathlib import Path

import pytest

from conftest import SAMPLES

MLP = SAMPLES / "mlp.onnx"


def _char_device(tmp_path: Path, name: str = "null") -> Path:
    """A character device node with /dev/null's numbers (1, 3): writes to it are discarded."""
    path = tmp_path / name
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError:
        pytest.skip("making a device node needs root (CAP_MKNOD)")
    return path


def _block_device(tmp_path: Path) -> Path:
    """A block device node whose numbers (7, 200) name no loop device in use; nothing must open it."""
    path = tmp_path / "disk"
    try:
        os.mknod(path, 0o600 | stat.S_IFBLK, os.makedev(7, 200))
    except PermissionError:
        pytest.skip("making a device node needs root (CAP_MKNOD)")
    return path


def _listing(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_plan_to_a_character_device_writes_through_and_keeps_the_node(run_cli, tmp_path):
    null = _char_device(tmp_path)
    before = _listing(tmp_path)
    made = run_cli("plan", MLP, "-o", null, "--select-distance", "2", "--params")
    assert made.exit_code == 0, made.stderr
    assert stat.S_ISCHR(null.stat().st_mode) and os.major(null.stat().st_rdev) == 1  # still the device
    assert _listing(tmp_path) == before  # no file beside it, no temporary file left


def test_plan_to_a_fifo_writes_the_whole_plan_into_it(run_cli, tmp_path):
    fifo = tmp_path / "plan.pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    made = run_cli("plan", MLP, "-o", fifo, "--select-distance", "2", "--params")
    reader.join(timeout=60)
    assert made.exit_code == 0, made.stderr
    assert json.loads(got[0])["stage"] == "scheduled" and stat.S_ISFIFO(fifo.stat().st_mode)


def test_a_symlink_is_written_through_to_its_target_and_kept(run_cli, tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (real / "plan.json").write_text("old")
    link = tmp_path / "plan.json"
    link.symlink_to(real / "plan.json")
    unet = SAMPLES / "unet.onnx"
    assert run_cli("plan", unet, "-o", link, "--select-distance", "10", "--params").exit_code == 0
    assert link.is_symlink() and json.loads((real / "plan.json").read_text())["stage"] == "scheduled"
    out = tmp_path / "m.offload.onnx"
    out.symlink_to(real / "m.offload.onnx")  # dangling until apply writes the target
    applied = run_cli("apply", link, "-o", out, "--copies", "streams")
    assert applied.exit_code == 0, applied.stderr
    assert out.is_symlink() and (real / "m.offload.onnx").is_file()
    assert (real / "m.offload.streams.json").is_file()  # the partition file beside the model it points to
    ran = run_cli("run", out, "--device", "cpu", "--compare-to", unet, "--inputs", SAMPLES / "unet.inputs.npz")
    assert ran.exit_code == 0, ran.stderr


def test_apply_through_a_device_writes_one_file_or_refuses(run_cli, tmp_path):
    plan = tmp_path / "plan.json"
    assert run_cli("plan", MLP, "-o", plan, "--select-distance", "2", "--params").exit_code == 0
    null = _char_device(tmp_path)
    before = _listing(tmp_path)
    assert run_cli("apply", plan, "-o", null, "--copies", "inline").exit_code == 0
    refused = run_cli("apply", plan, "-o", null, "--copies", "streams")
    said = " ".join(refused.stderr.split())
    assert refused.exit_code == 1 and "Traceback" not in refused.stderr
    assert f"{null} is not a file, and copies on streams need their partition file beside the model" in said
    assert _listing(tmp_path) == before and stat.S_ISCHR(null.stat().st_mode)


def test_reports_and_plots_through_a_device_or_a_symlink(run_cli, tmp_path):
    null = _char_device(tmp_path)
    target = tmp_path / "t.png"
    link = tmp_path / "memory.png"
    link.symlink_to(target)
    made = run_cli("plan", MLP, "-o", tmp_path / "plan.json", "--report", null)
    assert made.exit_code == 0, made.stderr
    simulated = run_cli("simulate", MLP, "--plan", tmp_path / "plan.json", "--plot", link)
    assert simulated.exit_code == 0, simulated.stderr
    assert link.is_symlink() and target.read_bytes().startswith(b"\x89PNG")
    assert stat.S_ISCHR(null.stat().st_mode)


def test_a_block_device_or_a_socket_is_refused_before_any_work(run_cli, tmp_path):
    disk = _block_device(tmp_path)
    sock_path = tmp_path / "s.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(sock_path))
    try:
        for target, kind in ((disk, "a block device"), (sock_path, "a socket")):
            for args in (("plan", MLP, "-o", target), ("plan", MLP, "-o", tmp_path / "p.json", "--report", target)):
                done = run_cli(*args)
                said = " ".join(done.stderr.split())
                assert done.exit_code == 1 and "Traceback" not in done.stderr, said
                assert f"{target} is {kind}: offloadctl writes files" in said
        link = tmp_path / "to-disk"
        link.symlink_to(disk)
        done = run_cli("plan", MLP, "-o", link)
        assert done.exit_code == 1 and f"(which points to {disk}) is a block device" in " ".join(done.stderr.split())
        assert stat.S_ISBLK(disk.stat().st_mode) and stat.S_ISSOCK(sock_path.stat().st_mode)
        assert not (tmp_path / "p.json").exists()
    finally:
        server.close()
