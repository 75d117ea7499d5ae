"""``flywheel run``: progress, a clean stop on SIGINT with checkpoints, and no orphan processes."""

from __future__ import annotations

import os
import signal
import stat
import sys
import time
from pathlib import Path

import psutil
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # under any import mode (the importnb plugin's too)
from pipeline_helpers import clean_env, get_json, wait_until

from flywheel.processes import launch
from flywheel.testing.run import launcher_endpoints

pytestmark = pytest.mark.system


def test_sigint_stops_every_child_and_leaves_checkpoints(tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    proc = launch(["run", "--env", "CartPole-v1", "--actors", "2", "--envs-per-actor", "4",
                   "--base-port", "0", "--http-port", "0", "--checkpoint-dir", str(tmp_path / "ckpt"),
                   "--progress-interval", "1", "--set", "replay.min_size_to_sample=200"], clean_env(), log)
    children: set[int] = set()
    try:
        def running() -> bool:
            children.update(c.pid for c in psutil.Process(proc.pid).children(recursive=True))
            endpoints = launcher_endpoints(log)  # the URL it printed: the kernel picked the port
            status = None if endpoints is None else get_json(f"{endpoints[0]}/status")
            if status is None:
                return False
            learner = status["services"].get("learner", {}).get("totals", {})
            # one host: the learner takes the replay's shared-memory offer (its first replies come over the socket)
            trained = learner.get("updates_total", 0) > 0 and learner.get("shm_batches_total", 0) > 0
            return len(children) >= 5 and trained
        wait_until(running, 120, "flywheel run to train on batches from shared memory", [log])
        wait_until(lambda: "updates" in log.read_text(), 30, "a progress line", [log])
        url, weights = launcher_endpoints(log) or ("", "")
        assert url.startswith("http://127.0.0.1:") and weights.startswith("ipc://")  # no TCP port guessed
        sockets = Path(weights.removeprefix("ipc://")).parent  # a new folder (mkdtemp), not a guessable path
        assert sockets.name.startswith(f"flywheel-run-{proc.pid}-") and weights == f"ipc://{sockets}/weights"
        assert (sockets / "transitions").is_socket() and (sockets / "sample").is_socket()  # the local fast path
        info = sockets.stat()
        assert stat.S_IMODE(info.st_mode) == 0o700 and info.st_uid == os.getuid()  # no other user gets in
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"
                                              for pid in children):
        time.sleep(0.2)
    alive = [pid for pid in children if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
    assert not alive, f"orphans left: {alive}"
    assert not sockets.exists(), "the Unix sockets' folder is removed on exit"
    text = log.read_text()
    assert "gateway http://127.0.0.1:" in text and "env steps" in text and "stopped; checkpoints in" in text
    assert (tmp_path / "ckpt" / "learner" / "learner.safetensors").exists()
    assert (tmp_path / "ckpt" / "replay" / "replay" / "manifest.json").exists()


def test_children_die_with_a_killed_parent(tmp_path: Path) -> None:
    """Even SIGKILL of ``flywheel run`` leaves no orphan: children get SIGTERM from the kernel (PDEATHSIG)."""
    log = tmp_path / "run.log"
    proc = launch(["run", "--env", "CartPole-v1", "--actors", "1", "--envs-per-actor", "2",
                   "--base-port", "0", "--http-port", "0", "--checkpoint-dir", str(tmp_path / "ckpt")],
                  clean_env(), log)
    children: set[int] = set()

    def started() -> bool:
        children.update(c.pid for c in psutil.Process(proc.pid).children(recursive=True))
        endpoints = launcher_endpoints(log)
        return len(children) >= 4 and endpoints is not None and get_json(f"{endpoints[0]}/healthz") is not None
    try:
        wait_until(started, 60, "children to start", [log])
    finally:
        proc.kill()
        proc.wait()

    def gone() -> bool:
        return not any(psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie" for pid in children)
    wait_until(gone, 60, "children to exit after the parent was killed", [log])


def test_bench_harness_measures_a_real_run(tmp_path: Path) -> None:
    """The benchmarks' view of ``flywheel run``: every service up, counters and per-process CPU that grow."""
    from flywheel.testing.run import FlywheelRun

    run = FlywheelRun("CartPole-v1", tmp_path, actors=1, envs_per_actor=4,
                      sets=["replay.min_size_to_sample=200"], progress_interval=1.0)
    with run:
        assert run.alive() and set(run.children()) == {"gateway-0", "replay-0", "learner-0", "actor-0"}
        first = run.wait_until_learning(120)
        time.sleep(3)
        last = run.snapshot()
        assert last is not None and last.t > first.t
        assert last.total("actor", "env_steps_total") > first.total("actor", "env_steps_total")
        assert last.total("replay", "transitions_received_total") > 0
        assert all(last.cpu[name] >= first.cpu.get(name, 0.0) for name in last.cpu)
        assert last.cpu["actor-0"] > 0 and last.cpu["learner-0"] > 0
        # the learner's evaluator (a spawned child, every 2 s in the CartPole preset) inherits the learner's
        # environment, instance name included: the CPU figures stay the services' own
        learner = run.children()["learner-0"]
        wait_until(lambda: bool(learner.children()), 60, "the learner's evaluation child", [run.log])
        run.children()
        assert {p.ppid() for p in run.children().values()} == {run.proc.pid}
        assert run.children()["learner-0"].pid == learner.pid
        pids = [p.pid for p in run.children().values()]
    assert run.proc is not None and run.proc.returncode == 0
    assert not [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
    assert "stopped; checkpoints in" in run.log.read_text()
