"""Atari (ale-py) with the DQN / Ape-X preprocessing: no-op starts, skip 4 + max-pool, 84x84 grey, stack 4.

The emulator is created through Gymnasium with ``frameskip=1`` and driven directly (``ale.act``), so
the skip, the max over the last two frames and the greyscale grab happen here, once per agent step.
Sticky actions are what the id says: ``ALE/*-v5`` repeats the previous action with probability 0.25
(Machado et al. 2018), ``*NoFrameskip-v4`` never does; the ``repeat_action_probability`` option
overrides either.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import gymnasium
import numpy as np

from flywheel.envs.options import EnvOptions
from flywheel.envs.preprocessing import FrameStack, resize_area

_REGISTERED = False


def register_ale() -> None:
    """Register ale-py's ids with Gymnasium (once); raises ImportError with the install hint."""
    global _REGISTERED
    if _REGISTERED:
        return
    try:
        import ale_py
    except ImportError as exc:  # pragma: no cover - ale-py is a dependency
        raise ImportError("Atari ids need ale-py: pip install 'ale-py>=0.12' (ROMs are bundled)") from exc
    gymnasium.register_envs(ale_py)
    _REGISTERED = True


def is_atari_id(env_id: str) -> bool:
    """True for an id registered by ale-py (``ALE/Pong-v5``, ``PongNoFrameskip-v4``, ...)."""
    register_ale()
    spec = gymnasium.registry.get(env_id)
    return spec is not None and str(spec.entry_point).startswith("ale_py")


def atari_env_ids() -> list[str]:
    """Every ale-py id, sorted."""
    register_ale()
    return sorted(i for i, s in gymnasium.registry.items() if str(s.entry_point).startswith("ale_py"))


@dataclass(frozen=True)
class AtariConfig(EnvOptions):
    """Preprocessing options for :class:`AtariEnv` (defaults: the DQN / Ape-X standard)."""

    FAMILY: ClassVar[str] = "Atari"

    noop_max: int = 30
    frame_skip: int = 4
    size: int = 84
    stack: int = 4
    terminal_on_life_loss: bool = True
    clip_rewards: bool = True
    repeat_action_probability: float | None = None  # None: the id's own (v5: 0.25, NoFrameskip-v4: 0)
    full_action_space: bool = False
    max_episode_steps: int | None = None  # agent steps; ALE's own cap (v5: 108,000 frames) always applies

    def __post_init__(self) -> None:
        """Reject invalid values with a clear message."""
        for name in ("frame_skip", "size", "stack"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"Atari option {name} must be >= 1, got {getattr(self, name)!r}")
        if self.noop_max < 0:
            raise ValueError(f"Atari option noop_max must be >= 0, got {self.noop_max!r}")
        if self.repeat_action_probability is not None and not 0 <= self.repeat_action_probability <= 1:
            raise ValueError(f"repeat_action_probability must be in [0, 1], got {self.repeat_action_probability!r}")
        if self.max_episode_steps is not None and self.max_episode_steps < 1:
            raise ValueError(f"max_episode_steps must be >= 1 or None, got {self.max_episode_steps!r}")

    @property
    def obs_shape(self) -> tuple[int, int, int]:
        """The stacked observation shape."""
        return (self.stack, self.size, self.size)


