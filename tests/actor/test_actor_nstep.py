"""NStepAccumulator against a brute-force per-env reference."""

from __future__ import annotations

import numpy as np
import pytest

from flywheel.services.actor.nstep import Emitted, NStepAccumulator


def max_q_of(obs: np.ndarray) -> np.ndarray:
    """A deterministic stand-in for max-Q of an observation (keyed by its unique id in column 0)."""
    return np.sin(obs[..., 0].astype(np.float64)) * 3.0


Row = tuple[float, int, float, float, float, float]  # obs id, action, return, discount, next_obs id, priority


def rows_of(emitted: list[Emitted]) -> list[Row]:
    out: list[Row] = []
    for e in emitted:
        assert e.obs.dtype == np.float32 and e.reward.dtype == np.float32 and e.discount.dtype == np.float32
        assert np.array_equal(e.obs[:, 1], e.next_obs[:, 1]), "a transition mixes two episodes"
        for i in range(len(e)):
            out.append((float(e.obs[i, 0]), int(e.action[i]), float(e.reward[i]), float(e.discount[i]),
                        float(e.next_obs[i, 0]), float(e.priority[i])))
    return out


def simulate(num_envs: int, n: int, gamma: float, steps: int, seed: int, p_end: float = 0.15,
             p_explore: float = 0.0) -> tuple[list[Row], list[Row]]:
    """Drive the accumulator like ActorCore does and build the brute-force answer alongside; with ``p_explore``
    each action is exploratory with that chance and returns are cut before it (``cut``)."""
    rng = np.random.default_rng(seed)
    acc = NStepAccumulator(num_envs, (2,), np.float32, n, gamma)
    next_id = iter(range(1, 10**9))
    episode = np.arange(num_envs, dtype=np.float64)
    next_episode = num_envs
    obs = np.array([[next(next_id), episode[e]] for e in range(num_envs)], dtype=np.float32)
    history: list[list[list[tuple]]] = [[[]] for _ in range(num_envs)]  # env -> episodes -> steps
    emitted: list[Emitted] = []
    for _ in range(steps):
        out = acc.finish(max_q_of(obs))
        if out is not None:
            emitted.append(out)
        action = rng.integers(0, 4, num_envs)
        explored = rng.random(num_envs) < p_explore if p_explore else np.zeros(num_envs, dtype=bool)
        if explored.any():
            out = acc.cut(explored, obs, max_q_of(obs))
            if out is not None:
                emitted.append(out)
        q_sa = rng.normal(size=num_envs)
        reward = rng.normal(size=num_envs).round(2)
        terminated = rng.random(num_envs) < p_end
        truncated = ~terminated & (rng.random(num_envs) < p_end)
        final = np.array([[next(next_id), episode[e]] for e in range(num_envs)], dtype=np.float32)
        following = final.copy()
        for e in range(num_envs):
            history[e][-1].append((obs[e, 0], action[e], q_sa[e], reward[e], terminated[e], truncated[e], final[e, 0],
                                   explored[e]))
            if terminated[e] or truncated[e]:
                history[e].append([])
                episode[e] = next_episode
                next_episode += 1
                following[e] = (next(next_id), episode[e])
        final_max_q = np.where(truncated, max_q_of(final), np.nan) if truncated.any() else None
        out = acc.push(obs, action, q_sa, reward, terminated, truncated, final, final_max_q)
        if out is not None:
            emitted.append(out)
        obs = following
    out = acc.finish(max_q_of(obs))
    if out is not None:
        emitted.append(out)

    expected: list[Row] = []
    for env_history in history:
        for ep in env_history:
            ended = bool(ep) and (ep[-1][4] or ep[-1][5])
            for t in range(len(ep)):
                # The entry leaves at the first later push where it is n - 1 steps old, at its episode's last step,
                # or (cut) at the step before the next exploratory action of its episode.
                leaves = [j for j in range(t, len(ep)) if j - t >= n - 1 or (ended and j == len(ep) - 1)
                          or (j + 1 < len(ep) and ep[j + 1][7])]
                if not leaves:
                    continue  # not mature yet when the run stopped
                k = leaves[0] - t + 1
                ret = sum(gamma**i * ep[t + i][3] for i in range(k))
                last = ep[t + k - 1]
                terminal = bool(last[4])
                discount = 0.0 if terminal else gamma**k
                boot = 0.0 if terminal else float(max_q_of(np.array([[last[6], 0.0]]))[0])
                priority = abs(ret + discount * boot - ep[t][2])
                expected.append((float(ep[t][0]), int(ep[t][1]), ret, discount, float(last[6]), priority))
    return rows_of(emitted), expected


