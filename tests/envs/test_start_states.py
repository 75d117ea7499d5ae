"""The start-state curriculum on real emulators: Mario (nes-py's slot, two emulators) and Atari (cloneState)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from flywheel.envs import StartStateConfig, StartStatesUnsupported, make_env, make_vector_env, start_states_refusal
from flywheel.envs.mario import MarioEnv
from flywheel.envs.nes_states import NesStartStates
from flywheel.envs.start_states import StartStateCurriculum
from flywheel.envs.vector import EpisodeEnd, InProcessVector, VectorEnv

MARIO = "SuperMarioBros-1-1-v0"
LEVEL_START_X = 40  # Mario's x at the start of 1-1


def run_and_jump(t: int) -> int:
    """Hold right + B (run), press A (jump) for 10 steps of every 12 ("simple" actions 4 and 3)."""
    return 4 if t % 12 < 10 else 3


def curriculum(share: float, margin: float = 50.0, **options: Any) -> StartStateCurriculum:
    env = make_env(MARIO, max_episode_steps=150, **options)
    return StartStateCurriculum(env, StartStateConfig(share=share, margin=margin, window=1, pool=4), MARIO)


def play(env: StartStateCurriculum, offset: int = 0, script: Callable[[int], int] = run_and_jump
         ) -> tuple[list[int], list[bool]]:
    """One scripted episode (its t-th action is ``script(offset + t)``): x after each step, kept or not."""
    xs, kept = [], []
    t = 0
    while True:
        saved_before = env.saved
        _, _, terminated, truncated, info = env.step(script(offset + t))
        xs.append(info["x_pos"])
        kept.append(env.saved and not saved_before)
        t += 1
        if terminated or truncated:
            return xs, kept


def test_share_one_restarts_at_a_kept_state_and_replays_the_same_game() -> None:
    env = curriculum(share=1.0)
    try:
        _, info = env.reset(seed=3)
        assert not info["restarted"] and info["x_pos"] == LEVEL_START_X
        first, kept = play(env)
        assert not any(kept) and max(first) > LEVEL_START_X + 100  # no frontier yet: nothing kept
        _, info = env.reset()  # nothing kept yet: the level start, whatever the share
        assert not info["restarted"] and info["x_pos"] == LEVEL_START_X
        second, kept = play(env)
        assert second == first and info["start_states_kept"] == 0
        saved_at = kept.index(True)  # the first step past frontier - margin
        assert second[saved_at] >= max(first) - 50 and env.kept[0].progress == second[saved_at]
        obs, info = env.reset()
        assert info["restarted"] and info["start_progress"] == info["x_pos"] == second[saved_at] > LEVEL_START_X
        assert obs.shape == (4, 84, 84) and all(np.array_equal(obs[0], frame) for frame in obs)
        third, _ = play(env, offset=saved_at + 1)
        assert third == second[saved_at + 1:]  # the very state: the same actions play the same game from there
    finally:
        env.close()


def test_share_zero_never_restarts_and_level_starts_stay_exact() -> None:
    env = curriculum(share=0.0)
    try:
        start_obs, _ = env.reset(seed=3)
        for _ in range(4):
            play(env)
            obs, info = env.reset()
            assert not info["restarted"] and info["start_progress"] == info["x_pos"] == LEVEL_START_X
            assert np.array_equal(obs, start_obs)
        assert len(env.kept) == 1  # a state was kept, on one emulator; level starts were played on the other
        assert isinstance(env.states, NesStartStates) and len(env.states.emulators) == 2
    finally:
        env.close()


def test_a_kept_state_is_replaced_once_it_has_been_kept_for_window_episodes() -> None:
    env = make_env(MARIO, max_episode_steps=150)
    wrapped = StartStateCurriculum(env, StartStateConfig(share=0.0, margin=50.0, window=2, pool=1), MARIO)
    try:
        wrapped.reset(seed=3)
        kept_in = []
        for _ in range(6):  # the same scripted episode every time: the frontier never moves
            play(wrapped)
            kept_in.append(wrapped.kept[0].episode if wrapped.kept else None)
            wrapped.reset()
        assert kept_in == [None, 1, 1, 3, 3, 5]  # kept in the 2nd episode, then replaced every 2 episodes
        assert isinstance(wrapped.states, NesStartStates) and wrapped.states.rebuilds == 2
    # kept on emulator A, level starts on a new B; kept on B, A rebuilt; kept on A, B rebuilt (by the last reset)
    finally:
        wrapped.close()


def test_the_level_start_is_rebuilt_exactly_when_no_emulator_holds_it() -> None:
    env = make_env(MARIO)
    assert isinstance(env, MarioEnv)
    try:
        states = env.start_states()
        assert isinstance(states, NesStartStates)
        start_obs, start_info = env.reset(seed=0)
        start_ram = np.array(env._nes.ram)
        for t in range(8):
            env.step(run_and_jump(t))
        states.save(0)  # emulator A now holds a kept state
        states.level_start()
        obs, info = env.reset()  # on emulator B, built at the level start
        assert np.array_equal(obs, start_obs) and info == start_info and states.rebuilds == 0
        for t in range(8):
            env.step(run_and_jump(t))
        states.save(0)  # B holds the kept state; A's is stale
        states.level_start()
        obs, info = env.reset()
        assert states.rebuilds == 1 and states.holds.count("start") == 1
        assert np.array_equal(obs, start_obs) and info == start_info and np.array_equal(env._nes.ram, start_ram)
        obs, info = states.restore(0)
        assert info["x_pos"] > LEVEL_START_X
    finally:
        env.close()


def three_scripted_episodes(vec: VectorEnv, death: float | None = None) -> list[EpisodeEnd]:
    """Reset a one-slot Mario vector (and send it the death point ``death``) and play the script until three
    episodes have ended."""
    vec.reset()
    if death is not None:
        vec.set_start_targets([death])  # the first episode drew before it came: it keeps nothing (no frontier yet)
    episodes: list[EpisodeEnd] = []
    t = 0
    while len(episodes) < 3:
        step = vec.step(np.array([run_and_jump(t)]))
        t = 0 if step.episodes else t + 1
        episodes += step.episodes
    return episodes


def test_the_deaths_choice_keeps_the_state_margin_before_a_drawn_death_point() -> None:
    env = StartStateCurriculum(make_env(MARIO, max_episode_steps=150),
                               StartStateConfig(share=1.0, margin=50.0, window=1, pool=4, choice="deaths"), MARIO)
    try:
        env.reset(seed=3)
        first, kept = play(env)
        assert not any(kept)
        death = float(first[len(first) // 2])  # a point the script passes well before its furthest
        assert death - 50 > LEVEL_START_X and death < max(first) - 60
        env.set_targets([death, float("nan")])
        assert env.targets == [death]  # what is not a finite number is dropped
        _, info = env.reset()  # nothing kept yet: the level start, with the death point drawn
        assert not info["restarted"] and env.target == death
        second, kept = play(env)
        saved_at = kept.index(True)
        assert second[saved_at] >= death - 50 > second[saved_at - 1]  # the first step past death - margin
        assert env.kept[0].progress == second[saved_at] < max(first) - 50  # not where the frontier rule keeps
        _, info = env.reset()
        assert info["restarted"] and info["start_progress"] == second[saved_at]
    finally:
        env.close()


def test_the_deaths_choice_needs_an_env_with_a_progress_measure() -> None:
    with pytest.raises(ValueError, match="'deaths' needs an env with a progress measure.*'ALE/Breakout-v5' has none"):
        make_vector_env("ALE/Breakout-v5", 1, start_states=StartStateConfig(share=0.5, choice="deaths"))


def death_point_restart(vec: VectorEnv, death: float) -> EpisodeEnd:
    """Reset a one-slot Mario vector (deaths choice, margin 50), send it one death point, play the script to the
    third episode's end: that episode began at the state kept in the second."""
    episodes = three_scripted_episodes(vec, death)
    assert [e.restarted for e in episodes] == [False, False, True]
    return episodes[2]


