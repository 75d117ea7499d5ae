"""The compact form of pixel batches: each distinct frame once plus stack indices, rebuilt byte for byte."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from replay_helpers import ActorStreams, assert_demo_and_actor_rows, first_reply_tampered, make_core, running_server

from flywheel import proto
from flywheel.services.replay.client import ReplayClient
from flywheel.services.replay.shm import ShmSlots
from flywheel.transport import FaultCounter


def round_trip(batch: proto.SampleBatch) -> proto.SampleBatch:
    """Through the codec and back, then rebuilt as a client does."""
    frames = [bytes(memoryview(f)) for f in proto.encode(batch)]
    decoded = proto.decode(frames, expect=proto.SampleBatch)
    decoded.expand_frames()
    return decoded


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(envs=st.integers(1, 4), depth=st.integers(1, 4), n_step=st.integers(1, 4), longest=st.integers(1, 15),
       capacity=st.integers(8, 80), static=st.sampled_from([0.0, 0.5]), rows=st.integers(1, 48),
       seed=st.integers(0, 2**16))
def test_compact_batches_rebuild_exactly_the_stacks_that_were_sent(
    envs: int, depth: int, n_step: int, longest: int, capacity: int, static: float, rows: int, seed: int,
) -> None:
    streams = ActorStreams(envs, depth, n_step, episode=(1, longest), static=static, seed=seed)
    core = make_core(capacity)
    for _ in range(5):  # evictions for frames may keep a small replay below its capacity: insert a fixed amount
        core.insert(streams.batch(10))
    assert core.compact_ready
    compact = core.sample_compact(rows, beta=0.5, request_id=7)
    refs = 2 * rows * depth
    assert compact.frames is not None and compact.frames.shape[0] <= refs
    assert compact.obs.shape == (rows, 0) and compact.obs_idx.shape == ((rows, depth) if depth > 1 else (rows,))
    batch = round_trip(compact)
    assert batch.frames is None and batch.obs.shape == (rows, *core.obs_schema[0])
    for i, position in enumerate(batch.index):
        obs, next_obs = streams.sent[int(position)]
        assert np.array_equal(batch.obs[i], obs) and np.array_equal(batch.next_obs[i], next_obs)


def test_stacks_share_frames_so_fewer_travel() -> None:
    streams = ActorStreams(envs=2, depth=4, n_step=3, frame=(16, 16), episode=(50, 80), seed=3)
    core = make_core(400)
    while core.size < 300:
        core.insert(streams.batch(40))
    compact = core.sample_compact(64, beta=0.4)
    assert compact.frames.shape[0] <= 7 * 64  # a stack and its 3-step next stack share one frame
    whole = core.sample(64, beta=0.4)
    sent = sum(a.nbytes for a in (compact.frames, compact.obs_idx, compact.next_idx))
    assert sent < 0.9 * (whole.obs.nbytes + whole.next_obs.nbytes)


def test_demonstration_rows_index_their_own_frames() -> None:
    streams = ActorStreams(envs=2, depth=4, n_step=2, frame=(8, 8), episode=(5, 10), seed=4)
    core = make_core(64, demo_ratio=0.25)
    while core.size < 40:
        core.insert(streams.batch(10))
    rng = np.random.default_rng(5)
    demo_obs = rng.integers(0, 256, (12, 4, 8, 8), dtype=np.uint8)
    demo_next = rng.integers(0, 256, (12, 4, 8, 8), dtype=np.uint8)
    core.load_demos(12, (4, 8, 8), np.uint8, [proto.Transition(
        obs=demo_obs, action=np.arange(12) + 1000, reward=np.zeros(12, np.float32),
        discount=np.full(12, 0.9, np.float32), next_obs=demo_next)])
    assert core.compact_ready
    assert_demo_and_actor_rows(round_trip(core.sample_compact(16, beta=0.4)), demo_obs, demo_next, streams, demos=4)


def valid_compact(rows: int = 4) -> proto.SampleBatch:
    rng = np.random.default_rng(0)
    return proto.SampleBatch(
        request_id=1, replay_size=100, obs=np.empty((rows, 0), np.uint8), action=np.zeros(rows, np.int64),
        reward=np.zeros(rows, np.float32), discount=np.ones(rows, np.float32), next_obs=np.empty((rows, 0), np.uint8),
        index=np.arange(rows, dtype=np.int64), weight=np.ones(rows, np.float32),
        frames=rng.integers(0, 256, (6, 8, 8), dtype=np.uint8),
        obs_idx=np.tile(np.arange(4), (rows, 1)), next_idx=np.tile(np.arange(2, 6), (rows, 1)))


@pytest.mark.parametrize(("change", "message"), [
    ({"next_idx": None}, "come together"),
    ({"frames": None, "obs_idx": None}, "come together"),
    ({"obs": np.zeros((4, 4, 8, 8), np.uint8), "next_obs": np.zeros((4, 4, 8, 8), np.uint8)}, "placeholders"),
    ({"next_idx": np.tile(np.arange(3), (4, 1))}, "differ"),
    ({"obs_idx": np.full((4, 4), 6)}, "outside 0..5"),
    ({"next_idx": np.full((4, 4), -1)}, "outside 0..5"),
    ({"frames": np.zeros((33, 8, 8), np.uint8)}, "33 frames for 16"),
    ({"shm": {"slot": 0}}, "placeholders and no slot"),
])
def test_malformed_compact_batches_are_refused(change: dict, message: str) -> None:
    bad = dataclasses.replace(valid_compact(), **change)
    with pytest.raises(proto.BadShape, match=message):
        bad.validate()


def test_a_compact_reply_with_bad_indices_is_counted_and_the_client_goes_on() -> None:
    """Indices are checked on decode, before any gather: a reply pointing outside its frames is a counted fault."""
    def reply(request: proto.SampleRequest) -> list:
        assert request.compact
        return proto.encode(dataclasses.replace(valid_compact(), request_id=request.request_id))

    def tamper(frames: list) -> list:  # obs_idx after encoding: index 200 into 6 frames
        position = [i for i, f in enumerate(frames) if isinstance(f, np.ndarray) and f.shape == (4, 4)][0]
        frames[position] = np.full((4, 4), 200, np.int64)
        return frames

    faults = FaultCounter("learner")
    got, client = first_reply_tampered(reply, tamper, faults)
    assert client.counters.bad_replies == 1 and faults.counts["sample:shape"] == 1
    assert len(got) == 1 and got[0].obs.shape == (4, 4, 8, 8) and client.outstanding == 0
    assert np.array_equal(got[0].next_obs[0], valid_compact().frames[2:6])


def test_old_clients_get_whole_stacks_new_ones_the_compact_form() -> None:
    streams = ActorStreams(envs=2, depth=4, n_step=3, frame=(16, 16), episode=(4, 30), seed=6)
    core = make_core(400)
    while core.size < 200:
        core.insert(streams.batch(40))
    with running_server(core, shm=ShmSlots()) as rs:
        for compact in (False, True):
            with ReplayClient(rs.sample, 16, inflight=2, transport="tcp", compact=compact) as client:
                for _ in range(3):
                    batch = client.poll(timeout_ms=10_000)
                    assert batch is not None and batch.frames is None
                    for i, position in enumerate(batch.index):
                        obs, next_obs = streams.sent[int(position)]
                        assert np.array_equal(batch.obs[i], obs) and np.array_equal(batch.next_obs[i], next_obs)
                    client.release(batch)
                assert client.counters.compact_batches_total == (3 if compact else 0)
                assert client.counters.tcp_batches_total == 3
        assert rs.server.counters.compact_batches_total >= 3  # the new client's, and only its
