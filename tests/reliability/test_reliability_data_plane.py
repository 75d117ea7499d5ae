"""The data plane closed by default: no plaintext bind other hosts can reach, and whole-message budgets."""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import zmq
from pipeline_helpers import clean_env, get_text, metric_values
from reliability_helpers import transitions

from flywheel import keyfiles, proto, security
from flywheel.security import PlaintextBindRefused, load_keys, loopback_only
from flywheel.testing.cluster import Cluster
from flywheel.transport import (
    MAX_PARTS,
    TELEMETRY_MAX_BYTES,
    MessageTooLarge,
    bind,
    make_socket,
    queued_messages,
    receive,
)

pytestmark = pytest.mark.timeout(180)
PART = 60 * 1024


@pytest.fixture
def plain() -> Iterator[None]:
    """This process with no CURVE keys and plaintext not allowed (the default); restored afterwards."""
    before = security.active()
    security.configure(None, service="replay")
    try:
        yield
    finally:
        security.configure(before)


@pytest.mark.parametrize(("endpoint", "local"), [
    ("tcp://127.0.0.1:5555", True), ("tcp://127.3.4.5:0", True), ("tcp://localhost:5555", True),
    ("tcp://[::1]:5555", True), ("tcp://lo:5555", True), ("ipc:///tmp/x.ipc", True), ("inproc://x", True),
    ("tcp://*:5555", False), ("tcp://0.0.0.0:5555", False), ("tcp://10.0.0.2:5555", False),
    ("tcp://eth0:5555", False), ("tcp://[::]:5555", False), ("tcp://replay:5555", False),
    ("epgm://eth0;239.192.1.1:5555", False),
])
def test_loopback_only_knows_which_addresses_other_hosts_reach(endpoint: str, local: bool) -> None:
    assert loopback_only(endpoint) is local


