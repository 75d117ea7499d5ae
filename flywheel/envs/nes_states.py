"""Mario's start states (capacity 1): nes-py's one backup slot per emulator, the level start never lost.

nes-py keeps one state per emulator (``_backup`` / ``_restore``), and gym-super-mario-bros keeps the level start
there (``reset`` restores it). Keeping a state of the agent's own overwrites it, so :class:`NesStartStates` plays on
up to two emulators of the same stage: the one whose slot holds the kept state, and one whose slot holds the level
start. A level-start ``reset`` switches to an emulator holding the start; only when none does (the other one's slot
held an older kept state) is one rebuilt the way gym-super-mario-bros builds it (power-on, start screen skipped:
about 220 frames), so the cost is at most one rebuild per state kept in a level-start episode.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

START, KEPT, STALE = "start", "kept", "stale"  # what an emulator's backup slot holds


class NesHost(Protocol):
    """What :class:`NesStartStates` uses of :class:`flywheel.envs.mario.MarioEnv`."""

    _nes: Any  # the emulator being played (a gym-super-mario-bros SuperMarioBrosEnv)

    def _new_emulator(self) -> Any:
        """Another emulator of the same stage, at the level start with it in its slot."""
        ...

    def _continue_from_emulator(self) -> tuple[np.ndarray, dict[str, Any]]:
        """Begin an episode from the emulator's current state: (obs, info)."""
        ...


class NesStartStates:
    """One kept state for a single-stage :class:`MarioEnv`, progress = ``info["x_pos"]``."""

    capacity = 1

    def __init__(self, env: NesHost) -> None:
        """Manage ``env``'s emulators (its own, plus one more built when first needed)."""
        self.env = env
        self.emulators: list[Any] = [env._nes]
        self.holds: list[str] = [START]
        self.rebuilds = 0  # level starts rebuilt (tests and the docs' cost note)

    @property
    def _current(self) -> int:
        return next(i for i, nes in enumerate(self.emulators) if nes is self.env._nes)

    def progress(self, info: dict[str, Any]) -> float:
        """Mario's x position in the stage."""
        return float(info.get("x_pos", 0))

    def starts_anew(self) -> bool:
        """Every Mario reset begins the stage anew."""
        return True

    def level_start(self) -> None:
        """Switch the env to an emulator whose slot holds the level start (rebuild one if none does)."""
        if self.holds[self._current] == START:
            return
        index = next((i for i, held in enumerate(self.holds) if held == START), None)
        if index is None:
            index = next((i for i, held in enumerate(self.holds) if held == STALE), None)
            if index is None:  # the only emulator holds the kept state: build the second one (it starts at START)
                self.emulators.append(self.env._new_emulator())
                self.holds.append(START)
                index = len(self.emulators) - 1
            else:
                self._rebuild(self.emulators[index])
                self.holds[index] = START
        self.env._nes = self.emulators[index]

    def _rebuild(self, nes: Any) -> None:
        """Put the level start back in ``nes``'s slot exactly as gym-super-mario-bros's constructor does."""
        from nes_py.nes_env import _LIB

        nes._will_reset()
        _LIB.Reset(nes._env)
        nes._did_reset()
        nes._skip_start_screen()
        nes._backup()
        self.rebuilds += 1

    def save(self, slot: int) -> None:
        """Keep the current state in the slot of the emulator being played; an older kept state becomes stale."""
        if slot != 0:
            raise IndexError(f"Mario keeps one start state (slot 0), got slot {slot}")
        current = self._current
        self.holds = [STALE if held == KEPT else held for held in self.holds]
        self.env._nes._backup()
        self.holds[current] = KEPT

    def restore(self, slot: int) -> tuple[np.ndarray, dict[str, Any]]:
        """Continue from the kept state: its emulator, its screen as a fresh frame stack, its info."""
        if slot != 0 or KEPT not in self.holds:
            raise IndexError(f"no kept start state in slot {slot}")
        nes = self.emulators[self.holds.index(KEPT)]
        self.env._nes = nes
        nes._restore()
        nes._did_reset()  # the library's reward counts x and time from here
        nes.done = False
        return self.env._continue_from_emulator()

    def close(self) -> None:
        """Close the emulators other than the one the env holds (the env closes that one)."""
        current = self._current
        for i, nes in enumerate(self.emulators):
            if i != current:
                nes.close()
        self.emulators, self.holds = [self.env._nes], [self.holds[current]]
