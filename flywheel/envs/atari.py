"""Atari (ale-py) with the DQN / Ape-X preprocessing, as SB3's AtariWrapper: no-op starts, FIRE on reset,
skip 4 + max-pool, 84x84 grey, stack 4, episodic life and reward clipping for training, a 108,000-frame cap.

The emulator is created through Gymnasium with ``frameskip=1`` and driven directly (``ale.act``), so
the skip, the max over the last two frames and the greyscale grab happen here, once per agent step.
Sticky actions are what the id says: ``ALE/*-v5`` repeats the previous action with probability 0.25
(Machado et al. 2018), ``*NoFrameskip-v4`` never does; the ``repeat_action_probability`` option
overrides either.

Training and evaluation differ only in two options: the defaults (``terminal_on_life_loss`` and
``clip_rewards`` on) are the training settings; :data:`EVALUATION_OPTIONS` turns both off, so an
evaluation episode is a whole game scored with the game's own points. ``flywheel.envs.evaluation_env_id``
applies them for every evaluation (flywheel.evaluation, the learner's best-policy evaluations,
actor-0's greedy env, ``flywheel play``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import gymnasium
import numpy as np

from flywheel.envs.ale_states import AleStartStates
from flywheel.envs.options import EnvOptions
from flywheel.envs.preprocessing import FrameStack, resize_area

_REGISTERED = False
MAX_EPISODE_FRAMES = 108_000  # 30 minutes of play at 60 Hz: the usual cap (Machado et al. 2018; 27,000 agent steps)
# What evaluation changes: a whole game (no episodic life) scored with the game's own points (no clipping).
EVALUATION_OPTIONS: dict[str, Any] = {"terminal_on_life_loss": False, "clip_rewards": False}


def register_ale() -> None:
    """Register ale-py's ids with Gymnasium (once); raises ImportError with the install hint."""
    global _REGISTERED
    if _REGISTERED:
        return
    try:
        import ale_py
    except ImportError as exc:  # ale-py is the atari extra
        from flywheel.extras import MissingExtra

        raise MissingExtra("atari", "Atari", exc) from exc
    gymnasium.register_envs(ale_py)
    _REGISTERED = True


def _ale_registered() -> bool:
    """Register ale-py's ids when it is installed; whether they are registered."""
    from flywheel.extras import MissingExtra

    try:
        register_ale()
    except MissingExtra:
        return False
    return True


def is_atari_id(env_id: str) -> bool:
    """True for an id registered by ale-py (``ALE/Pong-v5``, ``PongNoFrameskip-v4``, ...); False without ale-py."""
    if not _ale_registered():
        return False
    spec = gymnasium.registry.get(env_id)
    return spec is not None and str(spec.entry_point).startswith("ale_py")


def atari_env_ids() -> list[str]:
    """Every ale-py id, sorted (none without ale-py, the atari extra)."""
    if not _ale_registered():
        return []
    return sorted(i for i, s in gymnasium.registry.items() if str(s.entry_point).startswith("ale_py"))


