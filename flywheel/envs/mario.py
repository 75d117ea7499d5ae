"""Super Mario Bros (nes-py) as a Gymnasium env with Ape-X/Nature DQN preprocessing."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import gymnasium
import numpy as np

from flywheel.envs import nes_compat
from flywheel.envs.mario_ids import parse_mario_id
from flywheel.envs.measures import END, PROGRESS, SUCCESS
from flywheel.envs.nes_states import NesStartStates
from flywheel.envs.options import EnvOptions
from flywheel.envs.preprocessing import FrameStack, bgrx_to_grey, resize_area, rgb_to_grey

# Button bitmaps of the NES joypad (same as nes_py.wrappers.JoypadSpace).
BUTTONS: dict[str, int] = {
    "right": 0b10000000,
    "left": 0b01000000,
    "down": 0b00100000,
    "up": 0b00010000,
    "start": 0b00001000,
    "select": 0b00000100,
    "B": 0b00000010,
    "A": 0b00000001,
    "NOOP": 0b00000000,
}

# Reduced action sets, identical to gym_super_mario_bros.actions.
ACTION_SETS: dict[str, tuple[tuple[str, ...], ...]] = {
    "right_only": (("NOOP",), ("right",), ("right", "A"), ("right", "B"), ("right", "A", "B")),
    "simple": (
        ("NOOP",), ("right",), ("right", "A"), ("right", "B"), ("right", "A", "B"), ("A",), ("left",),
    ),
    "complex": (
        ("NOOP",), ("right",), ("right", "A"), ("right", "B"), ("right", "A", "B"), ("A",), ("left",),
        ("left", "A"), ("left", "B"), ("left", "A", "B"), ("down",), ("up",),
    ),
}  # fmt: skip

INFO_KEYS = ("x_pos", "y_pos", "flag_get", "world", "stage", "score", "time", "life", "coins", "status")


@dataclass(frozen=True)
class MarioConfig(EnvOptions):
    """Validated preprocessing options for :class:`MarioEnv`."""

    FAMILY: ClassVar[str] = "Mario"

    actions: str = "simple"
    frame_skip: int = 4
    stack: int = 4
    size: int = 84
    crop_top: int = 0  # screen rows dropped before resizing; 32 drops the HUD (score, coins, world, clock)
    max_episode_steps: int | None = 4500
    stages: tuple[str, ...] | None = None  # RandomStages only, e.g. ("1-1", "1-2")
    render_mode: str | None = None
    # Reward shaping (docs/ENVIRONMENTS.md): (built-in reward + flag_bonus at a flag - death_penalty at a death)
    # x reward_scale, then clipped to +-reward_clip when set.
    reward_scale: float = 0.1
    flag_bonus: float = 50.0
    death_penalty: float = 50.0
    reward_clip: float | None = None
    progress_reward: str = "x"  # "x": the library's reward for every x step; "frontier": only a new furthest x
    # Training only (evaluation_env_id drops it): truncate an episode after this many agent steps without a new
    # furthest x of its stage, so a Mario held against a pipe does not fill the replay until the level clock.
    stall_steps: int | None = None
    # The game jumps only on a fresh press of A, and the frames cannot show whether A is held: a policy that keeps
    # choosing a jump action after landing stands still (against a wall, until the level clock ends it). True: A
    # held on the ground since an earlier frame is let go for one frame, so a jump action on the ground jumps.
    rejump: bool = False

    def __post_init__(self) -> None:
        """Reject invalid option values with a clear message."""
        if self.actions not in ACTION_SETS:
            raise ValueError(f"actions must be one of {sorted(ACTION_SETS)}, got {self.actions!r}")
        for name in ("frame_skip", "stack", "size"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if not 0 <= int(self.crop_top) <= 200:
            raise ValueError(f"crop_top must be 0..200 screen rows (of 240), got {self.crop_top!r}")
        if self.max_episode_steps is not None and self.max_episode_steps < 1:
            raise ValueError(f"max_episode_steps must be >= 1 or None, got {self.max_episode_steps!r}")
        if self.render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode must be None or 'rgb_array', got {self.render_mode!r}")
        if not (math.isfinite(self.reward_scale) and self.reward_scale > 0):
            raise ValueError(f"reward_scale must be a finite number > 0, got {self.reward_scale!r}")
        for name in ("flag_bonus", "death_penalty"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number >= 0 (a magnitude), got {value!r}")
        if self.reward_clip is not None and not (math.isfinite(self.reward_clip) and self.reward_clip > 0):
            raise ValueError(f"reward_clip must be a finite number > 0 or None, got {self.reward_clip!r}")
        if self.stall_steps is not None and self.stall_steps < 1:
            raise ValueError(f"stall_steps must be >= 1 or None, got {self.stall_steps!r}")
        if self.progress_reward not in ("x", "frontier"):
            raise ValueError(f"progress_reward must be 'x' or 'frontier', got {self.progress_reward!r}")

    def shape_reward(self, raw: float, flag: bool, death: bool) -> float:
        """One agent step's reward: the built-in reward plus flag bonus minus death penalty, scaled, clipped."""
        total = (raw + (self.flag_bonus if flag else 0.0) - (self.death_penalty if death else 0.0)) * self.reward_scale
        if self.reward_clip is not None:
            total = min(max(total, -self.reward_clip), self.reward_clip)
        return total

    @classmethod
    def from_options(cls, **options: Any) -> MarioConfig:
        """Build from keyword options, rejecting unknown names (``stages`` may come as a list)."""
        if isinstance(options.get("stages"), list | tuple):
            options["stages"] = tuple(options["stages"])
        return super().from_options(**options)

    @property
    def obs_shape(self) -> tuple[int, int, int]:
        """Return the stacked observation shape (stack, size, size)."""
        return (self.stack, self.size, self.size)

    @property
    def n_actions(self) -> int:
        """Return the size of the reduced action set."""
        return len(ACTION_SETS[self.actions])


