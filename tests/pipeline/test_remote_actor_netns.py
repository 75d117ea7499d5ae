"""Two hosts made of network namespaces: `flywheel run --listen` on one, `flywheel actor --join` on the other.

The test makes two namespaces joined by a veth pair (10.231.N.1 runs the job, 10.231.N.2 the remote actor), so the
actor reaches the run over a real network interface with CURVE, as a second machine would. Every packet stays inside
the namespaces: this process never addresses their IPs; it reads the gateway's /status from inside the run's
namespace (`ip netns exec`). Needs root and iproute2: a failure under CI or root, a skip elsewhere.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from flywheel.testing.polling import wait_until
from flywheel.testing.run import clean_env, tail

pytestmark = pytest.mark.system

ACTOR_INSTANCE = "far-actor"
STATUS_PROBE = ("import json, sys, urllib.request\n"
                "try:\n"
                "    print(urllib.request.urlopen(sys.argv[1] + '/status', timeout=3).read().decode())\n"
                "except OSError:\n"
                "    print('null')\n")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=30)


@pytest.fixture
def two_hosts() -> Iterator[tuple[str, str, str, str]]:
    """(run namespace, actor namespace, run IP, actor IP), torn down afterwards."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        if os.environ.get("CI"):
            pytest.fail("the two-host test needs root and iproute2 (ip) in CI")
        pytest.skip("needs root and iproute2 (ip netns)")
    tag = f"{os.getpid() % 100000}"
    run_ns, actor_ns = f"fw-run-{tag}", f"fw-act-{tag}"
    subnet = f"10.231.{random.randint(1, 250)}"
    run_ip, actor_ip = f"{subnet}.1", f"{subnet}.2"
    veth_run, veth_actor = f"fwr{tag}", f"fwa{tag}"
    made: list[str] = []
    try:
        for ns in (run_ns, actor_ns):
            _ip("netns", "add", ns)
            made.append(ns)
            _ip("-n", ns, "link", "set", "lo", "up")
        _ip("link", "add", veth_run, "type", "veth", "peer", "name", veth_actor)
        _ip("link", "set", veth_run, "netns", run_ns)
        _ip("link", "set", veth_actor, "netns", actor_ns)
        for ns, dev, address in ((run_ns, veth_run, run_ip), (actor_ns, veth_actor, actor_ip)):
            _ip("-n", ns, "addr", "add", f"{address}/24", "dev", dev)
            _ip("-n", ns, "link", "set", dev, "up")
        yield run_ns, actor_ns, run_ip, actor_ip
    finally:
        for ns in made:  # deleting a namespace deletes its end of the veth pair, and so the pair
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


def _status(ns: str, url: str) -> dict[str, Any] | None:
    out = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", STATUS_PROBE, url], capture_output=True,
                         text=True, timeout=30).stdout.strip()
    return json.loads(out.splitlines()[-1]) if out else None


def _instance(status: dict[str, Any] | None, service: str, name: str | None = None) -> dict[str, Any] | None:
    for item in (status or {}).get("services", {}).get(service, {}).get("instances", []):
        if item.get("up") and (name is None or item.get("instance") == name):
            return item
    return None


def _gauge(item: dict[str, Any] | None, name: str) -> float:
    return float(((item or {}).get("gauges") or {}).get(name) or 0)


def _counter(item: dict[str, Any] | None, name: str) -> float:
    return float(((item or {}).get("counters") or {}).get(name) or 0)


def _logs(actor_log: Path, run_log: Path, service_logs: Path, lines: int) -> str:
    """What a failed wait shows: the remote actor's log, the run's, and each of the run's services' logs."""
    parts = [tail(actor_log, lines), "--- run ---", tail(run_log, lines)]
    for log in sorted(service_logs.glob("*.log")):
        parts += [f"--- {log.name} ---", tail(log, lines)]
    return "\n".join(parts)


