"""ReplayServer over real loopback sockets: inserts, in-flight sample requests, priorities, bad traffic."""

from __future__ import annotations

import time
from pathlib import Path

import msgpack
import numpy as np
import pytest
import zmq
from replay_helpers import ActorStreams, assert_stored_as_sent, make_core, running_server, transitions, wait_for

from flywheel import proto
from flywheel.services.replay import checkpoint
from flywheel.services.replay.client import ReplayClient
from flywheel.services.replay.core import ReplayCore
from flywheel.services.replay.shm import ShmSlots
from flywheel.services.replay.snapshot import Snapshotter
from flywheel.services.replay.transport import ReplayServer
from flywheel.transport import ControlSubscriber, EndpointInUse, FaultCounter, TelemetryReporter

DEADLINE_S = 10.0


def receive(sock: zmq.Socket) -> proto.Message:
    assert sock.poll(int(DEADLINE_S * 1000)), "no reply from replay"
    return proto.decode(sock.recv_multipart())


@pytest.fixture
def ctx() -> zmq.Context:
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


def test_inserts_then_in_flight_requests_are_answered(ctx: zmq.Context) -> None:
    core = make_core(64, min_size_to_sample=20)
    with running_server(core) as rs:
        push = ctx.socket(zmq.PUSH)
        push.connect(rs.transitions)
        learner = ctx.socket(zmq.DEALER)
        learner.connect(rs.sample)
        # Requests sent before there is enough data wait in the server.
        for request_id in (11, 12, 13):
            learner.send_multipart(proto.encode(proto.SampleRequest(request_id, 8, 0.4)))
        push.send_multipart(proto.encode(transitions(0, 10)))
        wait_for(lambda: rs.server.counters.transitions_received_total == 10, "first insert")
        wait_for(lambda: len(rs.server.pending) == 3, "requests queued")
        assert learner.poll(200) == 0  # below min size: nothing served yet
        push.send_multipart(proto.encode(transitions(10, 10, seq=1)))
        replies = [receive(learner) for _ in range(3)]
        assert [r.request_id for r in replies] == [11, 12, 13]
        for reply in replies:
            assert isinstance(reply, proto.SampleBatch)
            assert reply.replay_size == 20 and reply.obs.shape == (8, 4)
            assert np.array_equal(reply.action, reply.index)
        # Priority updates are applied to the live positions.
        learner.send_multipart(proto.encode(proto.PriorityUpdate(
            index=np.array([3, 4, 500], dtype=np.int64), priority=np.array([50.0, 0.0, 1.0], dtype=np.float32))))
        wait_for(lambda: rs.server.counters.priority_updates_total == 2, "priority update")
        assert core.tree.get([3])[0] == pytest.approx((50.0 + 1e-6) ** 0.6)
        assert core.stale_priority_updates == 1
        assert rs.server.counters.sample_batches_total == 3
        push.close()
        learner.close()


def test_two_learners_get_their_own_replies(ctx: zmq.Context) -> None:
    core = make_core(32, min_size_to_sample=1)
    core.insert(transitions(0, 32))
    with running_server(core) as rs:
        learners = [ctx.socket(zmq.DEALER) for _ in range(2)]
        for i, sock in enumerate(learners):
            sock.connect(rs.sample)
            for k in range(4):
                sock.send_multipart(proto.encode(proto.SampleRequest(100 * i + k, 4 + i, 0.4)))
        for i, sock in enumerate(learners):
            got = [receive(sock) for _ in range(4)]
            assert [r.request_id for r in got] == [100 * i + k for k in range(4)]
            assert all(len(r.action) == 4 + i for r in got)
            sock.close()


def test_bad_traffic_is_counted_and_valid_traffic_still_arrives(ctx: zmq.Context) -> None:
    core = make_core(64, min_size_to_sample=1)
    with running_server(core) as rs:
        push = ctx.socket(zmq.PUSH)
        push.connect(rs.transitions)
        push.send_multipart(proto.encode(transitions(0, 5)))
        wait_for(lambda: core.size == 5, "first batch")
        snapshot = {k: v.copy() for k, v in core.storage.arrays.items()}
        good = proto.encode(transitions(5, 5))
        header = bytes(good[0])
        push.send_multipart([b"\xc1garbage"])  # not msgpack
        push.send_multipart([header])  # frames missing
        push.send_multipart([header, *good[1:3]])  # truncated
        push.send(b"")
        push.send_multipart(proto.encode(transitions(5, 5, obs_shape=(6,))))  # valid message, wrong schema
        push.send_multipart(proto.encode(proto.SampleRequest(1, 4, 0.4)))  # wrong kind on this socket
        push.send_multipart(good)
        wait_for(lambda: core.size == 10, "valid batch after garbage")
        wait_for(lambda: rs.server.counters.transitions_rejected_total == 6, "rejections counted")
        assert rs.faults.counts["transitions:shape"] == 1
        assert sum(v for k, v in rs.faults.counts.items() if k.startswith("transitions:")) == 6
        for name, array in snapshot.items():  # stored rows untouched, new rows correct
            assert np.array_equal(core.storage.arrays[name][:5], array[:5])
        assert np.array_equal(core.storage.arrays["action"][:10], np.arange(10))
        # Garbage on the sampling socket is counted; the learner is still served afterwards.
        learner = ctx.socket(zmq.DEALER)
        learner.connect(rs.sample)
        learner.send_multipart([b"junk", b"more"])
        learner.send(b"")
        header = msgpack.unpackb(bytes(proto.encode(proto.SampleRequest(7, 4, 0.4))[0]))
        header["f"]["batch_size"] = 0  # out of range: the decoder must refuse it
        learner.send(msgpack.packb(header))
        learner.send_multipart(proto.encode(proto.SampleRequest(8, 4, 0.4)))
        reply = receive(learner)
        assert reply.request_id == 8
        wait_for(lambda: sum(v for k, v in rs.faults.counts.items() if k.startswith("sample:")) == 3, "sample faults")
        push.close()
        learner.close()


