"""Curves: TensorBoard events and progress.csv, read back with TensorBoard's own reader; a resume continues them."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from flywheel.curves import COLUMNS, MEASURES_TAG, TAGS, Curves, scalars, summarize

LABELS = {"progress_label": "cells visited", "success_label": "goal"}  # an env's own names for its measures


def _status(steps: float, loss: float, lag: list[float], success: list[float] | None = None) -> dict[str, Any]:
    """A gateway /status with what the progress loop reads (two actors, a learner, a replay); with ``success``
    the actors' env declares measures (flywheel.envs.measures) and they report them with its labels."""
    actors = [{"up": True, "gauges": {"policy_lag_versions": value, "env_steps_per_second": 100.0,
                                      "episode_return_mean": 20.0, "eval_return_mean": 30.0,
                                      **({"episode_success_rate": success[i], "episode_progress_mean": 500.0,
                                          "episode_progress_max": 600.0 + i, "restarted_progress_mean": 800.0,
                                          "restarted_success_rate": 0.5} if success else {})},
               "info": LABELS if success else {}}
              for i, value in enumerate(lag)]
    return {"services": {
        "actor": {"instances": actors + [{"up": False, "gauges": {"policy_lag_versions": 99.0}}],
                  "totals": {"env_steps_total": steps}},
        "learner": {"instances": [{"up": True, "gauges": {"loss": loss, "updates_per_second": 4.0,
                                                           "weight_version": 3.0},
                                   "counters": {"updates_total": 40.0}}]},
        "replay": {"instances": [{"up": True, "gauges": {"size_transitions": steps}}]},
    }}


def _events(folder: Path) -> EventAccumulator:
    acc = EventAccumulator(str(folder / "tb"))
    acc.Reload()
    return acc


