"""Every shell block of the README and docs/ runs as written against the samples, so no command a
reader copies can fail.

A block is a fence marked ``sh``; each page's blocks run in order in one fresh folder holding a copy
of ``sample_models/`` (a later block may read what an earlier one wrote, as a reader going down the
page would), with this environment's ``offloadctl`` on the PATH. The comment line just above a
block marks what cannot run here:

- ``<!-- not run here: REASON -->``: installs, downloads, or the test targets themselves;
- ``<!-- run: device -->``: needs a device provider, and runs in ``make test-device``'s environment.

Synopses and output go in ``text`` fences, which nothing runs.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import ROOT, SAMPLES

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL = {"sh", "bash", "shell"}
_FENCE = re.compile(r"^```(\S*)\s*$")
_MARK = re.compile(r"^<!--\s*(not run here:\s*(?P<why>.+?)|run:\s*(?P<where>\w+)|example:\s*[\w-]+)\s*-->$")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    mark: str | None  # the comment line just above, if any

    @property
    def where(self) -> str:
        """'here', 'device' or 'nowhere' (marked not run here)."""
        if self.mark is None:
            return "here"
        match = _MARK.match(self.mark)
        assert match, f"{self}: unknown marker {self.mark!r}"
        if match["why"]:
            return "nowhere"
        return match["where"] or "here"

    def __str__(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    found: list[Block] = []
    lines = page.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
        above = lines[i - 1].strip() if i else ""
        mark = above if above.startswith("<!--") else None
        found.append(Block(page, i + 1, fence[1], "\n".join(lines[i + 1 : end]) + "\n", mark))
        i = end + 1
    return found


ALL = [b for page in PAGES for b in blocks(page)]


def _run_page(page: Path, where: str, tmp_path: Path, bin_dir: Path, prefix: str = "") -> int:
    """Run the page's shell blocks marked for ``where`` in order; returns how many ran."""
    shutil.copytree(SAMPLES, tmp_path / "sample_models")
    env = dict(os.environ)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env.pop("ORT_LOAD_CONFIG_FROM_MODEL", None)
    ran = 0
    for block in (b for b in blocks(page) if b.lang in SHELL and b.where == where):
        done = subprocess.run(
            ["bash", "-c", f"set -euo pipefail\n{prefix}{block.text}"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        output = (done.stdout + done.stderr)[-4000:]
        assert done.returncode == 0, f"the block at {block} failed as written (exit {done.returncode}):\n{output}"
        assert "Traceback" not in output, f"{block}:\n{output}"
        ran += 1
    return ran


def test_every_block_is_a_known_kind():
    """A fence says what it holds; an unmarked one that holds a command is one no test would run."""
    for block in ALL:
        assert block.lang, f"{block}: give the fence a language (sh to run it, text for a synopsis or output)"
        assert block.where in {"here", "device", "nowhere"}, block
        if block.lang not in SHELL:
            marked = block.mark is not None and not block.mark.startswith("<!-- example:")
            assert not marked, f"{block}: a run marker on a block that is not a shell block"


def test_the_readme_starts_with_the_two_set_up_commands():
    first = blocks(ROOT / "README.md")[0]
    commands = [line.split("#")[0].strip() for line in first.text.splitlines()]
    assert commands == ["make demo", "make test"], first.text
    assert first.mark == "<!-- not run here: the set-up commands themselves; .ci/run runs both -->"
    assert "make demo" in (ROOT / ".ci" / "run").read_text() and "make test" in (ROOT / ".ci" / "run").read_text()


def test_few_blocks_are_not_run_here():
    """What cannot run here is marked, with a reason, and stays the exception."""
    nowhere = [b for b in ALL if b.lang in SHELL and b.where == "nowhere"]
    assert all(_MARK.match(b.mark or "")["why"].strip() for b in nowhere)
    runnable = [b for b in ALL if b.lang in SHELL and b.where != "nowhere"]
    assert len(nowhere) <= 6 and len(runnable) >= 2 * len(nowhere), [str(b) for b in nowhere]


@pytest.mark.parametrize(
    "page",
    [p for p in PAGES if any(b.lang in SHELL and b.where == "here" for b in blocks(p))],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_the_pages_shell_blocks_run_as_written(page, tmp_path):
    assert shutil.which("offloadctl", path=str(Path(sys.executable).parent)), "offloadctl is not installed"
    assert _run_page(page, "here", tmp_path, Path(sys.executable).parent) > 0


DEVICE_PAGES = [p for p in PAGES if any(b.lang in SHELL and b.where == "device" for b in blocks(p))]


@pytest.mark.device
@pytest.mark.parametrize("page", DEVICE_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_the_pages_device_blocks_run_on_the_device_provider(page, tmp_path):
    venv = os.environ.get("OFFLOADCTL_DEVICE_VENV")
    assert venv, "set OFFLOADCTL_DEVICE_VENV to an environment with onnxruntime-ep-webgpu (make test-device)"
    env_file = Path(venv).resolve() / "vulkan" / "env"
    prefix = f". '{env_file}'\n" if env_file.exists() else ""
    assert _run_page(page, "device", tmp_path, Path(venv).resolve() / "bin", prefix) > 0


def test_device_blocks_exist():
    assert DEVICE_PAGES, "the devices page shows a run on the device provider"


def test_the_synopses_list_every_option_of_every_command():
    """docs/commands.md's synopsis of each command names each of its options (``-o`` for ``--output``),
    so that no option a warning tells a user to take is missing there."""
    import click

    from offloadctl.cli import cli

    text = (ROOT / "docs" / "commands.md").read_text(encoding="utf-8")
    block = re.search(r"```text\n(offloadctl inspect.*?)```", text, flags=re.S)
    assert block, "the synopses block"
    synopses: dict[str, str] = {}
    name = None
    for line in block[1].splitlines():
        start = re.match(r"offloadctl (\w+)\s+(.*)", line)
        if start:
            name = start[1]
            synopses[name] = start[2]
        elif name:
            synopses[name] += " " + line.strip()
    context = click.Context(cli)
    for command_name in cli.list_commands(context):
        command = cli.get_command(context, command_name)
        assert command is not None and command_name in synopses, command_name
        synopsis = synopses[command_name]
        for param in command.params:
            flags = [o for o in param.opts if o.startswith("-")] if isinstance(param, click.Option) else []
            if flags and flags != ["-h", "--help"]:
                assert any(re.search(rf"(^|[\s\[]){re.escape(f)}($|[\s=\]/])", synopsis) for f in flags), (
                    f"{command_name}: {flags[-1]} is not in its synopsis in docs/commands.md"
                )
