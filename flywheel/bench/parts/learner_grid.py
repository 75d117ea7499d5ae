"""The learner's real update at each batch size x torch thread count: updates/s, samples/s, CPU per update, speedup.

Each thread count runs in a fresh process (``python -m flywheel.bench.parts.learner_grid``): torch.compile's CPU
backend writes the thread count into the kernels it generates (``#pragma omp parallel num_threads(N)``, from
torch.get_num_threads() at compile time), so changing torch.set_num_threads in a process that already compiled
would time the old count. Within a process the batch sizes alternate, one chunk each per repeat.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch

from flywheel.bench.parts.learner_cpu import pixel_batch
from flywheel.bench.runner import BenchContext, BenchError, Row, median
from flywheel.presets import DEFAULT_ENV
from flywheel.settings import build_settings

GRID_OPTIONS = {
    "grid": "1: the learner's update at each batch size x torch thread count, each count in a fresh process "
            "(the env's preset network and settings, in-memory batches); the other cases then default to off",
    "grid_batches": "grid: comma-separated batch sizes (default 32,64,128)",
    "grid_threads": "grid: comma-separated torch thread counts (default 1,2); speedups are over 1",
    "grid_updates": "grid: timed updates per cell and repeat (default 40; --quick 3)",
    "grid_env": f"grid: env id whose observation shape and preset are used (default {DEFAULT_ENV})",
}
GOAL_BATCH, GOAL_THREADS, GOAL_SPEEDUP = 128, 2, 1.6
WARMUP_UPDATES = 3  # per batch size before timing; the first compiled call compiles


@dataclass
class Cell:
    """One batch size at one thread count: the wall and process CPU seconds of each repeat's timed updates."""

    batch: int
    threads: int
    updates: int
    seconds: list[float]
    cpu_seconds: list[float]

    def rates(self) -> list[float]:
        return [self.updates / max(s, 1e-12) for s in self.seconds]


def _ints(text: str, option: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise BenchError(f"--opt {option}={text!r}: expected comma-separated whole numbers >= 1")
    return list(dict.fromkeys(values))


def measure_cells(batches: Sequence[int], updates: int, repeats: int, env_id: str = DEFAULT_ENV,
                  compile_choice: str | None = None, warmup: int = WARMUP_UPDATES,
                  progress: Callable[[str], None] = lambda _: None) -> list[Cell]:
    """Time the real LearnerCore (the env's preset settings at each batch size; ``compile_choice`` on/off overrides
    the preset's) in this process at its current torch thread count."""
    from flywheel.envs import env_spec
    from flywheel.services.learner.core import LearnerCore
    from flywheel.services.learner.settings import LearnerSettings
    from flywheel.services.learner.startup import core_config

    spec = env_spec(env_id)
    obs_shape, n_actions = tuple(int(d) for d in spec.obs_shape), int(spec.n_actions)
    threads, rng, cpu = torch.get_num_threads(), np.random.default_rng(0), torch.device("cpu")
    cores = {}
    for batch in batches:
        extra = {} if compile_choice is None else {"compile": compile_choice}
        settings = build_settings(LearnerSettings, {"env_id": env_id, "device": "cpu", "batch_size": batch, "seed": 0,
                                                    **extra}, "bench learner")
        core = LearnerCore(obs_shape, n_actions, core_config(settings, cpu), cpu)
        data = pixel_batch(obs_shape, batch, rng, n_actions)
        start = time.perf_counter()
        for _ in range(warmup):
            core.update(data).priorities()
        progress(f"{threads} thread(s), batch {batch}: warm-up {time.perf_counter() - start:.1f} s "
                 f"(compile state {core.compile_state})")
        cores[batch] = (core, data)
    cells = {b: Cell(b, threads, updates, [], []) for b in batches}
    for r in range(repeats):  # alternate so load swings hit every batch size alike; rotate the order
        order = list(batches)[r % len(batches):] + list(batches)[:r % len(batches)]
        for batch in order:
            core, data = cores[batch]
            wall, used = time.perf_counter(), time.process_time()
            for _ in range(updates):
                core.update(data).priorities()
            cells[batch].seconds.append(time.perf_counter() - wall)
            cells[batch].cpu_seconds.append(time.process_time() - used)
        progress(f"{threads} thread(s), repeat {r + 1}/{repeats}: "
                 + ", ".join(f"batch {b} {c.rates()[-1]:.1f} updates/s" for b, c in cells.items()))
    return [cells[b] for b in batches]


def run_grid(ctx: BenchContext) -> tuple[list[Row], list[str], str]:
    """The grid the options ask for, one fresh process per thread count: rows, notes and a Markdown table."""
    batches = _ints(ctx.option("grid_batches", "32,64,128"), "grid_batches")
    thread_counts = _ints(ctx.option("grid_threads", "1,2"), "grid_threads")
    updates = ctx.option_int("grid_updates", 3 if ctx.quick else 40)
    if updates < 1:
        raise BenchError(f"--opt grid_updates={updates}: expected at least 1")
    env_id = ctx.option("grid_env", DEFAULT_ENV)
    repeats = max(1, ctx.runs)
    cells: list[Cell] = []
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("FLYWHEEL_")}  # the preset's values only
    for threads in thread_counts:
        ctx.progress(f"grid: {threads} torch thread(s), batches {batches}, {updates} updates x {repeats} repeats "
                     "in a fresh process")
        args = [sys.executable, "-m", "flywheel.bench.parts.learner_grid", "--threads", str(threads),
                "--batches", ",".join(map(str, batches)), "--updates", str(updates), "--repeats", str(repeats),
                "--env", env_id]
        done = subprocess.run(args, env=child_env, stdout=subprocess.PIPE, text=True, timeout=4 * 3600, check=False)
        if done.returncode != 0 or not done.stdout.strip():
            raise BenchError(f"grid: the {threads}-thread process failed (exit {done.returncode}; its output is "
                             "above)")
        cells += [Cell(**c) for c in json.loads(done.stdout.strip().splitlines()[-1])]
    return grid_rows(cells, env_id, _samples_per_insert(env_id))


