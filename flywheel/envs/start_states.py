"""Start-state curriculum: training episodes that start from states the agent itself reached (near its frontier).

In the spirit of Backplay and Go-Explore restarts, an env whose emulator can save and restore its state
(:class:`StartStates`: Mario's nes-py, Atari's ``cloneState``) is wrapped in :class:`StartStateCurriculum`, which
runs in the env's own process. It tracks the env's frontier, the furthest progress (Mario: ``x_pos``; Atari: agent
steps into the game) over its last ``window`` episodes, keeps the state of an episode where it passes
``frontier - margin`` (at most one per episode, at most ``pool`` states; a state behind that point or kept for
``window`` episodes is replaced, the least advanced first), and starts a share of its episodes from one of them,
picked uniformly. Restarted episodes are marked in ``info`` (``restarted``, ``start_progress``) so that the actor
keeps them out of its level-start episode statistics. With ``choice="deaths"`` the point is not the frontier but
``margin`` before a death point drawn per episode from :attr:`StartStateCurriculum.targets`, the places where the
actor's level-start episodes at low exploration ended short of the goal (the actor measures and sends them:
services/actor/deaths.py); a kept state is then replaced once it has been kept for ``window`` episodes. Only
training envs get it: evaluation always starts at the level start. Death points are not written with the pool: a
resumed actor measures them anew (until its first ones arrive its envs keep states by the frontier rule).

A curriculum's pool (its kept states with their progress, and its frontier window) goes to a file and back
(:func:`save_pool`, :func:`load_pool`: an ``.npz`` of a JSON record and one uint8 array a state, never a pickle)
where its env's states can be written as data (:class:`PersistentStartStates`); of any other env only the frontier
window is written.
"""

from __future__ import annotations

import json
import math
import os
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import gymnasium
import numpy as np

from flywheel.envs.measures import measures_of

# info keys every step of a wrapped env carries (the vector copies them into EpisodeEnd)
RESTARTED, START_PROGRESS, STATES_KEPT = "restarted", "start_progress", "start_states_kept"
CHOICES = ("frontier", "deaths")  # where states are kept: near the frontier, or before where episodes die


@runtime_checkable
class StartStates(Protocol):
    """An env's saved states: ``capacity`` slots kept at once, progress of an info dict, save and restore."""

    capacity: int

    def progress(self, info: dict[str, Any]) -> float:
        """How far the episode has come (higher: further), from a step's or reset's info."""
        ...

    def starts_anew(self) -> bool:
        """Whether the next ``reset`` begins a new game or level (Atari after a lost life: the same game goes on,
        and the episode that follows belongs to the game before)."""
        ...

    def level_start(self) -> None:
        """Before the env's ``reset``: make that reset start at the level start (not at a saved state)."""
        ...

    def save(self, slot: int) -> None:
        """Keep the env's current state in ``slot`` (0 <= slot < capacity), replacing what was there."""
        ...

    def restore(self, slot: int) -> tuple[np.ndarray, dict[str, Any]]:
        """Right after a ``reset``: continue from the state in ``slot``; its observation (a consistent frame
        stack) and info."""
        ...

    def close(self) -> None:
        """Free what the saved states hold (the env itself is closed by its owner)."""
        ...


@runtime_checkable
class PersistentStartStates(StartStates, Protocol):
    """Start states that can be written to a file as data and read back (so a resumed run keeps its pool)."""

    def dump(self, slot: int) -> np.ndarray:
        """The state in ``slot`` as a uint8 array (IndexError when the slot holds none)."""
        ...

    def load(self, slot: int, data: np.ndarray) -> float:
        """Keep the state of :meth:`dump`'s ``data`` in ``slot``; the progress it is at (ValueError on bad data).
        May play the env: the next step is a ``reset``."""
        ...


class StartStatesUnsupported(ValueError):
    """Raised when start states are asked of an env that cannot save and restore its state."""

    def __init__(self, env_id: str, why: str = "") -> None:
        """One line naming the env id."""
        super().__init__(f"start_state_share > 0 needs an env that can save and restore its state; {env_id!r} "
                         f"cannot{' (' + why + ')' if why else ''} (set start_state_share to 0)")


@dataclass(frozen=True)
class StartStateConfig:
    """The curriculum's settings: ``share`` of episodes restarted, ``margin`` behind the frontier where states are
    kept, ``window`` of episodes the frontier is the furthest progress of, ``pool`` of states kept at most."""

    share: float = 0.0
    margin: float = 100.0
    window: int = 20
    pool: int = 8
    choice: str = "frontier"  # "deaths": before death points the actor sends (module docstring)
    death_epsilon: float = 0.1  # deaths: the actor counts those of its slots exploring at no more than this

    def __post_init__(self) -> None:
        """Reject bad values with a clear message."""
        if self.choice not in CHOICES:
            raise ValueError(f"start state choice must be one of {', '.join(CHOICES)}, got {self.choice!r}")
        if not (isinstance(self.death_epsilon, int | float) and 0.0 <= self.death_epsilon <= 1.0):
            raise ValueError(f"start state death epsilon must be a number in [0, 1], got {self.death_epsilon!r}")
        if not (isinstance(self.share, int | float) and 0.0 <= self.share <= 1.0):
            raise ValueError(f"start state share must be a number in [0, 1], got {self.share!r}")
        if not (isinstance(self.margin, int | float) and math.isfinite(self.margin) and self.margin >= 0):
            raise ValueError(f"start state margin must be a finite number >= 0, got {self.margin!r}")
        for name in ("window", "pool"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"start state {name} must be an integer >= 1, got {value!r}")

    def to_json(self) -> dict[str, Any]:
        """A JSON-able form (subprocess workers get it through their options)."""
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any] | StartStateConfig) -> StartStateConfig:
        """Rebuild from :meth:`to_json` (a config is returned as it is)."""
        if isinstance(data, StartStateConfig):
            return data
        return cls(**data)