def assert_same_rows(got: list[Row], expected: list[Row]) -> None:
    assert len(got) == len(expected)
    got_by_obs = {row[0]: row for row in got}
    assert len(got_by_obs) == len(got), "a transition was emitted twice"
    for row in expected:
        other = got_by_obs[row[0]]
        assert other[1] == row[1] and other[4] == row[4], (other, row)
        np.testing.assert_allclose(other[2:4], row[2:4], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(other[5], row[5], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("n", [1, 2, 3, 5])
@pytest.mark.parametrize("num_envs", [1, 4])
@pytest.mark.parametrize("seed", range(4))
def test_matches_brute_force_reference(n: int, num_envs: int, seed: int) -> None:
    got, expected = simulate(num_envs, n, 0.9, 120, seed)
    assert_same_rows(got, expected)


@pytest.mark.parametrize("p_end", [0.0, 0.03, 0.5, 1.0])  # 0.03: fast and general paths mixed
def test_extreme_episode_lengths(p_end: float) -> None:
    got, expected = simulate(3, 4, 0.97, 60, 11, p_end=p_end)
    assert_same_rows(got, expected)


@pytest.mark.parametrize("p_explore", [0.05, 0.4, 1.0])
@pytest.mark.parametrize("seed", range(3))
def test_returns_cut_before_exploratory_actions_match_the_reference(p_explore: float, seed: int) -> None:
    got, expected = simulate(4, 5, 0.9, 150, seed, p_end=0.05, p_explore=p_explore)
    assert_same_rows(got, expected)
    got, expected = simulate(4, 5, 0.9, 150, seed, p_end=0.0, p_explore=p_explore)  # no episode ends: only cuts
    assert_same_rows(got, expected)
    short = [row for row in got if row[3] > 0.9**5 + 1e-6]  # fewer than 5 steps: cut before a random action
    assert short and (len(short) == len(got) if p_explore == 1.0 else len(short) < len(got))


def test_a_cut_bootstraps_from_the_observation_about_to_be_acted_on() -> None:
    acc = NStepAccumulator(2, (2,), np.float32, 3, 0.5)
    obs = [np.array([[10 * i, 0], [10 * i + 1, 0]], dtype=np.float32) for i in range(3)]
    no = np.zeros(2, dtype=bool)
    for i in range(2):
        pushed = acc.push(obs[i], np.array([i, i]), np.array([0.5, 0.5]), np.array([1.0, 2.0]), no, no, obs[i + 1])
        assert pushed is None
    assert acc.finish(np.array([7.0, 7.0])) is None  # two steps waiting in each env: none mature yet at n = 3
    out = acc.cut(np.array([False, True]), obs[2], np.array([7.0, 4.0]))  # env 1's next action is random
    assert out is not None and len(out) == 2 and acc.filled.tolist() == [2, 0]
    np.testing.assert_array_equal(out.obs[:, 0], [1, 11])  # env 1's two steps, oldest first
    np.testing.assert_array_equal(out.next_obs[:, 0], [21, 21])
    np.testing.assert_allclose(out.reward, [2.0 + 0.5 * 2.0, 2.0])
    np.testing.assert_allclose(out.discount, [0.25, 0.5])
    np.testing.assert_allclose(out.priority, [abs(3.0 + 0.25 * 4 - 0.5), abs(2.0 + 0.5 * 4 - 0.5)])
    np.testing.assert_array_equal(out.stream, [1, 1])
    assert acc.cut(np.array([False, True]), obs[2], np.array([7.0, 4.0])) is None  # nothing left to cut


def test_truncated_episode_bootstraps_from_final_observation() -> None:
    acc = NStepAccumulator(1, (2,), np.float32, 3, 0.5)
    obs = [np.array([[i, 0]], dtype=np.float32) for i in range(4)]
    no = np.array([False])
    assert acc.push(obs[0], np.array([1]), np.array([0.5]), np.array([1.0]), no, no, obs[1]) is None
    out = acc.push(obs[1], np.array([0]), np.array([0.25]), np.array([2.0]), no, np.array([True]), obs[2],
                   final_max_q=np.array([10.0]))
    assert out is not None and len(out) == 2 and acc.finish(np.array([99.0])) is None
    order = np.argsort(out.obs[:, 0])  # rows for obs 0 (two steps) and obs 1 (one step)
    np.testing.assert_allclose(out.reward[order], [1.0 + 0.5 * 2.0, 2.0])
    np.testing.assert_allclose(out.discount[order], [0.25, 0.5])
    np.testing.assert_array_equal(out.next_obs[order, 0], [2, 2])
    np.testing.assert_array_equal(out.action[order], [1, 0])
    np.testing.assert_allclose(out.priority[order], [abs(2.0 + 0.25 * 10 - 0.5), abs(2.0 + 0.5 * 10 - 0.25)])
    with pytest.raises(ValueError, match="final_max_q"):
        acc.push(obs[2], np.array([0]), np.array([0.0]), np.array([0.0]), no, np.array([True]), obs[3])


def test_terminated_episode_does_not_bootstrap() -> None:
    acc = NStepAccumulator(2, (2,), np.float32, 2, 0.9)
    o = np.zeros((2, 2), dtype=np.float32)
    out = acc.push(o, np.array([0, 1]), np.array([1.0, 2.0]), np.array([3.0, 4.0]), np.array([True, False]),
                   np.array([False, False]), o + 1)
    assert out is not None and len(out) == 1
    np.testing.assert_allclose(out.discount, [0.0])
    np.testing.assert_allclose(out.priority, [2.0])  # |3 - 1|


def test_n_one_emits_every_step() -> None:
    acc = NStepAccumulator(3, (2,), np.float32, 1, 0.99)
    o = np.zeros((3, 2), dtype=np.float32)
    no = np.zeros(3, dtype=bool)
    assert acc.push(o, np.zeros(3, dtype=np.int64), np.zeros(3), np.ones(3), no, no, o) is None
    out = acc.finish(np.array([1.0, 2.0, 3.0]))
    assert out is not None and len(out) == 3
    np.testing.assert_allclose(out.discount, 0.99)
    np.testing.assert_allclose(out.priority, 1.0 + 0.99 * np.array([1.0, 2.0, 3.0]), rtol=1e-6)
    with pytest.raises(ValueError):
        NStepAccumulator(1, (2,), np.float32, 0, 0.99)
