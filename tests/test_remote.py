"""Actors on other hosts: the plan of ``flywheel run --listen``, the join document, ``/join`` and ``actor --join``."""

from __future__ import annotations

import json
import re
import stat
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from flywheel import remote
from flywheel import run as run_module
from flywheel.cli import build_parser, main
from flywheel.registry import settings_class
from flywheel.services.gateway.app import GatewayService, create_app
from flywheel.services.gateway.settings import GatewaySettings
from flywheel.settings import SettingsError, settings_from_args
from flywheel.testing.ports import free_port_block

BASE = free_port_block(91)


def ports(text: str) -> str:
    """The expected text with the documented ports 471xx moved to this run's block."""
    return re.sub(r"471(\d\d)", lambda m: str(BASE + int(m.group(1))), text)


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    folder = tmp_path / "keys"
    assert main(["keys", "generate", str(folder), "--client", "far"]) == 0
    return folder


def _plan(tmp_path: Path, *flags: str) -> tuple[run_module.Plan, Path]:
    """A plan on ports 47100-47106 (transitions ... lease) and 47190 (HTTP), moved to a free block as a whole."""
    ckpt = tmp_path / "ckpt"
    args = build_parser().parse_args(["run", "--env", "CartPole-v1", "--checkpoint-dir", str(ckpt), "--base-port",
                                      str(BASE), "--http-port", str(BASE + 90), *flags])
    plan = run_module.make_plan(args)
    plan.remove_socket_dir()
    return plan, ckpt


def test_listen_binds_the_remote_ports_and_the_gateway_on_the_address(tmp_path: Path, keys: Path) -> None:
    plan, ckpt = _plan(tmp_path, "--listen", "10.77.0.1", "--curve-keys-dir", str(keys))
    env = plan.env
    assert env["replay"]["TRANSITIONS_BIND"].split(",")[-1] == ports("tcp://10.77.0.1:47100")
    assert env["replay"]["SAMPLE_BIND"].split(",")[-1] == ports("tcp://127.0.0.1:47101")  # the learner is local
    assert env["learner"]["WEIGHTS_BIND"] == ports("tcp://10.77.0.1:47102")
    assert env["actor"]["WEIGHTS_ENDPOINT"] == ports("tcp://10.77.0.1:47102")  # local actors reach the bound address
    assert env["gateway"]["TELEMETRY_ENDPOINT"] == ports("tcp://10.77.0.1:47103")
    assert env["learner"]["TELEMETRY_ENDPOINT"] == ports("tcp://10.77.0.1:47103")
    assert env["gateway"]["LEASE_ENDPOINT"] == env["actor"]["LEASE_ENDPOINT"] == ports("tcp://10.77.0.1:47105")
    assert env["gateway"]["HTTP_HOST"] == "10.77.0.1" and plan.gateway_url == ports("http://10.77.0.1:47190")
    token = Path(env["gateway"]["CONTROL_TOKEN_FILE"])  # HTTP beyond loopback needs a token: one made, private
    assert token.parent == ckpt and stat.S_IMODE(token.stat().st_mode) == 0o600 and len(token.read_text()) == 64
    assert plan.join is not None and plan.join["endpoints"] == {
        "TRANSITIONS_ENDPOINT": ports("tcp://10.77.0.1:47100"), "WEIGHTS_ENDPOINT": ports("tcp://10.77.0.1:47102"),
        "LEASE_ENDPOINT": ports("tcp://10.77.0.1:47105"), "TELEMETRY_ENDPOINT": ports("tcp://10.77.0.1:47103"),
        "CONTROL_ENDPOINT": ports("tcp://10.77.0.1:47104")}


def test_listen_on_every_address_advertises_another_and_keeps_local_traffic_on_loopback(tmp_path: Path,
                                                                                        keys: Path) -> None:
    plan, _ = _plan(tmp_path, "--listen", "0.0.0.0", "--advertise", "run.example", "--curve-keys-dir", str(keys))
    assert plan.env["learner"]["WEIGHTS_BIND"] == ports("tcp://0.0.0.0:47102")
    assert plan.env["actor"]["WEIGHTS_ENDPOINT"] == ports("tcp://127.0.0.1:47102")
    assert plan.join is not None and plan.join["endpoints"]["WEIGHTS_ENDPOINT"] == ports("tcp://run.example:47102")
    assert plan.gateway_url == ports("http://127.0.0.1:47190")


@pytest.mark.parametrize(("flags", "message"), [
    (("--listen", "10.77.0.1"), "--listen needs --curve-keys-dir"),
    (("--listen", "10.77.0.1", "--base-port", "0", "--curve-keys-dir", "K"), "--listen needs TCP ports"),
    (("--listen", "0.0.0.0", "--curve-keys-dir", "K"), "--listen 0.0.0.0 needs --advertise HOST"),
    (("--listen", "runhost", "--curve-keys-dir", "K"), "is not an IP address"),
])
def test_listen_refuses_what_cannot_work(tmp_path: Path, keys: Path, flags: tuple[str, ...], message: str) -> None:
    with pytest.raises(SettingsError, match=message):
        _plan(tmp_path, *(str(keys) if f == "K" else f for f in flags))


