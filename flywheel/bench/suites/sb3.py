"""Stable-Baselines3 DQN with rl-baselines3-zoo's hyperparameters against ``flywheel run``: time and CPU to a target.

Tasks: CartPole-v1 (Flywheel's vector preset was tuned on it, on seeds 0-2) and Acrobot-v1 (tuned by nobody on
Flywheel's side; the zoo's tuned DQN on SB3's). Report on seeds the tuning never saw: ``--seed 1000``.

Both sides are judged by one criterion, evaluated by the same function (``_harness.greedy_returns``): the mean
return of ``eval_episodes`` greedy episodes on fresh, identically seeded CartPole-v1 environments reaches
``target``. Evaluations happen every ``eval_interval_s`` seconds of wall clock. Time counts from the moment the
process is started (interpreter, imports and, for Flywheel, every service's start-up included) until the start of
the evaluation that passes. SB3's evaluations run inside its training loop, so its clock is paused while it
evaluates; Flywheel's evaluator is this bench process, running beside the system and taking CPU from it. A seed
that does not reach the target within ``cap_s`` counts as censored at the cap.
"""

from __future__ import annotations

import functools
import json
import math
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from flywheel.bench.parts.plots import pyplot, save_figure
from flywheel.bench.parts.time_to_target import EVAL_SEED, flywheel_time_to_target
from flywheel.bench.runner import BenchContext, BenchError, Row, SuiteResult, median, median_ci
from flywheel.testing.run import clean_env, greedy_returns

DESCRIPTION = "time and CPU-seconds to a greedy target: Stable-Baselines3 DQN (zoo hyperparameters) vs flywheel run"
OPTIONS = {
    "env": "CartPole-v1 (default) or Acrobot-v1",
    "seeds": "seeds per side, from --seed on (default: --runs; report with --seed 1000: the preset was tuned on 0-2)",
    "cap_s": "give up on a seed after this many seconds (censored) (default 300; --quick 90)",
    "target": "mean greedy return that ends a run (default: the env's reward threshold, 475 or -100)",
    "eval_episodes": "greedy episodes per evaluation (default 10)",
    "eval_interval_s": "seconds of wall clock between evaluations (default 2)",
    "actors": "flywheel actors (default 2, one per core here)",
    "sb3_threads": "torch threads of the SB3 process, comma separated for one SB3 side each (default 1,2)",
    "set": "extra flywheel run --set items, comma separated (e.g. learner.lr=0.001)",
    "sides": "which sides to run: both (default), flywheel or sb3 (for tuning one side; no ratio then)",
}
# rl-baselines3-zoo hyperparams/dqn.yml (commit ce95481), each with its n_timesteps and the env's reward threshold.
ZOO: dict[str, dict[str, Any]] = {
    "CartPole-v1": {"timesteps": 50_000, "target": 475.0,
                    "tuned_on": "Flywheel's vector preset was tuned on CartPole-v1 seeds 0-2 (the sweep in "
                                "docs/benchmarks/sb3.md)",
                    "hyperparameters": {
                        "policy": "MlpPolicy", "learning_rate": 2.3e-3, "batch_size": 64, "buffer_size": 100_000,
                        "learning_starts": 1000, "gamma": 0.99, "target_update_interval": 10, "train_freq": 256,
                        "gradient_steps": 128, "exploration_fraction": 0.16, "exploration_final_eps": 0.04,
                        "policy_kwargs": {"net_arch": [256, 256]}}},
    "Acrobot-v1": {"timesteps": 100_000, "target": -100.0,
                   "tuned_on": "nobody tuned Flywheel for Acrobot-v1: it runs the vector preset tuned on CartPole-v1",
                   "hyperparameters": {
                       "policy": "MlpPolicy", "learning_rate": 6.3e-4, "batch_size": 128, "buffer_size": 50_000,
                       "learning_starts": 0, "gamma": 0.99, "target_update_interval": 250, "train_freq": 4,
                       "gradient_steps": -1, "exploration_fraction": 0.12, "exploration_final_eps": 0.1,
                       "policy_kwargs": {"net_arch": [256, 256]}}},
}


