"""The origin reports' comparisons, reproduced: their single-process DQN loop against ``flywheel run``, same machine.

For each environment both sides do the same work per env step: the same network, batch size and replay ratio
(Flywheel's preset: CartPole 8 samples per insert at batch 128, Mario 4 at batch 32; the loop learns every
batch/ratio steps). Each run warms up (fills the replay to the preset's minimum, learning under way), then
measures ``seconds`` of steady state. The figures are the reports' own: experience rate (env steps stored per
second: for Flywheel the transitions the replay took in, since steps an actor has made but a full queue still
holds are not yet experience), training throughput (updates/s, samples/s), time spent waiting, drops and time per
epoch (an epoch here is 4,096 env steps with their training), and each side's CPU cores busy, so a gain from using
the second core shows apart from a gain per CPU second. Runs alternate between the two sides; medians of
``--runs``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from flywheel.bench.parts.plots import pyplot, save_figure
from flywheel.bench.runner import BenchContext, BenchError, Row, SuiteResult, median
from flywheel.testing.run import FlywheelRun, clean_env

DESCRIPTION = "Origins: the reports' single-process act-learn DQN loop vs flywheel run (CartPole, Mario)"
OPTIONS = {
    "envs": "comma-separated env ids (default CartPole-v1,SuperMarioBros-1-1-v0)",
    "seconds": "measured seconds per run after warm-up (default 60; --quick 15)",
    "warmup_s": "seconds of learning before Flywheel's window opens (default 20; --quick 5)",
    "actors": "flywheel actors (default 2)",
    "loop_threads": "torch threads in the loop (default 1, the loop's best here; 0: torch's default, all cores)",
}
EPOCH_STEPS = 4096
PACE_TIMEOUT_S = 180.0
# Report 000 (Mario, optimised vs original): experience rate +80%, training throughput +150%, lock wait -90%,
# epoch time -60%. Report 001 (Snake, one process, 2 cores): 4.7x steps/s. These are the gains to beat.
GOALS = {"experience": 1.8, "training": 2.5, "epoch": 1 / 0.4}


def _preset(env_id: str) -> dict[str, Any]:
    from flywheel import presets
    from flywheel.envs import env_spec

    pixel = env_spec(env_id).obs_dtype == "uint8"
    preset = presets.load("pixel" if pixel else "vector").sections
    batch, spi = int(preset["learner"]["batch_size"]), float(preset["replay"]["samples_per_insert"])
    return {"pixel": pixel, "batch": batch, "spi": spi, "learn_every": max(1, round(batch / spi)),
            "min_size": int(preset["replay"]["min_size_to_sample"]), "lr": float(preset["learner"]["lr"]),
            "hidden": int(preset["learner"].get("hidden", preset["actor"].get("hidden", 256))),
            "target_update_interval": _target_interval(preset["learner"]),
            "capacity": 10_000 if pixel else int(preset["replay"]["capacity"])}  # 000's original buffer for pixels


def _target_interval(learner: dict[str, str]) -> int:
    """The loop copies its target network; Polyak averaging with tau matches a copy about every 1/tau updates."""
    tau = float(learner.get("tau", 0))
    return max(1, round(1 / tau)) if tau > 0 else int(learner.get("target_update_interval", 2500))


def _load() -> float:
    """The machine's 1-minute load average (it is shared: other programs' load shows here)."""
    import os

    return os.getloadavg()[0]


def _loop_run(ctx: BenchContext, env_id: str, seconds: float, seed: int, min_size: int | None,
              threads: int = 1) -> dict[str, Any]:
    p = _preset(env_id)
    config = {"env": env_id, "batch": p["batch"], "learn_every": p["learn_every"], "capacity": p["capacity"],
              "min_size": min_size or p["min_size"], "lr": p["lr"], "hidden": p["hidden"], "seconds": seconds,
              "target_update_interval": p["target_update_interval"], "epoch_steps": EPOCH_STEPS, "seed": seed,
              "threads": threads}
    proc = subprocess.run([sys.executable, "-m", "flywheel.bench.parts.origin_loop", json.dumps(config)],
                          env=clean_env(), capture_output=True, text=True, timeout=seconds + 900)
    if proc.returncode != 0:
        raise BenchError(f"the origin loop failed on {env_id}: {proc.stderr.strip().splitlines()[-1:]}")
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    s = r["seconds"]
    out = {"env_steps_per_s": r["env_steps"] / s, "updates_per_s": r["updates"] / s, "samples_per_s": r["samples"] / s,
           "learner_wait": 1 - r["learn_s"] / s, "acting_wait": r["learn_s"] / s, "lock_wait_ms_per_s":
           1e3 * r["lock_wait_s"] / s, "sync_share": r["sync_s"] / s, "drops": r["drops"],
           "epoch_s": median(r["epoch_times"]) if r["epoch_times"] else EPOCH_STEPS / (r["env_steps"] / s),
           "cores_busy": r["cpu_s"] / s, "env_steps_per_cpu_s": r["env_steps"] / max(r["cpu_s"], 1e-9),
           "threads": r["threads"], "load_average": _load(), "samples_per_insert": r["samples"] / r["env_steps"]}
    ctx.progress(f"origin loop {env_id}: {out['env_steps_per_s']:,.0f} env steps/s, {out['updates_per_s']:.1f} "
                 f"updates/s, env idle while learning {100 * out['acting_wait']:.0f}%, {out['cores_busy']:.2f} cores "
                 f"busy ({r['threads']} torch threads), load {out['load_average']:.1f}")
    return out


def _flywheel_run(ctx: BenchContext, env_id: str, seconds: float, warmup_s: float, actors: int,
                  min_size: int | None, workdir: Path) -> dict[str, Any]:
    sets = [f"replay.min_size_to_sample={min_size}"] if min_size else []
    run = FlywheelRun(env_id, workdir, actors=actors, sets=sets, progress_interval=30.0)
    with run:
        run.wait_until_learning(900, f"flywheel run on {env_id} to start learning")
        paced = run.wait_until_paced(PACE_TIMEOUT_S)
        first, last = run.window(warmup_s, seconds)
    dt = last.t - first.t

    def rate(service: str, name: str) -> float:
        return (last.total(service, name) - first.total(service, name)) / dt

    stored = rate("replay", "transitions_received_total")
    cpu_s = sum(last.cpu.get(k, 0.0) - first.cpu.get(k, 0.0) for k in last.cpu)
    drops = sum(last.total(s, n) - first.total(s, n) for s, n in (
        ("actor", "transitions_dropped_total"), ("replay", "transitions_rejected_total"),
        ("replay", "sample_requests_dropped_total"), ("learner", "priority_updates_dropped_total")))
    out = {"env_steps_per_s": stored, "actor_env_steps_per_s": rate("actor", "env_steps_total"),
           "updates_per_s": rate("learner", "updates_total"),
           "samples_per_s": rate("learner", "samples_total"),
           "learner_wait": rate("learner", "data_wait_seconds_total"),
           "acting_wait": rate("actor", "send_blocked_seconds_total") / actors, "lock_wait_ms_per_s": 0.0,
           "drops": drops, "epoch_s": EPOCH_STEPS / stored if stored > 0 else float("inf"),
           "cores_busy": cpu_s / dt, "env_steps_per_cpu_s": stored * dt / max(cpu_s, 1e-9), "load_average": _load(),
           "samples_per_insert": rate("learner", "samples_total") / stored if stored > 0 else 0.0, "paced": paced}
    ctx.progress(f"flywheel {env_id}: {out['env_steps_per_s']:,.0f} env steps/s stored "
                 f"({out['actor_env_steps_per_s']:,.0f} stepped), {out['updates_per_s']:.1f} updates/s, "
                 f"learner waiting {100 * out['learner_wait']:.0f}%, "
                 f"{out['cores_busy']:.2f} cores busy, load {out['load_average']:.1f}")
    return out


def run(ctx: BenchContext) -> SuiteResult:
    envs = [e for e in ctx.option("envs", "CartPole-v1,SuperMarioBros-1-1-v0").split(",") if e]
    seconds = ctx.option_float("seconds", 15.0 if ctx.quick else 60.0)
    warmup_s = ctx.option_float("warmup_s", 5.0 if ctx.quick else 20.0)
    actors = ctx.option_int("actors", 2)
    loop_threads = ctx.option_int("loop_threads", 1)
    result = SuiteResult(suite="origins", title="The origin reports' single-process DQN loop vs Flywheel")
    measured: dict[str, dict[str, list[dict[str, Any]]]] = {}
    with tempfile.TemporaryDirectory(prefix="flywheel-bench-origins-") as tmp:
        for env_id in envs:
            min_size = 1000 if ctx.quick and _preset(env_id)["pixel"] else None
            sides: dict[str, list[dict[str, Any]]] = {"loop": [], "flywheel": []}
            for k in range(ctx.warmup + ctx.runs):
                order = ["loop", "flywheel"] if k % 2 == 0 else ["flywheel", "loop"]
                for side in order:
                    ctx.progress(f"{env_id} run {k + 1}/{ctx.warmup + ctx.runs}{' (warm-up)' * (k < ctx.warmup)}: "
                                 f"{side}")
                    if side == "loop":
                        r = _loop_run(ctx, env_id, seconds, ctx.seed + k, min_size, loop_threads)
                    else:
                        r = _flywheel_run(ctx, env_id, seconds, warmup_s, actors, min_size, Path(tmp) / f"{env_id}-{k}")
                    if k >= ctx.warmup:
                        sides[side].append(r)
            measured[env_id] = sides
            _rows(result, env_id, sides)
    p = {e: _preset(e) for e in envs}
    result.notes += [
        "The loop (`flywheel/bench/parts/origin_loop.py`): one env, one action at a time; tuples in a deque behind "
        "a lock taken for every add and sample; batches built by list comprehension; learns every batch/ratio env "
        "steps in the same loop, so the env waits while it trains; an acting copy of the network refreshed by "
        "cloning the state dict every 3 epochs, with the weight comparison report 003 found on every sync; plain "
        f"DQN with a target network, uniform sampling, {loop_threads or 'all cores'} torch thread(s): one is the "
        "loop's best on this shared machine (torch's default of two threads ran it about 10x slower under the "
        "other programs' load, so it would flatter Flywheel), and report 000 pinned one thread too.",
        "Flywheel: `flywheel run --env ENV --actors " + str(actors) + "` (its preset: double + dueling n-step DQN, "
        "prioritized replay, rate limiter), measured from the gateway's counters after a warm-up of "
        f"{warmup_s:g} s of learning. Same network, batch and replay ratio as the loop: "
        + "; ".join(f"{e}: batch {v['batch']}, {v['spi']:g} samples per insert (loop learns every {v['learn_every']} "
                    f"steps)" for e, v in p.items()) + ".",
        "Waiting: for the loop, the share of wall time the env sits idle while the network trains, and the lock's "
        "wait; for Flywheel, the share of time the learner waited for data and the actors were held back by the "
        "replay's rate limiter (which is how Flywheel keeps the ratio). Flywheel has no locks. The loop's lock "
        "is never contended (one thread), so its wait is near zero too: the reports' lock waits came from "
        "several collector processes, which a one-process loop does not have.",
        "Experience rate: env steps stored per second. For Flywheel that is what the replay took in; steps an "
        "actor has made while the replay holds inserts back (the ratio) wait in ZeroMQ queues and count only "
        "once stored. Flywheel's window opens only once the rate limiter has held the actors back (until then "
        "they run ahead of the ratio into the replay's error buffer); the sampled-per-stored row shows the ratio "
        "each side kept in the window. CPU cores busy: CPU seconds per second of the loop's process, or of every "
        "Flywheel process (actors, replay, learner, gateway); env steps per CPU second divides the two, so a gain that "
        "only comes from using the second core shows apart from doing the work more cheaply.",
        "Targets from the reports: 000 (Mario) +80% experience rate, +150% training throughput, -60% epoch time; "
        "001 (Snake, 2 cores) 4.7x steps/s.",
    ]
    result.extra["measured"] = measured
    result.plots.append(_plot(ctx, measured))
    return result


def _rows(result: SuiteResult, env_id: str, sides: dict[str, list[dict[str, Any]]]) -> None:
    short = "Mario 1-1" if env_id.startswith("SuperMario") else env_id
    peer = "origin loop (1 process)"

    def add(metric: str, unit: str, key: str, higher: bool, goal: float | None = None, scale: float = 1.0) -> None:
        if any(key not in r for r in sides["flywheel"] + sides["loop"]):
            return
        fw = [scale * r[key] for r in sides["flywheel"]]
        lp = [scale * r[key] for r in sides["loop"]]
        row = Row(case=short, metric=metric, unit=unit, flywheel=median(fw), peer=median(lp), peer_name=peer,
                  higher_is_better=higher, flywheel_runs=fw, peer_runs=lp)
        if goal is not None:
            row.goal = f">= {goal:.2g}x (report 000)"
            row.met = row.ratio is not None and row.ratio >= goal
        result.rows.append(row)

    add("experience rate", "env steps/s", "env_steps_per_s", True, GOALS["experience"])
    add("training throughput", "updates/s", "updates_per_s", True, GOALS["training"])
    add("training throughput", "samples/s", "samples_per_s", True)
    add("time per epoch (4,096 env steps + training)", "s", "epoch_s", False, GOALS["epoch"])
    add("learner waiting for data", "% of time", "learner_wait", False, scale=100)
    add("acting held back (loop: env idle while learning)", "% of time", "acting_wait", False, scale=100)
    add("lock wait", "ms per s", "lock_wait_ms_per_s", False)
    add("drops", "transitions", "drops", False)
    add("sampled transitions per stored one", "ratio", "samples_per_insert", True)
    add("CPU cores busy", "cores", "cores_busy", True)
    add("env steps per CPU second", "steps/CPU s", "env_steps_per_cpu_s", True)


def _plot(ctx: BenchContext, measured: dict[str, dict[str, list[dict[str, Any]]]]) -> str:
    """Flywheel over the loop for the reports' three figures, per env, against the reports' gains."""
    plt = pyplot()
    metrics = (("env_steps_per_s", "experience rate", True), ("updates_per_s", "training throughput", True),
               ("epoch_s", "epoch time (inverse)", False))
    envs = list(measured)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.8 / len(metrics)
    for j, (key, label, higher) in enumerate(metrics):
        ratios = []
        for env_id in envs:
            fw = median([r[key] for r in measured[env_id]["flywheel"]] or [float("nan")])
            lp = median([r[key] for r in measured[env_id]["loop"]] or [float("nan")])
            ratios.append(fw / lp if higher else lp / fw)
        bars = ax.bar([i + j * width for i in range(len(envs))], ratios, width=width * 0.95, label=label)
        ax.bar_label(bars, fmt="%.2fx", fontsize=8)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.axhline(GOALS["experience"], color="tab:blue", linestyle="--", linewidth=1, label="report 000: +80% experience")
    ax.axhline(GOALS["training"], color="tab:orange", linestyle="--", linewidth=1,
               label="report 000: +150% training, -60% epoch time")
    ax.set_xticks([i + width for i in range(len(envs))],
                  ["Mario 1-1" if e.startswith("SuperMario") else e for e in envs])
    ax.set_ylabel("Flywheel / origin loop (higher is better)")
    ax.set_title("Flywheel against the origin reports' single-process loop, same machine")
    ax.legend(fontsize=8)
    return save_figure(fig, ctx.plot_path("ratios"))