DEATHS = StartStateConfig(share=1.0, margin=50.0, window=1, choice="deaths")


def test_a_vector_gives_its_envs_the_death_points() -> None:
    vec = make_vector_env(f"{MARIO}?max_episode_steps=150", 1, seed=3, start_states=DEATHS)
    try:
        restarted = death_point_restart(vec, 200.0)
        assert 150 <= restarted.start_progress < 170  # the script dies near x 314: the frontier rule keeps >= 264
    finally:
        vec.close()


@pytest.mark.system
def test_subprocess_workers_get_the_death_points_with_a_step() -> None:
    vec = make_vector_env(f"{MARIO}?max_episode_steps=150", 1, seed=3, mode="subprocess", workers=1, groups=1,
                          start_states=DEATHS)
    try:
        restarted = death_point_restart(vec, 200.0)
        assert 150 <= restarted.start_progress < 170
    finally:
        vec.close()


def test_vector_marks_restarted_episodes() -> None:
    vec = make_vector_env(f"{MARIO}?max_episode_steps=150", 1, seed=3,
                          start_states=StartStateConfig(share=1.0, margin=50.0, window=1))
    assert isinstance(vec, InProcessVector) and isinstance(vec.envs[0], StartStateCurriculum)
    try:
        episodes = three_scripted_episodes(vec)
        assert [e.restarted for e in episodes] == [False, False, True]
        assert episodes[2].start_progress > LEVEL_START_X and episodes[2].length < episodes[1].length
        assert episodes[0].metrics["start_states"] == 0 and episodes[1].metrics["start_states"] == 1
        assert EpisodeEnd.from_json(episodes[2].to_json()) == episodes[2]  # as subprocess workers send it
    finally:
        vec.close()


