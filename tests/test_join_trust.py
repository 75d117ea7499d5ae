"""``flywheel actor --join`` against forged join documents served by a real HTTP server on the loopback: keys,
endpoints, module env ids, plaintext switches, key folders and preset files are refused, local choices ignored."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq.auth
from join_helpers import Served, joined_actor, run_keys, serving

from flywheel import security
from flywheel.cli import build_parser, main
from flywheel.launch import remote
from flywheel.launch import run as run_module
from flywheel.launch.registry import settings_class
from flywheel.settings import SettingsError
from flywheel.testing.ports import free_port_block

BASE = free_port_block(91)


@pytest.fixture
def served() -> Iterator[Served]:
    with serving() as state:
        yield state


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    return run_keys(tmp_path / "keys")


@pytest.fixture
def genuine(tmp_path: Path, keys: Path, served: Served) -> dict[str, Any]:
    """The document a real ``flywheel run --listen 127.0.0.1`` writes (write_join_file), served at /join."""
    ckpt = tmp_path / "ckpt"
    args = build_parser().parse_args(["run", "--env", "CartPole-v1", "--checkpoint-dir", str(ckpt), "--base-port",
                                      str(BASE), "--http-port", str(BASE + 90), "--listen", "127.0.0.1",
                                      "--curve-keys-dir", str(keys), "--set", "actor.gamma=0.97"])
    plan = run_module.make_plan(args)
    plan.remove_socket_dir()
    assert plan.join is not None
    path = remote.write_join_file(plan.join, plan.env, "CartPole-v1", {"name": "vector", "sha256": "ab"}, ckpt)
    served.document = json.loads(path.read_text())
    return served.document


def _public(folder: Path) -> bytes:
    return zmq.auth.load_certificate(folder / "server.key")[0]


def _refused(served: Served, keys: Path, match: str, *argv: str) -> str:
    with pytest.raises(SettingsError, match=match) as info:
        joined_actor(["--join", served.url, *argv], keys)
    assert "\n" not in str(info.value)
    return str(info.value)


def test_a_genuine_document_is_accepted_and_the_key_used_is_this_hosts(genuine: dict[str, Any], served: Served,
                                                                     keys: Path) -> None:
    assert genuine["server_key"] == _public(keys).decode()  # written for the actor to check, with no secret
    assert set(genuine["actor"]) <= remote.TRAINING | remote.CHECKED and str(keys) not in json.dumps(genuine)
    settings = joined_actor(["--join", served.url], keys)
    assert settings.env_id == "CartPole-v1" and settings.gamma == 0.97
    assert settings.transitions_endpoint == f"tcp://127.0.0.1:{BASE}"
    used = security.keys_from_settings(settings, "actor")
    assert used is not None and used.server_public == _public(keys / "clients" / "far") == _public(keys)


@pytest.mark.parametrize("where", ["document", "actor"])
def test_a_forged_server_key_is_refused_naming_both_fingerprints(genuine: dict[str, Any], served: Served,
                                                                 keys: Path, tmp_path: Path, where: str) -> None:
    assert main(["keys", "generate", str(tmp_path / "theirs")]) == 0
    forged = _public(tmp_path / "theirs").decode()
    if where == "document":
        genuine["server_key"] = forged
        message = _refused(served, keys, "CURVE server key")
        assert security.key_fingerprint(forged) in message and security.key_fingerprint(_public(keys)) in message
    else:
        genuine["actor"]["CURVE_SERVER_KEY"] = forged
        _refused(served, keys, "sets CURVE_SERVER_KEY, which a join document may not")


@pytest.mark.parametrize("endpoint", ["tcp://10.66.0.1:47100", "tcp://127.0.0.2:47100", "ipc:///tmp/theirs",
                                      "tcp://10.66.0.1;127.0.0.1:47100", "tcp://127.0.0.1:0", "tcp://127.0.0.1"])
def test_endpoints_off_the_join_urls_host_are_refused(genuine: dict[str, Any], served: Served, keys: Path,
                                                      endpoint: str) -> None:
    genuine["actor"]["WEIGHTS_ENDPOINT"] = endpoint
    _refused(served, keys, "WEIGHTS_ENDPOINT .* is not tcp://127.0.0.1:PORT")
    genuine["actor"]["WEIGHTS_ENDPOINT"] = f"tcp://127.0.0.1:{BASE + 2}"
    genuine["endpoints"]["LEASE_ENDPOINT"] = endpoint
    _refused(served, keys, "endpoints .* are not tcp://127.0.0.1:PORT")


@pytest.mark.parametrize("where", ["actor", "document"])
def test_a_module_env_id_is_refused_and_nothing_imported(genuine: dict[str, Any], served: Served, keys: Path,
                                                         tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         caplog: pytest.LogCaptureFixture, where: str) -> None:
    name = f"flywheel_join_probe_{where}"
    marker = tmp_path / "imported"
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / f"{name}.py").write_text(f"open({str(marker)!r}, 'w').write('imported')\n")
    monkeypatch.syspath_prepend(str(tmp_path / "code"))
    monkeypatch.delenv("FLYWHEEL_PRESET")  # no preset named: the env id would choose one, importing its module
    if where == "actor":
        genuine["actor"]["ENV_ID"] = f"{name}:Probe-v0"
    else:
        genuine["env_id"] = f"{name}:Probe-v0"
    _refused(served, keys, "names a module to import.*give --env-id yourself")
    with caplog.at_level(logging.WARNING, logger="flywheel.actor"):  # the user's own env id: the module's ignored
        settings = joined_actor(["--join", served.url, "--env-id", "CartPole-v1"], keys)
    assert settings.env_id == "CartPole-v1" and "a module: id; yours is used" in caplog.text
    assert name not in sys.modules and not marker.exists()


@pytest.mark.parametrize(("key", "value", "match"), [
    ("ALLOW_PLAINTEXT", True, "sets ALLOW_PLAINTEXT, which a join document may not"),
    ("CURVE_KEYS_DIR", "/tmp/theirs", "sets CURVE_KEYS_DIR, which a join document may not"),
    ("CURVE_CLIENT_SECRET_KEY", "x" * 40, "sets CURVE_CLIENT_SECRET_KEY"),
    ("JOIN", "http://10.66.0.1:8080", "sets JOIN"),
    ("MAX_VERSION_JUMP", 1 << 62, "sets MAX_VERSION_JUMP"),
    ("PRESET", "PRESETFILE", "actor.PRESET .* is not a shipped preset's name"),
    ("ENV_ID", "CartPole-v1?xml_file=/etc/passwd", "option xml_file=.* never a path"),
    ("ENV_ID", "CartPole-v1?render_mode=../x", "never a path"),
    ("GAMMA", {"nested": 1}, "GAMMA is not a single value"),
])
def test_switches_key_folders_preset_files_and_paths_are_refused(genuine: dict[str, Any], served: Served, keys: Path,
                                                                 tmp_path: Path, key: str, value: Any,
                                                                 match: str) -> None:
    preset = tmp_path / "theirs.yaml"
    preset.write_text("actor:\n  gamma: 0.123\n")  # would be read, and its value used, were the path followed
    genuine["actor"][key] = str(preset) if value == "PRESETFILE" else value
    _refused(served, keys, match)


def test_a_preset_file_named_at_the_top_is_refused(genuine: dict[str, Any], served: Served, keys: Path) -> None:
    genuine["preset"] = {"name": "/tmp/theirs.yaml", "sha256": "ab"}
    _refused(served, keys, "preset .* is not a shipped preset's name")


def test_this_hosts_own_choices_are_ignored_with_one_warning(genuine: dict[str, Any], served: Served, keys: Path,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    genuine["actor"].update({"INSTANCE": "the-learner", "LOG_FORMAT": "json", "EVAL_ENVS": "1"})
    genuine["added_later"] = [1]
    with caplog.at_level(logging.WARNING, logger="flywheel.actor"):
        settings = joined_actor(["--join", served.url, "--instance", "far-1"], keys)
    assert settings.instance == "far-1" and settings.log_format == "text" and settings.eval_envs == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "actor.INSTANCE" in warnings[0] and "added_later" in warnings[0], warnings


def test_joining_without_this_hosts_keys_is_refused_before_asking(genuine: dict[str, Any], served: Served) -> None:
    with pytest.raises(SettingsError, match="needs this host's CURVE keys, never the network's") as info:
        joined_actor(["--join", served.url], None)
    assert "\n" not in str(info.value) and served.requests == 0


def test_redirects_other_schemes_and_oversized_answers_are_refused(genuine: dict[str, Any], served: Served,
                                                                   keys: Path) -> None:
    served.status, served.headers = 302, {"Location": "http://10.66.0.1:8080/join"}
    _refused(served, keys, r"answered 302 \(a redirect, not followed\)")
    served.status, served.headers = 200, {}
    served.body = b" " * (remote.MAX_DOCUMENT_BYTES + 1) + json.dumps(genuine).encode()
    _refused(served, keys, "answered more than 1048576 bytes")
    served.body = b"[" * 100_000  # deeper than the JSON parser recurses
    _refused(served, keys, "cannot read")
    with pytest.raises(SettingsError, match="must look like http://HOST:PORT"):
        joined_actor(["--join", "file:///etc/passwd"], keys)


def test_every_actor_setting_is_placed_in_exactly_one_list() -> None:
    lists = (remote.TRAINING, remote.CHECKED, remote.IGNORED, frozenset(remote.REFUSED))
    fields = {f.upper() for f in settings_class("actor").model_fields}
    assert set().union(*lists) == fields
    assert sum(len(group) for group in lists) == len(fields)  # no setting in two lists
