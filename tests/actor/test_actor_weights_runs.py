"""Weights across learner runs over real PUB/SUB: a rogue version 2^63-1 pins no actor, a new run is taken."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest
import torch
import zmq

from flywheel import proto
from flywheel.nets import build_q_network, weights_message
from flywheel.services.actor.policy import build_policy
from flywheel.services.actor.transport import WeightsReceiver
from flywheel.services.learner.publishing import WeightsSnapshots
from flywheel.services.learner.transport import WeightsPublisher
from flywheel.transport import FaultCounter

DEADLINE_S = 10.0
ROGUE_VERSION = 2**63 - 1


@pytest.fixture
def ctx() -> Iterator[zmq.Context]:
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


def next_version(snapshots: WeightsSnapshots) -> proto.Weights:
    """What the learner publishes next: a snapshot of its network, one version more, its run id."""
    snapshots.begin(0)
    msg = snapshots.take(time.monotonic(), wait=True)
    assert msg is not None
    return msg


def same(policy: object, net: torch.nn.Module) -> bool:
    acting = policy.state_dict()  # type: ignore[attr-defined]
    return all(np.array_equal(acting[k], v.detach().numpy()) for k, v in net.state_dict().items())


def test_after_a_rogue_version_2_63_the_actor_loads_a_new_learner_runs_weights(ctx: zmq.Context) -> None:
    torch.manual_seed(0)
    policy = build_policy((4,), 2, hidden=32, backend="numpy")
    faults = FaultCounter("actor")
    learner_pub = WeightsPublisher(ctx, "tcp://127.0.0.1:*", republish_s=0.02)  # the learner's own PUB
    rogue = ctx.socket(zmq.PUB)
    rogue.bind("tcp://127.0.0.1:*")
    receiver = WeightsReceiver(ctx, learner_pub.endpoint, policy, faults)
    receiver.sock.connect(rogue.getsockopt_string(zmq.LAST_ENDPOINT))  # the rogue reaches the actor's SUB too

    def pump(until: Callable[[], bool], send: Callable[[], None], what: str) -> None:
        deadline = time.monotonic() + DEADLINE_S
        while not until():
            assert time.monotonic() < deadline, f"timed out waiting for {what}"
            send()
            receiver.poll()
            receiver.sock.poll(20)

    def learner_sends() -> None:
        learner_pub.tick(time.monotonic())  # the newest version again, as a real learner does every few seconds

    try:
        first_net = build_q_network((4,), 2, hidden=32)
        first = WeightsSnapshots(first_net, policy.name, start_version=0, every_updates=1, every_seconds=0)
        for _ in range(5):
            msg = next_version(first)
        learner_pub.publish(msg)
        pump(lambda: receiver.version == 5, learner_sends, "the first learner's version 5")
        assert receiver.run_id == first.run_id and same(policy, first_net)

        # A rogue message of the same run far ahead is refused, counted, and raises no lag.
        forged = weights_message(build_q_network((4,), 2, hidden=32), ROGUE_VERSION, policy.name)
        forged.run_id = first.run_id
        rogue_frames = proto.encode(forged)
        pump(lambda: faults.counts["weights:version_jump"] >= 1, lambda: rogue.send_multipart(rogue_frames),
             "the same-run jump to be refused")
        assert receiver.version == 5 and receiver.lag == 0 and same(policy, first_net)

        # A rogue run's version 2^63-1 (weights that fit) is taken: it is the first message of a run not seen.
        forged.run_id = "f" * 16
        rogue_frames = proto.encode(forged)
        pump(lambda: receiver.version == ROGUE_VERSION, lambda: rogue.send_multipart(rogue_frames), "the rogue run")

        # The learner restarts (without --resume: its versions start again at 1): the actor loads it.
        second_net = build_q_network((4,), 2, hidden=32)
        second = WeightsSnapshots(second_net, policy.name, start_version=0, every_updates=1, every_seconds=0)
        assert second.run_id != first.run_id
        learner_pub.publish(next_version(second))
        pump(lambda: receiver.version == 1, learner_sends, "the new learner run's version 1")
        assert receiver.run_id == second.run_id and same(policy, second_net)
        assert receiver.lag == 0 and receiver.newest_seen == 1  # the rogue's version left no lag behind
        learner_pub.publish(next_version(second))
        pump(lambda: receiver.version == 2, learner_sends, "the new learner run's version 2")
        assert receiver.runs == 3 and faults.counts["weights:stale_version"] == 0
    finally:
        receiver.close()
        learner_pub.close()
        rogue.close(0)


def test_a_jump_within_the_bound_is_taken_beyond_it_refused(ctx: zmq.Context) -> None:
    """An actor partitioned while the learner published: the jump is taken up to ``max_version_jump``."""
    policy = build_policy((4,), 2, hidden=32, backend="numpy")
    faults = FaultCounter("actor")
    pub = ctx.socket(zmq.PUB)
    pub.bind("tcp://127.0.0.1:*")
    receiver = WeightsReceiver(ctx, pub.getsockopt_string(zmq.LAST_ENDPOINT), policy, faults, max_version_jump=1000)
    net = build_q_network((4,), 2, hidden=32)

    def deliver(version: int, until: Callable[[], bool]) -> None:
        msg = weights_message(net, version, policy.name)
        msg.run_id = "ab"
        frames = proto.encode(msg)
        deadline = time.monotonic() + DEADLINE_S
        while not until():
            assert time.monotonic() < deadline, f"version {version} never handled"
            pub.send_multipart(frames)
            receiver.poll()
            receiver.sock.poll(20)

    try:
        deliver(3, lambda: receiver.version == 3)
        deliver(1003, lambda: receiver.version == 1003)  # exactly the bound: taken
        deliver(2004, lambda: faults.counts["weights:version_jump"] >= 1)  # one more: refused
        assert receiver.version == 1003 and receiver.newest_seen == 1003 and receiver.rejected >= 1
        deliver(2003, lambda: receiver.version == 2003)
    finally:
        receiver.close()
        pub.close(0)
