"""MettaGrid: agents as env slots, dense observations, shared episode ends, rewards, seeds and errors."""

from __future__ import annotations

import numpy as np
import pytest

from flywheel.envs import env_family, env_spec, make_env, make_vector_env

pytest.importorskip("mettagrid")


def test_spec_counts_agents_as_slots() -> None:
    assert env_family("MettaGrid-v0") == "mettagrid"
    spec = env_spec("MettaGrid-v0")
    assert spec.agents == 4 and spec.n_actions == 5 and spec.obs_dtype == "uint8"
    assert len(spec.obs_shape) == 3 and spec.obs_shape[1:] == (13, 13) and spec.obs_shape[0] >= 8
    assert env_spec("MettaGrid-v0?agents=2").agents == 2
    assert env_spec("MettaGrid-Arena-v0").agents == 24


def test_slots_step_rewards_and_shared_episode_end() -> None:
    vec = make_vector_env("MettaGrid-v0?size=7,hearts=6,walls=0,max_steps=40", 8, seed=0)
    try:
        obs = vec.reset()
        assert obs.shape == (8, *vec.obs_shape) and obs.dtype == np.uint8 and obs.any()
        # Each agent sees itself in the centre of its egocentric window.
        assert all(obs[i, :, 6, 6].any() for i in range(8))
        rng = np.random.default_rng(0)
        total = np.zeros(8)
        for t in range(1, 81):
            res = vec.step(rng.integers(0, vec.n_actions, 8))
            total += res.reward
            if t % 40:
                assert not (res.terminated | res.truncated).any() and not res.episodes
            else:  # both simulations hit the time limit together: every agent is truncated
                assert res.truncated.all() and not res.terminated.any()
                assert sorted(e.slot for e in res.episodes) == list(range(8))
                assert all(e.length == 40 for e in res.episodes)
                assert not np.array_equal(res.final_obs, res.obs)  # new maps after the reset
        assert total.sum() > 0  # random walkers in a small room with six heart sources find hearts
    finally:
        vec.close()


def test_same_seed_same_maps_and_moves() -> None:
    a = make_vector_env("MettaGrid-v0", 4, seed=7)
    b = make_vector_env("MettaGrid-v0", 4, seed=7)
    c = make_vector_env("MettaGrid-v0", 4, seed=8)
    try:
        first = a.reset()
        np.testing.assert_array_equal(first, b.reset())
        assert not np.array_equal(first, c.reset())
        rng = np.random.default_rng(1)
        for _ in range(50):
            actions = rng.integers(0, 5, 4)
            np.testing.assert_array_equal(a.step(actions).obs, b.step(actions).obs)
    finally:
        for vec in (a, b, c):
            vec.close()


def test_slot_count_must_fill_whole_simulations_and_single_env_is_refused() -> None:
    with pytest.raises(ValueError, match="multiple of 4"):
        make_vector_env("MettaGrid-v0", 6)
    with pytest.raises(ValueError, match="multi-agent"):
        make_env("MettaGrid-v0")
    with pytest.raises(TypeError, match="unknown MettaGrid option"):
        env_spec("MettaGrid-v0?agent=3")


@pytest.mark.timeout(120)
@pytest.mark.system
def test_subprocess_keeps_simulations_whole_and_equals_inprocess() -> None:
    from test_vector import run_both  # same directory (pytest puts it on sys.path)

    run_both("MettaGrid-v0?max_steps=30", 16, 70)  # 4 simulations: 2 halves x 2 workers, 4 agents each
