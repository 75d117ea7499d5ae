"""The actor with the start-state curriculum on real Mario envs: settings, training envs only, own stats, telemetry."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch
import zmq
from pydantic import ValidationError

from flywheel.envs import StartStateConfig, StartStatesUnsupported, env_spec
from flywheel.envs.start_states import StartStateCurriculum
from flywheel.envs.vector import PROGRESS_METRIC, SUCCESS_METRIC, EpisodeEnd, InProcessVector, VectorStep, curriculum_of
from flywheel.services.actor.core import ActorCore, build_core
from flywheel.services.actor.policy import build_policy
from flywheel.services.actor.report import StepRate, actor_report
from flywheel.services.actor.settings import ActorSettings
from flywheel.services.actor.startup import build_acting
from flywheel.services.actor.transport import LeaseClient, TransitionSender, WeightsReceiver
from flywheel.transport import FaultCounter

MARIO = "SuperMarioBros-1-1-v0?size=42,max_episode_steps=30"
CURRICULUM = StartStateConfig(share=0.5, margin=1000.0, window=4, pool=1)


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)


def mario_core(start_states: StartStateConfig | None, eval_envs: int = 0) -> ActorCore:
    spec = env_spec(MARIO)
    policy = build_policy(spec.obs_shape, spec.n_actions, hidden=32, seed=0)
    core = build_core(MARIO, 2, policy, n_step=3, gamma=0.99, eval_envs=eval_envs, seed=5, start_states=start_states)
    core.epsilon = 1.0  # random actions: Mario mostly moves right
    return core


def report(core: ActorCore) -> tuple[dict[str, float], dict[str, float]]:
    """The actor's telemetry for ``core`` (sockets that nobody answers: only the core's figures matter)."""
    ctx = zmq.Context()
    faults = FaultCounter("actor")
    sender = TransitionSender(ctx, "inproc://rows", "actor-t", hwm=10, on_full="drop", batch_rows=8)
    weights = WeightsReceiver(ctx, "inproc://weights", core.policy, faults)
    lease = LeaseClient(ctx, "inproc://lease", "actor-t", faults)
    try:
        counters, gauges = actor_report(core, sender, weights, lease, paused=False, rate=StepRate(0.0), now=1.0)
        return counters.as_dict(), gauges.as_dict()
    finally:
        for part in (sender, weights, lease):
            part.close()
        ctx.term()


@pytest.fixture(scope="module")
def played() -> Iterator[ActorCore]:
    """A Mario core with the curriculum and a greedy env, stepped until it has had restarted and level-start
    episodes."""
    core = mario_core(CURRICULUM, eval_envs=1)
    try:
        for _ in range(600):
            core.step()
            if core.stats.restarts.episodes >= 2 and core.stats.episodes >= 4:
                break
        yield core
    finally:
        core.close()


def test_only_training_envs_restart(played: ActorCore) -> None:
    assert all(isinstance(env, StartStateCurriculum) for env in played.vec.envs)  # type: ignore[attr-defined]
    assert played.eval_vec is not None
    assert not any(isinstance(env, StartStateCurriculum) for env in played.eval_vec.envs)  # type: ignore[attr-defined]
    assert played.stats.eval_episodes >= 1  # the greedy env played whole episodes from the level start


def test_restarted_episodes_are_kept_out_of_the_level_start_stats(played: ActorCore) -> None:
    stats, restarts = played.stats, played.stats.restarts
    assert restarts.episodes >= 2 and stats.episodes >= 4
    assert len(restarts.recent) == stats.episodes + restarts.episodes
    assert sum(restarts.recent) == restarts.episodes
    assert len(stats.returns) == len(stats.measured.progress) == stats.episodes  # level-start episodes only
    assert len(restarts.measured.progress) == restarts.episodes
    assert len(restarts.returns) == restarts.episodes and min(restarts.start_progress) > 40  # x past the start


def test_telemetry_reports_the_curriculum(played: ActorCore) -> None:
    counters, gauges = report(played)
    restarts = played.stats.restarts
    assert counters["episodes_total"] == played.stats.episodes
    assert counters["restarted_episodes_total"] == restarts.episodes
    assert gauges["start_state_share_actual"] == pytest.approx(restarts.episodes / len(restarts.recent))
    assert gauges["start_state_progress_mean"] > 40
    assert gauges["start_states_kept"] == 2  # pool 1 on each of the 2 env slots
    assert "start_state_death_point_mean" not in gauges  # the frontier choice has no death points
    assert "restarted_return_mean" in gauges
    # the training distance of restarted episodes, shown apart from the level-start episodes'
    assert gauges["restarted_progress_mean"] > 40 and 0 <= gauges["restarted_success_rate"] <= 1
    assert gauges["episode_progress_mean"] > 0 and gauges["episode_progress_max"] >= gauges["episode_progress_mean"]


def test_without_the_curriculum_nothing_is_wrapped_or_reported() -> None:
    core = mario_core(None)
    try:
        assert not any(isinstance(env, StartStateCurriculum) for env in core.vec.envs)  # type: ignore[attr-defined]
        counters, gauges = report(core)
        assert "restarted_episodes_total" not in counters
        assert not {"start_state_share_actual", "start_states_kept", "restarted_progress_mean"} & set(gauges)
    finally:
        core.close()


@pytest.mark.parametrize(("name", "value"), [("start_state_share", 1.5), ("start_state_share", -0.5),
                                             ("start_state_margin", -1.0), ("start_state_margin", float("nan")),
                                             ("start_state_window", 0), ("start_state_pool", 0),
                                             ("start_state_choice", "ends"), ("start_state_death_epsilon", 1.5)])
def test_settings_validation(name: str, value: float) -> None:
    with pytest.raises(ValidationError, match=name):
        ActorSettings(**{name: value})


def test_settings_give_the_curriculum_only_when_on() -> None:
    assert ActorSettings().start_states() is None  # default: off
    on = ActorSettings(start_state_share=0.25, start_state_margin=64, start_state_window=5, start_state_pool=3)
    assert on.start_states() == StartStateConfig(share=0.25, margin=64.0, window=5, pool=3)
    deaths = ActorSettings(start_state_share=0.25, start_state_choice="deaths", start_state_death_epsilon=0.05)
    assert deaths.start_states() == StartStateConfig(share=0.25, choice="deaths", death_epsilon=0.05)


def test_the_deaths_choice_sends_where_low_exploration_level_start_episodes_die() -> None:
    """Slot 0 explores at 1.0 (too much to count), slot 1 at 0.05: the death points are slot 1's level-start
    episodes that ended short of the flag, and every env's curriculum is given them each time 8 more arrive."""
    core = mario_core(StartStateConfig(share=0.5, margin=50.0, window=4, pool=1, choice="deaths",
                                       death_epsilon=0.1))
    core.epsilon = np.array([1.0, 0.05])
    seen: list[EpisodeEnd] = []
    step_wait = core.vec.step_wait

    def spy(group: int) -> VectorStep:
        result = step_wait(group)
        seen.extend(result.episodes)
        return result

    core.vec.step_wait = spy  # type: ignore[method-assign]
    try:
        assert core.deaths is not None
        for _ in range(3000):
            core.step()
            if core.deaths.counted >= 16:
                break
        expected = [e.metrics[PROGRESS_METRIC] for e in seen
                    if e.slot == 1 and not e.restarted and not e.metrics[SUCCESS_METRIC]]
        assert len(expected) >= 16 and list(core.deaths.points) == expected
        assert any(e.slot == 0 and not e.restarted for e in seen)  # slot 0's deaths were there, and left out
        assert any(e.restarted for e in seen)  # restarted episodes too
        sent = expected[:len(expected) // 8 * 8]
        assert isinstance(core.vec, InProcessVector)
        for env in core.vec.envs:
            curriculum = curriculum_of(env)
            assert curriculum is not None and curriculum.targets == sent
        assert report(core)[1]["start_state_death_point_mean"] == pytest.approx(np.mean(expected))
    finally:
        core.close()


def test_an_env_that_cannot_save_state_stops_the_actor_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    policy = build_policy((4,), 2, hidden=32, seed=0)
    with pytest.raises(StartStatesUnsupported, match="'CartPole-v1' cannot"):
        build_core("CartPole-v1", 2, policy, n_step=3, gamma=0.99, start_states=StartStateConfig(share=0.5))
    with pytest.raises(SystemExit):
        build_acting(ActorSettings(env_id="CartPole-v1", num_envs=2, start_state_share=0.5))
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "'CartPole-v1' cannot" in line and "start_state_share" in line
