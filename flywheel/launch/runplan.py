"""What ``flywheel run`` is asked and what it starts: its command-line flags, the plan of the services' settings and
the child processes, as plain records (run.py beside it makes the plan and runs it; supervisor.py keeps the children
alive; runconfig.py saves and restores the flags)."""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import subprocess
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from flywheel.launch.remote import add_listen_flags
from flywheel.launch.runfolder import IF_EXISTS
from flywheel.launch.tracking_cli import add_track_flags
from flywheel.presets import DEFAULT_ENV as DEFAULT_ENV  # the default job (flywheel/presets names it)
from flywheel.presets import Preset
from flywheel.settings import MAX_TORCH_THREADS

MAX_RESTARTS = 5  # restarts of one child allowed within RESTART_WINDOW_S; its next exit stops the run
RESTART_WINDOW_S = 120.0
BACKOFF_S = 1.0  # wait before the first restart, doubled for each further one within the window
BACKOFF_MAX_S = 30.0

SEED_MAX = 2**31 - 1  # --seed: 0..SEED_MAX (what every env library takes)
CHILD_SEED_BOUND = 2**30  # a child's seed, below this: env slot i takes seed + i, the greedy env seed + 10,000
FIRST_WEIGHTS_WAIT_S = 60  # actors wait this long for the learner's first weights (a learner starts in seconds)
SEEDED = ("replay", "learner", "actor")  # the services flywheel run hands a seed (the gateway draws nothing)
REPLAY_CORES = 1  # the core flywheel run leaves to its replay when it sizes the learner's torch threads
_N = TypeVar("_N", int, float)


def _number(text: str, kind: Callable[[str], _N], what: str) -> _N:
    """A flag's value read as ``kind`` (int or float), or argparse's error saying it must be ``what``."""
    try:
        return kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None


def _count(text: str) -> int:
    value = _number(text, int, "a whole number")
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def _seconds(text: str) -> float:
    value = _number(text, float, "a number of seconds")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, got {text}")
    return value


def _seed(text: str) -> int:
    value = _number(text, int, "a whole number")
    if not 0 <= value <= SEED_MAX:
        raise argparse.ArgumentTypeError(f"must be within 0..{SEED_MAX}, got {value}")
    return value


def learner_threads(actors: int, cores: int | None = None, share: float = 0.0) -> int:
    """The learner's torch threads when its setting is 0: the cores left after the run's local actors (one core
    each) and its replay, or the preset's ``run.learner_core_share`` of the machine when the actors fill it, whichever
    is more; at least 1, at most MAX_TORCH_THREADS. On 2 cores with 2 actors and the default
    job's 0.3: 1, as measured."""
    cores = cores or os.cpu_count() or 1
    return max(1, min(MAX_TORCH_THREADS, max(cores - actors - REPLAY_CORES, round(cores * share))))


def draw_seed() -> int:
    """A run seed for a run started without --seed (recorded in run.json, so the run can be repeated)."""
    return secrets.randbelow(SEED_MAX + 1)


def child_seed(seed: int, service: str, index: int = 0, start: int = 0) -> int:
    """The seed of one child of a run with ``seed``: ``service``'s ``index``-th instance (actor i) at the run's
    ``start``-th start (0, then 1 for the first --resume, ...), so no two children and no two starts of a run share
    env seeds or random draws. A NumPy SeedSequence: the same inputs give the same seed on every machine."""
    key = (SEEDED.index(service), index, start)
    return int(np.random.SeedSequence(seed, spawn_key=key).generate_state(1, np.uint64)[0] % CHILD_SEED_BOUND)


def add_supervisor_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--max-restarts", type=_count, default=MAX_RESTARTS,
                        help=f"restarts of one child (backoff {BACKOFF_S:g} s doubling to {BACKOFF_MAX_S:g} s) "
                             f"allowed within --restart-window; its next exit stops the run (default "
                             f"{MAX_RESTARTS}; 0: any exit stops it)")
    parser.add_argument("--restart-window", type=_seconds, default=RESTART_WINDOW_S,
                        help=f"seconds over which --max-restarts counts (default {RESTART_WINDOW_S:g})")


