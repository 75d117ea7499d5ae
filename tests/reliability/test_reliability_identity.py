"""Telemetry tied to CURVE identity: a key speaks only for its role, and a forged report cannot stop a run."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import zmq
from pipeline_helpers import get_text, metric_values
from reliability_helpers import cli_keys, curve

from flywheel import curves, proto, security
from flywheel.launch.runwatch import own_reports, target_reached
from flywheel.security import load_keys
from flywheel.testing.cluster import Cluster
from flywheel.transport import connect, make_socket
from flywheel.zap import IDENTITY_DOMAIN, ZapHandler

pytestmark = pytest.mark.timeout(180)


@pytest.fixture
def keys_dir(tmp_path: Path) -> Path:
    """Keys made by the CLI (one key pair per role), with a client folder for an actor on another host."""
    return cli_keys(tmp_path / "keys", "far")


def test_each_key_speaks_for_its_role() -> None:
    assert [security.key_role(n) for n in ("learner", "learner-2", "replay", "replay-b")] == [
        "learner", "learner", "replay", "replay"]
    assert {security.key_role(n) for n in ("actor", "far", "learnerx", "key:abcdefgh", "gateway")} == {"actor"}
    assert security.key_role("") == security.key_role("client") == "*", "plain local peers; the legacy shared key"
    assert security.speaks_for("far", "actor") and security.speaks_for("actor", "supervisor"), "flywheel run's"
    assert not any(security.speaks_for(k, s) for k in ("actor", "far", "replay") for s in ("learner",))
    assert not security.speaks_for("learner", "replay") and not security.speaks_for("actor", "replay")
    assert security.speaks_for("learner-2", "learner") and security.speaks_for("client", "learner")


def _pipe(rcvhwm: int, domain: bytes, named: bool = True, n: int = 20) -> tuple[int, str | None]:
    """``n`` messages through a CURVE PUSH -> PULL (the PULL at ``rcvhwm``, our ZAP handler; the client's key
    named ``actor`` or given without a name): how many arrived and the User-Id the last one carried."""
    server_public, server_secret = zmq.curve_keypair()
    client_public, client_secret = zmq.curve_keypair()
    ctx = zmq.Context()
    try:
        ZapHandler(ctx, frozenset({client_public}), {client_public: "actor"} if named else None)
        pull = ctx.socket(zmq.PULL)
        pull.setsockopt(zmq.RCVHWM, rcvhwm)
        pull.setsockopt(zmq.ZAP_DOMAIN, domain)
        pull.setsockopt(zmq.CURVE_SECRETKEY, server_secret)
        pull.setsockopt(zmq.CURVE_SERVER, 1)
        pull.bind("tcp://127.0.0.1:0")
        push = ctx.socket(zmq.PUSH)
        push.setsockopt(zmq.SNDHWM, 1)
        push.setsockopt(zmq.CURVE_SERVERKEY, server_public)
        push.setsockopt(zmq.CURVE_PUBLICKEY, client_public)
        push.setsockopt(zmq.CURVE_SECRETKEY, client_secret)
        push.connect(pull.getsockopt(zmq.LAST_ENDPOINT).decode())
        received, sent, user = 0, 0, None
        deadline = time.monotonic() + 3
        while received < n and time.monotonic() < deadline:
            if sent < n and push.poll(10, zmq.POLLOUT):
                push.send(b"m", zmq.NOBLOCK)
                sent += 1
            if pull.poll(10):
                try:
                    frame = pull.recv(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    continue
                received += 1
                user = security.peer_key(frame)
        return received, user
    finally:
        ctx.destroy(linger=0)


def test_the_user_id_is_given_only_on_identity_sockets_and_never_stalls_one() -> None:
    """libzmq 4.3.5 delivers nothing to a CURVE PULL at RCVHWM 1 when the ZAP reply carries a user id (measured:
    0 of 20; with an empty one, 20 of 20). So only sockets of IDENTITY_DOMAIN get one (the gateway's telemetry,
    whose ``identify_peers`` lifts RCVHWM 1 to 2); the replay's transitions PULL (RCVHWM 1 under the vector preset)
    keeps none. If the first assertion fails, libzmq no longer stalls and the RCVHWM lift can go."""
    assert _pipe(1, IDENTITY_DOMAIN) == (0, None), "libzmq's stall, which the domain split works round"
    assert _pipe(1, security.ZAP_DOMAIN) == (20, ""), "every other CURVE socket: no user id, no stall"
    assert _pipe(2, IDENTITY_DOMAIN) == (20, "actor"), "the key's name reaches the receiver"
    received, unnamed = _pipe(2, IDENTITY_DOMAIN, named=False)
    assert received == 20 and unnamed is not None and unnamed.startswith("key:"), "a key given without a name"
    ctx = zmq.Context()
    try:
        with curve(load_keys(server_key=zmq.curve_keypair()[0].decode())):
            sock = make_socket(ctx, zmq.PULL, rcvhwm=1)
            security.identify_peers(sock)
            assert sock.getsockopt(zmq.RCVHWM) == 2 and sock.getsockopt(zmq.ZAP_DOMAIN) == IDENTITY_DOMAIN
        sock.close(0)
    finally:
        ctx.term()


def test_a_plain_peer_on_an_identity_socket_is_unnamed() -> None:
    """A NULL (plain, local) connection to an identity socket passes ZAP with no User-Id, so it reads as a plain
    local peer (``key_role`` "*"), not as a key named "anonymous" (pyzmq's name for it, an actor's by key_role)."""
    ctx = zmq.Context()
    try:
        ZapHandler(ctx, frozenset({zmq.curve_keypair()[0]}))
        pull = ctx.socket(zmq.PULL)
        pull.setsockopt(zmq.RCVHWM, 2)
        pull.setsockopt(zmq.ZAP_DOMAIN, IDENTITY_DOMAIN)  # a ZAP domain: libzmq asks ZAP about NULL peers too
        pull.bind("tcp://127.0.0.1:0")
        push = ctx.socket(zmq.PUSH)
        push.connect(pull.getsockopt(zmq.LAST_ENDPOINT).decode())
        push.send(b"m")
        assert pull.poll(10_000), "a plain peer passes"
        frame = pull.recv(copy=False)
        assert security.peer_key(frame) == "" and security.key_role(security.peer_key(frame)) == "*"
    finally:
        ctx.destroy(linger=0)


def _report(service: str, instance: str, seq: int, gauges: dict[str, float],
            info: dict[str, str] | None = None) -> list[Any]:
    return proto.encode(proto.Telemetry(service=service, instance=instance, seq=seq, time=time.time(),
                                        gauges=gauges, info={"version": "test", **(info or {})}))


def _rejected(cluster: Cluster, fault: str) -> float:
    found = metric_values(get_text(f"{cluster.url}/metrics"), "flywheel_gateway_messages_rejected_total")
    return sum(v for label, v in found.items() if 'socket="telemetry"' in label and f'fault="{fault}"' in label)


@pytest.mark.system
def test_an_actor_key_cannot_speak_for_the_learner_nor_stop_the_run(keys_dir: Path, tmp_path: Path) -> None:
    """A real gateway on CURVE: reports claiming to be the learner (or the replay) from an actor's key, or from a
    joined host's, are refused and counted as ``identity``; /status's summary does not move and the run's stop
    decision is not reached. The learner's own key is heard; a joined actor's own greedy return is shown but does
    not stop the run."""
    cluster = Cluster(tmp_path / "run", settings={"gateway": {"CURVE_KEYS_DIR": str(keys_dir)}})
    cluster.add("gateway")
    role = {r: load_keys(keys_dir, role=r) for r in ("learner", "actor")}
    far = load_keys(keys_dir / "clients" / "far")
    ctx = zmq.Context()
    socks: dict[str, zmq.Socket] = {}
    try:
        cluster.start("gateway-0")
        cluster.wait(lambda: cluster.status() is not None, 60, "the gateway", alive=["gateway-0"])
        for name, keys in (("learner", role["learner"]), ("actor", role["actor"]), ("far", far)):
            with curve(keys):
                socks[name] = make_socket(ctx, zmq.PUSH)
                connect(socks[name], cluster.endpoint("telemetry"))
        honest = {"weight_version": 3.0, "best_greedy_return": 12.0, "best_weight_version": 3.0}
        socks["learner"].send_multipart(_report("learner", "learner-0", 1, honest, {"curve_key": "forged"}))
        cluster.wait(lambda: cluster.instance("learner-0") is not None, 30, "the learner's own report")
        learner = cluster.instance("learner-0")
        assert learner is not None and learner["info"]["curve_key"] == "learner", "the gateway says who sent it"
        status = cluster.status()
        assert status is not None
        before = status["summary"]
        assert target_reached(curves.summarize(own_reports(status)), 10.0) is not None, "the real one counts"

        forged = {"eval_return_mean": 9e15, "best_greedy_return": 9e15, "best_weight_version": 99.0,
                  "weight_version": 9e15}
        for seq, (who, service, instance) in enumerate([("actor", "learner", "learner-0"),
                                                        ("actor", "learner", "learner-9"),
                                                        ("far", "learner", "learner-0"),
                                                        ("actor", "replay", "replay-0")], start=2):
            socks[who].send_multipart(_report(service, instance, seq, forged))
        cluster.wait(lambda: _rejected(cluster, "identity") >= 4, 30, "the forged reports to be refused")
        # an actor's key speaks for an actor; so does the joined host's, whose greedy return must not stop the run
        socks["actor"].send_multipart(_report("actor", "actor-0", 1, {"eval_return_mean": 5.0}))
        socks["far"].send_multipart(_report("actor", "far-0", 1, {"eval_return_mean": 9e15}))
        cluster.wait(lambda: cluster.instance("far-0") is not None and cluster.instance("actor-0") is not None, 30,
                     "the actors' reports")
        status = cluster.status()
        assert status is not None
        assert _rejected(cluster, "identity") == 4 and status["gateway"]["rejected"]["telemetry:identity"] == 4
        learners = status["services"]["learner"]["instances"]
        assert [i["instance"] for i in learners] == ["learner-0"] and learners[0]["gauges"] == honest
        assert "replay" not in status["services"]
        after = {k: v for k, v in status["summary"].items() if k not in ("eval_return_mean", "epsilon")}
        assert after == {k: v for k, v in before.items() if k not in ("eval_return_mean", "epsilon")}
        assert cluster.instance("far-0", status)["info"]["curve_key"] == "far"  # type: ignore[index]
        assert target_reached(curves.summarize(own_reports(status)), 1e6) is None, "no forged figure stops the run"
        assert target_reached(curves.summarize(status), 1e6) is not None, "(the joined host's figure, unfiltered)"
    finally:
        for sock in socks.values():
            sock.close(0)
        ctx.term()
        codes = cluster.stop()
    assert all(code == 0 for code in codes.values()), codes


@pytest.mark.system
def test_a_plain_local_peer_speaks_for_any_service(tmp_path: Path) -> None:
    """Without CURVE (``flywheel run`` on one host) reports are local and trusted, as before."""
    cluster = Cluster(tmp_path / "run")
    cluster.add("gateway")
    ctx = zmq.Context()
    push = make_socket(ctx, zmq.PUSH)
    try:
        cluster.start("gateway-0")
        cluster.wait(lambda: cluster.status() is not None, 60, "the gateway", alive=["gateway-0"])
        connect(push, cluster.endpoint("telemetry"))
        push.send_multipart(_report("learner", "learner-0", 1, {"best_greedy_return": 12.0}))
        cluster.wait(lambda: cluster.instance("learner-0") is not None, 30, "the local learner's report")
        assert "curve_key" not in cluster.instance("learner-0")["info"]  # type: ignore[index]
    finally:
        push.close(0)
        ctx.term()
        cluster.stop()
