"""ActorCore on real CartPole-v1 environments: shapes, counting, episode stats, eval env, greedy acting."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from flywheel.services.actor.core import ActorCore, build_core
from flywheel.services.actor.nstep import Emitted
from flywheel.services.actor.policy import Backend, TorchPolicy, build_policy


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)


def make_core(num_envs: int = 4, n_step: int = 3, eval_envs: int = 0, seed: int | None = 1,
              backend: Backend = "auto") -> ActorCore:
    policy = build_policy((4,), 2, hidden=32, backend=backend, seed=0)  # the same initial weights every time
    return build_core("CartPole-v1", num_envs, policy, n_step=n_step, gamma=0.99, eval_envs=eval_envs, seed=seed)


def greedy(core: ActorCore, obs: np.ndarray) -> np.ndarray:
    return core.policy.q_values(obs).argmax(axis=1)


def acted_and_greedy(core: ActorCore, epsilon: float | np.ndarray,
                     steps: int = 60) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Step ``core`` (then close it) at ``epsilon`` (one rate, or one per env slot): the actions of its rows, the
    greedy actions for the same observations, and each row's env slot."""
    core.epsilon = epsilon
    try:
        rows: list[Emitted] = []
        for _ in range(steps):
            rows += core.step()
        obs = np.concatenate([r.obs for r in rows])
        return np.concatenate([r.action for r in rows]), greedy(core, obs), np.concatenate([r.stream for r in rows])
    finally:
        core.close()


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


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_epsilon_zero_acts_greedily(backend: Backend) -> None:
    core = make_core(n_step=1, backend=backend)
    assert isinstance(core.policy, TorchPolicy) == (backend == "torch")
    actions, greedy_actions, _ = acted_and_greedy(core, 0.0)
    assert len(actions) >= 4 * 59
    assert np.array_equal(actions, greedy_actions)


def test_epsilon_one_explores() -> None:
    actions, greedy_actions, _ = acted_and_greedy(make_core(n_step=1), 1.0)
    mismatch = float(np.mean(actions != greedy_actions))
    assert 0.3 < mismatch < 0.7  # random actions disagree with greedy about half the time


def test_same_seed_same_trajectory() -> None:
    a, b = make_core(seed=5), make_core(seed=5)
    try:
        for _ in range(30):
            ra, rb = a.step(), b.step()
            assert len(ra) == len(rb)
            for x, y in zip(ra, rb, strict=True):
                assert np.array_equal(x.obs, y.obs) and np.array_equal(x.action, y.action)
    finally:
        a.close()
        b.close()


def collect(core: ActorCore, calls: int) -> list[Emitted]:
    rows: list[Emitted] = []
    for _ in range(calls):
        rows += core.step()
    return rows


def by_stream(rows: list[Emitted]) -> dict[int, list[tuple[np.ndarray, np.ndarray, float]]]:
    """Rows of each stream in the order they were emitted: (obs, next_obs, discount)."""
    streams: dict[int, list[tuple[np.ndarray, np.ndarray, float]]] = {}
    for r in rows:
        assert r.stream is not None and r.stream.dtype == np.int64 and r.stream.shape == (len(r),)
        for k in range(len(r)):
            streams.setdefault(int(r.stream[k]), []).append((r.obs[k], r.next_obs[k], float(r.discount[k])))
    return streams


@pytest.mark.parametrize("env_id,num_envs", [("CartPole-v1", 4), ("Snake-v0?size=6,hunger_limit=10000", 6)])
def test_streams_are_env_slots_in_step_order(env_id: str, num_envs: int) -> None:
    """Row k of a stream is step k of that env: a full 3-step row bootstraps from row k + 3's observation."""
    from flywheel.envs import env_spec

    spec = env_spec(env_id)
    policy = build_policy(spec.obs_shape, spec.n_actions, hidden=32)
    core = build_core(env_id, num_envs, policy, n_step=3, gamma=0.9, seed=2)
    core.epsilon = 0.5
    calls = 300
    try:
        streams = by_stream(collect(core, calls))
    finally:
        core.close()
    assert sorted(streams) == list(range(num_envs))
    full = terminal = 0
    for rows in streams.values():
        assert calls - 1 - 3 <= len(rows) <= calls - 1  # every step once, less the ones still maturing
        for k, (_, next_obs, discount) in enumerate(rows):
            if np.isclose(discount, 0.9**3) and k + 3 < len(rows):
                np.testing.assert_array_equal(next_obs, rows[k + 3][0])
                full += 1
            elif discount == 0.0:
                terminal += 1
    assert full > 100 * num_envs and terminal > 3 * num_envs  # episodes ended, and the order held across them


