"""``flywheel run``'s supervisor: the restart policy alone, then kill -9 and SIGSTOP of real services in a run."""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # under any import mode (the importnb plugin's too)
from pipeline_helpers import get_json, get_text, wait_until

from flywheel.launch.runplan import Child, Plan
from flywheel.launch.supervisor import RestartPolicy, Supervisor, restart_values
from flywheel.testing.run import FlywheelRun

# -- the policy: no processes ------------------------------------------------------------------------------------


def test_backoff_doubles_per_exit_and_the_next_exit_after_max_restarts_in_the_window_stops() -> None:
    policy = RestartPolicy(max_restarts=5, window_s=120, backoff_s=1, backoff_max_s=30)
    assert [policy.on_exit(-9, t) for t in (0.0, 1.0, 3.0, 7.0, 15.0)] == [1, 2, 4, 8, 16]
    assert policy.on_exit(-9, 31.0) is None
    assert policy.reason == "restarted 5 times within 120 s already" and policy.restarts == 5


def test_backoff_is_capped() -> None:
    policy = RestartPolicy(max_restarts=10, window_s=1000, backoff_s=1, backoff_max_s=30)
    assert [policy.on_exit(1, float(t)) for t in range(7)] == [1, 2, 4, 8, 16, 30, 30]


def test_exits_older_than_the_window_are_forgotten_and_the_backoff_starts_again() -> None:
    policy = RestartPolicy(max_restarts=2, window_s=10, backoff_s=1, backoff_max_s=30)
    assert policy.on_exit(-9, 0.0) == 1 and policy.on_exit(-9, 5.0) == 2
    assert policy.on_exit(-9, 9.0) is None  # a third exit within 10 s of the first
    fresh = RestartPolicy(max_restarts=2, window_s=10, backoff_s=1, backoff_max_s=30)
    assert fresh.on_exit(-9, 0.0) == 1 and fresh.on_exit(-9, 5.0) == 2
    assert fresh.on_exit(-9, 15.0) == 1  # both earlier exits are 10 s or more ago
    assert fresh.on_exit(-9, 16.0) == 2 and fresh.on_exit(-9, 17.0) is None


def test_exit_codes_that_are_not_restarted() -> None:
    finished = RestartPolicy()
    assert finished.on_exit(0, 0.0) is None and "finished on its own" in finished.reason
    refused = RestartPolicy()
    assert refused.on_exit(2, 0.0) is None and "settings or start-up error" in refused.reason
    restarted = RestartPolicy()
    assert restarted.on_exit(-9, 0.0) == 1 and restarted.on_exit(2, 5.0) == 2  # code 2 after a restart: retried
    off = RestartPolicy(max_restarts=0)
    assert off.on_exit(-9, 0.0) is None and off.reason == "restarts are off (--max-restarts 0)"
    with pytest.raises(ValueError):
        RestartPolicy(max_restarts=-1)
    with pytest.raises(ValueError):
        RestartPolicy(backoff_s=10, backoff_max_s=1)


@pytest.mark.parametrize(("flag", "value", "expected"), [
    ("--max-restarts", "-1", "--max-restarts: must be 0 or more"),
    ("--restart-window", "0", "--restart-window: must be more than 0 seconds"),
])
def test_bad_restart_flags_are_one_clear_line(flag: str, value: str, expected: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    from flywheel.cli import build_parser

    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["run", "--env", "CartPole-v1", flag, value])
    assert exc.value.code == 2 and expected in capsys.readouterr().err


def _plan(tmp_path: Path) -> Plan:
    env = {"learner": {"CHECKPOINT_DIR": str(tmp_path / "learner"), "RESUME": "false", "LR": "0.001"},
           "replay": {"CHECKPOINT_DIR": str(tmp_path / "replay"), "RESTORE": "false"},
           "actor": {"NUM_ENVS": "4"}}
    return Plan(env, {}, "", tmp_path, [{"EVAL_ENVS": "1"}, {}])


def _child(service: str, name: str, tmp_path: Path) -> Child:
    return Child(service, name, subprocess.Popen([sys.executable, "-c", "pass"]), tmp_path / f"{name}.log")


