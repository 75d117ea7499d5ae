"""ActorCore on real CartPole-v1 environments: shapes, counting, episode stats, eval env, greedy acting."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from flywheel.nets import build_q_network
from flywheel.services.actor.core import ActorCore, build_core
from flywheel.services.actor.nstep import Emitted


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)


def make_core(num_envs: int = 4, n_step: int = 3, eval_envs: int = 0, seed: int | None = 1) -> ActorCore:
    net = build_q_network((4,), 2, hidden=32)
    net.eval()
    return build_core("CartPole-v1", num_envs, net, n_step=n_step, gamma=0.99, eval_envs=eval_envs, seed=seed)


def greedy(core: ActorCore, obs: np.ndarray) -> np.ndarray:
    with torch.inference_mode():
        return core.net(torch.from_numpy(obs)).argmax(dim=1).numpy()


def test_shapes_counting_and_episode_stats() -> None:
    core = make_core()
    try:
        assert core.obs[0].shape == (4, 4) and core.obs[0].dtype == np.float32 and core.n_actions == 2
        rows: list[Emitted] = []
        steps = 0
        while core.stats.episodes < 3 and steps < 2000:
            rows += core.step()
            steps += 1
        assert core.env_steps == 4 * (steps - 1)  # the first call only picks actions
        assert core.stats.episodes >= 3
        # CartPole pays 1 per step: returns equal lengths.
        assert list(core.stats.returns) == [float(n) for n in core.stats.lengths]
        assert all(1 <= n <= 500 for n in core.stats.lengths)
        total = sum(len(r) for r in rows)
        assert total > 0
        for r in rows:
            assert r.obs.shape == (len(r), 4) and r.next_obs.shape == (len(r), 4)
            assert r.obs.dtype == np.float32 and r.action.dtype == np.int64
            assert set(np.unique(r.action)) <= {0, 1}
            assert np.all(np.isfinite(r.priority)) and np.all(r.priority >= 0)
            assert np.all((r.discount == 0) | np.isclose(r.discount, 0.99 ** np.arange(1, 4)[:, None]).any(axis=0))
        # Every step is one row once matured: rows never exceed env steps, and lag them by < n steps per env.
        assert total <= core.env_steps and core.env_steps - total <= 4 * 3
        # A termination gives the last min(n, length) rows of its episode a zero discount.
        assert sum(int((r.discount == 0).sum()) for r in rows) == sum(min(3, n) for n in core.stats.lengths)
    finally:
        core.close()


def test_eval_env_produces_eval_returns() -> None:
    core = make_core(num_envs=2, eval_envs=1)
    try:
        steps = 0
        while core.stats.eval_episodes < 2 and steps < 1500:
            core.step()
            steps += 1
        assert core.stats.eval_episodes >= 2
        assert all(1 <= r <= 500 for r in core.stats.eval_returns)
        assert core.env_steps == 2 * (steps - 1)  # the eval env does not count as training steps
    finally:
        core.close()


def test_epsilon_zero_acts_greedily() -> None:
    core = make_core(n_step=1)
    core.epsilon = 0.0
    try:
        rows: list[Emitted] = []
        for _ in range(60):
            rows += core.step()
        obs = np.concatenate([r.obs for r in rows])
        actions = np.concatenate([r.action for r in rows])
        assert len(actions) >= 4 * 59
        assert np.array_equal(actions, greedy(core, obs))
    finally:
        core.close()


def test_epsilon_one_explores() -> None:
    core = make_core(n_step=1)
    core.epsilon = 1.0
    try:
        rows: list[Emitted] = []
        for _ in range(60):
            rows += core.step()
        obs = np.concatenate([r.obs for r in rows])
        actions = np.concatenate([r.action for r in rows])
        mismatch = float(np.mean(actions != greedy(core, obs)))
        assert 0.3 < mismatch < 0.7  # random actions disagree with greedy about half the time
    finally:
        core.close()


def test_same_seed_same_trajectory() -> None:
    a, b = make_core(seed=5), make_core(seed=5)
    b.net.load_state_dict(a.net.state_dict())
    try:
        for _ in range(30):
            ra, rb = a.step(), b.step()
            assert len(ra) == len(rb)
            for x, y in zip(ra, rb, strict=True):
                assert np.array_equal(x.obs, y.obs) and np.array_equal(x.action, y.action)
    finally:
        a.close()
        b.close()
