"""The supervisor of ``flywheel run``: restarts children that die, with backoff, until one dies too often."""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter, deque
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flywheel.launch.runplan import BACKOFF_MAX_S, BACKOFF_S, MAX_RESTARTS, RESTART_WINDOW_S

if TYPE_CHECKING:
    from flywheel.launch.runplan import Child, Plan

TELEMETRY_SERVICE, TELEMETRY_INSTANCE = "supervisor", "run"  # how the run process shows on the gateway


class RestartPolicy:
    """Whether and when to restart one child: no processes, only times and exit codes.

    Each exit within ``window_s`` of the last ``max_restarts`` restarts doubles the wait (``backoff_s`` up to
    ``backoff_max_s``); once ``max_restarts`` happened within the window, the next exit is not restarted. Nor is
    exit code 0 (the child finished on its own: max_updates, max_env_steps) or exit code 2 before any restart (the
    services' code for refused settings or a failed start, which a restart would repeat).
    """

    def __init__(self, max_restarts: int = MAX_RESTARTS, window_s: float = RESTART_WINDOW_S,
                 backoff_s: float = BACKOFF_S, backoff_max_s: float = BACKOFF_MAX_S) -> None:
        if max_restarts < 0 or window_s <= 0 or backoff_s < 0 or backoff_max_s < backoff_s:
            raise ValueError("restart policy: need max_restarts >= 0, window_s > 0, 0 <= backoff_s <= backoff_max_s")
        self.max_restarts, self.window_s = max_restarts, window_s
        self.backoff_s, self.backoff_max_s = backoff_s, backoff_max_s
        self.recent: deque[float] = deque()  # times of the exits restarted within the window
        self.restarts = 0  # restarts granted in all
        self.reason = ""  # why the last exit is not restarted

    def on_exit(self, code: int, now: float) -> float | None:
        """Seconds to wait before restarting a child that exited with ``code`` at ``now``; None: no restart."""
        if code == 0:
            self.reason = "it finished on its own; not restarted"
            return None
        if code == 2 and self.restarts == 0:
            self.reason = "a settings or start-up error, which a restart would repeat"
            return None
        while self.recent and now - self.recent[0] >= self.window_s:
            self.recent.popleft()
        if len(self.recent) >= self.max_restarts:
            self.reason = (f"restarted {len(self.recent)} times within {self.window_s:g} s already"
                           if self.max_restarts else "restarts are off (--max-restarts 0)")
            return None
        self.recent.append(now)
        self.restarts += 1
        return min(self.backoff_max_s, self.backoff_s * 2 ** (len(self.recent) - 1))


def _tail(path: Path, lines: int = 3) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return ""


def _written_since(path: Path, since: float) -> bool:
    """Whether ``path`` (a file, or any manifest.json under a folder) was written at or after ``since``."""
    files = [path] if path.is_file() else list(path.rglob("manifest.json")) if path.is_dir() else []
    try:
        return any(f.stat().st_mtime >= since for f in files)
    except OSError:
        return False


def restart_values(plan: Plan, child: Child, resume: bool, since: float) -> dict[str, str]:
    """The settings a child restarts with: its own, the learner resuming, the replay restoring its checkpoint and an
    actor reading its start-state pools.

    Only a checkpoint this run wrote (at or after ``since``, wall clock) or, with ``--resume``, the one it started
    from counts: a fresh run in a folder holding an older run's checkpoints must not pick those up on a restart.
    """
    values = dict(plan.env[child.service])
    if child.service == "actor":
        index = child.name.rpartition("-")[2]
        if index.isdigit() and int(index) < len(plan.actor_extra):
            values.update(plan.actor_extra[int(index)])
        if values.get("CHECKPOINT_DIR"):  # its pools, <instance>-env<slot>.npz (flywheel.envs.vector.pool_file)
            pools = list(Path(values["CHECKPOINT_DIR"]).glob(f"{child.name}-env*.npz"))
            ours = resume or any(_written_since(f, since) for f in pools)
            values["RESUME"] = str(ours).lower()
    elif child.service == "learner" and values.get("CHECKPOINT_DIR"):
        ours = resume or _written_since(Path(values["CHECKPOINT_DIR"]) / "learner.safetensors", since)
        values["RESUME"] = "auto" if ours else "false"  # auto: versions go on above every one published
    elif child.service == "replay" and values.get("CHECKPOINT_DIR"):
        ours = resume or _written_since(Path(values["CHECKPOINT_DIR"]), since)
        values["RESTORE"] = "true" if ours else "false"
    return values


Start = Callable[[str, str, dict[str, str], Path], "Child"]


