"""Preallocated ring storage for n-step transitions, addressed by a global insert position."""

from __future__ import annotations

import numpy as np

ARRAY_FIELDS = ("obs", "action", "reward", "discount", "next_obs")


class SchemaMismatch(ValueError):
    """An insert whose observation shape or dtype differs from what the storage holds."""

    fault = "shape"


class RingStorage:
    """FIFO storage of ``capacity`` transitions; arrays are allocated on the first insert.

    Positions are global (the running insert count); slot = position % capacity. A position older
    than ``capacity`` inserts has been evicted, which lets stale priority updates be ignored.
    """

    def __init__(self, capacity: int, obs_shape: tuple[int, ...] | None = None, obs_dtype: str | None = None) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self.next_position = 0
        self.obs_shape: tuple[int, ...] | None = None
        self.obs_dtype: np.dtype | None = None
        self.arrays: dict[str, np.ndarray] = {}
        if obs_shape is not None and obs_dtype is not None:
            self._allocate(tuple(obs_shape), np.dtype(obs_dtype))

    def _allocate(self, obs_shape: tuple[int, ...], obs_dtype: np.dtype) -> None:
        cap = self.capacity
        self.obs_shape, self.obs_dtype = obs_shape, obs_dtype
        self.arrays = {
            "obs": np.zeros((cap, *obs_shape), dtype=obs_dtype),
            "next_obs": np.zeros((cap, *obs_shape), dtype=obs_dtype),
            "action": np.zeros(cap, dtype=np.int64),
            "reward": np.zeros(cap, dtype=np.float32),
            "discount": np.zeros(cap, dtype=np.float32),
        }

    @property
    def size(self) -> int:
        return min(self.next_position, self.capacity)

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values())

    def check(self, obs: np.ndarray) -> None:
        """Raise SchemaMismatch unless ``obs`` (a batch) matches the stored observation schema."""
        if self.obs_shape is None:
            return
        if tuple(obs.shape[1:]) != self.obs_shape or obs.dtype != self.obs_dtype:
            raise SchemaMismatch(
                f"observations {obs.dtype}{tuple(obs.shape[1:])} do not match stored "
                f"{self.obs_dtype}{self.obs_shape}"
            )

    def insert(self, batch: dict[str, np.ndarray]) -> np.ndarray:
        """Write a batch (validated by the caller) and return the slots it took."""
        obs = batch["obs"]
        if self.obs_shape is None:
            self._allocate(tuple(obs.shape[1:]), obs.dtype)
        self.check(obs)
        count = obs.shape[0]
        if count > self.capacity:  # only the newest capacity items can survive anyway
            skip = count - self.capacity
            self.next_position += skip
            batch = {k: v[skip:] for k, v in batch.items()}
            count = self.capacity
        positions = np.arange(self.next_position, self.next_position + count, dtype=np.int64)
        slots = positions % self.capacity
        for name in ARRAY_FIELDS:
            self.arrays[name][slots] = batch[name]
        self.next_position += count
        return slots

    def positions_of(self, slots: np.ndarray) -> np.ndarray:
        """Global positions currently held by ``slots``."""
        base = self.next_position - self.size
        return base + (slots - base) % self.capacity

    def live_slots(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(mask of positions still stored, their slots)."""
        positions = np.asarray(positions, dtype=np.int64)
        live = (positions >= self.next_position - self.size) & (positions < self.next_position)
        return live, positions % self.capacity

    def gather(self, slots: np.ndarray) -> dict[str, np.ndarray]:
        return {name: self.arrays[name].take(slots, axis=0) for name in ARRAY_FIELDS}

    def state_dict(self) -> dict[str, np.ndarray]:
        state = {name: arr[: self.size] for name, arr in self.arrays.items()}
        state["next_position"] = np.array(self.next_position, dtype=np.int64)
        return state

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        size = int(state["action"].shape[0])
        if size > self.capacity:
            raise ValueError(f"checkpoint holds {size} transitions, more than capacity {self.capacity}")
        obs = state["obs"]
        # Validate everything before touching the storage, so a refused checkpoint leaves it as it was.
        for name in ARRAY_FIELDS:
            if state[name].shape[0] != size:
                raise ValueError(f"checkpoint array {name} has {state[name].shape[0]} rows, expected {size}")
        if state["next_obs"].shape != obs.shape:
            raise ValueError(f"checkpoint next_obs shape {state['next_obs'].shape} differs from obs {obs.shape}")
        next_position = int(state["next_position"])
        if next_position < size or (size < self.capacity and next_position != size):
            raise ValueError("checkpoint position counter is inconsistent with its size")
        self._allocate(tuple(obs.shape[1:]), obs.dtype)
        for name in ARRAY_FIELDS:
            self.arrays[name][:size] = state[name]
        self.next_position = next_position
