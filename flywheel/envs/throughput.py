"""Measure raw single-process env throughput: ``python -m flywheel.envs.throughput [ENV_ID] [STEPS]``."""

from __future__ import annotations

import sys
import time

import numpy as np

from flywheel.envs import action_count, make_env


def agent_steps_per_second(env_id: str = "SuperMarioBros-1-1-v0", steps: int = 2000, seed: int = 0) -> float:
    """Step ``env_id`` with uniformly random actions and return agent steps per second."""
    env = make_env(env_id, seed=seed)
    rng = np.random.default_rng(seed)
    env.reset(seed=seed)
    n_actions = action_count(env.action_space)
    start = time.perf_counter()
    for _ in range(steps):
        _, _, terminated, truncated, _ = env.step(int(rng.integers(n_actions)))
        if terminated or truncated:
            env.reset()
    elapsed = time.perf_counter() - start
    env.close()
    return steps / elapsed


if __name__ == "__main__":
    env_id = sys.argv[1] if len(sys.argv) > 1 else "SuperMarioBros-1-1-v0"
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
    print(f"{env_id}: {agent_steps_per_second(env_id, steps):.1f} agent steps/s (incl. resets)")
