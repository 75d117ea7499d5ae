"""The replay core: storage, prioritized sampler and rate limiter, with no sockets."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from flywheel import proto

from .limiter import RateLimiter
from .storage import RingStorage
from .sumtree import SumTree


@dataclass
class ReplayConfig:
    """What shapes the replay core; built from ReplaySettings by main."""

    capacity: int = 100_000
    prioritized: bool = True
    alpha: float = 0.6
    priority_eps: float = 1e-6
    min_size_to_sample: int = 1000
    samples_per_insert: float = 0.0
    error_buffer: float = 100_000.0
    block_inserts: bool = False
    seed: int | None = None


class ReplayCore:
    """Inserts transition batches, samples batches (proportional or uniform), updates priorities."""

    def __init__(self, config: ReplayConfig) -> None:
        self.config = config
        self.storage = RingStorage(config.capacity)
        self.tree = SumTree(config.capacity) if config.prioritized else None
        self.limiter = RateLimiter(
            config.min_size_to_sample, config.samples_per_insert, config.error_buffer, config.block_inserts,
        )
        self.rng = np.random.default_rng(config.seed)
        self.max_priority = 1.0
        self.priority_updates = 0
        self.stale_priority_updates = 0

    @property
    def size(self) -> int:
        return self.storage.size

    def can_sample(self, batch_size: int) -> bool:
        return self.limiter.can_sample(batch_size, self.size)

    def can_insert(self, count: int = 1) -> bool:
        return self.limiter.can_insert(count)

    def insert(self, batch: proto.TransitionBatch) -> int:
        """Store a decoded batch; raises storage.SchemaMismatch (storage untouched) on a schema change."""
        self.storage.check(batch.obs)
        priority = batch.priority
        if priority is not None and (not np.all(np.isfinite(priority)) or np.any(priority < 0)):
            priority = None  # an actor's garbage priorities must not poison the tree: use the max
        slots = self.storage.insert({
            "obs": batch.obs, "action": batch.action, "reward": batch.reward,
            "discount": batch.discount, "next_obs": batch.next_obs,
        })
        if self.tree is not None:
            if priority is None:
                values = np.full(slots.shape[0], self.max_priority, dtype=np.float64)
            else:
                values = (priority[-slots.shape[0]:].astype(np.float64) + self.config.priority_eps) ** self.config.alpha
                self.max_priority = max(self.max_priority, float(values.max()))
            self.tree.set(slots, values)
        self.limiter.record_insert(len(batch))
        return int(slots.shape[0])

    def sample(self, batch_size: int, beta: float, request_id: int = 0) -> proto.SampleBatch:
        """A ready-to-use batch; the caller checks ``can_sample`` first."""
        size = self.size
        if size == 0:
            raise ValueError("cannot sample from an empty replay")
        if self.tree is not None:
            slots = self.tree.sample(batch_size, self.rng, size)
            probs = self.tree.get(slots) / self.tree.total
            weights = (size * probs) ** (-beta)
            weights = (weights / weights.max()).astype(np.float32)
        else:
            slots = self.rng.integers(0, size, size=batch_size)
            weights = np.ones(batch_size, dtype=np.float32)
        data = self.storage.gather(slots)
        self.limiter.record_sample(batch_size)
        return proto.SampleBatch(
            request_id=request_id, replay_size=size, index=self.storage.positions_of(slots), weight=weights, **data,
        )

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
        values = (priorities[keep] + self.config.priority_eps) ** self.config.alpha
        self.tree.set(slots[keep], values)
        self.max_priority = max(self.max_priority, float(values.max()))
        self.priority_updates += int(keep.sum())
        return int(keep.sum())

    def state_dict(self) -> dict[str, np.ndarray]:
        state = {f"storage.{k}": v for k, v in self.storage.state_dict().items()}
        if self.tree is not None:
            state.update({f"sampler.{k}": v for k, v in self.tree.state_dict().items()})
        limiter = self.limiter.state_dict()
        state["limiter.counts"] = np.array([limiter["inserts"], limiter["samples"]], dtype=np.int64)
        state["sampler.max_priority"] = np.array(self.max_priority, dtype=np.float64)
        state["config.capacity"] = np.array(self.config.capacity, dtype=np.int64)
        return state

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        capacity = int(state["config.capacity"])
        if capacity != self.config.capacity:
            raise ValueError(f"checkpoint was written with capacity {capacity}, this replay has {self.config.capacity}")
        self.storage.load_state_dict({k.removeprefix("storage."): v for k, v in state.items()
                                      if k.startswith("storage.")})
        if self.tree is not None:
            if "sampler.leaves" in state:
                self.tree.load_state_dict({"leaves": state["sampler.leaves"]})
            else:  # written by a uniform replay: start every stored item at priority 1
                self.tree.set(np.arange(self.size), np.ones(self.size))
        inserts, samples = (int(x) for x in state["limiter.counts"])
        self.limiter.load_state_dict({"inserts": inserts, "samples": samples})
        self.max_priority = float(state["sampler.max_priority"])
