"""Evaluation of a checkpoint (or a uniformly random policy): seeded episodes in worker processes, bootstrap CIs.

Every episode has its own seed: the env is reset with it and a ``numpy.random.default_rng(seed)`` draws the
exploration (epsilon-greedy, default epsilon 0.05) or, for the random policy, every action; so an episode's result
depends only on (policy, env id, seed, epsilon, stall rule), whichever worker plays it.

Mario (any env whose info has ``x_pos``) is evaluated as a paper would: each episode starts at the level start
with 0..``noop_max`` NOOP actions (action 0 of every Mario action set; the count drawn from the episode's rng, kept
as ``noops``), then epsilon-greedy. Stall rule: with ``stall_steps`` > 0 an episode also ends after that many agent
steps without a new maximum ``x_pos`` (a Mario stuck at a pipe otherwise walks in place for ~2,400 agent steps until
the level's clock kills it). A rule that can only lower scores is best reported beside the plain figure, so every
record also carries what the rule with ``STALL_STEPS`` would have kept (``x_pos_max_stall_rule``,
``flag_stall_rule``) from the same episode. ``end`` records why each episode ended: "flag", "death", "clock" (the
level's timer ran out), "stall", "time_limit" (the env's max_episode_steps), "max_steps" (this module's cap) or,
for envs without Mario's info, "terminated" / "truncated".

Atari is evaluated as the standard says, whatever the training id's options: whole games (no episodic life) with
the game's own score (no reward clipping), after the env's seeded no-op start and FIRE
(``flywheel.envs.evaluation_env_id``); an episode's return is the game's score, ``info["episode"]["return"]``.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from flywheel.policy import Policy

STALL_STEPS = 250
BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 20240601  # fixed, so the same values always give the same interval

_worker: dict[str, Any] = {}  # per process: the env, the policy (None: random) and the settings


def _setup(env_id: str, checkpoint: str | Policy | None, epsilon: float, stall_steps: int, max_steps: int | None,
           noop_max: int = 0) -> None:
    """Build this process's env and policy once (a Pool initializer, or the caller itself for workers=1)."""
    import torch

    from flywheel.envs import action_count, evaluation_env_id, make_env
    from flywheel.policy import Policy

    torch.set_num_threads(1)
    policy = Policy.load(checkpoint, env_id=env_id) if isinstance(checkpoint, str) else checkpoint
    env = make_env(evaluation_env_id(env_id))  # Atari: whole games, unclipped scores
    _worker.clear()
    _worker.update(env=env, policy=policy, n_actions=action_count(env.action_space), epsilon=float(epsilon),
                   stall_steps=int(stall_steps), max_steps=max_steps, noop_max=int(noop_max))


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
    noops = int(rng.integers(_worker["noop_max"] + 1)) if mario and _worker["noop_max"] else 0
    x_max = int(info.get("x_pos", 0)) if mario else None
    since_best, ret, length, flag, end = 0, 0.0, 0, False, ""
    stall_rule: tuple[int | None, bool] | None = None  # (x_max, flag) when STALL_STEPS would have ended it
    while not end:
        if length < noops:
            action = 0
        elif policy is None or rng.random() < epsilon:
            action = int(rng.integers(n_actions))
        else:
            action = int(policy.predict(np.asarray(obs)[None])[0])
        obs, reward, terminated, truncated, info = env.step(action)
        ret += float(reward)
        length += 1
        if mario:
            x = int(info.get("x_pos", 0))
            flag = flag or bool(info.get("flag_get", False))
            if x_max is None or x > x_max:
                x_max, since_best = x, 0
            else:
                since_best += 1
            if stall_rule is None and since_best >= STALL_STEPS:
                stall_rule = (x_max, flag)
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
    x_stall, flag_stall = stall_rule if stall_rule is not None else (x_max, flag)
    return {"seed": int(seed), "x_pos_max": x_max, "flag": flag, "return": ret, "length": length, "end": end,
            "noops": noops, "x_pos_max_stall_rule": x_stall, "flag_stall_rule": flag_stall,
            "seconds": time.monotonic() - started}


