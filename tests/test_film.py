"""The end-of-run film (flywheel/tools/film.py): the better-evaluating weights are chosen and remembered, their furthest
episode is filmed again frame for frame with a caption, and ``flywheel play`` takes them by default and says why."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_play import read_mp4

from flywheel.policy import BEST_FILE, PREFERRED_FILE, find_checkpoint, preferred
from flywheel.services.learner.checkpoint import save_checkpoint
from flywheel.services.learner.core import LearnerCore
from flywheel.testing.cartpole import cartpole_core, set_policy
from flywheel.tools.film import FILM_EPISODES, caption, compare, film, run_protocol, write_preferred


def _cartpole_core(balancing: bool) -> LearnerCore:
    core = cartpole_core()
    set_policy(core, right_when_leaning_right=balancing)
    return core


def _run_folder(tmp_path: Path, latest_balances: bool) -> Path:
    """A run folder as flywheel run leaves it: run.json (greedy protocol), newest weights v9, a kept best v5."""
    folder = tmp_path / "run"
    save_checkpoint(folder / "learner", _cartpole_core(balancing=not latest_balances), weight_version=5)
    shutil.move(folder / "learner" / "learner.safetensors", folder / "learner" / BEST_FILE)
    save_checkpoint(folder / "learner", _cartpole_core(balancing=latest_balances), weight_version=9)
    run = {"env_id": "CartPole-v1", "services": {"learner": {"BEST_EVAL_EPSILON": "0.0", "BEST_EVAL_NOOP_MAX": "0"}}}
    (folder / "run.json").write_text(json.dumps(run))
    return folder


@pytest.mark.system
def test_the_better_weights_are_chosen_filmed_with_a_caption_and_remembered(tmp_path: Path) -> None:
    folder = _run_folder(tmp_path, latest_balances=False)  # the kept best balances, the newest drops the pole
    protocol = run_protocol(folder)
    assert (protocol.epsilons, protocol.noop_max, protocol.episodes) == ((0.0,), 0, FILM_EPISODES)
    comparison = compare(folder, "CartPole-v1", protocol, workers=1)
    results = comparison["results"]
    assert comparison["which"] == "best" and results["best"]["version"] == 5 and results["latest"]["version"] == 9
    assert results["best"]["mean_return"] > 100 > results["latest"]["mean_return"]

    write_preferred(folder / "learner", comparison)
    assert preferred(folder) is not None and preferred(folder)[0] == "best"
    assert find_checkpoint(folder).name == BEST_FILE

    path = tmp_path / "film.mp4"
    filmed = film(folder, "CartPole-v1", comparison, path)
    furthest = max(results["best"]["records"], key=lambda r: r["return"])
    assert filmed["return"] == furthest["return"] and filmed["seed"] == furthest["seed"]  # the same episode again
    assert filmed["caption"] == caption(5, "best", protocol, furthest) and "v5 best" in filmed["caption"]
    _, frames = read_mp4(path)
    assert len(frames) == filmed["length"] + 1  # the reset frame, then one per step
    strip = frames[0][-10:, :, :].astype(int)  # the caption's strip: white text on black
    assert strip.max() > 200 and (strip < 40).mean() > 0.5


@pytest.mark.system
def test_play_takes_the_preferred_weights_and_says_why_until_the_run_goes_on(tmp_path: Path) -> None:
    folder = _run_folder(tmp_path, latest_balances=True)
    comparison = compare(folder, "CartPole-v1", run_protocol(folder), workers=1)
    assert comparison["which"] == "latest"
    write_preferred(folder / "learner", comparison)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLYWHEEL_")}
    result = subprocess.run([sys.executable, "-m", "flywheel", "play", str(folder), "--episodes", "1"], env=env,
                            capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr
    assert "learner.safetensors (weight version 9" in result.stdout
    assert "the newest weights, which evaluated better (mean return over" in result.stdout

    save_checkpoint(folder / "learner", _cartpole_core(balancing=True), weight_version=12)  # the run went on
    assert preferred(folder) is None and find_checkpoint(folder).name == BEST_FILE
    (folder / "learner" / PREFERRED_FILE).write_text("{not json")
    assert preferred(folder) is None  # a damaged file is no choice


def test_a_protocol_comes_from_run_json_and_defaults_to_greedy(tmp_path: Path) -> None:
    (tmp_path / "run.json").write_text(json.dumps(
        {"services": {"learner": {"BEST_EVAL_EPSILON": "0.05", "BEST_EVAL_NOOP_MAX": "30"}}}))
    protocol = run_protocol(tmp_path)
    assert (protocol.epsilons, protocol.noop_max) == ((0.05,), 30)
    assert run_protocol(tmp_path / "missing").epsilons == (0.0,)
    (tmp_path / "run.json").write_text(json.dumps(  # today's run.json: the settings each service ran with
        {"services": {"learner": {"PRESET": "mario"}}, "settings": {"learner": {"best_eval_epsilon": 0.05,
                                                                                 "best_eval_noop_max": 30}}}))
    assert (run_protocol(tmp_path).epsilons, run_protocol(tmp_path).noop_max) == ((0.05,), 30)
    record = {"progress": 3161.0, "success": True, "return": 311.2, "end": "flag"}
    labels = {"progress": "furthest x", "success": "flag"}  # the env's measures (flywheel.envs.measures)
    assert caption(3356, "latest", protocol, record, labels) == "v3356 latest | eps 0.05 | furthest x 3,161 | flag"
    assert caption(7, "best", protocol, {"progress": None, "return": 500.0, "end": "truncated"}) == (
        "v7 best | eps 0.05 | return 500.0 | truncated")  # an env without a progress measure
    assert np.isfinite(record["return"])


def test_a_pool_plays_the_film_only_where_episodes_are_pictures() -> None:
    """Two processes for image observations (a Mario episode takes seconds); this process for a vector env, where
    starting two interpreters that import torch took longer than the episodes (about 4 s of a CartPole run's stop)."""
    from flywheel.tools.film import film_workers

    assert film_workers("CartPole-v1") == 1
    assert film_workers("SuperMarioBros-1-1-v0?size=42,crop_top=32") == 2