def add_run_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--env", default=DEFAULT_ENV,
                        help=f"environment id (default: the default job's, {DEFAULT_ENV})")
    parser.add_argument("--preset", default=None, metavar="NAME|FILE",
                        help="tuned settings: a preset name (flywheel presets list) or a YAML file (default: chosen "
                             "from --env); FLYWHEEL_* variables and --set override its values")
    parser.add_argument("--actors", type=int, default=None,
                        help="actor processes (default: one per core, less the preset's run.spare_cores: one "
                             "left to the learner for Atari)")
    parser.add_argument("--envs-per-actor", type=int, default=None, help="environments per actor")
    parser.add_argument("--steps", type=int, default=0, help="stop after this many env steps in total (0: never)")
    parser.add_argument("--target-return", type=float, default=None,
                        help="stop once the greedy evaluation return reaches this")
    parser.add_argument("--time-limit", type=float, default=0, help="stop after this many seconds (0: never)")
    parser.add_argument("--checkpoint-dir", type=Path, default=Path("checkpoints"), help="where checkpoints go")
    parser.add_argument("--log-dir", type=Path, default=None, help="service logs (default: CHECKPOINT_DIR/logs)")
    parser.add_argument("--log-format", choices=("text", "json"), default=None,
                        help="every service's log lines as text (default) or JSON, one object per line")
    parser.add_argument("--resume", action="store_true", help="continue from the checkpoints in --checkpoint-dir")
    parser.add_argument("--if-exists", choices=IF_EXISTS, default=None,
                        help="when --checkpoint-dir already holds a run: new (default) writes to the next free "
                             "CHECKPOINT_DIR-2, -3, ...; resume continues it (as --resume); overwrite replaces it; "
                             "fail exits 2. A folder a live run holds is always refused")
    parser.add_argument("--base-port", type=int, default=5555,
                        help="first of six ZeroMQ ports on 127.0.0.1 (0: no TCP ports, every service on Unix "
                             "sockets in a private directory)")
    parser.add_argument("--http-port", type=int, default=8080,
                        help="gateway HTTP port on 127.0.0.1 (0: one the kernel picks, printed at start and kept "
                             "across gateway restarts)")
    parser.add_argument("--progress-interval", type=float, default=5.0, help="seconds between progress lines")
    parser.add_argument("--local-transport", choices=("ipc", "tcp"), default="ipc",
                        help="how the local actors and learner reach the replay: Unix sockets (default; the "
                             "replay also listens on TCP, on --listen ADDR for actors from other hosts) or TCP only")
    parser.add_argument("--curve-keys-dir", type=Path, default=None,
                        help="ZeroMQ CURVE keys (flywheel keys generate DIR) for every service: its TCP "
                             "connections encrypted and authenticated (Unix sockets stay plain)")
    parser.add_argument("--set", action="append", default=[], metavar="SERVICE.FIELD=VALUE",
                        help="override one service setting, e.g. --set learner.lr=0.0005 (repeatable)")
    parser.add_argument("--seed", type=_seed, default=None,
                        help="seed of every env, exploration draw, network initialisation and replay sampler "
                             "(each service and actor gets its own, derived from it; default: one is drawn); "
                             "recorded in CHECKPOINT_DIR/run.json, kept by --resume (docs/REPRODUCIBILITY.md)")
    parser.add_argument("--no-video", action="store_true",
                        help="skip the end-of-run clip of one greedy episode (CHECKPOINT_DIR/video.mp4)")
    add_listen_flags(parser)  # --listen, --advertise: actors on other hosts (flywheel/launch/remote.py)
    add_supervisor_flags(parser)  # --max-restarts, --restart-window
    add_track_flags(parser)  # --track, --wandb-project, --wandb-entity, --wandb-group, --wandb-tags


@dataclass
class Child:
    """One service process started by ``flywheel run``."""

    service: str
    name: str
    proc: subprocess.Popen[bytes]
    log: Path


@dataclass
class Plan:
    """What will be started: per-service environment variables (the preset's name, the wiring and the user's own
    values: each child reads the preset itself), validated before anything starts into ``settings``."""

    env: dict[str, dict[str, str]]
    ports: dict[str, int]
    gateway_url: str
    log_dir: Path
    actor_extra: list[dict[str, str]] = field(default_factory=list)
    socket_dir: Path | None = None  # holds the Unix sockets of the local fast path; removed at the end
    preset: Preset | None = None  # the preset env names, which every child reads (flywheel/presets/*.yaml)
    join: dict[str, Any] | None = None  # --listen: what actors on other hosts are told (flywheel/launch/remote.py)
    settings: dict[str, Any] = field(default_factory=dict)  # service -> the settings its env gives it
    _remove: weakref.finalize | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.socket_dir is not None:  # also when a plan is dropped unused (and at exit)
            self._remove = weakref.finalize(self, shutil.rmtree, str(self.socket_dir), True)

    def remove_socket_dir(self) -> None:
        """Remove the sockets' folder (the end of the run); idempotent."""
        if self._remove is not None:
            self._remove()


def seed_plan(plan: Plan, seed: int, start: int = 0) -> None:
    """Give the replay (its sampler), the learner (its network) and each actor (its envs, exploration draws and
    acting network) a seed of their own derived from the run's ``seed`` at its ``start``-th start, and have the
    actors wait for the learner's first (seeded) weights before acting. A value set for a service (--set
    SERVICE.seed=N, FLYWHEEL_<SERVICE>_SEED) is kept as given, for every actor alike."""
    for service in ("replay", "learner"):
        plan.env[service].setdefault("SEED", str(child_seed(seed, service, 0, start)))
    plan.env["actor"].setdefault("FIRST_WEIGHTS_WAIT_S", str(FIRST_WEIGHTS_WAIT_S))  # the learner's network first
    if plan.settings:  # the settings the plan records say so too
        for service in ("replay", "learner"):
            seeded = {"seed": int(plan.env[service]["SEED"])}
            plan.settings[service] = plan.settings[service].model_copy(update=seeded)
        waits = {"first_weights_wait_s": float(plan.env["actor"]["FIRST_WEIGHTS_WAIT_S"])}
        plan.settings["actor"] = plan.settings["actor"].model_copy(update=waits)
    if "SEED" not in plan.env["actor"]:
        for index, extra in enumerate(plan.actor_extra):
            extra["SEED"] = str(child_seed(seed, "actor", index, start))