@pytest.mark.system
def test_restart_values_resume_only_from_this_runs_checkpoints(tmp_path: Path) -> None:
    plan = _plan(tmp_path)
    learner, replay = _child("learner", "learner-0", tmp_path), _child("replay", "replay-0", tmp_path)
    since = time.time()
    assert restart_values(plan, learner, False, since)["RESUME"] == "false"  # nothing written yet: fresh
    assert restart_values(plan, replay, False, since)["RESTORE"] == "false"
    ckpt = tmp_path / "learner" / "learner.safetensors"
    manifest = tmp_path / "replay" / "replay" / "manifest.json"
    for path in (ckpt, manifest):
        path.parent.mkdir(parents=True)
        path.write_text("{}")
        os.utime(path, (since - 100, since - 100))  # an older run's checkpoints in the same folder
    assert restart_values(plan, learner, False, since)["RESUME"] == "false"
    assert restart_values(plan, replay, False, since)["RESTORE"] == "false"
    assert restart_values(plan, learner, True, since)["RESUME"] == "auto"  # --resume: the one it started from
    assert restart_values(plan, replay, True, since)["RESTORE"] == "true"
    for path in (ckpt, manifest):
        os.utime(path, (since + 1, since + 1))  # written by this run
    values = restart_values(plan, learner, False, since)
    assert values["RESUME"] == "auto" and values["LR"] == "0.001"
    assert restart_values(plan, replay, False, since)["RESTORE"] == "true"
    assert restart_values(plan, _child("actor", "actor-0", tmp_path), False, since) == {"NUM_ENVS": "4",
                                                                                        "EVAL_ENVS": "1"}
    assert restart_values(plan, _child("actor", "actor-1", tmp_path), False, since) == {"NUM_ENVS": "4"}
    assert plan.env["learner"]["RESUME"] == "false"  # the plan itself is left alone


@pytest.mark.system
def test_a_restarted_actor_reads_the_pools_this_run_wrote(tmp_path: Path) -> None:
    pools = tmp_path / "actors"
    plan = _plan(tmp_path)
    plan.actor_extra[:] = [{"CHECKPOINT_DIR": str(pools), "RESUME": "false"}] * 2
    actor = _child("actor", "actor-1", tmp_path)
    since = time.time()
    assert restart_values(plan, actor, False, since)["RESUME"] == "false"  # no pools yet
    pools.mkdir()
    own, other = pools / "actor-1-env0.npz", pools / "actor-0-env0.npz"
    for path in (own, other):
        path.write_bytes(b"x")
        os.utime(path, (since - 100, since - 100))  # an older run's pools in the same folder
    assert restart_values(plan, actor, False, since)["RESUME"] == "false"
    assert restart_values(plan, actor, True, since)["RESUME"] == "true"  # --resume: the pools it started from
    os.utime(other, (since + 1, since + 1))  # another actor's, written by this run
    assert restart_values(plan, actor, False, since)["RESUME"] == "false"
    os.utime(own, (since + 1, since + 1))  # its own, written by this run
    assert restart_values(plan, actor, False, since)["RESUME"] == "true"


@pytest.mark.system
def test_supervisor_restarts_real_processes_then_gives_up(tmp_path: Path) -> None:
    """Children that exit with code 1 after 0.2 s: restarted twice with backoff, the third exit is returned."""
    started: list[str] = []

    def start(service: str, name: str, values: dict[str, str], log_dir: Path) -> Child:
        started.append(name)
        log = log_dir / f"{name}.log"
        with open(log, "ab") as fh:
            proc = subprocess.Popen([sys.executable, "-c", "import sys, time; print('dying'); time.sleep(0.2); "
                                     "sys.exit(1)"], stdout=fh, stderr=subprocess.STDOUT)
        return Child(service, name, proc, log)

    plan = _plan(tmp_path)
    children = [start("actor", "actor-0", {}, tmp_path)]
    args = argparse.Namespace(resume=False, max_restarts=2, restart_window=60.0)
    supervisor = Supervisor(children, plan, start, args, backoff_s=0.1, backoff_max_s=1.0)
    assert supervisor.telemetry is None  # no gateway in this plan
    deadline = time.monotonic() + 30
    given_up = None
    while given_up is None and time.monotonic() < deadline:
        given_up = supervisor.poll()
        time.sleep(0.05)
    assert given_up is not None and given_up.name == "actor-0" and given_up.proc.returncode == 1
    assert started == ["actor-0"] * 3 and supervisor.restarts["actor-0"] == 2
    assert supervisor.reason == "restarted 2 times within 60 s already"
    assert supervisor.progress() == " | restarts actor 2"
    assert children[0] is given_up
    assert (tmp_path / "actor-0.log").read_text().count("restarted") == 2  # a marker line per restart