class AtariEnv(gymnasium.Env[np.ndarray, np.int64]):
    """One Atari game as ``uint8 (stack, 84, 84)`` observations.

    With ``terminal_on_life_loss`` (training), losing a life ends the episode as seen by the
    learner (``terminated``), and the next ``reset`` continues the same game with one no-op frame,
    as in the DQN/Ape-X setup. The game's own return and length (unclipped, over all lives) are
    reported in ``info["episode"]`` when the game really ends, so telemetry shows game scores.
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": ["rgb_array"]}
    reports_episodes = True

    def __init__(self, env_id: str, **options: Any) -> None:
        """Create the emulator for ``env_id`` (any ale-py id)."""
        if not is_atari_id(env_id):
            raise ValueError(f"not an ale-py id: {env_id!r}")
        self.config = AtariConfig.from_options(**options)
        kwargs: dict[str, Any] = {"frameskip": 1, "obs_type": "grayscale",
                                  "full_action_space": self.config.full_action_space}
        if self.config.repeat_action_probability is not None:
            kwargs["repeat_action_probability"] = float(self.config.repeat_action_probability)
        self._env = gymnasium.make(env_id, **kwargs).unwrapped
        self.env_id = env_id
        self._ale = self._env.ale
        self._actions = list(self._env._action_set)
        self._noop = self._actions[0]
        self.action_space = gymnasium.spaces.Discrete(len(self._actions))
        self.observation_space = gymnasium.spaces.Box(0, 255, self.config.obs_shape, dtype=np.uint8)
        height, width = self._ale.getScreenDims()
        self._frames = np.zeros((2, height, width), dtype=np.uint8)
        self._stack = FrameStack(self.config.stack, self.config.size, self.config.size)
        self._lives = 0
        self._continue_game = False
        self._game_return = 0.0
        self._game_length = 0
        self._closed = False

    def get_action_meanings(self) -> list[str]:
        """Names of the minimal (or full) action set."""
        return [a.name for a in self._actions]

    def _grab(self, slot: int) -> None:
        self._ale.getScreenGrayscale(self._frames[slot])

    def _observe(self, frame: np.ndarray) -> np.ndarray:
        return resize_area(frame, self.config.size, self.config.size)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[np.ndarray, dict[str, Any]]:
        """Start a new game with 1..noop_max no-op frames, or go on after a lost life."""
        super().reset(seed=seed)
        ale = self._ale
        if self._continue_game and seed is None:
            ale.act(self._noop)  # the DQN convention: one no-op frame after a lost life, same game
            self._continue_game = False
        else:
            self._env.reset(seed=seed)  # a seed reloads the ROM (about a second): only when one is given
            noops = int(self.np_random.integers(1, self.config.noop_max + 1)) if self.config.noop_max else 0
            for _ in range(noops):
                ale.act(self._noop)
                if ale.game_over():
                    self._env.reset()
            self._game_return = 0.0
            self._game_length = 0
            self._continue_game = False
        self._lives = ale.lives()
        self._grab(0)
        obs = self._stack.reset(self._observe(self._frames[0]))
        return obs, {"lives": self._lives}

    def step(self, action: int) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Repeat ``action`` for ``frame_skip`` frames and max-pool the last two."""
        ale = self._ale
        act = self._actions[int(action)]
        skip = self.config.frame_skip
        total = 0.0
        grabbed, last = 0, 0
        for frame in range(skip):
            total += ale.act(act)
            over = ale.game_over()
            if frame >= skip - 2 or over:
                last = grabbed % 2
                self._grab(last)
                grabbed += 1
            if over:
                break
        frame_out = np.maximum(self._frames[0], self._frames[1]) if grabbed >= 2 else self._frames[last]
        obs = self._stack.push(self._observe(frame_out))
        self._game_return += total
        self._game_length += 1
        game_over = ale.game_over(with_truncation=False)
        truncated = ale.game_truncated() or (
            self.config.max_episode_steps is not None and self._game_length >= self.config.max_episode_steps)
        lives = ale.lives()
        info: dict[str, Any] = {"lives": lives}
        life_lost = lives < self._lives and not game_over
        self._lives = lives
        terminated = game_over
        if life_lost and self.config.terminal_on_life_loss and not truncated:
            terminated = True
            self._continue_game = True
            info["life_lost"] = True
        if game_over or truncated:
            info["episode"] = {"return": self._game_return, "length": self._game_length}
            self._continue_game = False
        reward = float(np.sign(total)) if self.config.clip_rewards else total
        return obs, reward, bool(terminated), bool(truncated and not terminated), info

    def render(self) -> np.ndarray | None:
        """The full-resolution RGB screen."""
        return self._ale.getScreenRGB()

    def close(self) -> None:
        """Free the emulator; safe to call twice."""
        if not self._closed:
            self._closed = True
            self._env.close()
        super().close()
