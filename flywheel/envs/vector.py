"""Vectors of environments with auto-reset: the interface actors step, and the in-process implementation."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import gymnasium
import numpy as np

from flywheel.envs.measures import PROGRESS, SUCCESS, measures_so_far
from flywheel.envs.spaces import action_count, observation_shape
from flywheel.envs.start_states import (
    RESTARTED,
    START_PROGRESS,
    STATES_KEPT,
    StartStateCurriculum,
    load_pool,
    save_pool,
)

# Episode metrics: the env's measures (flywheel.envs.measures: "progress", the episode's maximum of
# info["progress"]; "success", 1 if any step's info["success"] was true, else 0) where its info has them, and the
# start-state curriculum's states kept (from the last step's info).
PROGRESS_METRIC, SUCCESS_METRIC, STATES_METRIC = "progress", "success", "start_states"


@dataclass
class EpisodeEnd:
    """One finished episode of one env slot: its return and length plus env-specific metrics.

    ``restarted``: it began at a kept start state (flywheel.envs.start_states), at progress ``start_progress``.
    """

    slot: int
    ret: float
    length: int
    metrics: dict[str, float] = field(default_factory=dict)
    restarted: bool = False
    start_progress: float = 0.0

    def to_json(self) -> list[Any]:
        """A JSON-able form (subprocess workers send these through a pipe)."""
        return [self.slot, self.ret, self.length, self.metrics, self.restarted, self.start_progress]

    @classmethod
    def from_json(cls, data: list[Any]) -> EpisodeEnd:
        """Rebuild from :meth:`to_json`."""
        slot, ret, length, metrics, restarted, start_progress = data
        return cls(int(slot), float(ret), int(length), {str(k): float(v) for k, v in metrics.items()},
                   bool(restarted), float(start_progress))


@dataclass
class PoolReport:
    """What saving or loading the start-state pools of a vector's slots did (files ``<key>-env<slot>.npz``)."""

    slots: int = 0  # slots with a start-state curriculum
    files: int = 0  # pool files written or read
    states: int = 0  # kept states in them
    dropped: int = 0  # states read but not kept (beyond the pool, or rebuilt at another progress)
    missing: list[int] = field(default_factory=list)  # slots without a file to load
    failed: list[str] = field(default_factory=list)  # "slot N: why" for each file that could not be written or read

    def __add__(self, other: PoolReport) -> PoolReport:
        """Both reports' counts and lists together."""
        return PoolReport(self.slots + other.slots, self.files + other.files, self.states + other.states,
                          self.dropped + other.dropped, self.missing + other.missing, self.failed + other.failed)

    def to_json(self) -> dict[str, Any]:
        """A JSON-able form (subprocess workers send these through a pipe)."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PoolReport:
        """Rebuild from :meth:`to_json`."""
        return cls(int(data["slots"]), int(data["files"]), int(data["states"]), int(data["dropped"]),
                   [int(s) for s in data["missing"]], [str(f) for f in data["failed"]])


def pool_file(directory: str, key: str, slot: int) -> str:
    """The file of env slot ``slot``'s start-state pool, for the vector keyed ``key`` (its actor)."""
    return os.path.join(directory, f"{key}-env{slot}.npz")


def curriculum_of(env: gymnasium.Env[Any, Any]) -> StartStateCurriculum | None:
    """The start-state curriculum among ``env``'s wrappers, or None."""
    while isinstance(env, gymnasium.Wrapper):
        if isinstance(env, StartStateCurriculum):
            return env
        env = env.env
    return None


@dataclass
class _Measured:
    """One episode's measures so far: the furthest ``info["progress"]`` and whether any ``info["success"]``."""

    progress: float | None = None
    success: bool | None = None
    ended: bool = False  # its episode was recorded (an env that reports its own episodes may go on past a reset)

    def seen(self, info: dict[str, Any]) -> _Measured:
        """Take one step's (or reset's) info; values that are not numbers are ignored."""
        self.progress, self.success = measures_so_far(info, self.progress, self.success)
        return self


@dataclass
class VectorStep:
    """The outcome of one step of a group of slots.

    ``obs`` is what each slot acts on next (the reset observation where an episode ended);
    ``final_obs`` is the last observation of the ended episode where ``terminated | truncated``
    and equals ``obs`` elsewhere (it may be the very same array when no episode ended). If the
    vector's ``reuses_buffers`` is true, the arrays are overwritten by the group's next step:
    copy what you keep.
    """

    obs: np.ndarray
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    final_obs: np.ndarray
    episodes: list[EpisodeEnd]


