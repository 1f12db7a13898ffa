"""What a planner returns: the plan, and the simulation it made of it if it made one.

A planner that simulated its plan on the way (the budget planner comparing two plans with copies
on streams, the trade-off timing each budget) hands the simulation back, so the command that
prints the verdict does not simulate the same plan again (as onnx-ir's passes return a
``PassResult``).
"""

from __future__ import annotations

from dataclasses import dataclass

from offloadctl.core.plantypes import Plan
from offloadctl.simulation.result import SimResult

__all__ = ["PlanOutcome"]


@dataclass(frozen=True)
class PlanOutcome:
    """A planner's result: the plan and, when the planner simulated it on the request's profile, the
    simulation (None otherwise)."""

    plan: Plan
    simulation: SimResult | None = None