@dataclass(frozen=True)
class AtariConfig(EnvOptions):
    """Preprocessing options for :class:`AtariEnv` (defaults: the DQN / Ape-X training standard).

    ``noop_max``: a new game starts with 1..noop_max no-op frames, drawn from the reset seed (0: none).
    ``fire_reset``: press FIRE then action 2 (``frame_skip`` frames each) when a game starts and after a
    lost life, as SB3's FireResetEnv; None (default): when the game's action 1 is FIRE. ``terminal_on_life_loss``
    (episodic life, SB3's name): a lost life ends the training episode, the game goes on. ``clip_rewards``: the
    reward is its sign. ``max_episode_frames``: emulator frames per game, no-ops included (0: no cap).
    ``max_episode_steps``: agent steps per game (None: no cap beyond the frames).
    """

    FAMILY: ClassVar[str] = "Atari"

    noop_max: int = 30
    fire_reset: bool | None = None  # None: when the game's action meanings have FIRE (action 1)
    frame_skip: int = 4
    size: int = 84
    stack: int = 4
    terminal_on_life_loss: bool = True
    clip_rewards: bool = True
    repeat_action_probability: float | None = None  # None: the id's own (v5: 0.25, NoFrameskip-v4: 0)
    full_action_space: bool = False
    max_episode_frames: int = MAX_EPISODE_FRAMES  # ALE's max_num_frames_per_episode: a truncation
    max_episode_steps: int | None = None  # agent steps

    def __post_init__(self) -> None:
        """Reject invalid values with a clear message."""
        for name in ("frame_skip", "size", "stack"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"Atari option {name} must be >= 1, got {getattr(self, name)!r}")
        if self.noop_max < 0:
            raise ValueError(f"Atari option noop_max must be >= 0, got {self.noop_max!r}")
        if self.max_episode_frames < 0:
            raise ValueError(f"Atari option max_episode_frames must be >= 0 (0: no cap), "
                             f"got {self.max_episode_frames!r}")
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

    A new game (a reset with a seed, or after game over) starts with 1..``noop_max`` no-op frames drawn
    from the env's generator (seeded by the reset seed, so a seed always gives the same start), then, for
    games that need it, FIRE and action 2 (``fire_reset``). With ``terminal_on_life_loss`` (training),
    losing a life ends the episode as seen by the learner (``terminated``), and the next ``reset`` continues
    the same game with one no-op frame (and FIRE), as in the DQN/Ape-X setup; without it, a lost life is
    followed by FIRE inside the same step, so a policy that never learned to serve (training always served
    for it) does not stand still until the frame cap. ``info["life_lost"]`` marks a lost life. The game's own
    return and length (unclipped, over all lives, in agent steps) are reported in ``info["episode"]`` when the
    game really ends (game over or a cap), and only then, so telemetry and evaluation show game scores.
    """

    metadata = {"render_modes": ["rgb_array"]}
    reports_episodes = True

    def __init__(self, env_id: str, **options: Any) -> None:
        """Create the emulator for ``env_id`` (any ale-py id)."""
        if not is_atari_id(env_id):
            raise ValueError(f"not an ale-py id: {env_id!r}")
        self.config = AtariConfig.from_options(**options)
        kwargs: dict[str, Any] = {"frameskip": 1, "obs_type": "grayscale",
                                  "full_action_space": self.config.full_action_space,
                                  "max_num_frames_per_episode": int(self.config.max_episode_frames)}
        if self.config.repeat_action_probability is not None:
            kwargs["repeat_action_probability"] = float(self.config.repeat_action_probability)
        from ale_py.env import AtariEnv as Emulator

        emulator = gymnasium.make(env_id, **kwargs).unwrapped
        if not isinstance(emulator, Emulator):
            raise ValueError(f"{env_id!r} did not build an ale-py emulator but {type(emulator).__name__}")
        self._env = emulator
        self.env_id = env_id
        self._ale = self._env.ale
        self._actions = list(self._env._action_set)
        self._noop = self._actions[0]
        meanings = self.get_action_meanings()
        fire_game = len(meanings) >= 3 and meanings[1] == "FIRE"  # SB3's FireResetEnv test
        if self.config.fire_reset and not fire_game:
            raise ValueError(f"Atari option fire_reset=true needs FIRE as action 1; {env_id} has {meanings}")
        self.fire_reset = fire_game if self.config.fire_reset is None else bool(self.config.fire_reset)
        self.action_space = gymnasium.spaces.Discrete(len(self._actions))
        self.observation_space = gymnasium.spaces.Box(0, 255, self.config.obs_shape, dtype=np.uint8)
        height, width = self._ale.getScreenDims()
        self._frames = np.zeros((2, height, width), dtype=np.uint8)
        self._stack = FrameStack(self.config.stack, self.config.size, self.config.size)
        self._lives = 0
        self._continue_game = False
        self._game_return = 0.0
        self._game_length = 0
        self.noops = 0  # no-op frames at the start of the current game
        self._closed = False
        self._start_states: AleStartStates | None = None

    def start_states(self) -> AleStartStates:
        """Its start states for the curriculum (flywheel.envs.start_states): ``cloneState``, many."""
        if self._start_states is None:
            self._start_states = AleStartStates(self)
        return self._start_states

    def _continue_from_state(self, state: Any, steps: int, states: AleStartStates) -> tuple[np.ndarray, dict[str, Any]]:
        """Restore an emulator state as a new game (return counted from here): (obs, info)."""
        self._ale.restoreState(state)
        states.offset = steps
        self._continue_game = False
        self._game_return, self._game_length = 0.0, 0
        self._lives = self._ale.lives()
        self._grab(0)
        return self._stack.reset(self._observe(self._frames[0])), {"lives": self._lives, "noops": 0}

    def get_action_meanings(self) -> list[str]:
        """Names of the minimal (or full) action set."""
        return [a.name for a in self._actions]

    def _grab(self, slot: int) -> None:
        self._ale.getScreenGrayscale(self._frames[slot])

    def _observe(self, frame: np.ndarray) -> np.ndarray:
        return resize_area(frame, self.config.size, self.config.size)

    def _repeat(self, act: Any) -> tuple[float, np.ndarray]:
        """Play ``act`` for ``frame_skip`` frames (fewer if the game ends): the reward and the max of the last two."""
        ale = self._ale
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
        return total, (np.maximum(self._frames[0], self._frames[1]) if grabbed >= 2 else self._frames[last])

    def _fire(self) -> tuple[float, np.ndarray]:
        """FIRE, then action 2, ``frame_skip`` frames each (SB3's FireResetEnv); stops early at game over."""
        total, frame = self._repeat(self._actions[1])
        if not self._ale.game_over():
            reward, frame = self._repeat(self._actions[2])
            total += reward
        return total, frame

    def _new_game(self, seed: int | None) -> None:
        """Reset the emulator (a seed reloads the ROM: only when one is given) and play the no-op start."""
        ale = self._ale
        self._env.reset(seed=seed)
        self.noops = int(self.np_random.integers(1, self.config.noop_max + 1)) if self.config.noop_max else 0
        for _ in range(self.noops):
            ale.act(self._noop)
            if ale.game_over():
                self._env.reset()
        self._game_return = 0.0
        self._game_length = 0

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[np.ndarray, dict[str, Any]]:
        """Start a new game with 1..noop_max no-op frames (and FIRE), or go on after a lost life."""
        super().reset(seed=seed)
        ale = self._ale
        if self._continue_game and seed is None:
            ale.act(self._noop)  # the DQN convention: one no-op frame after a lost life, same game
        else:
            self._new_game(seed)
        self._continue_game = False
        frame = None
        for _ in range(3):  # FIRE ends the game only in a game that is over anyway: start another
            if not self.fire_reset:
                break
            reward, frame = self._fire()
            self._game_return += reward
            if not ale.game_over():
                break
            self._new_game(None)
            frame = None
        if frame is None:
            self._grab(0)
            frame = self._frames[0]
        self._lives = ale.lives()
        obs = self._stack.reset(self._observe(frame))
        return obs, {"lives": self._lives, "noops": self.noops}

    def step(self, action: int | np.integer[Any]) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Repeat ``action`` for ``frame_skip`` frames and max-pool the last two."""
        ale = self._ale
        total, frame = self._repeat(self._actions[int(action)])
        lives = ale.lives()
        life_lost = lives < self._lives and not ale.game_over(with_truncation=False)
        if life_lost and self.fire_reset and not self.config.terminal_on_life_loss and not ale.game_over():
            reward, frame = self._fire()  # serve again inside this step: the game goes on
            total += reward
            lives = ale.lives()
        obs = self._stack.push(self._observe(frame))
        self._game_return += total
        self._game_length += 1
        game_over = ale.game_over(with_truncation=False)
        truncated = ale.game_truncated() or (
            self.config.max_episode_steps is not None and self._game_length >= self.config.max_episode_steps)
        info: dict[str, Any] = {"lives": lives}
        self._lives = lives
        terminated = game_over
        if life_lost:
            info["life_lost"] = True
            if self.config.terminal_on_life_loss and not truncated:
                terminated = True
                self._continue_game = True
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
