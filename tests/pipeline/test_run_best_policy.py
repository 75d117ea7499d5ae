"""A real `flywheel run` keeps the best policy: the learner's greedy evaluations write learner/best.safetensors
and best.json, the progress line shows the best beside the actors' greedy return, and `flywheel play` takes it."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from pipeline_helpers import clean_env, wait_until
from test_run_folder_runs import CHEAP

from flywheel.processes import launch

pytestmark = pytest.mark.system


def shown_best(learner: Path, log: Path) -> dict[str, Any] | None:
    """best.json once the progress line shows it (`` best RETURN (vVERSION)``)."""
    try:
        best = json.loads((learner / "best.json").read_text())
    except (OSError, ValueError):
        return None
    return best if f" best {best['mean_return']:.1f} (v{best['weight_version']:,})" in log.read_text() else None


def test_a_run_keeps_its_best_policy_and_play_takes_it(tmp_path: Path) -> None:
    log, learner = tmp_path / "run.log", tmp_path / "ckpt" / "learner"
    run = launch(["run", *CHEAP, "--checkpoint-dir", "ckpt", "--time-limit", "120", "--set",
                  "learner.best_eval_interval_s=4", "--set", "learner.best_eval_episodes=2"], clean_env(), log,
                 cwd=tmp_path)
    try:  # stopped (Ctrl-C) once a best is kept and shown, not after a fixed time
        shown = wait_until(lambda: shown_best(learner, log), 110, "a kept best on the progress line", [log])
        run.send_signal(signal.SIGINT)
        assert run.wait(timeout=120) == 0, log.read_text()[-3000:]
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    # a round may end between the last progress line and the stop: the best kept last is the shown one or newer, and
    # its score may have moved since (the kept best replays each confirmation's seeds, 2 episodes a time)
    best = json.loads((learner / "best.json").read_text())
    assert best["weight_version"] >= shown["weight_version"] >= 1 and best["epsilon"] == 0.0, best
    assert best["episodes"] >= 4 and best["episodes"] % 2 == 0, best  # 2, 2 confirming, and any replays
    returns = [r["return"] for r in best["records"]]
    assert len(returns) == best["episodes"] and best["mean_return"] == sum(returns) / len(returns), best
    assert (learner / "best.safetensors").is_file() and not (learner / ".best-candidate.safetensors").exists()
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
