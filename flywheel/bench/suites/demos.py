"""Demonstrations: collection speed, and what demonstrations buy on CartPole and Mario, measured side by side.

(a) ``flywheel demos collect`` with the scripted experts, 1 worker against all cores, CartPole and Mario: episodes/s
and transitions/s from the call to the finished set (worker start-up, playing, writing, merging included).
(b) CartPole-v1: wall clock from process start until the mean return of 10 greedy episodes reaches 475 (the sb3
suite's criterion and evaluation code), ``flywheel run`` with and without demonstrations: behaviour-cloning
pretraining in the learner, a demonstrations table in replay and the large-margin loss on its rows (DQfD), median of
``seeds`` seeds per side, sides alternating first. Collecting the demonstrations is not counted (done once, in (a)).
(c) Super Mario Bros 1-1: ``flywheel run`` for a fixed wall-clock budget with and without demonstrations from the
run-and-jump expert; then the newest weights play ``mario_eval_episodes`` episodes at epsilon 0.05
(flywheel.evaluation, seeds 50,000 on) and the mean furthest x_pos is the figure, beside the actors' own rolling
mean distance at the end.
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from flywheel.bench.parts.plots import pyplot, save_figure
from flywheel.bench.parts.records import furthest_x
from flywheel.bench.parts.time_to_target import flywheel_time_to_target
from flywheel.bench.runner import BenchContext, BenchError, Row, SuiteResult, median
from flywheel.envs import env_spec
from flywheel.testing.run import FlywheelRun
from flywheel.testing.weights import WeightsWatcher

if TYPE_CHECKING:
    from flywheel.nets import QNetwork

DESCRIPTION = "Demos: collection speed (1 vs all workers); CartPole time to 475, Mario distance, with vs without"
OPTIONS = {
    "parts": "comma-separated parts to run: collect, cartpole, mario (default all three)",
    "seeds": "CartPole seeds per side (default: --runs; --quick 1)",
    "cap_s": "give up on a CartPole seed after this many seconds (censored) (default 240; --quick 90)",
    "cartpole_episodes": "expert episodes collected for CartPole (default 200; --quick 6)",
    "mario_episodes": "expert episodes collected for Mario (default 16; --quick 2)",
    "pretrain_updates": "CartPole behaviour-cloning updates (default 1000)",
    "mario_pretrain_updates": "Mario behaviour-cloning updates (default 500; --quick 100)",
    "pretrain_loss": "dqfd (TD + large margin, default) or bc (cross-entropy)",
    "demo_ratio": "share of every batch drawn from the demonstrations table (default 0.25)",
    "margin_weight": "lambda of the large-margin loss during RL (default 1.0)",
    "mario_minutes": "wall-clock budget of each Mario run (default 6; --quick 1.5)",
    "mario_eval_episodes": "evaluation episodes after each Mario run (default 3; --quick 1)",
    "actors": "flywheel actors (default 2, one per core here)",
}
CARTPOLE, MARIO = "CartPole-v1", "SuperMarioBros-1-1-v0"
EVAL_SEED, EVAL_EPSILON = 50_000, 0.05  # Mario's evaluation episodes after training: first seed, exploration


def _collect(ctx: BenchContext, env_id: str, episodes: int, workers: str, out: Path) -> dict[str, Any]:
    from flywheel.demos.collect import collect

    ctx.progress(f"collect {episodes} expert episodes of {env_id} with {workers} worker(s)")
    summary = collect(env_id, episodes, out, workers=workers, show_progress=False, seed=ctx.seed)
    ctx.progress(f"  {summary['episodes_per_s']:.2f} episodes/s, {summary['transitions_per_s']:.0f} transitions/s, "
                 f"mean return {summary['mean_return']:.1f}")
    return summary


def collection_part(ctx: BenchContext, workdir: Path, episodes: dict[str, int]) -> tuple[list[Row], dict[str, Path],
                                                                                        dict[str, Any]]:
    """1 worker and all cores per env; returns rows, the all-cores sets (reused by the other parts) and summaries."""
    cores = os.cpu_count() or 1
    rows: list[Row] = []
    sets: dict[str, Path] = {}
    summaries: dict[str, Any] = {}
    for env_id, count in episodes.items():
        one = _collect(ctx, env_id, count, "1", workdir / f"{env_id}-1")
        every = _collect(ctx, env_id, count, str(cores), workdir / f"{env_id}-all")
        sets[env_id] = workdir / f"{env_id}-all"
        summaries[env_id] = {"1": one, "all": every}
        for metric, key in (("episodes/s", "episodes_per_s"), ("transitions/s", "transitions_per_s")):
            rows.append(Row(case=f"collect {env_id} ({count} expert episodes)", metric=metric, unit=metric,
                            flywheel=every[key], peer=one[key], peer_name="1 worker",
                            goal=f"{cores} workers faster than 1", met=every[key] > one[key],
                            flywheel_runs=[every[key]], peer_runs=[one[key]]))
    return rows, sets, summaries


def demo_sets(demos: Path, pretrain_updates: int, loss: str, ratio: float, margin_weight: float) -> list[str]:
    """The ``flywheel run --set`` items that turn demonstrations on: pretraining, the replay table, the margin loss."""
    sets = [f"replay.demo_path={demos}", f"replay.demo_ratio={ratio}", f"learner.demo_loss_weight={margin_weight}"]
    if pretrain_updates > 0:
        sets += [f"learner.demos_path={demos}", f"learner.pretrain_updates={pretrain_updates}",
                 f"learner.pretrain_loss={loss}"]
    return sets


def cartpole_part(ctx: BenchContext, workdir: Path, demos: Path, seeds: int, cap_s: float,
                  with_sets: list[str]) -> list[dict[str, Any]]:
    opts = {"target": 475.0, "eval_episodes": 10, "eval_interval_s": 2.0, "actors": ctx.option_int("actors", 2),
            "sets": []}
    results: list[dict[str, Any]] = []
    for k in range(seeds):
        seed = ctx.seed + k
        sides = [("without", []), ("with", with_sets)]
        for label, extra in sides if k % 2 == 0 else sides[::-1]:
            ctx.progress(f"CartPole seed {seed}: {label} demonstrations")
            results.append(flywheel_time_to_target(ctx, CARTPOLE, seed, cap_s, opts, workdir, label=label,
                                                   sets=[f"learner.seed={seed}", *extra]))
    return results


def _mario_run(ctx: BenchContext, workdir: Path, label: str, minutes: float, sets: list[str],
               eval_episodes: int) -> dict[str, Any]:
    run = FlywheelRun(MARIO, workdir / f"mario-{label}", actors=ctx.option_int("actors", 2), sets=sets,
                      progress_interval=30.0)
    spec = env_spec(MARIO)
    watcher = WeightsWatcher(run.weights_endpoint, spec.obs_shape, spec.n_actions)
    out: dict[str, Any] = {"side": label, "rolling": None, "steps": 0.0, "updates": 0.0}
    try:
        with run:
            end = run.started + 60 * minutes
            next_poll = time.monotonic()
            while time.monotonic() < end:
                run.check_alive()
                watcher.poll(int(1000 * max(0.0, min(next_poll, end) - time.monotonic())))
                if time.monotonic() >= next_poll:
                    next_poll = time.monotonic() + 15.0
                    snap = run.snapshot()
                    if snap is None:
                        continue
                    rolling = [g["episode_progress_mean"] for g in snap.gauges.get("actor", [])
                               if g.get("episode_progress_mean") is not None]
                    out.update(steps=snap.total("actor", "env_steps_total"),
                               updates=snap.total("learner", "updates_total"),
                               rolling=float(np.mean(rolling)) if rolling else None)
                    ctx.progress(f"Mario {label}: {(snap.t - run.started) / 60:4.1f} min, {out['steps']:,.0f} steps, "
                                 f"{out['updates']:,.0f} updates, weights v{watcher.version}, rolling distance "
                                 f"{'-' if out['rolling'] is None else format(out['rolling'], '.0f')}")
        if watcher.net is None:
            raise BenchError(f"Mario {label}: no weights arrived in {minutes:g} min; log {run.log}")
        out["version"] = watcher.version
        out["distances"] = evaluate_network(ctx, label, watcher.net, eval_episodes)
    finally:
        watcher.close()
    return out


def evaluate_network(ctx: BenchContext, label: str, net: QNetwork, episodes: int) -> list[float]:
    """The furthest x_pos of each of ``episodes`` Mario episodes (seeds EVAL_SEED on) played by ``net`` at epsilon
    EVAL_EPSILON, with flywheel.evaluation in this process (no stall rule: an episode ends as the game ends it)."""
    from flywheel.evaluation import evaluate
    from flywheel.policy import Policy

    def report(record: dict[str, Any]) -> None:
        ctx.progress(f"Mario {label}: evaluation seed {record['seed']}: distance {furthest_x(record):.0f}")

    records = evaluate(MARIO, range(EVAL_SEED, EVAL_SEED + episodes), checkpoint=Policy(net, MARIO),
                       epsilon=EVAL_EPSILON, stall_steps=0, noop_max=0, progress=report)
    return [furthest_x(r) for r in records]


def run(ctx: BenchContext) -> SuiteResult:
    parts = {p.strip() for p in ctx.option("parts", "collect,cartpole,mario").split(",") if p.strip()}
    if not parts <= {"collect", "cartpole", "mario"}:
        raise BenchError(f"--opt parts: expected collect, cartpole and/or mario, got {sorted(parts)}")
    quick = ctx.quick
    episodes = {CARTPOLE: ctx.option_int("cartpole_episodes", 6 if quick else 200),
                MARIO: ctx.option_int("mario_episodes", 2 if quick else 16)}
    seeds = ctx.option_int("seeds", 1 if quick else ctx.runs)
    cap_s = ctx.option_float("cap_s", 90.0 if quick else 240.0)
    loss = ctx.option("pretrain_loss", "dqfd")
    ratio = ctx.option_float("demo_ratio", 0.25)
    margin_weight = ctx.option_float("margin_weight", 1.0)
    minutes = ctx.option_float("mario_minutes", 1.5 if quick else 6.0)
    mario_eval = ctx.option_int("mario_eval_episodes", 1 if quick else 3)
    result = SuiteResult(suite="demos", title="Demonstrations: collection speed and learning with vs without demos")
    result.method = f"collection once per setting; CartPole median of {seeds} seed(s) per side; Mario one run per side"
    with tempfile.TemporaryDirectory(prefix="flywheel-bench-demos-") as tmp:
        workdir = Path(tmp)
        if "collect" in parts:
            rows, sets, summaries = collection_part(ctx, workdir, episodes)
            result.rows += rows
            result.extra["collection"] = summaries
        else:  # the other parts still need the sets: collect with all cores, untimed
            sets = {env: _collect(ctx, env, n, str(os.cpu_count() or 1), workdir / f"{env}-all")["path"]
                    for env, n in episodes.items() if (env == CARTPOLE and "cartpole" in parts)
                    or (env == MARIO and "mario" in parts)}
        if "cartpole" in parts:
            with_sets = demo_sets(Path(sets[CARTPOLE]), ctx.option_int("pretrain_updates", 1000), loss, ratio,
                                  margin_weight)
            runs = cartpole_part(ctx, workdir, Path(sets[CARTPOLE]), seeds, cap_s, with_sets)
            _cartpole_rows(result, runs, cap_s, with_sets)
            result.plots.append(_plot(ctx, runs))
        if "mario" in parts:
            with_sets = demo_sets(Path(sets[MARIO]), ctx.option_int("mario_pretrain_updates", 100 if quick else 500),
                                  loss, ratio, margin_weight)
            sides = [_mario_run(ctx, workdir, label, minutes, extra, mario_eval)
                     for label, extra in (("without", []), ("with", with_sets))]
            _mario_rows(result, sides, minutes, with_sets, result.extra.get("collection", {}).get(MARIO))
    result.notes.append("Machine shared with other engineers' jobs (2 cores, no GPU): absolute figures are depressed "
                        "and noisy; the two sides of each row ran one after the other in the same session.")
    return result


def _seconds(r: dict[str, Any], cap_s: float) -> float:
    return float(r["reached"]["s"]) if r["reached"] else cap_s


def _cartpole_rows(result: SuiteResult, runs: list[dict[str, Any]], cap_s: float, with_sets: list[str]) -> None:
    by = {side: [r for r in runs if r["side"] == side] for side in ("with", "without")}
    secs = {side: [_seconds(r, cap_s) for r in rs] for side, rs in by.items()}
    censored = {side: sum(r["reached"] is None for r in rs) for side, rs in by.items()}
    n = len(by["with"])
    result.rows.append(Row(case=f"{CARTPOLE}, {n} seed(s)", metric="time to greedy 475", unit="s",
                           flywheel=median(secs["with"]), peer=median(secs["without"]), peer_name="without demos",
                           higher_is_better=False, goal="with demos faster",
                           met=median(secs["with"]) < median(secs["without"]) and censored["with"] * 2 < n,
                           flywheel_runs=secs["with"], peer_runs=secs["without"]))
    weights = {side: [r["first_weights_s"] for r in rs if r.get("first_weights_s") is not None]
               for side, rs in by.items()}
    if weights["with"] and weights["without"]:
        result.rows.append(Row(case=f"{CARTPOLE}, start-up", metric="process start to first weights", unit="s",
                               flywheel=median(weights["with"]), peer=median(weights["without"]),
                               peer_name="without demos", higher_is_better=False, flywheel_runs=weights["with"],
                               peer_runs=weights["without"]))
    result.notes += [
        "CartPole criterion (the sb3 suite's code): mean return of 10 greedy episodes on fresh, seeded envs >= 475, "
        "evaluated every 2 s from the published weights; time from process start, pretraining included.",
        f"With demos: `flywheel run --env {CARTPOLE} --set {' --set '.join(with_sets)}` (the set path is the expert "
        "set collected in part (a)). Without: the same run with none of these.",
        f"Censored at the {cap_s:g} s cap: with {censored['with']}, without {censored['without']}. Per seed (s): with "
        f"{', '.join(f'{v:.1f}' for v in secs['with'])}; without {', '.join(f'{v:.1f}' for v in secs['without'])}.",
    ]
    result.extra["cartpole"] = runs


def _mario_rows(result: SuiteResult, sides: list[dict[str, Any]], minutes: float, with_sets: list[str],
                collection: dict[str, Any] | None) -> None:
    side = {s["side"]: s for s in sides}
    mean = {k: float(np.mean(v["distances"])) for k, v in side.items()}
    result.rows.append(Row(case=f"Mario 1-1 after {minutes:g} min", metric="mean distance (eps 0.05)", unit="x_pos",
                           flywheel=mean["with"], peer=mean["without"], peer_name="without demos",
                           goal="with demos farther", met=mean["with"] > mean["without"],
                           flywheel_runs=side["with"]["distances"], peer_runs=side["without"]["distances"]))
    if side["with"]["rolling"] is not None and side["without"]["rolling"] is not None:
        result.rows.append(Row(case=f"Mario 1-1 after {minutes:g} min", metric="actors' rolling mean distance",
                               unit="x_pos", flywheel=side["with"]["rolling"], peer=side["without"]["rolling"],
                               peer_name="without demos"))
    expert = (collection["all"].get("mean_progress", collection["all"].get("mean_distance"))  # older: the latter
              if collection else None)
    result.notes += [
        f"Mario: one `flywheel run --env {MARIO} --actors 2` per side for {minutes:g} min of wall clock (pixel "
        f"preset); with demos adds --set {' --set '.join(with_sets)}. Then the newest weights (with v"
        f"{side['with'].get('version')}, without v{side['without'].get('version')}) played "
        f"{len(side['with']['distances'])} episode(s) each at epsilon {EVAL_EPSILON:g} (flywheel.evaluation: the "
        f"furthest x_pos of each episode, seeds from {EVAL_SEED:,}).",
        f"At the end: with {side['with']['steps']:,.0f} env steps / {side['with']['updates']:,.0f} updates, without "
        f"{side['without']['steps']:,.0f} / {side['without']['updates']:,.0f}."
        + (f" The scripted expert's own mean distance: {expert:.0f}." if expert else ""),
    ]
    result.extra["mario"] = sides


def _plot(ctx: BenchContext, runs: list[dict[str, Any]]) -> str:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    colours = {"with": "tab:green", "without": "tab:grey"}
    seen: set[str] = set()
    for r in runs:
        if not r["curve"]:
            continue
        t, _, mean = zip(*r["curve"], strict=True)
        ax.plot(t, mean, color=colours[r["side"]], alpha=0.85,
                label=None if r["side"] in seen else f"{r['side']} demonstrations")
        seen.add(r["side"])
    ax.axhline(475, color="black", linestyle="--", linewidth=1, label="target 475")
    ax.set_xlabel("wall clock since process start (s)")
    ax.set_ylabel("mean greedy return (10 episodes)")
    ax.set_title("CartPole-v1 with and without demonstrations (one line per seed)")
    ax.legend(loc="lower right")
    ax.set_ylim(0, 520 if runs else math.nan)
    return save_figure(fig, ctx.plot_path("cartpole"))
