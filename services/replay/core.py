"""The replay core: main and demonstration tables, importance weights and the rate limiter, with no sockets."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from flywheel import proto
from flywheel.settings import setting_default

from .frames import stream_keys
from .limiter import RateLimiter
from .settings import ReplaySettings
from .storage import FrameRefs, SchemaMismatch, TransitionStorage, frame_layout
from .sumtree import SumTree
from .table import ReplayTable

log = logging.getLogger("flywheel.replay")


class InsertRejected(ValueError):
    """A transition batch whose values cannot be stored (NaN rewards, discounts outside [0, 1], ...)."""

    fault = "values"


class ActionOutOfRange(InsertRejected):
    """A transition batch with an action outside 0..num_actions-1: the learner's network has no such output."""

    fault = "action"


_default = partial(setting_default, ReplaySettings)  # a settings field's default: each value is written once


@dataclass
class ReplayConfig:
    """What shapes the replay core; built from ReplaySettings (startup.py), whose defaults these are."""

    capacity: int = _default("capacity")
    prioritized: bool = _default("prioritized")
    alpha: float = _default("alpha")
    priority_eps: float = 1e-6
    max_priority: float = _default("max_priority")  # higher priorities are stored as this (and counted)
    min_size_to_sample: int = _default("min_size_to_sample")
    samples_per_insert: float = _default("samples_per_insert")
    error_buffer: float = _default("error_buffer")
    block_inserts: bool = _default("block_inserts")
    seed: int | None = _default("seed")
    dedup_frames: bool = _default("dedup_frames")
    frame_ratio: float = _default("frame_ratio")
    frame_capacity: int | None = None
    pack_frames: bool = False  # also keep pixel frames LZ4-packed, for packed socket replies
    demo_ratio: float = _default("demo_ratio")
    gather_threads: int = _default("gather_threads")
    num_actions: int = _default("num_actions")  # batches with an action outside 0..num_actions-1 refused (0: unchecked)
    max_abs_value: float = _default("max_abs_value")  # largest |reward| and |float observation| stored


