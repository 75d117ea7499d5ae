"""Actors on other hosts: the plan of ``flywheel run --listen``, the join document, ``/join`` and ``actor --join``."""

from __future__ import annotations

import json
import re
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from join_helpers import Served, joined_actor, run_keys, serving

from flywheel.cli import build_parser
from flywheel.launch import remote
from flywheel.launch import run as run_module
from flywheel.launch.runplan import Plan
from flywheel.services.gateway.app import GatewayService, create_app
from flywheel.services.gateway.settings import GatewaySettings
from flywheel.settings import SettingsError
from flywheel.testing.ports import free_port_block

BASE = free_port_block(91)


def ports(text: str) -> str:
    """The expected text with the documented ports 471xx moved to this run's block."""
    return re.sub(r"471(\d\d)", lambda m: str(BASE + int(m.group(1))), text)


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    return run_keys(tmp_path / "keys")


def _plan(tmp_path: Path, *flags: str) -> tuple[Plan, Path]:
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
def served() -> Iterator[Served]:
    """/join answered with a run's document, which the test can change."""
    with serving() as state:
        state.document = {"format": remote.FORMAT, "env_id": "CartPole-v1", "actor": {
            "ENV_ID": "CartPole-v1", "NUM_ENVS": "16", "GAMMA": "0.99", "HIDDEN": "128",
            "TRANSITIONS_ENDPOINT": "tcp://127.0.0.1:47100", "WEIGHTS_ENDPOINT": "tcp://127.0.0.1:47102"}}
        yield state


def test_actor_join_takes_the_runs_values_under_its_own_flags_and_variables(
        served: Served, keys: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLYWHEEL_ACTOR_GAMMA", "0.5")
    settings = joined_actor(["--join", served.url, "--num-envs", "3"], keys)
    assert settings.env_id == "CartPole-v1" and settings.hidden == 128
    assert settings.transitions_endpoint == "tcp://127.0.0.1:47100"
    assert settings.num_envs == 3 and settings.gamma == 0.5  # the flag and the variable win


def test_actor_join_errors_are_one_line(served: Served, keys: Path) -> None:
    url, document = served.url, served.document
    with pytest.raises(SettingsError, match=r"answered 404 \(is the run started with --listen\?\)"):
        joined_actor(["--join", url + "/nothing"], keys)
    with pytest.raises(SettingsError, match="cannot read http://127.0.0.1:1/join"):
        joined_actor(["--join", "http://127.0.0.1:1"], keys)
    document["format"] = "something-else"
    with pytest.raises(SettingsError, match="is not a Flywheel run's join document"):
        joined_actor(["--join", url], keys)
    document["format"] = remote.FORMAT
    document["actor"] = {"WARP_DRIVE": "1"}
    with pytest.raises(SettingsError, match=r"names settings this actor does not have \(warp_drive\)"):
        joined_actor(["--join", url], keys)
