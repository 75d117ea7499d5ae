"""Actor sockets over real loopback: TransitionSender block/drop, WeightsReceiver, LeaseClient."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest
import torch
import zmq

from flywheel import proto
from flywheel.nets import QNetwork, build_q_network, weights_message
from flywheel.nets_numpy import NumpyQNetwork
from flywheel.services.actor.nstep import Emitted
from flywheel.services.actor.policy import Backend, Policy, TorchPolicy, build_policy
from flywheel.services.actor.transport import LeaseClient, TransitionSender, WeightsReceiver, auto_batch_rows
from flywheel.transport import FaultCounter

DEADLINE_S = 10.0


@pytest.fixture
def ctx() -> Iterator[zmq.Context]:
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


def rows(start: int, count: int) -> Emitted:
    ids = np.arange(start, start + count)
    obs = np.stack([ids, ids], axis=1).astype(np.float32)
    return Emitted(obs=obs, action=ids.astype(np.int64), reward=ids.astype(np.float32),
                   discount=np.full(count, 0.9, np.float32), next_obs=obs + 1, priority=np.ones(count, np.float32))


@pytest.fixture
def dead_endpoint() -> Iterator[str]:
    """A loopback port held (bound, never listening) for the test: connections to it are refused."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        yield f"tcp://127.0.0.1:{holder.getsockname()[1]}"


def test_drop_mode_counts_drops_when_nobody_receives(ctx: zmq.Context, dead_endpoint: str) -> None:
    sender = TransitionSender(ctx, dead_endpoint, "a0", hwm=1, on_full="drop", batch_rows=4)
    for i in range(10):
        sender.add([rows(4 * i, 4)], 1, lambda: True)
    # A connect without a peer still queues up to the high-water mark; everything past it is dropped.
    assert sender.sent + sender.dropped == 40 and sender.sent <= 8 and sender.seq == 10
    assert sender.buffered == 0 and not sender.buffer
    sender.close()


def test_block_mode_delivers_everything(ctx: zmq.Context) -> None:
    pull = ctx.socket(zmq.PULL)
    pull.setsockopt(zmq.RCVHWM, 1)
    pull.bind("tcp://127.0.0.1:*")
    sender = TransitionSender(ctx, pull.getsockopt_string(zmq.LAST_ENDPOINT), "a0", hwm=1, on_full="block",
                              batch_rows=6)
    def produce() -> None:
        for i in range(30):
            sender.add([rows(3 * i, 3)], 7, lambda: True)  # two adds per message: concatenation
        sender.flush(7, lambda: True)

    thread = threading.Thread(target=produce)
    thread.start()
    got: list[proto.TransitionBatch] = []
    received = 0
    while received < 90:
        assert pull.poll(int(DEADLINE_S * 1000)), "sender stalled"
        msg = proto.decode(pull.recv_multipart(), expect=proto.TransitionBatch)
        got.append(msg)
        received += len(msg)
        time.sleep(0.002)  # a slow replay: the sender has to wait at the high-water mark
    thread.join(DEADLINE_S)
    assert not thread.is_alive()
    assert sender.sent == 90 and sender.dropped == 0
    assert [m.seq for m in got] == list(range(15))
    assert np.array_equal(np.concatenate([m.action for m in got]), np.arange(90))
    assert all(m.weight_version == 7 and m.actor == "a0" and len(m) == 6 for m in got)
    np.testing.assert_array_equal(got[3].next_obs, got[3].obs + 1)
    sender.close()
    pull.close()


