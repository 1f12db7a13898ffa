"""Checking that a plan describes the model it is applied to or simulated with.

`check_plan_for_model` is the one check `apply` and `simulate` share: a plan that passes it can be
rewritten into the model, and the simulator's figures for it are the figures of that rewrite. It
reads an `Analysis` and a plan; it changes neither.
"""

from __future__ import annotations

from typing import Any

from offloadctl.analysis.graph import Analysis
from offloadctl.core.errors import OffloadError
from offloadctl.core.plantypes import Offload, Plan, Use
from offloadctl.loading.tensors import TensorInfo

__all__ = ["check_plan_for_model"]

_HINT_REPLAN = "re-create the plan from this model (offloadctl plan) or pass the model the plan was made for"


def _use_key(use: Use) -> tuple[int, int, str]:
    index = use["input_index"]
    return (use["position"], -1 if index is None else index, use["node"])


def _describe_use(key: tuple[int, int, str]) -> str:
    where = "inside a subgraph" if key[1] < 0 else f"at input {key[1]}"
    return f"node {key[2]!r} (position {key[0]}) {where}"


def check_plan_for_model(plan: Plan, analysis: Analysis) -> None:
    """Refuse a plan that does not describe this model: every field that states a fact about the
    model (tensor, kind, producer, uses, size, shape, type, graph output) must be true of it, and
    every position must make sense for it (copies after the D2H and by their group's first use,
    release not before the last device use, no device use of an offloaded weight). The plan itself
    is assumed valid against the schema (`validate_plan`).

    Raises:
        OffloadError: naming the first entry and field that disagree, with how to fix it.
    """
    n = analysis.num_positions
    model_path = analysis.loaded.path
    if plan["model"]["num_positions"] != n:
        raise OffloadError(
            f"the plan counts {plan['model']['num_positions']} positions but {model_path} has {n}",
            hint=_HINT_REPLAN,
        )
    for off in plan["offloads"]:
        kind = _check_kind(off, analysis)
        if kind == "activation":
            _check_activation(off, analysis)
        else:
            _check_weight(off, analysis)
        _check_facts(off, _copyable_info(off, analysis), model_path)
        if kind == "activation":
            _check_release(off)
        _check_uses(off, analysis)
        _check_h2d_positions(off, kind == "activation")


def _check_kind(off: Offload, analysis: Analysis) -> str:
    """The tensor exists and is of the plan's kind; returns its kind."""
    tensor, model_path = off["tensor"], analysis.loaded.path
    exists = tensor in analysis.producer or tensor in analysis.weights or tensor in analysis.graph_inputs
    if not exists:
        raise OffloadError(
            f"plan names tensor {tensor!r} which the model {model_path} does not have", hint=_HINT_REPLAN
        )
    kind = analysis.kind(tensor)
    if kind != off["kind"]:
        what = {"activation": "an activation", "parameter": "a weight", "input": "a graph input"}[kind]
        raise OffloadError(
            f"plan offloads tensor {tensor!r} as {off['kind']}, but in {model_path} it is {what}",
            hint=_HINT_REPLAN if kind != "input" else "graph inputs cannot be offloaded; remove the entry",
        )
    return kind


def _check_activation(off: Offload, analysis: Analysis) -> None:
    """Producer, D2H, graph output and the output's H2D of an offloaded activation."""
    tensor, model_path, n = off["tensor"], analysis.loaded.path, analysis.num_positions
    producer = analysis.producer[tensor]
    planned_producer, d2h_after = off["producer"], off["d2h_after"]
    assert planned_producer is not None and d2h_after is not None  # validate_plan requires both
    if planned_producer["position"] != producer or planned_producer["node"] != analysis.node_names[producer]:
        raise OffloadError(
            f"plan says tensor {tensor!r} is produced by node {planned_producer['node']!r} at position "
            f"{planned_producer['position']}, but in {model_path} node {analysis.node_names[producer]!r} at "
            f"position {producer} produces it",
            hint=_HINT_REPLAN,
        )
    if not producer <= d2h_after < n:
        raise OffloadError(
            f"plan puts the D2H copy of tensor {tensor!r} after position {off['d2h_after']}, before its "
            f"producer (position {producer}) or beyond the model's {n} positions",
            hint="set d2h_after to the producer's position",
        )
    is_output = tensor in analysis.graph_outputs
    if off["graph_output"] != is_output:
        state = "is" if is_output else "is not"
        raise OffloadError(
            f"plan says graph_output={str(off['graph_output']).lower()} for tensor {tensor!r}, but it {state} "
            f"a graph output of {model_path}",
            hint=_HINT_REPLAN,
        )
    out_h2d = off["output_h2d_before"]
    if out_h2d is not None and not off["graph_output"]:
        raise OffloadError(
            f"plan sets output_h2d_before for tensor {tensor!r}, which is not a graph output of {model_path}",
            hint="set it to null",
        )
    if out_h2d is not None and not d2h_after < out_h2d <= n:
        raise OffloadError(
            f"plan puts the H2D copy feeding graph output {tensor!r} before position {out_h2d}; it must lie "
            f"after the D2H (position {off['d2h_after']}) and at most {n} (the end)",
            hint="set output_h2d_before to the number of positions (the end)",
        )


