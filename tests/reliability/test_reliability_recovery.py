"""How the learner comes back from a restarted replay and from its own kill, on real sockets and files."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import torch
import zmq

from flywheel import proto
from flywheel.services.learner.checkpoint import (
    VERSIONS_FILE,
    CheckpointError,
    reserve_versions,
    reserved_version,
)
from flywheel.services.learner.publishing import WeightsSnapshots
from flywheel.services.learner.sampling import batch_limits
from flywheel.services.replay.client import ReplayClient
from flywheel.transport import FaultCounter, make_socket

pytestmark = pytest.mark.timeout(60)


def _bound_router(ctx: zmq.Context, endpoint: str) -> zmq.Socket:
    router = make_socket(ctx, zmq.ROUTER)
    for _ in range(50):  # the port was just released by the 'killed' replay
        try:
            router.bind(endpoint)
            return router
        except zmq.ZMQError:
            time.sleep(0.1)
    raise AssertionError(f"cannot bind {endpoint} again")


def _requests(router: zmq.Socket, timeout_s: float) -> list[int]:
    ids, deadline = [], time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if router.poll(100):
            msg = proto.decode(router.recv_multipart()[1:])
            assert isinstance(msg, proto.SampleRequest)
            ids.append(msg.request_id)
    return ids


def test_sample_requests_are_resent_as_soon_as_a_restarted_replay_is_back() -> None:
    """A restarted replay knows none of the requests in flight: waiting out request_timeout_s (60 s) would
    stall the learner for a minute, so the client notices the reconnection and re-sends at once."""
    ctx = zmq.Context()
    router = make_socket(ctx, zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    endpoint = f"tcp://127.0.0.1:{port}"
    client = ReplayClient(endpoint, 8, inflight=3, ctx=ctx, limits=batch_limits(8, (4,)), request_timeout_s=60.0,
                          faults=FaultCounter("learner"))
    try:
        client.top_up(0.4)
        assert sorted(_requests(router, 1.0)) == [1, 2, 3]
        assert client.resend_stale(time.monotonic(), 0.4) == 0  # nothing to re-send while it is there
        router.close(0)  # the replay dies with the three requests
        time.sleep(0.5)
        client.resend_stale(time.monotonic(), 0.4)  # notices the disconnection
        router = _bound_router(ctx, endpoint)
        deadline, resent = time.monotonic() + 10, 0
        while not resent and time.monotonic() < deadline:
            resent = client.resend_stale(time.monotonic(), 0.4)
            time.sleep(0.05)
        assert resent == 3 and client.counters.replay_reconnects_total == 1
        assert sorted(_requests(router, 1.0)) == [4, 5, 6]  # well before the 60 s timeout
        assert client.outstanding == 3
    finally:
        client.close()
        router.close(0)
        ctx.term()


def _reply(request_id: int, rows: int = 8) -> list[bytes]:
    obs = np.zeros((rows, 4), np.float32)
    return proto.encode(proto.SampleBatch(
        request_id=request_id, replay_size=100, obs=obs, action=np.zeros(rows, np.int64),
        reward=np.zeros(rows, np.float32), discount=np.ones(rows, np.float32), next_obs=obs,
        index=np.arange(rows, dtype=np.int64), weight=np.ones(rows, np.float32)))


def test_replies_beyond_the_requests_in_flight_are_not_handed_on() -> None:
    """A replay that held requests back (its rate limiter) longer than request_timeout_s answers both the
    originals and the re-sent ones: the client hands on one batch per request it still counts as outstanding,
    so the learner's queue of staged batches stays within 2 x requests_in_flight."""
    ctx = zmq.Context()
    router = make_socket(ctx, zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    client = ReplayClient(f"tcp://127.0.0.1:{port}", 8, inflight=2, ctx=ctx, limits=batch_limits(8, (4,)),
                          request_timeout_s=0.3, faults=FaultCounter("learner"))
    try:
        client.top_up(0.4)
        time.sleep(0.5)
        assert client.resend_stale(time.monotonic(), 0.4) == 2  # the replay is silent: re-send
        received = []
        deadline = time.monotonic() + 5
        while len(received) < 4 and time.monotonic() < deadline:
            if router.poll(100):
                frames = router.recv_multipart()
                msg = proto.decode(frames[1:])
                received.append(msg.request_id)
                router.send_multipart([frames[0], *_reply(msg.request_id)])
        assert sorted(received) == [1, 2, 3, 4]  # it answers every request it got
        batches, deadline = [], time.monotonic() + 3
        while time.monotonic() < deadline:
            if client.sock.poll(100):
                batch = client.receive()
                if batch is not None:
                    batches.append(batch.request_id)
        assert len(batches) == 2 and client.outstanding == 0
        assert client.counters.replies_unrequested_total == 2
    finally:
        client.close()
        router.close(0)
        ctx.term()


def test_versions_are_reserved_ahead_so_a_resumed_learner_publishes_above_a_killed_one(tmp_path: Path) -> None:
    net = torch.nn.Linear(4, 2)
    published: list[int] = []

    def publish_until(snapshots: WeightsSnapshots, count: int) -> None:
        for _ in range(count):
            snapshots.begin(0)
            msg = snapshots.take(time.monotonic(), wait=True)
            assert msg is not None
            published.append(msg.version)

    first = WeightsSnapshots(net, "n", start_version=0, every_updates=1, every_seconds=0, reserve_ahead=10,
                             reserve=lambda upto: reserve_versions(tmp_path, upto))
    publish_until(first, 25)  # killed here: say its last checkpoint noted version 7
    assert reserved_version(tmp_path) >= 25 and reserved_version(tmp_path) - 25 <= 10
    start = max(7, reserved_version(tmp_path))  # what the learner's main does on --resume
    second = WeightsSnapshots(net, "n", start_version=start, every_updates=1, every_seconds=0, reserve_ahead=10,
                              reserve=lambda upto: reserve_versions(tmp_path, upto))
    publish_until(second, 3)
    assert published[25] > published[24] and np.all(np.diff(published) > 0)
    assert not list(tmp_path.glob(".*.tmp"))  # written through a temp file, renamed


def test_a_damaged_versions_note_is_refused_with_one_line(tmp_path: Path) -> None:
    assert reserved_version(tmp_path) == 0
    (tmp_path / VERSIONS_FILE).write_text('{"reserved": "many"}')
    with pytest.raises(CheckpointError, match="non-negative int"):
        reserved_version(tmp_path)
    (tmp_path / VERSIONS_FILE).write_text("{trunc")
    with pytest.raises(CheckpointError, match="unreadable"):
        reserved_version(tmp_path)


def test_a_blocked_actor_reports_its_blocked_time_while_still_blocked() -> None:
    """The replay is away: a blocking actor's send_blocked_seconds_total must grow during the wait (its reports
    go on from the idle callback), not only once the wait ends, or a stuck actor would look idle."""
    from flywheel.services.actor.nstep import Emitted
    from flywheel.services.actor.transport import TransitionSender

    ctx = zmq.Context()
    sender = TransitionSender(ctx, "tcp://127.0.0.1:1", "a0", hwm=1, on_full="block", batch_rows=1)
    seen: list[float] = []
    row = Emitted(obs=np.zeros((1, 4), np.float32), action=np.zeros(1, np.int64), reward=np.zeros(1, np.float32),
                  discount=np.ones(1, np.float32), next_obs=np.zeros((1, 4), np.float32),
                  priority=np.ones(1, np.float32))
    try:
        for _ in range(4):  # the queue takes the first ones; then a send waits
            sender.add([row], 1, lambda: len(seen) < 4, lambda: seen.append(sender.blocked_s))
        assert len(seen) == 4 and seen[0] > 0.1 and all(b > a for a, b in zip(seen, seen[1:], strict=False))
    finally:
        sender.close()
        ctx.term()
