"""ReplayClient against a real ReplayServer over loopback: shared memory, TCP, fallback, several clients."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import zmq
from replay_helpers import ActorStreams, make_core, running_server, transitions, wait_for

from flywheel import proto
from flywheel.services.replay.client import ReplayClient, ReplayClientError
from flywheel.services.replay.core import ReplayCore
from flywheel.services.replay.shm import SHM_DIR, ShmSlots

pytestmark = pytest.mark.skipif(not SHM_DIR.is_dir(), reason="needs /dev/shm")


def next_batch(client: ReplayClient) -> proto.SampleBatch:
    batch = client.poll(timeout_ms=10_000)
    assert batch is not None, "no batch from replay"
    return batch


def filled(streams: ActorStreams, capacity: int = 400, rows: int = 200, **overrides: object) -> ReplayCore:
    core = make_core(capacity, **overrides)
    while core.size < rows:
        core.insert(streams.batch(40))
    return core


def check_batch(batch: proto.SampleBatch, streams: ActorStreams) -> None:
    assert np.array_equal(batch.action, batch.index)
    for i, position in enumerate(batch.index):
        obs, next_obs = streams.sent[int(position)]
        assert np.array_equal(batch.obs[i], obs) and np.array_equal(batch.next_obs[i], next_obs)


def test_shared_memory_batches_are_zero_copy_views_and_slots_recycle() -> None:
    streams = ActorStreams(envs=3, depth=4, n_step=3, frame=(16, 16), episode=(4, 30), seed=21)
    core = filled(streams)
    shm = ShmSlots(default_slots=2, max_slots=3)
    with running_server(core, shm=shm) as rs, ReplayClient(rs.sample, 32, inflight=3, transport="shm") as client:
        for _ in range(12):  # far more batches than slots: releases must hand slots back
            batch = next_batch(client)
            if client.segment is not None and batch.shm.get("slot", -1) >= 0:
                assert not batch.obs.flags.writeable and batch.obs.base is not None  # a view of the segment
            check_batch(batch, streams)
            assert batch.is_demo is None and not batch.demo_mask().any()  # no demonstrations table
            client.update_priorities(batch.index, np.full(32, 2.0, np.float32))
            client.release(batch)
        assert client.counters.shm_batches_total >= 9  # the first replies carry the offer, inline
        assert rs.server.counters.shm_slots_exhausted_total == 0
        segment = shm.clients[next(iter(shm.clients))].segment
        assert segment.slots == 3 and len(segment.busy) <= 3
        wait_for(lambda: rs.server.counters.priority_updates_total >= 11 * 32, "priority updates")
        with pytest.raises(ValueError, match="released twice"):
            client.release(batch)
    assert not segment.path.exists()  # the server removes its segments when it closes


def test_tcp_client_gets_inline_batches() -> None:
    streams = ActorStreams(envs=2, depth=4, n_step=2, seed=22)
    core = filled(streams)
    with running_server(core, shm=ShmSlots()) as rs, ReplayClient(rs.sample, 16, inflight=2, transport="tcp") as client:
        for _ in range(5):
            batch = next_batch(client)
            assert batch.shm == {}
            check_batch(batch, streams)
            client.release(batch)
        assert client.counters.tcp_batches_total == 5 and client.counters.shm_batches_total == 0
        assert client.counters.compact_batches_total == 5  # pixel stacks travel as distinct frames + indices
        assert rs.server.shm.clients == {}  # a TCP client never gets a segment


def test_unreachable_segment_falls_back_to_tcp(tmp_path: Path) -> None:
    # The replay writes its segments where this client cannot find them: as if it ran on another host.
    streams = ActorStreams(envs=2, depth=4, n_step=2, seed=23)
    core = filled(streams)
    shm = ShmSlots(directory=tmp_path)
    with running_server(core, shm=shm) as rs, ReplayClient(rs.sample, 16, inflight=2) as client:
        for _ in range(6):
            batch = next_batch(client)
            check_batch(batch, streams)
            client.release(batch)
        assert client.shm_refused and client.counters.shm_batches_total == 0
        wait_for(lambda: not shm.clients, "the unused segment to be dropped")
        assert list(tmp_path.iterdir()) == []
    with running_server(filled(streams), shm=ShmSlots(directory=tmp_path)) as rs:
        client = ReplayClient(rs.sample, 16, inflight=1, transport="shm")
        with pytest.raises(ReplayClientError, match="shared memory"):
            client.poll(timeout_ms=10_000)
        client.close()


def test_several_clients_each_get_their_own_batches() -> None:
    streams = ActorStreams(envs=3, depth=4, n_step=3, seed=24)
    core = filled(streams, capacity=600, rows=300)
    with running_server(core, shm=ShmSlots()) as rs:
        clients = [ReplayClient(rs.sample, size, inflight=2, transport=transport)
                   for size, transport in ((8, "auto"), (16, "auto"), (24, "tcp"))]
        try:
            got = {id(c): 0 for c in clients}
            while min(got.values()) < 6:
                for client in clients:
                    batch = client.poll(timeout_ms=50)
                    if batch is not None:
                        assert len(batch.index) == client.batch_size
                        check_batch(batch, streams)
                        client.release(batch)
                        got[id(client)] += 1
            assert clients[0].counters.shm_batches_total > 0 and clients[1].counters.shm_batches_total > 0
            assert len(rs.server.shm.clients) == 2
        finally:
            for client in clients:
                client.close()


def test_client_re_requests_after_the_replay_restarts() -> None:
    streams = ActorStreams(envs=2, depth=4, n_step=2, seed=25)
    with running_server(filled(streams), shm=ShmSlots()) as rs:
        endpoint = rs.sample
        client = ReplayClient(endpoint, 8, inflight=2)
        batch = next_batch(client)
        client.release(batch)
    # Same endpoint, a new process' worth of state: the old requests and segment are gone.
    fresh = ActorStreams(envs=2, depth=4, n_step=2, seed=26)
    with running_server(filled(fresh), sample_bind=endpoint, shm=ShmSlots()):
        try:
            from_new = 0
            while from_new < 4:
                batch = next_batch(client)  # a reply of the old replay may still have been on its way
                try:
                    check_batch(batch, fresh)
                    from_new += 1
                except AssertionError:
                    check_batch(batch, streams)
                client.release(batch)
            assert client.counters.replay_reconnects_total == 1
        finally:
            client.close()


def test_demo_rows_are_flagged_and_weighted() -> None:
    core = make_core(64, demo_ratio=0.25)
    core.insert(transitions(0, 64))
    demo = transitions(1000, 16)
    count = core.load_demos(16, (4,), np.float32, [demo])
    assert count == 16 and core.demos.size == 16
    with running_server(core, shm=ShmSlots()) as rs, ReplayClient(rs.sample, 32, inflight=1) as client:
        batch = next_batch(client)
        assert int(batch.is_demo.sum()) == 8
        demo_rows = batch.demo_mask()
        assert np.all(batch.index[demo_rows] < 0) and np.all(batch.index[~demo_rows] >= 0)
        assert np.all(batch.action[demo_rows] >= 1000) and np.all(batch.action[~demo_rows] < 64)
        client.update_priorities(batch.index, np.full(32, 9.0, np.float32))
        wait_for(lambda: core.priority_updates >= 32, "priorities for both tables")
        assert core.demos.max_priority == pytest.approx((9.0 + 1e-6) ** 0.6)
        client.release(batch)


def test_set_replay_ratio_control_is_applied_or_refused_and_counted() -> None:
    core = make_core(16, samples_per_insert=1.0, error_buffer=100.0)
    with running_server(core) as rs:
        wait_for(lambda: rs.server.control.sock is not None, "server")
        seq = 1
        for args in ({"samples_per_insert": -1.0}, {"error_buffer": 3.0}, {"samples_per_insert": 2, "x": 1},
                     {"samples_per_insert": "fast"}):
            rs.send_control("set_replay_ratio", args, seq=seq)
            seq += 1
        rs.send_control("noop", seq=seq)  # no such command
        rs.send_control("set_replay_ratio", {"samples_per_insert": 8.0, "error_buffer": 50.0}, seq=seq + 1)
        wait_for(lambda: core.limiter.samples_per_insert == 8.0, "the ratio change")
        assert core.limiter.error_buffer == 50.0
        wait_for(lambda: rs.server.control.rejected == 5, "the refusals")
        assert rs.faults.counts["control:bad_args"] == 4 and rs.faults.counts["control:unknown_command"] == 1
        assert rs.faults.as_counters()['rejected_total{where="control",reason="bad_args"}'] == 4  # in telemetry
        assert rs.server.counters.control_commands_total == 1  # only the good one reached the replay
        assert rs.server.running


def test_pending_requests_wait_for_the_limiter_then_flow(tmp_path: Path) -> None:
    core = make_core(64, min_size_to_sample=10)
    with running_server(core, shm=ShmSlots()) as rs, ReplayClient(rs.sample, 4, inflight=3) as client:
        assert client.poll(timeout_ms=200) is None  # empty replay: requests wait
        wait_for(lambda: len(rs.server.pending) == 3, "requests queued")
        push = rs.ctx.socket(zmq.PUSH)
        push.connect(rs.transitions)
        push.send_multipart(proto.encode(transitions(0, 12)))
        for _ in range(3):
            client.release(next_batch(client))
        assert rs.server.counters.rate_limiter_sample_wait_seconds_total > 0
        push.close(0)


def test_a_reply_naming_a_slot_of_no_attached_segment_is_counted_not_fatal() -> None:
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    client = ReplayClient(f"tcp://127.0.0.1:{port}", 4, inflight=2, ctx=ctx)
    try:
        client.top_up()
        for shm in ({"slot": 0}, {}):  # a slot, but no segment this client ever attached; then a plain reply
            assert router.poll(5000)
            frames = router.recv_multipart()
            request = proto.decode(frames[1:], expect=proto.SampleRequest)
            rows, placeholder = 4, np.empty((4, 0), np.float32)
            obs = placeholder if shm else np.zeros((rows, 4), np.float32)
            router.send_multipart([frames[0], *proto.encode(proto.SampleBatch(
                request_id=request.request_id, replay_size=10, obs=obs, action=np.zeros(rows, np.int64),
                reward=np.zeros(rows, np.float32), discount=np.ones(rows, np.float32), next_obs=obs,
                index=np.arange(rows), weight=np.ones(rows, np.float32), shm=shm))])
        batch = next_batch(client)
        assert batch.obs.shape == (4, 4) and client.counters.bad_replies == 1
        assert client.faults.counts["sample:malformed"] == 1
        client.release(batch)
    finally:
        client.close()
        router.close(0)
        ctx.term()
