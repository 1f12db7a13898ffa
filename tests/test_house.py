"""The house's labels and walls: every package docstring names what the package holds, and no module
imports another in a circle, type-only imports included (docs/development.md, Layout)."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import grimp
import networkx as nx
import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "offloadctl"
PACKAGES = sorted(p.parent for p in PACKAGE.rglob("__init__.py") if p.parent != PACKAGE)


def _defined(module: Path) -> set[str]:
    tree = ast.parse(module.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: str(p.relative_to(PACKAGE.parent)))
def test_the_package_docstring_names_every_module_it_holds_and_no_other(package):
    doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text(encoding="utf-8"))) or ""
    modules = {p.stem for p in package.glob("*.py") if p.stem != "__init__"}
    modules |= {p.name for p in package.iterdir() if (p / "__init__.py").is_file()}
    named = set(re.findall(r"(?<!`)`([a-z_][a-z0-9_]*)`(?!`)", doc))  # `name`, not ``literal``
    assert modules <= named, f"{package.name}'s docstring leaves out {sorted(modules - named)}"
    known = modules | {n for m in package.rglob("*.py") for n in _defined(m)} | {"offloadctl"}
    assert named <= known, f"{package.name}'s docstring names what it does not hold: {sorted(named - known)}"


def test_no_module_imports_another_in_a_circle_type_only_imports_included():
    graph = grimp.build_graph("offloadctl", exclude_type_checking_imports=False)
    edges = nx.DiGraph()
    for module in graph.modules:
        edges.add_edges_from((module, other) for other in graph.find_modules_directly_imported_by(module))
    cycles = [c for c in nx.simple_cycles(edges) if len(c) > 1]
    assert cycles == []


# options that mean the same in every command that has them: one definition each
SHARED = ["--execution-order", "--inputs", "--json", "--input-shape", "--dim", "--ep-option", "--profile",
          "--sizes-from-run", "--max-peak", "--report", "--strict", "--shape-point"]  # fmt: skip


@pytest.mark.parametrize("flag", SHARED)
def test_an_option_shared_by_commands_is_defined_once(flag):
    from offloadctl.cli import cli

    found = {
        name: (p.help, p.default, getattr(p, "metavar", None), str(p.type))
        for name, command in cli.commands.items()
        for p in command.params
        if flag in getattr(p, "opts", ())
    }
    assert len(found) >= 2, f"{flag} is in {sorted(found)} only"
    assert len(set(found.values())) == 1, f"{flag} differs between {sorted(found)}"


def test_run_takes_the_order_a_rewrite_was_planned_for(run_cli, tmp_path):
    plan, out = tmp_path / "plan.json", tmp_path / "seed.offload.onnx"
    seed = PACKAGE.parent / "sample_models" / "seed.onnx"
    args = ["--select-distance", "1", "--prefetch-distance", "0", "--execution-order", "default"]
    assert run_cli("plan", seed, "-o", plan, *args).exit_code == 0
    assert run_cli("apply", plan, "-o", out).exit_code == 0
    res = run_cli("run", out, "--device", "cpu", "--repeat", "1", "--json")
    assert res.exit_code == 0, res.stderr
    assert res.json()["session"]["execution_order"] == "DEFAULT"  # without --execution-order


def test_plan_reads_its_profile_file_once(run_cli, tmp_path, monkeypatch):
    """The request's parts are checked once, as they are made: progress and ``--device`` findings are
    set on the checked request without checking it (and reading its profile) again."""
    import offloadctl.simulation.profiles as profiles

    source = json.loads((PACKAGE / "simulation" / "profiles" / "cpu.json").read_text())
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(source))
    reads: list[str] = []
    real = profiles.read_json

    def counted(p, *args, **kwargs):
        reads.append(str(p))
        return real(p, *args, **kwargs)

    monkeypatch.setattr(profiles, "read_json", counted)
    unet = PACKAGE.parent / "sample_models" / "unet.onnx"
    res = run_cli("plan", unet, "-o", tmp_path / "p.json", "--params", "--budget", "300KiB", "--profile", path)
    assert res.exit_code == 0, res.stderr
    assert reads == [str(path)]


def test_every_option_of_a_request_part_is_written_once_in_the_part():
    """plan's planning options are built from the parts' own fields: flag, default and help."""
    import dataclasses

    from offloadctl.cli import cli
    from offloadctl.planning.request import BudgetPart, FilterPart, PrefetchPart, SelectPart

    params = {p.name: p for p in cli.commands["plan"].params}
    fields = [f for part in (SelectPart, FilterPart, BudgetPart, PrefetchPart) for f in dataclasses.fields(part)]
    options = [f for f in fields if "kind" in f.metadata]
    assert len(options) == 19  # 5 select, 2 filter, 10 budget, 2 prefetch
    for f in options:
        param = params[f.name]
        assert param.help == f.metadata["help"], f.name
        assert param.default == f.default, f.name
        if "shown" in f.metadata:  # a default the request picks (the profile): shown, not given
            assert param.show_default == f.metadata["shown"], f.name
        assert "--" + f.name.replace("_", "-") in param.opts, f.name


def test_the_index_of_tests_by_module_is_current_and_reaches_every_module():
    """tests/INDEX.md (`python tests/index.py > tests/INDEX.md`) names, for every module, the tests that
    exercise it: a newcomer finds a module's tests from its name."""
    from tests.index import index

    text = index()
    committed = (Path(__file__).resolve().parent / "INDEX.md").read_text()
    assert committed == text, "run python tests/index.py > tests/INDEX.md"
    assert "| (none) |" not in text