def _sb3_worker(config: dict[str, Any]) -> None:
    """Runs in its own process: train SB3 DQN, evaluate greedily on a wall-clock schedule, print JSON lines."""
    import torch

    torch.set_num_threads(int(config["threads"]))
    import gymnasium
    from stable_baselines3 import DQN
    from stable_baselines3.common.callbacks import BaseCallback

    deadline, interval = float(config["deadline"]), float(config["eval_interval_s"])
    env_id, zoo = str(config["env"]), ZOO[str(config["env"])]

    def emit(**values: Any) -> None:
        print(json.dumps(values), flush=True)

    class GreedyEvalCallback(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.paused = 0.0
            self.cpu_paused = 0.0  # CPU seconds spent evaluating, left out of the CPU to target as the time is
            self.evals = 0
            self.next_eval = time.monotonic() + interval
            self.first_step: float | None = None

        def _on_step(self) -> bool:
            now = time.monotonic()
            if self.first_step is None:
                self.first_step = now
                emit(event="first_step", t=now)
            if now < self.next_eval:
                return True
            cpu = time.process_time()
            returns = greedy_returns(q_values, env_id, int(config["eval_episodes"]),
                                     EVAL_SEED + 100 * self.evals)
            self.evals += 1
            done = time.monotonic()
            emit(event="eval", t=now - self.paused, steps=self.num_timesteps, mean=float(returns.mean()),
                 eval_s=done - now)
            self.paused += done - now
            self.next_eval = done + interval
            cpu_to_here = cpu - self.cpu_paused
            self.cpu_paused += time.process_time() - cpu
            if returns.mean() >= float(config["target"]):
                emit(event="reached", t=now - self.paused + (done - now), steps=self.num_timesteps,
                     cpu_s=cpu_to_here)
                return False
            return done - self.paused < deadline

    model = DQN(env=gymnasium.make(env_id), seed=int(config["seed"]), device="cpu", verbose=0,
                **zoo["hyperparameters"])

    def q_values(obs: np.ndarray) -> np.ndarray:
        """The model's Q-values now (its evaluations, and the final model's play)."""
        with torch.no_grad():
            return model.q_net(torch.as_tensor(obs)).numpy()

    callback = GreedyEvalCallback()
    model.learn(total_timesteps=zoo["timesteps"], callback=callback)
    if model.num_timesteps >= zoo["timesteps"] and time.monotonic() - callback.paused < deadline:
        final = float(zoo["hyperparameters"]["exploration_final_eps"])
        model.exploration_schedule = lambda _progress: final  # go on past the zoo's budget at the final epsilon
        model.learn(total_timesteps=10**9, callback=callback, reset_num_timesteps=False)
    emit(event="end", steps=model.num_timesteps, t=time.monotonic())
    if int(config.get("play_episodes", 0)) > 0:  # the final model on fresh seeds, after the clock stopped
        returns = greedy_returns(q_values, env_id, int(config["play_episodes"]), int(config["play_seed"]))
        emit(event="play", returns=[float(r) for r in returns])


def _run_sb3(ctx: BenchContext, seed: int, cap_s: float, opts: dict[str, Any], workdir: Path,
             threads: int) -> dict[str, Any]:
    started = time.monotonic()
    config = {**opts, "seed": seed, "deadline": started + cap_s, "threads": threads}
    side = _sb3_side(threads)
    log = workdir / f"{side}-seed{seed}.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "flywheel.bench.suites.sb3", "--worker", json.dumps(config)],
                                env=clean_env(), stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL)
    curve: list[tuple[float, float, float]] = []
    out: dict[str, Any] = {"side": side, "seed": seed, "reached": None, "first_step_s": None}
    assert proc.stdout is not None
    for line in proc.stdout:
        event = json.loads(line)
        if event["event"] == "first_step":
            out["first_step_s"] = event["t"] - started
        elif event["event"] == "eval":
            curve.append((event["t"] - started, float(event["steps"]), float(event["mean"])))
            ctx.progress(f"{side} seed {seed}: {curve[-1][0]:6.1f} s, {event['steps']:,} steps, greedy "
                         f"{event['mean']:.1f}")
        elif event["event"] == "reached":
            out["reached"] = {"s": curve[-1][0], "steps": event["steps"], "cpu_s": event["cpu_s"]}
    if proc.wait() != 0:
        raise BenchError(f"the SB3 worker failed (code {proc.returncode}); log {log}")
    out["curve"] = curve
    return out


