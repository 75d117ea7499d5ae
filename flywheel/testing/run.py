"""``flywheel run`` as a child process for tests and benchmarks: start, wait, counters, CPU, greedy evaluation."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from flywheel.launch.runwatch import fetch_status
from flywheel.processes import launch
from flywheel.testing.errors import HarnessError
from flywheel.testing.polling import wait_until

SERVICES = ("actor", "replay", "learner", "gateway")
START_LINE = re.compile(r"gateway (?P<url>http://\S+) \(/status, /metrics\); weights (?P<weights>\S+);")


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without FLYWHEEL_* variables and with no preset (FLYWHEEL_PRESET=none), so only
    the command line (and ``extra``) shapes a child process; its output unbuffered. ``flywheel run`` still applies
    its preset: it hands its children the preset's values."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLYWHEEL_")}
    env["PYTHONUNBUFFERED"] = "1"
    env["FLYWHEEL_PRESET"] = "none"
    env.update(extra)
    return env


def launcher_endpoints(log: Path) -> tuple[str, str] | None:
    """(gateway URL, weights endpoint) from the start line ``flywheel run`` prints into ``log``; None until then.
    With ``--base-port 0 --http-port 0`` this is how a test learns where the run it started listens."""
    try:
        found = START_LINE.search(log.read_text(errors="replace"))
    except OSError:
        return None
    return None if found is None else (found["url"], found["weights"])


def tail(path: Path, lines: int = 8) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


@dataclass
class Snapshot:
    """Counters of a running system at one moment: per-service sums over every instance, and CPU seconds."""

    t: float
    counters: dict[str, dict[str, float]]
    gauges: dict[str, list[dict[str, float]]]
    cpu: dict[str, float] = field(default_factory=dict)

    def total(self, service: str, name: str) -> float:
        return self.counters.get(service, {}).get(name, 0.0)

    def actors(self) -> list[dict[str, float]]:
        """The actors' gauges, one dict per instance, in instance order."""
        return sorted(self.gauges.get("actor", []), key=lambda g: str(g.get("instance")))

    def per_actor(self, gauge: str) -> dict[str, float | None]:
        """One actor gauge by instance."""
        return {str(g.get("instance")): g.get(gauge) for g in self.actors()}

    def progress_point(self, started: float) -> dict[str, Any]:
        """What every learning benchmark records per snapshot: seconds since ``started``, the system's counts,
        each actor's exploration rate, the replay's size, CPU seconds per process and the load average."""
        return {
            "t": self.t - started, "env_steps": self.total("actor", "env_steps_total"),
            "episodes": self.total("actor", "episodes_total"), "updates": self.total("learner", "updates_total"),
            "samples": self.total("learner", "samples_total"),
            "transitions": self.total("replay", "transitions_received_total"),
            "epsilon": self.per_actor("epsilon"),
            "replay_size": sum(g.get("size_transitions", 0.0) for g in self.gauges.get("replay", [])),
            "cpu": dict(self.cpu), "load": list(os.getloadavg()),
        }


def all_up(status: dict[str, Any] | None, actors: int) -> bool:
    """The gateway's /status shows a live replay, a live learner and ``actors`` live actors."""
    services = (status or {}).get("services", {})
    return all(services.get(name, {}).get("up", 0) >= count
               for name, count in (("replay", 1), ("learner", 1), ("actor", actors)))


def snapshot_of(status: dict[str, Any], now: float, cpu: dict[str, float]) -> Snapshot:
    """A Snapshot of the gateway's /status: counters summed per service over every instance, gauges per instance."""
    counters: dict[str, dict[str, float]] = {}
    gauges: dict[str, list[dict[str, float]]] = {}
    for service, entry in status.get("services", {}).items():
        sums: dict[str, float] = {}
        for inst in entry.get("instances", []):
            for key, value in inst.get("counters", {}).items():
                sums[key] = sums.get(key, 0.0) + float(value)
            gauges.setdefault(service, []).append({"instance": inst.get("instance"), **inst.get("gauges", {})})
        counters[service] = sums
    return Snapshot(now, counters, gauges, cpu)