@pytest.mark.system
def test_subprocess_workers_run_the_curriculum() -> None:
    vec = make_vector_env(f"{MARIO}?max_episode_steps=150", 1, seed=3, mode="subprocess", workers=1, groups=1,
                          start_states=StartStateConfig(share=1.0, margin=50.0, window=1))
    try:
        episodes = three_scripted_episodes(vec)
        assert [e.restarted for e in episodes] == [False, False, True] and episodes[2].start_progress > LEVEL_START_X
    finally:
        vec.close()


def test_atari_games_that_began_at_a_kept_state_are_marked() -> None:
    """Breakout with episodic life: a game (5 lives) restarts only where a new game begins, and its end says so."""
    vec = make_vector_env("ALE/Breakout-v5?repeat_action_probability=0", 1, seed=1,
                          start_states=StartStateConfig(share=1.0, margin=5.0, window=2, pool=3))
    try:
        vec.reset()
        rng = np.random.default_rng(0)
        games: list[EpisodeEnd] = []
        while len(games) < 3:
            games += vec.step(rng.integers(4, size=1)).episodes
        assert [g.restarted for g in games] == [False, True, True]
        assert all(g.start_progress > 0 for g in games[1:]) and games[0].start_progress == 0
    finally:
        vec.close()


def test_atari_pool_restarts_from_cloned_states() -> None:
    env = StartStateCurriculum(make_env("ALE/Breakout-v5", repeat_action_probability=0.0),
                               StartStateConfig(share=1.0, margin=5.0, window=2, pool=3), "ALE/Breakout-v5")
    try:
        env.reset(seed=1)
        rng = np.random.default_rng(0)
        restarted = []
        for _ in range(8):
            while True:
                _, _, terminated, truncated, info = env.step(int(rng.integers(4)))
                if terminated or truncated:
                    break
            _, info = env.reset()
            restarted.append(info["restarted"])
        assert 1 <= len(env.kept) <= 3 and any(restarted)
        assert all(k.progress > 0 for k in env.kept)
    finally:
        env.close()


@pytest.mark.parametrize("env_id", ["CartPole-v1", "Snake-v0", "SuperMarioBros-v0", "SuperMarioBrosRandomStages-v0"])
def test_envs_that_cannot_save_state_are_refused_naming_the_id(env_id: str) -> None:
    with pytest.raises(StartStatesUnsupported, match=f"'{env_id}' cannot"):
        make_vector_env(env_id, 1, start_states=StartStateConfig(share=0.5))
    if env_id != "SuperMarioBrosRandomStages-v0":  # (32 emulators: seconds to build)
        make_vector_env(env_id, 1, start_states=StartStateConfig(share=0.0)).close()  # share 0: off, no error


@pytest.mark.parametrize(("env_id", "refused"), [
    ("SuperMarioBros-1-1-v0?size=42,crop_top=32", None), ("SuperMarioBros-8-4-v3", None), ("ALE/Pong-v5", None),
    ("SuperMarioBros-v0", "only single-stage ids"), ("SuperMarioBrosRandomStages-v1", "single-stage"),
    ("Snake-v0", "natively vectorised"), ("MettaGrid-v0", "natively vectorised"),
])
def test_which_ids_can_keep_start_states_is_known_from_the_id(env_id: str, refused: str | None) -> None:
    """One rule for the vector env's refusal and the preset a Mario id gets (mario only where states are kept)."""
    from flywheel.presets import name_for_env

    why = start_states_refusal(env_id)
    assert why is None if refused is None else refused in (why or "")
    if env_id.startswith("SuperMarioBros"):
        assert name_for_env(env_id) == ("mario" if refused is None else "pixel")


@pytest.mark.parametrize(("values", "message"), [
    ({"share": 1.5}, "share must be a number in"), ({"share": -0.1}, "share must be"),
    ({"margin": float("inf")}, "margin must be a finite"), ({"margin": -1}, "margin must be"),
    ({"window": 0}, "window must be an integer >= 1"), ({"pool": 2.5}, "pool must be an integer"),
    ({"choice": "ends"}, "choice must be one of frontier, deaths"), ({"death_epsilon": 2}, "death epsilon must be"),
])
def test_config_validation(values: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        StartStateConfig(**values)
