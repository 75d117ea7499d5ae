"""Evaluation of a checkpoint (or a uniformly random policy): seeded episodes in worker processes, bootstrap CIs.

Every episode has its own seed: the env is reset with it and a ``numpy.random.default_rng(seed)`` draws the
exploration (epsilon-greedy, default epsilon 0.05) or, for the random policy, every action; so an episode's result
depends only on (policy, env id, seed, epsilon, stall rule), whichever worker plays it.

Stall rule (Mario, any env whose info has ``x_pos``): an episode also ends after ``stall_steps`` (default 250)
agent steps without a new maximum ``x_pos``. A Mario stuck at a pipe or a wall otherwise walks in place for
~2,400 agent steps until the level's clock kills it, which costs evaluation time and says nothing more about the
distance reached. The rule is the same for every policy, the random one included; ``end`` records why each
episode ended: "flag", "death", "clock" (the level's timer ran out), "stall", "time_limit" (the env's
max_episode_steps), "max_steps" (this module's cap) or, for envs without Mario's info, "terminated" / "truncated".

Atari is evaluated as the standard says, whatever the training id's options: whole games (no episodic life) with
the game's own score (no reward clipping), after the env's seeded no-op start and FIRE
(``flywheel.envs.evaluation_env_id``); an episode's return is the game's score, ``info["episode"]["return"]``.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

STALL_STEPS = 250
BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 20240601  # fixed, so the same values always give the same interval

_worker: dict[str, Any] = {}  # per process: the env, the policy (None: random) and the settings


def _setup(env_id: str, checkpoint: str | None, epsilon: float, stall_steps: int, max_steps: int | None) -> None:
    """Build this process's env and policy once (a Pool initializer, or the caller itself for workers=1)."""
    import torch

    from flywheel.envs import evaluation_env_id, make_env

    torch.set_num_threads(1)
    policy = None
    if checkpoint is not None:
        from flywheel.policy import Policy

        policy = Policy.load(checkpoint, env_id=env_id)
    env = make_env(evaluation_env_id(env_id))  # Atari: whole games, unclipped scores
    _worker.clear()
    _worker.update(env=env, policy=policy, n_actions=int(env.action_space.n), epsilon=float(epsilon),
                   stall_steps=int(stall_steps), max_steps=max_steps)


def _setup_worker(*args: Any) -> None:
    """Pool initializer: a failure is kept and raised by the first episode (a raising initializer makes the
    pool start replacement workers for ever)."""
    try:
        _setup(*args)
    except Exception as exc:  # re-raised in the parent through the first task
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        _worker["error"] = f"evaluation worker could not start: {first}"


def _episode(seed: int) -> dict[str, Any]:
    """Play one episode with the process's env and policy; a plain dict of what happened."""
    if "error" in _worker:
        raise RuntimeError(_worker["error"])
    env, policy, n_actions = _worker["env"], _worker["policy"], _worker["n_actions"]
    epsilon, stall_steps, max_steps = _worker["epsilon"], _worker["stall_steps"], _worker["max_steps"]
    rng = np.random.default_rng(seed)
    started = time.monotonic()
    obs, info = env.reset(seed=int(seed))
    mario = "x_pos" in info
    x_max = int(info.get("x_pos", 0)) if mario else None
    since_best, ret, length, flag, end = 0, 0.0, 0, False, ""
    while not end:
        if policy is None or rng.random() < epsilon:
            action = int(rng.integers(n_actions))
        else:
            action = int(policy.predict(np.asarray(obs)[None])[0])
        obs, reward, terminated, truncated, info = env.step(action)
        ret += float(reward)
        length += 1
        if mario:
            x = int(info.get("x_pos", 0))
            flag = flag or bool(info.get("flag_get", False))
            if x > x_max:
                x_max, since_best = x, 0
            else:
                since_best += 1
        if (terminated or truncated) and isinstance(info.get("episode"), dict) and "return" in info["episode"]:
            ret = float(info["episode"]["return"])  # an env that keeps its own score (Atari: the game's points)
        if terminated:
            end = ("flag" if flag else "clock" if info.get("time") == 0 else "death") if mario else "terminated"
        elif truncated:
            end = "time_limit" if mario else "truncated"
        elif mario and stall_steps and since_best >= stall_steps:
            end = "stall"
        elif max_steps is not None and length >= max_steps:
            end = "max_steps"
    return {"seed": int(seed), "x_pos_max": x_max, "flag": flag, "return": ret, "length": length, "end": end,
            "seconds": time.monotonic() - started}


def evaluate(env_id: str, seeds: Sequence[int], *, checkpoint: str | None = None, epsilon: float = 0.05,
             workers: int = 1, stall_steps: int = STALL_STEPS, max_steps: int | None = None,
             progress: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """One episode per seed with the checkpoint in folder ``checkpoint`` (None: uniformly random actions).

    ``workers`` > 1 plays the episodes in that many 'spawn' processes (each loads the policy and builds the env
    once); 1 plays them in this process. ``progress`` gets each finished episode's record. Returns the records
    in the order of ``seeds``: seed, x_pos_max and flag (None / False off Mario), return, length, end, seconds.
    """
    seeds = [int(s) for s in seeds]
    if len(set(seeds)) != len(seeds):
        raise ValueError("evaluation seeds must be distinct")
    if not 0.0 <= epsilon <= 1.0:
        raise ValueError(f"epsilon must be in [0, 1], got {epsilon!r}")
    if workers < 1 or stall_steps < 0:
        raise ValueError(f"workers must be >= 1 and stall_steps >= 0, got {workers} and {stall_steps}")
    args = (env_id, None if checkpoint is None else str(checkpoint), float(epsilon), int(stall_steps), max_steps)
    records: dict[int, dict[str, Any]] = {}

    def done(record: dict[str, Any]) -> None:
        records[record["seed"]] = record
        if progress is not None:
            progress(record)

    if workers == 1 or len(seeds) <= 1:
        saved = dict(_worker)
        try:
            _setup(*args)
            for seed in seeds:
                done(_episode(seed))
        finally:
            if "env" in _worker:
                _worker["env"].close()
            _worker.clear()
            _worker.update(saved)
    else:
        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(min(workers, len(seeds)), initializer=_setup_worker, initargs=args) as pool:
            for record in pool.imap_unordered(_episode, seeds):
                done(record)
    return [records[s] for s in seeds]


def summarize(values: Sequence[float], flags: Sequence[bool] | None = None, *,
              resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED) -> dict[str, Any]:
    """n, mean, median, a 95% percentile-bootstrap CI of the mean (``resamples`` resamples, fixed seed), flag rate.

    ``flags`` (one bool per value) gives ``flag_rate``; without them it is None. No values: a ValueError.
    """
    data = np.asarray(values, dtype=np.float64)
    if data.ndim != 1 or len(data) == 0:
        raise ValueError("summarize needs a non-empty sequence of numbers")
    rng = np.random.default_rng(seed)
    means = data[rng.integers(len(data), size=(resamples, len(data)))].mean(axis=1)
    low, high = np.percentile(means, [2.5, 97.5])
    flag_rate = None
    if flags is not None:
        if len(flags) != len(data):
            raise ValueError(f"{len(flags)} flags for {len(data)} values")
        flag_rate = float(np.mean([bool(f) for f in flags]))
    return {"n": int(len(data)), "mean": float(data.mean()), "median": float(np.median(data)),
            "ci_low": float(low), "ci_high": float(high), "flag_rate": flag_rate}
