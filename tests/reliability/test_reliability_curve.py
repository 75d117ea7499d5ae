"""Optional ZeroMQ CURVE: keys, settings errors, bytes on the wire, and a whole pipeline with rogue clients."""

from __future__ import annotations

import dataclasses
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import zmq
from pipeline_helpers import clean_env, get_text, metric_values
from reliability_helpers import cli_keys, closed_by_peer, curve, transitions

from flywheel import keyfiles, proto
from flywheel.security import CurveKeyError, keys_from_settings, load_keys
from flywheel.services.actor.settings import ActorSettings
from flywheel.services.gateway.settings import GatewaySettings
from flywheel.services.replay.settings import ReplaySettings
from flywheel.testing.cluster import Cluster
from flywheel.testing.weights import WeightsWatcher
from flywheel.transport import bind, connect, make_socket

pytestmark = [pytest.mark.timeout(240), pytest.mark.system]  # every test starts `flywheel keys` (keys_dir)
MARKER = "plaintext-marker-4f2a"


@pytest.fixture
def keys_dir(tmp_path: Path) -> Path:
    """Keys made by the CLI, with one extra named client."""
    return cli_keys(tmp_path / "keys", "remote")


def test_keys_generate_layout_and_refusals(keys_dir: Path) -> None:
    roles = ("learner", "replay", "actor")  # one client key pair per role that connects (flywheel/security.py)
    assert {p.name for p in keys_dir.iterdir()} == {"server.key", "server.key_secret", "authorized", "clients",
                                                    *(f"{r}.{kind}" for r in roles for kind in ("key", "key_secret"))}
    assert (keys_dir / "server.key_secret").stat().st_mode & 0o077 == 0
    assert {p.name for p in (keys_dir / "authorized").iterdir()} == {"learner.key", "replay.key", "actor.key",
                                                                    "remote.key"}
    remote = load_keys(keys_dir / "clients" / "remote")
    assert remote is not None
    for role in roles:
        keys = load_keys(keys_dir, role=role)
        assert keys is not None and keys.client_public in keys.authorized and keys.client_public != remote.client_public
        assert dict(keys.names)[keys.client_public] == role and dict(keys.names)[remote.client_public] == "remote"
    assert remote.server_secret is None and remote.server_public == keys.server_public
    again = subprocess.run([sys.executable, "-m", "flywheel", "keys", "generate", str(keys_dir)], env=clean_env(),
                           capture_output=True, text=True, timeout=60)
    assert again.returncode == 2 and "--force" in again.stderr


