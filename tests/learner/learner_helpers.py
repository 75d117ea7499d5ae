"""Helpers for the learner tests: CartPole-shaped sample batches and free TCP ports."""

from __future__ import annotations

import numpy as np

from flywheel import proto


def make_batch(rng: np.random.Generator, size: int = 32, obs_shape: tuple[int, ...] = (4,), n_actions: int = 2,
               request_id: int = 0, pixels: bool = False) -> proto.SampleBatch:
    if pixels:
        obs = rng.integers(0, 256, (size, *obs_shape), dtype=np.uint8)
        next_obs = rng.integers(0, 256, (size, *obs_shape), dtype=np.uint8)
    else:
        obs = rng.standard_normal((size, *obs_shape)).astype(np.float32)
        next_obs = rng.standard_normal((size, *obs_shape)).astype(np.float32)
    return proto.SampleBatch(
        request_id=request_id, replay_size=1000, obs=obs,
        action=rng.integers(0, n_actions, size, dtype=np.int64),
        reward=rng.standard_normal(size).astype(np.float32),
        discount=np.full(size, 0.99**3, dtype=np.float32),
        next_obs=next_obs, index=rng.integers(0, 1000, size, dtype=np.int64),
        weight=rng.uniform(0.2, 1.0, size).astype(np.float32),
    )
