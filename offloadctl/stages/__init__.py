"""Planning stages: pure functions from an analysis or plan to a new plan.

``select`` (model -> "selected"), ``filter_plan`` ("selected" -> "filtered"), ``prefetch``
("filtered" -> "scheduled"), and ``make_plan`` for all three in one call. None of them edits ONNX.
Plans are validated where they cross a boundary (`offloadctl.plan.read_plan` and `write_plan`);
a caller that hands an edited plan to a stage directly can check it with `validate_plan` first.
"""

from __future__ import annotations

from offloadctl.stages.filter import DEFAULT_MIN_BYTES, DEFAULT_SELECT_NUM, filter_plan
from offloadctl.stages.prefetch import DEFAULT_PREFETCH_DISTANCE, DEFAULT_RELEASE_DISTANCE, prefetch
from offloadctl.stages.select import DEFAULT_SELECT_DISTANCE, select

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
    analysis,
    *,
    select_distance: int = DEFAULT_SELECT_DISTANCE,
    activations: bool = True,
    params: bool = False,
    force: tuple[str, ...] = (),
    never: tuple[str, ...] = (),
    select_num: int = DEFAULT_SELECT_NUM,
    min_bytes: int = DEFAULT_MIN_BYTES,
    prefetch_distance: int = DEFAULT_PREFETCH_DISTANCE,
    release_distance: int = DEFAULT_RELEASE_DISTANCE,
):
    """select, filter and prefetch in one call; the result equals chaining the three stages."""
    # Chained, so each stage's input can be freed once the next stage has copied it (big plans).
    return prefetch(
        filter_plan(
            select(
                analysis,
                select_distance=select_distance,
                activations=activations,
                params=params,
                force=force,
                never=never,
            ),
            select_num=select_num,
            min_bytes=min_bytes,
        ),
        prefetch_distance=prefetch_distance,
        release_distance=release_distance,
    )