def test_block_inserts_holds_actors_until_learner_samples(ctx: zmq.Context) -> None:
    core = make_core(256, min_size_to_sample=4, samples_per_insert=1.0, error_buffer=4.0, block_inserts=True)
    with running_server(core, transitions_hwm=1) as rs:
        push = ctx.socket(zmq.PUSH)
        push.setsockopt(zmq.SNDHWM, 1)
        push.connect(rs.transitions)
        for i in range(4):  # HWMs of 1 on both ends: the extra batches wait in socket queues
            push.send_multipart(proto.encode(transitions(4 * i, 4, seq=i)))
        # max_diff = spi*min_size + buffer = 8: after two batches (8 inserts, 0 samples) inserts stop.
        wait_for(lambda: core.size >= 8, "inserts up to the ratio")
        time.sleep(0.3)
        assert core.size == 8
        learner = ctx.socket(zmq.DEALER)
        learner.connect(rs.sample)
        learner.send_multipart(proto.encode(proto.SampleRequest(1, 4, 0.4)))
        assert receive(learner).request_id == 1
        wait_for(lambda: core.size == 12, "inserts resumed after sampling")  # (8+1) - 4 <= 8: one more batch
        learner.send_multipart(proto.encode(proto.SampleRequest(2, 4, 0.4)))
        assert receive(learner).request_id == 2
        wait_for(lambda: core.size == 16, "the last batch after the second sample")
        # the server thread counts a batch just after inserting it: wait for the count, not only the size
        wait_for(lambda: rs.server.counters.transitions_received_total == 16, "all 16 transitions counted")
        assert core.size == 16 and rs.server.counters.batches_received_total == 4
        push.close()
        learner.close()


def test_busy_port_raises_endpoint_in_use(ctx: zmq.Context) -> None:
    holder = ctx.socket(zmq.PULL)
    holder.bind("tcp://127.0.0.1:*")
    busy = holder.getsockopt_string(zmq.LAST_ENDPOINT)
    faults = FaultCounter("replay")
    telemetry = TelemetryReporter(ctx, "inproc://telemetry-sink", "replay", "test")
    control = ControlSubscriber(ctx, "inproc://control-source", "replay", "test", faults)
    with pytest.raises(EndpointInUse) as info:
        ReplayServer(make_core(4), ctx, transitions_bind=busy, sample_bind="tcp://127.0.0.1:*",
                     telemetry=telemetry, control=control, faults=faults)
    message = str(info.value)
    assert "\n" not in message and busy in message and "FLYWHEEL_REPLAY_TRANSITIONS_BIND" in message
    for sock in (holder, telemetry, control):
        sock.close()


def test_stop_returns_promptly_with_pending_requests(ctx: zmq.Context) -> None:
    core: ReplayCore = make_core(8, min_size_to_sample=8)
    with running_server(core) as rs:
        learner = ctx.socket(zmq.DEALER)
        learner.connect(rs.sample)
        learner.send_multipart(proto.encode(proto.SampleRequest(1, 4, 0.4)))
        wait_for(lambda: len(rs.server.pending) == 1, "pending request")
        learner.close()


def test_checkpoint_during_traffic_keeps_inserts_and_samples_flowing(ctx: zmq.Context, tmp_path: Path) -> None:
    streams = ActorStreams(envs=3, depth=4, n_step=3, frame=(32, 32), episode=(5, 40), seed=31)
    core = make_core(2000, min_size_to_sample=50)
    while core.size < 500:
        core.insert(streams.batch(50))
    def state() -> dict:
        snapshot = core.state_dict()  # taken in the child, at fork time
        time.sleep(1.0)  # a slow disk: the parent must keep going meanwhile
        return snapshot

    snap = Snapshotter(tmp_path, state, lambda: core.size)
    with running_server(core, snapshotter=snap, shm=ShmSlots()) as rs, \
            ReplayClient(rs.sample, 32, inflight=2) as client:
        push = ctx.socket(zmq.PUSH)
        push.connect(rs.transitions)
        size_at_request = core.size
        rs.send_control("checkpoint", {"tag": "t1"})
        wait_for(lambda: snap.in_progress, "the checkpoint to start")
        inserted_before = rs.server.counters.transitions_received_total
        sampled_during = 0
        while snap.in_progress:
            push.send_multipart(proto.encode(streams.batch(20)))
            batch = client.poll(timeout_ms=20)
            if batch is not None:
                sampled_during += int(snap.in_progress)
                client.release(batch)
        assert sampled_during > 0
        assert rs.server.counters.transitions_received_total > inserted_before
        wait_for(lambda: rs.server.counters.checkpoints_total == 1, "the checkpoint to be reaped")
        assert snap.max_pause_s > 0 and rs.server.max_turn_during_checkpoint_s > 0
        push.close(0)
    restored = make_core(2000)
    restored.load_state_dict(checkpoint.load(tmp_path))
    assert size_at_request <= restored.size < core.size
    assert_stored_as_sent(restored, streams.sent)