def _plain(value: Any) -> Any:
    """Convert NumPy scalars in info values to Python builtins."""
    return value.item() if isinstance(value, np.generic) else value


def _with_measures(info: dict[str, Any]) -> dict[str, Any]:
    """Add the env's measures to a library info dict: progress = ``x_pos``, success = ``flag_get``."""
    info[PROGRESS] = float(info.get("x_pos") or 0)
    info[SUCCESS] = bool(info.get("flag_get", False))
    return info


def _raw_screen(screen: np.ndarray) -> np.ndarray | None:
    """Return nes-py's native (H, W, 4) BGRx frame buffer behind its RGB view, if recognisable.

    nes-py exposes ``screen`` as a channel-reversed, padding-dropped view of the
    emulator's little-endian 32-bit pixels; reading the buffer directly avoids a
    copy per frame.  Returns None (use the RGB view) if the layout is unexpected.
    """
    base = screen.base
    height, width, _ = screen.shape
    if (
        sys.byteorder != "little"
        or not isinstance(base, np.ndarray)
        or base.dtype != np.uint8
        or base.size != height * width * 4
        or screen.strides != (width * 4, 4, -1)
    ):
        return None
    raw = base.reshape(height, width, 4)
    # the RGB view's red byte must be byte 2 of the matching BGRx pixel
    if raw[..., 2].__array_interface__["data"][0] != screen.__array_interface__["data"][0]:
        return None
    return raw


