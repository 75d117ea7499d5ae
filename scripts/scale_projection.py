"""The scale model of the default Mario job, projected from committed raw results: which part binds first at 2, 8,
16, 64 and 256 actors, and the minutes to the flag rate the default reaches in its first hour.

Inputs, all from measurements this project committed (paths on the command line, defaults below):
- per-unit CPU costs of the default job (``--runs``: `flywheel bench mario` results of the default recipe; each
  carries the suite's ``scale_model``): an actor's CPU seconds per env step, the learner's per sampled transition
  (batch 32, one torch thread), the replay's per item moved; medians over the runs;
- the learner's batch x threads grid (``--grid``: `flywheel bench learner --opt grid=1`): how samples/s and CPU per
  sample change with torch threads at batch 32;
- the weights fan-out (``--load``: `flywheel bench load`): the learner's ZeroMQ I/O CPU per MB sent;
- the learning curve: agent steps at which the default's median flag rate (epsilon 0.05) reached ``--flag-rate``
  (``--steps-to-flags``, from docs/benchmarks/mario.md's four seeds).

The model: one actor per core, as ``flywheel run`` starts them, and the learner's torch threads from the preset's
``run.learner_core_share`` (flywheel.launch.runplan.learner_threads). Env steps/s are the least of the CPU the
machine has for a step's work (actor + samples-per-insert x learner + the replay's items, the learner's threads
at their measured CPU cost), the single learner process's rate, and the single replay event loop's. What it
assumes, and no run has checked: learning per agent step holds at every actor count (the per-slot epsilon ladder
spread over more slots), and torch threads past 2 keep the marginal gain measured from 1 to 2.

    python scripts/scale_projection.py --out docs/benchmarks/results/scale_projection_20261205.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from flywheel import presets
from flywheel.launch import runplan
from flywheel.launch.run import learner_core_share
from flywheel.services.learner.settings import LearnerSettings
from flywheel.settings import setting_default

RESULTS = Path(__file__).resolve().parents[1] / "docs" / "benchmarks" / "results"
DEFAULT_RUNS = [f"mario_60min_lr25_seed{k}.json" for k in (1, 2, 3)] + ["mario_long_lr25_seed4_part1.json"]
DEFAULT_GRID = "learner_grid_20261205/grid_200updates_5runs.json"
DEFAULT_LOAD = "load_20261204/load_rate8.json"
ACTORS = (2, 8, 16, 64, 256)
BATCH = 32  # the batch the per-unit costs were measured at (the mario preset's)
_MARIO = presets.load("mario")
SPI = float(_MARIO.section("replay")["samples_per_insert"])
PUBLISH_EVERY = int(_MARIO.section("learner")["publish_interval_updates"])
FANOUT_BUDGET_MB_S = float(setting_default(LearnerSettings, "weights_fanout_mb_per_s"))
LEARNER_SHARE = learner_core_share(_MARIO)

def _load(name: str) -> dict[str, Any]:
    path = Path(name) if Path(name).is_file() else RESULTS / name
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        sys.exit(f"error: {path}: {exc}")


def costs(runs: list[str]) -> dict[str, float]:
    """Median per-unit CPU seconds of the default job's runs (their steady windows)."""
    models = [_load(r)["extra"]["scale_model"] for r in runs]
    return {key: statistics.median(m[key] for m in models)
            for key in ("actor_cpu_per_step", "learner_cpu_per_sample", "replay_cpu_per_item", "env_steps_per_s",
                        "cores_used")}


def grid_cell(grid: dict[str, Any], batch: int, threads: int, metric: str) -> float:
    case = f"batch {batch}, {threads} thread(s)"
    for row in grid["rows"]:
        if row["case"].endswith(case) and row["metric"] == metric:
            return float(row["flywheel"])
    raise SystemExit(f"error: the grid has no {metric!r} for {case}")


def threads_model(grid: dict[str, Any]) -> tuple[float, float]:
    """(speedup of 2 threads over 1 at batch 32, CPU per update at 2 threads over 1): measured on this machine."""
    one, two = grid_cell(grid, BATCH, 1, "updates/s"), grid_cell(grid, BATCH, 2, "updates/s")
    cpu1 = grid_cell(grid, BATCH, 1, "process CPU per update")
    cpu2 = grid_cell(grid, BATCH, 2, "process CPU per update")
    return two / one, cpu2 / cpu1


def learner_threads(cores: int) -> int:
    """flywheel run's rule with one actor per core (its preset share of the cores)."""
    return runplan.learner_threads(cores, cores, share=LEARNER_SHARE)