def _sb3_side(threads: int) -> str:
    return f"sb3-{threads}t"


def _run_flywheel(ctx: BenchContext, seed: int, cap_s: float, opts: dict[str, Any], workdir: Path) -> dict[str, Any]:
    return flywheel_time_to_target(ctx, str(opts["env"]), seed, cap_s, opts, workdir)


def _seconds(result: dict[str, Any], cap_s: float) -> float:
    return float(result["reached"]["s"]) if result["reached"] else cap_s


def _threads(raw: str) -> list[int]:
    try:
        threads = [int(t) for t in raw.split(",") if t.strip()]
    except ValueError:
        raise BenchError(f"--opt sb3_threads={raw!r}: expected thread counts separated by commas") from None
    if not threads or any(t < 1 for t in threads):
        raise BenchError(f"--opt sb3_threads={raw!r}: each thread count must be >= 1")
    return threads


def run(ctx: BenchContext) -> SuiteResult:
    env_id = ctx.option("env", "CartPole-v1")
    if env_id not in ZOO:
        raise BenchError(f"--opt env={env_id!r}: expected one of {', '.join(ZOO)}")
    seeds = ctx.option_int("seeds", 1 if ctx.quick else ctx.runs)
    cap_s = ctx.option_float("cap_s", 90.0 if ctx.quick else 300.0)
    extra_sets = [s for s in ctx.option("set", "").split(",") if s]
    which = ctx.option("sides", "both")
    if which not in ("both", "flywheel", "sb3"):
        raise BenchError(f"--opt sides={which!r}: expected both, flywheel or sb3")
    threads = _threads(ctx.option("sb3_threads", "1,2"))
    opts = {"env": env_id, "target": ctx.option_float("target", ZOO[env_id]["target"]),
            "eval_episodes": ctx.option_int("eval_episodes", 10),
            "eval_interval_s": ctx.option_float("eval_interval_s", 2.0), "actors": ctx.option_int("actors", 2),
            "sb3_threads": threads, "sets": extra_sets}
    if which != "flywheel":
        try:
            import stable_baselines3  # noqa: F401
        except ImportError:
            raise BenchError("the peer needs stable-baselines3: pip install 'flywheel-rl[bench]'") from None
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="flywheel-bench-sb3-") as tmp:
        workdir = Path(tmp)
        for k in range(seeds):
            seed = ctx.seed + k
            sides: list[tuple[str, Callable[[], dict[str, Any]]]] = []
            if which in ("both", "flywheel"):
                sides.append(("flywheel", functools.partial(_run_flywheel, ctx, seed, cap_s, opts, workdir)))
            if which in ("both", "sb3"):
                sides += [(_sb3_side(t), functools.partial(_run_sb3, ctx, seed, cap_s, opts, workdir, t))
                          for t in threads]
            shift = k % len(sides)  # rotate which side goes first, so no side always runs on a warmer machine
            for name, side in sides[shift:] + sides[:shift]:
                ctx.progress(f"seed {seed}: {name}")
                results.append(side())
    result = summarize(results, cap_s, opts, first_seed=ctx.seed)
    result.plots.append(_plot(ctx, results, opts))
    return result


def _stat_note(label: str, values: list[float]) -> str:
    if len(values) < 2:
        return f"{label}: {', '.join(f'{v:.1f}' for v in values) or 'none'}"
    low, high = median_ci(values)
    return f"{label}: median {median(values):.1f}, 95% CI {low:.1f}-{high:.1f} (n={len(values)})"


