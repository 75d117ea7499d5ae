"""A vectorised sum tree for proportional prioritized sampling: O(log N) per item, NumPy only."""

from __future__ import annotations

import numpy as np


class SumTree:
    """Binary tree over ``capacity`` leaves whose inner nodes hold the sum of their children."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self.leaves = 1 << max(0, (capacity - 1).bit_length())
        self.tree = np.zeros(2 * self.leaves, dtype=np.float64)

    @property
    def total(self) -> float:
        return float(self.tree[1])

    def get(self, slots: np.ndarray) -> np.ndarray:
        return self.tree[self.leaves + np.asarray(slots, dtype=np.int64)]

    def set(self, slots: np.ndarray, values: np.ndarray) -> None:
        """Set leaf values (later duplicates win) and repair the sums above them, one level at a time."""
        slots = np.asarray(slots, dtype=np.int64)
        values = np.asarray(values, dtype=np.float64)
        if slots.size == 0:
            return
        if np.any((slots < 0) | (slots >= self.capacity)):
            raise IndexError("slot outside the tree")
        if np.any(~np.isfinite(values)) or np.any(values < 0):
            raise ValueError("priorities must be finite and non-negative")
        nodes = slots + self.leaves
        self.tree[nodes] = values
        nodes = np.unique(nodes >> 1)  # sorted: every level above stays sorted, so duplicates are neighbours
        keep = np.empty(nodes.size, dtype=bool)
        while nodes[0] >= 1:  # a one-leaf tree has no inner node
            self.tree[nodes] = self.tree[2 * nodes] + self.tree[2 * nodes + 1]
            if nodes[0] == 1:
                break
            nodes >>= 1
            keep[0] = True
            np.not_equal(nodes[1:], nodes[:-1], out=keep[1:nodes.size])
            nodes = nodes[keep[:nodes.size]]

    def find(self, targets: np.ndarray) -> np.ndarray:
        """Leaf slots whose prefix-sum interval contains each target in [0, total)."""
        targets = np.array(targets, dtype=np.float64).reshape(-1)
        nodes = np.ones(targets.shape[0], dtype=np.int64)
        while nodes.size and nodes[0] < self.leaves:
            left = 2 * nodes
            left_sum = self.tree[left]
            go_right = targets >= left_sum
            targets -= np.where(go_right, left_sum, 0.0)
            nodes = left + go_right
        return nodes - self.leaves

    def stratified(self, count: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Stratified proportional sample of ``count`` slots, and a mask of the (rare) ones float rounding
        landed on an empty leaf, which the caller replaces."""
        total = self.total
        if count <= 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool)
        if total <= 0:
            raise ValueError("cannot sample from an empty tree")
        bounds = (np.arange(count) + rng.random(count)) * (total / count)
        slots = self.find(np.minimum(bounds, np.nextafter(total, 0)))
        bad = (slots >= self.capacity) | (self.get(np.minimum(slots, self.capacity - 1)) <= 0)
        return slots, bad

    def sample(self, count: int, rng: np.random.Generator, limit: int) -> np.ndarray:
        """Stratified proportional sample of ``count`` slots among the first ``limit`` ones."""
        slots, bad = self.stratified(count, rng)
        bad |= slots >= limit
        if np.any(bad):
            slots[bad] = rng.integers(0, limit, size=int(bad.sum()))
        return slots

    def state_dict(self) -> dict[str, np.ndarray]:
        return {"leaves": self.tree[self.leaves: self.leaves + self.capacity].copy()}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        leaves = np.asarray(state["leaves"], dtype=np.float64)
        if leaves.shape != (self.capacity,):
            raise ValueError(f"sum tree state has {leaves.shape[0]} leaves, expected {self.capacity}")
        self.tree[:] = 0
        self.set(np.arange(self.capacity), leaves)
