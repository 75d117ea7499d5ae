"""A rogue process attacks every socket the replay, the learner and the gateway bind, while real traffic flows.

Garbage, truncated and oversized messages, frames announced far above the socket caps, wrong kinds and
well-formed messages with wrong shapes or values: no service crashes, every valid message still arrives, and the
rejects are counted by reason.
"""

from __future__ import annotations

import http.client
import time
from pathlib import Path

import numpy as np
import pytest
import zmq
from pipeline_helpers import get_json, get_text, metric_values
from reliability_helpers import bad_transitions, claim_huge_frame, header, raw_garbage, transitions

from flywheel import proto
from flywheel.testing.cluster import Cluster
from flywheel.testing.weights import WeightsWatcher
from flywheel.transport import make_socket

pytestmark = [pytest.mark.system, pytest.mark.timeout(300)]
TOKEN = "reliability-test-token-0123456789"
VALID_BATCHES, ROWS = 40, 16


def _post_chunked(port: int, path: str, chunks: int, chunk: bytes) -> int:
    """POST a body in chunks (no Content-Length, so the size is only known while reading); the status code."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.putrequest("POST", path)
    conn.putheader("Authorization", f"Bearer {TOKEN}")
    conn.putheader("Transfer-Encoding", "chunked")
    conn.endheaders()
    try:
        for _ in range(chunks):
            conn.send(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n")
        conn.send(b"0\r\n\r\n")
    except OSError:
        pass  # the gateway may answer and close before the whole body is sent
    status = conn.getresponse().status
    conn.close()
    return status


def test_rogue_peers_on_every_bound_socket(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    cluster = Cluster(tmp_path, settings={
        "gateway": {"CONTROL_TOKEN": TOKEN, "MAX_INSTANCES": "40"},
        "replay": {"CAPACITY": "100000", "MIN_SIZE_TO_SAMPLE": "64", "MAX_MESSAGE_MB": "16"},
        "learner": {"BATCH_SIZE": "32", "HIDDEN": "32", "PUBLISH_INTERVAL_UPDATES": "5", "TORCH_THREADS": "1"},
    })
    for service in ("gateway", "replay", "learner"):
        cluster.add(service)
    ctx = zmq.Context()
    socks: list[zmq.Socket] = []

    def sock(kind: int, endpoint: str) -> zmq.Socket:
        s = make_socket(ctx, kind, sndhwm=10_000)
        s.connect(endpoint)
        socks.append(s)
        return s

    watcher = WeightsWatcher(cluster.endpoint("weights")).follow()
    try:
        cluster.start_all()
        names = ["gateway-0", "replay-0", "learner-0"]
        cluster.wait(lambda: cluster.is_up("replay-0") and cluster.is_up("learner-0"), 120,
                     "replay and learner to report", alive=names)
        rss_before = {name: cluster.rss(name) for name in names}

        actor = sock(zmq.PUSH, cluster.endpoint("transitions"))  # the real traffic: counted rows
        rogue_push = sock(zmq.PUSH, cluster.endpoint("transitions"))
        rogue_dealer = sock(zmq.DEALER, cluster.endpoint("sample"))
        rogue_telemetry = sock(zmq.PUSH, cluster.endpoint("telemetry"))
        rogue_lease = sock(zmq.DEALER, cluster.endpoint("lease"))
        rogue_sub = {name: sock(zmq.XSUB, cluster.endpoint(name)) for name in ("weights", "control")}
        probe = sock(zmq.PUSH, cluster.endpoint("telemetry"))
        lease = sock(zmq.DEALER, cluster.endpoint("lease"))
        time.sleep(0.5)  # connections up, so nothing below waits in a queue for one
        lease.send_multipart(proto.encode(proto.LeaseRequest("honest-actor")))  # before the flood fills the table

        bad = bad_transitions(rng)
        huge_cut = {}
        for i in range(VALID_BATCHES):
            actor.send_multipart(proto.encode(transitions(ROWS, seq=i)))
            reason, frames = bad[i % len(bad)]
            rogue_push.send_multipart(frames)
            # sampling and priorities: garbage, an empty body, a wrong kind, bad values, a flood of requests
            rogue_dealer.send_multipart([rng.integers(0, 256, 32, dtype=np.uint8).tobytes()])
            rogue_dealer.send_multipart([b""])
            rogue_dealer.send_multipart(proto.encode(transitions(4)))
            rogue_dealer.send_multipart([header("sample_request", {"request_id": 1, "batch_size": 0}, [])])
            rogue_dealer.send_multipart(proto.encode(proto.PriorityUpdate(
                index=np.array([-5, 1 << 40, 3], np.int64), priority=np.array([np.nan, 1.0, -2.0], np.float32))))
            rogue_dealer.send_multipart([header("priorities", {}, [["index", "int64", [3]], ["priority", "float32",
                                                                                          [2]]]),
                                         np.zeros(3, np.int64).tobytes(), np.zeros(2, np.float32).tobytes()])
            for request in range(5):  # valid requests it never reads the answers to
                rogue_dealer.send_multipart(proto.encode(proto.SampleRequest(request_id=request, batch_size=4096)))
            # the gateway: garbage and invalid telemetry, oversized strings, too many instances; valid probes
            rogue_telemetry.send_multipart([rng.integers(0, 256, 48, dtype=np.uint8).tobytes()])
            rogue_telemetry.send_multipart(proto.encode(proto.Telemetry("gateway", "fake", i, 0.0)))
            rogue_telemetry.send_multipart([header("telemetry", {"service": "x" * 300, "instance": "i", "seq": 1,
                                                                 "time": 0.0}, [])])
            rogue_telemetry.send_multipart(proto.encode(proto.Telemetry("rogue", f"flood-{i}", 1, 0.0)))
            probe.send_multipart(proto.encode(proto.Telemetry("probe", "probe-0", i + 1, time.time(),
                                                              {"probe_messages_total": i + 1})))
            rogue_lease.send_multipart([rng.integers(0, 256, 40, dtype=np.uint8).tobytes()])
            rogue_lease.send_multipart(proto.encode(proto.LeaseReply("x", 0, 1, 1.0)))
            rogue_lease.send_multipart([header("lease_request", {"instance": "y" * 300}, [])])
            rogue_lease.send_multipart(proto.encode(proto.LeaseRequest(f"lease-flood-{i}")))
            for sub in rogue_sub.values():  # a PUB reads only subscriptions: anything else, and big frames
                sub.send_multipart([b"\x01"])
                sub.send_multipart([rng.integers(2, 256, 64, dtype=np.uint8).tobytes()])
            if i % 10 == 0:  # on fresh connections: frames announced at 4 GiB, and bytes that are not ZMTP
                for name, kind in (("transitions", b"PUSH"), ("sample", b"DEALER"), ("telemetry", b"PUSH"),
                                   ("lease", b"DEALER"), ("weights", b"SUB"), ("control", b"SUB")):
                    huge_cut[name] = claim_huge_frame(cluster.ports[name], kind) and huge_cut.get(name, True)
                    raw_garbage(cluster.ports[name], rng)
            time.sleep(0.05)
        assert huge_cut == dict.fromkeys(huge_cut, True), f"sockets without a size cap: {huge_cut}"
        for sub in rogue_sub.values():
            sub.send_multipart([b"\x01" + b"z" * 8192])  # above the PUB's inbound cap: the peer is cut off

        # The valid lease request got its answer.
        assert lease.poll(10_000), "no lease reply"
        reply = proto.decode(lease.recv_multipart(), expect=proto.LeaseReply)
        assert isinstance(reply, proto.LeaseReply) and reply.instance == "honest-actor" and reply.count >= 1

        # HTTP: a chunked body far over the 64 KiB limit is refused with 413; the API still answers.
        assert _post_chunked(cluster.ports["http"], "/control/set_lr", 160, b"[" * 65536) == 413
        conn = http.client.HTTPConnection("127.0.0.1", cluster.ports["http"], timeout=10)
        conn.request("GET", "/healthz")
        assert conn.getresponse().status == 200
        conn.close()

        # Every valid message arrived, and only those.
        valid_rows = VALID_BATCHES * ROWS
        cluster.wait(lambda: cluster.value("replay-0", "transitions_received_total") >= valid_rows, 30,
                     "every valid transition to arrive", alive=names)
        cluster.wait(lambda: cluster.value("probe-0", "probe_messages_total") == VALID_BATCHES, 30,
                     "the last valid telemetry message to arrive", alive=names)
        # the replay's next report holds the last wrong-kind sample request (counters arrive a report later)
        cluster.wait(lambda: cluster.value("replay-0", 'rejected_total{where="sample",reason="wrong_kind"}')
                     >= VALID_BATCHES, 30, "the replay to report every wrong-kind sample request", alive=names)
        replay = cluster.instance("replay-0")
        assert replay is not None
        assert replay["counters"]["transitions_received_total"] == valid_rows
        reasons = {key for key, value in replay["counters"].items()
                   if key.startswith('rejected_total{where="transitions"') and value > 0}
        assert reasons == {f'rejected_total{{where="transitions",reason="{r}"}}' for r, _ in bad}, reasons
        assert replay["counters"]['rejected_total{where="sample",reason="malformed"}'] >= VALID_BATCHES
        assert replay["counters"]['rejected_total{where="sample",reason="wrong_kind"}'] == VALID_BATCHES
        assert replay["counters"]['rejected_total{where="sample",reason="shape"}'] == 2 * VALID_BATCHES
        assert replay["counters"]["stale_priority_updates_total"] >= 3 * VALID_BATCHES

        # The learner kept training and publishing through it all.
        updates = cluster.value("learner-0", "updates_total")
        version = watcher.newest()
        cluster.wait(lambda: cluster.value("learner-0", "updates_total") > updates + 10 and watcher.newest() > version,
                     60, "the learner to keep training and publishing", alive=names)
        text = get_text(f"{cluster.url}/metrics")
        gateway_rejects = metric_values(text, "flywheel_gateway_messages_rejected_total")
        faults = {(label.split('socket="')[1].split('"')[0], label.split('fault="')[1].split('"')[0])
                  for label, value in gateway_rejects.items() if value > 0}
        assert {("telemetry", "malformed"), ("telemetry", "capacity"), ("telemetry", "oversized"),
                ("lease", "malformed"), ("lease", "wrong_kind"), ("lease", "oversized"),
                ("lease", "leases_per_peer")} <= faults, faults
        status = get_json(f"{cluster.url}/status")
        assert status is not None and "probe" in status["services"]
        for name in names:  # the 4 GiB announcements were never allocated
            assert cluster.rss(name) < rss_before[name] + (400 << 20), (name, rss_before[name], cluster.rss(name))
        cluster.check_alive()
    finally:
        for s in socks:
            s.close(0)
        watcher.close()
        ctx.term()
        codes = cluster.stop()
    assert all(code == 0 for code in codes.values()), codes
