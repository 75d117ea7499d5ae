"""Atari's start states: ale-py's ``cloneState`` / ``restoreState``, a pool of many; progress = steps into the game.

Atari has no progress measure of its own, so a state's progress is the agent steps played in its game (a kept
state's own steps included when a game began at one): deeper into a game is further. A state is restored only
where a new game would begin (with episodic life, a reset after a lost life goes on with the same game), and a
game that began at a kept state reports its return from there.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np


class AleHost(Protocol):
    """What :class:`AleStartStates` uses of :class:`flywheel.envs.atari.AtariEnv`."""

    _ale: Any  # the ALEInterface
    _game_length: int  # agent steps of the current game
    _continue_game: bool  # the next reset goes on with the same game (a life was lost)

    def _continue_from_state(self, state: Any, steps: int, states: AleStartStates
                             ) -> tuple[np.ndarray, dict[str, Any]]:
        """Restore an emulator state as a new game: (obs, info)."""
        ...


CAPACITY = 1024  # states a pool may hold (each a few KiB); the curriculum's pool setting keeps far fewer


class AleStartStates:
    """Kept ALE states of one :class:`AtariEnv`, each with the game steps it was saved at."""

    capacity = CAPACITY

    def __init__(self, env: AleHost) -> None:
        """Keep states of ``env``'s emulator."""
        self.env = env
        self.saved: dict[int, tuple[Any, int]] = {}  # slot -> (ALEState, game steps at the save)
        self.offset = 0  # game steps of the kept state the current game began at (0: a game from the start)

    def progress(self, info: dict[str, Any]) -> float:
        """Agent steps into the current game (``info`` is not needed: the env counts them)."""
        return float(self.offset + self.env._game_length)

    def starts_anew(self) -> bool:
        """Whether the next reset begins a new game (not the same game after a lost life)."""
        return not self.env._continue_game

    def level_start(self) -> None:
        """The next reset starts a game from the start: steps count from 0."""
        self.offset = 0

    def save(self, slot: int) -> None:
        """Clone the emulator's state (its RNG too, so sticky actions go on as they would have)."""
        if not 0 <= slot < self.capacity:
            raise IndexError(f"start state slot {slot} out of range [0, {self.capacity})")
        self.saved[slot] = (self.env._ale.cloneState(include_rng=True), int(self.progress({})))

    def restore(self, slot: int) -> tuple[np.ndarray, dict[str, Any]]:
        """After a reset: continue from the kept state as a new game (return and steps counted from here)."""
        if slot not in self.saved:
            raise IndexError(f"no kept start state in slot {slot}")
        state, steps = self.saved[slot]
        return self.env._continue_from_state(state, steps, self)

    def dump(self, slot: int) -> np.ndarray:
        """The kept state in ``slot`` as data for a file (uint8): its game steps (8 bytes, little-endian), then
        ale-py's own serialization of the state (RNG included)."""
        if slot not in self.saved:
            raise IndexError(f"no kept start state in slot {slot}")
        state, steps = self.saved[slot]
        return np.frombuffer(np.int64(steps).astype("<i8").tobytes() + state.serialize(), dtype=np.uint8).copy()

    def load(self, slot: int, data: np.ndarray) -> float:
        """Keep the state of :meth:`dump`'s data in ``slot``; its progress (ValueError on data ale-py refuses)."""
        from ale_py import ALEState

        if not 0 <= slot < self.capacity:
            raise IndexError(f"start state slot {slot} out of range [0, {self.capacity})")
        raw = np.asarray(data, dtype=np.uint8).reshape(-1).tobytes()
        if len(raw) <= 8:
            raise ValueError(f"{len(raw)} bytes is no ALE state")
        steps = int(np.frombuffer(raw[:8], dtype="<i8")[0])
        try:
            state = ALEState(raw[8:])
        except Exception as exc:  # ale-py raises its own kinds on bytes it cannot read
            raise ValueError(f"not an ALE state ({exc})") from None
        self.saved[slot] = (state, steps)
        return float(steps)

    def close(self) -> None:
        """Drop the kept states."""
        self.saved.clear()
