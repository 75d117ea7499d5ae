"""Registered Gymnasium envs adapted to Flywheel's observation/action conventions."""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces


class FlywheelObservation(gymnasium.ObservationWrapper[np.ndarray, Any, Any]):
    """Emit uint8 pixels unchanged and everything else as a flat-or-shaped float32 array.

    Box observations of dtype uint8 are passed through; other Box, MultiBinary
    and MultiDiscrete observations are cast to float32; Discrete observations
    become float32 one-hot vectors.  Dict/Tuple/Graph/Text spaces are rejected.
    """

    def __init__(self, env: gymnasium.Env[Any, Any]) -> None:
        """Validate the observation space and derive the converted one."""
        super().__init__(env)
        space = env.observation_space
        self._one_hot: tuple[int, int] | None = None
        self._cast = True
        if isinstance(space, spaces.Box) and space.dtype == np.uint8:
            self._cast = False
            self.observation_space = space
        elif isinstance(space, spaces.Box):
            low = np.asarray(space.low, dtype=np.float32)
            high = np.asarray(space.high, dtype=np.float32)
            self.observation_space = spaces.Box(low, high, space.shape, dtype=np.float32)
        elif isinstance(space, spaces.Discrete):
            self._one_hot = (int(space.n), int(space.start))
            self.observation_space = spaces.Box(0.0, 1.0, (int(space.n),), dtype=np.float32)
        elif isinstance(space, spaces.MultiBinary | spaces.MultiDiscrete):
            top = 1.0 if isinstance(space, spaces.MultiBinary) else np.asarray(space.nvec, np.float32) - 1
            self.observation_space = spaces.Box(0.0, top, space.shape, dtype=np.float32)
        else:
            raise ValueError(
                f"unsupported observation space {space} for {env.spec.id if env.spec else env}; "
                "Flywheel needs Box, Discrete, MultiBinary or MultiDiscrete observations"
            )

    def observation(self, observation: Any) -> np.ndarray:
        """Convert one observation."""
        if self._one_hot is not None:
            n, start = self._one_hot
            out = np.zeros(n, dtype=np.float32)
            out[int(observation) - start] = 1.0
            return out
        if not self._cast:
            return observation
        return np.asarray(observation, dtype=np.float32)


class ZeroBasedActions(gymnasium.ActionWrapper[Any, np.int64, Any]):
    """Map agent actions 0..n-1 onto a Discrete(n, start=k) action space."""

    def __init__(self, env: gymnasium.Env[Any, Any]) -> None:
        """Wrap an env whose Discrete action space has a non-zero start."""
        super().__init__(env)
        space = env.action_space
        if not isinstance(space, spaces.Discrete):
            raise ValueError(f"ZeroBasedActions wraps a Discrete action space, got {space}")
        self._start = int(space.start)
        self.action_space = spaces.Discrete(int(space.n))

    def action(self, action: Any) -> Any:
        """Shift the action by the original space's start."""
        return np.int64(int(action) + self._start)


def make_gymnasium_env(env_id: str, **options: Any) -> gymnasium.Env[np.ndarray, Any]:
    """Build a registered Gymnasium env and adapt its spaces; options go to gymnasium.make."""
    options.setdefault("disable_env_checker", True)  # the passive checker is one more wrapper call per step
    env = gymnasium.make(env_id, **options)
    action_space = env.action_space
    if not isinstance(action_space, spaces.Discrete):
        env.close()
        raise ValueError(
            f"environment {env_id!r} has action space {action_space}; Flywheel's DQN supports only "
            "Discrete action spaces (pick a discrete variant, e.g. continuous=False where offered)"
        )
    if int(action_space.start) != 0:
        env = ZeroBasedActions(env)
    try:
        return FlywheelObservation(env)
    except ValueError:
        env.close()
        raise
