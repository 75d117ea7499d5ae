"""Snake, vectorised in NumPy: one array operation steps every board; also a registered Gymnasium env.

Each board is an (H, W) grid. The body is stored as a countdown: a body cell holds how many more
steps it stays occupied (the head holds the snake's length, the tail 1), so moving is "decrement
every cell, write the new head" and growing is "skip the decrement". Observations are ``uint8
(3, H, W)`` images: body, head and food planes (255 where present). Actions are absolute
directions 0 up, 1 right, 2 down, 3 left; turning back onto the neck keeps the current direction.
Rewards: +1 for food, -1 for hitting a wall or the body, 0 otherwise. An episode is truncated
after ``hunger_limit`` steps without food (default: the number of cells) or ``max_episode_steps``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import gymnasium
import numpy as np

from flywheel.envs.options import EnvOptions
from flywheel.envs.vector import EpisodeEnd, SyncVectorEnv, VectorStep

SNAKE_IDS = ("Snake-v0", "flywheel/Snake-v0")
_MOVES = np.array([[-1, 0], [0, 1], [1, 0], [0, -1]], dtype=np.int64)  # up, right, down, left


@dataclass(frozen=True)
class SnakeConfig(EnvOptions):
    """Board size, starting length, starting distance to the walls and episode limits."""

    FAMILY: ClassVar[str] = "Snake"

    size: int = 10
    start_length: int = 3
    border_distance: int = 1  # free cells at least between the starting snake and every wall
    hunger_limit: int | None = None  # steps without food before truncation (None: size * size)
    max_episode_steps: int | None = None

    def __post_init__(self) -> None:
        """Reject boards the starting snake cannot fit on."""
        if self.size < 3:
            raise ValueError(f"Snake option size must be >= 3, got {self.size!r}")
        if self.start_length < 1:
            raise ValueError(f"Snake option start_length must be >= 1, got {self.start_length!r}")
        if self.border_distance < 0:
            raise ValueError(f"Snake option border_distance must be >= 0, got {self.border_distance!r}")
        if self.start_length + 2 * self.border_distance > self.size or 2 * self.border_distance >= self.size:
            raise ValueError(
                f"a snake of length {self.start_length} kept {self.border_distance} cells from the walls does not "
                f"fit on a {self.size}x{self.size} board"
            )
        for name in ("hunger_limit", "max_episode_steps"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"Snake option {name} must be >= 1 or None, got {value!r}")

    @property
    def obs_shape(self) -> tuple[int, int, int]:
        """Body, head and food planes."""
        return (3, self.size, self.size)


class SnakeVector(SyncVectorEnv):
    """``num_envs`` Snake boards stepped by array operations; board ``i`` is seeded with ``seed + i``."""

    n_actions = 4

    def __init__(self, num_envs: int, seed: int | None = None, slot_offset: int = 0, autoreset: bool = True,
                 **options: Any) -> None:
        """Allocate every board; call :meth:`reset` before stepping."""
        super().__init__()
        if num_envs < 1:
            raise ValueError("a vector needs at least one environment")
        self.config = SnakeConfig.from_options(**options)
        self.num_envs = num_envs
        self.obs_shape = self.config.obs_shape
        self.obs_dtype = np.dtype(np.uint8)
        self.slot_offset = slot_offset
        self.autoreset = autoreset
        n, size = num_envs, self.config.size
        seeds = np.random.SeedSequence(seed).spawn(n) if seed is None else [seed + i for i in range(n)]
        self.rngs = [np.random.default_rng(s) for s in seeds]
        self.body = np.zeros((n, size, size), dtype=np.int32)
        self.head = np.zeros((n, 2), dtype=np.int64)
        self.direction = np.zeros(n, dtype=np.int64)
        self.length = np.zeros(n, dtype=np.int64)
        self.food = np.zeros((n, 2), dtype=np.int64)
        self.steps = np.zeros(n, dtype=np.int64)
        self.hunger = np.zeros(n, dtype=np.int64)
        self.ret = np.zeros(n)
        self.hunger_limit = self.config.hunger_limit or size * size
        self._rows = np.arange(n)

    def _place_food(self, i: int) -> bool:
        """Put food on a random free cell of board ``i``; False when the board is full (a win)."""
        free = np.flatnonzero(self.body[i].ravel() == 0)
        if free.size == 0:
            return False
        cell = int(free[self.rngs[i].integers(free.size)])
        self.food[i] = divmod(cell, self.config.size)
        return True

    def reset_board(self, i: int) -> None:
        """A straight snake in a random direction, ``border_distance`` cells clear of the walls."""
        cfg, rng = self.config, self.rngs[i]
        length, d = cfg.start_length, cfg.border_distance
        direction = int(rng.integers(4))
        dr, dc = _MOVES[direction]
        # The tail is (length - 1) cells behind the head; both ends must stay inside [d, size - 1 - d].
        lo_r = d + max(0, dr * (length - 1))
        hi_r = cfg.size - 1 - d + min(0, dr * (length - 1))
        lo_c = d + max(0, dc * (length - 1))
        hi_c = cfg.size - 1 - d + min(0, dc * (length - 1))
        r, c = int(rng.integers(lo_r, hi_r + 1)), int(rng.integers(lo_c, hi_c + 1))
        self.body[i] = 0
        for k in range(length):
            self.body[i, r - dr * k, c - dc * k] = length - k
        self.head[i] = (r, c)
        self.direction[i] = direction
        self.length[i] = length
        self.steps[i] = 0
        self.hunger[i] = 0
        self.ret[i] = 0.0
        self._place_food(i)

    def observe(self) -> np.ndarray:
        """Body, head and food planes of every board as uint8 (n, 3, size, size)."""
        n = self.num_envs
        obs = np.zeros((n, *self.obs_shape), dtype=np.uint8)
        obs[:, 0] = (self.body > 0) * np.uint8(255)
        obs[self._rows, 1, self.head[:, 0], self.head[:, 1]] = 255
        obs[self._rows, 2, self.food[:, 0], self.food[:, 1]] = 255
        return obs

    def reset(self) -> np.ndarray:
        """Reset every board."""
        for i in range(self.num_envs):
            self.reset_board(i)
        return self.observe()

    def _step(self, actions: np.ndarray) -> VectorStep:
        actions = np.asarray(actions, dtype=np.int64)
        if actions.min(initial=0) < 0 or actions.max(initial=0) >= 4:
            raise ValueError(f"Snake actions must be in 0..3, got {actions}")
        size, rows = self.config.size, self._rows
        reverse = actions == (self.direction + 2) % 4
        self.direction = np.where(reverse & (self.length > 1), self.direction, actions)
        target = self.head + _MOVES[self.direction]
        wall = ((target < 0) | (target >= size)).any(axis=1)
        tr, tc = np.clip(target[:, 0], 0, size - 1), np.clip(target[:, 1], 0, size - 1)
        eat = ~wall & (tr == self.food[:, 0]) & (tc == self.food[:, 1])
        # Move: every body cell counts down unless the snake grows this step (the tail stays).
        self.body -= (~eat)[:, None, None] & (self.body > 0)
        bitten = ~wall & (self.body[rows, tr, tc] > 0)
        dead = wall | bitten
        alive = ~dead
        self.length += eat
        self.body[rows[alive], tr[alive], tc[alive]] = self.length[alive]
        self.head[alive] = np.stack([tr, tc], axis=1)[alive]
        self.steps += 1
        self.hunger = np.where(eat, 0, self.hunger + 1)
        reward = np.where(dead, -1.0, eat.astype(np.float64)).astype(np.float32)
        won = np.zeros(self.num_envs, dtype=bool)
        for i in np.flatnonzero(eat):
            won[i] = not self._place_food(int(i))
        terminated = dead | won
        limit = self.hunger >= self.hunger_limit
        if self.config.max_episode_steps is not None:
            limit |= self.steps >= self.config.max_episode_steps
        truncated = limit & ~terminated
        self.ret += reward
        obs = self.observe()
        episodes: list[EpisodeEnd] = []
        done = np.flatnonzero(terminated | truncated)
        final = obs.copy() if done.size and self.autoreset else obs
        for i in done:
            episodes.append(EpisodeEnd(self.slot_offset + int(i), float(self.ret[i]), int(self.steps[i]),
                                       {"length": float(self.length[i]), "won": float(won[i])}))
            if self.autoreset:
                self.reset_board(int(i))
        if done.size and self.autoreset:
            obs[done] = self.observe()[done]
        return VectorStep(obs, reward, terminated, truncated, final, episodes)


class SnakeEnv(gymnasium.Env[np.ndarray, np.int64]):
    """One Snake board as a Gymnasium env (the same code as one slot of :class:`SnakeVector`)."""

    metadata = {"render_modes": ["ansi"]}

    def __init__(self, render_mode: str | None = None, **options: Any) -> None:
        """Build one board with ``options`` (see :class:`SnakeConfig`)."""
        self._options = options
        self._vec = SnakeVector(1, None, autoreset=False, **options)
        self.config = self._vec.config
        self.render_mode = render_mode
        self.observation_space = gymnasium.spaces.Box(0, 255, self.config.obs_shape, dtype=np.uint8)
        self.action_space = gymnasium.spaces.Discrete(4)
        self._done = True

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[np.ndarray, dict[str, Any]]:
        """A new board; ``seed`` makes it equal to slot 0 of ``SnakeVector(n, seed)``."""
        super().reset(seed=seed)
        if seed is not None:
            self._vec.rngs[0] = np.random.default_rng(seed)
        obs = self._vec.reset()[0]
        self._done = False
        return obs, {"length": int(self._vec.length[0])}

    def step(self, action: int | np.integer[Any]) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Move one cell."""
        if self._done:
            raise RuntimeError("SnakeEnv.step called before reset() or after the episode ended")
        result = self._vec.step(np.array([int(action)]))
        terminated, truncated = bool(result.terminated[0]), bool(result.truncated[0])
        self._done = terminated or truncated
        return result.obs[0], float(result.reward[0]), terminated, truncated, {"length": int(self._vec.length[0])}

    def render(self) -> str | None:
        """The board as text: H head, o body, * food."""
        if self.render_mode != "ansi":
            return None
        grid = np.full((self.config.size, self.config.size), ".")
        grid[self._vec.body[0] > 0] = "o"
        grid[tuple(self._vec.food[0])] = "*"
        grid[tuple(self._vec.head[0])] = "H"
        return "\n".join("".join(row) for row in grid)


def register_snake() -> None:
    """Register Snake-v0 and flywheel/Snake-v0 with Gymnasium (idempotent)."""
    for env_id in SNAKE_IDS:
        if env_id not in gymnasium.registry:
            gymnasium.register(env_id, entry_point="flywheel.envs.snake:SnakeEnv")
