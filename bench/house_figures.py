"""The house's size and complexity figures, as docs/development.md states its floor: functions over
cyclomatic complexity 15, modules at maintainability rank C, functions over 80 lines, modules that
import more than 15 of offloadctl's modules, and the module and line counts.

Run: ``pip install radon==6.0.1`` once, then ``python bench/house_figures.py [--json]``.
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "offloadctl"


def _radon(*args: str) -> dict:
    done = subprocess.run([sys.executable, "-m", "radon", *args, "-j", str(PACKAGE)], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"radon failed: {done.stderr.strip() or 'pip install radon==6.0.1'}")
    return json.loads(done.stdout)


def _blocks(blocks: list[dict]):
    for block in blocks:  # methods are listed under their class and again on their own: each is counted once
        yield block
        yield from _blocks(block.get("methods", []))
        yield from _blocks(block.get("closures", []))


def figures() -> dict:
    complex_ = {
        f"{Path(path).relative_to(ROOT)}:{b['lineno']} {b['name']} ({b['complexity']})"
        for path, blocks in _radon("cc").items()
        for b in _blocks(blocks)
        if b["type"] != "class" and b["complexity"] > 15
    }
    rank_c = sorted(str(Path(p).relative_to(ROOT)) for p, v in _radon("mi").items() if v["rank"] == "C")
    long, imports, lines, modules = [], [], 0, 0
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        modules += 1
        lines += text.count("\n")
        tree = ast.parse(text)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > 80:
                long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1})")
        found = {
            n.module
            for n in ast.walk(tree)
            if isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("offloadctl")
        }
        if len(found) > 15:
            imports.append(f"{path.relative_to(ROOT)} ({len(found)})")
    return {
        "modules": modules,
        "lines": lines,
        "over_complexity_15": sorted(complex_),
        "rank_c": rank_c,
        "over_80_lines": long,
        "over_15_imports": imports,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    found = figures()
    if parser.parse_args().json:
        print(json.dumps(found, indent=1))
        return 0
    print(f"{found['modules']} modules, {found['lines']} lines")
    for key, floor in (("over_complexity_15", 40), ("rank_c", 0), ("over_80_lines", 0), ("over_15_imports", 0)):
        print(f"{key}: {len(found[key])} (floor {floor})")
        for item in found[key]:
            print(f"  {item}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
