"""Preallocated FIFO transition storage: frame references into a FrameStore for pixels, whole arrays otherwise."""

from __future__ import annotations

import math
from concurrent.futures import Executor
from dataclasses import dataclass

import numpy as np
from numpy.typing import DTypeLike

from .frames import FrameStore

SMALL_FIELDS = ("action", "reward", "discount")
FRAME_FIELDS = ("obs_ref", "next_ref", "min_ref", "ins_head")
_NO_FLOOR = np.iinfo(np.int64).max
PARALLEL_GATHER_BYTES = 4 << 20  # a helper thread pays off above a few MB of observations


@dataclass
class FrameRefs:
    """A batch's distinct frames (or, packed, their LZ4 blocks and sizes) and its stacks' indices into them."""

    frames: np.ndarray | None
    obs_idx: np.ndarray
    next_idx: np.ndarray
    packed: np.ndarray | None = None
    packed_sizes: np.ndarray | None = None

    @property
    def count(self) -> int:
        """How many distinct frames."""
        sizes = self.packed_sizes
        return int(self.frames.shape[0]) if self.frames is not None else int(0 if sizes is None else sizes.size)


class SchemaMismatch(ValueError):
    """An insert whose observation shape or dtype differs from what the storage holds."""

    fault = "shape"


def frame_layout(obs_shape: tuple[int, ...], dtype: np.dtype) -> tuple[int, tuple[int, ...]] | None:
    """(stack depth, frame shape) for pixel observations (uint8 (K, H, W) or (H, W)), None for the rest."""
    if dtype != np.uint8 or len(obs_shape) not in (2, 3):
        return None
    depth, frame = (obs_shape[0], obs_shape[1:]) if len(obs_shape) == 3 else (1, obs_shape)
    if depth > 16 or math.prod(frame) < 64:
        return None
    return depth, tuple(frame)


