"""Corridor-v0: walk right to the end of a corridor; a tiny example of your own env for Flywheel.

Train it with ``flywheel run --env flywheel.examples.corridor:Corridor-v0``: every service imports this
module from the id, and importing it registers ``Corridor-v0`` with Gymnasium. The agent starts on a
random cell of a corridor of ``length`` cells (never the last one) and sees its position one-hot, as a
``float32 (length,)`` vector. Actions: 0 left, 1 stay, 2 right. Each step costs 0.01; reaching the last
cell ends the episode with +1 instead. Episodes are truncated after 50 steps. The best policy (always
right) scores ``1 - 0.01 * (d - 1)`` from ``d`` cells away, 0.97 on average with the default length 8;
a policy that never arrives scores -0.5.
"""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces

ENV_ID = "Corridor-v0"
MAX_EPISODE_STEPS = 50
STEP_COST = 0.01
CELL_PX = 32  # rendered cell size: frames are (CELL_PX, length * CELL_PX, 3)


class CorridorEnv(gymnasium.Env[np.ndarray, np.int64]):
    """A 1-D corridor: discrete actions, a Box observation, a reward only at the far end."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 8}

    def __init__(self, length: int = 8, render_mode: str | None = None) -> None:
        """``length`` cells (at least 2); ``render_mode`` None or "rgb_array"."""
        if not isinstance(length, int) or isinstance(length, bool) or length < 2:
            raise ValueError(f"Corridor option length must be an integer >= 2, got {length!r}")
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"Corridor render_mode must be None or 'rgb_array', got {render_mode!r}")
        self.length = length
        self.render_mode = render_mode
        self.observation_space = spaces.Box(0.0, 1.0, (length,), dtype=np.float32)
        self.action_space = spaces.Discrete(3)
        self._pos = 0

    def _obs(self) -> np.ndarray:
        obs = np.zeros(self.length, dtype=np.float32)
        obs[self._pos] = 1.0
        return obs

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        """Start on a random cell that is not the goal."""
        super().reset(seed=seed)
        self._pos = int(self.np_random.integers(0, self.length - 1))
        return self._obs(), {"position": self._pos}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        """Move left (0), stay (1) or right (2); +1 on reaching the last cell, else -0.01."""
        move = int(action)
        if not 0 <= move <= 2:
            raise ValueError(f"Corridor action must be 0, 1 or 2, got {action!r}")
        self._pos = min(max(self._pos + move - 1, 0), self.length - 1)
        arrived = self._pos == self.length - 1
        return self._obs(), 1.0 if arrived else -STEP_COST, arrived, False, {"position": self._pos}

    def render(self) -> np.ndarray | None:
        """An RGB strip: grey floor, green goal, red agent."""
        if self.render_mode != "rgb_array":
            return None
        cells = np.full((self.length, 3), 90, dtype=np.uint8)
        cells[-1] = (40, 170, 60)
        cells[self._pos] = (220, 50, 40)
        row = np.repeat(cells, CELL_PX, axis=0)  # (length * CELL_PX, 3)
        return np.ascontiguousarray(np.broadcast_to(row, (CELL_PX, *row.shape)))


if ENV_ID not in gymnasium.registry:  # registered once, when the module is first imported
    gymnasium.register(id=ENV_ID, entry_point=f"{__name__}:CorridorEnv", max_episode_steps=MAX_EPISODE_STEPS)
