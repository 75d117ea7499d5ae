"""Mario reward options: scale, flag bonus, death penalty and clip, on the pure rule and on the real emulator."""

from __future__ import annotations

import math

import pytest

from flywheel.envs import make_env
from flywheel.envs.mario import MarioConfig, MarioEnv

NOOP, RIGHT = 0, 1  # indices in the "simple" action set


def test_defaults_are_the_documented_recipe() -> None:
    config = MarioConfig()
    assert (config.reward_scale, config.flag_bonus, config.death_penalty, config.reward_clip) == (0.1, 50.0, 50.0, None)


def test_scale_alone_multiplies_the_builtin_reward() -> None:
    config = MarioConfig(reward_scale=0.25, flag_bonus=0.0, death_penalty=0.0)
    assert config.shape_reward(12.0, flag=False, death=False) == pytest.approx(3.0)
    assert config.shape_reward(-15.0, flag=False, death=True) == pytest.approx(-3.75)


def test_flag_bonus_is_added_before_scaling() -> None:
    config = MarioConfig(reward_scale=0.1, flag_bonus=50.0, death_penalty=0.0)
    assert config.shape_reward(8.0, flag=True, death=False) == pytest.approx(5.8)
    assert config.shape_reward(8.0, flag=False, death=False) == pytest.approx(0.8)


def test_death_penalty_is_subtracted_before_scaling() -> None:
    config = MarioConfig(reward_scale=0.1, flag_bonus=0.0, death_penalty=50.0)
    assert config.shape_reward(-15.0, flag=False, death=True) == pytest.approx(-6.5)
    assert config.shape_reward(-15.0, flag=False, death=False) == pytest.approx(-1.5)


def test_clip_bounds_the_shaped_reward_both_ways() -> None:
    config = MarioConfig(reward_scale=1.0, flag_bonus=50.0, death_penalty=50.0, reward_clip=1.0)
    assert config.shape_reward(8.0, flag=True, death=False) == 1.0
    assert config.shape_reward(-15.0, flag=False, death=True) == -1.0
    assert config.shape_reward(0.5, flag=False, death=False) == 0.5


@pytest.mark.parametrize(("option", "message"), [
    ("reward_scale=0", "reward_scale must be a finite number > 0"),
    ("reward_scale=-1", "reward_scale must be a finite number > 0"),
    ("flag_bonus=-5", "flag_bonus must be a finite number >= 0"),
    ("death_penalty=-1", "death_penalty must be a finite number >= 0"),
    ("reward_clip=0", "reward_clip must be a finite number > 0 or None"),
    ("reward_scale=\"big\"", "reward_scale must be float"),
    ("reward_bonus=1", "unknown Mario option"),
])
def test_bad_reward_options_are_refused_with_one_line(option: str, message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        make_env(f"SuperMarioBros-1-1-v0?{option}")


def _play_until_end(env: MarioEnv, action: int, limit: int = 3000) -> list[tuple[float, bool, dict]]:
    env.reset(seed=0)
    steps = []
    for _ in range(limit):
        _, reward, terminated, truncated, info = env.step(action)
        steps.append((reward, terminated, info))
        if terminated or truncated:
            break
    return steps


@pytest.mark.slow  # thousands of emulator frames
def test_real_death_gets_the_penalty_and_other_steps_only_the_scale() -> None:
    """Standing still on 1-1, the first Goomba walks into Mario: the last step is a death without a flag."""
    env = make_env("SuperMarioBros-1-1-v0?reward_scale=0.1,flag_bonus=50,death_penalty=50")
    try:
        steps = _play_until_end(env, NOOP)
    finally:
        env.close()
    reward, terminated, info = steps[-1]
    assert terminated and not info["flag_get"] and not info["success"]
    assert info["end"] == "clock" and info["time"] == 0  # standing still, Mario dies when the level clock runs out
    assert info["raw_reward"] <= -15  # the library's own death penalty is in the raw sum
    assert reward == pytest.approx((info["raw_reward"] - 50.0) * 0.1)
    for reward, _, info in steps[:-1]:
        assert reward == pytest.approx(info["raw_reward"] * 0.1)


def test_neutral_options_reproduce_the_library_reward() -> None:
    env = make_env("SuperMarioBros-1-1-v0?reward_scale=1,flag_bonus=0,death_penalty=0")
    try:
        steps = _play_until_end(env, RIGHT, limit=200)
    finally:
        env.close()
    assert len(steps) > 10
    assert all(reward == info["raw_reward"] for reward, _, info in steps)
    assert math.isclose(sum(r for r, _, _ in steps), sum(i["raw_reward"] for _, _, i in steps))
