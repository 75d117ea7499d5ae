"""GridWalk-v0: a game Flywheel has never heard of, with measures of its own (tests/pipeline/test_env_measures.py).

Everything Flywheel needs to show this game's measures is in this module: ``metadata["measures"]`` names them
(``cells visited`` and ``goal``) and every step's info carries them (``progress``: the distinct cells this episode
has visited; ``success``: whether the agent stands on the goal; at the last step ``end``: why it ended). The agent
walks a 4x4 grid from the top-left corner to the goal in the bottom-right one and sees its cell one-hot
(``float32 (16,)``). Actions: 0 up, 1 right, 2 down, 3 left. Each step costs 0.01; reaching the goal ends the
episode with +1 instead; the episode is cut after 30 steps. Reached as ``measured_env:GridWalk-v0`` (the module on
PYTHONPATH): importing it registers the id with Gymnasium.
"""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
from gymnasium import spaces

ENV_ID = "GridWalk-v0"
SIDE = 4
MAX_STEPS = 30
CELL_PX = 16  # rendered cell size: frames are (SIDE * CELL_PX, SIDE * CELL_PX, 3)
MOVES = ((-1, 0), (0, 1), (1, 0), (0, -1))  # up, right, down, left as (row, column)


class GridWalkEnv(gymnasium.Env[np.ndarray, np.int64]):
    """A 4x4 grid walk that declares and reports a progress and a success measure."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 8,
                "measures": {"progress": "cells visited", "success": "goal"}}

    def __init__(self, render_mode: str | None = None) -> None:
        """``render_mode`` None or "rgb_array"."""
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"GridWalk render_mode must be None or 'rgb_array', got {render_mode!r}")
        self.render_mode = render_mode
        self.observation_space = spaces.Box(0.0, 1.0, (SIDE * SIDE,), dtype=np.float32)
        self.action_space = spaces.Discrete(len(MOVES))
        self._cell, self._steps = (0, 0), 0
        self._visited: set[tuple[int, int]] = set()

    def _obs(self) -> np.ndarray:
        obs = np.zeros(SIDE * SIDE, dtype=np.float32)
        obs[self._cell[0] * SIDE + self._cell[1]] = 1.0
        return obs

    def _info(self) -> dict[str, Any]:
        return {"progress": float(len(self._visited)), "success": self._cell == (SIDE - 1, SIDE - 1)}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[np.ndarray, dict]:
        """Start in the top-left corner."""
        super().reset(seed=seed)
        self._cell, self._steps = (0, 0), 0
        self._visited = {self._cell}
        return self._obs(), self._info()

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        """Move one cell (walls hold the agent in place); +1 on reaching the goal, else -0.01."""
        move = int(action)
        if not 0 <= move < len(MOVES):
            raise ValueError(f"GridWalk action must be 0-3, got {action!r}")
        row, col = self._cell[0] + MOVES[move][0], self._cell[1] + MOVES[move][1]
        self._cell = (min(max(row, 0), SIDE - 1), min(max(col, 0), SIDE - 1))
        self._visited.add(self._cell)
        self._steps += 1
        info = self._info()
        terminated, truncated = bool(info["success"]), self._steps >= MAX_STEPS
        if terminated or truncated:
            info["end"] = "goal" if terminated else "clock"
        return self._obs(), 1.0 if terminated else -0.01, terminated, truncated and not terminated, info

    def render(self) -> np.ndarray | None:
        """An RGB picture of the grid: grey floor, blue visited cells, green goal, red agent."""
        if self.render_mode != "rgb_array":
            return None
        cells = np.full((SIDE, SIDE, 3), 90, dtype=np.uint8)
        for cell in self._visited:
            cells[cell] = (60, 90, 160)
        cells[SIDE - 1, SIDE - 1] = (40, 170, 60)
        cells[self._cell] = (220, 50, 40)
        return np.ascontiguousarray(np.repeat(np.repeat(cells, CELL_PX, axis=0), CELL_PX, axis=1))


if ENV_ID not in gymnasium.registry:  # registered once, when the module is first imported
    gymnasium.register(id=ENV_ID, entry_point=f"{__name__}:GridWalkEnv")
