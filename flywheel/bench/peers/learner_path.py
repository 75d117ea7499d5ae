"""The learner's own data path as a benchmark sampler: its ReplayClient, Feeder and staging in a pinned process."""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from flywheel.services.learner.settings import LearnerSettings

from .cpu_clock import SideClock
from .replay_harness import spawned_result

MARIO_OBS, MARIO_ACTIONS = (4, 84, 84), 7
WARMUP_BATCHES = 3  # the first replies carry the shared-memory offer


def learner_settings(endpoint: str, transport: str, batch: int, inflight: int, packed: bool = True
                     ) -> LearnerSettings:
    """LearnerSettings of a CPU learner sampling ``batch``-row batches from ``endpoint`` over ``transport``; its
    other endpoints are in-process ones nobody uses (the data path opens only the replay client)."""
    return LearnerSettings.model_validate({
        "instance": "bench-learner-path", "env_id": "bench", "batch_size": batch, "requests_in_flight": inflight,
        "sample_endpoint": endpoint, "sample_transport": transport, "control_endpoint": "inproc://unused-control",
        "telemetry_endpoint": "inproc://unused", "weights_bind": "inproc://unused-weights", "device": "cpu",
        "torch_threads": 1, "sample_packed": packed})


def learner_path_main(endpoint: str, transport: str, batch: int, seconds: float, cpus: list[int], result: Any,
                      inflight: int = 4, side_pids: tuple[int, ...] = (), obs_shape: tuple[int, ...] = MARIO_OBS,
                      n_actions: int = MARIO_ACTIONS, packed: bool = True) -> None:
    """Sample for ``seconds`` through the learner service's data path (transport.open_feeder: ReplayClient,
    Feeder with its I/O thread for pixels, core.check_batch, the CPU stager), taking ready batches as the update
    loop does and handing back random |TD| priorities at once, with no training in between. CPU-seconds are
    those of this process (every thread) and ``side_pids`` (the replay) over the same window."""
    import torch
    import zmq

    from flywheel.services.learner.core import CoreConfig, LearnerCore
    from flywheel.services.learner.sampling import FeedConfig
    from flywheel.services.learner.transport import open_feeder
    from flywheel.transport import FaultCounter

    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus)  # before any thread starts: they inherit it
    torch.set_num_threads(1)  # the data path does no torch compute; no idle pool threads to count
    settings = learner_settings(endpoint, transport, batch, inflight, packed)
    core = LearnerCore(obs_shape, n_actions, CoreConfig(), "cpu")  # its check_batch and stager, as the service's
    ctx = zmq.Context()
    faults = FaultCounter("learner")
    feeder = open_feeder(FeedConfig.of(settings), core, ctx, faults)  # beta_start: the annealed beta at update 0
    rng = np.random.default_rng(0)
    clock = SideClock([os.getpid(), *side_pids])
    counts = {"batches": 0, "rows": 0}

    def turn(timeout_ms: int) -> bool:
        """One update-loop turn without the update: a ready batch gets random priorities back at once."""
        if feeder.error is not None:
            raise SystemExit(f"the learner's sampling failed: {feeder.error}")
        ready = feeder.take(timeout_ms)
        if ready is not None:
            rows = int(ready.index.shape[0])
            feeder.done(ready, torch.from_numpy(rng.uniform(0.1, 2, rows).astype(np.float32)))
            counts["batches"] += 1
            counts["rows"] += rows
        return ready is not None

    try:
        feeder.start()
        deadline = time.monotonic() + 60
        warm = 0
        while warm < WARMUP_BATCHES:
            warm += turn(100)
            if time.monotonic() > deadline:
                raise SystemExit("no batch within 60 s")
        counts.update(batches=0, rows=0)
        start = time.monotonic()
        clock.start()
        while time.monotonic() - start < seconds:
            turn(100)
        rates = clock.rates(counts["batches"]) | {"path": feeder.client.path}  # closing drops the segment
    finally:
        feeder.close()  # the priorities still queued are sent first
        ctx.term()
    c = feeder.client.counters
    result.put(rates | {"shm": int(c.shm_batches_total), "tcp": int(c.tcp_batches_total),
                        "compact": int(c.compact_batches_total), "packed": int(c.packed_batches_total),
                        "rows": counts["rows"], "priority_messages": int(c.priority_updates),
                        "faults": faults.total})


def learner_path_run(endpoint: str, transport: str, batch: int, seconds: float, cpus: list[int], inflight: int = 4,
                     side_pids: tuple[int, ...] = (), obs_shape: tuple[int, ...] = MARIO_OBS,
                     n_actions: int = MARIO_ACTIONS, packed: bool = True) -> dict[str, Any]:
    """``learner_path_main`` in its own process; returns its batches per second (``rate``) and per CPU-second
    of it and ``side_pids`` (``rate_per_cpu``) and its path counters."""
    return spawned_result(learner_path_main, lambda result: (
        endpoint, transport, batch, seconds, cpus, result, inflight, tuple(side_pids), obs_shape, n_actions, packed),
        seconds + 180, f"learner data path ({transport})")
