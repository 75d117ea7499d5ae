"""Throughput of ``flywheel run`` with 1, 2 and 4 actors on this machine, and a model of how it grows with cores.

Each configuration runs the real system (``flywheel run``) and is measured from the gateway's counters over a
window that opens ``warmup_s`` seconds after learning starts. Two modes: ``preset`` keeps the preset's
samples-per-insert ratio (the learner paces the actors: what a user gets), ``free`` turns the ratio off so the
actors run as fast as they can (what the actors alone would deliver). Each process's CPU seconds over the window
give per-unit costs, from which ``_scale.ScaleModel`` predicts env steps/s on more cores and names the limit.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from flywheel.bench.parts.plots import pyplot, save_figure
from flywheel.bench.parts.scale import ScaleModel
from flywheel.bench.runner import BenchContext, BenchError, Row, SuiteResult, median
from flywheel.testing.run import FlywheelRun

DESCRIPTION = "flywheel run with 1, 2, 4 actors (CartPole, Mario): env steps, transitions, updates; core model"
OPTIONS = {
    "actors": "actor counts to run (default 1,2,4)",
    "envs": "comma-separated env ids (default CartPole-v1,SuperMarioBros-1-1-v0)",
    "modes": "preset (the preset's replay ratio) and/or free (no ratio) (default preset,free)",
    "seconds": "measured seconds per configuration (default 45; --quick 10)",
    "warmup_s": "seconds of learning before the window opens (default 15; --quick 5)",
}
MODEL_CORES = (2, 4, 8, 16, 32, 64)
PACE_TIMEOUT_S = 180.0  # preset mode: the window opens once the rate limiter holds the actors back


def _point(run: FlywheelRun, snap: Any) -> dict[str, Any]:
    return {"t": snap.t - run.started, "env_steps": snap.total("actor", "env_steps_total"),
            "updates": snap.total("learner", "updates_total"), "samples": snap.total("learner", "samples_total"),
            "transitions": snap.total("replay", "transitions_received_total"), "cpu": dict(snap.cpu)}


def _measure(ctx: BenchContext, env_id: str, actors: int, mode: str, seconds: float, warmup_s: float,
             min_size: int | None, workdir: Path) -> dict[str, Any]:
    sets = ["replay.samples_per_insert=0", "replay.block_inserts=false"] if mode == "free" else []
    if min_size:
        sets.append(f"replay.min_size_to_sample={min_size}")
    run = FlywheelRun(env_id, workdir, actors=actors, sets=sets, progress_interval=30.0)
    with run:
        run.wait_until_learning(900, f"flywheel run ({env_id}, {actors} actors) to start learning")
        paced = run.wait_until_paced(PACE_TIMEOUT_S) if mode == "preset" else False
        first, last = run.window(warmup_s, seconds)
        a, b = _point(run, first), _point(run, last)
    model = ScaleModel.between(a, b, actors=actors)
    if model is None:
        raise BenchError(f"{env_id} with {actors} actors made no progress in {seconds:g} s; log {run.log}")
    ctx.progress(f"{env_id} {mode} x{actors}: {model.env_steps_per_s:,.0f} env steps/s, "
                 f"{model.transitions_per_s:,.0f} transitions/s, {model.updates_per_s:.1f} updates/s")
    return {"model": model, "env_steps_per_s": model.env_steps_per_s, "transitions_per_s": model.transitions_per_s,
            "updates_per_s": model.updates_per_s, "samples_per_s": model.samples_per_s, "paced": paced}


def run(ctx: BenchContext) -> SuiteResult:
    try:
        counts = [int(a) for a in ctx.option("actors", "1,2,4").split(",") if a]
    except ValueError:
        raise BenchError("--opt actors expects comma-separated integers, e.g. 1,2,4") from None
    envs = [e for e in ctx.option("envs", "CartPole-v1,SuperMarioBros-1-1-v0").split(",") if e]
    modes = [m for m in ctx.option("modes", "preset,free").split(",") if m]
    if not set(modes) <= {"preset", "free"} or not modes:
        raise BenchError("--opt modes expects preset and/or free")
    seconds = ctx.option_float("seconds", 10.0 if ctx.quick else 45.0)
    warmup_s = ctx.option_float("warmup_s", 5.0 if ctx.quick else 15.0)
    result = SuiteResult(suite="scaling", title="Flywheel with 1, 2 and 4 actors, and a model for more cores")
    measured: dict[str, dict[str, dict[int, list[dict[str, Any]]]]] = {}
    with tempfile.TemporaryDirectory(prefix="flywheel-bench-scaling-") as tmp:
        for env_id in envs:
            pixel = env_id.startswith("SuperMario")
            min_size = 1000 if ctx.quick and pixel else None
            measured[env_id] = {m: {a: [] for a in counts} for m in modes}
            for k in range(ctx.warmup + ctx.runs):
                for mode in modes:
                    for actors in counts if k % 2 == 0 else list(reversed(counts)):
                        r = _measure(ctx, env_id, actors, mode, seconds, warmup_s, min_size,
                                     Path(tmp) / f"{env_id}-{mode}-{actors}-{k}")
                        if k >= ctx.warmup:
                            measured[env_id][mode][actors].append(r)
            _rows(result, env_id, measured[env_id], counts)
    result.sections += _model_sections(measured, counts)
    result.notes += [
        f"Each configuration: `flywheel run --env ENV --actors N` on this machine's {_cores()} cores, measured "
        f"for {seconds:g} s starting {warmup_s:g} s after the learner's first update; medians of {ctx.runs} runs "
        f"(after {ctx.warmup} warm-up), actor counts in alternating order.",
        "preset: the preset's samples-per-insert ratio holds, so the learner sets the pace (actors wait at the "
        "replay; its window opens only once the replay's rate limiter has held the actors back, since until then "
        "they run ahead of the ratio into the replay's error buffer and the ZeroMQ queues); free: `--set "
        "replay.samples_per_insert=0 --set replay.block_inserts=false`, actors unpaced.",
        "Ratios are against 1 actor in the same mode and run. More actors than cores share the cores with the "
        "learner, the replay and the gateway.",
    ]
    result.extra["measured"] = {e: {m: {str(a): [{k: v for k, v in r.items() if k != "model"} | {
        "model": r["model"].as_dict()} for r in rs] for a, rs in by.items()} for m, by in ms.items()}
        for e, ms in measured.items()}
    result.plots += _plots(ctx, measured, counts)
    return result


def _cores() -> int:
    import os

    return os.cpu_count() or 1


def _rows(result: SuiteResult, env_id: str, by_mode: dict[str, dict[int, list[dict[str, Any]]]],
          counts: list[int]) -> None:
    short = "Mario 1-1" if env_id.startswith("SuperMario") else env_id
    for mode, by_actors in by_mode.items():
        base = by_actors.get(min(counts), [])
        for actors in counts:
            runs = by_actors[actors]
            for key, metric, unit in (("env_steps_per_s", "env steps/s", "steps/s"),
                                      ("transitions_per_s", "transitions into replay/s", "1/s"),
                                      ("updates_per_s", "learner updates/s", "1/s")):
                values = [r[key] for r in runs]
                peer = [r[key] for r in base] if actors != min(counts) else []
                result.rows.append(Row(case=f"{short}, {mode}, {actors} actor{'s' * (actors > 1)}", metric=metric,
                                       unit=unit, flywheel=median(values), peer=median(peer) if peer else None,
                                       peer_name=f"{min(counts)} actor" if peer else "", flywheel_runs=values,
                                       peer_runs=peer))


def _reference(by_mode: dict[str, dict[int, list[dict[str, Any]]]], counts: list[int]) -> ScaleModel | None:
    """The per-unit costs to extrapolate from: the free mode at one actor per core (or the closest run)."""
    mode = "free" if "free" in by_mode else next(iter(by_mode))
    cores = _cores()
    actors = min(counts, key=lambda a: (abs(a - cores), -a))
    runs = by_mode[mode][actors]
    return runs[len(runs) // 2]["model"] if runs else None


def _preset_here(by_mode: dict[str, dict[int, list[dict[str, Any]]]], counts: list[int]) -> ScaleModel | None:
    runs = by_mode.get("preset", {}).get(min(counts, key=lambda a: (abs(a - _cores()), -a)), [])
    return sorted(runs, key=lambda r: r["env_steps_per_s"])[len(runs) // 2]["model"] if runs else None


def _model_sections(measured: dict[str, dict[str, dict[int, list[dict[str, Any]]]]], counts: list[int]) -> list[str]:
    from flywheel import presets

    lines = ["Core model: predicted env steps/s for one learner process and one replay event loop as cores grow, "
             "from the per-unit CPU costs measured here (free mode, one actor per core); the preset's ratio is "
             "kept, so every env step brings its share of learner and replay work.", "",
             "| env | costs (ms CPU) | measured here, preset, 1 actor per core | model at the CPU it got | "
             + " | ".join(f"{c} cores" for c in MODEL_CORES) + " |",
             "|---|---|---:|---:|" + "---:|" * len(MODEL_CORES)]
    for env_id, by_mode in measured.items():
        model = _reference(by_mode, counts)
        if model is None:
            continue
        spi = float(presets.load("pixel" if env_id.startswith("SuperMario") else "vector").sections["replay"][
            "samples_per_insert"])
        cells = []
        for cores in MODEL_CORES:
            rate, limit = model.env_steps_on(max(0.5, cores - 0.5), spi)  # half a core for the gateway and OS
            cells.append(f"{rate:,.0f}" + (f" ({limit.split(' ')[0]})" if limit != "cores" else ""))
        costs = (f"actor {1e3 * model.actor_cpu_per_step:.3f}/step, learner {1e3 * model.learner_cpu_per_sample:.4f}"
                 f"/sample, replay {1e3 * model.replay_cpu_per_item:.4f}/item; ratio {spi:g}")
        here = _preset_here(by_mode, counts)
        check = "–", "–"
        if here is not None:
            predicted = model.env_steps_on(here.cores_used, spi)[0]
            check = (f"{here.env_steps_per_s:,.0f} ({here.cores_used:.2f} cores busy)", f"{predicted:,.0f}")
        lines.append(f"| {env_id} | {costs} | {check[0]} | {check[1]} | " + " | ".join(cells) + " |")
    lines += ["", "A figure in brackets names the single process that caps it (the learner or the replay); beyond "
              "that point more actors only help with more learners (or a GPU learner) and sharded replays. "
              "\"Model at the CPU it got\" checks the model against the measured run: the cores it was given are "
              "the CPU seconds per second of all its processes (the machine is shared, so fewer than its cores)."]
    return ["\n".join(lines)]


def _plots(ctx: BenchContext, measured: dict[str, dict[str, dict[int, list[dict[str, Any]]]]],
           counts: list[int]) -> list[str]:
    plt = pyplot()
    envs = list(measured)
    fig, axes = plt.subplots(1, len(envs), figsize=(5 * len(envs), 4), squeeze=False)
    styles = {"preset": ("tab:blue", "o"), "free": ("tab:green", "s")}
    for ax, env_id in zip(axes[0], envs, strict=True):
        for mode, by_actors in measured[env_id].items():
            colour, marker = styles[mode]
            xs = [a for a in counts if by_actors[a]]
            ax.plot(xs, [median([r["env_steps_per_s"] for r in by_actors[a]]) for a in xs], marker=marker,
                    color=colour, label=f"{mode}: env steps/s")
            ax.plot(xs, [median([r["samples_per_s"] for r in by_actors[a]]) / 10 for a in xs], marker=marker,
                    color=colour, linestyle=":", label=f"{mode}: learner samples/s / 10")
        ax.set_xticks(counts)
        ax.set_xlabel("actors")
        ax.set_ylabel("per second")
        ax.set_title("Mario 1-1" if env_id.startswith("SuperMario") else env_id)
        ax.legend(fontsize=8)
    measured_png = save_figure(fig, ctx.plot_path("actors"))
    fig, ax = plt.subplots(figsize=(6, 4))
    from flywheel import presets

    for env_id in envs:
        model = _reference(measured[env_id], counts)
        if model is None:
            continue
        spi = float(presets.load("pixel" if env_id.startswith("SuperMario") else "vector").sections["replay"][
            "samples_per_insert"])
        cores = [1, *MODEL_CORES]
        ax.plot(cores, [model.env_steps_on(max(0.5, c - 0.5), spi)[0] for c in cores], marker=".",
                label=f"{'Mario 1-1' if env_id.startswith('SuperMario') else env_id} (model, ratio {spi:g})")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("cores")
    ax.set_ylabel("env steps/s")
    ax.set_title("Predicted throughput with one learner and one replay")
    ax.legend(fontsize=8)
    return [measured_png, save_figure(fig, ctx.plot_path("model"))]