@pytest.mark.system
def test_no_restart_while_the_run_is_stopping(tmp_path: Path) -> None:
    def start(service: str, name: str, values: dict[str, str], log_dir: Path) -> Child:
        return Child(service, name, subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"]),
                     log_dir / f"{name}.log")

    children = [start("learner", "learner-0", {}, tmp_path)]
    first = children[0]
    first.proc.wait(timeout=30)
    supervisor = Supervisor(children, _plan(tmp_path), start, argparse.Namespace(), backoff_s=0.0)
    assert supervisor.poll(stopping=lambda: True) is None
    assert children[0] is first and list(supervisor.due) == ["learner-0"]
    assert supervisor.progress() == ""
    assert supervisor.poll() is None and children[0] is not first  # once not stopping, it is restarted
    children[0].proc.wait(timeout=30)


@pytest.mark.system
def test_supervisor_reports_to_a_curve_gateway_with_the_actors_keys(tmp_path: Path) -> None:
    """With --curve-keys-dir the gateway's telemetry socket is a CURVE server: the run connects as a client."""
    from flywheel import keyfiles, security
    from flywheel.cli import build_parser
    from flywheel.launch.run import _http_socket, _start, make_plan

    keys = tmp_path / "keys"
    keyfiles.generate(keys)
    args = build_parser().parse_args(["run", "--env", "CartPole-v1", "--curve-keys-dir", str(keys), "--checkpoint-dir",
                                      str(tmp_path / "ckpt"), "--base-port", "0", "--http-port", "0"])
    plan = make_plan(args)
    plan.env["gateway"]["TELEMETRY_ENDPOINT"] = "tcp://127.0.0.1:0"  # TCP, where CURVE applies; the kernel's port
    http = _http_socket(plan)  # as flywheel run: the launcher listens, the gateway serves on the inherited socket
    assert http is not None and plan.socket_dir is not None
    assert plan.socket_dir.is_dir()  # the Unix sockets' private folder, made with the plan
    children = [_start("gateway", "gateway-0", plan.env["gateway"], tmp_path)]
    bound = wait_until(lambda: (get_json(f"{plan.gateway_url}/status") or {}).get("gateway", {}).get("endpoints"),
                       60, "the gateway to report its endpoints", [tmp_path / "gateway-0.log"])
    assert bound["telemetry"].startswith("tcp://127.0.0.1:") and not bound["telemetry"].endswith(":0")
    plan.env["gateway"]["TELEMETRY_ENDPOINT"] = bound["telemetry"]  # where the supervisor reports to
    previous = security.active()
    supervisor = Supervisor(children, plan, _start, args)
    try:
        assert security.active() is not None and supervisor.telemetry is not None

        def reported() -> dict[str, Any] | None:
            assert supervisor.poll() is None, supervisor.reason
            status = get_json(f"{plan.gateway_url}/status") or {}
            instances = status.get("services", {}).get("supervisor", {}).get("instances", [])
            return instances[0] if instances else None

        found = wait_until(reported, 60, "the supervisor's report on the gateway", [tmp_path / "gateway-0.log"])
        assert found["instance"] == "run" and found["counters"]['restarts_total{child="gateway-0"}'] == 0
        assert found["info"]["curve"] == "on"
        assert found["gauges"] == {"children_running": 1, "children_waiting_restart": 0}
    finally:
        supervisor.close()
        security.configure(previous)
        children[0].proc.terminate()
        children[0].proc.wait(timeout=30)
        http.close()
        shutil.rmtree(plan.socket_dir, ignore_errors=True)


# -- a real run: CartPole, one actor -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FlywheelRun]:
    """One run for the kill tests below, in order; the last one makes it stop. At most 3 restarts per child."""
    flywheel = FlywheelRun("CartPole-v1", tmp_path_factory.mktemp("supervised"), actors=1, envs_per_actor=4,
                           sets=["replay.min_size_to_sample=200", "learner.checkpoint_interval_s=2",
                                 "replay.checkpoint_interval_s=4"],
                           args=["--max-restarts", "3", "--restart-window", "600", "--no-video"],
                           progress_interval=1.0)
    with flywheel:
        yield flywheel