def test_returns_are_cut_before_exploratory_actions() -> None:
    """With cut_at_exploration a greedy slot (epsilon 0) keeps full 3-step returns, an always-random slot (1) makes
    1-step ones, and every row of k steps bootstraps from its stream's row k later: the cut keeps step order."""
    policy = build_policy((4,), 2, hidden=32, seed=0)
    core = build_core("CartPole-v1", 4, policy, n_step=3, gamma=0.9, seed=3, cut_at_exploration=True)
    core.epsilon = np.array([0.0, 1.0, 0.3, 0.3])
    calls = 300
    try:
        streams = by_stream(collect(core, calls))
    finally:
        core.close()
    steps_of: dict[int, list[int]] = {}
    for slot, rows in streams.items():
        assert calls - 1 - 3 <= len(rows) <= calls - 1  # every step once, less the ones still maturing
        for k, (_, next_obs, discount) in enumerate(rows):
            if discount == 0.0:
                continue  # the episode's last steps
            n = round(np.log(discount) / np.log(0.9))
            steps_of.setdefault(slot, []).append(n)
            if k + n < len(rows):
                np.testing.assert_array_equal(next_obs, rows[k + n][0])
    assert set(steps_of[0]) == {3} and set(steps_of[1]) == {1}
    assert set(steps_of[2]) == {1, 2, 3} and set(steps_of[3]) == {1, 2, 3}


class AlwaysRight:
    """A network whose greedy action is always 1 (CartPole: push right), so action 0 is a no-op start's."""

    name = "always-right"

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        return np.tile(np.array([0.0, 1.0], dtype=np.float32), (len(obs), 1))

    def load(self, msg: object) -> None:
        raise NotImplementedError


def test_episodes_start_with_their_drawn_no_ops() -> None:
    """episode_noops_max=5: each episode of each slot begins with 0-5 actions 0 (various counts), then the greedy
    policy's; with cut_at_exploration the no-ops end returns as random actions do (a step followed by a no-op makes
    a 1-step return, the rest full 3-step ones or the episode's end)."""
    core = build_core("CartPole-v1", 3, AlwaysRight(), n_step=3, gamma=0.9, seed=4, episode_noops_max=5,
                      cut_at_exploration=True)
    core.epsilon = 0.0
    try:
        rows = collect(core, 400)
    finally:
        core.close()
    leading: list[int] = []
    for slot in range(3):
        actions = np.concatenate([r.action[r.stream == slot] for r in rows])
        discounts = np.concatenate([r.discount[r.stream == slot] for r in rows])
        ends = np.flatnonzero(discounts == 0.0)
        ends = ends[np.r_[np.diff(ends) > 1, True]]  # an episode's last 3 steps all end it: the last of each run
        for start, end in zip(ends[:-1] + 1, ends[1:], strict=True):  # whole episodes after the first
            episode, discount = actions[start:end], discounts[start:end]
            noops = int(np.argmax(episode != 0)) if (episode != 0).any() else len(episode)
            assert (episode[noops:] == 1).all()  # after the no-ops, only the policy's actions
            np.testing.assert_allclose(discount[:max(noops - 1, 0)], 0.9)  # cut before the next no-op
            rest = discount[max(noops - 1, 0):]
            np.testing.assert_allclose(rest[rest > 0], 0.9**3, rtol=1e-6)  # the episode's last steps: 0
            leading.append(noops)
    assert len(leading) > 30 and max(leading) <= 5 and len(set(leading)) >= 4, leading


@pytest.mark.system
def test_subprocess_double_buffered_core_equals_inprocess() -> None:
    policy = build_policy((4,), 2, hidden=32)
    a = build_core("CartPole-v1", 8, policy, n_step=3, gamma=0.99, seed=4)
    b = build_core("CartPole-v1", 8, policy, n_step=3, gamma=0.99, seed=4, vector_mode="subprocess", workers=2)
    a.epsilon = b.epsilon = 0.0  # greedy: both take the same actions from the same observations
    try:
        assert len(a.groups) == 1 and len(b.groups) == 2
        rows_a = collect(a, 100)
        rows_b = collect(b, 200)  # one call steps one half
        sa, sb = by_stream(rows_a), by_stream(rows_b)
        assert sorted(sa) == sorted(sb) == list(range(8))
        for slot in range(8):
            n = min(len(sa[slot]), len(sb[slot]))
            assert n > 90
            for (o1, n1, d1), (o2, n2, d2) in zip(sa[slot][:n], sb[slot][:n], strict=True):
                assert np.array_equal(o1, o2) and np.array_equal(n1, n2) and d1 == d2
        assert a.env_steps == b.env_steps == 8 * 99
        assert b.times.env >= 0 and b.times.inference > 0 and a.times.inference > 0
    finally:
        a.close()
        b.close()


def test_mettagrid_agents_share_one_policy() -> None:
    pytest.importorskip("mettagrid")
    from flywheel.envs import env_spec

    spec = env_spec("MettaGrid-v0?max_steps=20")
    policy = build_policy(spec.obs_shape, spec.n_actions, hidden=32)
    assert isinstance(policy, TorchPolicy)  # grids need the convolutional network
    core = build_core("MettaGrid-v0?max_steps=20", 8, policy, n_step=3, gamma=0.99, seed=0, eval_envs=1)
    try:
        rows = collect(core, 50)
        assert sorted(by_stream(rows)) == list(range(8))
        # two simulations x 4 agents, twice; the greedy evaluation is one simulation of 4 agents, twice
        assert core.stats.episodes == 16 and core.stats.eval_episodes == 8
        assert all(r.obs.dtype == np.uint8 and r.obs.shape[1:] == spec.obs_shape for r in rows)
    finally:
        core.close()


def test_time_split_accounts_for_the_loop() -> None:
    core = make_core(num_envs=8)
    try:
        collect(core, 200)
        t = core.times
        assert t.env > 0 and t.inference > 0 and t.other > 0
    finally:
        core.close()