def _rows(folder: Path) -> list[dict[str, str]]:
    with open(folder / "progress.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def test_scalars_from_a_gateway_status() -> None:
    status = _status(1000, 0.5, [1.0, 3.0], success=[0.0, 0.5])
    summary = summarize(status)
    assert (summary["progress_max"], summary["progress_label"], summary["success_label"]) == (
        601.0, "cells visited", "goal")
    values = scalars(summary, status)
    assert values == {"return": 20.0, "greedy_return": 30.0, "progress_mean": 500.0,
                      "restarted_progress_mean": 800.0, "success_rate": 0.25, "restarted_success_rate": 0.5,
                      "loss": 0.5, "updates": 40.0, "updates_per_second": 4.0, "env_steps_per_second": 200.0,
                      "policy_lag": 2.0, "replay_size": 1000.0, "eval_return": None, "eval_success_rate": None,
                      "eval_progress_mean": None}  # the actor that is down counts for nothing
    plain = summarize(_status(0, 0.1, [0.0]))  # an env without measures: none, and no labels
    assert plain["success_rate"] is plain["progress_mean"] is plain["progress_label"] is None
    assert scalars(plain, _status(0, 0.1, [0.0]))["success_rate"] is None


def test_events_and_csv_hold_every_point_with_env_steps_as_the_step(tmp_path: Path) -> None:
    with Curves(tmp_path) as curves:
        for i, steps in enumerate((500, 1500, 3000)):
            status = _status(steps, 1.0 / (i + 1), [float(i), float(i)])
            curves.record_status(5.0 * (i + 1), status)
        curves.record(20.0, 3500, {"loss": math.nan, "return": None, "replay_size": 7.0})  # gaps stay gaps
    acc = _events(tmp_path)
    tags = set(acc.Tags()["scalars"])
    assert {TAGS[k] for k in ("return", "greedy_return", "loss", "updates_per_second", "env_steps_per_second",
                              "replay_size", "policy_lag", "updates")} <= tags
    assert not {t for t in tags if t.startswith("episodes/")}  # CartPole-like: no measures, no such curves
    assert not acc.Tags()["tensors"], "and no measures text"
    loss = acc.Scalars("learner/loss")
    assert [e.step for e in loss] == [500, 1500, 3000]
    assert [e.value for e in loss] == pytest.approx([1.0, 0.5, 1 / 3])
    assert [e.step for e in acc.Scalars("replay/size")] == [500, 1500, 3000, 3500]
    assert [e.value for e in acc.Scalars("actors/policy_lag_versions")] == [0.0, 1.0, 2.0]
    rows = _rows(tmp_path)
    assert list(rows[0]) == list(COLUMNS)
    assert [r["env_steps"] for r in rows] == ["500", "1500", "3000", "3500"]
    assert [r["elapsed_s"] for r in rows] == ["5.0", "10.0", "15.0", "20.0"]
    assert float(rows[1]["loss"]) == pytest.approx(0.5) and rows[3]["loss"] == "" and rows[3]["return"] == ""
    assert rows[0]["success_rate"] == ""


def test_the_envs_measures_are_curves_named_by_its_labels(tmp_path: Path) -> None:
    """An env with measures: generic tags (level start and restarted apart), and one text naming the env's
    measure behind each, written again only when the labels change."""
    with Curves(tmp_path) as curves:
        for i, steps in enumerate((500, 1500)):
            curves.record_status(5.0 * (i + 1), _status(steps, 1.0, [0.0, 0.0], success=[0.0, 0.5 * i]))
    acc = _events(tmp_path)
    assert [e.value for e in acc.Scalars("episodes/success_rate")] == [0.0, 0.25]
    assert [e.value for e in acc.Scalars("episodes/restarted_progress_mean")] == [800.0, 800.0]
    (text,) = acc.Tensors(f"{MEASURES_TAG}/text_summary")  # once: the labels did not change
    assert text.step == 500
    written = text.tensor_proto.string_val[0].decode()
    assert "| episodes/progress_mean | cells visited (level-start episodes, mean) |" in written
    assert "| episodes/restarted_success_rate | goal (restarted episodes, rate) |" in written
    assert "eval/" not in written, "no evaluation labels reported"
    assert [r["restarted_progress_mean"] for r in _rows(tmp_path)] == ["800", "800"]


def test_a_resumed_run_continues_the_curves(tmp_path: Path) -> None:
    with Curves(tmp_path) as curves:
        curves.record(10.0, 2000, {"loss": 1.0})
    with Curves(tmp_path, resume=True) as curves:  # a restarted gateway, or a resumed run
        assert (curves.step_offset, curves.time_offset) == (2000, 10.0)
        curves.record(5.0, 300, {"loss": 0.5})  # its first point marks the seam; nothing new there, so no row
        curves.record(9.0, 700, {"loss": 0.4})  # then it counts what it sees grow
        curves.record(12.0, 100, {"loss": 0.3})  # counters that start again (services restarted) keep counting on
    assert [(r["env_steps"], r["elapsed_s"], r["loss"]) for r in _rows(tmp_path)] == [
        ("2000", "10.0", "1"), ("2400", "14.0", "0.4"), ("2500", "17.0", "0.3")]
    assert [(e.step, e.value) for e in _events(tmp_path).Scalars("learner/loss")] == [
        (2000, 1.0), (2400, pytest.approx(0.4)), (2500, pytest.approx(0.3))]
    with Curves(tmp_path) as curves:  # a new run in the same folder starts over
        curves.record(1.0, 10, {"loss": 2.0})
    assert [r["env_steps"] for r in _rows(tmp_path)] == ["10"]
    assert [(e.step, e.value) for e in _events(tmp_path).Scalars("learner/loss")] == [(10, 2.0)]


def test_a_resume_keeps_the_columns_of_an_earlier_version(tmp_path: Path) -> None:
    """A progress.csv written with other columns (an earlier version's) is continued with today's columns, its
    own old ones kept, every value still under its own column."""
    (tmp_path / "progress.csv").write_text("env_steps,elapsed_s,return,old_measure,loss\n1000,5.0,7,480,0.9\n")
    with Curves(tmp_path, resume=True) as curves:
        curves.record(1.0, 1500, {"loss": 0.5, "success_rate": 0.25})
    rows = _rows(tmp_path)
    assert list(rows[0]) == [*COLUMNS, "old_measure"]
    assert [(r["env_steps"], r["return"], r["old_measure"], r["loss"], r["success_rate"]) for r in rows] == [
        ("1000", "7", "480", "0.9", ""), ("1500", "", "", "0.5", "0.25")]


def test_the_learners_evaluation_reaches_the_curves_and_the_progress_line() -> None:
    from flywheel.launch.runwatch import progress_line

    status = _status(1000, 0.5, [1.0])
    learner = status["services"]["learner"]["instances"][0]
    learner["gauges"].update(eval_greedy_return=250.5, eval_greedy_version=1234.0, eval_success_rate=0.44,
                             eval_progress_mean=2315.0, eval_progress_median=3161.0)
    learner["info"] = {"eval_progress_label": "cells visited", "eval_success_label": "goal"}  # its env's labels
    summary = summarize(status)
    values = scalars(summary, status)
    assert (values["eval_return"], values["eval_success_rate"], values["eval_progress_mean"]) == (250.5, 0.44, 2315.0)
    assert (summary["eval_progress_label"], summary["eval_success_label"]) == ("cells visited", "goal")
    line = progress_line(60.0, summary)
    assert line.endswith("| eval v1,234: goal 44%, cells visited 2,315 (median 3,161)"), line
    del learner["gauges"]["eval_success_rate"]  # an env with no measures
    del learner["info"]
    assert progress_line(60.0, summarize(status)).endswith("| eval v1,234: return 250.5")
