"""Frame-deduplicated storage: stacks rebuilt byte for byte, never mixing episodes, evictions keep refs valid."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from replay_helpers import ActorStreams, assert_stored_as_sent, make_core

from flywheel import proto
from flywheel.services.replay.frames import FrameStore
from flywheel.services.replay.storage import frame_layout


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    envs=st.integers(1, 4), depth=st.integers(1, 4), n_step=st.integers(1, 4), longest=st.integers(1, 15),
    capacity=st.integers(4, 80), frame_ratio=st.floats(0.3, 2.0), static=st.sampled_from([0.0, 0.3, 0.9]),
    stream_ids=st.sampled_from(["env", "none", "random"]), batches=st.lists(st.integers(1, 40), min_size=1,
                                                                             max_size=12),
    seed=st.integers(0, 2**16),
)
def test_every_live_transition_rebuilds_what_was_sent(
    envs: int, depth: int, n_step: int, longest: int, capacity: int, frame_ratio: float, static: float,
    stream_ids: str, batches: list[int], seed: int,
) -> None:
    streams = ActorStreams(envs, depth, n_step, episode=(1, longest), static=static, seed=seed,
                           stream_ids=stream_ids)
    core = make_core(capacity, frame_ratio=frame_ratio)
    for rows in batches:
        core.insert(streams.batch(rows))
        storage = core.storage
        # (H, W) and (K, H, W) uint8 rows that name their stream are kept as frames, other rows whole
        assert (storage.frames is None) == (stream_ids == "none")
        assert 0 < storage.size <= capacity
        assert storage.oldest <= storage.next_position == streams.position
        assert_stored_as_sent(core, streams.sent)
        batch = core.sample(16, beta=0.5)
        for i, position in enumerate(batch.index):
            obs, next_obs = streams.sent[int(position)]
            assert np.array_equal(batch.obs[i], obs) and np.array_equal(batch.next_obs[i], next_obs)


def test_in_order_streams_store_about_one_frame_per_transition() -> None:
    streams = ActorStreams(envs=8, depth=4, n_step=3, frame=(12, 12), episode=(100, 200), seed=1)
    core = make_core(4000, frame_ratio=1.2)
    for _ in range(40):
        core.insert(streams.batch(128))
    storage = core.storage
    assert storage.size == 4000 and storage.frames_evicted == 0
    # An episode of L steps has L + 1 distinct frames for L transitions: ~1.007 here, 8 if stacks were whole.
    assert storage.frames_stored / storage.size < 1.05
    assert storage.frames.collisions == 0
    assert_stored_as_sent(core, streams.sent)


def test_static_frames_are_shared_without_mixing_episodes() -> None:
    streams = ActorStreams(envs=2, depth=4, n_step=2, episode=(5, 30), static=0.8, seed=2)
    core = make_core(500)
    for _ in range(20):
        core.insert(streams.batch(30))
    assert core.storage.frames_stored < core.storage.size  # repeated frames are kept once
    assert_stored_as_sent(core, streams.sent)


def test_small_frame_ring_evicts_oldest_transitions_first() -> None:
    streams = ActorStreams(envs=3, depth=4, n_step=3, episode=(1, 4), seed=3)  # short episodes: many frames
    core = make_core(400, frame_capacity=300)
    for _ in range(40):
        core.insert(streams.batch(20))
        assert_stored_as_sent(core, streams.sent)
    storage = core.storage
    assert storage.size < 400 and storage.frames_evicted > 0
    assert storage.frames_stored <= 300


def test_fingerprint_collisions_cost_space_not_correctness(monkeypatch: pytest.MonkeyPatch) -> None:
    # Every frame gets the same key: each proposed match is wrong and must be caught by the byte comparison.
    monkeypatch.setattr(FrameStore, "fingerprint", lambda self, frames, key: np.zeros(len(frames), np.uint64))
    streams = ActorStreams(envs=3, depth=4, n_step=3, episode=(2, 10), seed=4)
    core = make_core(200, frame_ratio=8.0)
    for _ in range(10):
        core.insert(streams.batch(25))
        assert_stored_as_sent(core, streams.sent)
    assert core.storage.frames.collisions > 0


def test_two_actors_with_the_same_stream_ids_do_not_mix() -> None:
    a = ActorStreams(envs=2, depth=4, n_step=3, episode=(3, 9), seed=5)
    b = ActorStreams(envs=2, depth=4, n_step=3, episode=(3, 9), seed=6)
    core = make_core(600)
    sent: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for _ in range(10):
        for streams, actor in ((a, "actor-a"), (b, "actor-b")):
            batch = streams.batch(10, actor=actor)
            start = core.storage.next_position
            batch.action = np.arange(start, start + len(batch))
            for i in range(len(batch)):
                sent[start + i] = (batch.obs[i], batch.next_obs[i])
            core.insert(batch)
    assert_stored_as_sent(core, sent)


def test_frame_layout_rules() -> None:
    assert frame_layout((4, 84, 84), np.dtype(np.uint8)) == (4, (84, 84))
    assert frame_layout((84, 84), np.dtype(np.uint8)) == (1, (84, 84))
    assert frame_layout((4, 84, 84), np.dtype(np.float32)) is None  # float pixels: stored whole
    assert frame_layout((4,), np.dtype(np.uint8)) is None
    assert frame_layout((32, 8, 8), np.dtype(np.uint8)) is None  # not a frame stack
    assert frame_layout((4, 4, 4), np.dtype(np.uint8)) is None  # frames too small to be worth it


@pytest.mark.parametrize("dedup, stream_ids", [(False, "env"), (True, "none")])
def test_without_dedup_or_streams_pixels_are_stored_whole(dedup: bool, stream_ids: str) -> None:
    streams = ActorStreams(envs=2, depth=4, n_step=3, seed=7, stream_ids=stream_ids)
    core = make_core(100, dedup_frames=dedup)
    core.insert(streams.batch(30))
    assert core.storage.frames is None and "obs" in core.storage.arrays
    assert_stored_as_sent(core, streams.sent)
    state = {k: np.array(v) for k, v in core.state_dict().items()}
    restored = make_core(100)
    restored.load_state_dict(state)
    assert restored.storage.frames is None
    assert_stored_as_sent(restored, streams.sent)


def test_checkpoint_state_round_trip_with_frames() -> None:
    streams = ActorStreams(envs=3, depth=4, n_step=3, episode=(2, 20), seed=8)
    core = make_core(150, frame_ratio=1.5, seed=3)
    for _ in range(15):
        core.insert(streams.batch(20))
    state = {k: (np.concatenate(v) if isinstance(v, list) else np.array(v)) for k, v in core.state_dict().items()}
    restored = make_core(150, frame_ratio=1.5, seed=3)
    restored.load_state_dict(state)
    assert restored.size == core.size and restored.storage.frames.head == core.storage.frames.head
    assert_stored_as_sent(restored, streams.sent)
    for _ in range(5):  # inserts after the restore reuse the restored frames and keep everything valid
        restored.insert(streams.batch(20))
        assert_stored_as_sent(restored, streams.sent)
    other = make_core(150, frame_ratio=1.0)
    with pytest.raises(ValueError, match="frame"):
        other.load_state_dict(state)
    bad = dict(state)
    bad["storage.obs_ref"] = bad["storage.obs_ref"] + 10**6
    with pytest.raises(ValueError, match="outside"):
        make_core(150, frame_ratio=1.5).load_state_dict(bad)


def test_sample_batch_shapes_for_single_frames() -> None:
    streams = ActorStreams(envs=2, depth=1, n_step=2, seed=9)
    core = make_core(50)
    core.insert(streams.batch(20))
    batch = core.sample(8, 0.4)
    assert isinstance(batch, proto.SampleBatch) and batch.obs.shape == (8, 8, 8) and batch.obs.dtype == np.uint8
    assert_stored_as_sent(core, streams.sent)


@pytest.mark.parametrize("threads", [1, 2])
def test_big_batches_gathered_in_two_threads_are_exact(threads: int) -> None:
    streams = ActorStreams(envs=4, depth=4, n_step=3, frame=(84, 84), episode=(10, 60), seed=13)
    core = make_core(400, gather_threads=threads)
    core.insert(streams.batch(300))
    assert (core.helper is not None) == (threads == 2)
    batch = core.sample(256, 0.4)  # 7 MB of observations: above the two-thread threshold
    for i, position in enumerate(batch.index):
        obs, next_obs = streams.sent[int(position)]
        assert np.array_equal(batch.obs[i], obs) and np.array_equal(batch.next_obs[i], next_obs)
