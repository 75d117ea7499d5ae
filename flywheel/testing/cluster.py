"""The four services as separate local processes that can be killed, restarted and watched: reliability runs."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from flywheel.checkpoints import process_running
from flywheel.launch.runwatch import fetch_status
from flywheel.processes import launch
from flywheel.testing.errors import HarnessError
from flywheel.testing.polling import wait_until
from flywheel.testing.ports import free_port_block
from flywheel.testing.run import clean_env, tail

PORTS = ("transitions", "sample", "weights", "telemetry", "control", "lease", "http")
START_ORDER = ("gateway", "replay", "learner", "actor")


class ClusterError(HarnessError):
    """A service died or a condition was not reached in time; the message ends with the logs' last lines."""


@dataclass
class Service:
    """One service process: what it is started with, its log, and how often it was started."""

    name: str
    service: str
    env: dict[str, str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    started_at: float = 0.0


@dataclass
class Cluster:
    """Gateway, replay, learner and actors on free loopback ports, each its own ``flywheel <service>`` process.

    ``settings`` holds per-service overrides (``{"replay": {"CAPACITY": "20000"}}``, without the
    ``FLYWHEEL_<SERVICE>_`` prefix); every process gets the endpoints of the others and an instance name
    (``gateway-0``, ``replay-0``, ``learner-0``, ``actor-0`` ...) that the gateway reports it under.
    """

    workdir: Path
    env_id: str = "CartPole-v1"
    settings: dict[str, dict[str, str]] = field(default_factory=dict)
    services: dict[str, Service] = field(default_factory=dict)
    ports: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        base = free_port_block(len(PORTS))
        self.ports = {name: base + i for i, name in enumerate(PORTS)}
        self.url = f"http://127.0.0.1:{self.ports['http']}"

    def endpoint(self, name: str) -> str:
        return f"tcp://127.0.0.1:{self.ports[name]}"

    # ---- processes ------------------------------------------------------------------------------------------
    def base_env(self, service: str) -> dict[str, str]:
        ep = self.endpoint
        common = {"TELEMETRY_ENDPOINT": ep("telemetry"), "CONTROL_ENDPOINT": ep("control")}
        wired = {
            "gateway": {"LEASE_ENDPOINT": ep("lease"), "HTTP_HOST": "127.0.0.1", "HTTP_PORT": str(self.ports["http"])},
            "replay": {"ENV_ID": self.env_id, "TRANSITIONS_BIND": ep("transitions"), "SAMPLE_BIND": ep("sample")},
            "learner": {"ENV_ID": self.env_id, "SAMPLE_ENDPOINT": ep("sample"), "WEIGHTS_BIND": ep("weights")},
            "actor": {"ENV_ID": self.env_id, "TRANSITIONS_ENDPOINT": ep("transitions"),
                      "WEIGHTS_ENDPOINT": ep("weights"), "LEASE_ENDPOINT": ep("lease")},
        }[service]
        return {**common, **wired, **self.settings.get(service, {})}

    def add(self, service: str, name: str | None = None, **overrides: str) -> Service:
        """Register a process (not started yet); ``overrides`` win over ``settings``."""
        name = name or f"{service}-{sum(s.service == service for s in self.services.values())}"
        env = {**self.base_env(service), **overrides, "INSTANCE": name}
        self.services[name] = Service(name, service, env, self.workdir / f"{name}.log")
        return self.services[name]

    def start(self, name: str, **overrides: str) -> Service:
        """Start (or start again) one process; ``overrides`` change its settings from now on."""
        svc = self.services[name]
        if svc.proc is not None and svc.proc.poll() is None:
            raise ClusterError(f"{name} is already running")
        svc.env.update(overrides)
        env = clean_env()
        env.update({f"FLYWHEEL_{svc.service.upper()}_{k}": v for k, v in svc.env.items()})
        with open(svc.log, "ab") as log:
            log.write(f"\n===== start {svc.starts + 1} of {name} at {time.strftime('%H:%M:%S')}\n".encode())
            log.flush()
        svc.proc = launch([svc.service], env, svc.log)
        svc.starts += 1
        svc.started_at = time.monotonic()
        return svc

    def start_all(self) -> None:
        for service in START_ORDER:
            for svc in list(self.services.values()):
                if svc.service == service and svc.proc is None:
                    self.start(svc.name)

    def kill(self, name: str, sig: int = signal.SIGKILL) -> float:
        """Send ``sig`` (default: kill -9) and reap the process; returns when it was sent (time.monotonic)."""
        svc = self.services[name]
        assert svc.proc is not None
        sent = time.monotonic()
        if svc.proc.poll() is None:
            svc.proc.send_signal(sig)
        svc.proc.wait(timeout=120)
        return sent

    def alive(self, name: str) -> bool:
        proc = self.services[name].proc
        return proc is not None and proc.poll() is None

    def pid(self, name: str) -> int:
        proc = self.services[name].proc
        assert proc is not None
        return proc.pid

    def check_alive(self, names: list[str] | None = None) -> None:
        for name in names if names is not None else list(self.services):
            svc = self.services[name]
            if svc.proc is not None and svc.proc.poll() is not None:
                raise ClusterError(f"{name} exited with code {svc.proc.returncode}:\n{tail(svc.log, 15)}")

    def stop(self, timeout: float = 60.0) -> dict[str, int | None]:
        """SIGTERM in the order flywheel run uses (actors first), SIGKILL what does not stop in time."""
        codes: dict[str, int | None] = {}
        for service in reversed(START_ORDER):
            group = [(s.name, s.proc) for s in self.services.values() if s.service == service and s.proc is not None]
            for _, proc in group:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for name, proc in group:
                try:
                    codes[name] = proc.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
                    codes[name] = None
        return codes

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- observation ----------------------------------------------------------------------------------------
    def status(self) -> dict[str, Any] | None:
        return fetch_status(self.url, timeout=5.0)

    def instance(self, name: str, status: dict[str, Any] | None = None) -> dict[str, Any] | None:
        """The gateway's view of one instance (``up``, ``counters``, ``gauges`` ...), None if unknown."""
        status = status if status is not None else self.status()
        if status is None:
            return None
        for entry in status.get("services", {}).values():
            for inst in entry.get("instances", []):
                if inst.get("instance") == name:
                    return inst
        return None

    def value(self, name: str, key: str, default: float = 0.0) -> float:
        """A counter or gauge of one instance as the gateway has it now."""
        inst = self.instance(name)
        if inst is None:
            return default
        return float(inst.get("counters", {}).get(key, inst.get("gauges", {}).get(key, default)))

    def is_up(self, name: str) -> bool | None:
        inst = self.instance(name)
        return None if inst is None else bool(inst.get("up"))

    def wait(self, check: Callable[[], Any], timeout: float, what: str, *, poll_s: float = 0.25,
             alive: list[str] | None = None) -> Any:
        """Poll ``check`` until truthy; a dead process among ``alive`` (default: none checked) or the timeout raises."""
        return wait_until(check, timeout, what, interval=poll_s, error=ClusterError,
                          before=(lambda: self.check_alive(alive)) if alive else None,
                          detail=lambda: "".join(f"\n--- {s.name}\n{tail(s.log, 12)}" for s in self.services.values()))

    def rss(self, name: str) -> int:
        """Resident bytes of one process and its children (env workers, checkpoint writers); 0 when gone."""
        try:
            proc = psutil.Process(self.pid(name))
            total = proc.memory_info().rss
            for child in proc.children(recursive=True):
                try:
                    total += child.memory_info().rss
                except psutil.Error:
                    continue
            return total
        except (psutil.Error, AssertionError):
            return 0

    def log_text(self, name: str) -> str:
        try:
            return self.services[name].log.read_text(errors="replace")
        except OSError:
            return ""


def wait_for_file(path: Path, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return True
        time.sleep(0.05)
    return False


def pid_alive(pid: int) -> bool:
    """``process_running``, and not a zombie waiting to be reaped."""
    if not process_running(pid):
        return False
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False
