"""The plan file's two forms of ``rejected``, side by side in one process: size, write and read time.

offloadctl writes a plan's rejected candidates as a table (one row per candidate, each detail text
once) and reads that or a list of entries (one object each, what a plan dict written as it is
holds, and the form schema version 1 wrote). This writes the same plan both ways and reads both
files back with `offloadctl.contract.document.read_plan`:

- table: `write_plan` (validate, one line per row);
- entries: the plan validated as it is and written with one line per entry, as version 1 did.

Each figure is the fastest of ``--repeat`` calls, the two forms interleaved, with the garbage
collector held as the command holds it. The plan is ``offloadctl plan MODEL --params``'s distance
plan (on the generated model, a rejection for almost every tensor).

    python bench/plan_file.py                          # a generated 100,000-node model
    python bench/plan_file.py MODEL.onnx --repeat 7
    python bench/plan_file.py --json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from offloadctl.contract.document import read_plan, validate_plan, write_plan  # noqa: E402
from offloadctl.core.bulk import keep_what_is_built, paused_gc  # noqa: E402
from offloadctl.core.files import atomic_write  # noqa: E402
from offloadctl.core.plantypes import Plan  # noqa: E402
from offloadctl.job import Job  # noqa: E402
from offloadctl.planning.make import scheduled_plan  # noqa: E402
from offloadctl.planning.request import PlanRequest  # noqa: E402

import gen_large  # noqa: E402

__all__ = ["main"]

_SLOT = "\u0000rejected"


@paused_gc()
def write_entries(path: Path, plan: Plan) -> None:
    """The plan validated as it is and written with one line per ``rejected`` entry (version 1's form)."""
    validate_plan(plan)
    text = json.dumps({**plan, "schema_version": 1, "rejected": _SLOT}, indent=1)
    listing = "[\n  " + json.dumps(plan["rejected"])[1:-1].replace('}, {"', '},\n  {"') + "\n ]"
    text = text.replace(json.dumps(_SLOT), listing if plan["rejected"] else "[]", 1) + "\n"
    atomic_write(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def _timed(runs: list[float], call: Callable[..., Any], *args: Any) -> None:
    start = time.perf_counter()
    call(*args)
    runs.append(time.perf_counter() - start)


def measure(model: Path, work: Path, repeat: int) -> dict[str, Any]:
    """Sizes and fastest write and read times of the plan's two forms."""
    keep_what_is_built()
    plan = scheduled_plan(Job.of_model(model).analysis, PlanRequest.of_options(params=True))
    paths = {"table": work / "table.json", "entries": work / "entries.json"}
    writers = {"table": write_plan, "entries": write_entries}
    times: dict[str, dict[str, list[float]]] = {form: {"write": [], "read": []} for form in paths}
    for _ in range(repeat):
        for form, path in paths.items():
            _timed(times[form]["write"], writers[form], path, plan)
            _timed(times[form]["read"], read_plan, path)
    assert read_plan(paths["table"]) == plan == {**read_plan(paths["entries"]), "schema_version": 2}, "the same plan"
    return {
        "rejected": len(plan["rejected"]),
        "forms": {
            form: {
                "bytes": path.stat().st_size,
                "write_s": min(times[form]["write"]),
                "read_s": min(times[form]["read"]),
            }
            for form, path in paths.items()
        },
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Size, write and read time of the plan file's two forms.")
    parser.add_argument("model", nargs="?", type=Path, help="the model (default: a generated one)")
    parser.add_argument("--nodes", type=int, default=100_000, help="nodes of the generated model")
    parser.add_argument("--hidden", type=int, default=8, help="hidden size of the generated model")
    parser.add_argument("--repeat", type=int, default=5, help="calls of each, interleaved; the fastest counts")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON document")
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    with tempfile.TemporaryDirectory(prefix="offloadctl-plan-file-") as tmp:
        model = args.model
        if model is None:
            config = gen_large.LargeModelConfig(layers=gen_large.layers_for_nodes(args.nodes), hidden=args.hidden)
            model = gen_large.generate(Path(tmp) / "model.onnx", config).path
        result = measure(model, Path(tmp), args.repeat)
    if args.json:
        print(json.dumps(result, indent=1))
        return
    forms = result["forms"]
    table = Table(title=f"the plan file, {result['rejected']} rejected candidates (fastest of {args.repeat})")
    for column in ("rejected as", "file MB", "write s", "read s"):
        table.add_column(column, justify="left" if column == "rejected as" else "right")
    for form, fig in forms.items():
        table.add_row(form, f"{fig['bytes'] / 1e6:.1f}", f"{fig['write_s']:.3f}", f"{fig['read_s']:.3f}")
    ratio = {key: forms["table"][key] / forms["entries"][key] for key in ("bytes", "write_s", "read_s")}
    table.add_row(
        "table / entries", f"{ratio['bytes']:.2f}x", f"{ratio['write_s']:.2f}x", f"{ratio['read_s']:.2f}x", style="bold"
    )
    Console().print(table)


if __name__ == "__main__":
    main()
