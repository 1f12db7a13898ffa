"""What copies cost inside a model, against what a sweep of copies alone predicts (`copies_in_model`).

Two rewrites of the model, every weight and every activation offloaded, are timed against it side by
side; the time each adds scales the sweep's fits (`offloadctl.running.fits`). A copy in a model is not
a copy in a loop of copies: the cache holds other things, and the copy's neighbours compete for memory
bandwidth.
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from offloadctl.core.plantypes import Plan
from offloadctl.loading.model import load_model
from offloadctl.planning.make import scheduled_plan
from offloadctl.planning.request import FilterPart, PlanRequest, SelectPart
from offloadctl.rewriting.metadata import SessionSettings
from offloadctl.rewriting.rewrite import RewriteOptions, apply_plan
from offloadctl.rewriting.writing import external_locations, write_model
from offloadctl.running import timed
from offloadctl.running.fits import LinkFit
from offloadctl.running.sessions import required_settings
from offloadctl.running.timed import Device, alternate_runners
from offloadctl.simulation.base import is_rewritten

__all__ = ["IN_MODEL_DATA_MAX", "copies_in_model", "unfolding_cost"]

logger = logging.getLogger(__name__)

IN_MODEL_DATA_MAX = 512 << 20  # rewrites of a model with more external data are not timed
_SCALE_RANGE = (0.1, 10.0)  # a sweep fit scaled beyond this by the copies in the model is kept as it is


def _unfolding(settings: SessionSettings) -> SessionSettings:
    """``settings`` with onnxruntime's ConstantFolding off, as every rewrite with pins or offloaded weights runs."""
    return {**settings, "disabled_optimizers": [*settings.get("disabled_optimizers", []), "ConstantFolding"]}


def unfolding_cost(
    dev: Device, model: str, feeds: Mapping[str, np.ndarray], settings: SessionSettings, repeat: int, level: str
) -> float:
    """What a run of ``model`` at ``level`` takes longer with ConstantFolding off (timed side by side)."""
    runners = [
        dev.runner(model, feeds, settings, profiled=False, opt_level=level),
        dev.runner(model, feeds, _unfolding(settings), profiled=False, opt_level=level),
    ]
    on, off = (statistics.median(t) for t in alternate_runners(runners, repeat, min_seconds=3 * timed.MIN_SECONDS))
    return max(off - on, 0.0)


def _offload_everything(analysis: Any, *, activations: bool, fused: Sequence[str] = ()) -> Plan:
    """A plan that offloads every activation (or every weight) it can, reloaded for each use at the
    default prefetch distance (where a plan's reloads usually run: early, the copy then waits);
    ``fused``: what the optimizer takes in at the profile's level, kept as plans made with the
    profile keep it."""
    every = len(analysis.producer) + len(analysis.weights) + 1
    select = SelectPart(select_distance=0, activations=activations, params=not activations, fused=tuple(fused))
    return scheduled_plan(analysis, PlanRequest(select=select, filter=FilterPart(select_num=every)))


def _plan_copies(plan: Plan) -> dict[str, list[int]]:
    """Bytes of every copy a plan makes, per direction."""
    copies: dict[str, list[int]] = {"d2h": [], "h2d": []}
    for off in plan["offloads"]:
        if off["kind"] == "activation":
            copies["d2h"].append(off["bytes"])
        copies["h2d"] += [off["bytes"]] * (len(off["reload_groups"]) + (off["output_h2d_before"] is not None))
    return copies


def _external_bytes(model: str, proto: onnx.ModelProto) -> int:
    folder = Path(model).parent
    return sum((folder / name).stat().st_size for name in external_locations(proto) if (folder / name).is_file())


def _scaled(
    direction: str,
    plan: Plan,
    added: float,
    unfolded: float,
    fits: dict[str, LinkFit],
    scale: dict[str, float],
    model: str,
) -> dict[str, Any]:
    """The record of one rewrite's copies timed inside the model (``added``: the seconds it adds over the
    model, ``unfolded`` of them what running without ConstantFolding costs), setting
    ``scale[direction]`` when the factor over the sweep's fit is plausible (`_SCALE_RANGE`)."""
    copies = _plan_copies(plan)
    others = sum(fits["h2d"].time(b) * scale["h2d"] for b in copies["h2d"]) if direction == "d2h" else 0.0
    predicted = sum(fits[direction].time(b) for b in copies[direction])
    cost = added - others - unfolded
    factor = cost / predicted if predicted > 0 else 0.0
    entry: dict[str, Any] = {
        "copies": len(copies[direction]),
        "bytes": sum(copies[direction]),
        "rewrite_copies": sum(len(v) for v in copies.values()),
        "added_s": added,
        "sweep_fit_s": predicted + others,
        "scale": None,
    }
    if _SCALE_RANGE[0] <= factor <= _SCALE_RANGE[1]:
        scale[direction] = factor
        entry["scale"] = factor
    else:
        logger.warning(
            "timing %s copies inside %s: they added %.1f us against %.1f us predicted by the sweep; "
            "the sweep's fit is kept (measure on a quiet machine)",
            direction.upper(),
            model,
            cost * 1e6,
            predicted * 1e6,
        )
    return entry


