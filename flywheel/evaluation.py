"""Evaluation of a checkpoint (or a uniformly random policy): the project's protocol, seeded episodes in workers.

The protocol (``flywheel eval``, the model card, the bench suites): one episode per seed, the env reset with it and a
``numpy.random.default_rng(seed)`` drawing the exploration (epsilon-greedy, default epsilon 0.05) or, for the random
policy, every action; so an episode's result depends only on (policy, env id, seed, epsilon, no-ops, stall rule),
whichever worker plays it. An episode ends as the env ends it: no stall rule unless asked (``stall_steps``).

The env's own measures (flywheel.envs.measures) are what a record says beyond the return: ``progress``, the
episode's furthest ``info["progress"]`` (None for an env without a progress measure), and ``success``, whether any
step's ``info["success"]`` was true. No-op starts: with ``noop_max`` > 0 each episode starts with 0..``noop_max``
actions 0 (the count drawn from the episode's rng, kept as ``noops``), then epsilon-greedy; ``noop_max`` defaults to
the env's preset's (``best_eval_noop_max``, what the learner's own evaluations play; 0 for a preset that sets none,
so an env whose action 0 is not a no-op never gets them unasked). Stall rule: with ``stall_steps`` > 0 an episode of
an env with a progress measure also ends after that many agent steps without a new maximum progress. A rule that can
only lower scores is best reported beside the plain figure, so every record also carries what the rule with
``STALL_STEPS`` would have kept (``progress_stall_rule``, ``success_stall_rule``) from the same episode. ``end``
records why each episode ended: the env's own word at its last step (``info["end"]``, e.g. "death" or "clock"),
else "terminated" / "truncated", or this module's "stall" or "max_steps" (its cap).

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

from flywheel.stats import summarize, wilson_interval

if TYPE_CHECKING:
    from flywheel.envs.measures import Measures
    from flywheel.policy import Policy

STALL_STEPS = 250  # the stall rule whose figure every record carries beside the plain one
EPSILON = 0.05  # the protocol's exploration rate (the Nature DQN's)
FIRST_SEED = 100_000  # the protocol's first seed (the benchmarks' seed_base)
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
    from flywheel.envs.measures import END, SUCCESS, progress_in

    rng = np.random.default_rng(seed)
    started = time.monotonic()
    obs, info = env.reset(seed=int(seed))
    if after_reset is not None:
        after_reset()
    noops = int(rng.integers(noop_max + 1)) if noop_max else 0
    best = progress_in(info)  # the furthest progress so far; None: the env reports none
    since_best, ret, length, success, end = 0, 0.0, 0, bool(info.get(SUCCESS, False)), ""
    stall_rule: tuple[float | None, bool] | None = None  # (progress, success) when STALL_STEPS would have ended it
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
        success = success or bool(info.get(SUCCESS, False))
        progress = progress_in(info)
        if progress is not None and (best is None or progress > best):
            best, since_best = progress, 0
        elif best is not None:
            since_best += 1
            if stall_rule is None and since_best >= STALL_STEPS:
                stall_rule = (best, success)
        if (terminated or truncated) and isinstance(info.get("episode"), dict) and "return" in info["episode"]:
            ret = float(info["episode"]["return"])  # an env that keeps its own score (Atari: the game's points)
        if terminated or truncated:
            word = info.get(END)
            end = word[:40] if isinstance(word, str) and word else "terminated" if terminated else "truncated"
        elif best is not None and stall_steps and since_best >= stall_steps:
            end = "stall"
        elif max_steps is not None and length >= max_steps:
            end = "max_steps"
    stall_progress, stall_success = stall_rule if stall_rule is not None else (best, success)
    return {"seed": int(seed), "progress": best, "success": success, "return": ret, "length": length, "end": end,
            "noops": noops, "progress_stall_rule": stall_progress, "success_stall_rule": stall_success,
            "seconds": time.monotonic() - started}


def evaluate(env_id: str, seeds: Sequence[int], *, checkpoint: str | Path | Policy | None = None,
             epsilon: float = EPSILON, workers: int = 1, stall_steps: int = 0, max_steps: int | None = None,
             noop_max: int | None = None, progress: Callable[[dict[str, Any]], None] | None = None
             ) -> list[dict[str, Any]]:
    """One episode per seed with the checkpoint in folder ``checkpoint``, or a Policy already built (None:
    uniformly random actions).

    ``workers`` > 1 plays the episodes in that many 'spawn' processes (each loads the policy and builds the env
    once); 1 plays them in this process. ``progress`` gets each finished episode's record. Returns the records
    in the order of ``seeds``: seed, progress and success (None / False for an env without those measures), return,
    length, end, noops, progress_stall_rule and success_stall_rule (see the module's docstring), seconds.
    ``noop_max`` > 0 starts each episode with 0..noop_max actions 0 (None: the env's preset's, ``default_noop_max``);
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


def env_measures(env_id: str) -> Measures:
    """The labels of the measures the env that evaluation plays for ``env_id`` declares (flywheel.envs.measures)."""
    from flywheel.envs import env_spec, evaluation_env_id

    return env_spec(evaluation_env_id(env_id)).measures


def score(records: list[dict[str, Any]], epsilon: float, measures: Measures | None = None) -> dict[str, Any]:
    """One epsilon's figures: mean and median return with 95% bootstrap intervals, and where the env has them
    (``measures``, from ``env_measures``) its progress (the same, where every record has one) and success rate
    (95% Wilson interval), with their labels in ``measures``; the records too."""
    labels = measures.labels() if measures is not None else {}
    row: dict[str, Any] = {"epsilon": epsilon, "episodes": len(records),
                           "return": summarize([float(r["return"]) for r in records]), "progress": None,
                           "success": None, "measures": labels}
    progress = [float(r["progress"]) for r in records if r.get("progress") is not None]
    if "progress" in labels and records and len(progress) == len(records):
        row["progress"] = {k: v for k, v in summarize(progress).items() if not k.startswith("flag_")}
    if "success" in labels and records:
        wins = sum(bool(r.get("success")) for r in records)
        low, high = wilson_interval(wins, len(records))
        row["success"] = {"rate": wins / len(records), "ci_low": low, "ci_high": high, "successes": wins}
    row["records"] = records
    return row


def run_protocol(env_id: str, checkpoint: str | Path | Policy | None, protocol: Protocol, *, workers: int = 1,
                 progress: Callable[[float, dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Play ``protocol`` with the checkpoint (a folder or file, a Policy, or None: random): the protocol (no-ops
    resolved), one ``score`` row per epsilon and the labels of the env's measures (``measures``: {"progress": label,
    "success": label}, those the env has). ``progress(epsilon, record)`` follows each finished episode."""
    noop_max = default_noop_max(env_id) if protocol.noop_max is None else protocol.noop_max
    measures = env_measures(env_id)
    rows = []
    for epsilon in protocol.epsilons:
        def report(record: dict[str, Any], epsilon: float = epsilon) -> None:
            if progress is not None:
                progress(epsilon, record)

        records = evaluate(env_id, protocol.seeds, checkpoint=checkpoint, epsilon=epsilon, workers=workers,
                           stall_steps=protocol.stall_steps, max_steps=protocol.max_steps, noop_max=noop_max,
                           progress=report)
        rows.append(score(records, epsilon, measures))
    described = {**asdict(protocol), "epsilons": list(protocol.epsilons), "noop_max": noop_max}
    described.pop("seeds", None)
    return {"env_id": env_id, "protocol": described, "described": protocol.describe(noop_max), "rows": rows,
            "measures": measures.labels()}
