"""Atari (Breakout by default): a short timed ``flywheel run`` with the Atari preset, its last weights against a
random policy on the same seeds with the same evaluation code.

The suite starts ``flywheel run`` on ``env`` (the Atari preset: Rainbow's recipe, episodic life and clipped rewards
for training) for ``minutes``, with nothing evaluated while it trains (no greedy env in actor-0, no best-policy
evaluations in the learner), reading the gateway every ``poll_s`` seconds. At the end it asks the learner for a
checkpoint through ``POST /control/checkpoint`` and stops the run. Then the checkpoint and a uniformly random policy
play the same ``eval_episodes`` seeds at epsilon ``eval_epsilon`` (flywheel.evaluation: whole games, no-op starts
drawn from each seed, FIRE on reset, the game's own unclipped score, the 108,000-frame cap), and each is summarised
by its mean game score with a 95% bootstrap CI.

Why Breakout: its reward is dense (every brick scores), a random policy scores little (about 1-2 a game), a
policy that only learns to follow the ball beats that within the first few hundred thousand frames in published
DQN curves, and it exercises what Atari needs beyond pixels (FIRE to serve, five lives). Pong needs millions of
frames before its score moves off -21, far beyond what two cores do in minutes. A few minutes here is a check that
the pipeline learns something, not a learning result.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable
from typing import Any

from flywheel import presets
from flywheel.bench.parts.mario_checkpoint import take_checkpoint
from flywheel.bench.runner import BenchContext, BenchError, Row, SuiteResult, _cpu_model
from flywheel.bench.suites.mario import open_run, train_and_poll
from flywheel.envs import env_family, evaluation_env_id
from flywheel.launch.run import default_actors
from flywheel.testing.run import FlywheelRun, Snapshot

DEFAULT_ENV = "BreakoutNoFrameskip-v4"  # no sticky actions, as the DQN / Ape-X evaluations (and SB3's zoo)
DESCRIPTION = "Atari (Breakout): last weights of a timed flywheel run vs a random policy on the same seeds"
OPTIONS = {
    "minutes": "length of the flywheel run (default 30; --quick 3)",
    "env": f"Atari id, options after '?' allowed (default {DEFAULT_ENV})",
    "actors": "actor processes (default: as flywheel run, one per core less the preset's run.spare_cores)",
    "set": "extra flywheel run --set overrides, ';'-separated, e.g. replay.min_size_to_sample=5000 "
           "(actor.eval_envs=0 and learner.best_eval_interval_s=0 are added unless given: no evaluation in training)",
    "eval_episodes": "evaluation episodes (games) for the trained and the random policy (default 30; --quick 5)",
    "eval_epsilon": "exploration during evaluation (default 0.05, flywheel.evaluation's and the Nature DQN's)",
    "eval_workers": "evaluation processes (default 2)",
    "eval_max_steps": "cut an evaluation game at this many agent steps (default 0: only the env's 27,000-step cap)",
    "seed_base": "evaluation seeds are seed_base .. seed_base + eval_episodes - 1 (default 100000)",
    "poll_s": "seconds between reads of the gateway (default 15; --quick 5)",
    "workdir": "folder for the run and its checkpoint copy, kept afterwards (default: a temporary folder)",
}
FRAME_SKIP = 4


def _point(run: FlywheelRun, snap: Snapshot) -> dict[str, Any]:
    return {**snap.progress_point(run.started), "training_return": snap.per_actor("episode_return_mean")}


def _train(ctx: BenchContext, run: FlywheelRun, minutes: float, poll_s: float,
           points: list[dict[str, Any]]) -> None:
    def score(p: dict[str, Any]) -> str:
        ret = ", ".join(f"{k} {v:.1f}" for k, v in p["training_return"].items() if v is not None) or "-"
        return f"replay {p['replay_size']:,.0f}, training game score (rolling) {ret}"

    train_and_poll(ctx, run, minutes, poll_s, points, lambda snap: _point(run, snap), score)


def evaluate_both(env_id: str, checkpoint: str, seeds: list[int], *, epsilon: float, workers: int,
                  max_steps: int | None, progress: Callable[[str], None] | None = None
                  ) -> dict[str, list[dict[str, Any]]]:
    """The random policy and the checkpoint, each on every seed with flywheel.evaluation (Atari's evaluation
    settings: whole games, the game's own score): ``{"random": records, "trained": records}``, in seed order."""
    from flywheel.evaluation import evaluate

    def reporter(name: str) -> Callable[[dict[str, Any]], None]:
        done: list[int] = []

        def report(r: dict[str, Any]) -> None:
            done.append(1)
            if progress is not None:
                progress(f"{name}: game {len(done)}/{len(seeds)} (seed {r['seed']}): score {r['return']:g}, "
                         f"{r['length']} steps, {r['end']}")

        return report

    return {name: evaluate(env_id, seeds, checkpoint=path, epsilon=epsilon, workers=workers, max_steps=max_steps,
                           progress=reporter(name))
            for name, path in (("random", None), ("trained", checkpoint))}


def run(ctx: BenchContext) -> SuiteResult:
    env_id = ctx.option("env", DEFAULT_ENV)
    if env_family(env_id) != "atari":
        raise BenchError(f"--opt env={env_id!r} is not an Atari (ale-py) id")
    minutes = ctx.option_float("minutes", 3.0 if ctx.quick else 30.0)
    actors = ctx.option_int("actors", default_actors(presets.load(presets.name_for_env(env_id))))
    sets = [s.strip() for s in ctx.option("set", "").split(";") if s.strip()]
    for default in ("learner.best_eval_interval_s=0", "actor.eval_envs=0"):  # evaluation takes no training CPU
        if not any(s.startswith(default.split("=")[0] + "=") for s in sets):
            sets.insert(0, default)
    episodes = ctx.option_int("eval_episodes", 5 if ctx.quick else 30)
    epsilon = ctx.option_float("eval_epsilon", 0.05)
    workers = ctx.option_int("eval_workers", 2)
    max_steps = ctx.option_int("eval_max_steps", 0)
    seed_base = ctx.option_int("seed_base", 100_000)
    poll_s = ctx.option_float("poll_s", 5.0 if ctx.quick else 15.0)
    if episodes < 1 or workers < 1 or actors < 1 or max_steps < 0 or minutes <= 0:
        raise BenchError("eval_episodes, eval_workers and actors must be >= 1, eval_max_steps >= 0, minutes > 0")
    seeds = list(range(seed_base, seed_base + episodes))
    with ctx.workdir("atari") as workdir:
        run_, token = open_run(workdir, env_id, actors, sets)
        loads: dict[str, Any] = {"start": list(os.getloadavg())}
        points: list[dict[str, Any]] = []
        ctx.progress(f"flywheel run --env {env_id} --actors {actors} {' '.join('--set ' + s for s in sets)} for "
                     f"{minutes:g} min (log {run_.log})")
        with run_:
            _train(ctx, run_, minutes, poll_s, points)
            checkpoint = take_checkpoint(run_, token, minutes, workdir)
            loads["end_of_training"] = list(os.getloadavg())
        ctx.progress(f"evaluating the random policy and the checkpoint ({checkpoint['checkpoint_updates']:,} "
                     f"updates) on seeds {seeds[0]}..{seeds[-1]} of {evaluation_env_id(env_id)} "
                     f"(epsilon {epsilon:g}, {workers} workers)")
        records = evaluate_both(env_id, checkpoint["dir"], seeds, epsilon=epsilon, workers=workers,
                                max_steps=max_steps or None, progress=ctx.progress)
        loads["end"] = list(os.getloadavg())
        settings = {"env_id": env_id, "eval_env_id": evaluation_env_id(env_id), "minutes": minutes,
                    "actors": actors, "sets": sets, "eval_episodes": episodes, "eval_epsilon": epsilon,
                    "eval_workers": workers, "eval_max_steps": max_steps, "seeds": seeds,
                    "workdir": str(workdir) if ctx.option("workdir", "") else None}
        return summarize(settings, points, checkpoint, records, loads)


def _scores(records: list[dict[str, Any]]) -> list[float]:
    return [float(r["return"]) for r in records]


def summarize(settings: dict[str, Any], points: list[dict[str, Any]], checkpoint: dict[str, Any],
              records: dict[str, list[dict[str, Any]]], loads: dict[str, Any]) -> SuiteResult:
    """Rows, notes and the raw record from the run and the two evaluations; no plotting."""
    from flywheel.stats import summarize as stats

    env_id, eps, seeds = settings["env_id"], settings["eval_epsilon"], settings["seeds"]
    for name in ("random", "trained"):
        if [r["seed"] for r in records[name]] != seeds:
            raise BenchError(f"the {name} policy was not evaluated on the suite's seeds")
    rnd, trained = stats(_scores(records["random"])), stats(_scores(records["trained"]))
    steps = checkpoint.get("env_steps") or 0
    result = SuiteResult(suite="atari", title=f"{env_id}: {settings['minutes']:g} minutes of flywheel run "
                                              "(a short check) vs a random policy")
    result.method = (f"one run; its last weights and a random policy play the same {len(seeds)} seeds (mean game "
                     "score, 95% bootstrap CI of the mean)")
    result.rows.append(Row(
        case=f"last weights at {settings['minutes']:g} min ({steps:,.0f} agent steps, "
             f"{checkpoint.get('checkpoint_updates') or 0:,} updates)",
        metric=f"mean game score, eps {eps:g} (median {trained['median']:g}, 95% CI {trained['ci_low']:.1f}-"
               f"{trained['ci_high']:.1f})",
        unit="points", flywheel=trained["mean"], peer=rnd["mean"], peer_name="random policy (mean)",
        flywheel_runs=_scores(records["trained"]), peer_runs=_scores(records["random"])))
    if len(points) >= 2:
        first, last = points[0], points[-1]
        span = max(last["t"] - first["t"], 1e-9)
        result.rows.append(Row(case=env_id, metric="agent steps/s, all actors, over the polls", unit="steps/s",
                               flywheel=(last["env_steps"] - first["env_steps"]) / span))
        result.rows.append(Row(case=env_id, metric="learner updates/s over the polls", unit="1/s",
                               flywheel=(last["updates"] - first["updates"]) / span))
    above = trained["ci_low"] > rnd["mean"]
    one_min = [p["load"][0] for p in points] + [v[0] for v in loads.values()]
    result.notes += [
        f"A short check, not a learning result: {settings['minutes']:g} minutes on this machine is "
        f"{steps * FRAME_SKIP:,.0f} frames, against the 10-200 million frames of published Atari results.",
        f"`flywheel run --env {env_id} --actors {settings['actors']}` with the Atari preset"
        + "".join(f" `--set {s}`" for s in settings["sets"]) + f", {settings['minutes']:g} min from process "
        "start; nothing evaluated while it trained; the last weights via POST /control/checkpoint.",
        f"Evaluation after training, the same code for both policies (flywheel.evaluation on "
        f"`{settings['eval_env_id']}`: whole games, no-op starts drawn from each seed, FIRE on reset and after a "
        f"lost life, the game's own score): seeds {seeds[0]}..{seeds[-1]}, epsilon {eps:g}, "
        f"{settings['eval_workers']} worker processes"
        + (f", games cut at {settings['eval_max_steps']} agent steps." if settings["eval_max_steps"] else "."),
        f"Random policy: mean {rnd['mean']:.2f} (95% CI {rnd['ci_low']:.2f}-{rnd['ci_high']:.2f}), median "
        f"{rnd['median']:g}. Trained: mean {trained['mean']:.2f} (95% CI {trained['ci_low']:.2f}-"
        f"{trained['ci_high']:.2f}); the CI's low end is {'above' if above else 'not above'} the random mean.",
        f"Load average (1 min) during the run: min {min(one_min):.2f}, median {statistics.median(one_min):.2f}, "
        f"max {max(one_min):.2f}; CPU {_cpu_model()}.",
    ]
    if points:
        p = points[-1]
        result.notes.append(f"Last poll: {p['env_steps']:,.0f} agent steps, {p['updates']:,.0f} updates, replay "
                            f"{p['replay_size']:,.0f} transitions; training game score (rolling mean, epsilon-greedy "
                            "actors): " + (", ".join(f"{k} {v:.2f}" for k, v in p["training_return"].items()
                                                      if v is not None) or "-") + ".")
    result.extra.update({"settings": settings, "points": points, "checkpoint": checkpoint, "loads": loads,
                         "random": {"summary": rnd, "episodes": records["random"]},
                         "trained": {"summary": trained, "episodes": records["trained"]},
                         "trained_ci_low_above_random_mean": above, "cpu_model": _cpu_model()})
    return result
