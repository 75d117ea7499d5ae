"""``flywheel demos collect``: play demonstration episodes in a pool of worker processes and write one set."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from queue import Empty
from typing import Any

import numpy as np

from flywheel.demos.format import DemoFileError, DemoWriter, read_manifest
from flywheel.envs.measures import progress_in
from flywheel.envs.spaces import observation_shape


@dataclass(frozen=True)
class CollectJob:
    """What one worker plays: episodes ``first, first + stride, ...`` below ``episodes``."""

    env_id: str
    policy: str
    episodes: int
    first: int
    stride: int
    shard: str
    n_step: int
    gamma: float
    seed: int


def resolve_workers(workers: str, episodes: int) -> int:
    """``auto`` is the number of cores minus one (at least 1); never more workers than episodes."""
    if workers == "auto":
        count = max(1, (os.cpu_count() or 2) - 1)
    else:
        try:
            count = int(workers)
        except ValueError:
            raise ValueError(f"--workers must be 'auto' or a positive integer, got {workers!r}") from None
        if count < 1:
            raise ValueError(f"--workers must be 'auto' or a positive integer, got {workers!r}")
    return max(1, min(count, episodes))


def play_episode(env: Any, policy: Any, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, bool, dict]:
    """One episode: observations o_0..o_T, actions, rewards, whether it terminated, and the last info."""
    obs, info = env.reset(seed=seed)
    observations, actions, rewards = [np.array(obs)], [], []
    while True:
        action = policy(obs, info)
        obs, reward, terminated, truncated, info = env.step(action)
        observations.append(np.array(obs))
        actions.append(action)
        rewards.append(float(reward))
        if terminated or truncated:
            return np.stack(observations), np.asarray(actions, np.int64), np.asarray(rewards), bool(terminated), info


def _worker(job: CollectJob, progress: Any) -> None:
    """Play this worker's episodes into its own shard; report (episodes, transitions, return) per episode."""
    try:  # one OpenCV thread per worker: the workers are the parallelism, threads on top only contend
        import cv2

        cv2.setNumThreads(1)
    except ImportError:  # pragma: no cover - preprocessing falls back to NumPy without cv2
        pass
    if job.policy.startswith("checkpoint:"):  # torch only for a network policy: it costs seconds per worker
        import torch

        torch.set_num_threads(1)
    from flywheel.demos.experts import build_policy
    from flywheel.envs import make_env

    try:
        env = make_env(job.env_id, seed=job.seed + job.first)
        policy = build_policy(job.policy, job.env_id, env, job.seed + job.first)
        space = env.observation_space
        if space.dtype is None:
            raise ValueError(f"{job.env_id}: its observation space {space} has no dtype")
        with DemoWriter(job.shard, env_id=job.env_id, obs_shape=observation_shape(space), obs_dtype=space.dtype.name,
                        n_step=job.n_step, gamma=job.gamma) as writer:
            for episode in range(job.first, job.episodes, job.stride):
                observations, actions, rewards, terminated, info = play_episode(env, policy, job.seed + episode)
                added = writer.add_episode(observations, actions, rewards, terminated)
                progress.put(("episode", added, float(rewards.sum()), progress_in(info)))
        env.close()
    except Exception as exc:  # reported to the parent, which stops and says so
        progress.put(("error", f"{type(exc).__name__}: {exc}", 0.0, None))
        raise SystemExit(1) from None


def merge_shards(shards: list[Path], out: Path, append: bool) -> dict[str, Any]:
    """Move every shard's episodes into ``out`` under fresh numbers; the manifest is written last, atomically."""
    manifests = [read_manifest(shard) for shard in shards]
    base = read_manifest(out) if append and (out / "manifest.json").exists() else None
    keys = ("env_id", "obs_shape", "obs_dtype", "n_step", "gamma")
    merged = dict(base or manifests[0], episodes=list(base["episodes"]) if base else [], count=base["count"] if base
                  else 0)
    for manifest in manifests:
        for key in keys:
            if manifest[key] != merged[key]:
                raise DemoFileError(f"cannot merge: {key} is {manifest[key]!r} in one part, {merged[key]!r} in another")
    number = max([int(e["file"][8:14]) + 1 for e in merged["episodes"]], default=0)
    for shard, manifest in zip(shards, manifests, strict=True):
        for entry in manifest["episodes"]:
            name = f"episode-{number:06d}.npz"
            number += 1
            os.replace(shard / entry["file"], out / name)
            merged["episodes"].append(dict(entry, file=name))
            merged["count"] += entry["transitions"]
    tmp = out / f".manifest.json.tmp-{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump(merged, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, out / "manifest.json")
    return merged


def collect(env_id: str, episodes: int, out: Path, *, workers: str = "auto", policy: str = "expert",
            n_step: int = 3, gamma: float = 0.99, seed: int = 0, append: bool = False,
            show_progress: bool = True) -> dict[str, Any]:
    """Collect ``episodes`` episodes with ``workers`` processes into the set at ``out``; returns a summary."""
    if episodes < 1:
        raise ValueError(f"--episodes must be >= 1, got {episodes}")
    if (out / "manifest.json").exists() and not append:
        raise DemoFileError(f"{out} already holds demonstrations: pass --append to add to them")
    count = resolve_workers(workers, episodes)
    out.mkdir(parents=True, exist_ok=True)
    ctx = mp.get_context("spawn")  # no inherited torch or emulator state in the workers
    progress = ctx.Queue()
    shards = [out / f".shard-{os.getpid()}-{k}" for k in range(count)]
    for shard in shards:
        shutil.rmtree(shard, ignore_errors=True)
    procs = [ctx.Process(target=_worker, args=(CollectJob(env_id, policy, episodes, k, count, str(shards[k]), n_step,
                                                          gamma, seed), progress), daemon=True)
             for k in range(count)]
    start = time.monotonic()
    done = transitions = 0
    returns: list[float] = []
    reached_all: list[float] = []  # the env's progress measure at each episode's end, where it has one
    try:
        for proc in procs:
            proc.start()
        while done < episodes:
            try:
                kind, added, ret, reached = progress.get(timeout=1.0)
            except Empty:
                dead = [p for p in procs if p.exitcode not in (None, 0)]
                if dead:
                    raise RuntimeError(f"a collection worker exited with code {dead[0].exitcode}") from None
                continue
            if kind == "error":
                raise RuntimeError(f"a collection worker failed: {added}")
            done += 1
            transitions += added
            returns.append(ret)
            if reached is not None:
                reached_all.append(float(reached))
            if show_progress:
                elapsed = time.monotonic() - start
                bar = "#" * int(30 * done / episodes)
                print(f"\r[{bar:<30}] {done}/{episodes} episodes, {transitions} transitions, "
                      f"{done / elapsed:.2f} episodes/s, mean return {np.mean(returns):.1f}",
                      end="", file=sys.stderr, flush=True)
        for proc in procs:
            proc.join(timeout=60)
        merged = merge_shards(shards, out, append)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
        for shard in shards:
            shutil.rmtree(shard, ignore_errors=True)
        if show_progress:
            print(file=sys.stderr)
    elapsed = time.monotonic() - start
    return {"path": str(out), "env_id": env_id, "policy": policy, "workers": count, "episodes": done,
            "transitions": transitions, "seconds": elapsed, "episodes_per_s": done / elapsed,
            "transitions_per_s": transitions / elapsed, "mean_return": float(np.mean(returns)),
            "mean_progress": float(np.mean(reached_all)) if reached_all else None, "total_count": merged["count"]}
