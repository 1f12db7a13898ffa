"""Peak memory of the commands on a model of about 100 MB of embedded weights, against the model's size.

A model of ``--layers`` transformer layers (``bench/gen_large.py``, weights of a repeating pattern) is
saved with its weights in the file, as exporters write models under 2 GB. Each command runs in a
process of its own, and its peak resident memory (``ru_maxrss`` from ``wait4``) is set against a Python
process that has only imported onnx and onnxruntime. Printed per command: the peak, the peak above
that baseline, and that figure over the model file's size (the goal: at most 2x).

Run: ``python bench/bench_rss.py [--layers 8] [--hidden 512]``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MIB = 1 << 20
#: a child's peak counts from the parent's at the fork, so this process stays small: it imports no onnx,
#: and the model is made in a child of its own
_EMBED = "import onnx, sys; onnx.save(onnx.load(sys.argv[1]), sys.argv[2])"


def peak_rss(args: list[str]) -> int:
    """The peak resident memory of one process running ``args``, in bytes."""
    child = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    error = child.stderr.read().decode() if child.stderr else ""
    if child.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed: {error.strip().splitlines()[-1:]}")
    return usage.ru_maxrss * 1024  # kilobytes on Linux


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=512)
    args = parser.parse_args(argv)
    cli = [sys.executable, "-m", "offloadctl"]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        made = [sys.executable, str(ROOT / "bench" / "gen_large.py"), str(folder / "external.onnx")]
        subprocess.run([*made, "--layers", str(args.layers), "--hidden", str(args.hidden), "--fill", "pattern"],
                       check=True, capture_output=True)  # fmt: skip
        model = folder / "model.onnx"
        subprocess.run([sys.executable, "-c", _EMBED, str(folder / "external.onnx"), str(model)], check=True)
        size = model.stat().st_size
        base = peak_rss([sys.executable, "-c", "import onnx, onnxruntime"])
        print(f"model {size / MIB:.1f} MiB, weights in the file; baseline (python, import onnx, onnxruntime) "
              f"{base / MIB:.1f} MiB")  # fmt: skip
        plan = folder / "plan.json"
        for name, command in (
            ("inspect", ["inspect", model]),
            ("plan", ["plan", model, "--params", "--select-distance", "5", "-o", plan]),
            ("apply", ["apply", plan, "-o", folder / "model.offload.onnx"]),
            ("simulate", ["simulate", model, "--plan", plan]),
        ):
            peak = peak_rss([*cli, *map(str, command)])
            print(f"{name:<9} peak {peak / MIB:7.1f} MiB  above the baseline {(peak - base) / MIB:7.1f} MiB  "
                  f"= {(peak - base) / size:.2f}x the model file")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