def summarize(results: list[dict[str, Any]], cap_s: float, opts: dict[str, Any], *,
              first_seed: int = 0) -> SuiteResult:
    """Rows and notes from per-seed results (``side``, ``reached``, ``first_step_s``, ``curve``); no plotting."""
    env_id, target = str(opts["env"]), float(opts["target"])
    by_side: dict[str, list[dict[str, Any]]] = {}
    for r in results:
        by_side.setdefault(r["side"], []).append(r)
    fw = by_side.get("flywheel", [])
    fw_s = [_seconds(r, cap_s) for r in fw]
    n = max((len(v) for v in by_side.values()), default=0)
    result = SuiteResult(suite="sb3", title=f"{env_id}: time and CPU to a greedy {target:g}, Flywheel vs "
                                            f"Stable-Baselines3")
    result.method = (f"median of {n} seeds per side ({first_seed}-{first_seed + n - 1}), sides rotating first, "
                     "95% bootstrap CIs of the medians in the notes")
    peers = [side for side in by_side if side != "flywheel"]
    peer_sides: list[str | None] = [*peers] if peers else [None]
    for side in peer_sides:
        sb = by_side.get(side, []) if side else []
        sb_s = [_seconds(r, cap_s) for r in sb]
        peer_name = f"SB3 DQN (zoo), {side.removeprefix('sb3-').removesuffix('t')} thread(s)" if side else ""
        fw_med = median(fw_s) if fw_s else math.nan
        sb_med = median(sb_s) if sb_s else None
        censored_fw = sum(r["reached"] is None for r in fw)
        met = None if sb_med is None or not fw else fw_med <= 0.5 * sb_med and censored_fw * 2 < len(fw)
        result.rows.append(Row(case=f"{env_id}, {n} seeds", metric=f"time to greedy {target:g}", unit="s",
                               flywheel=fw_med, peer=sb_med, peer_name=peer_name, higher_is_better=False,
                               goal="Flywheel <= 0.5x SB3 time" if env_id == "CartPole-v1" else "",
                               flywheel_runs=fw_s, peer_runs=sb_s, met=met if env_id == "CartPole-v1" else None))
        fw_cpu = [float(r["reached"]["cpu_s"]) for r in fw if r["reached"] and r["reached"].get("cpu_s") is not None]
        sb_cpu = [float(r["reached"]["cpu_s"]) for r in sb if r["reached"] and r["reached"].get("cpu_s") is not None]
        if fw_cpu or sb_cpu:
            result.rows.append(Row(case=f"{env_id}, seeds that reached it", metric="CPU-seconds to greedy target",
                                   unit="CPU-s", flywheel=median(fw_cpu) if fw_cpu else math.nan,
                                   peer=median(sb_cpu) if sb_cpu else None, peer_name=peer_name,
                                   higher_is_better=False, flywheel_runs=fw_cpu, peer_runs=sb_cpu))

    def steps(rs: list[dict[str, Any]]) -> list[float]:
        return [float(r["reached"]["steps"]) for r in rs if r["reached"]]

    peer_steps = [v for side in peers for v in steps(by_side[side])]
    if steps(fw) or peer_steps:
        result.rows.append(Row(case=f"{env_id}, seeds that reached it", metric="env steps to greedy target",
                               unit="steps", flywheel=median(steps(fw)) if steps(fw) else math.nan,
                               peer=median(peer_steps) if peer_steps else None,
                               peer_name="SB3 DQN (zoo), all threads", higher_is_better=False,
                               flywheel_runs=steps(fw), peer_runs=peer_steps))
    starts_fw = [r["first_step_s"] for r in fw if r["first_step_s"] is not None]
    starts_sb = [r["first_step_s"] for side in peers for r in by_side[side] if r["first_step_s"] is not None]
    if starts_fw or starts_sb:
        result.rows.append(Row(case=f"{env_id}, start-up", metric="process start to first env step", unit="s",
                               flywheel=median(starts_fw) if starts_fw else math.nan,
                               peer=median(starts_sb) if starts_sb else None, peer_name="SB3 DQN (zoo), all threads",
                               higher_is_better=False, flywheel_runs=starts_fw, peer_runs=starts_sb))
    zoo = ZOO[env_id]
    result.notes += [
        f"Seeds: reported on {first_seed}-{first_seed + n - 1}; tuning: {zoo['tuned_on']}.",
        f"Criterion (both sides, same code and seeds): the mean return of {opts['eval_episodes']} greedy episodes on "
        f"fresh {env_id} envs reaches {target:g}; evaluated every {opts['eval_interval_s']:g} s of wall clock.",
        "Time counts from starting the process (interpreter, imports, Flywheel's five services) to the start of the "
        "evaluation that passed. SB3's clock stops while it evaluates; Flywheel's evaluator runs beside it, on its "
        "CPU. CPU-seconds (user + system) count to the same moment: every Flywheel process (launcher and services) "
        "against the SB3 process, evaluation left out on both sides.",
        f"SB3: DQN with rl-baselines3-zoo's {env_id} hyperparameters ({zoo['timesteps']:,} steps; past them epsilon "
        f"stays at {zoo['hyperparameters']['exploration_final_eps']:g}), torch threads "
        f"{', '.join(str(t) for t in opts['sb3_threads'])}. Flywheel: `flywheel run --env {env_id} --actors "
        f"{opts['actors']}`" + (f" with --set {' --set '.join(opts['sets'])}" if opts["sets"] else "")
        + " (the vector preset), started with --base-port 0 --http-port 0: every service on Unix sockets.",
        "Censored at the {:g} s cap (counted as the cap, which flatters whichever side it happened to): {}.".format(
            cap_s, ", ".join(f"{side} {sum(r['reached'] is None for r in rs)} of {len(rs)}"
                             for side, rs in by_side.items())),
    ]
    for side, rs in by_side.items():
        secs = [_seconds(r, cap_s) for r in rs]
        result.notes.append(_stat_note(f"{side} seconds", secs) + f"; per seed {', '.join(f'{v:.1f}' for v in secs)}")
        cpus = [float(r["reached"]["cpu_s"]) for r in rs if r["reached"] and r["reached"].get("cpu_s") is not None]
        if cpus:
            result.notes.append(_stat_note(f"{side} CPU-seconds (seeds that reached it)", cpus))
    result.extra = {"runs": results, "cap_s": cap_s, "options": {k: v for k, v in opts.items()},
                    "seeds": [first_seed, first_seed + n - 1], "tuned_on": zoo["tuned_on"]}
    return result