def _check_weight(off: Offload, analysis: Analysis) -> None:
    tensor, model_path = off["tensor"], analysis.loaded.path
    if tensor in analysis.graph_outputs:
        raise OffloadError(
            f"plan offloads weight {tensor!r}, which is also a graph output of {model_path}",
            hint="remove the entry: a weight that is a graph output stays on the device",
        )
    if off["output_h2d_before"] is not None:
        raise OffloadError(f"plan sets output_h2d_before for weight {tensor!r}", hint="set it to null")
    if off["device_uses"]:
        raise OffloadError(
            f"plan offloads weight {tensor!r} but lists uses that read it on the device (device_uses); an "
            "offloaded weight lives on the host and every use reads a reload group's copy",
            hint="move those uses into a reload group, or " + _HINT_REPLAN,
        )


def _copyable_info(off: Offload, analysis: Analysis) -> TensorInfo:
    """What the model says of the tensor, which the copy operators must be able to move."""
    tensor = off["tensor"]
    info = analysis.infos.get(tensor)
    if tensor in analysis.sparse_weights or info is None or not info.copyable or info.elem_type is None:
        why = (
            "a sparse weight"
            if tensor in analysis.sparse_weights
            else (info.why_unknown() if info is not None else "its type is unknown")
        )
        raise OffloadError(
            f"tensor {tensor!r} of {analysis.loaded.path} cannot be copied by MemcpyToHost/MemcpyFromHost ({why})",
            hint="remove the entry from the plan",
        )
    return info


def _check_release(off: Offload) -> None:
    last_device = off["device_uses"][-1]["position"] if off["device_uses"] else off["d2h_after"]
    release = off["release_after"]
    if release is not None and last_device is not None and release < last_device:
        raise OffloadError(
            f"plan releases the device buffer of tensor {off['tensor']!r} after position {release}, before its last "
            f"device use (position {last_device})",
            hint=f"set release_after to {last_device} or later, or re-run offloadctl prefetch",
        )


def _check_uses(off: Offload, analysis: Analysis) -> None:
    """The plan's uses are the model's uses of the tensor, each once."""
    tensor, model_path = off["tensor"], analysis.loaded.path
    planned = [_use_key(u) for u in off["device_uses"]]
    for group in off["reload_groups"]:
        planned += [_use_key(u) for u in group["uses"]]
    actual = [_use_key(u.to_json()) for u in analysis.uses.get(tensor, [])]
    extra = sorted(set(planned) - set(actual))
    if extra:
        raise OffloadError(
            f"plan names a read of tensor {tensor!r} by {_describe_use(extra[0])}, which {model_path} does not have",
            hint=_HINT_REPLAN,
        )
    missing = sorted(set(actual) - set(planned))
    if missing:
        raise OffloadError(
            f"plan does not say where {_describe_use(missing[0])} of {model_path} reads tensor {tensor!r}",
            hint="list every use in device_uses or a reload group, or " + _HINT_REPLAN,
        )
    if len(planned) != len(set(planned)):
        raise OffloadError(f"plan lists a use of tensor {tensor!r} twice", hint=_HINT_REPLAN)


def _check_h2d_positions(off: Offload, activation: bool) -> None:
    """Every reload group's H2D runs after the D2H (activations) and not after the group's first use."""
    d2h_after = off["d2h_after"]
    low = d2h_after + 1 if activation and d2h_after is not None else 0
    for g, group in enumerate(off["reload_groups"]):
        h2d, first = group["h2d_before"], group["uses"][0]["position"]
        if h2d is None or not low <= h2d <= first:
            raise OffloadError(
                f"plan puts the H2D copy of reload group {g} of tensor {off['tensor']!r} before position {h2d}; it "
                f"must lie in [{low}, {first}] (after the D2H, not after the group's first use)",
                hint="re-run offloadctl prefetch on the filtered plan, or edit reload_groups/h2d_before",
            )


def _check_facts(off: Offload, info: TensorInfo, model_path: Any) -> None:
    """The plan's bytes, shape and dtype of a tensor must be the model's."""
    tensor = off["tensor"]
    if info.bytes is None:
        raise OffloadError(
            f"the size of tensor {tensor!r} of {model_path} is unknown ({info.why_unknown()}), "
            "so it cannot be offloaded",
            hint="pin the model's dynamic inputs (model.input_shapes in the plan, --input-shape when planning) or "
            "remove the entry",
        )
    facts = (
        ("bytes", off["bytes"], info.bytes),
        ("shape", off["shape"], list(info.shape or ())),
        ("dtype", off["dtype"], info.dtype),
    )
    for field, planned, actual in facts:
        if planned != actual:
            raise OffloadError(
                f"plan says tensor {tensor!r} has {field} {planned!r}, but in {model_path} it has {field} {actual!r}",
                hint=_HINT_REPLAN,
            )