def test_the_join_document_holds_the_actor_settings_and_no_secret_or_local_path(tmp_path: Path, keys: Path) -> None:
    plan, ckpt = _plan(tmp_path, "--listen", "10.77.0.1", "--curve-keys-dir", str(keys), "--set", "actor.gamma=0.97")
    assert plan.join is not None
    path = remote.write_join_file(plan.join, plan.env, "CartPole-v1", {"name": "vector", "sha256": "x"}, ckpt)
    document = json.loads(path.read_text())
    actor = document["actor"]
    assert document["env_id"] == actor["ENV_ID"] == "CartPole-v1" and document["preset"]["name"] == "vector"
    assert actor["GAMMA"] == "0.97" and actor["HIDDEN"] == "128"  # the user's --set and the preset's values
    assert actor["TRANSITIONS_ENDPOINT"] == ports("tcp://10.77.0.1:47100")
    assert not {"CURVE_KEYS_DIR", "INSTANCE", "EVAL_ENVS"} & set(actor)
    assert str(keys) not in path.read_text() and "ipc://" not in path.read_text()


def test_the_gateway_serves_the_join_document_or_404(tmp_path: Path) -> None:
    path = tmp_path / "join.json"
    path.write_text(json.dumps({"format": remote.FORMAT, "actor": {"ENV_ID": "CartPole-v1"}}))
    for join_file, code in ((path, 200), (None, 404), (tmp_path / "missing.json", 404)):
        settings = GatewaySettings(telemetry_endpoint="tcp://127.0.0.1:*", control_endpoint="tcp://127.0.0.1:*",
                                   lease_endpoint="tcp://127.0.0.1:*", join_file=join_file)
        with TestClient(create_app(settings, GatewayService(settings))) as client:
            response = client.get("/join")
        assert response.status_code == code, join_file
        if code == 200:
            assert response.json()["actor"]["ENV_ID"] == "CartPole-v1"
        else:
            assert "flywheel run --listen" in response.json()["error"]


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, dict[str, object]]]:
    """A real HTTP server on the loopback answering /join with a document the test can change."""
    document: dict[str, object] = {"format": remote.FORMAT, "env_id": "CartPole-v1", "actor": {
        "ENV_ID": "CartPole-v1", "NUM_ENVS": "16", "GAMMA": "0.99", "HIDDEN": "128",
        "TRANSITIONS_ENDPOINT": "tcp://127.0.0.1:47100", "WEIGHTS_ENDPOINT": "tcp://127.0.0.1:47102"}}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = json.dumps(document).encode() if self.path == "/join" else b"{}"
            self.send_response(200 if self.path == "/join" else 404)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", document
    server.shutdown()
    server.server_close()


def _actor(argv: list[str], keys: Path | None = None) -> object:
    """``flywheel actor ARGV``'s settings, with the client folder ``keys/clients/far`` when given."""
    own = ["--curve-keys-dir", str(keys / "clients" / "far")] if keys is not None else []
    args = build_parser().parse_args(["actor", *argv, *own])
    settings = settings_from_args(settings_class("actor"), args, "actor")
    return remote.joined_settings(settings, args, "actor")


def test_actor_join_takes_the_runs_values_under_its_own_flags_and_variables(
        served: tuple[str, dict[str, object]], keys: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    url, _ = served
    monkeypatch.setenv("FLYWHEEL_ACTOR_GAMMA", "0.5")
    settings = _actor(["--join", url, "--num-envs", "3"], keys)
    assert settings.env_id == "CartPole-v1" and settings.hidden == 128  # type: ignore[attr-defined]
    assert settings.transitions_endpoint == "tcp://127.0.0.1:47100"  # type: ignore[attr-defined]
    assert settings.num_envs == 3 and settings.gamma == 0.5  # type: ignore[attr-defined]  # flag, variable win


def test_actor_join_errors_are_one_line(served: tuple[str, dict[str, object]], keys: Path) -> None:
    url, document = served
    with pytest.raises(SettingsError, match=r"answered 404 \(is the run started with --listen\?\)"):
        _actor(["--join", url + "/nothing"], keys)
    with pytest.raises(SettingsError, match="cannot read http://127.0.0.1:1/join"):
        _actor(["--join", "http://127.0.0.1:1"], keys)
    document["format"] = "something-else"
    with pytest.raises(SettingsError, match="is not a Flywheel run's join document"):
        _actor(["--join", url], keys)
    document["format"] = remote.FORMAT
    document["actor"] = {"WARP_DRIVE": "1"}
    with pytest.raises(SettingsError, match=r"names settings this actor does not have \(warp_drive\)"):
        _actor(["--join", url], keys)
