"""An env that declares its own measures: they come out of the vector, the evaluation records and the actor's gauges
under generic names, with the env's labels, and nothing outside the env names them."""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
import pytest

from flywheel.envs import EpisodeEnd, env_spec, make_env, make_vector_env
from flywheel.envs.measures import Measures, measures_of, measures_so_far, progress_in
from flywheel.evaluation import Protocol, evaluate, run_protocol
from flywheel.services.actor.core import EpisodeStats, build_core
from flywheel.services.actor.policy import build_policy
from flywheel.services.actor.report import episode_gauges

CELLS = "flywheel-test/CellWalk-v0"
SCRIPTED = "flywheel-test/ScriptedProgress-v0"


class CellWalk(gymnasium.Env[np.ndarray, np.int64]):
    """A corridor of ``size`` cells: action 1 steps right, 0 left; the goal is the last cell. Its measures: the cells
    visited so far, and the goal reached."""

    metadata = {"render_modes": [], "measures": {"progress": "cells visited", "success": "goal"}}

    def __init__(self, size: int = 6, max_steps: int = 20) -> None:
        self.size, self.max_steps = size, max_steps
        self.observation_space = gymnasium.spaces.Box(0.0, 1.0, (size,), dtype=np.float32)
        self.action_space = gymnasium.spaces.Discrete(2)
        self.pos, self.t, self.visited = 0, 0, {0}

    def _obs(self) -> np.ndarray:
        obs = np.zeros(self.size, dtype=np.float32)
        obs[self.pos] = 1.0
        return obs

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.pos, self.t, self.visited = 0, 0, {0}
        return self._obs(), {"progress": 1.0, "success": False}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.t += 1
        self.pos = min(max(self.pos + (1 if int(action) == 1 else -1), 0), self.size - 1)
        self.visited.add(self.pos)
        goal = self.pos == self.size - 1
        out_of_time = not goal and self.t >= self.max_steps
        info: dict[str, Any] = {"progress": float(len(self.visited)), "success": goal}
        if goal or out_of_time:
            info["end"] = "goal" if goal else "out of time"
        return self._obs(), float(goal), goal, out_of_time, info


class ScriptedProgress(gymnasium.Env[np.ndarray, np.int64]):
    """Three steps whose progress goes 2, 5, 3 (the episode's measure is its maximum, 5), success on step 2 only."""

    metadata = {"render_modes": [], "measures": {"progress": "height"}}
    observation_space = gymnasium.spaces.Box(0.0, 1.0, (1,), dtype=np.float32)
    action_space = gymnasium.spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1, np.float32), {"progress": 0.0}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.t += 1
        info = {"progress": np.float32((2, 5, 3)[self.t - 1]), "success": self.t == 2}
        return np.zeros(1, np.float32), 1.0, self.t == 3, False, info


for _id, _cls in ((CELLS, CellWalk), (SCRIPTED, ScriptedProgress)):
    if _id not in gymnasium.registry:
        gymnasium.register(_id, entry_point=_cls)


def test_an_env_declares_its_measures_and_reads_its_info() -> None:
    env = make_env(CELLS)
    try:
        assert measures_of(env) == Measures("cells visited", "goal") == env_spec(CELLS).measures
        assert measures_of(env).labels() == {"progress": "cells visited", "success": "goal"}
    finally:
        env.close()
    assert env_spec("CartPole-v1").measures == Measures() and Measures().labels() == {}
    assert Measures.from_metadata({"measures": {"progress": " ", "success": 3}}) == Measures()  # no usable label
    assert Measures.from_metadata({"measures": {"success": "goal"}}) == Measures(success="goal")
    for bad in (None, "x", True, float("nan"), float("inf")):
        assert progress_in({"progress": bad}) is None
    assert progress_in({"progress": np.float32(2.5)}) == 2.5 and progress_in({}) is None
    assert measures_so_far({}, None, None) == (None, None)  # an env without measures
    assert measures_so_far({"progress": 3, "success": False}, None, None) == (3.0, False)
    assert measures_so_far({"progress": 2, "success": False}, 3.0, True) == (3.0, True)  # the furthest; once reached
    assert measures_so_far({"progress": float("nan"), "success": True}, 3.0, False) == (3.0, True)


def test_the_vector_reports_the_maximum_progress_and_any_success() -> None:
    vec = make_vector_env(SCRIPTED, 1, seed=0)
    try:
        vec.reset()
        episodes: list[EpisodeEnd] = []
        for _ in range(3):
            episodes += vec.step(np.zeros(1, dtype=np.int64)).episodes
        [episode] = episodes
        assert episode.metrics == {"progress": 5.0, "success": 1.0}  # not the last step's 3, nor its False
    finally:
        vec.close()


def test_evaluation_records_carry_the_env_measures_and_the_summary_its_labels() -> None:
    records = evaluate(CELLS, [1, 2, 3, 4], epsilon=0.3, noop_max=0)  # random actions (no checkpoint)
    for r in records:
        assert 1 <= r["progress"] <= 6 and isinstance(r["success"], bool)
        assert r["end"] == ("goal" if r["success"] else "out of time")  # the env's own word
        assert r["success"] == (r["progress"] == 6)  # the goal is the last of the 6 cells
    assert len({r["progress"] for r in records}) > 1  # the seeds drive different walks
    stalled = evaluate(CELLS, [1, 2, 3, 4], epsilon=0.3, stall_steps=2, noop_max=0)  # 2 steps without a new cell
    assert any(r["end"] == "stall" for r in stalled)
    result = run_protocol(CELLS, None, Protocol(episodes=4, seed=1, noop_max=0))
    assert result["measures"] == {"progress": "cells visited", "success": "goal"}
    [row] = result["rows"]
    assert row["measures"] == result["measures"]
    assert row["progress"]["mean"] == pytest.approx(np.mean([r["progress"] for r in row["records"]]))
    assert row["success"]["successes"] == sum(r["success"] for r in row["records"])


def test_the_actor_reports_level_start_and_restarted_measures_apart() -> None:
    spec = env_spec(CELLS)
    core = build_core(CELLS, 2, build_policy(spec.obs_shape, spec.n_actions, hidden=8, seed=0), n_step=1,
                      gamma=0.99, seed=3)
    core.epsilon = 1.0
    try:
        while core.stats.episodes < 6:
            core.step()
        progress = list(core.stats.measured.progress)
        gauges = episode_gauges(core.stats, curriculum=False)
        assert gauges["episode_progress_mean"] == pytest.approx(np.mean(progress))
        assert gauges["episode_progress_max"] == max(progress) and 0 <= gauges["episode_success_rate"] <= 1
        assert not {"restarted_progress_mean", "restarted_success_rate"} & set(gauges)
    finally:
        core.close()
    stats = EpisodeStats()  # episodes as a curriculum's env slots report them: some began at a kept start state
    for progress, success, restarted in ((2.0, 0.0, False), (4.0, 0.0, False), (5.0, 1.0, True), (6.0, 0.0, True)):
        stats.record(EpisodeEnd(0, 1.0, 10, {"progress": progress, "success": success}, restarted=restarted))
    gauges = episode_gauges(stats, curriculum=True)
    assert (gauges["episode_progress_mean"], gauges["episode_progress_max"], gauges["episode_success_rate"]) == (
        3.0, 4.0, 0.0)
    assert (gauges["restarted_progress_mean"], gauges["restarted_success_rate"]) == (5.5, 0.5)
