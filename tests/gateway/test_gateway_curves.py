"""The gateway writes curves that outlive it (FLYWHEEL_GATEWAY_CURVES_DIR), and continues them after kill -9."""

from __future__ import annotations

import csv
import signal
import socket
import time
from pathlib import Path

import pytest
import zmq
from gateway_helpers import gateway_env, http_get, tel, wait_for
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from flywheel import proto
from flywheel.processes import launch
from flywheel.services.gateway.server import listen_socket

pytestmark = pytest.mark.system


def _rows(folder: Path) -> list[dict[str, str]]:
    try:
        with open(folder / "progress.csv", newline="") as fh:
            return list(csv.DictReader(fh))
    except FileNotFoundError:
        return []


def _start(folder: Path, http: socket.socket, telemetry: str, log: Path):
    """A gateway serving on ``http``, a listening socket it inherits, as flywheel run starts one (a restart keeps
    the port); telemetry on a Unix socket, so the actor's endpoint stays the same too."""
    env = gateway_env(FLYWHEEL_GATEWAY_HTTP_FD=str(http.fileno()), FLYWHEEL_GATEWAY_TELEMETRY_ENDPOINT=telemetry,
                      FLYWHEEL_GATEWAY_CURVES_DIR=str(folder), FLYWHEEL_GATEWAY_CURVES_INTERVAL_S="0.3")
    proc = launch(["gateway"], env, log, pass_fds=(http.fileno(),))
    url = f"http://127.0.0.1:{http.getsockname()[1]}"

    def up() -> bool:
        try:
            return http_get(f"{url}/status")[0] == 200
        except OSError:
            return False

    wait_for(lambda: proc.poll() is None and up(), timeout=60, what=f"gateway up ({log})")
    return proc


def test_curves_are_written_by_the_gateway_and_continue_after_it_is_killed(tmp_path: Path) -> None:
    folder, log = tmp_path / "curves", tmp_path / "gateway.log"
    http, telemetry = listen_socket("127.0.0.1", 0), f"ipc://{tmp_path}/telemetry"
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    push.connect(telemetry)
    seq = 0

    def report(steps: float) -> None:
        nonlocal seq
        seq += 1
        push.send_multipart(proto.encode(tel(instance="actor-0", seq=seq, counters={"env_steps_total": steps},
                                             gauges={"episode_return_mean": steps / 100})))

    proc = _start(folder, http, telemetry, log)
    try:
        for steps in (1000.0, 2000.0):
            report(steps)
            wait_for(lambda s=steps: any(r["env_steps"] == str(int(s)) for r in _rows(folder)), timeout=30,
                     what=f"a curve point at {steps:.0f} env steps")
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        last = int(_rows(folder)[-1]["env_steps"])
        proc = _start(folder, http, telemetry, log)  # compose or the supervisor restarts it: same folder
        report(2500.0)  # the actor kept running: its counter went on
        for _ in range(12):  # reports every second, as an actor does, so it stays up through the gateway's grace
            time.sleep(1.0)
            report(3000.0)
        wait_for(lambda: int(_rows(folder)[-1]["env_steps"]) >= 3000, timeout=30, what="the restarted gateway's points")
        steps = [int(r["env_steps"]) for r in _rows(folder)]
        assert last == 2000 and steps == sorted(steps) and steps[-1] == 3000, steps  # continued, nothing twice
        assert "continuing the earlier rows" in log.read_text()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        push.close(0)
        ctx.term()
        http.close()
    acc = EventAccumulator(str(folder / "tb"))
    acc.Reload()
    returns = acc.Scalars("returns/episode")
    assert returns and max(e.step for e in returns) == steps[-1]
