"""The memory and time simulator: what a plan (or a rewritten model) does to peak device memory and run time.

The simulator owns the memory model, the time model and their report (`SimResult`). It reads an
`Analysis`, optionally a scheduled plan, and a device profile (`offloadctl.profiles`); it never
edits ONNX. The memory rules are onnxruntime's, stated once in `offloadctl.timeline`; the
simulator applies them to programs whose steps include the copies. Its rooms:

- `offloadctl.simulator.base`: the model's original nodes with tensors interned as integer ids;
- `offloadctl.simulator.program`: the steps the device runs with a plan's copies (or a rewritten
  model's own), after checking the plan against the model;
- `offloadctl.simulator.memory`: bytes alive at every step, the peak, and the lower bound;
- `offloadctl.simulator.timing`: FLOPs, node costs on a profile, and run time with copies in line
  or on streams;
- `offloadctl.simulator.result`: `simulate` and its `SimResult`.

The plot of a `SimResult` is drawn by the command line (`offloadctl.cli.plot`).
"""

from __future__ import annotations

from offloadctl.simulator.base import is_rewritten
from offloadctl.simulator.memory import MemoryTrace, lower_bound, peak_memory
from offloadctl.simulator.result import SimResult, simulate
from offloadctl.simulator.timing import TimeFigures, node_flops, node_seconds

__all__ = [
    "MemoryTrace",
    "SimResult",
    "TimeFigures",
    "is_rewritten",
    "lower_bound",
    "node_flops",
    "node_seconds",
    "peak_memory",
    "simulate",
]