def pid_of(run: FlywheelRun, name: str) -> int | None:
    """The live process of service instance ``name`` (a direct child of flywheel run; not its own children)."""
    assert run.proc is not None
    env_key = f"FLYWHEEL_{name.rpartition('-')[0].upper()}_INSTANCE"
    try:
        children = psutil.Process(run.proc.pid).children()
    except psutil.Error:
        return None
    for child in children:
        try:
            if child.environ().get(env_key) == name and child.status() != psutil.STATUS_ZOMBIE:
                return child.pid
        except psutil.Error:
            continue
    return None


def instance(run: FlywheelRun, name: str) -> dict[str, Any]:
    """What the gateway shows of one instance now ({} when it does not answer or does not know it)."""
    status = run.status() or {}
    service = status.get("services", {}).get(name.rpartition("-")[0], {})
    return next((i for i in service.get("instances", []) if i["instance"] == name), {})


def supervisor_restarts(run: FlywheelRun) -> dict[str, float]:
    """The supervisor's restarts_total per child, as the gateway shows them."""
    status = run.status() or {}
    instances = status.get("services", {}).get("supervisor", {}).get("instances", [])
    counters = instances[0].get("counters", {}) if instances else {}
    return {k.split('"')[1]: v for k, v in counters.items() if k.startswith("restarts_total{")}


def counter(run: FlywheelRun, name: str, key: str, restarted: int = 0) -> float | None:
    """A counter of ``name`` once the gateway saw it restart ``restarted`` times (None before)."""
    inst = instance(run, name)
    if not inst.get("up") or inst.get("restarts", 0) < restarted:
        return None
    return inst.get("counters", {}).get(key)


def rises(run: FlywheelRun, read: Any, what: str, timeout: float = 60) -> None:
    """Wait until ``read()`` gives a number, then until it gives a higher one."""
    first = run.wait_for(lambda: read(), timeout, what)
    run.wait_for(lambda: (value := read()) is not None and value > first, timeout, f"{what} to rise above {first}")


def kill_and_wait_for_restart(run: FlywheelRun, name: str, sig: int = signal.SIGKILL) -> int:
    before = run.wait_for(lambda: pid_of(run, name), 60, f"{name} to run")
    os.kill(before, sig)
    return run.wait_for(lambda: (pid := pid_of(run, name)) not in (None, before) and pid, 60,
                        f"{name} to be restarted")


@pytest.mark.timeout(360)  # the run's start-up counts here
@pytest.mark.system
def test_killed_actor_is_restarted_and_acts_again(run: FlywheelRun) -> None:
    run.wait_for(lambda: counter(run, "learner-0", "updates_total"), 120, "the first learner updates")
    kill_and_wait_for_restart(run, "actor-0")
    rises(run, lambda: counter(run, "actor-0", "env_steps_total", restarted=1), "the restarted actor's env steps")
    rises(run, lambda: counter(run, "learner-0", "updates_total"), "learner updates after the actor's restart")
    assert supervisor_restarts(run)["actor-0"] == 1
    run.wait_for(lambda: "| restarts actor 1" in run.log.read_text(), 30, "the restart in the progress line")
    assert "warning: actor-0 exited with code -9" in run.log.read_text()


@pytest.mark.timeout(150)
@pytest.mark.system
def test_killed_learner_resumes_from_its_checkpoint_with_higher_weight_versions(run: FlywheelRun) -> None:
    ckpt = run.workdir / "checkpoints" / "learner" / "learner.safetensors"
    run.wait_for(ckpt.exists, 60, "a learner checkpoint")
    version = run.wait_for(lambda: instance(run, "learner-0").get("gauges", {}).get("weight_version"), 30,
                           "a published weight version")
    kill_and_wait_for_restart(run, "learner-0")

    def resumed_version() -> float | None:
        learner = instance(run, "learner-0")
        return learner.get("gauges", {}).get("weight_version") if learner.get("restarts", 0) >= 1 else None

    resumed = run.wait_for(resumed_version, 90, "the resumed learner's weight version")
    assert resumed > version
    run.wait_for(lambda: instance(run, "actor-0").get("gauges", {}).get("weight_version", 0) > version, 60,
                 "the actor acting with the resumed learner's weights")
    rises(run, lambda: counter(run, "learner-0", "updates_total", restarted=1), "the resumed learner's updates")
    rises(run, lambda: counter(run, "actor-0", "env_steps_total"), "env steps after the learner's restart")
    assert "resumed from" in (run.workdir / "checkpoints" / "logs" / "learner-0.log").read_text()
    assert supervisor_restarts(run)["learner-0"] == 1


