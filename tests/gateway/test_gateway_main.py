"""`flywheel gateway` on the command line: one-line errors for bad settings, busy ports and missing tokens."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import zmq

from flywheel.services.gateway.__main__ import main as gateway_main

LOCAL = ["--telemetry-endpoint", "tcp://127.0.0.1:*", "--control-endpoint", "tcp://127.0.0.1:*",
         "--lease-endpoint", "tcp://127.0.0.1:*"]


def one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err
    return err


def test_main_refuses_a_bad_setting(capsys) -> None:
    assert gateway_main(["--http-port", "99999"]) == 2
    err = one_line_error(capsys)
    assert "--http-port" in err and "FLYWHEEL_GATEWAY_HTTP_PORT" in err


def test_main_reports_a_busy_port_in_one_line(capsys) -> None:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    port = holder.getsockname()[1]
    try:
        assert gateway_main(["--http-port", str(port), *LOCAL]) == 2
    finally:
        holder.close()
    err = one_line_error(capsys)
    assert "--http-port" in err and str(port) in err


def test_main_reports_a_busy_zmq_endpoint(capsys) -> None:
    ctx = zmq.Context()
    holder = ctx.socket(zmq.PULL)
    port = holder.bind_to_random_port("tcp://127.0.0.1")
    try:
        assert gateway_main(["--http-port", "0", "--telemetry-endpoint", f"tcp://127.0.0.1:{port}"]) == 2
    finally:
        holder.close(0)
        ctx.term()
    err = one_line_error(capsys)
    assert "FLYWHEEL_GATEWAY_TELEMETRY_ENDPOINT" in err and "already in use" in err


def test_main_refuses_control_without_token_beyond_loopback(capsys, monkeypatch) -> None:
    monkeypatch.delenv("FLYWHEEL_GATEWAY_CONTROL_TOKEN", raising=False)
    assert gateway_main(["--http-host", "0.0.0.0", "--http-port", "0", *LOCAL]) == 2
    err = one_line_error(capsys)
    assert "FLYWHEEL_GATEWAY_CONTROL_TOKEN" in err and "FLYWHEEL_GATEWAY_CONTROL_ENABLED=false" in err


def test_main_refuses_an_unreadable_token_file(capsys, tmp_path: Path) -> None:
    assert gateway_main(["--http-port", "0", "--control-token-file", str(tmp_path / "missing"), *LOCAL]) == 2
    err = one_line_error(capsys)
    assert "missing" in err and "FLYWHEEL_GATEWAY_CONTROL_TOKEN_FILE" in err