def test_block_mode_stops_when_asked_and_final_flush_still_tries(ctx: zmq.Context, dead_endpoint: str) -> None:
    sender = TransitionSender(ctx, dead_endpoint, "a0", hwm=1, on_full="block", batch_rows=100)
    sender.add([rows(0, 5)], 1, lambda: True)  # below batch_rows: buffered only
    assert sender.buffered == 5 and sender.sent == 0
    calls = {"idle": 0}
    state = {"running": True}

    def idle() -> None:
        calls["idle"] += 1
        state["running"] = False  # a stop request arrives while blocked

    # Nobody receives: the first messages fill the queue, then a flush blocks until the stop request.
    for i in range(10):
        sender.add([rows(5 * i, 5)], 1, lambda: True)
        sender.flush(1, lambda: state["running"], idle)
        if sender.dropped:
            break
    assert sender.dropped == 5 and calls["idle"] == 1 and sender.sent == 5 * (i + 1)
    # The final flush on exit (running() already False) delivers when a receiver is there.
    pull = ctx.socket(zmq.PULL)
    pull.bind("tcp://127.0.0.1:*")
    final = TransitionSender(ctx, pull.getsockopt_string(zmq.LAST_ENDPOINT), "a0", hwm=4, on_full="block",
                             batch_rows=100)
    final.add([rows(0, 3)], 1, lambda: True)
    deadline = time.monotonic() + DEADLINE_S
    while not final.sock.poll(10, zmq.POLLOUT):  # connected (the exit path never waits for that)
        assert time.monotonic() < deadline
    final.flush(1, lambda: False)
    assert final.sent == 3 and final.dropped == 0
    assert pull.poll(int(DEADLINE_S * 1000))
    assert len(proto.decode(pull.recv_multipart())) == 3
    for sock in (sender, final, pull):
        sock.close()


def params(net: QNetwork | Policy) -> dict[str, np.ndarray]:
    if isinstance(net, NumpyQNetwork):
        return net.state_dict()
    module = net.net if isinstance(net, TorchPolicy) else net
    assert isinstance(module, QNetwork)
    return {k: v.detach().numpy().copy() for k, v in module.state_dict().items()}


def same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_weights_receiver_newest_version_and_refusals(ctx: zmq.Context, backend: Backend) -> None:
    torch.manual_seed(0)
    pub = ctx.socket(zmq.PUB)
    pub.bind("tcp://127.0.0.1:*")
    actor_net = build_policy((4,), 2, hidden=32, backend=backend)
    faults = FaultCounter("actor")
    receiver = WeightsReceiver(ctx, pub.getsockopt_string(zmq.LAST_ENDPOINT), actor_net, faults)
    learner = [build_q_network((4,), 2, hidden=32) for _ in range(4)]

    def publish(msg: proto.Weights) -> None:
        pub.send_multipart(proto.encode(msg))

    def settle() -> None:
        """Send an undecodable marker and poll until it is refused: everything sent before it has been read."""
        before = sum(n for key, n in faults.counts.items() if not key.endswith(("stale_version", "mismatch")))
        pub.send_multipart([b"\x00marker"])
        deadline = time.monotonic() + DEADLINE_S
        while sum(n for key, n in faults.counts.items() if not key.endswith(("stale_version", "mismatch"))) == before:
            assert time.monotonic() < deadline, "marker never seen"
            receiver.poll()
            receiver.sock.poll(50)

    # PUB/SUB joins late: repeat version 1 until the subscription is live, then read the leftovers.
    deadline = time.monotonic() + DEADLINE_S
    while not receiver.poll():
        assert time.monotonic() < deadline, "subscription never became live"
        publish(weights_message(learner[1], 1, actor_net.name))
        time.sleep(0.02)
    settle()
    assert receiver.version == 1 and same(params(actor_net), params(learner[1]))
    stale, rejected = receiver.stale, receiver.rejected  # late copies of version 1: the acting one, ignored

    # Newest wins even when an older one comes after it in the same burst (the older is superseded, not refused).
    publish(weights_message(learner[3], 3, actor_net.name))
    publish(weights_message(learner[2], 2, actor_net.name))
    settle()
    assert receiver.version == 3 and same(params(actor_net), params(learner[3]))
    # v2 was either superseded in the same drain or, read after v3 was loaded, refused as stale
    assert receiver.stale - stale in (0, 1) and receiver.rejected - rejected == 1 + receiver.stale - stale
    stale, rejected = receiver.stale, receiver.rejected - 1

    # Older versions are refused and counted; the acting version again (the learner republishes its newest every
    # weights_republish_s) is ignored, neither counted nor loaded; the network stays as it was.
    publish(weights_message(learner[2], 2, actor_net.name))
    publish(weights_message(learner[1], 3, actor_net.name))
    settle()
    assert receiver.stale == stale + 1 and receiver.rejected == rejected + 3
    assert faults.counts["weights:stale_version"] == receiver.stale
    assert receiver.version == 3 and same(params(actor_net), params(learner[3]))

    # Mismatched weights are refused and the acting weights stay as they were.
    before = params(actor_net)
    publish(weights_message(learner[0], 10, "mlp-8-2-dueling"))  # wrong network name
    settle()
    publish(weights_message(build_q_network((4,), 2, hidden=64), 11, actor_net.name))  # right name, wrong shapes
    settle()
    nan = weights_message(learner[0], 12, actor_net.name)
    next(iter(nan.tensors.values()))[...] = np.nan
    publish(nan)
    settle()
    assert faults.counts["weights:mismatch"] == 3 and receiver.rejected == rejected + 3 + 6
    assert receiver.version == 3 and same(params(actor_net), before)
    assert receiver.newest_seen == 3 and receiver.lag == 0  # refused weights are no newer version to lag behind

    # A good newer version still gets through afterwards.
    publish(weights_message(learner[0], 13, actor_net.name))
    deadline = time.monotonic() + DEADLINE_S
    while not receiver.poll():
        assert time.monotonic() < deadline, "good weights never arrived"
        receiver.sock.poll(50)
    assert receiver.version == 13 and receiver.lag == 0 and same(params(actor_net), params(learner[0]))

    # With an interval, a newer version waits (policy lag 1) until the interval has passed; acting goes on.
    receiver.interval_s = 100.0
    publish(weights_message(learner[2], 14, actor_net.name))
    settle()
    assert receiver.version == 13 and receiver.newest_seen == 14 and receiver.lag == 1
    receiver.loaded_at = 8141.429970365  # a clock reading where (t + 100) - t rounds below 100 (CI, 2026-12-01)
    assert not receiver.poll(receiver.loaded_at + 99.0)
    assert receiver.poll(receiver.loaded_at + 100.0)
    assert receiver.version == 14 and receiver.lag == 0 and same(params(actor_net), params(learner[2]))
    receiver.close()
    pub.close()