def test_settings_say_what_is_missing_in_one_line(keys_dir: Path, tmp_path: Path) -> None:
    assert keys_from_settings(ReplaySettings(), "replay") is None  # no keys: plain, as before
    remote = keys_dir / "clients" / "remote"
    actor = keys_from_settings(ActorSettings(curve_keys_dir=remote), "actor")  # a client needs no server secret
    assert actor is not None and actor.client_secret is not None
    with pytest.raises(CurveKeyError, match="FLYWHEEL_REPLAY_CURVE_SERVER_SECRET_KEY"):
        keys_from_settings(ReplaySettings(curve_keys_dir=remote), "replay")
    with pytest.raises(CurveKeyError, match="does not exist"):
        keys_from_settings(ReplaySettings(curve_keys_dir=tmp_path / "nowhere"), "replay")
    with pytest.raises(CurveKeyError, match="not a Z85 CURVE key"):
        keys_from_settings(ActorSettings(curve_server_key="short", curve_client_secret_key="x" * 40), "actor")
    # Keys from variables alone (e.g. from a secret manager): the public keys follow from the secret ones.
    server_public, server_secret = zmq.curve_keypair()
    client_public, client_secret = zmq.curve_keypair()
    gateway = keys_from_settings(GatewaySettings(curve_server_secret_key=server_secret.decode(),
                                                 curve_authorized_keys=client_public.decode()), "gateway")
    assert gateway is not None and gateway.server_public == server_public and gateway.authorized == {client_public}
    with pytest.raises(CurveKeyError, match="no client is authorized"):
        keys_from_settings(GatewaySettings(curve_server_secret_key=server_secret.decode()), "gateway")
    proc = subprocess.run([sys.executable, "-m", "flywheel", "replay", "--curve-keys-dir", str(remote)],
                          env=clean_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "server secret key" in proc.stderr


def _relay(listen: socket.socket, target: int, seen: bytearray, stop: threading.Event) -> None:
    """Forward one TCP connection to ``target``, keeping every byte that passes."""
    client, _ = listen.accept()
    upstream = socket.create_connection(("127.0.0.1", target))
    for s in (client, upstream):
        s.settimeout(0.05)
    while not stop.is_set():
        for src, dst in ((client, upstream), (upstream, client)):
            try:
                data = src.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return
            if data:
                seen.extend(data)
                dst.sendall(data)
    client.close()
    upstream.close()


@pytest.mark.parametrize("encrypted", [False, True])
def test_curve_encrypts_what_crosses_the_network(keys_dir: Path, encrypted: bool) -> None:
    """A TCP relay between actor and replay sees the batch's text in the clear without CURVE, never with it."""
    keys = load_keys(keys_dir, role="replay") if encrypted else None  # binds and connects
    ctx = zmq.Context()
    listen = socket.create_server(("127.0.0.1", 0))
    seen, stop = bytearray(), threading.Event()
    try:
        with curve(keys):
            pull = make_socket(ctx, zmq.PULL)
            port = pull.bind_to_random_port("tcp://127.0.0.1") if keys is None else None
            if keys is not None:
                bind(pull, "tcp://127.0.0.1:*", "test", "-")
                port = int(pull.getsockopt_string(zmq.LAST_ENDPOINT).rsplit(":", 1)[1])
            relay = threading.Thread(target=_relay, args=(listen, port, seen, stop), daemon=True)
            relay.start()
            push = make_socket(ctx, zmq.PUSH)
            connect(push, f"tcp://127.0.0.1:{listen.getsockname()[1]}")
            push.send_multipart(proto.encode(transitions(4, actor=MARKER)))
        assert pull.poll(10_000), "the batch did not arrive"
        batch = proto.decode(pull.recv_multipart(), expect=proto.TransitionBatch)
        assert isinstance(batch, proto.TransitionBatch) and batch.actor == MARKER
        assert (MARKER.encode() in seen) is not encrypted
    finally:
        stop.set()
        listen.close()
        ctx.destroy(0)


def test_a_curve_pipeline_refuses_every_client_without_an_authorized_key(keys_dir: Path, tmp_path: Path) -> None:
    """Every service on CURVE: what authorized clients send arrives; plain, wrong-server-key and unauthorized
    clients get nothing through (and the replay counts nothing from them); the actor, learner and gateway work."""
    good = load_keys(keys_dir / "clients" / "remote")
    keyfiles.generate(tmp_path / "other")
    other = load_keys(tmp_path / "other", role="actor")
    assert good is not None and other is not None
    unauthorized = dataclasses.replace(other, server_public=good.server_public)
    curve_env = {"CURVE_KEYS_DIR": str(keys_dir)}
    cluster = Cluster(tmp_path / "run", settings={
        "gateway": dict(curve_env),
        "replay": {**curve_env, "CAPACITY": "20000", "MIN_SIZE_TO_SAMPLE": "64"},
        "learner": {**curve_env, "BATCH_SIZE": "32", "HIDDEN": "32", "PUBLISH_INTERVAL_UPDATES": "5",
                    "TORCH_THREADS": "1"},
        "actor": {**curve_env, "NUM_ENVS": "4", "HIDDEN": "32"},
    })
    for service in ("gateway", "replay", "learner"):
        cluster.add(service)
    cluster.add("actor")
    ctx = zmq.Context()
    names = ["gateway-0", "replay-0", "learner-0"]
    try:
        for name in names:
            cluster.start(name)
        cluster.wait(lambda: cluster.is_up("replay-0") and cluster.is_up("learner-0"), 120,
                     "replay and learner to report over CURVE", alive=names)
        sent, pushes = 0, []
        for keys, rows in ((None, 0), (other, 0), (unauthorized, 0), (good, 8)):
            with curve(keys):
                push = make_socket(ctx, zmq.PUSH)
                connect(push, cluster.endpoint("transitions"))
                dealer = make_socket(ctx, zmq.DEALER)
                connect(dealer, cluster.endpoint("lease"))
            pushes += [push, dealer]  # kept open: the refused ones keep trying (and being refused)
            try:  # a refused client's session may already be gone (libzmq drops it on a failed handshake)
                dealer.send_multipart(proto.encode(proto.LeaseRequest(f"lease-{rows}-{len(pushes)}")),
                                      flags=zmq.NOBLOCK)
            except zmq.Again:
                assert rows == 0, "the authorized client's lease request could not be queued"
            for seq in range(10):
                try:  # plain and refused sockets never get a connection: their sends would block
                    push.send_multipart(proto.encode(transitions(8, seq=seq)), flags=zmq.NOBLOCK)
                except zmq.Again:
                    pass
            sent += 10 * rows
        for port in (cluster.ports["transitions"], cluster.ports["lease"]):  # bytes that are not CURVE: cut
            with socket.create_connection(("127.0.0.1", port)) as raw:
                raw.sendall(b"\x01" + np.arange(256, dtype=np.uint8).tobytes() * 8)
                assert closed_by_peer(raw, 5)

        def gateway_refused() -> set[str]:
            found = metric_values(get_text(f"{cluster.url}/metrics"), "flywheel_gateway_curve_handshakes_refused_total")
            return {label.split('reason="')[1].split('"')[0] for label, value in found.items() if value > 0}
        cluster.wait(lambda: {"unauthorized_key", "protocol"} <= gateway_refused(), 20,
                     "the gateway to count the lease clients it refused", alive=names)
        cluster.wait(lambda: cluster.value("replay-0", "transitions_received_total") >= sent, 30,
                     "the authorized client's transitions", alive=names)
        time.sleep(2.0)  # what the refused clients might still get through would have arrived by now
        replay = cluster.instance("replay-0")
        assert replay is not None and replay["counters"]["transitions_received_total"] == sent
        assert replay["info"]["curve"] == "on" and replay["counters"]["messages_rejected_total"] == 0
        assert replay["counters"]['curve_handshakes_refused_total{reason="unauthorized_key"}'] > 0
        assert replay["counters"]['curve_handshakes_refused_total{reason="protocol"}'] > 0
        # A real actor over CURVE: transitions in, weights out, a lease and telemetry from the gateway.
        with curve(good):
            watcher = WeightsWatcher(cluster.endpoint("weights")).follow()
        try:
            cluster.start("actor-0")
            cluster.wait(lambda: cluster.value("actor-0", "weight_version") > 0 and cluster.value(
                "actor-0", "lease_slots") == 1 and cluster.value("replay-0", "transitions_received_total") > sent
                and cluster.value("learner-0", "updates_total") > 5, 120,
                "the actor to act, send and get weights over CURVE", alive=[*names, "actor-0"])
            assert watcher.newest() > 0  # an authorized subscriber outside the cluster gets the weights too
        finally:
            watcher.close()
    finally:
        ctx.destroy(0)
        codes = cluster.stop()
    assert all(code == 0 for code in codes.values()), codes


def test_one_socket_serves_plain_unix_sockets_and_curve_tcp(keys_dir: Path, tmp_path: Path) -> None:
    """As ``flywheel run`` binds the replay: local actors on a Unix socket (plain), remote ones on TCP (CURVE)."""
    keys = load_keys(keys_dir, role="replay")
    ctx = zmq.Context()
    ipc = f"ipc://{tmp_path}/transitions"
    try:
        with curve(keys):
            pull = make_socket(ctx, zmq.PULL)
            bind(pull, ipc, "test", "-")
            bind(pull, "tcp://127.0.0.1:*", "test", "-")
            tcp = pull.getsockopt_string(zmq.LAST_ENDPOINT)
            local, remote = make_socket(ctx, zmq.PUSH), make_socket(ctx, zmq.PUSH)
            connect(local, ipc)
            connect(remote, tcp)
        plain = make_socket(ctx, zmq.PUSH)
        connect(plain, tcp)  # no keys: refused
        for sock, name in ((local, "local"), (remote, "remote")):
            sock.send_multipart(proto.encode(transitions(2, actor=name)), flags=zmq.NOBLOCK)
        try:
            plain.send_multipart(proto.encode(transitions(2, actor="plain")), flags=zmq.NOBLOCK)
        except zmq.Again:
            pass  # the refused handshake already dropped its pipe (libzmq remakes it on each ~100 ms retry)
        got = set()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if pull.poll(100):
                msg = proto.decode(pull.recv_multipart(), expect=proto.TransitionBatch)
                got.add(msg.actor)
        assert got == {"local", "remote"}
    finally:
        ctx.destroy(0)


def test_flywheel_run_hands_the_keys_to_every_service(keys_dir: Path, tmp_path: Path) -> None:
    from flywheel.cli import build_parser
    from flywheel.launch.run import make_plan
    from flywheel.settings import SettingsError

    args = build_parser().parse_args(["run", "--env", "CartPole-v1", "--curve-keys-dir", str(keys_dir),
                                      "--checkpoint-dir", str(tmp_path), "--base-port", "0", "--http-port", "0"])
    plan = make_plan(args)
    assert {values["CURVE_KEYS_DIR"] for values in plan.env.values()} == {str(keys_dir.resolve())}
    args.curve_keys_dir = keys_dir / "clients" / "remote"  # a client's folder: the replay could not bind
    with pytest.raises(SettingsError, match="server secret key"):
        make_plan(args)
