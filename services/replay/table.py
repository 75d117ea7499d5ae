"""One replay table: FIFO transition storage with proportional priorities (a sum tree) or uniform sampling."""

from __future__ import annotations

import math

import numpy as np

from flywheel import proto

from .storage import TransitionStorage
from .sumtree import SumTree


class ReplayTable:
    """Storage plus sampling state; priorities are stored as (min(p, priority_cap) + eps) ** alpha.

    ``priority_cap`` bounds what one row can take of a batch, whoever sent its priority (an actor's first one, or a
    learner's update): a row at the cap is drawn (cap + eps) ** alpha times as often as a row of priority 1, however
    large a number it came with. Rows above it are counted in ``clamped_priorities``. ``max_priority``, the
    priority new rows without one get, is the largest stored value, so it stays at or below the cap too.
    """

    def __init__(self, capacity: int, *, prioritized: bool = True, alpha: float = 0.6, priority_eps: float = 1e-6,
                 priority_cap: float = math.inf, dedup_frames: bool = True, frame_ratio: float = 1.1,
                 frame_capacity: int | None = None, pack_frames: bool = False) -> None:
        if not priority_cap > 0:
            raise ValueError(f"priority_cap must be > 0, got {priority_cap}")
        self.storage = TransitionStorage(capacity, dedup_frames=dedup_frames, frame_ratio=frame_ratio,
                                         frame_capacity=frame_capacity, pack_frames=pack_frames)
        self.tree = SumTree(capacity) if prioritized else None
        self.alpha, self.priority_eps, self.priority_cap = alpha, priority_eps, priority_cap
        # the largest value a leaf of the tree holds: the cap, scaled as every priority is
        self.scaled_cap = float(self._scaled(np.array(priority_cap)))
        self.max_priority = min(1.0, self.scaled_cap)
        self.stale_priority_updates = 0
        self.clamped_priorities = 0

    @property
    def size(self) -> int:
        return self.storage.size

    def insert(self, rows: proto.Transition[np.ndarray], keys: np.ndarray, priority: np.ndarray | None,
               streamed: bool = True) -> int:
        """Store rows; new rows get their priority, or the largest so far when ``priority`` is None."""
        storage = self.storage
        slots, evicted = storage.insert(rows, keys, streamed)
        if self.tree is not None:
            positions = storage.next_position - slots.size + np.arange(slots.size)
            live = positions >= storage.oldest
            if priority is None:
                values = np.full(slots.size, self.max_priority)
            else:
                values = self._scaled(self._clamped(priority[-slots.size:]))
                self.max_priority = max(self.max_priority, float(values.max()))
            if evicted.size:
                dead = np.setdiff1d(evicted, slots[live])
                self.tree.set(dead, np.zeros(dead.size))
            self.tree.set(slots[live], values[live])
        return int(slots.size)

    def _scaled(self, priority: np.ndarray) -> np.ndarray:
        return (np.asarray(priority, np.float64) + self.priority_eps) ** self.alpha

    def _clamped(self, priority: np.ndarray) -> np.ndarray:
        """Priorities lowered to ``priority_cap``, the rows lowered counted."""
        priority = np.asarray(priority, np.float64)
        over = priority > self.priority_cap
        if not np.any(over):
            return priority
        self.clamped_priorities += int(over.sum())
        return np.minimum(priority, self.priority_cap)

    def sample(self, count: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """(slots, probability of each within this table)."""
        size = self.size
        if size == 0:
            raise ValueError("cannot sample from an empty table")
        if self.tree is None or self.tree.total <= 0:
            return self.storage.random_slots(rng, count), np.full(count, 1.0 / size)
        slots, bad = self.tree.stratified(count, rng)
        if np.any(bad):
            slots[bad] = self.storage.random_slots(rng, int(bad.sum()))
        leaves = self.tree.get(slots)
        leaves[leaves <= 0] = self.tree.total / size  # only a replaced rounding miss can land here
        return slots, leaves / self.tree.total

    def update_priorities(self, positions: np.ndarray, priorities: np.ndarray) -> int:
        """Apply learner priorities to positions still stored; returns how many were applied."""
        if self.tree is None:
            return 0
        priorities = np.asarray(priorities, dtype=np.float64)
        valid = np.isfinite(priorities) & (priorities >= 0)
        live, slots = self.storage.live_slots(positions)
        keep = live & valid
        self.stale_priority_updates += int((~keep).sum())
        if not np.any(keep):
            return 0
        values = self._scaled(self._clamped(priorities[keep]))
        self.tree.set(slots[keep], values)
        self.max_priority = max(self.max_priority, float(values.max()))
        return int(keep.sum())

    def state_dict(self) -> dict[str, np.ndarray | list[np.ndarray]]:
        state: dict[str, np.ndarray | list[np.ndarray]] = {
            f"storage.{k}": v for k, v in self.storage.state_dict().items()}
        if self.tree is not None:
            state["sampler.leaves"] = self.tree.tree[self.tree.leaves: self.tree.leaves + self.tree.capacity]
        state["sampler.max_priority"] = np.array(self.max_priority, dtype=np.float64)
        state["config.capacity"] = np.array(self.storage.capacity, dtype=np.int64)
        return state

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        """Restore; raises ValueError (and changes nothing) when the state does not fit this table."""
        capacity = int(state["config.capacity"])
        if capacity != self.storage.capacity:
            raise ValueError(f"checkpoint was written with capacity {capacity}, this replay has "
                             f"{self.storage.capacity}")
        max_priority = float(state["sampler.max_priority"])
        if not np.isfinite(max_priority) or max_priority <= 0:
            raise ValueError(f"checkpoint max priority {max_priority} is not a positive number")
        leaves = state.get("sampler.leaves")
        if self.tree is not None and leaves is not None:
            leaves = np.asarray(leaves, np.float64)
            if leaves.shape != (capacity,) or not np.all(np.isfinite(leaves)) or np.any(leaves < 0):
                raise ValueError("checkpoint priorities are not finite, non-negative and one per slot")
        self.storage.load_state_dict({k.removeprefix("storage."): v for k, v in state.items()
                                      if k.startswith("storage.")})
        cap = self.scaled_cap  # a checkpoint written with a higher (or no) cap is held to this run's
        self.max_priority = min(max_priority, cap)
        if self.tree is None:
            return
        live = np.arange(self.storage.oldest, self.storage.next_position) % capacity
        values = np.zeros(capacity)
        # A checkpoint of a uniform replay has no priorities: every stored item starts at the max.
        values[live] = np.minimum(leaves[live], cap) if leaves is not None else self.max_priority
        self.tree.load_state_dict({"leaves": values})
