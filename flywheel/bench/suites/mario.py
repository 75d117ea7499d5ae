"""Super Mario Bros 1-1: a timed ``flywheel run`` against a random policy, and a scale model for longer runs.

The suite first plays ``random_episodes`` episodes with uniformly random actions (the distance a policy must beat
and the bare emulator's speed), then starts ``flywheel run`` with the default pixel preset for ``minutes``. While it
runs, the bench reads the gateway every ``poll_s`` seconds (steps, updates, each actor's rolling distance, CPU
seconds of every process) and, every ``eval_every_min`` minutes, plays ``eval_episodes`` episodes with the newest
published weights at epsilon 0.05 (the usual DQN evaluation), recording the distance (``x_pos``) each one reached.
The scale model turns the measured per-process costs into what a run of N frames in T hours would need.
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from flywheel.bench.runner import BenchContext, Row, SuiteResult, median
from flywheel.bench.suites._harness import FlywheelRun, Snapshot, WeightsWatcher, pyplot, save_figure
from flywheel.bench.suites._scale import ScaleModel, scale_table

DESCRIPTION = "Mario 1-1: distance per episode over a timed flywheel run vs a random policy; scale model"
OPTIONS = {
    "minutes": "length of the flywheel run (default 60; --quick 4)",
    "env": "environment id (default SuperMarioBros-1-1-v0)",
    "actors": "actor processes (default: the machine's cores, as flywheel run does)",
    "random_episodes": "episodes of the random policy (default 30; --quick 4)",
    "eval_every_min": "minutes between evaluations of the newest weights (default 5; --quick 1)",
    "eval_episodes": "episodes per evaluation (default 2; --quick 1)",
    "eval_epsilon": "exploration during evaluations (default 0.05)",
    "poll_s": "seconds between reads of the gateway (default 15; --quick 5)",
}
FRAME_SKIP = 4  # emulator frames per agent step in Flywheel's Mario preprocessing
MAX_EVAL_STEPS = 4500  # the environment's own time limit


def _play(env_id: str, episodes: int, seed: int, choose: Any, progress: Any) -> tuple[list[float], int, float]:
    """Play ``episodes`` episodes; ``choose(obs, rng)`` picks the action. Returns distances, steps, seconds."""
    from flywheel.envs import make_env

    env = make_env(env_id, seed=seed)
    rng = np.random.default_rng(seed)
    distances: list[float] = []
    steps, started = 0, time.monotonic()
    for episode in range(episodes):
        obs, info = env.reset(seed=seed + episode)
        x_pos = float(info.get("x_pos", 0.0))
        for _ in range(MAX_EVAL_STEPS):
            obs, _, terminated, truncated, info = env.step(int(choose(obs, rng)))
            steps += 1
            x_pos = float(info.get("x_pos", x_pos))
            if terminated or truncated:
                break
        distances.append(x_pos)
        progress(episode, x_pos)
    env.close()
    return distances, steps, time.monotonic() - started


def _point(run: FlywheelRun, snap: Snapshot) -> dict[str, Any]:
    actors = sorted(snap.gauges.get("actor", []), key=lambda g: str(g.get("instance")))
    learner = (snap.gauges.get("learner") or [{}])[0]
    return {
        "t": snap.t - run.started, "env_steps": snap.total("actor", "env_steps_total"),
        "episodes": snap.total("actor", "episodes_total"), "updates": snap.total("learner", "updates_total"),
        "samples": snap.total("learner", "samples_total"),
        "transitions": snap.total("replay", "transitions_received_total"),
        "actor_blocked_s": snap.total("actor", "send_blocked_seconds_total"),
        "learner_wait_s": snap.total("learner", "data_wait_seconds_total"),
        "distance": {str(g.get("instance")): g.get("mario_distance_mean") for g in actors},
        "distance_max": max((g.get("mario_distance_max", 0.0) for g in actors), default=0.0),
        "epsilon": {str(g.get("instance")): g.get("epsilon") for g in actors},
        "replay_size": sum(g.get("size_transitions", 0.0) for g in snap.gauges.get("replay", [])),
        "loss": learner.get("loss"), "cpu": dict(snap.cpu),
    }


def run(ctx: BenchContext) -> SuiteResult:
    env_id = ctx.option("env", "SuperMarioBros-1-1-v0")
    minutes = ctx.option_float("minutes", 4.0 if ctx.quick else 60.0)
    actors = ctx.option_int("actors", os.cpu_count() or 1)
    random_episodes = ctx.option_int("random_episodes", 4 if ctx.quick else 30)
    eval_every = 60 * ctx.option_float("eval_every_min", 1.0 if ctx.quick else 5.0)
    eval_episodes = ctx.option_int("eval_episodes", 1 if ctx.quick else 2)
    eval_eps = ctx.option_float("eval_epsilon", 0.05)
    poll_s = ctx.option_float("poll_s", 5.0 if ctx.quick else 15.0)

    ctx.progress(f"random policy: {random_episodes} episodes of {env_id}")
    random_d, random_steps, random_s = _play(
        env_id, random_episodes, ctx.seed, lambda _obs, rng: rng.integers(7),
        lambda i, x: ctx.progress(f"random episode {i + 1}/{random_episodes}: distance {x:.0f}"))
    bare_rate = random_steps / random_s

    points: list[dict[str, Any]] = []
    evals: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="flywheel-bench-mario-") as tmp:
        run_ = FlywheelRun(env_id, Path(tmp), actors=actors, progress_interval=30.0)
        ctx.progress(f"flywheel run --env {env_id} --actors {actors} for {minutes:g} min (log {run_.log})")
        with run_:
            spec_shape, n_actions = _spec(env_id)
            watcher = WeightsWatcher(run_.weights_endpoint, spec_shape, n_actions)
            try:
                _monitor(ctx, run_, watcher, minutes, poll_s, eval_every, eval_episodes, eval_eps, points, evals)
            finally:
                watcher.close()
    result = summarize(env_id, actors, minutes, random_d, bare_rate, points, evals, eval_eps)
    if points:
        result.plots.append(_plot(ctx, env_id, points, evals, random_d))
    return result


def _spec(env_id: str) -> tuple[tuple[int, ...], int]:
    from flywheel.envs import env_spec

    spec = env_spec(env_id)
    return tuple(spec.obs_shape), int(spec.n_actions)


def _monitor(ctx: BenchContext, run: FlywheelRun, watcher: WeightsWatcher, minutes: float, poll_s: float,
             eval_every: float, eval_episodes: int, eval_eps: float, points: list[dict[str, Any]],
             evals: list[dict[str, Any]]) -> None:
    end = run.started + 60 * minutes
    next_poll, next_eval = run.started + poll_s, run.started + eval_every
    while time.monotonic() < end:
        run.check_alive()
        watcher.poll(int(1000 * max(0.0, min(next_poll, end) - time.monotonic())))
        now = time.monotonic()
        if now >= next_poll:
            next_poll = now + poll_s
            snap = run.snapshot()
            if snap is not None:
                points.append(_point(run, snap))
                p = points[-1]
                dist = ", ".join(f"{k} {v:.0f}" for k, v in p["distance"].items() if v is not None) or "-"
                ctx.progress(f"{p['t'] / 60:5.1f} min: {p['env_steps']:,.0f} env steps, {p['updates']:,.0f} "
                             f"updates, distance (rolling) {dist}")
        if now >= next_eval and watcher.net is not None and now + 30 < end:
            next_eval = now + eval_every
            version = watcher.version

            def choose(obs: np.ndarray, rng: np.random.Generator) -> int:
                if rng.random() < eval_eps:
                    return int(rng.integers(watcher.n_actions))
                return int(watcher.q_values(obs[None]).argmax())

            distances, _, _ = _play(run.env_id, eval_episodes, 50_000 + len(evals), choose, lambda i, x: None)
            evals.append({"t": now - run.started, "version": version, "distances": distances})
            ctx.progress(f"evaluation at {(now - run.started) / 60:.1f} min (weights v{version}): distances "
                         f"{', '.join(f'{d:.0f}' for d in distances)}")


def summarize(env_id: str, actors: int, minutes: float, random_d: list[float], bare_rate: float,
              points: list[dict[str, Any]], evals: list[dict[str, Any]], eval_eps: float) -> SuiteResult:
    """Rows, notes and the scale model's table from what the run recorded; no plotting."""
    result = SuiteResult(suite="mario", title=f"{env_id}: {minutes:g} minutes of flywheel run vs a random policy")
    result.method = f"one run of {minutes:g} min; {len(random_d)} random-policy episodes"
    late = [d for e in evals if e["t"] >= 0.75 * 60 * minutes for d in e["distances"]] or \
        [d for e in evals[-1:] for d in e["distances"]]
    if late:
        result.rows.append(Row(case=f"{env_id}, last quarter", metric=f"distance per episode (eps {eval_eps:g})",
                               unit="x_pos", flywheel=median(late), peer=median(random_d), peer_name="random policy",
                               goal="more than random", flywheel_runs=late, peer_runs=random_d,
                               met=median(late) > median(random_d)))
    last = points[-1] if points else None
    rolling = [v for v in (last or {}).get("distance", {}).values() if v is not None]
    if rolling:
        result.rows.append(Row(case=f"{env_id}, training episodes at the end", metric="best actor's mean distance "
                               "(last 100 episodes)", unit="x_pos", flywheel=max(rolling),
                               peer=float(np.mean(random_d)), peer_name="random policy (mean)"))
    model = ScaleModel.from_points(points, actors=actors, frame_skip=FRAME_SKIP, bare_env_steps_per_s=bare_rate)
    if model is not None:
        result.rows += model.rows(env_id)
        result.sections += scale_table(model, targets=((10e6, 8), (50e6, 12), (200e6, 24)))
        result.extra["scale_model"] = model.as_dict()
    result.notes += [
        f"`flywheel run --env {env_id} --actors {actors}` with the pixel preset, {minutes:g} min of wall clock "
        "from process start; the bench read /status every few seconds and evaluated the newest weights every "
        f"few minutes ({len(evals)} evaluations, epsilon {eval_eps:g}, on the same 2 cores, so they slow training "
        "a little).",
        f"Random policy: {len(random_d)} episodes, distance median {median(random_d):.0f}, mean "
        f"{np.mean(random_d):.0f}, max {max(random_d):.0f}; the bare emulator with preprocessing ran "
        f"{bare_rate:.0f} agent steps/s in this process.",
    ]
    if points:
        result.notes.append(f"At the end: {last['env_steps']:,.0f} agent steps ({FRAME_SKIP * last['env_steps']:,.0f} "
                            f"frames), {last['updates']:,.0f} updates, replay {last['replay_size']:,.0f} transitions.")
    result.extra.update({"points": points, "evals": evals, "random_distances": random_d, "minutes": minutes})
    return result


