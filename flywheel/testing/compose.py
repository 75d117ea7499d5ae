"""The shipped docker-compose.yml as a running stack for benchmarks: built and started on a Docker engine
(flywheel.testing.dockerhost), read through the gateway like a ``flywheel run``, its learner checkpoint copied out.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flywheel.launch.runplan import DEFAULT_ENV
from flywheel.launch.runwatch import fetch_status
from flywheel.testing.dockerhost import Engine, base_image, stage_build_context, wheelhouse
from flywheel.testing.errors import HarnessError
from flywheel.testing.polling import wait_until
from flywheel.testing.run import Snapshot, all_up, snapshot_of

IMAGES = {"FLYWHEEL_IMAGE": "flywheel-bench:cpu", "FLYWHEEL_IMAGE_ACTOR": "flywheel-bench-actor:cpu"}
SERVICES = ("control-token", "curve-keys", "gateway", "replay", "learner", "actor")


class ComposeStack:
    """``docker compose up -d --scale actor=N`` of the compose file as shipped (its default job, or ``env_id`` through
    FLYWHEEL_ENV_ID), the gateway published on 127.0.0.1:``port`` and its control token set to ``token``; ``seed``
    seeds the learner and the replay through FLYWHEEL_LEARNER_SEED and FLYWHEEL_REPLAY_SEED."""

    def __init__(self, engine: Engine, workdir: Path, *, env_id: str = DEFAULT_ENV, actors: int, port: int,
                 token: str, project: str = "flywheel-bench", seed: int | None = None) -> None:
        self.engine, self.workdir, self.env_id, self.actors = engine, workdir, env_id, actors
        self.url = f"http://127.0.0.1:{port}"
        self.log = workdir / "compose.log"
        self.started = 0.0
        self.compose_file = workdir / "context" / "docker-compose.yml"
        engine.env.update(IMAGES, COMPOSE_PROJECT_NAME=project, FLYWHEEL_HTTP_PORT=str(port),
                          FLYWHEEL_CONTROL_TOKEN=token)
        if env_id != DEFAULT_ENV:  # else the compose file's own default, as a user gets it
            engine.env["FLYWHEEL_ENV_ID"] = env_id
        for name in ("FLYWHEEL_LEARNER_SEED", "FLYWHEEL_REPLAY_SEED"):
            engine.env.pop(name, None)
            if seed is not None:
                engine.env[name] = str(seed)

    def compose(self, *args: str, timeout: float = 300, check: bool = True, capture: bool = True) -> str:
        return self.engine.compose(self.compose_file, *args, timeout=timeout, check=check, capture=capture).stdout

    def build(self) -> None:
        """Stage the checkout with the host's wheelhouse and build both images (cached by the engine)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        stage_build_context(self.workdir / "context", wheelhouse())
        self.engine.env["FLYWHEEL_BASE_IMAGE"] = base_image(self.engine)
        self.compose("down", "-v", "--remove-orphans", "-t", "5", timeout=120, check=False)
        self.compose("--parallel", "1", "build", timeout=1800, capture=False)

    def start(self, timeout: float = 600.0) -> ComposeStack:
        """Up the stack and wait until the gateway sees a replay, a learner and every actor."""
        self.started = time.monotonic()
        self.compose("up", "-d", "--no-build", "--scale", f"actor={self.actors}", *SERVICES, timeout=timeout)
        self.wait_for(lambda: all_up(self.status(), self.actors), timeout,
                      f"a replay, a learner and {self.actors} actors on the gateway")
        return self

    def __enter__(self) -> ComposeStack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def status(self) -> dict[str, Any] | None:
        return fetch_status(self.url, timeout=5.0)

    def snapshot(self) -> Snapshot | None:
        """The gateway's counters; no per-process CPU seconds (the services run in containers)."""
        status = self.status()
        return None if status is None else snapshot_of(status, time.monotonic(), {})

    def check_alive(self) -> None:
        """A HarnessError when a service container has exited (compose restarts crashed ones: that is logged)."""
        exited = self.compose("ps", "-q", "--status", "exited", "--status", "dead", timeout=60).split()
        stopped = [c for c in exited if c]
        finished = self.compose("ps", "-aq", "control-token", "curve-keys", timeout=60).split()
        if [c for c in stopped if c not in finished]:
            raise HarnessError(f"a compose service exited; its logs:\n{self.logs(tail=40)}")

    def wait_for(self, check: Callable[[], Any], timeout: float, what: str) -> Any:
        return wait_until(check, timeout, what, error=HarnessError, interval=2.0,
                          detail=lambda: f"; logs:\n{self.logs(tail=20)}")

    def learner_checkpoints(self) -> float:
        snap = self.snapshot()
        return -1.0 if snap is None else snap.total("learner", "checkpoints_total")

    def copy_learner_checkpoint(self, dest: Path) -> Path:
        """The learner's volume (/data/learner) copied to ``dest``; its kept best removed, so ``dest`` holds the
        latest weights as a ``flywheel run`` checkpoint folder does."""
        dest.mkdir(parents=True, exist_ok=True)
        self.compose("cp", "learner:/data/learner/.", str(dest), timeout=300)
        for kept_best in dest.glob("best.*"):
            kept_best.unlink()
        return dest

    def logs(self, tail: int | None = None) -> str:
        extra = [] if tail is None else ["--tail", str(tail)]
        return self.compose("logs", "--no-color", *extra, timeout=120, check=False)

    def stop(self) -> None:
        """Keep every service's log in compose.log, then down -v (containers, network and volumes go)."""
        try:
            self.log.write_text(self.logs())
        finally:
            self.compose("down", "-v", "--remove-orphans", "-t", "60", timeout=300, check=False)
