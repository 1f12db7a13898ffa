"""The house rules that no linter states: no library function longer than 100 lines (ruff checks
complexity, C901 at 15; import-linter the layers and cycles, both run by `make lint`)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 100


def _functions(path: Path):
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node.lineno, node.end_lineno - node.lineno + 1


def test_no_library_function_is_longer_than_100_lines():
    long = [
        f"{path.relative_to(ROOT)}:{line} {name} ({length} lines)"
        for path in sorted((ROOT / "offloadctl").rglob("*.py"))
        for name, line, length in _functions(path)
        if length > MAX_LINES
    ]
    assert long == [], "functions over 100 lines: " + "; ".join(long)


def test_the_length_check_sees_a_long_function(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    (tmp_path / "m.py").write_text(f"def f():\n{body}\n")
    assert [(name, length) for name, _, length in _functions(tmp_path / "m.py")] == [("f", MAX_LINES + 1)]