class ReplayCore:
    """Inserts transition batches, samples batches (proportional or uniform), updates priorities."""

    def __init__(self, config: ReplayConfig) -> None:
        self.config = config
        self.main = ReplayTable(config.capacity, prioritized=config.prioritized, alpha=config.alpha,
                                priority_eps=config.priority_eps, priority_cap=config.max_priority,
                                dedup_frames=config.dedup_frames,
                                frame_ratio=config.frame_ratio, frame_capacity=config.frame_capacity,
                                pack_frames=config.pack_frames)
        self.demos: ReplayTable | None = None
        self.limiter = RateLimiter(
            config.min_size_to_sample, config.samples_per_insert, config.error_buffer, config.block_inserts,
        )
        self.rng = np.random.default_rng(config.seed)
        # One helper thread copies half of each big batch while the loop thread copies the other half.
        self.helper = ThreadPoolExecutor(1, "replay-gather") if config.gather_threads > 1 else None
        self.priority_updates = 0
        self.demo_samples = 0
        self.expected_obs: tuple[tuple[int, ...], np.dtype] | None = None  # the env's, when known (expect_obs)
        self._clamp_logged = False

    @property
    def size(self) -> int:
        return self.main.size

    @property
    def storage(self) -> TransitionStorage:
        return self.main.storage

    @property
    def tree(self) -> SumTree | None:
        return self.main.tree

    @property
    def max_priority(self) -> float:
        return self.main.max_priority

    @property
    def stale_priority_updates(self) -> int:
        return self.main.stale_priority_updates + (self.demos.stale_priority_updates if self.demos else 0)

    @property
    def priorities_clamped(self) -> int:
        """Rows whose priority (an actor's or the learner's) was above ``config.max_priority`` and stored as it."""
        return self.main.clamped_priorities + (self.demos.clamped_priorities if self.demos else 0)

    def _note_clamped(self, before: int, source: str) -> None:
        if self.priorities_clamped > before and not self._clamp_logged:
            self._clamp_logged = True
            log.warning("priorities above max_priority %g (from %s) are stored as %g and counted in "
                        "priorities_clamped_total (logged once)", self.config.max_priority, source,
                        self.config.max_priority)

    @property
    def obs_schema(self) -> tuple[tuple[int, ...], np.dtype] | None:
        storage = self.main.storage
        if storage.obs_shape is None or storage.obs_dtype is None:
            return None
        return storage.obs_shape, storage.obs_dtype

    def can_sample(self, batch_size: int) -> bool:
        return self.limiter.can_sample(batch_size - self.demo_rows(batch_size), self.size)

    def can_insert(self, count: int = 1) -> bool:
        return self.limiter.can_insert(count)

    def demo_rows(self, batch_size: int) -> int:
        """Rows of a batch drawn from the demonstrations table."""
        if self.demos is None or self.demos.size == 0 or self.config.demo_ratio <= 0:
            return 0
        return min(batch_size - 1, max(1, round(batch_size * self.config.demo_ratio)))

    def insert(self, batch: proto.TransitionBatch) -> int:
        """Store a decoded batch; raises SchemaMismatch or InsertRejected with the storage untouched."""
        expected = self.expected_obs
        if expected is not None and (tuple(batch.obs.shape[1:]) != expected[0] or batch.obs.dtype != expected[1]):
            raise SchemaMismatch(f"observations {batch.obs.dtype}{tuple(batch.obs.shape[1:])} are not the env's "
                                 f"{expected[1]}{expected[0]}")
        self.main.storage.check(batch.obs)
        if self.demos is not None:
            self.demos.storage.check(batch.obs)  # actors must send what the demonstrations hold
        _check_values(batch, self.config.num_actions, self.config.max_abs_value)
        priority = batch.priority
        if priority is not None and (not np.all(np.isfinite(priority)) or np.any(priority < 0)):
            priority = None  # an actor's garbage priorities must not poison the tree: use the max
        keys = np.broadcast_to(stream_keys(batch.actor, batch.stream), (len(batch),))
        clamped = self.priorities_clamped
        inserted = self.main.insert(batch, keys, priority, streamed=batch.stream is not None)
        self._note_clamped(clamped, f"actor {batch.actor[:64]!r}")
        self.limiter.record_insert(len(batch))
        return inserted

    def check_actions(self, num_actions: int) -> None:
        """Refuse, from now on, transition batches with an action outside 0..num_actions-1 (0: only negative ones)."""
        if num_actions < 0:
            raise ValueError(f"num_actions must be >= 0, got {num_actions}")
        self.config.num_actions = num_actions

    def expect_obs(self, shape: tuple[int, ...], dtype: np.dtype | str) -> None:
        """Refuse, from now on, batches whose observations are not ``dtype[shape]`` (the env's); SchemaMismatch
        when what is already stored (a restored checkpoint, demonstrations) is something else."""
        schema = self.obs_schema
        if schema is not None and (schema[0] != tuple(shape) or schema[1] != np.dtype(dtype)):
            raise SchemaMismatch(f"the replay holds observations {schema[1]}{schema[0]}, the env gives "
                                 f"{np.dtype(dtype)}{tuple(shape)}")
        self.expected_obs = (tuple(shape), np.dtype(dtype))

    def load_demos(self, count: int, obs_shape: tuple[int, ...], obs_dtype: np.dtype | str,
                   episodes: Iterable[proto.Transition[np.ndarray]]) -> int:
        """Fill the demonstrations table (never evicted) with ``count`` transitions, given one episode at a time;
        returns how many."""
        dtype = np.dtype(obs_dtype)
        schema = self.obs_schema
        if schema is not None and (schema[0] != tuple(obs_shape) or schema[1] != dtype):
            raise SchemaMismatch(f"demonstrations hold {dtype}{tuple(obs_shape)}, replay holds {schema[1]}{schema[0]}")
        layout = frame_layout(tuple(obs_shape), dtype) if self.config.dedup_frames else None
        frames = 2 * layout[0] * count + 8 * layout[0] + 8 if layout else None  # room for every frame: no eviction
        table = ReplayTable(max(count, 1), prioritized=self.config.prioritized, alpha=self.config.alpha,
                            priority_eps=self.config.priority_eps, priority_cap=self.config.max_priority,
                            dedup_frames=self.config.dedup_frames,
                            frame_capacity=frames, pack_frames=self.config.pack_frames)
        table.storage.allocate(tuple(obs_shape), dtype)
        for episode, rows in enumerate(episodes):
            table.insert(rows, np.full(len(rows), episode, np.uint64), None)
        if table.size != count:
            raise ValueError(f"demonstrations table holds {table.size} transitions, expected {count}")
        self.demos = table
        return table.size

    def _draw(self, batch_size: int, beta: float, request_id: int
              ) -> tuple[np.ndarray, np.ndarray | None, proto.SampleBatch]:
        """Rows of both tables for one batch: (main slots, demo slots or None, the batch with everything but its
        observations, which are (B, 0) placeholders)."""
        schema = self.obs_schema
        if schema is None or self.size == 0:
            raise ValueError("cannot sample from an empty replay")
        demo_count = self.demo_rows(batch_size)
        main_count = batch_size - demo_count
        slots, probs = self.main.sample(main_count, self.rng)
        small: dict[str, Any] = self.main.storage.small(slots)
        index = self.main.storage.positions_of(slots)
        total_size = self.size
        demo_slots = None
        if demo_count:
            assert self.demos is not None
            share = demo_count / batch_size
            demo_slots, demo_probs = self.demos.sample(demo_count, self.rng)
            demo_small = self.demos.storage.small(demo_slots)
            small = {k: np.concatenate([small[k], demo_small[k]]) for k in small}
            index = np.concatenate([index, -1 - self.demos.storage.positions_of(demo_slots)])
            probs = np.concatenate([probs * (1 - share), demo_probs * share])
            total_size += self.demos.size
            self.demo_samples += demo_count
        weights = (total_size * probs) ** (-beta)
        weights = (weights / weights.max()).astype(np.float32)
        is_demo = np.zeros(batch_size, np.uint8)
        is_demo[main_count:] = 1
        self.limiter.record_sample(main_count)
        placeholder = np.empty((batch_size, 0), schema[1])
        return slots, demo_slots, proto.SampleBatch(
            request_id=request_id, replay_size=self.size, obs=placeholder, next_obs=placeholder, index=index,
            weight=weights, is_demo=is_demo if self.demos is not None else None, **small)

    def sample_into(self, batch_size: int, beta: float, obs_out: np.ndarray, next_out: np.ndarray,
                    request_id: int = 0) -> proto.SampleBatch:
        """Sample ``batch_size`` rows, writing observations into the outputs; returns the batch with (B, 0)
        placeholders for them. The caller checks ``can_sample``."""
        slots, demo_slots, batch = self._draw(batch_size, beta, request_id)
        main_count = len(slots)
        self.main.storage.gather(slots, obs_out[:main_count], next_out[:main_count], self.helper)
        if demo_slots is not None:
            assert self.demos is not None
            self.demos.storage.gather(demo_slots, obs_out[main_count:], next_out[main_count:])
        return batch

    @property
    def compact_ready(self) -> bool:
        """Whether batches can travel in the compact form (every table keeps pixel frames deduplicated)."""
        return self.main.storage.frames is not None and (self.demos is None or self.demos.storage.frames is not None)

    @property
    def packed_ready(self) -> bool:
        """Whether compact batches can carry LZ4-packed frames (every table's frame ring packs them)."""
        tables = [self.main] if self.demos is None else [self.main, self.demos]
        return self.compact_ready and all(t.storage.frames is not None and t.storage.frames.packed is not None
                                          for t in tables)

    def sample_compact(self, batch_size: int, beta: float, request_id: int = 0,
                       packed: bool = False) -> proto.SampleBatch:
        """A batch in the compact form: each distinct frame once plus the stacks' frame indices (see
        ``proto.SampleBatch.frames``), the frames LZ4-packed with ``packed`` (only when ``packed_ready``); only
        when ``compact_ready``. The caller checks ``can_sample``."""
        schema = self.obs_schema
        assert schema is not None and self.compact_ready and (self.packed_ready or not packed)
        slots, demo_slots, batch = self._draw(batch_size, beta, request_id)
        refs = self.main.storage.frame_refs(slots, packed)
        if demo_slots is not None:
            assert self.demos is not None
            refs = _joined(refs, self.demos.storage.frame_refs(demo_slots, packed))
        obs_idx, next_idx = refs.obs_idx, refs.next_idx
        if len(schema[0]) == 2:  # single-frame observations: one frame per row, no stack axis
            obs_idx, next_idx = obs_idx[:, 0], next_idx[:, 0]
        batch.packing = {"codec": "lz4", "shape": ",".join(str(side) for side in schema[0][-2:])} if packed else {}
        batch.frames, batch.obs_idx, batch.next_idx = refs.frames, obs_idx, next_idx
        batch.packed, batch.packed_sizes = refs.packed, refs.packed_sizes
        return batch

    def sample(self, batch_size: int, beta: float, request_id: int = 0) -> proto.SampleBatch:
        """A ready-to-use batch in fresh arrays; the caller checks ``can_sample`` first."""
        schema = self.obs_schema
        if schema is None or self.size == 0:
            raise ValueError("cannot sample from an empty replay")
        obs = np.empty((batch_size, *schema[0]), schema[1])
        next_obs = np.empty_like(obs)
        batch = self.sample_into(batch_size, beta, obs, next_obs, request_id)
        batch.obs, batch.next_obs = obs, next_obs
        return batch

    def update_priorities(self, index: np.ndarray, priorities: np.ndarray) -> int:
        """Apply learner priorities (negative indices name demonstration rows); returns how many applied."""
        index = np.asarray(index, np.int64)
        priorities = np.asarray(priorities, np.float64)
        demo = index < 0
        clamped = self.priorities_clamped
        applied = self.main.update_priorities(index[~demo], priorities[~demo])
        if self.demos is not None and demo.any():
            applied += self.demos.update_priorities(-1 - index[demo], priorities[demo])
        elif demo.any():
            self.main.stale_priority_updates += int(demo.sum())
        self.priority_updates += applied
        self._note_clamped(clamped, "a priority update")
        return applied

    def set_ratio(self, ratio: proto.ReplayRatioArgs) -> None:
        """Change the limiter's samples-per-insert ratio (and error buffer, when given); checked when ``ratio`` was
        built, by the set_replay_ratio command's one rule."""
        self.limiter.samples_per_insert = ratio.samples_per_insert
        if ratio.error_buffer is not None:
            self.limiter.error_buffer = ratio.error_buffer

    def state_dict(self) -> dict[str, np.ndarray | list[np.ndarray]]:
        state = self.main.state_dict()
        limiter = self.limiter.state_dict()
        state["limiter.counts"] = np.array([limiter["inserts"], limiter["samples"]], dtype=np.int64)
        return state

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        """Restore the main table and limiter counts (before ``load_demos``); raises ValueError or KeyError."""
        counts = np.asarray(state["limiter.counts"])
        if counts.shape != (2,) or np.any(counts < 0):
            raise ValueError("checkpoint limiter counts are not two non-negative numbers")
        self.main.load_state_dict(state)
        self.limiter.load_state_dict({"inserts": int(counts[0]), "samples": int(counts[1])})


