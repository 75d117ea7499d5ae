"""Evaluation of a checkpoint (or a uniformly random policy): the project's protocol, seeded episodes in workers.

The protocol (``flywheel eval``, the model card, the bench suites): one episode per seed, the env reset with it and a
``numpy.random.default_rng(seed)`` drawing the exploration (epsilon-greedy, default epsilon 0.05) or, for the random
policy, every action; so an episode's result depends only on (policy, env id, seed, epsilon, no-ops, stall rule),
whichever worker plays it. An episode ends as the env ends it: no stall rule unless asked (``stall_steps``).

No-op starts where the env supports them (today Mario, whose info has ``x_pos``): each episode starts at the level
start with 0..``noop_max`` NOOP actions (action 0 of every Mario action set; the count drawn from the episode's rng,
kept as ``noops``), then epsilon-greedy; ``noop_max`` defaults to the env's preset's (``best_eval_noop_max``, what
the learner's own evaluations play: Mario's 30, others 0). Stall rule: with ``stall_steps`` > 0 an episode also ends
after that many agent steps without a new maximum ``x_pos``. A rule that can only lower scores is best reported
beside the plain figure, so every record also carries what the rule with ``STALL_STEPS`` would have kept
(``x_pos_max_stall_rule``, ``flag_stall_rule``) from the same episode. ``end`` records why each episode ended:
"flag", "death", "clock" (the level's timer ran out), "stall", "time_limit" (the env's max_episode_steps),
"max_steps" (this module's cap) or, for envs without Mario's info, "terminated" / "truncated".

Atari is evaluated as the standard says, whatever the training id's options: whole games (no episodic life) with
the game's own score (no reward clipping), after the env's seeded no-op start and FIRE
(``flywheel.envs.evaluation_env_id``); an episode's return is the game's score, ``info["episode"]["return"]``.
The statistics (bootstrap and Wilson intervals) are flywheel.stats.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from flywheel.stats import summarize

if TYPE_CHECKING:
    from flywheel.policy import Policy

STALL_STEPS = 250  # the stall rule whose figure every record carries beside the plain one
EPSILON = 0.05  # the protocol's exploration rate (the Nature DQN's)
FIRST_SEED = 100_000  # the protocol's first seed (flywheel bench mario's seed_base)
EPISODES = 100

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
    """Play one episode with the process's env and policy (a Pool task)."""
    if "error" in _worker:
        raise RuntimeError(_worker["error"])
    return run_episode(_worker["env"], _worker["policy"], _worker["n_actions"], seed, epsilon=_worker["epsilon"],
                       noop_max=_worker["noop_max"], stall_steps=_worker["stall_steps"], max_steps=_worker["max_steps"])


def run_episode(env: Any, policy: Policy | None, n_actions: int, seed: int, *, epsilon: float = EPSILON,
                noop_max: int = 0, stall_steps: int = 0, max_steps: int | None = None,
                after_reset: Callable[[], None] | None = None,
                after_step: Callable[[], None] | None = None) -> dict[str, Any]:
    """Play one episode of the protocol in ``env`` (built with ``evaluation_env_id``) with ``policy`` (None:
    random); a plain dict of what happened (see ``evaluate``). ``after_reset`` and ``after_step`` are called after
    the reset and each step (e.g. to film it); the episode is the same with or without them."""
    rng = np.random.default_rng(seed)
    started = time.monotonic()
    obs, info = env.reset(seed=int(seed))
    if after_reset is not None:
        after_reset()
    mario = "x_pos" in info
    noops = int(rng.integers(noop_max + 1)) if mario and noop_max else 0
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
        if after_step is not None:
            after_step()
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


def evaluate(env_id: str, seeds: Sequence[int], *, checkpoint: str | Path | Policy | None = None,
             epsilon: float = EPSILON, workers: int = 1, stall_steps: int = 0, max_steps: int | None = None,
             noop_max: int | None = None, progress: Callable[[dict[str, Any]], None] | None = None
             ) -> list[dict[str, Any]]:
    """One episode per seed with the checkpoint in folder ``checkpoint``, or a Policy already built (None:
    uniformly random actions).

    ``workers`` > 1 plays the episodes in that many 'spawn' processes (each loads the policy and builds the env
    once); 1 plays them in this process. ``progress`` gets each finished episode's record. Returns the records
    in the order of ``seeds``: seed, x_pos_max and flag (None / False off Mario), return, length, end, noops,
    x_pos_max_stall_rule and flag_stall_rule (see the module's docstring), seconds. ``noop_max`` > 0 starts each
    episode of an env that supports it with 0..noop_max NOOPs (None: the env's preset's, ``default_noop_max``);
    ``stall_steps`` > 0 turns the stall rule on.
    """
    if noop_max is None:
        noop_max = default_noop_max(env_id)
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


def default_noop_max(env_id: str) -> int:
    """The no-op starts the env's shipped preset evaluates with (its learner's ``best_eval_noop_max``, what the
    learner's own evaluations play; 0 for an env whose preset sets none)."""
    from flywheel import presets

    preset = presets.resolve("", env_id)
    return int(preset.section("learner").get("best_eval_noop_max", 0)) if preset is not None else 0


