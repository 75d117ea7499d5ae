"""Vectors of envs: subprocess equals in-process for the same seeds, worker failures are clear errors, ids."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest

from flywheel.envs import (
    UnknownEnvironmentError,
    known_env_ids,
    make_vector_env,
    split_env_id,
)
from flywheel.envs.subproc import EnvWorkerError, SubprocessVector


def run_both(env_id: str, num_envs: int, steps: int, seed: int = 3) -> int:
    """Step an in-process and a subprocess vector with the same actions; return the episodes seen."""
    a = make_vector_env(env_id, num_envs, seed=seed)
    b = make_vector_env(env_id, num_envs, seed=seed, mode="subprocess", workers=2)
    episodes = 0
    try:
        assert isinstance(b, SubprocessVector) and len(b.groups) == 2 and b.workers == 2
        np.testing.assert_array_equal(a.reset(), b.reset())
        rng = np.random.default_rng(0)
        for _ in range(steps):
            actions = rng.integers(0, a.n_actions, num_envs)
            ra = a.step(actions)
            for g, grp in enumerate(b.groups):  # both halves in flight at once, as the actor does
                b.step_async(g, actions[grp.start:grp.stop])
            for g, grp in enumerate(b.groups):
                rb = b.step_wait(g)
                part = slice(grp.start, grp.stop)
                np.testing.assert_array_equal(ra.obs[part], rb.obs)
                np.testing.assert_array_equal(ra.final_obs[part], rb.final_obs)
                np.testing.assert_array_equal(ra.reward[part], rb.reward)
                np.testing.assert_array_equal(ra.terminated[part], rb.terminated)
                np.testing.assert_array_equal(ra.truncated[part], rb.truncated)
                mine = sorted((e.slot, e.ret, e.length) for e in ra.episodes if e.slot in grp)
                assert mine == sorted((e.slot, e.ret, e.length) for e in rb.episodes)
            episodes += len(ra.episodes)
    finally:
        a.close()
        b.close()
    return episodes


@pytest.mark.timeout(120)
@pytest.mark.system
def test_subprocess_equals_inprocess_cartpole() -> None:
    assert run_both("CartPole-v1", 8, 300) > 5


@pytest.mark.timeout(120)
@pytest.mark.system
def test_subprocess_equals_inprocess_snake() -> None:
    assert run_both("Snake-v0?size=6", 6, 300) > 5


@pytest.mark.timeout(180)
@pytest.mark.system
def test_subprocess_equals_inprocess_mario() -> None:
    run_both("SuperMarioBros-1-1-v0", 4, 60)


@contextmanager
def two_workers(env_id: str) -> Iterator[SubprocessVector]:
    """Four slots of ``env_id`` in two worker processes, reset; closed when the block ends, however it ends."""
    vec = make_vector_env(env_id, 4, seed=0, mode="subprocess", workers=2)
    try:
        assert isinstance(vec, SubprocessVector)
        vec.reset()
        yield vec
    finally:
        vec.close()


@pytest.mark.timeout(120)
@pytest.mark.system
def test_killed_worker_is_a_clear_error_not_a_hang() -> None:
    with two_workers("CartPole-v1") as vec:
        pid = vec._procs[1].pid
        os.kill(pid, signal.SIGKILL)
        began = time.monotonic()
        with pytest.raises(EnvWorkerError, match=rf"env worker 1 \(pid {pid}, CartPole-v1 slots .*\) (died|is gone)"):
            for g in range(len(vec.groups)):
                vec.step_async(g, np.zeros(len(vec.groups[g]), dtype=np.int64))
                vec.step_wait(g)
        assert time.monotonic() - began < 30
    assert all(not p.is_alive() for p in vec._procs)


@pytest.mark.timeout(120)
@pytest.mark.system
def test_exception_in_worker_is_reported_with_its_message() -> None:
    with two_workers("Snake-v0") as vec:
        vec.step_async(0, np.array([9, 0]))
        with pytest.raises(EnvWorkerError, match="failed: ValueError: Snake actions must be in 0..3"):
            vec.step_wait(0)


@pytest.mark.timeout(60)
@pytest.mark.system
def test_bad_env_in_worker_fails_at_start() -> None:
    with pytest.raises(EnvWorkerError, match="TypeError: unknown Snake option"):
        SubprocessVector("Snake-v0", 2, obs_shape=(3, 10, 10), obs_dtype="uint8", n_actions=4, workers=1,
                         options={"colour": 1}, make_vector_env=make_vector_env)


def test_id_options_and_errors() -> None:
    assert split_env_id("ALE/Pong-v5?clip_rewards=false,stack=2,name=x") == (
        "ALE/Pong-v5", {"clip_rewards": False, "stack": 2, "name": "x"})
    assert split_env_id("CartPole-v1") == ("CartPole-v1", {})
    with pytest.raises(ValueError, match="expected name=value"):
        split_env_id("Snake-v0?size")
    with pytest.raises(UnknownEnvironmentError, match="Snake-v0"):
        make_vector_env("Snakes-v0", 2)
    ids = known_env_ids()
    for env_id in ("SuperMarioBros-1-1-v0", "ALE/Pong-v5", "Snake-v0", "MettaGrid-v0", "CartPole-v1"):
        assert env_id in ids
    with pytest.raises(ValueError, match="vector mode"):
        make_vector_env("CartPole-v1", 2, mode="threads")  # type: ignore[arg-type]


def test_mario_episode_metrics_and_action_set_in_the_id() -> None:
    from flywheel.envs import env_spec

    assert env_spec("SuperMarioBros-1-1-v0?actions=complex").n_actions == 12
    assert env_spec("SuperMarioBros-1-1-v0?actions=right_only").n_actions == 5
    vec = make_vector_env("SuperMarioBros-2-3-v0?actions=right_only,max_episode_steps=25", 2, seed=0)
    try:
        vec.reset()
        episodes = []
        for _ in range(25):
            res = vec.step(np.full(2, 3))  # right + B: run
            episodes += res.episodes
        assert res.truncated.all() and len(episodes) == 2
        for ep in episodes:
            assert ep.length == 25 and set(ep.metrics) == {"progress", "success"}  # the env's measures only
            assert ep.metrics["success"] == 0 and ep.metrics["progress"] > 40  # Mario ran to the right
            assert ep.ret > 0
    finally:
        vec.close()