class Supervisor:
    """Watches the children of ``flywheel run`` and restarts the ones that die, in ``children`` itself.

    ``poll`` (from the run's loop) notes exits, restarts children whose backoff is over (never while ``stopping``)
    and reports restarts to the gateway as service ``supervisor``, instance ``run``: counter
    ``restarts_total{child="..."}`` per child, gauges ``children_running`` and ``children_waiting_restart``.
    """

    def __init__(self, children: list[Child], plan: Plan, start: Start, args: argparse.Namespace, *,
                 backoff_s: float = BACKOFF_S, backoff_max_s: float = BACKOFF_MAX_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.children, self.plan, self.start, self.clock = children, plan, start, clock
        self.resume = bool(getattr(args, "resume", False))
        self.max_restarts = getattr(args, "max_restarts", MAX_RESTARTS)
        self.window_s = getattr(args, "restart_window", RESTART_WINDOW_S)
        self.backoff_s, self.backoff_max_s = backoff_s, backoff_max_s
        self.since = time.time()
        self.policies: dict[str, RestartPolicy] = {}
        self.due: dict[str, float] = {}  # child name -> when its restart is due (clock)
        self.restarts: Counter[str] = Counter()  # child name -> restarts done
        self.services: dict[str, str] = {}  # child name -> service
        self.reason = ""  # why the child poll returned is not restarted
        self._ctx: Any = None
        self.telemetry = self._reporter()

    def poll(self, stopping: Callable[[], bool] = lambda: False) -> Child | None:
        """Note exits and restart what is due; returns a child that is not to be restarted (the run stops)."""
        now = self.clock()
        for i, child in enumerate(self.children):
            code = child.proc.poll()
            if code is None:
                continue
            if child.name not in self.due:
                policy = self.policies.setdefault(
                    child.name, RestartPolicy(self.max_restarts, self.window_s, self.backoff_s, self.backoff_max_s))
                delay = policy.on_exit(code, now)
                if delay is None:
                    self.reason = policy.reason
                    return child
                self.due[child.name] = now + delay
                print(f"warning: {child.name} exited with code {code}: {_tail(child.log)}; restarting it in "
                      f"{delay:g} s (restart {len(policy.recent)} of at most {self.max_restarts} within "
                      f"{self.window_s:g} s)", file=sys.stderr, flush=True)
            if now >= self.due[child.name] and not stopping():
                del self.due[child.name]
                try:
                    self.children[i] = self._restart(child, code)
                except OSError as exc:  # could not even start the process (fork, exec, the log file)
                    self.reason = f"could not start it again: {exc}"
                    return child
        self._report()
        return None

    def _restart(self, child: Child, code: int) -> Child:
        values = restart_values(self.plan, child, self.resume, self.since)
        ckpt = Path(values.get("CHECKPOINT_DIR") or "/nonexistent")
        note = ""
        if child.service == "learner":
            found = values.get("RESUME") == "auto" and (ckpt / "learner.safetensors").is_file()
            note = ", resuming from its checkpoint" if found else ", from scratch (no checkpoint of this run)"
        elif child.service == "replay":
            found = values.get("RESTORE") == "true" and any(ckpt.rglob("manifest.json"))
            note = ", restoring its checkpoint" if found else ", empty (no checkpoint of this run)"
        try:
            with open(child.log, "a") as fh:
                fh.write(f"--- flywheel run: {child.name} exited with code {code}; restarted{note} ---\n")
        except OSError:
            pass
        new = self.start(child.service, child.name, values, self.plan.log_dir)
        self.restarts[child.name] += 1
        self.services[child.name] = child.service
        print(f"flywheel: restarted {child.name}{note} (restart {self.restarts[child.name]})", flush=True)
        return new

    def progress(self) -> str:
        """`` | restarts learner 1, actor 2`` for the progress line (per service); empty before any restart."""
        per_service: Counter[str] = Counter()
        for name, count in self.restarts.items():
            per_service[self.services[name]] += count
        if not per_service:
            return ""
        return " | restarts " + ", ".join(f"{service} {count}" for service, count in sorted(per_service.items()))

    def _reporter(self) -> Any:
        """A TelemetryReporter to the gateway (with the actors' CURVE keys when they have some); None: none."""
        endpoint = self.plan.env.get("gateway", {}).get("TELEMETRY_ENDPOINT")
        if not endpoint:
            return None
        import zmq

        from flywheel import security
        from flywheel.transport import TelemetryReporter

        actor = self.plan.env.get("actor", {})
        if any(key.startswith("CURVE_") for key in actor):
            from flywheel.launch.registry import settings_class
            from flywheel.settings import SettingsError, build_settings

            try:
                settings = build_settings(settings_class("actor"), {k.lower(): v for k, v in actor.items()},
                                          "run (supervisor)")
                security.configure(security.keys_from_settings(settings, "actor"), service="actor")
            except (SettingsError, security.CurveKeyError, ValueError) as exc:
                print(f"warning: flywheel run reports no restarts to the gateway: {exc}", file=sys.stderr)
                return None
        self._ctx = zmq.Context()
        return TelemetryReporter(self._ctx, endpoint, TELEMETRY_SERVICE, TELEMETRY_INSTANCE, process_stats=False)

    def _report(self) -> None:
        if self.telemetry is None or not self.telemetry.due():
            return
        counters = {f'restarts_total{{child="{c.name}"}}': float(self.restarts[c.name]) for c in self.children}
        gauges = {"children_running": float(sum(c.proc.poll() is None for c in self.children)),
                  "children_waiting_restart": float(len(self.due))}
        self.telemetry.send(counters, gauges, {"max_restarts": str(self.max_restarts),
                                               "restart_window_s": f"{self.window_s:g}"})

    def close(self) -> None:
        if self.telemetry is not None:
            self.telemetry.close()
            self.telemetry = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None