def _plot(ctx: BenchContext, results: list[dict[str, Any]], opts: dict[str, Any]) -> str:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    palette = ["tab:blue", "tab:orange", "tab:green", "tab:red"]
    sides = list(dict.fromkeys(r["side"] for r in results))
    seen: set[str] = set()
    for r in results:
        if not r["curve"]:
            continue
        t, _, mean = zip(*r["curve"], strict=True)
        side = r["side"]
        ax.plot(t, mean, color=palette[sides.index(side) % len(palette)], alpha=0.7,
                label=None if side in seen else side)
        seen.add(side)
    ax.axhline(float(opts["target"]), color="grey", linestyle="--", linewidth=1, label=f"target {opts['target']:g}")
    ax.set_xlabel("wall clock since process start (s)")
    ax.set_ylabel("mean greedy return")
    ax.set_title(f"{opts['env']}: greedy evaluation return vs wall clock (one line per seed)")
    ax.legend(loc="lower right")
    name = "curves" if opts["env"] == "CartPole-v1" else f"curves_{str(opts['env']).split('-')[0].lower()}"
    return save_figure(fig, ctx.plot_path(name))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        _sb3_worker(json.loads(sys.argv[2]))
    else:
        sys.exit("usage: python -m flywheel.bench.suites.sb3 --worker CONFIG_JSON (started by flywheel bench sb3)")
