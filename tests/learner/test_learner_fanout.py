"""The weights fan-out budget: the pure rule (FanoutShaper), and the weights PUB over real sockets counting its
subscribers and sending only the newest version at the shaped spacing."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import zmq

from flywheel import keyfiles, proto, security
from flywheel.security import load_keys
from flywheel.services.learner.fanout import FanoutShaper, fanout_interval
from flywheel.services.learner.settings import LearnerSettings
from flywheel.services.learner.transport import WeightsPublisher
from flywheel.settings import setting_default
from flywheel.transport import subscriber

DEADLINE_S = 20.0
MARIO_WEIGHTS_BYTES = 461_872  # one encoded Mario weights message (docs/benchmarks/results/load_20261204)


@pytest.fixture
def ctx() -> Iterator[zmq.Context]:
    context = zmq.Context()
    yield context
    context.destroy(linger=0)


def test_the_interval_is_subscribers_times_bytes_over_the_budget() -> None:
    assert fanout_interval(10, 1000, 5000.0) == pytest.approx(2.0)
    assert fanout_interval(0, 1000, 5000.0) == 0.0  # nobody to send to
    assert fanout_interval(10, 1000, 0.0) == 0.0  # no budget


def test_the_default_budget_leaves_16_actors_alone_and_stretches_256() -> None:
    budget = setting_default(LearnerSettings, "weights_fanout_mb_per_s") * 1e6
    # the load test's learner published 1.6 times a second at 16 actors and 0.84 at 256 (two busy cores)
    assert fanout_interval(2, MARIO_WEIGHTS_BYTES, budget) < fanout_interval(16, MARIO_WEIGHTS_BYTES, budget) < 0.2
    assert fanout_interval(256, MARIO_WEIGHTS_BYTES, budget) > 1 / 0.84


def test_a_version_due_early_waits_and_the_republish_obeys_the_budget() -> None:
    shaper = FanoutShaper(bytes_per_s=1000.0, republish_s=5.0)  # 4 subscribers x 500 bytes: one send per 2 s
    assert shaper.offer(0.0, 4, 500)  # the first goes at once
    shaper.sent(0.0)
    assert not shaper.binding
    assert not shaper.offer(1.0, 4, 500) and not shaper.offer(1.5, 4, 500)  # the second replaces the first
    assert shaper.deferred_total == 2 and shaper.waiting and shaper.binding
    assert not shaper.due(1.9, 4, 500) and shaper.due(2.0, 4, 500)  # the waiting one: at the interval
    shaper.sent(2.0)
    assert not shaper.due(6.9, 4, 500) and shaper.due(7.0, 4, 500)  # nothing waits: after republish_s
    assert not shaper.due(8.0, 40, 500) and shaper.due(22.0, 40, 500)  # 40 subscribers: 20 s > republish_s
    assert shaper.deferred_total == 2


def test_binding_stops_only_when_the_budget_is_free_for_two_intervals() -> None:
    shaper = FanoutShaper(bytes_per_s=1000.0, republish_s=60.0)  # 2 s between sends
    shaper.sent(0.0)
    assert not shaper.offer(1.0, 4, 500) and shaper.binding
    shaper.sent(2.0)
    assert shaper.offer(5.0, 4, 500) and shaper.binding  # 3 s after: sent, but it still binds (no flapping)
    shaper.sent(5.0)
    assert shaper.offer(9.0, 4, 500) and not shaper.binding  # 4 s = two intervals after: it no longer binds
    shaper.sent(9.0)
    assert shaper.offer(9.5, 0, 500)  # nobody subscribed: nothing to shape
    assert shaper.deferred_total == 1


def test_a_joining_subscriber_is_owed_the_newest_within_the_budget() -> None:
    shaper = FanoutShaper(bytes_per_s=1000.0, republish_s=60.0)  # 4 subscribers x 500 bytes: one send per 2 s
    assert shaper.offer(0.0, 4, 500)
    shaper.sent(0.0)
    shaper.joined()  # not after republish_s (60 s): at the budget's interval
    assert not shaper.due(1.9, 4, 500) and shaper.due(2.0, 4, 500)
    shaper.sent(2.0)
    assert not shaper.due(30.0, 4, 500) and shaper.deferred_total == 0  # owed once, then the republish timer


def weights(version: int) -> proto.Weights:
    return proto.Weights(version=version, network="test-net", tensors={"w": np.full(256, version, np.float32)},
                         run_id="ab12")


def pump(pub: WeightsPublisher, until: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not until():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        pub.tick(time.monotonic())
        time.sleep(0.01)


def versions(sub: zmq.Socket, count: int) -> list[int]:
    """The next ``count`` versions ``sub`` receives, then any more that came within 0.3 s."""
    out: list[int] = []
    while sub.poll(int(DEADLINE_S * 1000) if len(out) < count else 300):
        out.append(proto.decode(sub.recv_multipart(), expect=proto.Weights).version)
    return out


def test_subscribers_are_counted_up_and_down_over_real_sockets(ctx: zmq.Context) -> None:
    pub = WeightsPublisher(ctx, "tcp://127.0.0.1:0", republish_s=3600.0, fanout_bytes_per_s=0.0)
    subs = [subscriber(ctx, pub.endpoint) for _ in range(5)]
    try:
        pump(pub, lambda: pub.subscribers == 5, "5 subscribers")
        for sub in subs[:2]:
            sub.close(0)
        pump(pub, lambda: pub.subscribers == 3, "3 subscribers after 2 closed")
        subs.append(subscriber(ctx, pub.endpoint))  # one joins again: a new connection
        pump(pub, lambda: pub.subscribers == 4, "4 subscribers")
        pub.publish(weights(1))
        assert [versions(sub, 1) for sub in subs[2:]] == [[1]] * 4
        assert pub.fanout_bytes_total == 4 * sum(memoryview(f).nbytes for f in proto.encode(weights(1)))
    finally:
        for sub in subs:
            sub.close(0)
        pub.close()


def test_a_burst_under_a_tiny_budget_delivers_only_the_newest_at_the_shaped_spacing(
        ctx: zmq.Context, caplog: pytest.LogCaptureFixture) -> None:
    pub = WeightsPublisher(ctx, "tcp://127.0.0.1:0", republish_s=1.0, fanout_bytes_per_s=1.0)  # an hour apart
    subs = [subscriber(ctx, pub.endpoint) for _ in range(3)]
    try:
        pump(pub, lambda: pub.subscribers == 3, "3 subscribers")
        with caplog.at_level(logging.INFO, logger="flywheel.learner"):
            for version in range(1, 6):
                pub.publish(weights(version))  # the first goes at once, the other four wait
            first = pub.shaper.last_send
            interval = pub.min_interval
            assert interval > 600 and pub.shaper.deferred_total == 4
            pub.tick(first + interval * 0.999)  # neither the waiting version nor a republish (1 s) goes yet
            assert pub.shaper.waiting and pub.shaper.last_send == first
            pub.tick(first + interval)  # now the newest, once
            assert not pub.shaper.waiting and pub.shaper.last_send == first + interval
            pub.tick(first + interval + 2.0)  # a republish would be due after 1 s: the budget holds it back
        assert [versions(sub, 2) for sub in subs] == [[1, 5]] * 3
        binds = [r.getMessage() for r in caplog.records if "fan-out budget" in r.getMessage()]
        assert len(binds) == 1 and "binds: 3 subscribers" in binds[0]  # one line, not one per deferral

        caplog.clear()
        pub.shaper.bytes_per_s = 0.0  # the budget lifted: the next version goes at once, and it no longer binds
        with caplog.at_level(logging.INFO, logger="flywheel.learner"):
            pub.publish(weights(6), now=first + interval + 3.0)  # the clock the ticks above were given
        assert [versions(sub, 1) for sub in subs] == [[6]] * 3 and pub.shaper.deferred_total == 4
        assert [r.getMessage() for r in caplog.records if "no longer binds" in r.getMessage()] != []
    finally:
        for sub in subs:
            sub.close(0)
        pub.close()


def test_a_late_subscriber_gets_the_newest_version_at_once_not_at_the_republish(ctx: zmq.Context) -> None:
    pub = WeightsPublisher(ctx, "tcp://127.0.0.1:0", republish_s=3600.0, fanout_bytes_per_s=0.0)
    early = subscriber(ctx, pub.endpoint)
    late: zmq.Socket | None = None
    try:
        pump(pub, lambda: pub.subscribers == 1, "the first subscriber")
        pub.publish(weights(1))
        assert versions(early, 1) == [1]
        late = subscriber(ctx, pub.endpoint)  # joins after version 1 went out; the republish is an hour away
        pump(pub, lambda: late is not None and bool(late.poll(0)), "version 1 for the late subscriber")
        assert versions(late, 1) == [1]
        assert versions(early, 1) == [1]  # a PUB sends to all: the early one sees it again, as at a republish
    finally:
        early.close(0)
        if late is not None:
            late.close(0)
        pub.close()


def test_what_a_peer_sends_upstream_that_is_no_subscription_is_ignored(ctx: zmq.Context) -> None:
    """An XSUB peer may send anything up to the weights XPUB: an empty message, a multipart one, text. None changes
    the subscriber count (its real subscription after them does); one past the 4 KiB inbound limit ends its
    connection and so its subscription; none stops the next version reaching a real subscriber."""
    pub = WeightsPublisher(ctx, "tcp://127.0.0.1:0", republish_s=3600.0, fanout_bytes_per_s=0.0)
    rogue = ctx.socket(zmq.XSUB)
    rogue.connect(pub.endpoint)
    sub = subscriber(ctx, pub.endpoint)
    try:
        pump(pub, lambda: pub.subscribers == 1, "the real subscriber")
        for message in ([b""], [b"\x07", b"two frames"], [b"\x02not a subscription"], [b"\x05" * 3]):
            rogue.send_multipart(message)
        rogue.send(b"\x01")  # then a real subscription, behind the others on the same connection
        pump(pub, lambda: pub.subscribers == 2, "the rogue's real subscription")
        rogue.send(b"x" * 10_000)  # past the inbound limit: libzmq drops the connection, and its subscription
        pump(pub, lambda: pub.subscribers == 1, "the oversized sender's subscription to end")
        pub.publish(weights(3))
        assert versions(sub, 1) == [3]
    finally:
        rogue.close(0)
        sub.close(0)
        pub.close()


def test_a_peer_that_repeats_its_subscription_counts_once_and_is_owed_one_republish(ctx: zmq.Context) -> None:
    """Subscribers are counted at most one per open connection (the socket monitor's accepts and disconnects): an
    XSUB that sends the subscribe message 1,000 times is one subscriber, makes one republish (owed to its new
    connection), not 1,000, and leaves nothing counted when it closes."""
    pub = WeightsPublisher(ctx, "tcp://127.0.0.1:0", republish_s=3600.0, fanout_bytes_per_s=0.0)
    sub = subscriber(ctx, pub.endpoint)
    rogue = ctx.socket(zmq.XSUB)
    rogue.connect(pub.endpoint)
    late: zmq.Socket | None = None
    try:
        pump(pub, lambda: pub.subscribers == 1 and pub.connections.count == 2, "the subscriber and the rogue")
        pub.publish(weights(1))
        assert versions(sub, 1) == [1]
        for _ in range(1000):
            rogue.send(b"\x01")
        pump(pub, lambda: pub.subscriptions == 1001, "the rogue's 1,000 subscribe messages")
        assert pub.subscribers == 2 and pub.min_interval == 0.0
        settle = time.monotonic() + 0.5
        pump(pub, lambda: time.monotonic() > settle, "a moment of ticks")
        assert versions(sub, 1) == [1]  # one republish for the rogue's connection, then nothing (0.3 s)
        rogue.close(0)
        pump(pub, lambda: pub.subscribers == 1 and pub.connections.count == 1, "the rogue to be gone")
        late = subscriber(ctx, pub.endpoint)
        pump(pub, lambda: pub.subscribers == 2, "a new subscriber counted after the rogue left")
        assert versions(late, 1) == [1]
    finally:
        for sock in (sub, rogue, late):
            if sock is not None:
                sock.close(0)
        pub.close()


def test_over_curve_the_connection_count_keeps_counting_refused_handshakes(ctx: zmq.Context, tmp_path: Path) -> None:
    """The publisher reads its socket's one monitor (flywheel.connections), so the ZAP handler does not: the
    handshakes it refuses still reach the process's refusal counts, and a CURVE subscriber counts as one."""
    folder = tmp_path / "keys"
    keyfiles.generate(folder)
    before = security.active()
    security.configure(load_keys(folder, role="learner"), service="learner")
    try:
        pub = WeightsPublisher(ctx, "tcp://127.0.0.1:0", republish_s=3600.0, fanout_bytes_per_s=0.0)
        refused = security.refused_counts().get("protocol", 0)
        plain = ctx.socket(zmq.SUB)  # no CURVE: refused before ZAP is asked
        plain.setsockopt(zmq.SUBSCRIBE, b"")
        plain.connect(pub.endpoint)
        sub = subscriber(ctx, pub.endpoint)  # the process's keys: a CURVE client
        try:
            pump(pub, lambda: pub.subscribers == 1 and security.refused_counts().get("protocol", 0) > refused,
                 "the CURVE subscriber, and the plain one refused")
            pub.publish(weights(2))
            assert versions(sub, 1) == [2] and not plain.poll(300)
        finally:
            plain.close(0)
            sub.close(0)
            pub.close()
    finally:
        security.configure(before)
