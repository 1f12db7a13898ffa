"""Sessions timed side by side: a session configured as `offloadctl run --opt-level disable` configures
it (`Device.runner`), run once per call (`Runner.run`), and several of them taking turns under the same
machine load (`alternate`). The profiler and the benchmarks time with these.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from offloadctl.core.errors import OffloadError
from offloadctl.running.kernels import KernelEvent, kernel_runs
from offloadctl.running.sessions import create_session, feeds_for, import_onnxruntime, session_config, timed_run

__all__ = ["MIN_SECONDS", "Device", "Runner", "alternate", "alternate_runners"]

MIN_SECONDS = 0.5  # fast models get more runs than the repeat asked for, until this much time has passed
_MAX_ROUNDS_FACTOR = 20
_BLOCK_SECONDS = 0.05  # sessions timed side by side take turns in blocks this long


class Device:
    """Sessions on one device, configured as `offloadctl run --opt-level disable` configures them."""

    def __init__(self, device: str, ep_options: Mapping[str, str] | None, folder: Path, threads: int = 0) -> None:
        self.device = device
        self.ort = import_onnxruntime(device)
        self.ep_options = dict(ep_options or {})
        self.folder = folder
        self.threads = threads
        self.profiles = 0

    def runner(
        self,
        path: str,
        feeds: Mapping[str, np.ndarray],
        settings: Mapping[str, Any] | None = None,
        *,
        profiled: bool,
        node_stats: Path | None = None,
        opt_level: str = "disable",
        optimized: Path | None = None,
    ) -> Runner:
        config = session_config(
            settings or {}, self.device, opt_level=opt_level, ep_options=self.ep_options, ort=self.ort
        )
        config.sess_options.intra_op_num_threads = self.threads
        if optimized is not None:  # the graph onnxruntime runs, saved as it creates the session
            config.sess_options.optimized_model_filepath = str(optimized)
            config.sess_options.add_session_config_entry(
                "session.optimized_model_external_initializers_file_name", optimized.name + ".data"
            )
        if node_stats is not None:  # kernel scratch per node, written when the session ends
            config.sess_options.add_session_config_entry("session.collect_node_memory_stats_to_file", str(node_stats))
        if profiled:
            self.profiles += 1
            config.sess_options.enable_profiling = True
            config.sess_options.profile_file_prefix = str(self.folder / f"profile{self.profiles}")
        session = create_session(path, config, self.device, ort=self.ort)
        return Runner(session, feeds_for(session, feeds, path, "the inputs"), path, self.ort)


class Runner:
    """One session with its feeds: ``run()`` runs it once and returns the wall-clock seconds."""

    def __init__(self, session: Any, feeds: dict[str, np.ndarray], path: str, ort: Any) -> None:
        self.session, self.feeds, self.path, self.ort = session, feeds, path, ort

    def run(self) -> float:
        return timed_run(self.session, self.feeds, self.path, self.ort)

    def kernels(self) -> list[list[KernelEvent]]:
        """Kernel events of every run but the first (the warm-up), from the session's profiling file."""
        profile_file = self.session.end_profiling()
        if not profile_file:  # pragma: no cover - onnxruntime always writes one when asked
            raise OffloadError(
                f"onnxruntime wrote no profile for {self.path}", hint="check the onnxruntime installation"
            )
        return kernel_runs(profile_file)


def alternate(
    calls: Sequence[Callable[[], float]],
    repeat: int,
    *,
    min_seconds: float | None = None,
    block_seconds: float | None = None,
) -> list[list[float]]:
    """Time several sessions side by side: each call runs one session once and returns its seconds.

    After one warm-up run each, the sessions take turns in blocks of about ``block_seconds``, so
    that all see the same machine load, until each has ``repeat`` timed
    runs and ``min_seconds`` have passed (fast models get more runs, at most
    ``_MAX_ROUNDS_FACTOR * repeat``). Blocks, not single runs: a session's thread pool spins for a
    while after its run, and would slow the next session's run if turns were run by run; the first
    run of each block (after another session's block) is not timed.

    Returns:
        The seconds of every timed run, per session.
    """
    min_seconds = MIN_SECONDS if min_seconds is None else min_seconds
    block_seconds = _BLOCK_SECONDS if block_seconds is None else block_seconds
    warm = [call() for call in calls]
    limit = _MAX_ROUNDS_FACTOR * repeat
    blocks = [max(1, min(limit, int(block_seconds / max(t, 1e-9)))) for t in warm]
    times: list[list[float]] = [[] for _ in calls]
    start = time.perf_counter()
    while any(len(t) < repeat for t in times) or (
        time.perf_counter() - start < min_seconds and all(len(t) < limit for t in times)
    ):
        for k, call in enumerate(calls):
            if len(calls) > 1:
                call()
            for _ in range(blocks[k]):
                times[k].append(call())
    return times


def alternate_runners(runners: Sequence[Runner], repeat: int, *, min_seconds: float | None = None) -> list[list[float]]:
    return alternate([r.run for r in runners], repeat, min_seconds=min_seconds)
