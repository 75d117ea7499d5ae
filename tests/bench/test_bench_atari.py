"""The atari suite's parts that need no training run: both policies evaluated on the same seeds with the same
code (a real, untrained checkpoint and a few dozen agent steps), and the summary built from them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from flywheel.bench.runner import BenchError
from flywheel.bench.suites import atari
from flywheel.services.learner.checkpoint import save_checkpoint
from flywheel.services.learner.core import CoreConfig, LearnerCore

ENV = atari.DEFAULT_ENV


def _checkpoint(folder: Path) -> str:
    torch.manual_seed(0)
    core = LearnerCore((4, 84, 84), 4, CoreConfig())
    core.env_id = ENV  # type: ignore[attr-defined]
    save_checkpoint(folder, core, weight_version=1)
    return str(folder)


def test_both_policies_play_the_same_seeds_and_the_summary_says_so(tmp_path: Path) -> None:
    seeds = [100_000, 100_001]
    lines: list[str] = []
    records = atari.evaluate_both(ENV, _checkpoint(tmp_path / "ckpt"), seeds, epsilon=0.05, workers=1,
                                  max_steps=30, progress=lines.append)
    assert set(records) == {"random", "trained"}
    for name in ("random", "trained"):
        assert [r["seed"] for r in records[name]] == seeds
        assert all(r["length"] <= 30 and r["end"] in ("max_steps", "terminated", "truncated")
                   for r in records[name])
    assert len(lines) == 4 and lines[0].startswith("random: game 1/2")
    points = [{"t": 10.0 * i, "env_steps": 1000.0 * i, "updates": 100.0 * i, "replay_size": 1000.0 * i,
               "training_return": {"actor-0": 1.5}, "load": [1.0, 1.0, 1.0]} for i in range(1, 4)]
    settings = {"env_id": ENV, "eval_env_id": atari.evaluation_env_id(ENV), "minutes": 0.5, "actors": 1,
                "sets": ["actor.eval_envs=0"], "eval_episodes": 2, "eval_epsilon": 0.05, "eval_workers": 1,
                "eval_max_steps": 30, "seeds": seeds}
    checkpoint = {"env_steps": 3000.0, "checkpoint_updates": 300, "dir": str(tmp_path / "ckpt")}
    result = atari.summarize(settings, points, checkpoint, records, {"start": [1.0, 1.0, 1.0]})
    score = result.rows[0]
    assert score.unit == "points" and score.peer_name == "random policy (mean)"
    assert score.flywheel_runs == [r["return"] for r in records["trained"]]
    assert score.peer_runs == [r["return"] for r in records["random"]]
    assert [r.metric for r in result.rows[1:]] == ["agent steps/s, all actors, over the polls",
                                                   "learner updates/s over the polls"]
    assert result.rows[1].flywheel == pytest.approx(100.0)
    assert result.notes[0].startswith("A short check, not a learning result")
    assert "terminal_on_life_loss=false" in settings["eval_env_id"]
    extra = result.extra
    assert [r["seed"] for r in extra["random"]["episodes"]] == [r["seed"] for r in extra["trained"]["episodes"]]
    assert extra["random"]["summary"]["n"] == extra["trained"]["summary"]["n"] == 2
    with pytest.raises(BenchError, match="not evaluated on the suite's seeds"):
        atari.summarize(settings, points, checkpoint, {**records, "trained": records["trained"][:1]}, {})


def test_the_suite_refuses_a_non_atari_env(tmp_path: Path) -> None:
    from flywheel.bench.runner import BenchContext

    with pytest.raises(BenchError, match="not an Atari"):
        atari.run(BenchContext(suite="atari", out_dir=tmp_path, options={"env": "CartPole-v1"}))