MEASURES = {"progress": ("x_pos_max", "furthest x"), "success": ("flag", "flag")}  # what Mario's records carry


def measures(records: Sequence[dict[str, Any]]) -> dict[str, tuple[str, str]]:
    """The progress and success measures the env reported in these records, as {"progress": (record key, label),
    "success": (record key, label)}; empty for an env that reports none (its return is all there is)."""
    return dict(MEASURES) if any(r.get(MEASURES["progress"][0]) is not None for r in records) else {}


@dataclass(frozen=True)
class Protocol:
    """How a checkpoint is judged: ``episodes`` seeds from ``seed`` on, each played at every epsilon of
    ``epsilons``, after 0..``noop_max`` no-ops (None: the env's preset's), no stall rule unless ``stall_steps``."""

    episodes: int = EPISODES
    seed: int = FIRST_SEED
    epsilons: tuple[float, ...] = (EPSILON,)
    noop_max: int | None = None
    stall_steps: int = 0
    max_steps: int | None = None
    seeds: list[int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.episodes < 1 or self.seed < 0:
            raise ValueError(f"episodes must be >= 1 and the first seed >= 0, got {self.episodes} and {self.seed}")
        if not self.epsilons or any(not 0.0 <= e <= 1.0 for e in self.epsilons):
            raise ValueError(f"each epsilon must be in [0, 1], got {list(self.epsilons)}")
        if len(set(self.epsilons)) != len(self.epsilons):
            raise ValueError(f"the epsilons must be distinct, got {list(self.epsilons)}")
        if (self.noop_max is not None and self.noop_max < 0) or self.stall_steps < 0 or (
                self.max_steps is not None and self.max_steps < 1):
            raise ValueError(f"noop_max and stall_steps must be >= 0 and max_steps >= 1, got {self.noop_max}, "
                             f"{self.stall_steps} and {self.max_steps}")
        object.__setattr__(self, "seeds", list(range(self.seed, self.seed + self.episodes)))

    def describe(self, noop_max: int) -> str:
        """One line: what every episode played (``noop_max`` resolved)."""
        return (f"{self.episodes} episodes (seeds {self.seed}..{self.seed + self.episodes - 1}), epsilon "
                f"{' and '.join(f'{e:g}' for e in self.epsilons)}, "
                + (f"0..{noop_max} no-op starts" if noop_max else "no no-op starts") + ", "
                + (f"an episode cut after {self.stall_steps} agent steps without progress (stall rule)"
                   if self.stall_steps else "no stall rule (an episode ends as the env ends it)")
                + (f", at most {self.max_steps} agent steps" if self.max_steps else ""))


def score(records: list[dict[str, Any]], epsilon: float) -> dict[str, Any]:
    """One epsilon's figures: mean and median return with 95% bootstrap intervals, and the env's progress (same)
    and success rate (95% Wilson interval) when it reports them; the records too."""
    found = measures(records)
    row: dict[str, Any] = {"epsilon": epsilon, "episodes": len(records),
                           "return": summarize([float(r["return"]) for r in records]), "progress": None,
                           "success": None, "measures": {k: label for k, (_, label) in found.items()}}
    if found:
        (x_key, _), (ok_key, _) = found["progress"], found["success"]
        both = summarize([float(r[x_key] or 0) for r in records], [bool(r[ok_key]) for r in records])
        row["progress"] = {k: v for k, v in both.items() if not k.startswith("flag_")}
        row["success"] = {"rate": both["flag_rate"], "ci_low": both["flag_ci_low"], "ci_high": both["flag_ci_high"],
                          "successes": sum(bool(r[ok_key]) for r in records)}
    row["records"] = records
    return row


def run_protocol(env_id: str, checkpoint: str | Path | Policy | None, protocol: Protocol, *, workers: int = 1,
                 progress: Callable[[float, dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Play ``protocol`` with the checkpoint (a folder or file, a Policy, or None: random): the protocol (no-ops
    resolved) and one ``score`` row per epsilon. ``progress(epsilon, record)`` follows each finished episode."""
    noop_max = default_noop_max(env_id) if protocol.noop_max is None else protocol.noop_max
    rows = []
    for epsilon in protocol.epsilons:
        def report(record: dict[str, Any], epsilon: float = epsilon) -> None:
            if progress is not None:
                progress(epsilon, record)

        records = evaluate(env_id, protocol.seeds, checkpoint=checkpoint, epsilon=epsilon, workers=workers,
                           stall_steps=protocol.stall_steps, max_steps=protocol.max_steps, noop_max=noop_max,
                           progress=report)
        rows.append(score(records, epsilon))
    described = {**asdict(protocol), "epsilons": list(protocol.epsilons), "noop_max": noop_max}
    described.pop("seeds", None)
    return {"env_id": env_id, "protocol": described, "described": protocol.describe(noop_max), "rows": rows}