class MarioEnv(gymnasium.Env[np.ndarray, np.int64]):
    """Super Mario Bros with frame skip + 2-frame max-pool, 84x84 greyscale and frame stacking.

    ``terminated`` follows gym-super-mario-bros: game over for whole-game ids,
    death or flag for single-stage ids.  ``truncated`` is set after
    ``max_episode_steps`` agent steps, and (training only) after ``stall_steps``
    without a new furthest x.  The reward is the library's per-frame reward
    (x progress, clock and a -15 death penalty) summed over skipped frames,
    plus ``flag_bonus`` on the step that reaches a flag, minus ``death_penalty`` on
    the step that loses a life, times ``reward_scale`` and optionally clipped
    (:meth:`MarioConfig.shape_reward`).  ``info["raw_reward"]`` keeps the library's sum.

    Its measures (flywheel.envs.measures): progress ``x_pos``, success the flag; ``info["end"]``: "flag", "death",
    "clock" (the level's timer ran out), "time_limit" (``max_episode_steps``) or "stall" (``stall_steps``).
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 60,
                "measures": {PROGRESS: "furthest x", SUCCESS: "flag"}}  # flywheel.envs.measures

    def __init__(self, env_id: str, **options: Any) -> None:
        """Build the NES emulator for ``env_id`` (a gym-super-mario-bros id)."""
        parsed = parse_mario_id(env_id)
        if parsed is None:
            raise ValueError(f"not a Super Mario Bros id: {env_id!r}")
        self.config = MarioConfig.from_options(**options)
        if self.config.stages is not None and not parsed.random_stages:
            raise ValueError("option 'stages' is only valid for SuperMarioBrosRandomStages-vN ids")
        nes_compat.apply()
        import gym_super_mario_bros as smb

        self.env_id = env_id
        self.mario_id = parsed
        self.render_mode = self.config.render_mode
        if parsed.random_stages:
            stages = list(self.config.stages) if self.config.stages else None
            self._nes = smb.SuperMarioBrosRandomStagesEnv(rom_mode=parsed.rom_mode, stages=stages)
        else:
            self._nes = self._new_emulator()
        buttons = ACTION_SETS[self.config.actions]
        self._action_bytes = [sum(BUTTONS[b] for b in combo) for combo in buttons]
        self._action_meanings = [" ".join(combo) for combo in buttons]
        self.action_space = gymnasium.spaces.Discrete(len(buttons))
        self.observation_space = gymnasium.spaces.Box(0, 255, self.config.obs_shape, dtype=np.uint8)
        self._stack = FrameStack(self.config.stack, self.config.size, self.config.size)
        self._raw_screens: dict[int, np.ndarray | None] = {}
        self._steps = 0
        self._life: int | None = None
        self._flag = False
        self._a_frames = 0  # rejump: how many frames played last in a row held A (counted to 2)
        self._x_last = self._x_best = 0  # progress_reward=frontier: the last frame's x and the episode's furthest
        self._stall: tuple[Any, int, int] = (None, 0, 0)  # stall_steps: the stage, its furthest x, steps since it grew
        self._stage: tuple[Any, Any] | None = None
        self._needs_reset = True
        self._closed = False
        self._start_states: NesStartStates | None = None
        # Called after every emulator frame, skipped ones included, with the RGB screen (240, 256, 3) as a view
        # that the next frame overwrites: videos at the game's real frame rate (flywheel play). None: not called.
        self.frame_hook: Callable[[np.ndarray], None] | None = None

    def _new_emulator(self) -> Any:
        """A SuperMarioBrosEnv of this (non-random) id, at the level start with it in its backup slot."""
        import gym_super_mario_bros as smb

        parsed = self.mario_id
        return smb.SuperMarioBrosEnv(rom_mode=parsed.rom_mode, lost_levels=parsed.lost_levels, target=parsed.target)

    def start_states(self) -> NesStartStates | None:
        """Its start states for the curriculum (flywheel.envs.start_states): single-stage ids only, where x_pos
        measures progress; None for whole-game and random-stage ids."""
        if self.mario_id.target is None:
            return None
        if self._start_states is None:
            self._start_states = NesStartStates(self)
        return self._start_states

    def _continue_from_emulator(self) -> tuple[np.ndarray, dict[str, Any]]:
        """Begin an episode from the emulator's current state (a restored start state): (obs, info)."""
        self._steps = 0
        self._needs_reset = False
        frames = self._start_states.frames[-2:] if self._start_states is not None else b""
        self._a_frames = 0  # a restored state's last frames, as played
        for byte in frames:
            self._a_frames = self._a_frames + 1 if byte & BUTTONS["A"] else 0
        obs = self._stack.reset(self._observe(self._grey()))
        info = self._info()
        self._life, self._flag = info.get("life"), bool(info.get("flag_get", False))
        self._x_last = self._x_best = int(info.get("x_pos") or 0)
        self._stage = (info.get("world"), info.get("stage"))
        self._stall = (self._stage, self._x_best, 0)
        return obs, info

    def _stalled(self, info: dict[str, Any]) -> bool:
        """Count one agent step towards ``stall_steps``: whether that many passed without a new furthest x."""
        stage, x = (info.get("world"), info.get("stage")), int(info.get("x_pos") or 0)
        last_stage, best, since = self._stall
        if stage != last_stage or x > best:
            self._stall = (stage, x, 0)
            return False
        self._stall = (stage, best, since + 1)
        return since + 1 >= (self.config.stall_steps or 0)

    @property
    def _active(self) -> Any:
        """Return the SuperMarioBrosEnv currently being played (RandomStages swaps it)."""
        return self._nes.env if self.mario_id.random_stages else self._nes

    def get_action_meanings(self) -> list[str]:
        """Return the button combination of each discrete action."""
        return list(self._action_meanings)

    def _grey(self) -> np.ndarray:
        """Return the current NES screen as (240, 256) uint8 greyscale."""
        nes = self._active
        key = id(nes)
        if key not in self._raw_screens:
            self._raw_screens[key] = _raw_screen(nes.screen)
        raw = self._raw_screens[key]
        return rgb_to_grey(nes.screen) if raw is None else bgrx_to_grey(raw)

    def _observe(self, grey: np.ndarray) -> np.ndarray:
        """Resize a full-resolution greyscale frame, less its top ``crop_top`` rows, to (size, size)."""
        return resize_area(grey[self.config.crop_top:], self.config.size, self.config.size)

    def _info(self) -> dict[str, Any]:
        """Return the library's info dict with Python scalar values, and the measures."""
        return _with_measures({k: _plain(v) for k, v in self._active._get_info().items()})

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        """Reset to the start of the stage/game and return (obs, info)."""
        super().reset(seed=seed)
        if self.mario_id.random_stages:
            self._nes.reset(seed=seed, options=options)
        else:
            self._nes.reset(seed=seed)
        if self._start_states is not None:
            self._start_states.frames.clear()  # the frames a kept state is replayed from count from here
        return self._continue_from_emulator()

    def step(self, action: int | np.integer[Any]) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        """Repeat ``action`` for ``frame_skip`` frames; max-pool the last two frames."""
        if self._needs_reset:
            raise RuntimeError("MarioEnv.step called before reset() or after the episode ended")
        if not self.action_space.contains(action):
            raise ValueError(f"invalid action {action!r}; expected an int in [0, {len(self._action_bytes)})")
        byte = self._action_bytes[int(action)]
        skip = self.config.frame_skip
        nes_step = self._nes.step if self.frame_hook is None else self._hooked_step
        frontier = self.config.progress_reward == "frontier"
        total = shaped = 0.0
        done = False
        last: np.ndarray | None = None
        prev: np.ndarray | None = None
        info: dict[str, Any] = {}
        played = bytearray()  # the joypad byte of each frame played
        for _ in range(skip):
            pressed = self._rejumped(byte)
            _, reward, done, info = nes_step(pressed)
            played.append(pressed)
            total += reward
            if frontier:
                shaped += self._frontier_change(info)
            if len(played) >= skip - 1 or done:
                prev, last = last, self._grey()
            if done:
                break
        assert last is not None
        if self._start_states is not None:  # the frames played, so that a kept state can be replayed from a file
            self._start_states.frames.extend(played)
        pooled = last if prev is None else np.maximum(prev, last)
        obs = self._stack.push(self._observe(pooled))
        self._steps += 1
        limit = self.config.max_episode_steps
        info = _with_measures({k: _plain(v) for k, v in info.items()})
        stalled = self.config.stall_steps is not None and self._stalled(info)
        timed_out = limit is not None and self._steps >= limit
        truncated = not done and (timed_out or stalled)
        self._needs_reset = done or truncated
        flag = info[SUCCESS]
        new_flag = flag and not self._flag
        life = info.get("life")
        # a death: a life lost (whole-game ids), or a single-stage episode that ended without the flag
        death = (life is not None and self._life is not None and life < self._life) or (done and not flag)
        self._life, self._flag = life, flag
        if done:
            info[END] = "flag" if flag else "clock" if info.get("time") == 0 else "death"
        elif truncated:
            info[END] = "time_limit" if timed_out else "stall"
        info["raw_reward"] = total
        reward = self.config.shape_reward(total + shaped, new_flag, death)
        return obs, reward, bool(done), bool(truncated), info

    def _rejumped(self, byte: int) -> int:
        """The joypad byte to play this frame for ``byte``: with ``rejump``, without A when the last two frames held A
        and Mario stands on the ground (RAM 0x1D, the player's float state, 0), so the next frame's A is fresh.
        Two: the game takes a jump off a frame after the press, and the frame between must still hold A."""
        if not self.config.rejump:
            return byte
        a_button = BUTTONS["A"]
        if byte & a_button and self._a_frames >= 2 and self._active.ram[0x1D] == 0:
            byte &= ~a_button
        self._a_frames = min(self._a_frames + 1, 2) if byte & a_button else 0
        return byte

    def _frontier_change(self, info: dict[str, Any]) -> float:
        """One frame's change to the library's reward under progress_reward=frontier: its x step (clipped to 0
        beyond +-5 as the library does) out, the x gained past the episode's furthest in; a new stage starts over."""
        x, stage = int(info.get("x_pos") or 0), (info.get("world"), info.get("stage"))
        if stage != self._stage:
            self._stage, self._x_last, self._x_best = stage, x, x
        step, gain = x - self._x_last, x - self._x_best
        self._x_last, self._x_best = x, max(x, self._x_best)
        return float((gain if 0 < gain <= 5 else 0) - (step if -5 <= step <= 5 else 0))

    def _hooked_step(self, byte: int) -> tuple[Any, float, bool, dict[str, Any]]:
        """One emulator frame, then ``frame_hook`` with the RGB screen."""
        out = self._nes.step(byte)
        assert self.frame_hook is not None
        self.frame_hook(self._active.screen)
        return out

    def render(self) -> np.ndarray | None:
        """Return the full-resolution RGB screen when render_mode is 'rgb_array'."""
        if self.render_mode == "rgb_array":
            return np.array(self._active.screen)
        return None

    def close(self) -> None:
        """Free the emulator(s); safe to call twice."""
        if not self._closed and hasattr(self, "_nes"):
            self._closed = True
            if self._start_states is not None:
                self._start_states.close()
            self._nes.close()
        super().close()
