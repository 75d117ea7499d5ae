"""Stable-Baselines3 DQN with rl-baselines3-zoo's CartPole-v1 hyperparameters against ``flywheel run``.

Both sides are judged by one criterion, evaluated by the same function (``_harness.greedy_returns``): the mean
return of ``eval_episodes`` greedy episodes on fresh, identically seeded CartPole-v1 environments reaches
``target``. Evaluations happen every ``eval_interval_s`` seconds of wall clock. Time counts from the moment the
process is started (interpreter, imports and, for Flywheel, every service's start-up included) until the start of
the evaluation that passes. SB3's evaluations run inside its training loop, so its clock is paused while it
evaluates; Flywheel's evaluator is this bench process, running beside the system and taking CPU from it. A seed
that does not reach the target within ``cap_s`` counts as censored at the cap.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from flywheel.bench.runner import BenchContext, BenchError, Row, SuiteResult, median
from flywheel.bench.suites._plots import pyplot, save_figure
from flywheel.bench.suites._time_to_target import EVAL_SEED, flywheel_time_to_target
from flywheel.testing.run import clean_env, greedy_returns

DESCRIPTION = "CartPole-v1 time to a greedy 475: Stable-Baselines3 DQN (zoo hyperparameters) vs flywheel run"
OPTIONS = {
    "seeds": "seeds per side (default: --runs)",
    "cap_s": "give up on a seed after this many seconds (censored) (default 300; --quick 90)",
    "target": "mean greedy return that ends a run (default 475, CartPole-v1's reward threshold)",
    "eval_episodes": "greedy episodes per evaluation (default 10)",
    "eval_interval_s": "seconds of wall clock between evaluations (default 2)",
    "actors": "flywheel actors (default 2, one per core here)",
    "sb3_threads": "torch threads of the SB3 process (default 1: faster than 2 on a shared 2-core machine)",
    "set": "extra flywheel run --set items, comma separated (e.g. learner.lr=0.001)",
    "sides": "which sides to run: both (default), flywheel or sb3 (for tuning one side; no ratio then)",
}
ENV_ID = "CartPole-v1"
# rl-baselines3-zoo hyperparams/dqn.yml, CartPole-v1 (commit ce95481): n_timesteps 5e4 and these.
ZOO_CARTPOLE: dict[str, Any] = {
    "policy": "MlpPolicy", "learning_rate": 2.3e-3, "batch_size": 64, "buffer_size": 100_000,
    "learning_starts": 1000, "gamma": 0.99, "target_update_interval": 10, "train_freq": 256, "gradient_steps": 128,
    "exploration_fraction": 0.16, "exploration_final_eps": 0.04, "policy_kwargs": {"net_arch": [256, 256]},
}
ZOO_TIMESTEPS = 50_000


def _sb3_worker(config: dict[str, Any]) -> None:
    """Runs in its own process: train SB3 DQN, evaluate greedily on a wall-clock schedule, print JSON lines."""
    import torch

    torch.set_num_threads(int(config["threads"]))
    import gymnasium
    from stable_baselines3 import DQN
    from stable_baselines3.common.callbacks import BaseCallback

    deadline, interval = float(config["deadline"]), float(config["eval_interval_s"])

    def emit(**values: Any) -> None:
        print(json.dumps(values), flush=True)

    class GreedyEvalCallback(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.paused = 0.0
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
            q_net = self.model.q_net

            def q_values(obs: np.ndarray) -> np.ndarray:
                with torch.no_grad():
                    return q_net(torch.as_tensor(obs)).numpy()

            returns = greedy_returns(q_values, ENV_ID, int(config["eval_episodes"]),
                                     EVAL_SEED + 100 * self.evals)
            self.evals += 1
            done = time.monotonic()
            emit(event="eval", t=now - self.paused, steps=self.num_timesteps, mean=float(returns.mean()),
                 eval_s=done - now)
            self.paused += done - now
            self.next_eval = done + interval
            if returns.mean() >= float(config["target"]):
                emit(event="reached", t=now - self.paused + (done - now), steps=self.num_timesteps)
                return False
            return done - self.paused < deadline

    model = DQN(env=gymnasium.make(ENV_ID), seed=int(config["seed"]), device="cpu", verbose=0,
                **ZOO_CARTPOLE)
    callback = GreedyEvalCallback()
    model.learn(total_timesteps=ZOO_TIMESTEPS, callback=callback)
    if model.num_timesteps >= ZOO_TIMESTEPS and time.monotonic() - callback.paused < deadline:
        final = float(ZOO_CARTPOLE["exploration_final_eps"])
        model.exploration_schedule = lambda _progress: final  # go on past the zoo's budget at the final epsilon
        model.learn(total_timesteps=10**9, callback=callback, reset_num_timesteps=False)
    emit(event="end", steps=model.num_timesteps)


def _run_sb3(ctx: BenchContext, seed: int, cap_s: float, opts: dict[str, Any], workdir: Path) -> dict[str, Any]:
    started = time.monotonic()
    config = {**opts, "seed": seed, "deadline": started + cap_s}
    log = workdir / f"sb3-seed{seed}.log"
    with open(log, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "flywheel.bench.suites.sb3", "--worker", json.dumps(config)],
                                env=clean_env(), stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL)
    curve: list[tuple[float, float, float]] = []
    out: dict[str, Any] = {"side": "sb3", "seed": seed, "reached": None, "first_step_s": None}
    assert proc.stdout is not None
    for line in proc.stdout:
        event = json.loads(line)
        if event["event"] == "first_step":
            out["first_step_s"] = event["t"] - started
        elif event["event"] == "eval":
            curve.append((event["t"] - started, float(event["steps"]), float(event["mean"])))
            ctx.progress(f"sb3 seed {seed}: {curve[-1][0]:6.1f} s, {event['steps']:,} steps, greedy "
                         f"{event['mean']:.1f}")
        elif event["event"] == "reached":
            out["reached"] = {"s": curve[-1][0], "steps": event["steps"]}
    if proc.wait() != 0:
        raise BenchError(f"the SB3 worker failed (code {proc.returncode}); log {log}")
    out["curve"] = curve
    return out


def _run_flywheel(ctx: BenchContext, seed: int, cap_s: float, opts: dict[str, Any], workdir: Path) -> dict[str, Any]:
    return flywheel_time_to_target(ctx, ENV_ID, seed, cap_s, opts, workdir)


def _seconds(result: dict[str, Any], cap_s: float) -> float:
    return float(result["reached"]["s"]) if result["reached"] else cap_s


def run(ctx: BenchContext) -> SuiteResult:
    seeds = ctx.option_int("seeds", 1 if ctx.quick else ctx.runs)
    cap_s = ctx.option_float("cap_s", 90.0 if ctx.quick else 300.0)
    extra_sets = [s for s in ctx.option("set", "").split(",") if s]
    which = ctx.option("sides", "both")
    if which not in ("both", "flywheel", "sb3"):
        raise BenchError(f"--opt sides={which!r}: expected both, flywheel or sb3")
    opts = {"target": ctx.option_float("target", 475.0), "eval_episodes": ctx.option_int("eval_episodes", 10),
            "eval_interval_s": ctx.option_float("eval_interval_s", 2.0), "actors": ctx.option_int("actors", 2),
            "threads": ctx.option_int("sb3_threads", 1), "sets": extra_sets}
    try:
        import stable_baselines3  # noqa: F401
    except ImportError:
        raise BenchError("the peer needs stable-baselines3: pip install 'flywheel-rl[bench]'") from None
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="flywheel-bench-sb3-") as tmp:
        workdir = Path(tmp)
        for k in range(seeds):
            seed = ctx.seed + k
            sides = [_run_sb3, _run_flywheel] if k % 2 == 0 else [_run_flywheel, _run_sb3]  # alternate the order
            sides = [side for side in sides if which in ("both", side.__name__.removeprefix("_run_"))]
            for side in sides:
                ctx.progress(f"seed {seed}: {side.__name__.removeprefix('_run_')}")
                results.append(side(ctx, seed, cap_s, opts, workdir))
    result = summarize(results, cap_s, opts)
    result.plots.append(_plot(ctx, results, opts["target"]))
    return result


def summarize(results: list[dict[str, Any]], cap_s: float, opts: dict[str, Any]) -> SuiteResult:
    """Rows and notes from per-seed results (``side``, ``reached``, ``first_step_s``, ``curve``); no plotting."""
    fw = [r for r in results if r["side"] == "flywheel"]
    sb = [r for r in results if r["side"] == "sb3"]
    fw_s, sb_s = [_seconds(r, cap_s) for r in fw], [_seconds(r, cap_s) for r in sb]
    fw_med = median(fw_s) if fw_s else math.nan
    sb_med = median(sb_s) if sb_s else None
    censored_fw = sum(r["reached"] is None for r in fw)
    censored_sb = sum(r["reached"] is None for r in sb)
    target = opts["target"]
    result = SuiteResult(suite="sb3", title=f"CartPole-v1: time to a greedy {target:g}, Flywheel vs Stable-Baselines3")
    result.method = f"median of {max(len(fw), len(sb))} seeds per side, sides alternating first"
    met = None if sb_med is None or not fw else fw_med <= 0.5 * sb_med and censored_fw * 2 < len(fw)
    result.rows.append(Row(case=f"{ENV_ID}, {max(len(fw), len(sb))} seeds", metric=f"time to greedy {target:g}",
                           unit="s", flywheel=fw_med, peer=sb_med, peer_name="SB3 DQN (zoo)", higher_is_better=False,
                           goal="Flywheel <= 0.5x SB3 time", flywheel_runs=fw_s, peer_runs=sb_s, met=met))

    def steps(rs: list[dict[str, Any]]) -> list[float]:
        return [float(r["reached"]["steps"]) for r in rs if r["reached"]]

    if steps(fw) or steps(sb):
        result.rows.append(Row(case=f"{ENV_ID}, seeds that reached it", metric="env steps to greedy target",
                               unit="steps", flywheel=median(steps(fw)) if steps(fw) else math.nan,
                               peer=median(steps(sb)) if steps(sb) else None,
                               peer_name="SB3 DQN (zoo)", higher_is_better=False,
                               flywheel_runs=steps(fw), peer_runs=steps(sb)))
    starts_fw = [r["first_step_s"] for r in fw if r["first_step_s"] is not None]
    starts_sb = [r["first_step_s"] for r in sb if r["first_step_s"] is not None]
    if starts_fw or starts_sb:
        result.rows.append(Row(case=f"{ENV_ID}, start-up", metric="process start to first env step", unit="s",
                               flywheel=median(starts_fw) if starts_fw else math.nan,
                               peer=median(starts_sb) if starts_sb else None, peer_name="SB3 DQN (zoo)",
                               higher_is_better=False, flywheel_runs=starts_fw, peer_runs=starts_sb))
    result.notes += [
        f"Criterion (both sides, same code and seeds): the mean return of {opts['eval_episodes']} greedy episodes on "
        f"fresh CartPole-v1 envs reaches {target:g}; evaluated every {opts['eval_interval_s']:g} s of wall clock.",
        "Time counts from starting the process (interpreter, imports, Flywheel's five services) to the start of the "
        "evaluation that passed. SB3's clock stops while it evaluates; Flywheel's evaluator runs beside it, on its "
        "CPU.",
        f"SB3: DQN with rl-baselines3-zoo's CartPole-v1 hyperparameters ({ZOO_TIMESTEPS:,} steps; past them epsilon "
        f"stays at 0.04), {opts['threads']} torch thread(s). Flywheel: `flywheel run --env CartPole-v1 --actors "
        f"{opts['actors']}`" + (f" with --set {' --set '.join(opts['sets'])}" if opts["sets"] else "")
        + " (the vector preset).",
        f"Censored at the {cap_s:g} s cap: Flywheel {censored_fw} of {len(fw)}, SB3 {censored_sb} of {len(sb)} "
        "(a censored run counts as the cap, which flatters whichever side it happened to).",
        f"Per seed (s): Flywheel {', '.join(f'{v:.1f}' for v in fw_s)}; SB3 {', '.join(f'{v:.1f}' for v in sb_s)}.",
    ]
    result.extra = {"runs": results, "cap_s": cap_s, "options": {k: v for k, v in opts.items()}}
    return result


def _plot(ctx: BenchContext, results: list[dict[str, Any]], target: float) -> str:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    colours = {"flywheel": "tab:blue", "sb3": "tab:orange"}
    labels = {"flywheel": "Flywheel", "sb3": "SB3 DQN (zoo)"}
    seen: set[str] = set()
    for r in results:
        if not r["curve"]:
            continue
        t, _, mean = zip(*r["curve"], strict=True)
        side = r["side"]
        ax.plot(t, mean, color=colours[side], alpha=0.8, label=None if side in seen else labels[side])
        seen.add(side)
    ax.axhline(target, color="grey", linestyle="--", linewidth=1, label=f"target {target:g}")
    ax.set_xlabel("wall clock since process start (s)")
    ax.set_ylabel("mean greedy return")
    ax.set_title("CartPole-v1: greedy evaluation return vs wall clock (one line per seed)")
    ax.legend(loc="lower right")
    return save_figure(fig, ctx.plot_path("curves"))


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        _sb3_worker(json.loads(sys.argv[2]))
    else:
        sys.exit("usage: python -m flywheel.bench.suites.sb3 --worker CONFIG_JSON (started by flywheel bench sb3)")