class TransitionStorage:
    """FIFO storage of up to ``capacity`` transitions, allocated on the first insert.

    Positions are global (the running insert count); slot = position % capacity; live positions are
    ``[oldest, next_position)``. Pixel observations keep each distinct frame once in a FrameStore of
    ``capacity * frame_ratio`` frames; a transition holds the ids of the frames of its two stacks. When the
    frame ring must overwrite a frame a live transition still uses, the oldest transitions go first.
    """

    def __init__(self, capacity: int, *, dedup_frames: bool = True, frame_ratio: float = 1.1,
                 frame_capacity: int | None = None, pack_frames: bool = False) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.capacity = capacity
        self.dedup_frames, self.frame_ratio, self.frame_capacity = dedup_frames, frame_ratio, frame_capacity
        self.pack_frames = pack_frames  # the frame ring also keeps each frame LZ4-packed (FrameStore.pack)
        self.next_position = 0
        self.oldest = 0
        self.obs_shape: tuple[int, ...] | None = None
        self.obs_dtype: np.dtype | None = None
        self.depth = 0
        self.frames: FrameStore | None = None
        self.arrays: dict[str, np.ndarray] = {}
        self.frames_evicted = 0
        self._floor = _NO_FLOOR  # a lower bound of every live transition's oldest frame id

    def allocate(self, obs_shape: tuple[int, ...], obs_dtype: np.dtype | str, frames: bool = True) -> None:
        """Allocate for this schema; pixels go to a frame ring when ``frames`` and ``dedup_frames`` allow it."""
        cap = self.capacity
        self.obs_shape, self.obs_dtype = tuple(obs_shape), np.dtype(obs_dtype)
        self.arrays = {"action": np.zeros(cap, np.int64), "reward": np.zeros(cap, np.float32),
                       "discount": np.zeros(cap, np.float32)}
        layout = frame_layout(self.obs_shape, self.obs_dtype) if self.dedup_frames and frames else None
        if layout is None:
            self.frames = None
            self.arrays["obs"] = np.zeros((cap, *self.obs_shape), self.obs_dtype)
            self.arrays["next_obs"] = np.zeros((cap, *self.obs_shape), self.obs_dtype)
            return
        self.depth, frame_shape = layout
        self.frames = FrameStore(self.frame_ring_size(self.depth), frame_shape, pack=self.pack_frames)
        refs = (cap, self.depth)
        self.arrays.update(obs_ref=np.zeros(refs, np.int64), next_ref=np.zeros(refs, np.int64),
                           min_ref=np.zeros(cap, np.int64), ins_head=np.zeros(cap, np.int64))

    def frame_ring_size(self, depth: int) -> int:
        """Frames in the ring: ``frame_capacity``, or ``capacity * frame_ratio`` (at least a few stacks)."""
        return self.frame_capacity or max(int(math.ceil(self.capacity * self.frame_ratio)), 8 * depth + 8)

    @property
    def size(self) -> int:
        return self.next_position - self.oldest

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays.values()) + (self.frames.nbytes if self.frames else 0)

    @property
    def frames_stored(self) -> int:
        """Frames from the oldest one a live transition uses to the newest (2 per transition for whole stacks)."""
        if self.frames is None:
            return 2 * self.size
        if self.size == 0:
            return 0
        live = np.arange(self.oldest, self.next_position) % self.capacity
        return self.frames.head - int(self.arrays["min_ref"][live].min())

    def check(self, obs: np.ndarray) -> None:
        """Raise SchemaMismatch unless ``obs`` (a batch) matches the stored observation schema."""
        if self.obs_shape is None:
            return
        if tuple(obs.shape[1:]) != self.obs_shape or obs.dtype != self.obs_dtype:
            raise SchemaMismatch(f"observations {obs.dtype}{tuple(obs.shape[1:])} do not match stored "
                                 f"{self.obs_dtype}{self.obs_shape}")

    def insert(self, obs: np.ndarray, action: np.ndarray, reward: np.ndarray, discount: np.ndarray,
               next_obs: np.ndarray, keys: np.ndarray, streamed: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Store rows (the newest ``capacity`` of them); returns (their slots, slots evicted early).

        The first insert fixes the layout: pixel rows that name their stream (``streamed``) go to the frame
        ring; without it (rows that need not be consecutive env steps) stacks are stored whole.
        """
        self.check(obs)
        if len(action) == 0:  # e.g. an empty demonstrations episode: nothing to store, nothing to evict
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        if self.obs_shape is None:
            self.allocate(tuple(obs.shape[1:]), obs.dtype, frames=streamed)
        skip = max(0, len(action) - self.capacity)
        rows = slice(skip, None)
        self.next_position += skip  # rows that would be evicted by their own batch take a position, no slot
        self.oldest = max(self.oldest, self.next_position - self.capacity)
        if self.frames is None:
            return self._append(action[rows], reward[rows], discount[rows], obs=obs[rows], next_obs=next_obs[rows]), \
                np.zeros(0, np.int64)
        return self._insert_frames(obs[rows], action[rows], reward[rows], discount[rows], next_obs[rows], keys[rows])

    def _insert_frames(self, obs: np.ndarray, action: np.ndarray, reward: np.ndarray, discount: np.ndarray,
                       next_obs: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        store = self.frames
        assert store is not None
        depth, frame_shape = self.depth, store.frame_shape
        chunk = max(1, store.max_insert // (2 * depth))
        slots_out, evicted = [], [np.zeros(0, np.int64)]
        for lo in range(0, len(action), chunk):
            hi = min(lo + chunk, len(action))
            n = hi - lo
            row_keys = np.repeat(keys[lo:hi], depth)
            next_frames = next_obs[lo:hi].reshape(n * depth, *frame_shape)
            obs_frames = obs[lo:hi].reshape(n * depth, *frame_shape)
            head = store.head
            refs = []
            for frames, reserve in ((next_frames, 2 * n * depth), (obs_frames, n * depth)):
                frame_keys = store.fingerprint(frames, row_keys)
                refs.append(store.add(frames, frame_keys, reserve,
                                      lambda limit: evicted.append(self._make_room(limit))).reshape(n, depth))
            next_ref, obs_ref = refs
            slots = self._append(action[lo:hi], reward[lo:hi], discount[lo:hi], obs_ref=obs_ref, next_ref=next_ref,
                                 min_ref=np.minimum(obs_ref.min(axis=1), next_ref.min(axis=1)),
                                 ins_head=np.full(n, head, np.int64))
            self._floor = min(self._floor, int(self.arrays["min_ref"][slots].min()))
            slots_out.append(slots)
        return np.concatenate(slots_out), np.concatenate(evicted)

    def _append(self, action: np.ndarray, reward: np.ndarray, discount: np.ndarray, **rest: np.ndarray) -> np.ndarray:
        count = len(action)
        positions = np.arange(self.next_position, self.next_position + count, dtype=np.int64)
        slots = positions % self.capacity
        for name, values in (("action", action), ("reward", reward), ("discount", discount), *rest.items()):
            self.arrays[name][slots] = values
        self.next_position += count
        self.oldest = max(self.oldest, self.next_position - self.capacity)
        return slots

    def _make_room(self, limit: int) -> np.ndarray:
        """Evict the oldest transitions until none uses a frame id below ``limit``; return their slots."""
        if limit <= self._floor or self.size == 0:
            return np.zeros(0, np.int64)
        store = self.frames
        assert store is not None
        ins_head, min_ref = self.arrays["ins_head"], self.arrays["min_ref"]
        # ins_head never decreases with position and min_ref >= ins_head - window: past ``end`` all is safe.
        lo, hi = self.oldest, self.next_position
        while lo < hi:
            mid = (lo + hi) // 2
            if ins_head[mid % self.capacity] - store.window >= limit:
                hi = mid
            else:
                lo = mid + 1
        end = lo
        positions = np.arange(self.oldest, end, dtype=np.int64)
        uses = np.nonzero(min_ref[positions % self.capacity] < limit)[0]
        beyond = int(ins_head[end % self.capacity]) - store.window if end < self.next_position else _NO_FLOOR
        if uses.size == 0:
            self._floor = min(int(min_ref[positions % self.capacity].min()) if positions.size else _NO_FLOOR, beyond)
            return np.zeros(0, np.int64)
        new_oldest = int(positions[uses[-1]]) + 1
        gone = np.arange(self.oldest, new_oldest, dtype=np.int64) % self.capacity
        self.oldest = new_oldest
        self.frames_evicted += gone.size
        rest = positions[uses[-1] + 1:]
        self._floor = min(int(min_ref[rest % self.capacity].min()) if rest.size else _NO_FLOOR, beyond)
        return gone

    def positions_of(self, slots: np.ndarray) -> np.ndarray:
        """Global positions currently held by ``slots``."""
        return self.oldest + (np.asarray(slots, np.int64) - self.oldest) % self.capacity

    def live_slots(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(mask of positions still stored, their slots)."""
        positions = np.asarray(positions, dtype=np.int64)
        live = (positions >= self.oldest) & (positions < self.next_position)
        return live, positions % self.capacity

    def random_slots(self, rng: np.random.Generator, count: int) -> np.ndarray:
        """Uniformly drawn live slots."""
        return rng.integers(self.oldest, self.next_position, size=count) % self.capacity

    def gather(self, slots: np.ndarray, obs_out: np.ndarray, next_out: np.ndarray,
               helper: Executor | None = None) -> dict[str, np.ndarray]:
        """Write the observations of ``slots`` into the two outputs; return the small per-row arrays.

        With a ``helper`` thread, obs are copied there while this thread copies next_obs (NumPy's take
        releases the GIL), for batches big enough to be worth it.
        """
        if self.frames is None:
            jobs = [(self.arrays["obs"], slots, obs_out), (self.arrays["next_obs"], slots, next_out)]
        else:
            cap, shape = self.frames.capacity, self.frames.frame_shape
            jobs = [(self.frames.frames, (self.arrays[name][slots] % cap).reshape(-1), out.reshape(-1, *shape))
                    for name, out in (("obs_ref", obs_out), ("next_ref", next_out))]
        pending = None
        if helper is not None and obs_out.nbytes >= PARALLEL_GATHER_BYTES:
            source, index, out = jobs.pop(0)
            pending = helper.submit(np.take, source, index, 0, out, "wrap")
        for source, index, out in jobs:
            np.take(source, index, axis=0, out=out, mode="wrap")
        if pending is not None:
            pending.result()
        return self.small(slots)

    def small(self, slots: np.ndarray) -> dict[str, np.ndarray]:
        """The per-row arrays (action, reward, discount) of ``slots``."""
        return {name: self.arrays[name][slots] for name in SMALL_FIELDS}

    def frame_refs(self, slots: np.ndarray, packed: bool = False) -> FrameRefs:
        """Each distinct frame of the rows' stacks once, and the obs and next_obs frame indices (B, K) into them.

        ``frames[obs_idx]`` is what ``gather`` writes as obs; a stack and its next stack share K - n frames, and
        a stack at an episode start repeats its first one, so F is below the 2 * B * K frames of whole stacks.
        With ``packed`` (a packing store only) the frames come as LZ4 blocks (``FrameStore.packed_frames``).
        """
        store = self.frames
        assert store is not None, "frame_refs needs deduplicated pixel storage"
        refs = np.concatenate([self.arrays["obs_ref"][slots], self.arrays["next_ref"][slots]])
        ids, inverse = np.unique(refs, return_inverse=True)
        inverse = inverse.reshape(refs.shape)
        rows = len(slots)
        if packed:
            blocks, sizes = store.packed_frames(ids)
            return FrameRefs(None, inverse[:rows], inverse[rows:], blocks, sizes)
        return FrameRefs(np.take(store.frames, ids % store.capacity, axis=0), inverse[:rows], inverse[rows:])

    def state_dict(self) -> dict[str, np.ndarray | list[np.ndarray]]:
        """Arrays to checkpoint; the frame ring as its live id range, possibly in two segments."""
        state: dict[str, np.ndarray | list[np.ndarray]] = {
            "positions": np.array([self.next_position, self.oldest], np.int64),
            "obs_shape": np.array(self.obs_shape or (), np.int64),
            "obs_dtype": np.frombuffer((self.obs_dtype.str if self.obs_dtype else "").encode().ljust(8), np.uint8),
        }
        state.update(self.arrays)
        store = self.frames
        if store is not None:
            live = (np.arange(self.oldest, self.next_position) % self.capacity)
            first = int(self.arrays["min_ref"][live].min()) if live.size else store.head
            first = max(first, store.oldest_id)
            state["frames.range"] = np.array([first, store.head, store.capacity], np.int64)
            state["frames.frames"] = _ring_segments(store.frames, first, store.head)
            state["frames.keys"] = _ring_segments(store.keys, first, store.head)
        return state

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        """Restore from ``state_dict`` output; raises ValueError (storage untouched) when it does not fit."""
        next_position, oldest = (int(x) for x in state["positions"])
        shape = tuple(int(x) for x in state["obs_shape"])
        dtype_text = bytes(state["obs_dtype"]).rstrip(b" ").decode("ascii", "replace")
        if not 0 <= oldest <= next_position or next_position - oldest > self.capacity:
            raise ValueError(f"positions {oldest}..{next_position} do not fit capacity {self.capacity}")
        if not shape:
            if next_position != oldest:
                raise ValueError("checkpoint holds transitions but no observation schema")
            self.next_position = self.oldest = next_position
            return
        try:
            dtype = np.dtype(dtype_text)
        except TypeError:
            raise ValueError(f"unknown observation dtype {dtype_text!r}") from None
        layout = frame_layout(shape, dtype) if "frames.range" in state else None
        if "frames.range" in state and (layout is None or not self.dedup_frames):
            raise ValueError("checkpoint keeps frames deduplicated: start with --dedup-frames true to restore it")
        names = set(SMALL_FIELDS) | (set(FRAME_FIELDS) if layout else {"obs", "next_obs"})
        missing = names - set(state)
        if missing:
            raise ValueError(f"checkpoint lacks {sorted(missing)}: it was written with other frame settings")
        live = np.arange(oldest, next_position, dtype=np.int64) % self.capacity
        depth = layout[0] if layout else 0
        expected_arrays: dict[str, tuple[DTypeLike, tuple[int, ...]]] = {
            "action": (np.int64, ()), "reward": (np.float32, ()), "discount": (np.float32, ()),
            "obs": (dtype, shape), "next_obs": (dtype, shape), "obs_ref": (np.int64, (depth,)),
            "next_ref": (np.int64, (depth,)), "min_ref": (np.int64, ()), "ins_head": (np.int64, ())}
        for name in names:
            want_dtype, want_shape = expected_arrays[name]
            if state[name].shape != (self.capacity, *want_shape) or state[name].dtype != want_dtype:
                raise ValueError(f"array {name} is {state[name].dtype}{state[name].shape}, this replay needs "
                                 f"{np.dtype(want_dtype)}{(self.capacity, *want_shape)}: same capacity and "
                                 "observation shape required")
        first = head = 0
        frames = np.zeros(0, np.uint8)
        if layout is not None:
            first, head, frame_cap = (int(x) for x in state["frames.range"])
            expected = self.frame_ring_size(depth)
            if not 0 <= head - first <= frame_cap or frame_cap != expected:
                raise ValueError(f"checkpoint frame ring holds {frame_cap} frames, this replay {expected}: "
                                 "use the same capacity and frame_ratio")
            frames = state["frames.frames"]
            if frames.shape != (head - first, *layout[1]) or state["frames.keys"].shape != (head - first,):
                raise ValueError("checkpoint frame ring does not match its range")
            refs = np.concatenate([state["obs_ref"][live].ravel(), state["next_ref"][live].ravel()])
            if refs.size and (refs.min() < first or refs.max() >= head):
                raise ValueError("checkpoint transitions use frames outside the saved frame range")
        self.allocate(shape, dtype, frames=layout is not None)
        for name in names:
            self.arrays[name][:] = state[name]
        self.next_position, self.oldest = next_position, oldest
        if self.frames is not None:
            self.frames.head = head
            for lo in range(first, head, 65536):  # chunked: the source is usually a memory map
                hi = min(lo + 65536, head)
                slots = np.arange(lo, hi) % self.frames.capacity
                self.frames.frames[slots] = frames[lo - first:hi - first]
                self.frames.keys[slots] = state["frames.keys"][lo - first:hi - first]
                if self.frames.packed is not None:
                    self.frames.pack(slots)
            self.frames.rebuild_index()
            self._floor = int(self.arrays["min_ref"][live].min()) if live.size else _NO_FLOOR


def _ring_segments(ring: np.ndarray, first: int, head: int) -> list[np.ndarray]:
    """Ids [first, head) of a ring as at most two views, oldest first."""
    cap = ring.shape[0]
    if head <= first:
        return [ring[:0]]
    start, end = first % cap, head % cap or cap
    if start < end and head - first <= cap:
        return [ring[start:end]]
    return [ring[start:], ring[:end]]
