"""The checkpoints of a timed Mario training: a poll of the gateway, the learner's checkpoint asked for over control
and copied out with the kept best of its moment (used by the mario and atari suites)."""

from __future__ import annotations

import json
import shutil
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from flywheel.bench.runner import BenchError
from flywheel.testing.compose import ComposeStack
from flywheel.testing.run import FlywheelRun, Snapshot

Training = FlywheelRun | ComposeStack


def progress_point(run: Training, snap: Snapshot) -> dict[str, Any]:
    """One poll of the gateway as the suite keeps it: the run's progress, each actor's rolling distance and flag
    rate, the learner's loss and the whole machine's busy CPU seconds."""
    learner = (snap.gauges.get("learner") or [{}])[0]
    return {
        **snap.progress_point(run.started),
        "distance": snap.per_actor("episode_progress_mean"),
        "distance_max_by_actor": snap.per_actor("episode_progress_max"),
        "distance_max": max((g.get("episode_progress_max") or 0.0 for g in snap.actors()), default=0.0),
        "flag_rate": snap.per_actor("episode_success_rate"),
        "loss": learner.get("loss"), "machine_cpu_s": machine_cpu_seconds(),
    }


def machine_cpu_seconds() -> float:
    """Busy CPU seconds of the whole machine since boot (user, nice, system, irq): the one CPU figure that covers
    containers and processes alike."""
    import psutil

    t = psutil.cpu_times()
    return float(t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0))


def request_checkpoint(run: Training, token: str) -> None:
    """``POST /control/checkpoint?target=learner`` with the control token; anything but 202 is a BenchError."""
    req = urllib.request.Request(f"{run.url}/control/checkpoint?target=learner", data=b"{}", method="POST",
                                 headers={"Authorization": f"Bearer {token}", "X-Flywheel-Operator": "bench-mario"})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            if resp.status != 202:
                raise BenchError(f"POST /control/checkpoint answered {resp.status}")
    except urllib.error.HTTPError as exc:
        raise BenchError(f"POST /control/checkpoint answered {exc.code}: {exc.read()[:200]!r}") from None


def take_checkpoint(run: Training, token: str, minute: float, workdir: Path, steps_mark: int | None = None,
                     polled: float = 0.0) -> dict[str, Any]:
    """Ask the learner for a checkpoint now, wait for the newer file, copy it to workdir/ckpt-<M>min/ (a step mark's:
    workdir/ckpt-<N>steps/, ``polled`` the agent steps of the poll that reached it)."""
    dest = workdir / (f"ckpt-{minute:g}min" if steps_mark is None else f"ckpt-{steps_mark}steps")
    asked = time.monotonic()
    if isinstance(run, ComposeStack):  # the learner's volume, copied out once its checkpoint counter moves
        count = run.learner_checkpoints()
        request_checkpoint(run, token)
        run.wait_for(lambda: run.learner_checkpoints() > count, 180.0, "the learner's checkpoint")
        snap = run.snapshot()
        run.copy_learner_checkpoint(dest)
    else:
        source = run.workdir / "checkpoints" / "learner" / "learner.safetensors"
        before = source.stat().st_mtime_ns if source.exists() else -1
        request_checkpoint(run, token)
        run.wait_for(lambda: source.exists() and source.stat().st_mtime_ns > before, 180.0,
                     "the learner's checkpoint")
        snap = run.snapshot()
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, dest / source.name)
        for extra in (source.parent / "weights-versions.json", run.workdir / "checkpoints" / "run.json"):
            if extra.exists():
                shutil.copy2(extra, dest / extra.name)
    from flywheel.policy import Policy

    policy = Policy.load(dest, env_id=run.env_id, which="latest")
    point = progress_point(run, snap) if snap is not None else {}
    found = {"minute": minute, "dir": str(dest), "t": time.monotonic() - run.started, "asked_t": asked - run.started,
             "env_steps": point.get("env_steps"), "updates": point.get("updates"),
             "replay_size": point.get("replay_size"), "checkpoint_updates": policy.updates,
             "weight_version": policy.weight_version}
    if steps_mark is not None:
        found.update(steps_mark=steps_mark, polled_env_steps=polled)
    if not isinstance(run, ComposeStack) and (kept := copy_kept_best(source.parent, dest, run.env_id)) is not None:
        found["best"] = kept
    return found


def copy_kept_best(learner_dir: Path, dest: Path, env_id: str) -> dict[str, Any] | None:
    """The learner's kept best of this moment, copied to dest/kept-best/ (None before its first evaluation): the
    policy file, its best.json, and the version the file itself names."""
    from flywheel.policy import BEST_FILE, KEPT_BEST_DIR, Policy
    from flywheel.services.learner.best import BEST_JSON

    if not (learner_dir / BEST_FILE).is_file():
        return None
    folder = dest / KEPT_BEST_DIR
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy2(learner_dir / BEST_FILE, folder / BEST_FILE)
    scored: dict[str, Any] = {}
    if (learner_dir / BEST_JSON).is_file():
        shutil.copy2(learner_dir / BEST_JSON, folder / BEST_JSON)
        scored = json.loads((folder / BEST_JSON).read_text())
    kept = Policy.load(folder / BEST_FILE, env_id=env_id)
    return {"file": str(folder / BEST_FILE), "weight_version": kept.weight_version, "updates": kept.updates,
            "scored": {k: scored.get(k) for k in ("weight_version", "mean_return", "episodes", "epsilon", "noop_max")}}