def copies_in_model(
    dev: Device,
    analysis: Any,
    model: str,
    feeds: Mapping[str, np.ndarray],
    settings: SessionSettings,
    fits: dict[str, LinkFit],
    repeat: int,
    folder: Path,
    opt_level: str,
    fused: Sequence[str],
) -> tuple[dict[str, float], dict[str, Any]]:
    """Scale the sweep's fits to what copies cost inside the model; returns (scale per direction, record).

    Two rewrites of the model are timed against it side by side: every weight offloaded (H2D only),
    and every activation offloaded (a D2H after its producer, an H2D before each use). The time
    each adds, over what the sweep's fits predict for its copies, scales the fits: the H2D fit from
    the first, then the D2H fit from the second (its H2Ds counted with the scaled H2D fit). A copy
    in a model is not a copy in a loop of copies: the cache holds other things, and the copy's
    neighbours compete for memory bandwidth.

    The rewrites run at the optimization level of the model's timed runs (``opt_level``), keeping what
    that level's fusions take in (``fused``: the original's tensors that level's graph lacks): above
    ``disable`` what a rewrite adds there besides its copies (its order pins' nodes, the constants no
    longer folded, kernels whose weights arrive by copy and are not prepacked) is priced into the copies too.
    """
    scale = {"d2h": 1.0, "h2d": 1.0}
    record: dict[str, Any] = {"d2h": None, "h2d": None}
    if is_rewritten(analysis):
        record["note"] = "the model already contains copies: the sweep's fits are used as measured"
        return scale, record
    if _external_bytes(model, analysis.loaded.proto) > IN_MODEL_DATA_MAX:
        record["note"] = (
            f"the model's external data exceed {IN_MODEL_DATA_MAX >> 20} MiB: not copied to time rewrites of it; "
            "the sweep's fits are used as measured"
        )
        if opt_level != "disable":  # the model alone, with ConstantFolding off and on
            record["unfolded_s"] = unfolding_cost(dev, model, feeds, settings, repeat, opt_level)
        return scale, record
    plans = {
        "h2d": _offload_everything(analysis, activations=False, fused=fused),
        "d2h": _offload_everything(analysis, activations=True, fused=fused),
    }
    paths = {}
    for direction, plan in plans.items():
        if not plan["offloads"]:
            continue
        path = folder / f"everything_{direction}.onnx"
        shared = apply_plan(plan, analysis, options=RewriteOptions(share_weights=True))
        write_model(shared, path, source_dir=Path(model).parent, weights_from=analysis.loaded.proto)
        paths[direction] = str(path)
    if not paths:
        record["note"] = "nothing in the model can be offloaded: the sweep's fits are used as measured"
        return scale, record
    runners = [dev.runner(model, feeds, settings, profiled=False, opt_level=opt_level)]
    for written in paths.values():
        settings_written = required_settings(load_model(written).proto, written)
        runners.append(dev.runner(written, feeds, settings_written, profiled=False, opt_level=opt_level))
    if opt_level != "disable":  # the rewrites run without ConstantFolding: what that costs the model itself
        runners.append(dev.runner(model, feeds, _unfolding(settings), profiled=False, opt_level=opt_level))
    # the difference of two latencies is what counts: time them three times as long as the model alone
    medians = [statistics.median(t) for t in alternate_runners(runners, repeat, min_seconds=3 * timed.MIN_SECONDS)]
    del runners
    base = medians[0]
    added = dict(zip(paths, medians[1 : 1 + len(paths)]))
    unfolded = max(medians[-1] - base, 0.0) if opt_level != "disable" else 0.0
    record["latency_s"] = base
    if opt_level != "disable":
        record["unfolded_s"] = unfolded
    for direction in ("h2d", "d2h"):  # H2D first: the D2H rewrite's H2Ds are priced with its scale
        if direction in added:
            record[direction] = _scaled(
                direction, plans[direction], added[direction] - base, unfolded, fits, scale, model
            )
    return scale, record