def start_states_of(env: gymnasium.Env[Any, Any]) -> StartStates | None:
    """The env's :class:`StartStates` (from its ``start_states()`` method), or None if it has none."""
    make = getattr(env.unwrapped, "start_states", None)
    states = make() if callable(make) else None
    return states if isinstance(states, StartStates) and states.capacity >= 1 else None


@dataclass
class KeptState:
    """One kept state: its slot in the env's :class:`StartStates` and the progress it was saved at."""

    slot: int
    progress: float
    episode: int  # the env's episode count when it was kept


class StartStateCurriculum(gymnasium.Wrapper[np.ndarray, Any, np.ndarray, Any]):
    """Starts ``config.share`` of the episodes from kept states the agent reached (module docstring).

    The draw comes from the wrapper's own generator, seeded by the first seeded ``reset``. Every ``info`` gets
    ``restarted`` (bool), ``start_progress`` (where the episode began) and ``start_states_kept``.
    """

    def __init__(self, env: gymnasium.Env[np.ndarray, Any], config: StartStateConfig, env_id: str) -> None:
        """Wrap ``env``; StartStatesUnsupported if it cannot save and restore its state."""
        super().__init__(env)
        states = start_states_of(env)
        if states is None:
            raise StartStatesUnsupported(env_id)
        if config.choice == "deaths" and measures_of(env).progress is None:
            raise ValueError(f"start_state_choice 'deaths' needs an env with a progress measure (where its episodes "
                             f"die); {env_id!r} has none (use start_state_choice 'frontier')")
        self.states = states
        self.config = config
        self.env_id = env_id
        self.capacity = min(config.pool, states.capacity)
        self.kept: list[KeptState] = []
        self.recent: deque[float] = deque(maxlen=config.window)  # furthest progress of each finished episode
        self.rng = np.random.default_rng()
        self.restarted = False
        self.start_progress = 0.0
        self.best = 0.0  # furthest progress of this episode
        self.saved = False  # a state was kept in this episode
        self.episodes = 0  # episodes finished
        self.targets: list[float] = []  # choice "deaths": death points (progress) the actor sent, drawn per episode
        self.target: float | None = None  # this episode's drawn death point (None: the frontier rule)

    @property
    def frontier(self) -> float | None:
        """The furthest progress of the last ``window`` finished episodes (None before the first)."""
        return max(self.recent) if self.recent else None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[np.ndarray, dict[str, Any]]:
        """The env's reset, then, with probability ``share`` and a state kept, a jump to one of the kept states."""
        if seed is not None:
            self.rng = np.random.default_rng([seed, 0x5747])
        if not self.states.starts_anew() and seed is None:  # the same game goes on: it keeps its marks
            obs, info = self.env.reset(options=options)
            self.best = self.states.progress(info)
            self.saved = False
            return obs, self._mark(info)
        draw = self.rng.random()
        kept = self.kept[int(self.rng.integers(len(self.kept)))] if self.kept and draw < self.config.share else None
        if kept is None:
            self.states.level_start()
        obs, info = self.env.reset(seed=seed, options=options)
        if kept is not None:
            obs, info = self.states.restore(kept.slot)
        self.restarted = kept is not None
        self.target = (self.targets[int(self.rng.integers(len(self.targets)))]
                       if self.config.choice == "deaths" and self.targets else None)
        self.start_progress = self.best = self.states.progress(info)
        self.saved = False
        return obs, self._mark(info)

    def step(self, action: Any) -> tuple[np.ndarray, Any, bool, bool, dict[str, Any]]:
        """The env's step; keeps the state where the episode first passes ``frontier - margin``."""
        obs, reward, terminated, truncated, info = self.env.step(action)
        progress = self.states.progress(info)
        self.best = max(self.best, progress)
        if terminated or truncated:
            self.recent.append(self.best)
            self.episodes += 1
        elif not self.saved:
            self._maybe_keep(progress)
        return obs, reward, terminated, truncated, self._mark(info)

    def set_targets(self, targets: list[float]) -> None:
        """Take the death points the next episodes draw from (choice "deaths"; non-finite values are dropped)."""
        self.targets = [float(t) for t in targets if isinstance(t, int | float) and math.isfinite(t)]

    def _maybe_keep(self, progress: float) -> None:
        """Keep this state if it is past ``frontier - margin`` and the pool has room, or holds a state behind that
        point or kept for ``window`` episodes already (so a state where every episode dies does not stay forever):
        the least advanced of those is replaced. With a drawn death point (choice "deaths") the point is
        ``target - margin``, and only a state kept for ``window`` episodes is replaced."""
        point = self.frontier if self.target is None else self.target
        if point is None or progress <= self.start_progress:
            return
        threshold = point - self.config.margin
        if progress < threshold:
            return
        if len(self.kept) < self.capacity:
            self.kept.append(KeptState(len(self.kept), progress, self.episodes))
            slot = len(self.kept) - 1
        else:
            replaceable = [k for k in self.kept if self.episodes - k.episode >= self.config.window
                           or (self.target is None and k.progress < threshold)]
            if not replaceable:
                return
            victim = min(replaceable, key=lambda k: k.progress)
            victim.progress, victim.episode = progress, self.episodes
            slot = victim.slot
        self.states.save(slot)
        self.saved = True

    def pool(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """The pool as a JSON-able record (env id, episodes, frontier window, each kept state's progress and age)
        and each kept state's data (``state_<i>``; none when the env's states cannot be written as data)."""
        states = self.states
        kept = self.kept if isinstance(states, PersistentStartStates) else []
        data = {f"state_{i}": states.dump(k.slot) for i, k in enumerate(kept)} if isinstance(
            states, PersistentStartStates) else {}
        record = {"format": POOL_FORMAT, "env_id": self.env_id, "episodes": self.episodes,
                  "recent": list(self.recent),
                  "kept": [{"progress": k.progress, "age": self.episodes - k.episode} for k in kept]}
        return record, data

    def load_pool(self, record: dict[str, Any], data: dict[str, np.ndarray]) -> tuple[int, int]:
        """Take a pool :meth:`pool` gave (before the first ``reset``): its frontier window and, the most advanced
        first, as many of its states as this pool holds; (states taken, states dropped: beyond the pool, or
        rebuilt at another progress than they were kept at). ValueError for a record of another env or format."""
        if record.get("format") != POOL_FORMAT:
            raise ValueError(f"not a start-state pool of format {POOL_FORMAT}")
        if str(record.get("env_id", "")).split("?")[0] != self.env_id.split("?")[0]:
            raise ValueError(f"a pool of {record.get('env_id')!r}, not of {self.env_id!r}")
        episodes = int(record["episodes"])
        recent = [float(x) for x in record["recent"]]
        kept = [(float(k["progress"]), int(k["age"]), i) for i, k in enumerate(record["kept"])]
        kept.sort(key=lambda k: -k[0])
        self.episodes, self.kept = episodes, []
        self.recent = deque(recent[-self.config.window:], maxlen=self.config.window)
        if not isinstance(self.states, PersistentStartStates):
            return 0, len(kept)
        for progress, age, i in kept[:self.capacity]:
            slot = len(self.kept)
            if self.states.load(slot, np.asarray(data[f"state_{i}"], dtype=np.uint8)) == progress:
                self.kept.append(KeptState(slot, progress, episodes - age))
        return len(self.kept), len(kept) - len(self.kept)

    def _mark(self, info: dict[str, Any]) -> dict[str, Any]:
        info[RESTARTED] = self.restarted
        info[START_PROGRESS] = self.start_progress
        info[STATES_KEPT] = len(self.kept)
        return info

    def close(self) -> None:
        """Free the kept states, then the env."""
        self.states.close()
        super().close()


POOL_FORMAT = 1  # the record's "format": files of another format are refused


def save_pool(path: str | Path, curriculum: StartStateCurriculum) -> int:
    """Write ``curriculum``'s pool to ``path`` (an .npz, replaced whole: a stop halfway leaves the old file);
    the states written."""
    record, data = curriculum.pool()
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    arrays: dict[str, Any] = {"record": np.frombuffer(json.dumps(record).encode(), dtype=np.uint8), **data}
    with open(tmp, "wb") as fh:
        np.savez(fh, **arrays)
    os.replace(tmp, path)
    return len(data)


def load_pool(path: str | Path, curriculum: StartStateCurriculum) -> tuple[int, int]:
    """Read a pool :func:`save_pool` wrote into ``curriculum``: (states taken, states dropped). Any fault of the
    file (missing, truncated, not an .npz, a bad record, data the env refuses) raises ValueError or OSError; the
    curriculum is then left empty."""
    try:
        with np.load(path, allow_pickle=False) as npz:
            record = json.loads(npz["record"].tobytes().decode())
            data = {name: npz[name] for name in npz.files if name.startswith("state_")}
        if not isinstance(record, dict):
            raise ValueError("its record is not a JSON object")
        return curriculum.load_pool(record, data)
    except OSError:
        curriculum.kept, curriculum.recent, curriculum.episodes = [], deque(maxlen=curriculum.config.window), 0
        raise
    except Exception as exc:  # zipfile, json, numpy and the env's own loaders raise many kinds
        curriculum.kept, curriculum.recent, curriculum.episodes = [], deque(maxlen=curriculum.config.window), 0
        raise ValueError(f"{type(exc).__name__}: {exc}") from None