def test_stream_column_and_one_weight_version_per_batch(ctx: zmq.Context) -> None:
    """Rows go out with their env slots in order; a new weight version starts a new message."""
    pull = ctx.socket(zmq.PULL)
    pull.bind("tcp://127.0.0.1:*")
    sender = TransitionSender(ctx, pull.getsockopt_string(zmq.LAST_ENDPOINT), "a0", hwm=100, on_full="block",
                              batch_rows=8)

    def slot_rows(start: int, streams: list[int]) -> Emitted:
        r = rows(start, len(streams))
        r.stream = np.array(streams, dtype=np.int64)
        return r

    sender.add([slot_rows(0, [0, 1, 2]), slot_rows(3, [0, 0])], 4, lambda: True)
    sender.add([slot_rows(5, [2, 1, 1])], 4, lambda: True)  # 8 rows: sent as one message
    sender.add([slot_rows(8, [0, 1])], 4, lambda: True)
    sender.add([slot_rows(10, [2])], 5, lambda: True)  # newer weights: the v4 rows leave first, alone
    sender.flush(5, lambda: True)
    got = []
    while len(got) < 3:
        assert pull.poll(int(DEADLINE_S * 1000))
        got.append(proto.decode(pull.recv_multipart(), expect=proto.TransitionBatch))
    assert [(m.weight_version, len(m)) for m in got] == [(4, 8), (4, 2), (5, 1)]
    assert got[0].stream.tolist() == [0, 1, 2, 0, 0, 2, 1, 1] and got[1].stream.tolist() == [0, 1]
    assert np.array_equal(np.concatenate([m.action for m in got]), np.arange(11))
    assert sender.send_s > 0
    sender.close()
    pull.close()