class VectorEnv:
    """A fixed number of env slots stepped together; episodes end and restart by themselves.

    Slots are split into ``groups`` (contiguous ranges). An actor may have one group in flight
    (``step_async``) while it computes actions for another, as Sample Factory's double-buffered
    sampling does; synchronous vectors have a single group and step inside ``step_wait``.
    """

    num_envs: int
    obs_shape: tuple[int, ...]
    obs_dtype: np.dtype
    n_actions: int
    reuses_buffers: bool = False  # True: a step's arrays are overwritten by the group's next step

    @property
    def groups(self) -> list[range]:
        """Slot ranges that are stepped as one unit (one group: the whole vector)."""
        return [range(self.num_envs)]

    def reset(self) -> np.ndarray:
        """Reset every slot (seeded at construction) and return (num_envs, *obs_shape) observations."""
        raise NotImplementedError

    def step_async(self, group: int, actions: np.ndarray) -> None:
        """Start stepping ``group``'s slots with ``actions`` (one per slot of the group)."""
        raise NotImplementedError

    def step_wait(self, group: int) -> VectorStep:
        """Finish the step started for ``group`` and return its outcome."""
        raise NotImplementedError

    def step(self, actions: np.ndarray) -> VectorStep:
        """Step every slot (only for single-group vectors)."""
        if len(self.groups) != 1:
            raise RuntimeError("step() needs a single-group vector; use step_async/step_wait per group")
        self.step_async(0, actions)
        return self.step_wait(0)

    def save_start_states(self, directory: str, key: str) -> PoolReport:
        """Write each slot's start-state pool to ``directory`` (between steps: no group in flight)."""
        return PoolReport()

    def load_start_states(self, directory: str, key: str) -> PoolReport:
        """Read each slot's start-state pool from ``directory`` (before the first ``reset``); a file missing or
        faulty leaves its slot's pool empty, and is reported."""
        return PoolReport()

    def set_start_targets(self, targets: list[float]) -> None:
        """Give every env's start-state curriculum the death points its next episodes draw from (choice "deaths";
        taken by each env before its next step; a vector without a curriculum ignores them)."""

    def close(self) -> None:
        """Free the environments; safe to call twice."""


class SyncVectorEnv(VectorEnv):
    """A single-group vector that steps in the caller's thread: ``step_wait`` does the work."""

    def __init__(self) -> None:
        """Start with no actions pending."""
        self._pending: np.ndarray | None = None

    def step_async(self, group: int, actions: np.ndarray) -> None:
        """Remember the actions; stepping happens in :meth:`step_wait`."""
        if group != 0:
            raise ValueError(f"{type(self).__name__} has one group, got group {group}")
        actions = np.asarray(actions)
        if actions.shape != (self.num_envs,):
            raise ValueError(f"expected {self.num_envs} actions, got shape {actions.shape}")
        self._pending = actions

    def step_wait(self, group: int) -> VectorStep:
        """Step with the remembered actions."""
        if self._pending is None:
            raise RuntimeError("step_wait without step_async")
        actions, self._pending = self._pending, None
        return self._step(actions)

    def _step(self, actions: np.ndarray) -> VectorStep:
        raise NotImplementedError


