"""Helpers for the replay tests: transition batches, cores and a ReplayServer running in a thread."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import zmq

from flywheel import proto
from flywheel.services.replay.core import ReplayConfig, ReplayCore
from flywheel.services.replay.transport import ReplayServer
from flywheel.transport import ControlSubscriber, FaultCounter, TelemetryReporter

OBS_SHAPE = (4,)


def transitions(start: int, count: int, *, obs_shape: tuple[int, ...] = OBS_SHAPE, dtype: str = "float32",
                priority: np.ndarray | None = None, seq: int = 0) -> proto.TransitionBatch:
    """A batch whose rows are tagged with ids start..start+count-1 (in action, reward and obs[:, 0])."""
    ids = np.arange(start, start + count)
    obs = np.zeros((count, *obs_shape), dtype=dtype)
    obs.reshape(count, -1)[:, 0] = ids % 256 if dtype == "uint8" else ids
    return proto.TransitionBatch(
        actor="test", weight_version=1, seq=seq, obs=obs, action=ids.astype(np.int64),
        reward=ids.astype(np.float32), discount=np.full(count, 0.97, dtype=np.float32), next_obs=obs + 1,
        priority=None if priority is None else np.asarray(priority, dtype=np.float32),
    )


def make_core(capacity: int = 16, **overrides: object) -> ReplayCore:
    config = ReplayConfig(capacity=capacity, min_size_to_sample=1, seed=0)
    for key, value in overrides.items():
        setattr(config, key, value)
    return ReplayCore(config)


@dataclass
class RunningServer:
    """A ReplayServer on ephemeral loopback ports, its context and the endpoints to connect to."""

    server: ReplayServer
    ctx: zmq.Context
    transitions: str
    sample: str
    faults: FaultCounter


@contextmanager
def running_server(core: ReplayCore, **kwargs: object) -> Iterator[RunningServer]:
    """Run ``server.run()`` in a thread on tcp://127.0.0.1:* ports; stop and close on exit."""
    ctx = zmq.Context()
    faults = FaultCounter("replay")
    telemetry = TelemetryReporter(ctx, "inproc://telemetry-sink", "replay", "test", 3600.0)
    control = ControlSubscriber(ctx, "inproc://control-source", "replay", "test", faults)
    server = ReplayServer(core, ctx, transitions_bind="tcp://127.0.0.1:*", sample_bind="tcp://127.0.0.1:*",
                          telemetry=telemetry, control=control, faults=faults, **kwargs)  # type: ignore[arg-type]
    endpoints = (server.pull.getsockopt_string(zmq.LAST_ENDPOINT), server.router.getsockopt_string(zmq.LAST_ENDPOINT))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        yield RunningServer(server, ctx, endpoints[0], endpoints[1], faults)
    finally:
        server.stop()
        thread.join(10)
        assert not thread.is_alive(), "replay server did not stop"
        server.close()
        telemetry.close()
        control.close()
        ctx.term()