class FlywheelRun:
    """One ``flywheel run`` as a user starts it, on Unix sockets and an HTTP port the kernel picks; stopped with
    SIGINT like Ctrl-C."""

    def __init__(self, env_id: str, workdir: Path, *, actors: int, envs_per_actor: int | None = None,
                 sets: Sequence[str] = (), args: Sequence[str] = (), progress_interval: float = 5.0) -> None:
        self.env_id, self.workdir, self.actors = env_id, workdir, actors
        self.url = ""  # known once the launcher has printed its first line (start)
        self.weights_endpoint = ""
        self.log = workdir / "run.log"
        self.command = ["run", "--env", env_id, "--actors", str(actors),
                        "--base-port", "0", "--http-port", "0",  # no port guessed: Unix sockets, an HTTP port picked
                        "--checkpoint-dir", str(workdir / "checkpoints"),
                        "--progress-interval", str(progress_interval)]
        if envs_per_actor is not None:
            self.command += ["--envs-per-actor", str(envs_per_actor)]
        for item in sets:
            self.command += ["--set", item]
        self.command += list(args)
        if "--resume" not in args and "--if-exists" not in args:  # a kept workdir is this harness's own run
            self.command += ["--if-exists", "overwrite"]
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = 0.0
        self._procs: dict[str, psutil.Process] = {}
        self._names: dict[int, str | None] = {}  # pid -> the instance name in its environment (None: none)

    def start(self, timeout: float = 300.0) -> FlywheelRun:
        """Start and wait until every service reports (the gateway's URL and the weights endpoint are read from
        the launcher's first line)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.started = time.monotonic()
        self.log.unlink(missing_ok=True)
        self.proc = launch(self.command, clean_env(), self.log, tie_to_parent=False)
        deadline = self.started + timeout
        while self.alive() and time.monotonic() < deadline and not (self._read_endpoints() and self._all_up()):
            time.sleep(0.25)
        if self.alive() and time.monotonic() < deadline:
            return self
        self.stop()
        raise HarnessError(f"flywheel run did not come up; log {self.log}:\n{tail(self.log)}")

    def _read_endpoints(self) -> bool:
        """The gateway URL and weights endpoint from the launcher's start line; False until it is printed."""
        if self.url:
            return True
        found = launcher_endpoints(self.log)
        if found is None:
            return False
        self.url, self.weights_endpoint = found
        return True

    def _all_up(self) -> bool:
        return all_up(self.status(), self.actors)

    def __enter__(self) -> FlywheelRun:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def check_alive(self) -> None:
        if not self.alive():
            raise HarnessError(f"flywheel run exited early (code {self.proc.returncode if self.proc else None}); "
                             f"log {self.log}:\n{tail(self.log)}")

    def wait_for(self, check: Callable[[], Any], timeout: float, what: str) -> Any:
        """Poll ``check`` twice a second until it is truthy; a dead run or the timeout is a HarnessError."""
        return wait_until(check, timeout, what, error=HarnessError, before=self.check_alive,
                          detail=lambda: f"; log {self.log}:\n{tail(self.log)}")

    def wait_until_learning(self, timeout: float, what: str = "the learner's first update") -> Snapshot:
        """The first snapshot in which the learner has made an update."""
        def learning() -> Snapshot | None:
            snap = self.snapshot()
            return snap if snap is not None and snap.total("learner", "updates_total") > 0 else None

        return self.wait_for(learning, timeout, what)

    def window(self, warmup_s: float, seconds: float) -> tuple[Snapshot, Snapshot]:
        """Snapshots ``seconds`` apart, the first ``warmup_s`` from now; a gateway that does not answer is a
        HarnessError."""
        time.sleep(warmup_s)
        first = self.snapshot()
        time.sleep(seconds)
        last = self.snapshot()
        if first is None or last is None:
            raise HarnessError(f"the gateway did not answer; log {self.log}:\n{tail(self.log)}")
        return first, last

    def status(self) -> dict[str, Any] | None:
        return fetch_status(self.url, timeout=5.0)

    def wait_until_paced(self, timeout: float) -> bool:
        """Wait until the replay's rate limiter has held inserts back once, so a window sees the paced state.

        Until then the actors run ahead of the ratio into the replay's error buffer and the ZeroMQ queues, which
        flatters env steps/s. False (measure anyway) when they were never held back within ``timeout`` seconds:
        then the learner keeps up with the actors and nothing is paced.
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.check_alive()
            snap = self.snapshot()
            if snap is not None and (snap.total("replay", "rate_limiter_insert_wait_seconds_total") > 0
                                     or snap.total("actor", "send_blocked_seconds_total") > 0):
                return True
            time.sleep(0.5)
        return False

    def snapshot(self) -> Snapshot | None:
        """Counters summed over every instance the gateway knows (live or not) and each child's CPU seconds."""
        status = self.status()
        return None if status is None else snapshot_of(status, time.monotonic(), self.cpu_seconds())

    def children(self) -> dict[str, psutil.Process]:
        """The service processes by instance name (actor-0, learner-0, ...), found once they exist."""
        if self.proc is None:
            return {}
        try:
            found = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.Error:
            found = []
        for child in found:
            if child.pid in self._names:
                continue
            try:
                env = child.environ()
                parent = child.ppid()
            except psutil.Error:
                continue
            name = next((env[key] for service in SERVICES
                         if (key := f"FLYWHEEL_{service.upper()}_INSTANCE") in env and env[key]), None)
            self._names[child.pid] = name
            # a service's own children (env workers, the learner's evaluator, compiler workers) inherit its
            # environment and so its instance name: the service is the one whose parent is not named so
            if name and self._names.get(parent) != name:
                self._procs[name] = child  # a restarted service replaces the one before
        return dict(self._procs)

    def cpu_seconds(self) -> dict[str, float]:
        """User + system CPU seconds of each service process so far."""
        out: dict[str, float] = {}
        for name, proc in self.children().items():
            try:
                times = proc.cpu_times()
            except psutil.Error:
                continue
            out[name] = times.user + times.system
        return out

    def launcher_cpu_seconds(self) -> float:
        """User + system CPU seconds of the ``flywheel run`` process itself (its supervisor, progress, curves)."""
        if self.proc is None:
            return 0.0
        try:
            times = psutil.Process(self.proc.pid).cpu_times()
        except psutil.Error:
            return 0.0
        return times.user + times.system

    def stop(self, timeout: float = 240.0) -> int | None:
        """SIGINT (Ctrl-C): flywheel run stops its children in order; SIGKILL if it takes longer than ``timeout``."""
        if self.proc is None or self.proc.poll() is not None:
            return None if self.proc is None else self.proc.returncode
        self.proc.send_signal(signal.SIGINT)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()



def greedy_returns(q_values: Callable[[np.ndarray], np.ndarray], env_id: str, episodes: int,
                   seed: int) -> np.ndarray:
    """Returns of ``episodes`` greedy episodes (argmax Q, no exploration) on fresh envs seeded seed, seed+1, ...

    The episodes run side by side as one batch per step; both sides of a comparison are evaluated by this function.
    """
    import gymnasium

    envs = [gymnasium.make(env_id) for _ in range(episodes)]
    obs = np.stack([np.asarray(env.reset(seed=seed + i)[0], dtype=np.float32) for i, env in enumerate(envs)])
    returns = np.zeros(episodes)
    done = np.zeros(episodes, dtype=bool)
    while not done.all():
        actions = q_values(obs).argmax(axis=1)
        for i, env in enumerate(envs):
            if done[i]:
                continue
            next_obs, reward, terminated, truncated, _ = env.step(int(actions[i]))
            returns[i] += float(reward)
            obs[i] = next_obs
            done[i] = terminated or truncated
    for env in envs:
        env.close()
    return returns


