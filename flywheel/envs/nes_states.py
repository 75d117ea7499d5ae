"""Mario's start states (capacity 1): nes-py's one backup slot per emulator, the level start never lost.

nes-py keeps one state per emulator (``_backup`` / ``_restore``), and gym-super-mario-bros keeps the level start
there (``reset`` restores it). Keeping a state of the agent's own overwrites it, so :class:`NesStartStates` plays on
up to two emulators of the same stage: the one whose slot holds the kept state, and one whose slot holds the level
start. A level-start ``reset`` switches to an emulator holding the start; only when none does (the other one's slot
held an older kept state) is one rebuilt the way gym-super-mario-bros builds it (power-on, start screen skipped:
about 220 frames), so the cost is at most one rebuild per state kept in a level-start episode.

nes-py gives no bytes of an emulator's state (only its 2 KiB RAM, which is not the whole state: CPU registers and the
PPU's are not in it), so a kept state is written to a file as the joypad bytes of every frame played from the level
start to it (:meth:`NesStartStates.dump`), and read back by replaying them (:meth:`NesStartStates.load`): the
emulator is deterministic, so the replay reaches the very state, RAM and screen byte for byte.
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

    def reset(self) -> tuple[np.ndarray, dict[str, Any]]:
        """Start an episode at the emulator's backup slot (the level start after ``level_start``)."""
        ...

    def _info(self) -> dict[str, Any]:
        """The current info dict (``x_pos`` among its keys)."""
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
        self.frames = bytearray()  # joypad byte of every frame played since the level start (MarioEnv.step adds)
        self.kept_frames = b""  # those of the kept state

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
        self.kept_frames = bytes(self.frames)

    def restore(self, slot: int) -> tuple[np.ndarray, dict[str, Any]]:
        """Continue from the kept state: its emulator, its screen as a fresh frame stack, its info."""
        if slot != 0 or KEPT not in self.holds:
            raise IndexError(f"no kept start state in slot {slot}")
        nes = self.emulators[self.holds.index(KEPT)]
        self.env._nes = nes
        nes._restore()
        nes._did_reset()  # the library's reward counts x and time from here
        nes.done = False
        self.frames = bytearray(self.kept_frames)
        return self.env._continue_from_emulator()

    def dump(self, slot: int) -> np.ndarray:
        """The kept state in ``slot`` as data for a file: the joypad bytes from the level start to it (uint8)."""
        if slot != 0 or KEPT not in self.holds:
            raise IndexError(f"no kept start state in slot {slot}")
        return np.frombuffer(self.kept_frames, dtype=np.uint8).copy()

    def load(self, slot: int, data: np.ndarray) -> float:
        """Rebuild a state from :meth:`dump`'s data into ``slot``: replay its frames from the level start, keep the
        state reached; its progress (ValueError when the episode ends on the way: the data is not of this stage)."""
        self.level_start()
        self.env.reset()
        nes = self.env._nes
        frames = np.asarray(data, dtype=np.uint8).reshape(-1)
        for byte in frames.tolist():
            if nes.done:
                raise ValueError(f"the episode ended after {len(self.frames)} of {len(frames)} frames")
            nes.step(byte)
            self.frames.append(byte)
        if nes.done:
            raise ValueError("the episode ended on the state's last frame")
        self.save(slot)
        return self.progress(self.env._info())

    def close(self) -> None:
        """Close the emulators other than the one the env holds (the env closes that one)."""
        current = self._current
        for i, nes in enumerate(self.emulators):
            if i != current:
                nes.close()
        self.emulators, self.holds = [self.env._nes], [self.holds[current]]