def _joined(main: FrameRefs, demos: FrameRefs) -> FrameRefs:
    """One batch's frame references from the main table's and the demonstrations table's."""
    offset = main.count
    obs_idx, next_idx = np.concatenate([main.obs_idx, demos.obs_idx + offset]), np.concatenate(
        [main.next_idx, demos.next_idx + offset])
    if main.frames is not None and demos.frames is not None:
        return FrameRefs(np.concatenate([main.frames, demos.frames]), obs_idx, next_idx)
    assert main.packed is not None and demos.packed is not None
    assert main.packed_sizes is not None and demos.packed_sizes is not None
    return FrameRefs(None, obs_idx, next_idx, np.concatenate([main.packed, demos.packed]),
                     np.concatenate([main.packed_sizes, demos.packed_sizes]))


def _check_values(batch: proto.TransitionBatch, num_actions: int = 0, max_abs: float = math.inf) -> None:
    if not np.all(np.abs(batch.reward) <= max_abs):  # NaN fails it too
        raise InsertRejected(f"rewards must be finite and within +-{max_abs:g} (max_abs_value)")
    discount = batch.discount
    if not np.all((discount >= 0) & (discount <= 1)):  # NaN fails both
        raise InsertRejected("discounts must lie in [0, 1]")
    action = batch.action
    if action.size and (int(action.min()) < 0 or (num_actions > 0 and int(action.max()) >= num_actions)):
        bad = int(action.min()) if int(action.min()) < 0 else int(action.max())
        allowed = f"0..{num_actions - 1}" if num_actions > 0 else "non-negative"
        raise ActionOutOfRange(f"action {bad} outside {allowed}: the whole batch of {len(batch)} rows is refused")
    if batch.obs.dtype.kind == "f" and not (np.all(np.abs(batch.obs) <= max_abs)
                                            and np.all(np.abs(batch.next_obs) <= max_abs)):
        raise InsertRejected(f"observations must be finite and within +-{max_abs:g} (max_abs_value): a larger one "
                             "overflows the loss of every batch it is sampled into")
