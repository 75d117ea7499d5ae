"""Atari through ale-py: Pong preprocessing against the raw emulator, no-op starts, FIRE on reset, episodic life,
reward clipping, the frame cap, evaluation settings, the Atari preset of flywheel run, ids."""

from __future__ import annotations

import os
from pathlib import Path

import gymnasium
import numpy as np
import pytest

from flywheel.envs import UnknownEnvironmentError, env_family, env_spec, evaluation_env_id, make_env, make_vector_env
from flywheel.envs.atari import AtariConfig, AtariEnv, atari_env_ids, register_ale
from flywheel.envs.preprocessing import resize_area
from flywheel.evaluation import evaluate


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
    env = AtariEnv("ALE/Pong-v5", noop_max=0, fire_reset=False, repeat_action_probability=0.0, clip_rewards=False)
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
    env = make_env("PongNoFrameskip-v4")
    assert isinstance(env, AtariEnv)
    try:
        frames, noops, first = {}, {}, {}
        for seed in range(8):
            first[seed], info = env.reset(seed=seed)
            noops[seed] = info["noops"]
            frames[seed] = env._ale.getEpisodeFrameNumber()  # frames played before the first observation
        obs, info = env.reset(seed=3)
        assert info["noops"] == noops[3] and env._ale.getEpisodeFrameNumber() == frames[3]
        assert np.array_equal(obs, first[3])  # the same seed, the same start (no sticky actions in v4)
        env.reset()  # without a seed the generator goes on: another start
    finally:
        env.close()
    assert all(1 <= n <= 30 for n in noops.values()) and len(set(noops.values())) > 2
    assert all(frames[s] == noops[s] + 2 * 4 for s in frames)  # then FIRE and RIGHT, 4 frames each (Pong has FIRE)
    quiet = make_env("ALE/Pong-v5", noop_max=0, fire_reset=False)
    try:
        _, info = quiet.reset(seed=0)
        assert info["noops"] == 0 and quiet._ale.getEpisodeFrameNumber() == 0  # type: ignore[attr-defined]
    finally:
        quiet.close()


def test_fire_on_reset_only_for_games_with_fire() -> None:
    """Breakout's action 1 is FIRE: reset serves the ball (FIRE, then action 2); Freeway has no FIRE: no press."""
    breakout = make_env("BreakoutNoFrameskip-v4")
    freeway = make_env("FreewayNoFrameskip-v4")
    assert isinstance(breakout, AtariEnv) and isinstance(freeway, AtariEnv)
    try:
        assert breakout.get_action_meanings()[1] == "FIRE" and breakout.fire_reset
        assert "FIRE" not in freeway.get_action_meanings() and not freeway.fire_reset
        _, info = breakout.reset(seed=4)
        assert breakout._ale.getEpisodeFrameNumber() == info["noops"] + 8
        _, info = freeway.reset(seed=4)
        assert freeway._ale.getEpisodeFrameNumber() == info["noops"]
    finally:
        breakout.close()
        freeway.close()
    with pytest.raises(ValueError, match="fire_reset=true needs FIRE"):
        make_env("FreewayNoFrameskip-v4?fire_reset=true")


def _noop_game(env_id: str, steps: int) -> tuple[int, bool, int]:
    """NOOP only: (lives lost, whether the game ended, agent steps played)."""
    env = make_env(env_id)
    try:
        _, info = env.reset(seed=0)
        start = lives = info["lives"]
        for step in range(1, steps + 1):
            _, _, terminated, truncated, info = env.step(0)
            assert info["lives"] <= lives
            lives = info["lives"]
            if "episode" in info:
                return start - lives, True, step
            assert not (terminated or truncated)  # no episodic life: a lost life goes on in the same step
        return start - lives, False, steps
    finally:
        env.close()


def test_fire_after_a_lost_life_without_episodic_life() -> None:
    """Evaluation settings: after each lost life FIRE serves again, so a policy that never fires still plays the
    game out; with FIRE off the ball is never served and the game stands still."""
    lost, over, steps = _noop_game("BreakoutNoFrameskip-v4?terminal_on_life_loss=false", 5000)
    assert lost == 5 and over and steps < 5000
    lost, over, _ = _noop_game("BreakoutNoFrameskip-v4?terminal_on_life_loss=false,fire_reset=false", 1000)
    assert lost == 0 and not over


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


def test_clipped_rewards_and_the_real_score() -> None:
    """The same seed and actions with and without clipping: rewards are the sign of the game's points, and the
    reported game return is the unclipped score either way (Space Invaders: 5 to 30 points an alien)."""
    runs = {}
    for clip in (True, False):
        env = make_env(f"SpaceInvadersNoFrameskip-v4?clip_rewards={str(clip).lower()}")
        try:
            env.reset(seed=7)
            rng = np.random.default_rng(7)
            rewards, ended = [], None
            while ended is None:
                _, reward, terminated, truncated, info = env.step(int(rng.integers(6)))
                rewards.append(reward)
                if "episode" in info:
                    ended = info["episode"]
                elif terminated or truncated:
                    env.reset()  # a lost life: the same game goes on
            runs[clip] = (np.array(rewards), ended)
        finally:
            env.close()
    (clipped, game), (raw, raw_game) = runs[True], runs[False]
    assert len(clipped) == len(raw) and raw.max() > 1  # the same game, with points above 1
    np.testing.assert_array_equal(clipped, np.sign(raw))
    assert game == raw_game and game["return"] == raw.sum() > clipped.sum()


