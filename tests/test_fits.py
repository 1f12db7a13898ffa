"""The lines a measured profile fits: a copy's latency and bandwidth, the sizes a fit spans, and the
executor's cost per node."""

from __future__ import annotations

import numpy as np
import pytest

from offloadctl.core.errors import OffloadError
from offloadctl.running.fits import fit_link, fit_range, node_overhead_for

SIZES = [4096 * 4**k for k in range(8)]


def test_fit_recovers_latency_and_bandwidth_from_exact_points():
    fit = fit_link([(b, 3e-6 + b / 8e9) for b in SIZES])
    assert fit.latency_s == pytest.approx(3e-6, rel=1e-9)
    assert fit.bandwidth == pytest.approx(8e9, rel=1e-9)
    assert fit.max_relative_error < 1e-9


def test_fit_recovers_latency_and_bandwidth_from_noisy_points():
    rng = np.random.default_rng(0)
    points = [(b, (2e-6 + b / 1.2e10) * (1 + rng.uniform(-0.02, 0.02))) for b in SIZES for _ in range(3)]
    fit = fit_link(points)
    assert fit.latency_s == pytest.approx(2e-6, rel=0.05)
    assert fit.bandwidth == pytest.approx(1.2e10, rel=0.05)
    assert 0 < fit.max_relative_error <= 0.05


def test_fit_never_gives_a_negative_latency():
    fit = fit_link([(b, b / 1e10 - 1e-7) for b in SIZES[2:]])
    assert fit.latency_s == 0.0
    assert fit.bandwidth == pytest.approx(1e10, rel=0.02)


@pytest.mark.parametrize(
    "points, words",
    [
        ([(4096, 1e-6)], "at least two sizes"),
        ([(4096, 1e-6), (4096, 2e-6)], "at least two sizes"),
        ([(4096, 2e-5), (1 << 20, 1e-5), (1 << 24, 5e-6)], "do not grow"),
    ],
)
def test_fit_refuses_points_without_a_bandwidth(points, words):
    with pytest.raises(OffloadError, match=words):
        fit_link(points)


@pytest.mark.parametrize(
    "tensors, expected",
    [
        ([100, 20_000], (4096, 65536)),  # spans the tensors, rounded down and up to the grid, up to 64 KiB
        ([5000, 6000], (4096, 65536)),
        ([5000, 100_000], (4096, 262144)),
        ([1 << 30], (16384, 262144)),  # beyond the sweep: the last three sizes
        ([], (4096, 262144)),  # no sizes known: all of it
    ],
)
def test_fit_range_spans_the_model_tensors(tensors, expected):
    assert fit_range([4096, 16384, 65536, 262144], tensors) == expected
    assert fit_range([256, 1024, 4096, 16384, 65536], [64]) == (256, 65536)  # small tensors: up to 64 KiB


@pytest.mark.parametrize(
    "durations, total, expected",
    [
        ([1.0, 2.0, 3.0], 9.0, 1.0),  # every node gets 1 more
        ([1.0, 2.0, 3.0], 3.0, -1.0),  # 0 + 1 + 2
        ([1.0, 2.0, 3.0], 1.0, -2.0),  # only the longest node keeps time
        ([1.0, 2.0, 3.0], 0.0, -3.0),
        ([], 5.0, 0.0),
    ],
)
def test_node_overhead_makes_the_nodes_add_up_to_the_latency(durations, total, expected):
    offset = node_overhead_for(durations, total)
    assert offset == pytest.approx(expected, abs=1e-9)
    if durations:
        assert sum(max(t + offset, 0) for t in durations) == pytest.approx(max(total, 0), abs=1e-9)