def _samples_per_insert(env_id: str) -> float:
    from flywheel.services.replay.settings import ReplaySettings

    replay = build_settings(ReplaySettings, {"env_id": env_id}, "bench learner")
    return float(replay.samples_per_insert)  # the preset's, as flywheel run's replay


def grid_rows(cells: list[Cell], env_id: str, samples_per_insert: float) -> tuple[list[Row], list[str], str]:
    """Rows per cell (updates/s, samples/s, CPU per update, updates per CPU-second), the speedup of each thread
    count over one thread at each batch with the goal at batch 128, and the grid as one Markdown table."""
    by = {(c.batch, c.threads): c for c in cells}
    rows: list[Row] = []
    speedups: dict[tuple[int, int], float] = {}
    lines = ["| batch | torch threads | updates/s | samples/s | env steps/s kept up with | CPU ms per update "
             "| updates per CPU-second | updates/s ÷ 1 thread |", "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for cell in cells:
        case = f"learner update, {env_id}, batch {cell.batch}, {cell.threads} thread(s)"
        rates = cell.rates()
        cpu_ms = [1e3 * c / cell.updates for c in cell.cpu_seconds]
        per_cpu = [cell.updates / max(c, 1e-12) for c in cell.cpu_seconds]
        samples = [r * cell.batch for r in rates]
        rows += [Row(case, "updates/s", "1/s", median(rates), flywheel_runs=rates),
                 Row(case, "samples/s (updates/s x batch)", "1/s", median(samples), flywheel_runs=samples),
                 Row(case, "process CPU per update", "ms", median(cpu_ms), higher_is_better=False,
                     flywheel_runs=cpu_ms),
                 Row(case, "updates per process CPU-second", "1/s", median(per_cpu), flywheel_runs=per_cpu)]
        one = by.get((cell.batch, 1))
        speedup = None
        if one is not None and cell.threads != 1:
            speedup = median(rates) / median(one.rates())
            speedups[(cell.batch, cell.threads)] = speedup
            paired = [a / b for a, b in zip(rates, one.rates(), strict=True)]
            goal_cell = (cell.batch, cell.threads) == (GOAL_BATCH, GOAL_THREADS)
            rows.append(Row(f"learner update, {env_id}, batch {cell.batch}",
                            f"updates/s, {cell.threads} threads ÷ 1 thread", "x", speedup,
                            goal=f">= {GOAL_SPEEDUP:.2f}" if goal_cell else "", flywheel_runs=paired,
                            met=speedup >= GOAL_SPEEDUP if goal_cell else None))
        env_steps = f"{median(samples) / samples_per_insert:,.0f}" if samples_per_insert > 0 else "–"
        lines.append(f"| {cell.batch} | {cell.threads} | {median(rates):.1f} | {median(samples):,.0f} | "
                     f"{env_steps} | {median(cpu_ms):.1f} | {median(per_cpu):.1f} | "
                     f"{'–' if speedup is None else f'{speedup:.2f}x'} |")
    goal = speedups.get((GOAL_BATCH, GOAL_THREADS))
    verdict = "not measured (the grid lacks that cell or 1 thread)" if goal is None else (
        f"{goal:.2f}x, {'met' if goal >= GOAL_SPEEDUP else 'not met'}")
    goal_line = (f"Goal: {GOAL_THREADS} torch threads >= {GOAL_SPEEDUP}x one thread's updates/s at batch "
                 f"{GOAL_BATCH}: {verdict}.")
    section = "\n".join([f"### Batch size x torch threads ({env_id})", "", goal_line, "", *lines, "",
                         f"Env steps/s kept up with: samples/s ÷ the preset's samples_per_insert "
                         f"({samples_per_insert:g}; – when it sets none), the same replay ratio at every batch size."])
    notes = [f"Grid: the real LearnerCore with {env_id}'s preset settings on in-memory batches, each thread count "
             "in a fresh process (compiled kernels keep the thread count they were compiled with); CPU is the "
             "process's (all threads) per timed update. " + goal_line]
    return rows, notes, section


def main(argv: list[str] | None = None) -> int:
    """One thread count's cells as a JSON line on stdout (run_grid starts this in a fresh process)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, required=True)
    parser.add_argument("--batches", required=True)
    parser.add_argument("--updates", type=int, required=True)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--env", default=DEFAULT_ENV)
    parser.add_argument("--compile", choices=("on", "off"), default=None, help="override the preset's")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)  # before anything is compiled

    def progress(message: str) -> None:
        print(f"[learner grid {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)

    cells = measure_cells(_ints(args.batches, "grid_batches"), args.updates, args.repeats, args.env, args.compile,
                          progress=progress)
    print(json.dumps([asdict(c) for c in cells]), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
