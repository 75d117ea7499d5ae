"""The learner loop fed by a real replay server over real sockets: shared memory on one host, TCP otherwise."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import torch
import zmq

from flywheel import proto
from flywheel.services.learner.core import CoreConfig, LearnerCore
from flywheel.services.learner.loop import LearnerLoop, LoopConfig
from flywheel.services.learner.sampling import FeedConfig
from flywheel.services.learner.settings import LearnerSettings
from flywheel.services.learner.staging import BatchStager
from flywheel.services.learner.transport import open_feeder, open_sockets
from flywheel.services.replay.core import ReplayConfig, ReplayCore
from flywheel.services.replay.shm import SHM_DIR, ShmSlots
from flywheel.services.replay.transport import ReplayServer
from flywheel.transport import ControlSubscriber, FaultCounter, TelemetryReporter

pytestmark = [pytest.mark.timeout(120), pytest.mark.skipif(not SHM_DIR.is_dir(), reason="needs /dev/shm")]
OBS = (4, 8, 8)  # 4-frame uint8 stacks: the replay keeps each frame once (the compact TCP form applies)


def pixel_rows(rng: np.random.Generator, count: int, start: int) -> proto.TransitionBatch:
    """``count`` consecutive steps of one env: stack t is frames t..t+3, its next stack (3-step) frames t+3..t+6."""
    frames = rng.integers(0, 256, (count + 7, *OBS[1:]), dtype=np.uint8)
    frames[:, 0, 0] = (start + np.arange(count + 7)) % 256
    obs = np.stack([frames[t:t + 4] for t in range(count)])
    next_obs = np.stack([frames[t + 3:t + 7] for t in range(count)])
    return proto.TransitionBatch(
        actor="actor-0", weight_version=0, seq=start, obs=obs, action=rng.integers(0, 2, count),
        reward=rng.standard_normal(count).astype(np.float32), discount=np.full(count, 0.9, np.float32),
        next_obs=next_obs, stream=np.zeros(count, np.int64))


@contextmanager
def replay_server(shm: ShmSlots | None) -> Iterator[tuple[ReplayServer, str]]:
    """A filled ReplayServer looping in a thread; yields it and its sample endpoint."""
    core = ReplayCore(ReplayConfig(capacity=512, min_size_to_sample=64, seed=0))
    rng = np.random.default_rng(0)
    for start in range(0, 400, 50):
        core.insert(pixel_rows(rng, 50, start))
    ctx = zmq.Context()
    faults = FaultCounter("replay")
    telemetry = TelemetryReporter(ctx, "inproc://replay-telemetry", "replay", "test", 3600.0)
    control = ControlSubscriber(ctx, "inproc://replay-control", "replay", "test", faults)
    server = ReplayServer(core, ctx, transitions_bind="tcp://127.0.0.1:*", sample_bind="tcp://127.0.0.1:*",
                          telemetry=telemetry, control=control, faults=faults, shm=shm)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        yield server, server.router.getsockopt_string(zmq.LAST_ENDPOINT)
    finally:
        server.stop()
        thread.join(10)
        server.close()
        telemetry.close()
        control.close()
        ctx.term()


def run_learner(endpoint: str, tmp_path: Path, transport: str, updates: int = 12,
                ) -> tuple[LearnerLoop, int, str]:
    """A learner loop on ``endpoint`` until ``updates`` updates; returns it (closed), its exit code and the path
    its batches came by at the end."""
    torch.manual_seed(0)
    ctx = zmq.Context()
    settings = LearnerSettings(
        instance="learner-test", env_id="pixels-test", batch_size=16, requests_in_flight=2, max_updates=updates,
        sample_endpoint=endpoint, sample_transport=transport, telemetry_endpoint="inproc://learner-telemetry",
        control_endpoint="inproc://learner-control", weights_bind="inproc://learner-weights",
        telemetry_interval_s=60, torch_threads=1)
    core = LearnerCore(OBS, 2, CoreConfig(lr=1e-3))
    loop = LearnerLoop(LoopConfig.of(settings), core, open_sockets(settings, core, ctx))
    try:
        code = loop.run()
        path = loop.sampler.path
    finally:
        loop.close()
        ctx.term()
    return loop, code, path


def test_same_host_learner_trains_on_shared_memory_batches(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="flywheel.replay.client"), replay_server(ShmSlots()) as (replay, end):
        service, code, path = run_learner(end, tmp_path, "auto")
        got = service.sampler.counters
        assert code == 0 and service.core.steps == 12
        assert got.shm_batches_total >= 8 and got.tcp_batches_total <= 4  # the offer comes inline first
        assert got.sample_batches_total == got.shm_batches_total + got.tcp_batches_total
        assert replay.counters.shm_batches_total >= got.shm_batches_total
        assert replay.counters.shm_slots_exhausted_total == 0  # 2 x requests_in_flight slots suffice
        assert any("sampling through shared memory" in r.getMessage() for r in caplog.records)
        assert path == "shm" and not service.sampler.held  # every batch handed back


def test_tcp_learner_gets_compact_pixel_batches(tmp_path: Path) -> None:
    with replay_server(ShmSlots()) as (replay, endpoint):
        service, code, path = run_learner(endpoint, tmp_path, "tcp")
        got = service.sampler.counters
        assert code == 0 and service.core.steps == 12
        assert got.shm_batches_total == 0 and got.tcp_batches_total >= 12
        assert got.compact_batches_total == got.tcp_batches_total  # distinct frames + indices, rebuilt
        assert replay.shm is not None and replay.shm.clients == {}  # never offered a segment
        assert path == "tcp"


def test_insisting_on_shared_memory_from_another_host_stops_the_learner(tmp_path: Path,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    # The replay writes its segments where this learner cannot find them: as if it ran on another host.
    with caplog.at_level(logging.ERROR, logger="flywheel.learner"), \
            replay_server(ShmSlots(directory=tmp_path)) as (_replay, endpoint):
        service, code, _path = run_learner(endpoint, tmp_path, "shm")
    assert code == 1 and service.core.steps == 0
    assert any("cannot attach the replay's shared memory" in r.getMessage() for r in caplog.records)


def test_cpu_staging_copies_shared_batches_and_keeps_views_of_owned_ones() -> None:
    rng = np.random.default_rng(1)
    obs = rng.integers(0, 256, (8, *OBS), dtype=np.uint8)
    batch = proto.SampleBatch(request_id=1, replay_size=8, obs=obs, action=np.zeros(8, np.int64),
                              reward=np.zeros(8, np.float32), discount=np.ones(8, np.float32), next_obs=obs.copy(),
                              index=np.arange(8), weight=np.ones(8, np.float32))
    stager = BatchStager(torch.device("cpu"))
    copied = stager.stage(batch, shared=True)
    assert not np.shares_memory(copied.obs.numpy(), obs) and np.array_equal(copied.obs.numpy(), obs)
    assert np.shares_memory(stager.stage(dataclasses.replace(batch)).obs.numpy(), obs)  # TCP batches: no copy


def test_cpu_learner_trains_on_views_of_the_shared_slot_and_hands_it_back_after_the_update() -> None:
    """On a CPU a shared-memory batch is not copied: the staged tensors are views of the replay's slot, leased
    until the update loop hands back its priorities; batches queued but never trained on go back at stop."""
    with replay_server(ShmSlots()) as (replay, endpoint):
        ctx = zmq.Context()
        settings = LearnerSettings(
            instance="learner-test", env_id="pixels-test", batch_size=16, requests_in_flight=2,
            sample_endpoint=endpoint, sample_transport="shm", control_endpoint="inproc://learner-control")
        core = LearnerCore(OBS, 2, CoreConfig(lr=1e-3))
        feeder = open_feeder(FeedConfig.of(settings), core, ctx, FaultCounter("learner"))
        feeder.start()
        try:
            leased = None
            for _ in range(200):  # the first replies carry the offer inline; then batches come in slots
                ready = feeder.take(1000)
                assert ready is not None
                if ready.lease is None:
                    feeder.done(ready, torch.ones(16))
                    continue
                leased = ready
                break
            assert leased is not None and leased.lease is not None
            batch = leased.lease.batch
            assert np.shares_memory(leased.tensors.obs.numpy(), batch.obs)  # trained on in place, no copy
            assert batch.request_id in feeder.client.held  # the replay may not reuse the slot yet
            core.update(leased.tensors)
            feeder.done(leased, torch.ones(16))
            deadline = time.monotonic() + 10
            while batch.request_id in feeder.client.held and time.monotonic() < deadline:
                time.sleep(0.01)
            assert batch.request_id not in feeder.client.held
        finally:
            feeder.close()
            ctx.term()
        assert not feeder.client.held  # queued, never trained on: handed back at stop
        assert replay.counters.shm_batches_total >= 1