def test_bad_pixel_inserts_are_counted_and_storage_stays_intact(ctx: zmq.Context) -> None:
    streams = ActorStreams(envs=2, depth=4, n_step=2, seed=32)
    core = make_core(300, min_size_to_sample=1)
    with running_server(core) as rs:
        push = ctx.socket(zmq.PUSH)
        push.connect(rs.transitions)
        push.send_multipart(proto.encode(streams.batch(30)))
        wait_for(lambda: core.size == streams.position, "first batch")
        good = streams.batch(10)
        wrong_dtype = proto.TransitionBatch(**{**good.__dict__, "obs": good.obs.astype(np.float32),
                                                "next_obs": good.next_obs.astype(np.float32)})
        wrong_shape = proto.TransitionBatch(**{**good.__dict__, "obs": good.obs[:, :3],
                                                "next_obs": good.next_obs[:, :3]})
        nan_reward = proto.TransitionBatch(**{**good.__dict__, "reward": np.full(len(good), np.nan, np.float32)})
        for bad in (wrong_dtype, wrong_shape, nan_reward):
            push.send_multipart(proto.encode(bad))
        frames = proto.encode(good)
        push.send_multipart([frames[0], *frames[1:2], b"short", *frames[3:]])  # a truncated array
        wait_for(lambda: rs.server.counters.transitions_rejected_total == 4, "rejections")
        assert rs.faults.counts["transitions:shape"] == 2 and rs.faults.counts["transitions:values"] == 1
        assert core.size == streams.position - len(good)
        streams.position -= len(good)  # the rejected rows never got positions: resend them as fresh rows
        for position in range(streams.position, streams.position + len(good)):
            streams.sent.pop(position, None)
        push.send_multipart(proto.encode(streams.batch(10)))
        wait_for(lambda: core.size == streams.position, "a good batch after the bad ones")
        assert_stored_as_sent(core, streams.sent)
        push.close(0)


def test_pause_holds_inserts_and_samples_until_resume(ctx: zmq.Context) -> None:
    core = make_core(64, min_size_to_sample=1)
    core.insert(transitions(0, 8))
    with running_server(core) as rs:
        rs.send_control("pause", seq=1)
        wait_for(lambda: rs.server.paused, "pause")
        push = ctx.socket(zmq.PUSH)
        push.connect(rs.transitions)
        push.send_multipart(proto.encode(transitions(8, 4)))
        learner = ctx.socket(zmq.DEALER)
        learner.connect(rs.sample)
        learner.send_multipart(proto.encode(proto.SampleRequest(1, 4, 0.4)))
        wait_for(lambda: len(rs.server.pending) == 1, "the request to wait")
        assert learner.poll(300) == 0 and core.size == 8
        rs.send_control("resume", seq=2)
        assert receive(learner).request_id == 1
        wait_for(lambda: core.size == 12, "the held insert")
        push.close(0)
        learner.close(0)


def test_the_server_reports_the_ports_the_kernel_picked(ctx: zmq.Context, tmp_path: Path) -> None:
    """Bound to port 0 it names the real ports (a test or launcher needs no port guessed in advance)."""
    ipc = f"ipc://{tmp_path}/sample"
    with running_server(make_core(64, min_size_to_sample=4), sample_bind=f"tcp://127.0.0.1:0,{ipc}") as rs:
        (transitions_at,), (sample_at, ipc_at) = rs.server.endpoints["transitions"], rs.server.endpoints["sample"]
        ports = {int(transitions_at.rsplit(":", 1)[1]), int(sample_at.rsplit(":", 1)[1])}
        assert 0 not in ports and len(ports) == 2 and ipc_at == ipc
        push = ctx.socket(zmq.PUSH)
        push.connect(transitions_at)  # the reported endpoints are the live ones
        push.send_multipart(proto.encode(transitions(0, 8)))
        learner = ctx.socket(zmq.DEALER)
        learner.connect(sample_at)
        learner.send_multipart(proto.encode(proto.SampleRequest(1, 4, 0.4)))
        reply = receive(learner)
        assert isinstance(reply, proto.SampleBatch) and reply.replay_size == 8
        push.close(0)
        learner.close(0)
