"""Packaging from a clone: the sdist carries only the project, the license matches, the wheel is complete."""

from __future__ import annotations

import re
import shutil
import sys
import tarfile
import zipfile

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from hatchling.builders.sdist import SdistBuilder
from hatchling.builders.wheel import WheelBuilder

from tests.conftest import ROOT

PROJECT_TOP = {
    "offloadctl",
    "_offloadctl.py",
    "schemas",
    "tests",
    "sample_models",
    "bench",
    ".ci",
    "README.md",
    "docs",
    "LICENSE",
    "Makefile",
    "pyproject.toml",
    "PKG-INFO",
    ".gitignore",
}


def _checkout_copy(tmp_path):
    """The project as a user's clone has it, plus the clutter a working checkout gathers."""
    src = tmp_path / "clone"
    shutil.copytree(
        ROOT,
        src,
        ignore=shutil.ignore_patterns(
            ".git", ".venv", "venv", "build", "dist", "__pycache__", ".pytest_cache", ".hypothesis", "*.egg-info"
        ),
    )
    for venv in (src / ".venv", src / "venv", src / "env"):  # "venv" and "env" are not in .gitignore
        (venv / "lib" / "python3" / "site-packages").mkdir(parents=True)
        (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
        (venv / "lib" / "python3" / "site-packages" / "big.py").write_text("x = 1\n")
    (src / "build").mkdir()
    (src / "build" / "demo.onnx").write_bytes(b"x")
    (src / "notes.txt").write_text("a file lying around\n")
    return src


def whl_text(wheel: str, suffix: str) -> str:
    with zipfile.ZipFile(wheel) as whl:
        return whl.read(next(n for n in whl.namelist() if n.endswith(suffix))).decode()


def test_sdist_carries_only_the_project_and_builds_a_complete_wheel(tmp_path):
    src = _checkout_copy(tmp_path)
    (sdist,) = SdistBuilder(str(src)).build(directory=str(tmp_path / "dist"))
    with tarfile.open(sdist) as tar:
        names = tar.getnames()
        tar.extractall(tmp_path / "unpacked", filter="data")
    top = {n.split("/", 2)[1] for n in names if n.count("/") >= 1}
    assert top <= PROJECT_TOP, top - PROJECT_TOP
    assert not [n for n in names if re.search(r"(^|/)(\.?venv|env|build)/|notes\.txt|__pycache__", n)]
    for needed in (
        "LICENSE",
        "offloadctl/py.typed",
        "schemas/plan.schema.json",
        "sample_models/seed.onnx",
        "tests/conftest.py",
        "Makefile",
    ):
        assert f"offloadctl-0.1.0/{needed}" in names, needed

    # the wheel built from the sdist (what pip does from an sdist) has the package, schema and marker
    (wheel,) = WheelBuilder(str(tmp_path / "unpacked" / "offloadctl-0.1.0")).build(directory=str(tmp_path / "wheels"))
    with zipfile.ZipFile(wheel) as whl:
        files = whl.namelist()
        metadata = whl.read(next(n for n in files if n.endswith(".dist-info/METADATA"))).decode()
    assert "offloadctl/py.typed" in files and "offloadctl/_schemas/plan.schema.json" in files
    assert "_offloadctl.py" in files  # the console script's entry point, beside the package
    entry_points = whl_text(wheel, ".dist-info/entry_points.txt")
    assert "offloadctl = _offloadctl:main" in entry_points
    assert "offloadctl/_schemas/profile.schema.json" in files
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in files)
    assert "License-Expression: Apache-2.0" in metadata
    assert re.search(r"^Requires-Dist: sympy", metadata, re.M)
    assert not [n for n in files if "tests/" in n or "sample_models" in n]


def test_the_license_file_matches_the_declared_license():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text


def test_every_onnxruntime_extra_gets_sympy():
    """onnxruntime's symbolic shape inference needs sympy, which the plain wheel no longer brings:
    without it, sizes silently go unknown. It is a base dependency, so every extra has it."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert any(re.match(r"sympy\b", d) for d in project["dependencies"])
    assert {"cann", "cpu", "cuda"} <= set(project["optional-dependencies"])
    from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference  # noqa: F401 - importable here


def test_readme_install_lines_work_from_a_clone():
    text = "\n".join(p.read_text() for p in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
    lines = [line.strip() for line in text.splitlines() if line.strip().startswith("pip install")]
    assert "pip install '.[cpu]'" in " ".join(lines)
    for line in lines:  # no index install: offloadctl is not on one
        assert line.startswith("pip install '.[") or "@ git+" in line, line
