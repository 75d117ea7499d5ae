"""The learner's torch threads when its setting is 0: flywheel run gives it the cores its actors and replay leave;
a learner started alone takes the cores its container may use, CPU quota included."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from flywheel import presets
from flywheel.cli import build_parser
from flywheel.launch.run import make_plan
from flywheel.launch.runplan import Plan, learner_threads
from flywheel.services.learner.startup import cpu_quota, usable_cores


@pytest.fixture(autouse=True)
def _no_flywheel_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in os.environ if n.startswith("FLYWHEEL_")]:
        monkeypatch.delenv(name)


@pytest.fixture
def plan_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Plan]]:
    """plan_on(cores, *argv): flywheel run's plan on a machine with ``cores`` cores."""
    made: list[Plan] = []

    def make(cores: int, *argv: str) -> Plan:
        monkeypatch.setattr(os, "cpu_count", lambda: cores)
        args = build_parser().parse_args(["run", "--checkpoint-dir", str(tmp_path / "ckpt"), "--base-port", "0",
                                          "--http-port", "0", *argv])
        made.append(make_plan(args))
        return made[-1]

    yield make
    for plan in made:
        plan.remove_socket_dir()


def test_the_learner_gets_the_cores_left_after_the_actors_and_the_replay_or_its_share_at_least_one() -> None:
    assert learner_threads(2, cores=2, share=0.3) == 1  # the 2-core machine Mario was measured on: one thread
    assert learner_threads(1, cores=2) == 1
    assert learner_threads(4, cores=16) == 8  # 11 left, capped
    assert learner_threads(4, cores=12) == 7
    assert learner_threads(16, cores=16) == 1  # no share: the actors take every core
    assert learner_threads(8, cores=8, share=0.3) == 2  # the actors fill the cores: the preset's share
    assert learner_threads(16, cores=16, share=0.3) == 5
    assert learner_threads(64, cores=64, share=0.3) == 8
    assert learner_threads(1, cores=8) == 6


def test_mario_takes_its_share_of_a_larger_machine(plan_on: Callable[..., Plan]) -> None:
    plan = plan_on(8)
    assert len(plan.actor_extra) == 8 and plan.env["learner"]["TORCH_THREADS"] == "2"


def test_mario_keeps_one_learner_thread_on_two_cores(plan_on: Callable[..., Plan]) -> None:
    assert presets.load("mario").section("learner")["torch_threads"] == 0  # sized by the run, not pinned
    plan = plan_on(2)
    assert plan.preset is not None and plan.preset.name == "mario" and len(plan.actor_extra) == 2
    assert plan.env["learner"]["TORCH_THREADS"] == "1" and plan.settings["learner"].torch_threads == 1


def test_fewer_actors_leave_the_learner_more_threads_and_a_chosen_count_is_kept(plan_on: Callable[..., Plan]) -> None:
    plan = plan_on(12, "--actors", "4")
    assert plan.env["learner"]["TORCH_THREADS"] == "7" and plan.settings["learner"].torch_threads == 7
    chosen = plan_on(16, "--actors", "4", "--set", "learner.torch_threads=3")
    assert chosen.env["learner"]["TORCH_THREADS"] == "3" and chosen.settings["learner"].torch_threads == 3


def test_a_preset_that_pins_the_threads_is_left_alone(plan_on: Callable[..., Plan]) -> None:
    plan = plan_on(16, "--env", "CartPole-v1", "--actors", "2")  # the vector preset pins 1
    assert "TORCH_THREADS" not in plan.env["learner"] and plan.settings["learner"].torch_threads == 1


def test_the_cgroup_quota_reads_whole_cores_and_none_when_unset() -> None:
    assert cpu_quota("max", "100000") is None  # cgroup v2, no limit
    assert cpu_quota("-1", "100000\n") is None  # cgroup v1, no limit
    assert cpu_quota("150000", "100000") == 2  # --cpus 1.5: two threads
    assert cpu_quota("50000", "100000") == 1
    assert cpu_quota("400000", "100000") == 4
    assert cpu_quota("", "") is None


def test_a_learner_alone_takes_its_container_quota_or_all_cores_but_one(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    assert usable_cores(tmp_path) == 8  # no cgroup files: every core but one, capped
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert usable_cores(tmp_path) == 1  # a 2-core host shared with the replay and the actors: 1, as before
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(6)))
    assert usable_cores(tmp_path) == 5
    (tmp_path / "cpu").mkdir()
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    (tmp_path / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert usable_cores(tmp_path) == 5  # v1 without a quota
    (tmp_path / "cpu" / "cpu.cfs_quota_us").write_text("400000\n")
    assert usable_cores(tmp_path) == 4  # v1, a 4-core limit: the pod's budget is the learner's own
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert usable_cores(tmp_path) == 5  # v2 is read first
    (tmp_path / "cpu.max").write_text("100000 100000\n")
    assert usable_cores(tmp_path) == 1
    (tmp_path / "cpu.max").write_text("1600000 100000\n")
    assert usable_cores(tmp_path) == 6  # a quota above the affinity: the affinity
