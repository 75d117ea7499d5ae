"""Snake: the rules (eating grows, walls and the body end it), starting placement, vector equals single, ids."""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest

from flywheel.envs import env_spec, make_env, make_vector_env
from flywheel.envs.snake import SnakeEnv, SnakeVector

UP, RIGHT, DOWN, LEFT = range(4)


def board(size: int = 6, **options: object) -> SnakeVector:
    vec = SnakeVector(1, seed=0, size=size, **options)
    vec.reset()
    return vec


def place(vec: SnakeVector, cells: list[tuple[int, int]], direction: int, food: tuple[int, int]) -> None:
    """Put a snake on board 0: ``cells`` from head to tail."""
    vec.body[0] = 0
    for k, (r, c) in enumerate(cells):
        vec.body[0, r, c] = len(cells) - k
    vec.head[0] = cells[0]
    vec.length[0] = len(cells)
    vec.direction[0] = direction
    vec.food[0] = food
    vec.hunger[0] = 0
    vec.steps[0] = 0


def test_moving_keeps_length_and_eating_grows() -> None:
    vec = board()
    place(vec, [(2, 2), (2, 1), (2, 0)], RIGHT, food=(2, 4))
    res = vec.step(np.array([RIGHT]))
    assert res.reward[0] == 0 and not res.terminated[0]
    assert (vec.body[0] > 0).sum() == 3 and tuple(vec.head[0]) == (2, 3) and vec.body[0, 2, 0] == 0
    res = vec.step(np.array([RIGHT]))  # onto the food
    assert res.reward[0] == 1 and not res.terminated[0] and vec.length[0] == 4
    assert (vec.body[0] > 0).sum() == 4 and tuple(vec.head[0]) == (2, 4)
    assert vec.body[0][tuple(vec.food[0])] == 0  # new food on a free cell
    obs = res.obs[0]
    assert obs.dtype == np.uint8 and obs.shape == (3, 6, 6)
    assert obs[0].sum() == 4 * 255 and obs[1, 2, 4] == 255 and obs[1].sum() == 255 and obs[2].sum() == 255


def test_wall_ends_the_episode_with_minus_one() -> None:
    vec = board()
    place(vec, [(0, 3), (1, 3)], UP, food=(5, 5))
    res = vec.step(np.array([UP]))
    assert res.terminated[0] and not res.truncated[0] and res.reward[0] == -1
    assert len(res.episodes) == 1 and res.episodes[0].ret == -1 and res.episodes[0].length == 1


def test_biting_the_body_ends_it_but_the_moving_tail_does_not() -> None:
    vec = board()
    # A 5-long snake curled so that turning down hits its own body.
    place(vec, [(2, 2), (2, 3), (3, 3), (3, 2), (3, 1)], LEFT, food=(0, 0))
    res = vec.step(np.array([DOWN]))
    assert res.terminated[0] and res.reward[0] == -1
    # A 4-long square: the head may move onto the cell the tail leaves this step.
    vec = board()
    place(vec, [(2, 2), (2, 3), (3, 3), (3, 2)], LEFT, food=(0, 0))
    res = vec.step(np.array([DOWN]))
    assert not res.terminated[0] and tuple(vec.head[0]) == (3, 2)


def test_reversing_keeps_going_and_hunger_truncates() -> None:
    vec = board(hunger_limit=3)
    place(vec, [(2, 2), (2, 1)], RIGHT, food=(5, 5))
    vec.autoreset = False
    vec.step(np.array([LEFT]))  # back onto the neck: ignored
    assert tuple(vec.head[0]) == (2, 3)
    vec.step(np.array([DOWN]))
    res = vec.step(np.array([DOWN]))
    assert res.truncated[0] and not res.terminated[0] and res.reward[0] == 0


@pytest.mark.parametrize("size,length,distance", [(10, 3, 1), (8, 4, 2), (12, 1, 0), (7, 5, 1)])
def test_start_respects_length_and_border_distance(size: int, length: int, distance: int) -> None:
    vec = SnakeVector(64, seed=1, size=size, start_length=length, border_distance=distance)
    vec.reset()
    for i in range(64):
        rows, cols = np.nonzero(vec.body[i])
        assert len(rows) == length and vec.length[i] == length
        assert rows.min() >= distance and cols.min() >= distance
        assert rows.max() <= size - 1 - distance and cols.max() <= size - 1 - distance
        assert vec.body[i][tuple(vec.food[i])] == 0


def test_bad_options_are_refused() -> None:
    with pytest.raises(ValueError, match="does not fit"):
        SnakeVector(1, size=5, start_length=4, border_distance=1)
    with pytest.raises(TypeError, match="unknown Snake option"):
        env_spec("Snake-v0?width=5")


def test_vector_slots_equal_single_envs_with_the_same_seeds() -> None:
    n, seed = 6, 11
    vec = make_vector_env("Snake-v0?size=7", n, seed=seed)
    singles = [make_env("Snake-v0", size=7) for _ in range(n)]
    obs = vec.reset()
    for i, env in enumerate(singles):
        np.testing.assert_array_equal(env.reset(seed=seed + i)[0], obs[i])
    rng = np.random.default_rng(0)
    ended = 0
    for _ in range(400):
        actions = rng.integers(4, size=n)
        res = vec.step(actions)
        for i, env in enumerate(singles):
            o, r, term, trunc, _ = env.step(int(actions[i]))
            np.testing.assert_array_equal(o, res.final_obs[i])
            assert (r, term, trunc) == (res.reward[i], res.terminated[i], res.truncated[i])
            if term or trunc:
                ended += 1
                env_obs, _ = env.reset()
                # the single env reseeds from its own generator, as the vector's board does
                np.testing.assert_array_equal(env_obs, res.obs[i])
    assert ended > 10


def test_registered_gymnasium_id() -> None:
    env = gymnasium.make("Snake-v0", size=8)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (3, 8, 8) and obs.dtype == np.uint8
    assert isinstance(env.unwrapped, SnakeEnv)
    env.close()
    assert isinstance(make_env("flywheel/Snake-v0"), SnakeEnv)
    assert env_spec("Snake-v0").obs_shape == (3, 10, 10) and env_spec("Snake-v0").n_actions == 4
