"""Reading onnxruntime's profiling files: kernel events grouped by run."""

from __future__ import annotations

import json

import pytest

from offloadctl.running.kernels import kernel_runs


def _event(name, ts, dur, op="Relu", shapes=((4,),)):
    return {
        "cat": "Node",
        "name": f"{name}_kernel_time",
        "ts": ts,
        "dur": dur,
        "ph": "X",
        "args": {"op_name": op, "input_type_shape": [{"float": list(s)} for s in shapes]},
    }


def test_kernel_runs_groups_by_run_drops_warmup_and_nested_events(tmp_path):
    events = [
        {"cat": "Session", "name": "model_run", "ts": 0, "dur": 100},
        _event("a", 10, 5),
        {"cat": "Session", "name": "model_run", "ts": 200, "dur": 300},
        _event("a", 210, 7),
        _event("if", 220, 100, op="If", shapes=((),)),
        _event("then_branch_node", 230, 40),  # runs inside the If: its time is the If's
        _event("b", 330, 9, op="Add", shapes=((4,), (4,))),
        {"cat": "Session", "name": "SequentialExecutor::Execute", "ts": 205, "dur": 290},
    ]
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(events))
    (run,) = kernel_runs(path)
    assert [e.name for e in run] == ["a", "if", "b"]
    assert [e.seconds for e in run] == pytest.approx([7e-6, 100e-6, 9e-6])
    assert run[2].op_type == "Add" and run[2].input_shapes == ((4,), (4,))
    assert [e.name for e in kernel_runs(path, skip=0)[0]] == ["a"]
