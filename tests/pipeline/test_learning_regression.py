"""Learning regression: the real `flywheel run --env CartPole-v1` reaches greedy return 400 within an env-step budget.

The budget counts env steps, not seconds, so a slow or busy machine does not make the test flaky: the replay's
rate limiter (samples_per_insert) ties learner updates to env steps. How the test knows: ``flywheel run`` writes
one row per progress tick to CHECKPOINT_DIR/progress.csv (env steps, greedy return of actor 0's greedy env) and
names the reason it stopped on its last lines. A learner that does not learn (checked by hand with
``--set learner.lr=1e-7``: greedy return about 9 after the whole budget) uses up the budget and fails the test.
"""

from __future__ import annotations

import csv
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # under any import mode (the importnb plugin's too)
from pipeline_helpers import clean_env

from flywheel.processes import launch

pytestmark = pytest.mark.slow

TARGET = 400.0  # greedy evaluation return (mean of actor 0's last greedy episodes); CartPole-v1 caps at 500
# Measured on the 2-core machine (the CartPole preset, seeds below): greedy 400 at 210,624, 217,264, 180,592 and
# 225,376 env steps (load 8-10, 53-78 s), and at 204,112 and 202,272 (quiet, ~40 s). One CI run collapsed after
# greedy 390 at ~300k and missed a 400k budget, so the budget is 3x the typical run: 600k env steps, about 60 s at
# the 10k env steps/s of a quiet machine, 150 s at 4k. A CI run on 2026-11-26 peaked at greedy 394.8 and collapsed
# while the learner judged its kept best every 20 s; since the preset judges it every 2 s (on new seeds, confirmed
# by a second round) the run stopped by the kept best at 130,608 env steps (27 s, quiet).
STEP_BUDGET = 600_000
RUN_TIMEOUT_S = 300  # a hang fails instead of blocking CI (a healthy run took 64-92 s here)
# The learner's network and the replay's sampling are seeded; the actors are not: one actor.seed would give every
# actor the same environments (runs with it took longer to reach 400).
SEEDS = ("--set", "learner.seed=1", "--set", "replay.seed=1")


def run_cartpole(tmp_path: Path, *sets: str) -> tuple[int, str, list[dict[str, str]], float]:
    """Run ``flywheel run`` with the step budget and the target; its exit code, output, progress rows, seconds."""
    ckpt = tmp_path / "ckpt"
    log = tmp_path / "run.log"
    args = ["run", "--env", "CartPole-v1", "--steps", str(STEP_BUDGET), "--target-return", f"{TARGET:g}",
            "--base-port", "0", "--http-port", "0", "--checkpoint-dir", str(ckpt),
            "--progress-interval", "1", "--no-video", *SEEDS, *sets]
    started = time.monotonic()
    proc = launch(args, clean_env(), log)
    try:
        code = proc.wait(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)  # stops and checkpoints every child
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-20:])
        raise AssertionError(f"flywheel run did not finish within {RUN_TIMEOUT_S} s\n{tail}") from None
    seconds = time.monotonic() - started
    with open(ckpt / "progress.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    return code, log.read_text(errors="replace"), rows, seconds


def first_at_target(rows: list[dict[str, str]]) -> int | None:
    """Env steps of the first progress row whose greedy return reached the target."""
    for row in rows:
        if row["greedy_return"] and float(row["greedy_return"]) >= TARGET:
            return int(row["env_steps"])
    return None


def last_lines(output: str, count: int = 15) -> str:
    return "\n".join(output.splitlines()[-count:])


@pytest.mark.timeout(RUN_TIMEOUT_S + 150)
def test_cartpole_reaches_greedy_400_within_the_step_budget(tmp_path: Path) -> None:
    code, output, rows, seconds = run_cartpole(tmp_path)
    assert code == 0, last_lines(output)
    stopped = re.search(rf"reached the target {TARGET:g} at (\d+) env steps", output)
    # the actors' greedy return in a progress row, or the learner's kept best (its own greedy evaluation) that
    # stopped the run between two rows
    steps = first_at_target(rows) or (int(stopped.group(1)) if stopped else None)
    best = max((float(r["greedy_return"]) for r in rows if r["greedy_return"]), default=None)
    assert steps is not None and steps <= STEP_BUDGET, (
        f"greedy return {best} (best seen) did not reach {TARGET:g} within {STEP_BUDGET:,} env steps "
        f"({seconds:.0f} s):\n{last_lines(output)}")
    assert f"reached the target {TARGET:g} at" in output, last_lines(output)  # it stopped for the target
    print(f"greedy return {TARGET:g} at {steps:,} env steps of {STEP_BUDGET:,}, {seconds:.0f} s")
