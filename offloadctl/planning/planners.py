"""Planning stages: pure functions from an analysis or plan to a new plan.

``select`` (model -> "selected"), ``filter_plan`` ("selected" -> "filtered"), ``prefetch``
("filtered" -> "scheduled"), and ``make_plan`` for all three in one call. None of them edits ONNX.
Plans are validated where they cross a boundary (`offloadctl.contract.document.read_plan` and `write_plan`);
a caller that hands an edited plan to a stage directly can check it with `validate_plan` first.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from offloadctl.contract.types import Plan
from offloadctl.core.errors import OffloadError
from offloadctl.planning.filter import DEFAULT_MIN_BYTES, DEFAULT_SELECT_NUM, filter_plan
from offloadctl.planning.prefetch import DEFAULT_PREFETCH_DISTANCE, DEFAULT_RELEASE_DISTANCE, prefetch
from offloadctl.planning.select import DEFAULT_SELECT_DISTANCE, select

if TYPE_CHECKING:
    from offloadctl.analysis.graph import Analysis
    from offloadctl.simulation.costs import CopyCost
    from offloadctl.simulation.profiles import Profile

__all__ = [
    "DEFAULT_MIN_BYTES",
    "DEFAULT_PREFETCH_DISTANCE",
    "DEFAULT_RELEASE_DISTANCE",
    "DEFAULT_SELECT_DISTANCE",
    "DEFAULT_SELECT_NUM",
    "filter_plan",
    "make_plan",
    "prefetch",
    "select",
]


def make_plan(
    analysis: Analysis,
    *,
    select_distance: int = DEFAULT_SELECT_DISTANCE,
    activations: bool = True,
    params: bool = False,
    force: Sequence[str] = (),
    never: Sequence[str] = (),
    select_num: int = DEFAULT_SELECT_NUM,
    min_bytes: int | str = DEFAULT_MIN_BYTES,
    prefetch_distance: int = DEFAULT_PREFETCH_DISTANCE,
    release_distance: int = DEFAULT_RELEASE_DISTANCE,
    strategy: str | None = None,
    budget: int | str | None = None,
    stream_weights: bool = False,
    stream_depth: int | None = None,
    step: Callable[..., None] | None = None,
    objective: str | CopyCost | None = None,
    profile: Profile | str | None = None,
    optimal: bool = False,
    time_limit: float | None = None,
    copies: str = "inline",
    max_slowdown: float | None = None,
) -> Plan:
    """The whole plan in one call: select, filter (by count, or by budget) and prefetch.

    With the distance strategy (HyperOffload's, the default) the result equals chaining `select`,
    `filter_plan` and `prefetch`. With ``budget`` (or ``stream_weights``, or ``strategy="budget"``)
    the budget strategy (`offloadctl.planning.budget.strategy.budget_filter`) chooses what to offload so the
    simulated peak fits, and the scheduled plan is checked against the simulator.

    Args:
        analysis: the analysed model (`offloadctl.analyse`).
        select_distance, activations, params, force, never: the select stage's options.
        select_num, min_bytes: the filter stage's options (``min_bytes`` also as ``"64KiB"``).
        prefetch_distance, release_distance: the prefetch stage's options.
        strategy: ``"distance"`` or ``"budget"``; None picks ``budget`` when a budget or weight
            streaming is asked for.
        budget: peak device memory to fit, in bytes or as text (``"1.5GiB"``, ``"800MB"``).
        stream_weights, stream_depth: keep weights on the host and stream them in by layer group.
        step: called with the name of each stage as it starts (``step("scheduling")``), and with
            ``new=False`` for news from a long budget search (``step(text, new=False)``).
        objective, profile, optimal, time_limit: the budget strategy's search: what it minimises
            (``"bytes"``, ``"time"`` on ``profile``, or an `offloadctl.simulation.costs.CopyCost`; None: time
            for a measured profile, bytes otherwise), and whether to solve it exactly (HiGHS) within
            ``time_limit`` seconds (see `budget_filter`).
        copies: how the copies run: ``"inline"`` on the compute stream (onnxruntime today) or
            ``"streams"`` (an estimate for copy streams, a mode onnxruntime does not run yet): what
            the time objective and ``max_slowdown`` estimate, and how the budget strategy places
            prefetches.
        max_slowdown: instead of a budget, the largest cut in peak memory whose estimated time stays
            within this multiple of the baseline (`offloadctl.planning.tradeoff.plan_within_slowdown`).

    Returns:
        A plan at stage "scheduled".

    Raises:
        OffloadError: contradictory options, or a budget below the lower bound or out of reach (the
            message gives the lower bound and the best peak reachable).
    """
    from offloadctl.core.units import parse_bytes
    from offloadctl.planning.budget.exact import DEFAULT_TIME_LIMIT
    from offloadctl.planning.budget.strategy import budget_filter, check_budget
    from offloadctl.planning.budget.streaming import DEFAULT_STREAM_DEPTH
    from offloadctl.simulation.costs import COPY_MODES, default_objective
    from offloadctl.simulation.profiles import DEFAULT_PROFILE, Profile, load_profile

    budget_bytes = parse_bytes(budget) if isinstance(budget, str) else budget
    min_bytes = parse_bytes(min_bytes) if isinstance(min_bytes, str) else min_bytes
    if strategy not in (None, "distance", "budget"):
        raise OffloadError(f"unknown strategy {strategy!r}", hint="use 'distance' or 'budget'")
    if copies not in COPY_MODES:
        raise OffloadError(f"unknown copy mode {copies!r}", hint=f"use one of {', '.join(COPY_MODES)}")
    prof = profile if isinstance(profile, Profile) else load_profile(profile or DEFAULT_PROFILE)
    if objective is None:
        objective = default_objective(prof)
    if max_slowdown is not None:
        if budget_bytes is not None or stream_weights or strategy == "distance" or optimal:
            raise OffloadError(
                "max_slowdown chooses the budget itself: it does not go with a budget, weight streaming, the "
                "distance strategy or the exact search",
                hint="give either --max-slowdown or --budget",
            )
        from offloadctl.planning.tradeoff import plan_within_slowdown

        report = step or (lambda text, new=True: None)
        report("fitting the slowdown")
        return plan_within_slowdown(
            analysis,
            max_slowdown,
            copies=copies,
            profile=prof,
            objective=objective if isinstance(objective, str) else None,
            activations=activations,
            params=params,
            force=force,
            never=never,
            min_bytes=min_bytes,
            prefetch_distance=prefetch_distance,
            release_distance=release_distance,
            step=lambda text: report(text, new=False),
        )
    if strategy == "distance" and (budget_bytes is not None or stream_weights):
        raise OffloadError(
            "a budget and weight streaming need the budget strategy, not the distance strategy",
            hint="drop --strategy distance (or the budget)",
        )
    if strategy == "budget" and budget_bytes is None and not stream_weights:
        raise OffloadError("the budget strategy needs a budget (or weight streaming)", hint="give --budget BYTES")
    use_budget = strategy == "budget" or budget_bytes is not None or stream_weights
    report = step or (lambda text, new=True: None)
    report("selecting")
    selected = select(  # the budget strategy weighs every idle stretch: it selects at distance 0
        analysis,
        select_distance=0 if use_budget else select_distance,
        activations=activations,
        params=params,
        force=tuple(force),
        never=tuple(never),
    )
    if use_budget:
        report("fitting the budget")
        filtered = budget_filter(
            selected,
            analysis,
            budget_bytes=budget_bytes,
            prefetch_distance=prefetch_distance,
            release_distance=release_distance,
            select_num=select_num,
            min_bytes=min_bytes,
            stream_weights=stream_weights,
            stream_depth=DEFAULT_STREAM_DEPTH if stream_depth is None else stream_depth,
            report=lambda text: report(text, new=False),
            objective=objective,
            profile=prof,
            copies=copies,
            optimal=optimal,
            time_limit=DEFAULT_TIME_LIMIT if time_limit is None else time_limit,
        )
    else:
        report("filtering")
        # chained, so each stage's input can be freed once the next stage has copied it (big plans)
        filtered = filter_plan(selected, select_num=select_num, min_bytes=min_bytes)
    del selected
    report("scheduling")
    plan = prefetch(filtered, prefetch_distance=prefetch_distance, release_distance=release_distance)
    if use_budget:
        check_budget(analysis, plan)
    return plan