def evaluate(env_id: str, seeds: Sequence[int], *, checkpoint: str | Path | Policy | None = None, epsilon: float = 0.05,
             workers: int = 1, stall_steps: int = STALL_STEPS, max_steps: int | None = None, noop_max: int = 0,
             progress: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """One episode per seed with the checkpoint in folder ``checkpoint``, or a Policy already built (None:
    uniformly random actions).

    ``workers`` > 1 plays the episodes in that many 'spawn' processes (each loads the policy and builds the env
    once); 1 plays them in this process. ``progress`` gets each finished episode's record. Returns the records
    in the order of ``seeds``: seed, x_pos_max and flag (None / False off Mario), return, length, end, noops,
    x_pos_max_stall_rule and flag_stall_rule (see the module's docstring), seconds. ``noop_max`` > 0 starts each
    Mario episode with 0..noop_max NOOPs.
    """
    seeds = [int(s) for s in seeds]
    if len(set(seeds)) != len(seeds):
        raise ValueError("evaluation seeds must be distinct")
    if not 0.0 <= epsilon <= 1.0:
        raise ValueError(f"epsilon must be in [0, 1], got {epsilon!r}")
    if workers < 1 or stall_steps < 0 or noop_max < 0:
        raise ValueError(f"workers must be >= 1, stall_steps and noop_max >= 0, got {workers}, {stall_steps} and "
                         f"{noop_max}")
    policy = str(checkpoint) if isinstance(checkpoint, str | Path) else checkpoint
    args = (env_id, policy, float(epsilon), int(stall_steps), max_steps, int(noop_max))
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
    """n, mean, median, 95% percentile-bootstrap CIs of the mean and the median (``resamples`` resamples, fixed
    seed), flag rate.

    ``flags`` (one bool per value) gives ``flag_rate`` and its 95% Wilson interval (``flag_ci_low``,
    ``flag_ci_high``); without them all three are None. No values: a ValueError.
    """
    data = np.asarray(values, dtype=np.float64)
    if data.ndim != 1 or len(data) == 0:
        raise ValueError("summarize needs a non-empty sequence of numbers")
    rng = np.random.default_rng(seed)
    resampled = data[rng.integers(len(data), size=(resamples, len(data)))]
    low, high = np.percentile(resampled.mean(axis=1), [2.5, 97.5])
    median_low, median_high = np.percentile(np.median(resampled, axis=1), [2.5, 97.5])
    flag_rate = flag_low = flag_high = None
    if flags is not None:
        if len(flags) != len(data):
            raise ValueError(f"{len(flags)} flags for {len(data)} values")
        flag_rate = float(np.mean([bool(f) for f in flags]))
        flag_low, flag_high = wilson_interval(sum(bool(f) for f in flags), len(data))
    return {"n": int(len(data)), "mean": float(data.mean()), "median": float(np.median(data)),
            "ci_low": float(low), "ci_high": float(high), "median_ci_low": float(median_low),
            "median_ci_high": float(median_high), "flag_rate": flag_rate, "flag_ci_low": flag_low,
            "flag_ci_high": flag_high}


def wilson_interval(successes: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """The 95% Wilson score interval of a proportion (sound at 0 and n successes, unlike the normal one)."""
    if n < 1 or not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n and n >= 1, got {successes} of {n}")
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return float(max(0.0, centre - half)), float(min(1.0, centre + half))


def interquartile_mean(values: Sequence[float] | np.ndarray) -> float:
    """The mean of the middle half: ``int(n / 4)`` values cut from each end, as scipy's trim_mean(x, 0.25) and
    rliable's IQM do (so under 4 values it is the plain mean)."""
    data = np.sort(np.asarray(values, dtype=np.float64))
    cut = len(data) // 4
    return float(data[cut:len(data) - cut].mean())


def across_runs(runs: Sequence[Sequence[float]], flags: Sequence[Sequence[bool]], *,
                resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED) -> dict[str, Any]:
    """Several training runs' evaluations of one task, aggregated as rliable does: each run's score is its mean over
    its episodes; the median and interquartile mean of the run scores (and of the runs' flag rates) with 95%
    percentile intervals from a bootstrap over runs (rliable's stratified bootstrap, one task: runs resampled with
    replacement). Also the pooled episodes' mean and flag rate with a two-level bootstrap (runs, then episodes
    within each), which carries both the run-to-run and the episode-to-episode noise. A single run has no interval
    over runs (None)."""
    if len(runs) < 1 or len(flags) != len(runs) or any(
            len(r) < 1 or len(r) != len(f) for r, f in zip(runs, flags, strict=True)):
        raise ValueError("across_runs needs one non-empty list of values and one of flags per run, of equal length")
    values = [np.asarray(r, dtype=np.float64) for r in runs]
    rates = [np.mean(np.asarray(f, dtype=bool)) for f in flags]
    scores = np.array([v.mean() for v in values])
    rng = np.random.default_rng(seed)
    picks = rng.integers(len(runs), size=(resamples, len(runs)))
    out: dict[str, Any] = {"runs": len(runs), "episodes": [len(v) for v in values], "run_means": scores.tolist(),
                           "run_flag_rates": [float(r) for r in rates]}
    for name, per_run in (("mean", scores), ("flag_rate", np.array(rates))):
        boot = per_run[picks]
        for stat, resampled, point in (
                ("median", np.median(boot, axis=1), np.median(per_run)),
                ("iqm", np.array([interquartile_mean(row) for row in boot]), interquartile_mean(per_run))):
            low, high = np.percentile(resampled, [2.5, 97.5])
            out[f"{stat}_{name}"] = float(point)  # one run says nothing of the spread between runs: no CI
            out[f"{stat}_{name}_ci"] = [float(low), float(high)] if len(runs) > 1 else None
    pooled_x, pooled_flag = [], []
    for row in picks[: max(1, resamples // 10)]:  # two levels cost more: a tenth of the resamples
        xs = [values[i][rng.integers(len(values[i]), size=len(values[i]))] for i in row]
        fs = [np.asarray(flags[i], dtype=bool)[rng.integers(len(values[i]), size=len(values[i]))] for i in row]
        pooled_x.append(np.concatenate(xs).mean())
        pooled_flag.append(np.concatenate(fs).mean())
    out["pooled_mean"] = float(np.concatenate(values).mean())
    out["pooled_mean_ci"] = [float(v) for v in np.percentile(pooled_x, [2.5, 97.5])]
    out["pooled_flag_rate"] = float(np.mean(np.concatenate([np.asarray(f, dtype=bool) for f in flags])))
    out["pooled_flag_rate_ci"] = [float(v) for v in np.percentile(pooled_flag, [2.5, 97.5])]
    return out