def test_frame_cap_truncates_the_game() -> None:
    assert AtariConfig().max_episode_frames == 108_000  # 27,000 agent steps at frame skip 4
    env = make_env("PongNoFrameskip-v4?max_episode_frames=400,noop_max=0")
    try:
        env.reset(seed=0)
        steps, truncated = 0, False
        while not truncated and steps < 200:
            _, _, terminated, truncated, info = env.step(0)
            steps += 1
        assert truncated and not terminated and "episode" in info
        assert info["episode"]["length"] == steps == (400 - 8) // 4  # Pong serves first: FIRE + RIGHT, 8 frames
        assert env._ale.getEpisodeFrameNumber() == 400  # type: ignore[attr-defined]
    finally:
        env.close()


def test_evaluation_plays_whole_games_with_the_real_score() -> None:
    """flywheel.evaluation on a training id: no episodic life, no clipping; the record is the game's score."""
    assert evaluation_env_id("ALE/Breakout-v5?size=42,clip_rewards=true") == \
        "ALE/Breakout-v5?size=42,clip_rewards=false,terminal_on_life_loss=false"
    assert evaluation_env_id("CartPole-v1") == "CartPole-v1"
    [record] = evaluate("BreakoutNoFrameskip-v4", [3])  # random policy: every action from default_rng(seed)
    env = make_env("BreakoutNoFrameskip-v4", terminal_on_life_loss=False, clip_rewards=False)
    try:
        _, info = env.reset(seed=3)
        rng = np.random.default_rng(3)
        score, length = 0.0, 0
        while "episode" not in info:
            _, reward, terminated, truncated, info = env.step(int(rng.integers(4)))
            score += reward
            length += 1
        assert terminated and info["lives"] == 0 and info["episode"]["return"] == score
    finally:
        env.close()
    assert (record["return"], record["length"], record["end"]) == (score, length, "terminated")


def test_actor_greedy_env_uses_the_evaluation_settings() -> None:
    from flywheel.services.actor.core import build_core
    from flywheel.services.actor.policy import build_policy

    policy = build_policy((4, 84, 84), 4, hidden=32, seed=0)
    core = build_core("ALE/Breakout-v5", 1, policy, n_step=3, gamma=0.99, eval_envs=1, seed=0)
    try:
        train, greedy = core.vec.envs[0].config, core.eval_vec.envs[0].config  # type: ignore[attr-defined,union-attr]
        assert train.terminal_on_life_loss and train.clip_rewards
        assert not greedy.terminal_on_life_loss and not greedy.clip_rewards and greedy.noop_max == 30
    finally:
        core.close()


def test_flywheel_run_picks_the_atari_preset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from flywheel.cli import build_parser
    from flywheel.launch import run as run_module
    from flywheel.launch.runplan import DEFAULT_ENV, Plan

    for name in [n for n in os.environ if n.startswith("FLYWHEEL_")]:
        monkeypatch.delenv(name)

    def plan(env_id: str) -> Plan:
        args = build_parser().parse_args(["run", "--env", env_id, "--checkpoint-dir", str(tmp_path / "ckpt"),
                                          "--base-port", "0", "--http-port", "0"])
        made = run_module.make_plan(args)
        made.remove_socket_dir()
        return made

    atari = plan("BreakoutNoFrameskip-v4")
    from flywheel import presets

    assert presets.name_for_env("ALE/Pong-v5?size=42", "uint8") == "atari"
    assert atari.env["learner"]["PRESET"] == "atari"  # each child reads it; the plan's settings are what they get
    actor, learner, replay = (atari.settings[s] for s in ("actor", "learner", "replay"))
    assert (actor.gamma, actor.n_step) == (0.99, 3)
    assert (learner.lr, learner.adam_eps, learner.batch_size, learner.target_update_interval) == (
        0.0000625, 0.00015, 32, 2000)
    assert (replay.capacity, replay.min_size_to_sample, replay.samples_per_insert) == (
        100_000, 20_000, presets.load("pixel").section("replay")["samples_per_insert"])
    assert atari.env["actor"]["ENV_ID"] == "BreakoutNoFrameskip-v4"  # training settings: the env's defaults
    assert atari.actor_extra[0]["EVAL_ENVS"] == "1"  # actor-0's greedy env (evaluation settings, see above)
    mario = plan(DEFAULT_ENV)
    assert mario.settings["actor"].gamma == 0.9 and mario.settings["learner"].lr == 0.00025  # Mario keeps its own


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
