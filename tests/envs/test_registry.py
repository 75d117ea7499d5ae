"""Tests for the env factory on Gymnasium ids, errors, specs and preprocessing helpers."""

from __future__ import annotations

import numpy as np
import pytest

from flywheel.envs import EnvSpec, UnknownEnvironmentError, env_spec, known_env_ids, make_env, preprocessing
from flywheel.envs.measures import Measures

pytestmark = pytest.mark.filterwarnings("error")


def test_cartpole_make_env_shapes_and_dtypes() -> None:
    env = make_env("CartPole-v1", seed=3)
    obs, info = env.reset(seed=3)
    assert isinstance(obs, np.ndarray) and obs.shape == (4,) and obs.dtype == np.float32
    assert isinstance(info, dict)
    obs, reward, terminated, truncated, _ = env.step(env.action_space.sample())
    assert obs.shape == (4,) and obs.dtype == np.float32
    assert isinstance(reward, float) and isinstance(terminated, bool) and isinstance(truncated, bool)
    assert env.observation_space.shape == (4,) and env.observation_space.dtype == np.float32
    env.close()


def test_cartpole_env_spec_values_and_cache() -> None:
    spec = env_spec("CartPole-v1")
    assert spec == EnvSpec("CartPole-v1", (4,), "float32", 2)
    assert env_spec("CartPole-v1") is spec


def test_seeded_resets_are_reproducible() -> None:
    a, _ = make_env("CartPole-v1", seed=7).reset(seed=7)
    b, _ = make_env("CartPole-v1", seed=7).reset(seed=7)
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize(
    "bad", ["CartPol-v1", "SuperMarioBros-9-1-v0", "SuperMarioBros-1-5-v0", "SuperMarioBros-v4", ""]
)
def test_unknown_id_raises_with_known_ids(bad: str) -> None:
    with pytest.raises(UnknownEnvironmentError) as excinfo:
        make_env(bad)
    message = str(excinfo.value)
    assert "\n" not in message
    assert f"unknown environment id {bad!r}" in message
    assert "CartPole-v1" in message and "SuperMarioBros-1-1-v0" in message
    assert "known_env_ids()" in message
    with pytest.raises(UnknownEnvironmentError):
        env_spec(bad)


def test_unknown_id_suggests_close_match() -> None:
    with pytest.raises(UnknownEnvironmentError, match="did you mean 'CartPole-v1'"):
        make_env("CartPol-v1")


def test_unknown_error_is_value_error() -> None:
    assert issubclass(UnknownEnvironmentError, ValueError)


def test_non_discrete_action_space_is_rejected() -> None:
    with pytest.raises(ValueError, match="only Discrete action spaces") as excinfo:
        make_env("Pendulum-v1")
    assert not isinstance(excinfo.value, UnknownEnvironmentError)


def test_discrete_observations_become_one_hot() -> None:
    env = make_env("FrozenLake-v1", seed=0)
    obs, _ = env.reset(seed=0)
    assert obs.dtype == np.float32 and obs.shape == (16,) and obs.sum() == 1.0 and obs[0] == 1.0
    assert env_spec("FrozenLake-v1") == EnvSpec("FrozenLake-v1", (16,), "float32", 4)


def test_known_env_ids_cover_both_families() -> None:
    ids = known_env_ids()
    assert "CartPole-v1" in ids
    for mario in ("SuperMarioBros-v0", "SuperMarioBros-v3", "SuperMarioBros-8-4-v3", "SuperMarioBrosRandomStages-v2"):
        assert mario in ids
    assert len(ids) == len(set(ids))


def test_mario_env_spec_is_cheap_and_option_aware() -> None:
    assert env_spec("SuperMarioBros-1-1-v0") == EnvSpec("SuperMarioBros-1-1-v0", (4, 84, 84), "uint8", 7,
                                                        measures=Measures("furthest x", "flag"))
    assert env_spec("SuperMarioBros-v0", actions="right_only").n_actions == 5
    assert env_spec("SuperMarioBros-v0", actions="complex", stack=2).obs_shape == (2, 84, 84)
    with pytest.raises(ValueError, match="actions must be one of"):
        env_spec("SuperMarioBros-v0", actions="everything")
    with pytest.raises(TypeError, match="unknown Mario option"):
        env_spec("SuperMarioBros-v0", frameskip=4)


@pytest.mark.skipif(not preprocessing.HAVE_CV2, reason="needs opencv to compare against")
def test_numpy_fallback_matches_cv2() -> None:
    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 256, size=(240, 256, 3), dtype=np.uint8)
    grey_cv, grey_np = preprocessing.rgb_to_grey(rgb), preprocessing.rgb_to_grey(rgb, use_cv2=False)
    assert np.abs(grey_cv.astype(int) - grey_np).max() <= 1
    bgrx = np.concatenate([rgb[..., ::-1], np.zeros((240, 256, 1), np.uint8)], axis=-1)
    np.testing.assert_array_equal(preprocessing.bgrx_to_grey(bgrx), grey_cv)
    assert np.abs(preprocessing.bgrx_to_grey(bgrx, use_cv2=False).astype(int) - grey_np).max() == 0
    small_cv = preprocessing.resize_area(grey_cv, 84, 84)
    small_np = preprocessing.resize_area(grey_cv, 84, 84, use_cv2=False)
    assert small_np.shape == small_cv.shape == (84, 84) and small_np.dtype == np.uint8
    assert np.abs(small_cv.astype(int) - small_np).max() <= 1


def test_frame_stack_order() -> None:
    stack = preprocessing.FrameStack(3, 2, 2)
    first = stack.reset(np.full((2, 2), 1, np.uint8))
    assert first.shape == (3, 2, 2) and (first == 1).all()
    out = stack.push(np.full((2, 2), 9, np.uint8))
    assert out[:, 0, 0].tolist() == [1, 1, 9]
    out[0] = 5  # returned stacks are copies
    assert stack.frames[0, 0, 0] == 1