@pytest.mark.timeout(150)
@pytest.mark.system
def test_killed_replay_restores_its_checkpoint_and_feeds_the_learner_again(run: FlywheelRun) -> None:
    manifest = run.workdir / "checkpoints" / "replay" / "replay" / "manifest.json"
    run.wait_for(manifest.exists, 60, "a replay checkpoint")
    kill_and_wait_for_restart(run, "replay-0")
    log = run.workdir / "checkpoints" / "logs" / "replay-0.log"
    run.wait_for(lambda: "restored" in log.read_text().rpartition("restarted, restoring its checkpoint")[2], 60,
                 "the restarted replay to restore its checkpoint")
    rises(run, lambda: counter(run, "replay-0", "transitions_received_total", restarted=1), "replay inserts")
    rises(run, lambda: counter(run, "learner-0", "updates_total"), "learner updates after the replay's restart")
    assert supervisor_restarts(run)["replay-0"] == 1


@pytest.mark.timeout(120)
@pytest.mark.system
def test_killed_gateway_comes_back_and_shows_the_restarts(run: FlywheelRun) -> None:
    kill_and_wait_for_restart(run, "gateway-0")
    restarts = run.wait_for(lambda: (r := supervisor_restarts(run)).get("gateway-0") and r, 60,
                            "the restarted gateway to hear from the supervisor")
    assert restarts["gateway-0"] == 1 and set(restarts) == {"gateway-0", "replay-0", "learner-0", "actor-0"}
    rises(run, lambda: counter(run, "learner-0", "updates_total"), "learner updates after the gateway's restart")
    text = get_text(f"{run.url}/metrics")
    assert "# TYPE flywheel_supervisor_restarts_total counter" in text
    assert 'flywheel_supervisor_restarts_total{service="supervisor",instance="run",child="gateway-0"} 1' in text
    assert "# TYPE flywheel_supervisor_children_running gauge" in text
    invalid = (run.status() or {})["gateway"]["invalid_metric_keys"]
    assert not [key for key in invalid if key.startswith("supervisor:")], invalid


@pytest.mark.timeout(120)
@pytest.mark.system
def test_stopped_replay_resumes_without_a_restart(run: FlywheelRun) -> None:
    pid = run.wait_for(lambda: pid_of(run, "replay-0"), 30, "the replay")
    before = supervisor_restarts(run)
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(20)
        assert psutil.Process(pid).status() == psutil.STATUS_STOPPED and pid_of(run, "replay-0") == pid
        assert not instance(run, "replay-0").get("up")  # silent for 20 s: the gateway shows it down
    finally:
        os.kill(pid, signal.SIGCONT)
    run.wait_for(lambda: instance(run, "replay-0").get("up"), 30, "the replay to report again")
    rises(run, lambda: counter(run, "learner-0", "updates_total"), "learner updates after SIGCONT")
    rises(run, lambda: counter(run, "actor-0", "env_steps_total"), "env steps after SIGCONT")
    assert pid_of(run, "replay-0") == pid and supervisor_restarts(run) == before


@pytest.mark.timeout(240)
@pytest.mark.system
def test_a_child_that_keeps_dying_stops_the_run_with_its_log_tail(run: FlywheelRun) -> None:
    """With --max-restarts 3 (actor-0 may have been restarted before), its fourth exit stops the run, which
    still stops the others in order (their final checkpoints) and exits non-zero."""
    assert run.proc is not None
    restarted = run.wait_for(lambda: pid_of(run, "actor-0") and supervisor_restarts(run), 30, "actor-0")
    killed: set[int] = set()
    deadline = time.monotonic() + 120
    while run.proc.poll() is None and len(killed) < 6 and time.monotonic() < deadline:
        pid = pid_of(run, "actor-0")
        if pid is not None and pid not in killed:
            os.kill(pid, signal.SIGKILL)
            killed.add(pid)
        time.sleep(0.2)
    assert run.proc.wait(timeout=100) == 1
    assert len(killed) == 4 - restarted["actor-0"]
    text = run.log.read_text()
    assert "error: actor-0 exited with code -9 (restarted 3 times within 600 s already): " in text
    assert "(log: " in text and "actor-0.log)" in text
    assert "stopped; checkpoints in" in text and "| restarts " in text
