"""A game Flywheel has never heard of shows its own measures everywhere, declared in its env module alone.

``measured_env.py`` beside this test is a tiny grid walk whose metadata names its measures ``cells visited`` and
``goal`` and whose step info reports them; nothing else in the repository knows it. A real ``flywheel run`` (every
service a process, the env reached by its ``module:EnvId`` id on PYTHONPATH) trains it, and the actors' gauges
reach ``/metrics`` under the generic names, ``/status`` carries the env's labels (the actors' and the learner's),
and the live page, rendered by headless Chromium, shows the cards, the chart and the filmed clip under them.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # under any import mode (the importnb plugin's too)
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gateway"))  # the live page's Chromium helpers
from pipeline_helpers import get_text, metric_values
from test_gateway_live_page import rendered

from flywheel.testing.run import FlywheelRun

HERE = Path(__file__).resolve().parent  # where measured_env.py is
pytestmark = [pytest.mark.system, pytest.mark.timeout(600)]  # a whole `flywheel run` and a browser

ENV_ID = "measured_env:GridWalk-v0"
LABELS = {"progress_label": "cells visited", "success_label": "goal"}


def test_an_envs_own_measures_reach_metrics_status_and_the_live_page(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # every service imports the env's module from the id: put it where they look (they inherit this environment)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p))
    run = FlywheelRun(ENV_ID, tmp_path / "run", actors=1, envs_per_actor=2, progress_interval=1.0,
                      sets=["replay.min_size_to_sample=200", "actor.clip_interval_s=5"], args=["--no-video"])
    with run:
        def measured() -> dict[str, Any] | None:
            status = run.status() or {}
            summary = status.get("summary", {})
            done = (summary.get("progress_mean") is not None and summary.get("success_rate") is not None
                    and summary.get("eval_success_rate") is not None and status.get("clip") is not None)
            return status if done else None

        status = run.wait_for(measured, 180, "the actors' measures, the learner's evaluation and a clip")
        summary = status["summary"]
        assert {k: summary[k] for k in LABELS} == LABELS
        assert (summary["eval_progress_label"], summary["eval_success_label"]) == ("cells visited", "goal")
        assert 1 <= summary["progress_mean"] <= summary["progress_max"] <= 16  # cells of a 4x4 grid
        assert 0 <= summary["success_rate"] <= 1 and 0 <= summary["eval_success_rate"] <= 1
        assert summary["restarted_progress_mean"] is None  # no start-state curriculum here
        clip = status["clip"]
        assert clip["env_id"] == ENV_ID and 1 <= clip["progress"] <= 16

        metrics = get_text(run.url + "/metrics")
        for name in ("flywheel_actor_episode_progress_mean", "flywheel_actor_episode_progress_max",
                     "flywheel_actor_episode_success_rate", "flywheel_learner_eval_progress_mean",
                     "flywheel_learner_eval_success_rate"):
            values = metric_values(metrics, name)
            assert values and all(v >= 0 for v in values.values()), name
        [info] = metric_values(metrics, "flywheel_actor_info")
        assert 'progress_label="cells visited"' in info and 'success_label="goal"' in info

        page = rendered(tmp_path, run.url + "/")
        t = page.by_id
        assert "hidden" not in page.attrs["measures_panel"]
        assert (t["progress_title"], t["progress_max_title"], t["success_title"]) == (
            "cells visited mean", "cells visited max", "goal rate")
        assert 1 <= float(t["progress_mean"]) <= 16 and t["success_rate"].endswith(" %")
        assert t["measures_title"] == "cells visited and goal rate over time"
        assert ", cells visited " in t["clip_info"], t["clip_info"]
        assert "mario" not in get_text(run.url + "/").lower()  # the page itself knows no game