class InProcessVector(SyncVectorEnv):
    """Gymnasium envs stepped one after another in this process, each reset on its own when done.

    Slot ``i`` is reset with ``seeds[i]`` the first time. Episode returns and lengths are kept here;
    an env that accounts for its own episodes (``reports_episodes = True``, e.g. Atari with episodic
    life, where losing a life ends a training episode but not the game) reports them in
    ``info["episode"]`` instead.
    """

    def __init__(self, envs: Sequence[gymnasium.Env[np.ndarray, Any]], seeds: Sequence[int | None] | None = None,
                 slot_offset: int = 0) -> None:
        """Take ownership of ``envs`` (all with the same spaces)."""
        super().__init__()
        if not envs:
            raise ValueError("a vector needs at least one environment")
        self.envs = list(envs)
        self.seeds = list(seeds) if seeds is not None else [None] * len(self.envs)
        self.slot_offset = slot_offset
        space = self.envs[0].observation_space
        self.num_envs = len(self.envs)
        self.obs_shape = observation_shape(space)
        self.obs_dtype = np.dtype(space.dtype)
        self.n_actions = action_count(self.envs[0].action_space)
        self._self_reporting = [bool(getattr(env.unwrapped, "reports_episodes", False)) for env in self.envs]
        self._ret = [0.0] * self.num_envs
        self._len = [0] * self.num_envs
        self._measured = [_Measured() for _ in self.envs]
        self._closed = False

    def reset(self) -> np.ndarray:
        """Reset each env with its seed."""
        obs = np.empty((self.num_envs, *self.obs_shape), dtype=self.obs_dtype)
        for i, env in enumerate(self.envs):
            seed = self.seeds[i]
            obs[i], info = env.reset(seed=seed)
            self._measured[i] = _Measured().seen(info)
            if seed is not None:
                env.action_space.seed(seed)
        self._ret = [0.0] * self.num_envs
        self._len = [0] * self.num_envs
        return obs

    def _step(self, actions: np.ndarray) -> VectorStep:
        n = self.num_envs
        rewards, terms, truncs = [0.0] * n, [False] * n, [False] * n
        episodes: list[EpisodeEnd] = []
        obs_out = np.empty((n, *self.obs_shape), dtype=self.obs_dtype)  # fresh: callers may keep it
        last: dict[int, np.ndarray] = {}
        ret, length = self._ret, self._len
        for i, (env, action) in enumerate(zip(self.envs, actions.tolist(), strict=True)):
            obs, reward, term, trunc, info = env.step(action)
            r = float(reward)
            rewards[i], terms[i], truncs[i] = r, term, trunc
            ret[i] += r
            length[i] += 1
            if PROGRESS in info or SUCCESS in info:
                self._measured[i].seen(info)
            if term or trunc:
                last[i] = obs
                self._record(i, info, episodes)
                obs, info = env.reset()
                if self._measured[i].ended:
                    self._measured[i] = _Measured().seen(info)
            obs_out[i] = obs
        reward = np.array(rewards, dtype=np.float32)
        terminated = np.array(terms, dtype=bool)
        truncated = np.array(truncs, dtype=bool)
        final = obs_out
        if last:
            final = obs_out.copy()
            for i, obs in last.items():
                final[i] = obs
        return VectorStep(obs_out, reward, terminated, truncated, final, episodes)

    def _record(self, i: int, info: dict[str, Any], episodes: list[EpisodeEnd]) -> None:
        slot = self.slot_offset + i
        if self._self_reporting[i]:
            done = info.get("episode")
            if done is not None:
                metrics = {k: float(v) for k, v in done.items() if k not in ("return", "length")}
                metrics.update(self._episode_metrics(i, info))
                episodes.append(EpisodeEnd(slot, float(done["return"]), int(done["length"]), metrics,
                                           bool(info.get(RESTARTED, False)), float(info.get(START_PROGRESS, 0.0))))
            return
        metrics = self._episode_metrics(i, info)
        episodes.append(EpisodeEnd(slot, float(self._ret[i]), int(self._len[i]), metrics,
                                   bool(info.get(RESTARTED, False)), float(info.get(START_PROGRESS, 0.0))))
        self._ret[i] = 0.0
        self._len[i] = 0

    def _episode_metrics(self, i: int, info: dict[str, Any]) -> dict[str, float]:
        """The metrics of slot ``i``'s episode that ends with ``info`` (its measures are then started anew)."""
        measured = self._measured[i]
        measured.ended = True
        metrics: dict[str, float] = {}
        if measured.progress is not None:
            metrics[PROGRESS_METRIC] = measured.progress
        if measured.success is not None:
            metrics[SUCCESS_METRIC] = float(measured.success)
        if STATES_KEPT in info:
            metrics[STATES_METRIC] = float(info[STATES_KEPT])
        return metrics

    def save_start_states(self, directory: str, key: str) -> PoolReport:
        """Write the pool of each env with a start-state curriculum."""
        report = PoolReport()
        for i, env in enumerate(self.envs):
            if (curriculum := curriculum_of(env)) is not None:
                report.slots += 1
                try:
                    report.states += save_pool(pool_file(directory, key, self.slot_offset + i), curriculum)
                    report.files += 1
                except (OSError, ValueError, IndexError) as exc:
                    report.failed.append(f"slot {self.slot_offset + i}: {exc}")
        return report

    def load_start_states(self, directory: str, key: str) -> PoolReport:
        """Read the pool of each env with a start-state curriculum whose file is there."""
        report = PoolReport()
        for i, env in enumerate(self.envs):
            if (curriculum := curriculum_of(env)) is None:
                continue
            report.slots += 1
            slot, path = self.slot_offset + i, pool_file(directory, key, self.slot_offset + i)
            if not os.path.exists(path):
                report.missing.append(slot)
                continue
            try:
                taken, dropped = load_pool(path, curriculum)
            except (OSError, ValueError) as exc:
                report.failed.append(f"slot {slot}: {exc}")
                continue
            report.files += 1
            report.states += taken
            report.dropped += dropped
        return report

    def set_start_targets(self, targets: list[float]) -> None:
        """Each env with a start-state curriculum takes ``targets``."""
        for env in self.envs:
            if (curriculum := curriculum_of(env)) is not None:
                curriculum.set_targets(targets)

    def close(self) -> None:
        """Close every env once."""
        if not self._closed:
            self._closed = True
            for env in self.envs:
                env.close()