def test_lease_client_gets_and_follows_its_slot(ctx: zmq.Context) -> None:
    router = ctx.socket(zmq.ROUTER)
    router.bind("tcp://127.0.0.1:*")
    faults = FaultCounter("actor")
    client = LeaseClient(ctx, router.getsockopt_string(zmq.LAST_ENDPOINT), "actor-a", faults)

    def answer(index: int, count: int, instance: str = "actor-a") -> None:
        assert router.poll(int(DEADLINE_S * 1000))
        identity, *frames = router.recv_multipart()
        request = proto.decode(frames, expect=proto.LeaseRequest)
        assert request.instance == "actor-a" and not request.release
        router.send_multipart([identity, *proto.encode(proto.LeaseReply(instance, index, count, 30.0))])

    now = time.monotonic()
    assert not client.tick(now)
    answer(2, 4)
    assert client.sock.poll(int(DEADLINE_S * 1000))
    assert client.tick(now)
    assert (client.index, client.count, client.have_lease) == (2, 4, True)
    assert not client.tick(now)  # renewal not due yet: nothing changes
    later = now + 30.0
    client.tick(later)  # renewal due
    answer(1, 3)
    assert client.sock.poll(int(DEADLINE_S * 1000))
    assert client.tick(later) and (client.index, client.count) == (1, 3)
    client.release()
    assert router.poll(int(DEADLINE_S * 1000))
    assert proto.decode(router.recv_multipart()[1:], expect=proto.LeaseRequest).release
    client.close()
    router.close()


def test_auto_batch_rows_whole_steps_up_to_rows_or_bytes() -> None:
    assert auto_batch_rows(64, 32) == 256  # CartPole: four vector steps
    assert auto_batch_rows(16, 32) == 256
    assert auto_batch_rows(1000, 32) == 1000  # never less than one step
    assert auto_batch_rows(8, 2 * 4 * 84 * 84) == 8  # Pong stacks: one step passes 256 KiB
    assert auto_batch_rows(2, 2 * 4 * 84 * 84) == 6
    assert auto_batch_rows(3, 1 << 21) == 3


def test_a_send_stuck_while_the_learner_goes_on_reconnects(ctx: zmq.Context) -> None:
    """A PULL that never reads: a long wait with no new weights is backpressure (kept); with new weights it is a
    stuck connection, and the sender reconnects once per stall and sends the batch it held."""
    pull = ctx.socket(zmq.PULL)
    pull.setsockopt(zmq.RCVHWM, 1)
    pull.setsockopt(zmq.RCVBUF, 4096)
    pull.bind("tcp://127.0.0.1:*")
    accepted = pull.get_monitor_socket(zmq.EVENT_ACCEPTED)
    learner = {"version": 10}
    sender = TransitionSender(ctx, pull.getsockopt_string(zmq.LAST_ENDPOINT), "a0", hwm=1, on_full="block",
                              batch_rows=2000, sndbuf=4096, stall_s=0.5, learner_versions=lambda: learner["version"])
    assert accepted.poll(int(DEADLINE_S * 1000))
    accepted.recv_multipart()

    for i in range(100):  # fill the connection until a batch blocks; give up on that one after 2 s
        sent, until = sender.sent, time.monotonic() + 2.0
        sender.add([rows(2000 * i, 2000)], 1, lambda until=until: time.monotonic() < until)
        if sender.dropped:
            break
    assert sender.dropped == 2000 and sender.sent == sent  # the last batch blocked and was given up at the stop
    assert sender.reconnects == 0 and not accepted.poll(0)  # no new weights while it waited: backpressure, kept

    def learner_goes_on() -> None:
        learner["version"] += 1

    began, blocked = time.monotonic(), sender.blocked_s
    sender.add([rows(0, 2000)], 1, lambda: time.monotonic() - began < DEADLINE_S, learner_goes_on)
    assert sender.reconnects == 1 and sender.sent == sent + 2000 and sender.dropped == 2000  # held, then sent
    assert sender.blocked_s - blocked >= 0.5
    assert accepted.poll(int(DEADLINE_S * 1000))  # the new connection
    sender.close()
    accepted.close()
    pull.close()