def test_a_reachable_plaintext_bind_is_refused_unless_allowed(plain: None, tmp_path: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    ctx = zmq.Context()
    try:
        sock = make_socket(ctx, zmq.PULL)
        with pytest.raises(PlaintextBindRefused, match="FLYWHEEL_REPLAY_ALLOW_PLAINTEXT=true") as refused:
            bind(sock, "tcp://0.0.0.0:0", "replay transitions", "FLYWHEEL_REPLAY_TRANSITIONS_BIND")
        message = str(refused.value)
        assert "\n" not in message and "flywheel keys generate" in message
        assert "FLYWHEEL_REPLAY_CURVE_KEYS_DIR" in message
        assert bind(sock, "tcp://127.0.0.1:0", "replay transitions", "x").startswith("tcp://127.0.0.1:")
        # Allowed explicitly: it binds, with a warning at the bind.
        security.configure(None, allow_plaintext=True, service="replay")
        with caplog.at_level(logging.WARNING, logger="flywheel.security"):
            bound = bind(sock, "tcp://0.0.0.0:0", "replay sample", "FLYWHEEL_REPLAY_SAMPLE_BIND")
        assert bound.startswith("tcp://0.0.0.0:")
        assert any("PLAINTEXT bind of tcp://0.0.0.0:0" in r.getMessage() for r in caplog.records)
        sock.close(0)
        # With CURVE keys, the same bind is a CURVE server and needs no permission.
        folder = tmp_path / "keys"
        keyfiles.generate(folder)
        security.configure(load_keys(folder), service="replay")
        curve_sock = make_socket(ctx, zmq.PULL)
        assert bind(curve_sock, "tcp://0.0.0.0:0", "replay transitions", "x").startswith("tcp://0.0.0.0:")
        assert curve_sock.getsockopt(zmq.CURVE_SERVER) == 1
        curve_sock.close(0)
    finally:
        ctx.term()


@pytest.mark.parametrize(("service", "flags", "variable"), [
    ("replay", ["--transitions-bind", "tcp://*:0", "--sample-bind", "tcp://127.0.0.1:0"], "FLYWHEEL_REPLAY_"),
    ("learner", ["--env-id", "CartPole-v1", "--weights-bind", "tcp://0.0.0.0:0"], "FLYWHEEL_LEARNER_"),
    ("gateway", ["--http-port", "0", "--telemetry-endpoint", "tcp://*:0"], "FLYWHEEL_GATEWAY_"),
])
@pytest.mark.system
def test_a_service_binding_every_interface_without_keys_refuses_to_start(
        service: str, flags: list[str], variable: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "flywheel", service, *flags], env=clean_env(),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    assert f"{variable}CURVE_KEYS_DIR" in errors[0] and f"{variable}ALLOW_PLAINTEXT=true" in errors[0]


@pytest.fixture
def pair() -> Iterator[tuple[zmq.Socket, zmq.Socket]]:
    """A PULL socket with a 64 KiB budget and a receive HWM of 10, and a PUSH peer over TCP loopback."""
    ctx = zmq.Context()
    pull = make_socket(ctx, zmq.PULL, rcvhwm=10, max_msg_bytes=64 * 1024)
    pull.bind("tcp://127.0.0.1:0")
    endpoint = pull.getsockopt_string(zmq.LAST_ENDPOINT)
    push = make_socket(ctx, zmq.PUSH, sndhwm=100)
    push.connect(endpoint)
    try:
        yield pull, push
    finally:
        push.close(0)
        pull.close(0)
        ctx.term()


def _next(pull: zmq.Socket) -> list[zmq.Frame]:
    assert pull.poll(10_000), "nothing arrived"
    return receive(pull)


def test_a_message_past_the_whole_message_budget_is_dropped_part_by_part(pair: tuple[zmq.Socket, zmq.Socket]) -> None:
    pull, push = pair
    part = np.zeros(PART, np.uint8)
    push.send_multipart([part] * 1001)  # 59 MiB in parts that each pass ZMQ_MAXMSGSIZE (64 KiB)
    push.send_multipart([b"x" * 10] * (MAX_PARTS + 1))  # tiny, but more parts than any message has
    push.send_multipart([part, part])  # 120 KiB: two parts, each fine, together past the budget
    push.send_multipart([part, b"tail"])  # within the budget: arrives whole
    with pytest.raises(MessageTooLarge, match="more than 65536 bytes"):
        _next(pull)
    with pytest.raises(MessageTooLarge, match=f"more than {MAX_PARTS} parts"):
        _next(pull)
    with pytest.raises(MessageTooLarge, match="more than 65536 bytes"):
        _next(pull)
    frames = _next(pull)
    assert [len(f) for f in frames] == [PART, 4] and frames[1].bytes == b"tail"
    assert not pull.poll(100), "the refused messages' parts were left on the socket"


def test_queued_messages_counts_an_oversized_message_and_goes_on(pair: tuple[zmq.Socket, zmq.Socket]) -> None:
    pull, push = pair
    good = proto.encode(transitions(4))
    push.send_multipart([*good, *([b"y" * 100] * 200)])  # a valid batch padded with 200 parts
    push.send_multipart(good)
    refused: list[proto.DecodeError] = []
    assert pull.poll(10_000)
    time.sleep(0.2)
    got = list(queued_messages(pull, proto.TransitionBatch, refused.append))
    assert len(got) == 1 and len(got[0]) == 4
    assert [type(e) for e in refused] == [MessageTooLarge] and refused[0].fault == "oversized"


@pytest.mark.system
def test_the_replay_and_gateway_refuse_a_thousand_part_message_and_keep_serving(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, settings={"replay": {"MAX_MESSAGE_MB": "16", "MIN_SIZE_TO_SAMPLE": "64"}})
    cluster.add("gateway")
    cluster.add("replay")
    ctx = zmq.Context()
    socks: list[zmq.Socket] = []
    try:
        cluster.start_all()
        cluster.wait(lambda: cluster.is_up("replay-0"), 90, "the replay to report", alive=["gateway-0", "replay-0"])
        for name in ("transitions", "telemetry"):
            sock = make_socket(ctx, zmq.PUSH, sndhwm=100)
            sock.connect(cluster.endpoint(name))
            socks.append(sock)
        actor, telemetry = socks
        time.sleep(0.3)
        part = np.zeros(PART, np.uint8)
        actor.send_multipart([*proto.encode(transitions(8)), *([part] * 300)])  # 17.6 MiB past the 16 MiB budget
        actor.send_multipart([b"z"] * 1001)  # tiny, but 1,001 parts
        telemetry.send_multipart([np.zeros(TELEMETRY_MAX_BYTES, np.uint8)] * 1001)  # each part at the socket's cap
        actor.send_multipart(proto.encode(transitions(8, seq=1)))
        telemetry.send_multipart(proto.encode(proto.Telemetry("probe", "probe-0", 1, time.time(), {"probe_total": 1})))
        cluster.wait(lambda: cluster.value("replay-0", "transitions_received_total") >= 8, 30,
                     "the valid batch after the big ones", alive=["gateway-0", "replay-0"])
        cluster.wait(lambda: cluster.value("probe-0", "probe_total") == 1, 30, "the valid telemetry after the big one",
                     alive=["gateway-0", "replay-0"])
        replay = cluster.instance("replay-0")
        assert replay is not None
        assert replay["counters"]["transitions_received_total"] == 8
        assert replay["counters"]['rejected_total{where="transitions",reason="oversized"}'] == 2
        rejects = metric_values(get_text(f"{cluster.url}/metrics"), "flywheel_gateway_messages_rejected_total")
        oversized = [value for label, value in rejects.items()
                     if 'socket="telemetry"' in label and 'fault="oversized"' in label]
        assert oversized == [1.0], rejects
        cluster.check_alive()
    finally:
        for sock in socks:
            sock.close(0)
        ctx.term()
        codes = cluster.stop()
    assert all(code == 0 for code in codes.values()), codes