@pytest.mark.timeout(420)
def test_an_actor_on_another_host_joins_the_run(tmp_path: Path, two_hosts: tuple[str, str, str, str]) -> None:
    run_ns, actor_ns, run_ip, _ = two_hosts
    keys = tmp_path / "keys"
    subprocess.run([sys.executable, "-m", "flywheel", "keys", "generate", str(keys), "--client", "far"], check=True,
                   capture_output=True, timeout=60)
    http_port = 47990
    url = f"http://{run_ip}:{http_port}"
    run_log, actor_log = tmp_path / "run.log", tmp_path / "actor.log"
    run_cmd = ["ip", "netns", "exec", run_ns, sys.executable, "-m", "flywheel", "run", "--env", "CartPole-v1",
               "--actors", "1", "--listen", run_ip, "--curve-keys-dir", str(keys), "--base-port", "47900",
               "--http-port", str(http_port), "--checkpoint-dir", str(tmp_path / "ckpt"), "--no-video",
               "--progress-interval", "2", "--time-limit", "300"]
    actor_cmd = ["ip", "netns", "exec", actor_ns, sys.executable, "-m", "flywheel", "actor", "--join", url,
                 "--curve-keys-dir", str(keys / "clients" / "far"), "--instance", ACTOR_INSTANCE, "--num-envs", "2"]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        with open(run_log, "wb") as out:
            procs.append(subprocess.Popen(run_cmd, stdout=out, stderr=subprocess.STDOUT, env=clean_env(),
                                          stdin=subprocess.DEVNULL))
        wait_until(lambda: _instance(_status(run_ns, url), "learner") is not None, 120, "the run's learner",
                   detail=lambda: tail(run_log, 30))
        with open(actor_log, "wb") as out:
            procs.append(subprocess.Popen(actor_cmd, stdout=out, stderr=subprocess.STDOUT, env=clean_env(),
                                          stdin=subprocess.DEVNULL))

        def far_actor_trains() -> dict[str, Any] | None:
            status = _status(run_ns, url)
            far = _instance(status, "actor", ACTOR_INSTANCE)
            if far and _counter(far, "env_steps_total") > 0 and _gauge(far, "weight_version_newest") >= 2:
                return status
            return None

        first = wait_until(far_actor_trains, 150, "the remote actor to send transitions and take weights",
                           detail=lambda: _logs(actor_log, run_log, tmp_path / "ckpt" / "logs", 30))
        far = _instance(first, "actor", ACTOR_INSTANCE)
        assert far is not None and far.get("info", {}).get("curve") == "on", far  # it came in over CURVE
        version = _gauge(far, "weight_version_newest")
        steps = _counter(far, "env_steps_total")

        def it_follows() -> dict[str, Any] | None:
            status = _status(run_ns, url)
            now = _instance(status, "actor", ACTOR_INSTANCE)
            if _gauge(now, "weight_version_newest") > version and _counter(now, "env_steps_total") > steps:
                return status
            return None

        later = wait_until(it_follows, 90, "the remote actor's weight versions to follow the learner's",
                           detail=lambda: _logs(actor_log, run_log, tmp_path / "ckpt" / "logs", 30))
        learner_version = _gauge(_instance(later, "learner"), "weight_version")
        far_version = _gauge(_instance(later, "actor", ACTOR_INSTANCE), "weight_version_newest")
        # close to the learner's newest (the two reports are up to a second apart: ~20 versions at 10 updates each)
        assert far_version > version and abs(far_version - learner_version) <= 100, (far_version, learner_version)
        joined = actor_log.read_text(errors="replace")
        assert f"joined the run at {url}: CartPole-v1, transitions to tcp://{run_ip}:47900" in joined, joined[-2000:]

        def delivered() -> tuple[float, float, float] | None:
            """The replay received clearly more than the local actor sent: the remote actor's transitions (reports
            are up to a second apart, so the margin is half the remote's count, at least 10,000 transitions)."""
            status = _status(run_ns, url)
            received = _counter(_instance(status, "replay"), "transitions_received_total")
            remote_sent = _counter(_instance(status, "actor", ACTOR_INSTANCE), "transitions_sent_total")
            local_sent = sum(_counter(i, "transitions_sent_total") for i in (status or {}).get("services", {}).get(
                "actor", {}).get("instances", []) if i.get("instance") != ACTOR_INSTANCE)
            ok = remote_sent >= 20_000 and received - local_sent >= remote_sent / 2
            return (received, local_sent, remote_sent) if ok else None

        received, local_sent, remote_sent = wait_until(
            delivered, 120, "the remote actor's transitions in the run's replay",
            detail=lambda: _logs(actor_log, run_log, tmp_path / "ckpt" / "logs", 20))
        assert received > local_sent
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for proc in reversed(procs):
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    assert procs[0].returncode == 0, tail(run_log)
    assert "stopped; checkpoints in" in run_log.read_text(errors="replace"), tail(run_log)
    assert (tmp_path / "ckpt" / "join.json").is_file()
