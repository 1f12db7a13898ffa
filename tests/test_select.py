"""The select stage's rules (`offloadctl.planning.select.RULES`): each reason stated once, as a
check on one tensor and a screen over all of them, and the screen never misses a tensor its check
rejects (so the array pass, which chooses what no screen marks, cannot choose a tensor a rule keeps)."""

from __future__ import annotations

import numpy as np

from offloadctl.loading.placed import HostPlacement
from offloadctl.planning.request import SelectPart
from offloadctl.planning.select import RULES, UseArrays, _Case, _matches, _Screen, _Selector, longest_gap
from tests.test_planning import _analysis, _selection_models


def _screen(selector: _Selector, analysis) -> tuple[_Screen, list[str]]:
    activations = list(analysis.producer)
    weights = [name for name in analysis.sorted_weights if name in analysis.uses]
    names = [*activations, *weights]
    arrays = UseArrays.of([analysis.uses.get(name) or [] for name in names])
    starts = np.zeros(len(names), dtype=np.int64)
    starts[: len(activations)] = [analysis.producer[n] for n in activations]
    ends = np.full(len(names), -1, dtype=np.int64)
    ends[len(activations) :] = np.maximum(selector.n - 1, arrays.last()[len(activations) :])
    gaps = arrays.max_gaps(arrays.steps(starts), ends)
    infos = [analysis.infos.get(name) for name in names]
    return _Screen(names, len(activations), arrays.counts > 0, gaps, infos, arrays), names


def test_every_rules_screen_marks_every_tensor_its_check_rejects(write_model):
    rejected_by = set()
    for path in _selection_models(write_model):
        analysis = _analysis(path)
        nodes = analysis.node_names
        for options in (
            SelectPart(params=True, select_distance=0),
            SelectPart(params=True, select_distance=2),
            SelectPart(params=False, select_distance=1),
            SelectPart(params=True, activations=False, never=("*0*",)),
            SelectPart(params=True, fused=tuple(sorted(analysis.producer)[::3])),
            SelectPart(params=True, host=HostPlacement("webgpu (measured)", tuple(nodes[::4]))),
        ):
            selector = _Selector(analysis, options)
            screen, names = _screen(selector, analysis)
            marks = {rule.name: rule.may_apply(selector, screen) for rule in RULES}
            for k, name in enumerate(names):
                kind = "activation" if k < screen.acts else "parameter"
                uses = analysis.uses.get(name) or []
                start = analysis.producer[name] if kind == "activation" else 0
                gap = (
                    longest_gap(start, uses, None if kind == "activation" else max(selector.n - 1, uses[-1][0]))
                    if uses
                    else 0
                )
                forced = bool(options.force) and _matches(name, options.force)
                case = _Case(name, kind, uses, forced, gap)
                for rule in RULES:  # as `consider` runs them: the first verdict decides
                    if rule.reads_tensor and case.info is None:
                        case = case._replace(info=screen.infos[k])
                    if rule.check(selector, case) is not None:
                        rejected_by.add(rule.name)
                        assert marks[rule.name][k], (path, options, rule.name, name)
                        break
    assert len(rejected_by) >= 10, rejected_by  # the models make most rules reject something


def test_the_reasons_no_select_distance_changes_are_those_of_the_rules_before_short_gaps():
    """`Selection.at_distance` keeps the verdicts of the rules `RULES` checks before idle stretches, read
    from their order there (reordering the rules moves the set with them), each named by its reason."""
    from typing import get_args

    from offloadctl.core.plantypes import RejectionReason
    from offloadctl.planning.select import _BEFORE_GAPS, GAPS_RULE, RULES

    names = [rule.name for rule in RULES]
    assert _BEFORE_GAPS == set(names[: names.index(GAPS_RULE)]) == {"unused", "disabled", "never"}
    assert _BEFORE_GAPS <= set(get_args(RejectionReason))
