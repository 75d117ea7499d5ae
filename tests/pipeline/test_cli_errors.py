"""Bad input to the ``flywheel`` command: one line that says what to do, and a non-zero exit."""

from __future__ import annotations

import socket
import subprocess
import sys
import tempfile

import pytest
from pipeline_helpers import clean_env

pytestmark = pytest.mark.system


def flywheel(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory() as cwd:  # a refused run leaves nothing (a run lock) in the checkout
        return subprocess.run([sys.executable, "-m", "flywheel", *args], env=clean_env(), capture_output=True,
                              text=True, timeout=timeout, cwd=cwd)


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def test_unknown_environment_id() -> None:
    line = one_line(flywheel("run", "--env", "SuperMarioBro-1-1-v0"))
    assert "unknown environment id 'SuperMarioBro-1-1-v0'" in line and "SuperMarioBros-1-1-v0" in line


def test_unknown_environment_id_for_one_service() -> None:
    line = one_line(flywheel("actor", "--env-id", "NoSuchEnv-v9"))
    assert "unknown environment id" in line and "CartPole-v1" in line


@pytest.mark.parametrize(("args", "expected"), [
    (("replay", "--capacity", "lots"), "--capacity"),
    (("replay", "--alpha", "2"), "--alpha"),
    (("learner", "--batch-size", "0"), "--batch-size"),
    (("actor", "--on-full", "explode"), "--on-full"),
    (("run", "--env", "CartPole-v1", "--actors", "0"), "--actors"),
    (("run", "--env", "CartPole-v1", "--set", "learner.lr=-1"), "--lr"),
    (("run", "--env", "CartPole-v1", "--set", "learner.no_such_thing=1"), "no_such_thing"),
    (("run", "--env", "CartPole-v1", "--set", "nonsense"), "SERVICE.FIELD=VALUE"),
])
def test_bad_setting_values(args: tuple[str, ...], expected: str) -> None:
    line = one_line(flywheel(*args))
    assert expected in line and line.startswith("error:")


def test_bad_value_from_the_environment_names_the_variable() -> None:
    result = subprocess.run([sys.executable, "-m", "flywheel", "replay"], capture_output=True, text=True,
                            env=clean_env(FLYWHEEL_REPLAY_CAPACITY="-5"), timeout=60)
    assert "FLYWHEEL_REPLAY_CAPACITY" in one_line(result)


def test_port_in_use_for_run_and_for_a_service() -> None:
    any_port = "tcp://127.0.0.1:0"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", 0))  # a port held by someone else: the kernel's pick
        busy.listen(1)
        port = busy.getsockname()[1]
        line = one_line(flywheel("run", "--env", "CartPole-v1", "--base-port", "0", "--http-port", str(port)))
        assert f"port {port}" in line and "already in use" in line and "--http-port" in line
        line = one_line(flywheel("run", "--env", "CartPole-v1", "--base-port", str(port), "--http-port", "0"))
        assert f"port {port}" in line and "already in use" in line and "--base-port" in line  # the first one
        line = one_line(flywheel("replay", "--transitions-bind", f"tcp://127.0.0.1:{port}", "--sample-bind", any_port))
        assert "already in use" in line and "FLYWHEEL_REPLAY_TRANSITIONS_BIND" in line
        line = one_line(flywheel("gateway", "--http-port", str(port), "--telemetry-endpoint", any_port,
                                 "--control-endpoint", any_port, "--lease-endpoint", any_port))
        assert "gateway HTTP" in line


def test_gateway_http_fd_that_is_no_listening_socket() -> None:
    line = one_line(flywheel("gateway", "--http-fd", "97", "--telemetry-endpoint", "tcp://127.0.0.1:0",
                             "--control-endpoint", "tcp://127.0.0.1:0", "--lease-endpoint", "tcp://127.0.0.1:0"))
    assert "FLYWHEEL_GATEWAY_HTTP_FD=97 is not an open socket" in line
