"""A real `flywheel run` keeps the best policy: the learner's greedy evaluations write learner/best.safetensors
and best.json, the progress line shows the best beside the actors' greedy return, and `flywheel play` takes it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from pipeline_helpers import clean_env
from test_run_folder_runs import flywheel_run

pytestmark = pytest.mark.system


def test_a_run_keeps_its_best_policy_and_play_takes_it(tmp_path: Path) -> None:
    run = flywheel_run(tmp_path, "--checkpoint-dir", "ckpt", "--time-limit", "45",
                       "--set", "learner.best_eval_interval_s=4", "--set", "learner.best_eval_episodes=2")
    assert run.returncode == 0, run.stdout + run.stderr
    learner = tmp_path / "ckpt" / "learner"
    best = json.loads((learner / "best.json").read_text())
    assert best["episodes"] == 4 and best["weight_version"] >= 1 and best["epsilon"] == 0.0  # 2, and 2 confirming
    assert (learner / "best.safetensors").is_file() and not (learner / ".best-candidate.safetensors").exists()
    assert any(f" best {best['mean_return']:.1f} (v{best['weight_version']:,})" in line
               for line in run.stdout.splitlines()), run.stdout
    logs = (tmp_path / "ckpt" / "logs" / "learner-0.log").read_text()
    assert "greedy evaluation of weight version" in logs and "the best so far" in logs, logs[-3000:]

    play = subprocess.run([sys.executable, "-m", "flywheel", "play", "ckpt", "--episodes", "1"], cwd=tmp_path,
                          env=clean_env(), capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert play.returncode == 0, play.stdout + play.stderr
    assert play.stdout.startswith(f"playing ckpt/learner/best.safetensors (weight version {best['weight_version']},")
    latest = subprocess.run([sys.executable, "-m", "flywheel", "play", "ckpt", "--episodes", "1", "--which",
                             "latest"], cwd=tmp_path, env=clean_env(), capture_output=True, text=True, timeout=120,
                            stdin=subprocess.DEVNULL)
    assert latest.returncode == 0 and latest.stdout.startswith("playing ckpt/learner/learner.safetensors ")
