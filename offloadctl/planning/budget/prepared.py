"""What the budget planner prepares once per model and options, whatever the budget (`Prepared`): the
check that every input has a size, the selection (weights looked at too), the lower bound and the peak
without offload, the candidates with and without weights (`Candidates`), and the device timing of
copies on streams, once per profile.

`offloadctl.planning.budget.strategy.BudgetSearch` searches over it at any number of budgets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from offloadctl.analysis import timeline
from offloadctl.analysis.graph import Analysis
from offloadctl.core.errors import OffloadError
from offloadctl.core.plantypes import Plan, Rejection
from offloadctl.planning.budget.candidates import Cand, Floor, candidates, copy_floor
from offloadctl.planning.budget.streaming import stream_states
from offloadctl.planning.request import FilterRequest, SelectPart
from offloadctl.planning.select import Selection, selection_for
from offloadctl.simulation.costs import CopyTiming, copy_timing
from offloadctl.simulation.memory import lower_bound, resident_profile
from offloadctl.simulation.profiles import Profile
from offloadctl.simulation.timing import scratched

__all__ = ["Candidates", "Prepared"]


@dataclass(frozen=True)
class Candidates:
    """One candidate set: with or without weights."""

    rejected: list[Rejection]  # the selection's rejections (none for a plan made for its figures alone)
    cands: list[Cand]
    small: list  # rejections for --min-bytes
    stream: Any  # the streamed weights' fixed states (`stream_states`), None without weight streaming
    stream_info: dict[str, Any] | None
    floored: bool = True  # copies under the floor left out (False: the budget needed them)


class Prepared:
    """The budget planner's work that does not depend on the budget, done once.

    Args:
        analysis: the analysed model.
        options: the budget planner's options (`FilterRequest`, or a whole `PlanRequest`).
        select: the candidates' select options (their select distance is not used: the planner
            weighs every idle stretch).
        base: the selected plan whose model, options and history the plans extend (None: the
            planner's own selection at select distance 0).
        listed: False for plans made for their figures alone: the same offloads, no ``rejected`` list.
        selection: the selection of ``analysis`` with ``select`` when the caller made it (the pipeline's
            select pass); None: made here (`offloadctl.planning.select.selection_for`).

    Raises:
        OffloadError: an input has dynamic dimensions, so the sizes computed from it are unknown.
    """

    def __init__(
        self,
        analysis: Analysis,
        options: FilterRequest,
        select: SelectPart,
        *,
        base: Plan | None,
        listed: bool,
        selection: Selection | None = None,
    ) -> None:
        dynamic = analysis.dynamic_inputs()
        if dynamic:
            raise OffloadError(
                f"a budget cannot be checked for {analysis.loaded.path}: input(s) {', '.join(dynamic)} have dynamic "
                "dimensions, so the sizes of the tensors computed from them are unknown",
                hint="pin them with --input-shape NAME=D0,D1,... where the model is loaded",
            )
        # the kernel scratch a measured profile records is part of every step's memory, as simulate counts it
        analysis = self.analysis = scratched(analysis, options.budget.device_profile)
        self.options = options
        self.params = select.params or options.budget.stream_weights
        self.listed = listed
        self.selection = selection if selection is not None else selection_for(analysis, select)
        self.base = base if base is not None else self.selection.header(weights=select.params)
        # the bound and the peak from the simulation's base, which a simulation of the plan reuses
        self.lower_bound, self.lower_bound_position = lower_bound(analysis)
        self.peak_before = timeline.peak_of(resident_profile(analysis))[0]
        given = options.filter.min_bytes is not None
        floor = options.filter.min_size if given else copy_floor(options.budget.device_profile, self.peak_before)
        self.floor = Floor(floor, given)
        self._candidates: dict[tuple[bool, bool], Candidates] = {}
        self._timing: dict[int, tuple[Profile, CopyTiming]] = {}

    def candidates(self, with_params: bool, floored: bool = True) -> Candidates:
        """The candidate set with weights or without, and with the copy floor or without it (a derived
        floor is dropped when the budget cannot be reached otherwise), made once each."""
        key = (with_params, floored)
        if key not in self._candidates:
            rejected = self.selection.rejected(weights=with_params) if self.listed else []
            floor = self.floor if floored else Floor(0, given=False)
            cands, small = candidates(self.analysis, self.selection, with_params, floor)
            stream = info = None
            if self.options.budget.stream_weights:
                stream, info = stream_states(cands, self.options.budget.stream_depth)
            self._candidates[key] = Candidates(rejected, cands, small, stream, info, floored)
        return self._candidates[key]

    def timing(self, profile: Profile) -> CopyTiming:
        """When each node runs on ``profile``, computed once per profile."""
        hit = self._timing.get(id(profile))
        if hit is None or hit[0] is not profile:
            hit = self._timing[id(profile)] = (profile, copy_timing(self.analysis, profile))
        return hit[1]
