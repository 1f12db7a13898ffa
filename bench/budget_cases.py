"""The models and budgets the budget benchmark compares on, and the reference figures of the old search.

A *case* is a model (a sample from ``sample_models/`` or a generated transformer-like model from
``bench/gen_large.py``), a budget rule (1.1x the lower bound, or halfway between the lower bound
and the peak without offload) and a candidate mode (``activations``: the default, weights added by
the strategy only when activations alone cannot fit; ``params``: ``--params``; ``stream``:
``--stream-weights``). Every case runs ``budget_filter`` then ``prefetch`` with the default
prefetch distance (50) and release distance 0, as ``offloadctl plan --budget`` does.

``bench/budget_reference.json`` holds what the greedy search of offloadctl 0.1.0 (before the
incremental search, commit 2e88358) gave on each case: whether it fitted, the bytes moved, the
predicted peak, and its time on the machine it was recorded on (2 shared cores: only a rough
figure). It was written by running, on that commit with this file added::

    python bench/budget_cases.py --record bench/budget_reference.json

``bench/bench_budget.py`` compares today's search against it.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from offloadctl.analysis.graph import Analysis, analyse  # noqa: E402
from offloadctl.core.errors import OffloadError  # noqa: E402
from offloadctl.loading.model import load_model  # noqa: E402
from offloadctl.planning.budget.build import bytes_moved  # noqa: E402
from offloadctl.planning.budget.strategy import budget_filter  # noqa: E402
from offloadctl.planning.prefetch import prefetch  # noqa: E402
from offloadctl.planning.request import PlanRequest, PrefetchPart, SelectPart  # noqa: E402
from offloadctl.planning.select import select  # noqa: E402
from offloadctl.simulation.memory import lower_bound, peak_memory  # noqa: E402

import gen_large  # noqa: E402

__all__ = ["SAMPLES", "GENERATED", "MODES", "RULES", "Case", "cases", "load", "budget_for", "run_case"]

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ("seed", "unet", "transformer", "training", "mlp")
# name -> (nodes wanted, hidden size, nodes per layer, sequence length); the long sequence makes
# activations outweigh weights
GENERATED = {
    "gen-1k": (1000, 32, 17, 16),
    "gen-1k-wide": (1000, 32, 40, 16),
    "gen-1k-longseq": (1000, 32, 17, 256),
    "gen-3k": (3000, 32, 17, 16),
}
MODES = ("activations", "params", "stream")
RULES = ("1.1x-lower-bound", "halfway")


@dataclass(frozen=True)
class Case:
    model: str
    rule: str
    mode: str

    @property
    def key(self) -> str:
        return f"{self.model}/{self.rule}/{self.mode}"


def cases(models: list[str] | None = None) -> list[Case]:
    names = models if models is not None else list(SAMPLES) + list(GENERATED)
    return [Case(m, r, mode) for m in names for r in RULES for mode in MODES]


def load(name: str, workdir: Path) -> Analysis:
    """The analysed model called ``name`` (generated into ``workdir`` when it is not a sample)."""
    if name in SAMPLES:
        return analyse(load_model(ROOT / "sample_models" / f"{name}.onnx"))
    nodes, hidden, per_layer, seq = GENERATED[name]
    config = gen_large.LargeModelConfig(
        layers=gen_large.layers_for_nodes(nodes, per_layer), hidden=hidden, nodes_per_layer=per_layer, seq=seq
    )
    path = workdir / f"{name}.onnx"
    if not path.exists():
        gen_large.generate(path, config)
    return analyse(load_model(path))


def budget_for(analysis: Analysis, rule: str) -> int:
    lb, _ = lower_bound(analysis)
    peak = peak_memory(analysis)[0]
    if rule == "1.1x-lower-bound":
        return int(1.1 * lb)
    return (lb + peak) // 2


def run_case(analysis: Analysis, case: Case, **options: Any) -> dict[str, Any]:
    """Plan one case; ``options`` go to ``budget_filter`` (e.g. ``optimal=True``)."""
    budget = budget_for(analysis, case.rule)
    t0 = time.perf_counter()
    try:
        selected = select(analysis, SelectPart(params=case.mode == "params"))
        filtered = budget_filter(
            selected, analysis, PlanRequest.of_options(budget=budget, stream_weights=case.mode == "stream", **options)
        )
        plan = prefetch(filtered, PrefetchPart())
    except OffloadError as exc:
        return {"budget": budget, "fits": False, "error": exc.message, "seconds": time.perf_counter() - t0}
    seconds = time.perf_counter() - t0
    peak = peak_memory(analysis, plan)[0]
    return {
        "budget": budget,
        "fits": peak <= budget,
        "bytes_moved": bytes_moved(plan),
        "peak": peak,
        "seconds": seconds,
        "plan_budget": plan.get("budget"),
    }


def record(path: Path, models: list[str] | None) -> None:
    """Run the cases of ``models`` and write (or, for an existing file, update) their figures."""
    logging.getLogger("offloadctl").setLevel(logging.ERROR)
    out: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))["cases"] if path.exists() else {}
    with tempfile.TemporaryDirectory() as tmp:
        loaded: dict[str, Analysis] = {}
        for case in cases(models):
            if case.model not in loaded:
                loaded.clear()
                loaded[case.model] = load(case.model, Path(tmp))
            result = run_case(loaded[case.model], case)
            result.pop("plan_budget", None)
            out[case.key] = result
            print(case.key, {k: v for k, v in result.items() if k != "error"}, file=sys.stderr, flush=True)
    path.write_text(json.dumps({"cases": out}, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record", type=Path, required=True, help="write the figures of this code to this file")
    parser.add_argument("models", nargs="*", help="models (default: every sample and generated model)")
    args = parser.parse_args(argv)
    record(args.record, args.models or None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
