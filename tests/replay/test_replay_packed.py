"""LZ4-packed frames (frame_packing=lz4): packed at rest, sent as blocks, unpacked byte for byte; bad blocks refused."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from replay_helpers import ActorStreams, assert_demo_and_actor_rows, first_reply_tampered, make_core, running_server

from flywheel import proto
from flywheel.services.replay.client import ReplayClient
from flywheel.services.replay.core import ReplayCore
from flywheel.services.replay.settings import ReplaySettings
from flywheel.transport import FaultCounter


class SparseStreams(ActorStreams):
    """ActorStreams whose frames compress as game screens do (a flat background, a stamp and a few random bytes),
    except a ``noisy`` share of pure noise that LZ4 cannot shrink into a slot."""

    def __init__(self, *args: object, noisy: float = 0.0, **kwargs: object) -> None:
        self.noisy = noisy
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def _frame(self, env: int) -> np.ndarray:
        frame = super()._frame(env)
        if self.rng.random() >= self.noisy:
            flat = frame.reshape(-1)
            flat[8:] = 90
            flat[8 + int(self.rng.integers(0, flat.size - 16)):][:6] = self.rng.integers(0, 256, 6, dtype=np.uint8)
        return frame


def round_trip(batch: proto.SampleBatch) -> proto.SampleBatch:
    """Through the codec and back, then unpacked and rebuilt as a client does."""
    frames = [bytes(memoryview(f)) for f in proto.encode(batch)]
    decoded = proto.decode(frames, expect=proto.SampleBatch)
    decoded.expand_frames()
    return decoded


def filled(streams: ActorStreams, capacity: int, batches: int = 5, **overrides: object) -> ReplayCore:
    core = make_core(capacity, pack_frames=True, **overrides)
    for _ in range(batches):  # evictions for frames may keep a small replay below its capacity: a fixed amount
        core.insert(streams.batch(10))
    return core


def assert_rows_are_what_was_sent(batch: proto.SampleBatch, streams: ActorStreams) -> None:
    for i, position in enumerate(batch.index):
        obs, next_obs = streams.sent[int(position)]
        assert np.array_equal(batch.obs[i], obs) and np.array_equal(batch.next_obs[i], next_obs)


def test_frames_pack_into_blocks_and_unpack_to_the_same_bytes() -> None:
    rng = np.random.default_rng(0)
    screens = np.full((5, 84, 84), 90, np.uint8)
    screens[:, 40:50, 10:30] = rng.integers(0, 256, (5, 10, 20), dtype=np.uint8)
    scratch = np.empty(proto.packing.pack_bound(84 * 84), np.uint8)
    blocks, sizes = [], []
    for screen in screens:
        size = proto.packing.pack_frame(screen, scratch)
        assert size < 84 * 84 // 4
        blocks.append(scratch[:size].copy())
        sizes.append(size)
    noise = rng.integers(0, 256, (84, 84), dtype=np.uint8)  # travels as itself
    payload = np.concatenate([*blocks, noise.reshape(-1)])
    out = proto.packing.unpack_frames(payload, np.array([*sizes, 84 * 84], np.int64), (84, 84))
    assert np.array_equal(out[:5], screens) and np.array_equal(out[5], noise)


def test_a_block_that_does_not_unpack_to_one_frame_is_malformed() -> None:
    screen = np.full((16, 16), 7, np.uint8)
    scratch = np.empty(proto.packing.pack_bound(256), np.uint8)
    size = proto.packing.pack_frame(screen, scratch)
    block = scratch[:size].copy()
    with pytest.raises(proto.MalformedMessage, match="packed frame 0"):
        proto.packing.unpack_frames(block, np.array([size], np.int64), (8, 8))  # a 256-byte block, 64-byte frames
    with pytest.raises(proto.MalformedMessage, match="packed frame 1"):
        garbage = np.full(size, 0xFF, np.uint8)
        proto.packing.unpack_frames(np.concatenate([block, garbage]), np.array([size, size], np.int64), (16, 16))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(envs=st.integers(1, 4), depth=st.integers(1, 4), n_step=st.integers(1, 4), longest=st.integers(1, 15),
       capacity=st.integers(8, 80), noisy=st.sampled_from([0.0, 0.3, 1.0]), rows=st.integers(1, 48),
       seed=st.integers(0, 2**16))
def test_packed_batches_rebuild_exactly_the_stacks_that_were_sent(
    envs: int, depth: int, n_step: int, longest: int, capacity: int, noisy: float, rows: int, seed: int,
) -> None:
    streams = SparseStreams(envs, depth, n_step, frame=(16, 16), episode=(1, longest), seed=seed, noisy=noisy)
    core = filled(streams, capacity)
    assert core.packed_ready
    packed = core.sample_compact(rows, beta=0.5, request_id=7, packed=True)
    assert packed.frames is None and packed.packing == {"codec": "lz4", "shape": "16,16"}
    assert packed.packed is not None and packed.packed_sizes is not None
    assert packed.packed.size == int(packed.packed_sizes.sum())
    batch = round_trip(packed)
    assert batch.frames is None and batch.packed is None and batch.obs.shape == (rows, *core.obs_schema[0])
    assert_rows_are_what_was_sent(batch, streams)


def test_screens_travel_in_far_fewer_bytes_and_noise_as_itself() -> None:
    streams = SparseStreams(envs=2, depth=4, n_step=3, frame=(32, 32), episode=(50, 80), seed=3, noisy=0.1)
    core = filled(streams, 400, batches=30)
    store = core.main.storage.frames
    assert store is not None and store.frames_unpackable > 0  # the noisy frames did not fit a slot
    assert store.nbytes >= store.frames.nbytes * 5 // 4  # the slots: a quarter frame each
    batch = core.sample_compact(64, beta=0.4, packed=True)
    unpacked = core.sample_compact(64, beta=0.4)
    assert batch.packed is not None and unpacked.frames is not None
    assert batch.packed.nbytes < 0.4 * unpacked.frames.nbytes
    assert np.any(batch.packed_sizes == 32 * 32)  # noise frames travel as themselves


def test_demonstration_frames_are_packed_too() -> None:
    streams = SparseStreams(envs=2, depth=4, n_step=2, frame=(8, 8), episode=(5, 10), seed=4)
    core = filled(streams, 64, demo_ratio=0.25)
    rng = np.random.default_rng(5)
    demo_obs = np.full((12, 4, 8, 8), 3, np.uint8)
    demo_obs[:, :, 0, 0] = rng.integers(0, 256, (12, 4), dtype=np.uint8)
    demo_next = rng.integers(0, 256, (12, 4, 8, 8), dtype=np.uint8)
    core.load_demos(12, (4, 8, 8), np.uint8, [proto.Transition(
        obs=demo_obs, action=np.arange(12) + 1000, reward=np.zeros(12, np.float32),
        discount=np.full(12, 0.9, np.float32), next_obs=demo_next)])
    assert core.packed_ready
    batch = round_trip(core.sample_compact(16, beta=0.4, packed=True))
    assert_demo_and_actor_rows(batch, demo_obs, demo_next, streams, demos=4)


def test_a_restored_replay_packs_the_frames_it_loads() -> None:
    streams = SparseStreams(envs=2, depth=4, n_step=3, frame=(16, 16), episode=(5, 30), seed=8)
    core = make_core(200)  # saved by a replay that did not pack
    for _ in range(10):
        core.insert(streams.batch(20))
    state = {k: (np.concatenate(v) if isinstance(v, list) else v) for k, v in core.state_dict().items()}
    restored = make_core(200, pack_frames=True)
    restored.load_state_dict(state)
    assert restored.packed_ready
    store = restored.main.storage.frames
    assert store is not None and store.packed_size is not None
    batch = round_trip(restored.sample_compact(32, beta=0.4, packed=True))
    assert_rows_are_what_was_sent(batch, streams)


def valid_packed(rows: int = 4) -> proto.SampleBatch:
    screen = np.full((8, 8), 5, np.uint8)
    scratch = np.empty(proto.packing.pack_bound(64), np.uint8)
    size = proto.packing.pack_frame(screen, scratch)
    return proto.SampleBatch(
        request_id=1, replay_size=100, obs=np.empty((rows, 0), np.uint8), action=np.zeros(rows, np.int64),
        reward=np.zeros(rows, np.float32), discount=np.ones(rows, np.float32), next_obs=np.empty((rows, 0), np.uint8),
        index=np.arange(rows, dtype=np.int64), weight=np.ones(rows, np.float32),
        packing={"codec": "lz4", "shape": "8,8"}, packed=np.tile(scratch[:size], 6),
        packed_sizes=np.full(6, size, np.int64),
        obs_idx=np.tile(np.arange(4), (rows, 1)), next_idx=np.tile(np.arange(2, 6), (rows, 1)))


@pytest.mark.parametrize(("change", "message"), [
    ({"packing": {}}, "only 'lz4'"),
    ({"packing": {"codec": "zstd", "shape": "8,8"}}, "only 'lz4'"),
    ({"packing": {"codec": "lz4", "shape": "8,x"}}, "not comma-separated"),
    ({"packing": {"codec": "lz4", "shape": "0,8"}}, "positive sides"),
    ({"packed_sizes": None}, "come together"),
    ({"frames": np.zeros((6, 8, 8), np.uint8)}, "without frames"),
    ({"packed_sizes": np.full(6, 65, np.int64)}, "outside 1..64"),
    ({"packed_sizes": np.zeros(6, np.int64)}, "outside 1..64"),
    ({"packed": np.zeros(3, np.uint8)}, "add up to"),
    ({"obs_idx": np.full((4, 4), 6)}, "outside 0..5"),
    ({"packing": {"codec": "lz4", "shape": "4096,4096"}, "packed_sizes": np.full(200, 1, np.int64),
      "packed": np.zeros(200, np.uint8), "obs_idx": np.zeros((4, 64), np.int64),
      "next_idx": np.zeros((4, 64), np.int64)}, "unpack to more than"),
])
def test_malformed_packed_batches_are_refused(change: dict, message: str) -> None:
    valid_packed().validate()
    bad = dataclasses.replace(valid_packed(), **change)
    with pytest.raises(proto.BadShape, match=message):
        bad.validate()


def test_a_packed_reply_that_does_not_unpack_is_counted_and_the_client_goes_on() -> None:
    """Sizes are checked on decode; a block that decodes to garbage is found when unpacked: a counted fault."""
    def reply(request: proto.SampleRequest) -> list:
        assert request.compact and request.packed
        return proto.encode(dataclasses.replace(valid_packed(), request_id=request.request_id))

    def tamper(frames: list) -> list:  # same sizes, bytes that are no LZ4 block of an 8x8 frame
        position = [i for i, f in enumerate(frames) if isinstance(f, np.ndarray) and f.dtype == np.uint8
                    and f.ndim == 1][0]
        frames[position] = np.full_like(frames[position], 0xF0)
        return frames

    faults = FaultCounter("learner")
    got, client = first_reply_tampered(reply, tamper, faults)
    assert client.counters.bad_replies == 1 and faults.counts["sample:malformed"] == 1
    assert len(got) == 1 and got[0].obs.shape == (4, 4, 8, 8) and client.outstanding == 0
    assert np.all(got[0].obs == 5) and client.counters.packed_batches_total == 1


def test_a_packing_replay_sends_packed_batches_over_its_socket() -> None:
    streams = SparseStreams(envs=2, depth=4, n_step=3, frame=(16, 16), episode=(4, 30), seed=6, noisy=0.2)
    core = make_core(400, pack_frames=True)
    while core.size < 200:
        core.insert(streams.batch(40))
    with running_server(core) as rs:
        for compact in (False, True):
            with ReplayClient(rs.sample, 16, inflight=2, transport="tcp", compact=compact) as client:
                for _ in range(3):
                    batch = client.poll(timeout_ms=10_000)
                    assert batch is not None and batch.frames is None and batch.packed is None
                    assert_rows_are_what_was_sent(batch, streams)
                    client.release(batch)
                assert client.counters.packed_batches_total == (3 if compact else 0)
        assert rs.server.counters.packed_batches_total >= 3  # the compact client's, and only its


def test_frame_packing_is_off_or_lz4() -> None:
    assert ReplaySettings(frame_packing="lz4").frame_packing == "lz4"
    with pytest.raises(ValidationError, match="frame_packing"):
        ReplaySettings(frame_packing="gzip")  # type: ignore[arg-type]