def _plot(ctx: BenchContext, env_id: str, points: list[dict[str, Any]], evals: list[dict[str, Any]],
          random_d: list[float]) -> str:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 5))
    names = sorted({k for p in points for k in p["distance"]})
    for name in names:
        xs = [p["t"] / 60 for p in points if p["distance"].get(name) is not None]
        ys = [p["distance"][name] for p in points if p["distance"].get(name) is not None]
        eps = next((p["epsilon"].get(name) for p in reversed(points) if p["epsilon"].get(name) is not None), None)
        label = f"{name} training episodes, rolling mean of 100" + (f" (eps {eps:.3g})" if eps is not None else "")
        ax.plot(xs, ys, linewidth=1.5, label=label)
    if evals:
        xs = [e["t"] / 60 for e in evals for _ in e["distances"]]
        ys = [d for e in evals for d in e["distances"]]
        ax.scatter(xs, ys, color="black", s=18, zorder=3, label="evaluation episodes (newest weights, eps 0.05)")
    lo, hi = np.percentile(random_d, [10, 90])
    ax.axhspan(lo, hi, color="grey", alpha=0.2, label="random policy, 10th-90th percentile")
    ax.axhline(float(np.median(random_d)), color="grey", linestyle="--", linewidth=1, label="random policy, median")
    ax.set_xlabel("minutes since flywheel run started")
    ax.set_ylabel("distance (x_pos) at episode end")
    ax.set_title(f"{env_id}: distance per episode over time")
    ax.legend(loc="upper left", fontsize=8)
    ax.set_ylim(bottom=0, top=max(math.ceil(max([*ys, *random_d], default=1) / 500) * 500, 500) if evals else None)
    return save_figure(fig, ctx.plot_path("distance"))
