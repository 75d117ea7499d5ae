"""The demos bench suite's parts that need no run: the --set items that turn demonstrations on, and its rows."""

from __future__ import annotations

from pathlib import Path

from flywheel.bench.runner import SuiteResult
from flywheel.bench.suites import demos
from flywheel.services.learner.settings import LearnerSettings
from flywheel.services.replay.settings import ReplaySettings


def _settings(items: list[str], service: str) -> dict[str, str]:
    return {k.split(".", 1)[1]: v for k, v in (item.split("=", 1) for item in items) if k.startswith(service + ".")}


def test_demo_sets_are_valid_settings_of_learner_and_replay(tmp_path: Path) -> None:
    items = demos.demo_sets(tmp_path, 1000, "bc", 0.25, 2.0)
    learner = LearnerSettings(**_settings(items, "learner"))
    replay = ReplaySettings(**_settings(items, "replay"))
    assert learner.pretrain_updates == 1000 and learner.pretrain_loss == "bc" and learner.demo_loss_weight == 2.0
    assert learner.demos_path == str(tmp_path) and replay.demo_path == tmp_path and replay.demo_ratio == 0.25
    no_pretraining = demos.demo_sets(tmp_path, 0, "dqfd", 0.1, 1.0)  # table and margin only: still valid
    LearnerSettings(**_settings(no_pretraining, "learner"))
    assert not any(item.startswith("learner.demos_path") for item in no_pretraining)


def test_cartpole_rows_compare_medians_and_count_censored_seeds() -> None:
    runs = [
        {"side": "with", "seed": 0, "reached": {"s": 20.0, "steps": 5000}, "first_weights_s": 12.0, "curve": []},
        {"side": "with", "seed": 1, "reached": None, "first_weights_s": 13.0, "curve": []},
        {"side": "with", "seed": 2, "reached": {"s": 22.0, "steps": 6000}, "first_weights_s": 11.0, "curve": []},
        {"side": "without", "seed": 0, "reached": {"s": 60.0, "steps": 9e4}, "first_weights_s": 10.0, "curve": []},
        {"side": "without", "seed": 1, "reached": {"s": 70.0, "steps": 1e5}, "first_weights_s": 10.0, "curve": []},
        {"side": "without", "seed": 2, "reached": {"s": 50.0, "steps": 8e4}, "first_weights_s": 10.0, "curve": []},
    ]
    result = SuiteResult(suite="demos", title="t")
    demos._cartpole_rows(result, runs, 240.0, ["replay.demo_ratio=0.25"])
    time_row = result.rows[0]
    assert time_row.flywheel_runs == [20.0, 240.0, 22.0] and time_row.flywheel == 22.0 and time_row.peer == 60.0
    assert time_row.met is True  # faster median, 1 of 3 censored
    assert any("with 1, without 0" in note for note in result.notes)
    assert result.rows[1].flywheel == 12.0 and result.rows[1].peer == 10.0


def test_mario_rows_use_the_evaluation_distances() -> None:
    sides = [{"side": "without", "distances": [300.0, 320.0], "rolling": 400.0, "steps": 9e3, "updates": 800.0,
              "version": 20},
             {"side": "with", "distances": [700.0, 500.0], "rolling": 520.0, "steps": 8e3, "updates": 600.0,
              "version": 14}]
    result = SuiteResult(suite="demos", title="t")
    demos._mario_rows(result, sides, 8.0, ["replay.demo_ratio=0.25"], {"all": {"mean_distance": 650.0}})
    assert result.rows[0].flywheel == 600.0 and result.rows[0].peer == 310.0 and result.rows[0].met is True
    assert result.rows[1].flywheel == 520.0 and result.rows[1].peer == 400.0
    assert any("expert's own mean distance: 650" in note for note in result.notes)
    fresh = SuiteResult(suite="demos", title="t")  # a collection of this build: the env's progress measure
    demos._mario_rows(fresh, sides, 8.0, ["replay.demo_ratio=0.25"], {"all": {"mean_progress": 640.0}})
    assert any("expert's own mean distance: 640" in note for note in fresh.notes)
