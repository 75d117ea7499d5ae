"""Atari through ale-py: Pong preprocessing against the raw emulator, episodic life, reward clipping, ids."""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest

from flywheel.envs import UnknownEnvironmentError, env_family, env_spec, make_env, make_vector_env
from flywheel.envs.atari import AtariEnv, atari_env_ids, register_ale
from flywheel.envs.preprocessing import resize_area


def test_pong_spec_and_shapes() -> None:
    assert env_family("ALE/Pong-v5") == "atari" and env_family("PongNoFrameskip-v4") == "atari"
    spec = env_spec("ALE/Pong-v5")
    assert (spec.obs_shape, spec.obs_dtype, spec.n_actions) == ((4, 84, 84), "uint8", 6)
    env = make_env("ALE/Pong-v5", seed=1)
    try:
        obs, info = env.reset(seed=1)
        assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8 and "lives" in info
        assert np.array_equal(obs[0], obs[3])  # a reset stack repeats the first frame
        for _ in range(50):
            obs, reward, terminated, truncated, _ = env.step(env.action_space.sample())
            assert obs.shape == (4, 84, 84) and reward in (-1.0, 0.0, 1.0)
            assert not (terminated or truncated)
        assert env.get_action_meanings() == ["NOOP", "FIRE", "RIGHT", "LEFT", "RIGHTFIRE", "LEFTFIRE"]
        assert not np.array_equal(obs[0], obs[3])
    finally:
        env.close()


def test_skip_four_with_max_pool_matches_the_raw_emulator() -> None:
    """Each agent step = 4 emulator frames; the newest stacked frame is resize(max(frame 3, frame 4))."""
    register_ale()
    raw = gymnasium.make("ALE/Pong-v5", frameskip=1, obs_type="grayscale", repeat_action_probability=0.0)
    env = AtariEnv("ALE/Pong-v5", noop_max=0, repeat_action_probability=0.0, clip_rewards=False)
    try:
        raw.reset(seed=5)
        obs, _ = env.reset(seed=5)
        first = raw.unwrapped.ale.getScreenGrayscale()
        np.testing.assert_array_equal(obs[-1], resize_area(first, 84, 84))
        rng = np.random.default_rng(0)
        previous = obs
        for _ in range(120):
            action = int(rng.integers(6))
            frames, total = [], 0.0
            for _ in range(4):
                frame, reward, *_ = raw.step(action)
                frames.append(frame)
                total += float(reward)
            obs, reward, *_ = env.step(action)
            np.testing.assert_array_equal(obs[-1], resize_area(np.maximum(frames[2], frames[3]), 84, 84))
            np.testing.assert_array_equal(obs[:-1], previous[1:])  # the stack shifts by one
            assert reward == total
            previous = obs
    finally:
        env.close()
        raw.close()


def test_noop_starts_differ_by_seed_and_repeat_with_it() -> None:
    env = make_env("ALE/Pong-v5")
    assert isinstance(env, AtariEnv)
    try:
        frames = {}
        for seed in range(8):
            env.reset(seed=seed)
            frames[seed] = env._ale.getEpisodeFrameNumber()  # frames played before the first observation
        env.reset(seed=3)
        assert env._ale.getEpisodeFrameNumber() == frames[3]
    finally:
        env.close()
    assert all(1 <= f <= 30 for f in frames.values()) and len(set(frames.values())) > 2


def test_episodic_life_and_game_return() -> None:
    """Breakout: a lost life ends the training episode, the game goes on; game over reports the game's return."""
    env = make_env("ALE/Breakout-v5", seed=0, clip_rewards=False, repeat_action_probability=0.0)
    try:
        env.reset(seed=0)
        rng = np.random.default_rng(0)
        life_losses, rewards, steps = 0, 0.0, 0
        while steps < 20_000:
            _, reward, terminated, truncated, info = env.step(int(rng.integers(4)))
            rewards += reward
            steps += 1
            if terminated or truncated:
                if "episode" in info:
                    break
                assert info["life_lost"] and info["lives"] >= 1
                life_losses += 1
                obs, info = env.reset()
                assert info["lives"] == 5 - life_losses  # the same game continues
        assert "episode" in info and life_losses == 4
        assert info["episode"]["return"] == rewards and info["episode"]["length"] == steps
    finally:
        env.close()


def test_vector_reports_games_not_lives_and_clips() -> None:
    vec = make_vector_env("ALE/Breakout-v5?repeat_action_probability=0", 2, seed=0)
    try:
        vec.reset()
        rng = np.random.default_rng(0)
        done_steps, episodes = 0, []
        for _ in range(6000):
            res = vec.step(rng.integers(4, size=2))
            assert set(np.unique(res.reward)) <= {-1.0, 0.0, 1.0}
            done_steps += int(res.terminated.sum())
            episodes += res.episodes
            if episodes:
                break
        assert episodes and done_steps >= 5  # five lives: five training episodes per game
        assert episodes[0].length > 0
    finally:
        vec.close()


def test_atari_ids_and_options_errors() -> None:
    ids = atari_env_ids()
    assert "ALE/Pong-v5" in ids and "PongNoFrameskip-v4" in ids and len(ids) > 100
    with pytest.raises(UnknownEnvironmentError, match="did you mean 'ALE/Pong-v5'"):
        make_env("ALE/Pongg-v5")
    with pytest.raises(TypeError, match="unknown Atari option"):
        env_spec("ALE/Pong-v5?frame_skipp=4")
    with pytest.raises(TypeError, match="clip_rewards must be bool"):
        env_spec("ALE/Pong-v5?clip_rewards=maybe")
    assert env_spec("ALE/Pong-v5?stack=2,size=64").obs_shape == (2, 64, 64)