def project(c: dict[str, float], speedup2: float, cpu2: float, io_ms_per_mb: float, weights_mb: float,
            steps_to_flags: float) -> list[dict[str, Any]]:
    actor, learner, replay = c["actor_cpu_per_step"], c["learner_cpu_per_sample"], c["replay_cpu_per_item"]
    out = []
    for actors in ACTORS:
        cores = actors
        t = learner_threads(cores)
        gain = 1.0 + (speedup2 - 1.0) * (t - 1)  # the 1 -> 2 gain per extra thread (past 2: assumed)
        cpu_per_sample = learner * (1.0 + (cpu2 - 1.0) * min(1, t - 1))
        cpu_cap = cores / (actor + SPI * cpu_per_sample + (1 + SPI) * replay)
        learner_cap = gain / (SPI * learner)
        replay_cap = 1.0 / ((1 + SPI) * replay)
        caps = {"cores": cpu_cap, "learner": learner_cap, "replay": replay_cap}
        binds = min(caps, key=lambda k: caps[k])
        rate = caps[binds]
        updates = rate * SPI / BATCH
        interval = max(PUBLISH_EVERY / updates, actors * weights_mb / FANOUT_BUDGET_MB_S)
        fanout_cores = actors * weights_mb * io_ms_per_mb / 1e3 / interval
        cpu_rate = rate  # a GPU learner: its cap is the replay's; the CPU only runs actors and the replay
        gpu_cap = cores / (actor + (1 + SPI) * replay)
        gpu_binds = "replay" if replay_cap < gpu_cap else "cores"
        gpu_rate = min(gpu_cap, replay_cap)
        out.append({
            "actors": actors, "cores": cores, "learner_threads": t, "caps_env_steps_per_s": caps, "binds": binds,
            "env_steps_per_s": cpu_rate, "updates_per_s": updates, "publish_interval_s": interval,
            "fanout_io_cores": fanout_cores, "minutes_to_flags": steps_to_flags / cpu_rate / 60,
            "gpu_learner": {"env_steps_per_s": gpu_rate, "binds": gpu_binds,
                            "minutes_to_flags": steps_to_flags / gpu_rate / 60},
        })
    return out


def markdown(rows: list[dict[str, Any]], flag_rate: float, steps_to_flags: float) -> str:
    lines = [f"| actors (= cores) | learner threads | env steps/s (CPU learner) | binds first | caps: cores, learner, "
             f"replay | weights: s between sends, I/O cores | minutes to {flag_rate:.0%} flags | GPU learner: env "
             f"steps/s, binds, minutes |", "|---:|---:|---:|---|---|---|---:|---|"]
    for row in rows:
        caps = ", ".join(f"{row['caps_env_steps_per_s'][k]:,.0f}" for k in ("cores", "learner", "replay"))
        gpu = row["gpu_learner"]
        lines.append(f"| {row['actors']} | {row['learner_threads']} | {row['env_steps_per_s']:,.0f} | {row['binds']} "
                     f"| {caps} | {row['publish_interval_s']:.2f}, {row['fanout_io_cores']:.3f} | "
                     f"{row['minutes_to_flags']:,.1f} | {gpu['env_steps_per_s']:,.0f}, {gpu['binds']}, "
                     f"{gpu['minutes_to_flags']:,.1f} |")
    lines.append(f"\nMinutes to {flag_rate:.0%} flags: {steps_to_flags:,.0f} agent steps (the default's median at 60 "
                 "minutes on 2 cores) over the projected env steps/s, if learning per agent step holds.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", nargs="+", default=DEFAULT_RUNS, help="bench mario results of the default job")
    parser.add_argument("--grid", default=DEFAULT_GRID, help="bench learner --opt grid=1 result")
    parser.add_argument("--load", default=DEFAULT_LOAD, help="bench load result")
    parser.add_argument("--steps-to-flags", type=float, default=732_264.0,
                        help="agent steps to the flag rate (default: the median of the four default seeds' 60-minute "
                             "checkpoints, 700,160-764,368)")
    parser.add_argument("--flag-rate", type=float, default=0.32, help="the flag rate those steps reached")
    parser.add_argument("--out", type=Path, help="write the projection's JSON here")
    args = parser.parse_args(argv)
    c = costs(args.runs)
    grid = _load(args.grid)
    speedup2, cpu2 = threads_model(grid)
    steps = [s for s in _load(args.load)["extra"]["steps"] if s["publishing"].get("publishes")]
    pub = steps[-1]["publishing"]
    weights_mb = pub["bytes_per_publish"] / 1e6
    io_ms_per_mb = pub["learner_io_thread_cpu_s_per_publish"] * 1e3 / (pub["wire_bytes_per_publish"] / 1e6)
    rows = project(c, speedup2, cpu2, io_ms_per_mb, weights_mb, args.steps_to_flags)
    doc = {"command": "python scripts/scale_projection.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "inputs": {"runs": args.runs, "grid": args.grid, "load": args.load, "costs": c,
                      "two_threads_speedup_b32": speedup2, "two_threads_cpu_per_update_ratio_b32": cpu2,
                      "weights_mb": weights_mb, "fanout_io_ms_per_mb": io_ms_per_mb,
                      "steps_to_flags": args.steps_to_flags, "flag_rate": args.flag_rate, "samples_per_insert": SPI,
                      "learner_core_share": LEARNER_SHARE, "fanout_budget_mb_per_s": FANOUT_BUDGET_MB_S},
           "rows": rows, "markdown": markdown(rows, args.flag_rate, args.steps_to_flags)}
    print(doc["markdown"])
    if args.out:
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
