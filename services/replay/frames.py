"""Frame ring: each distinct observation frame stored once, found by fingerprint and verified byte for byte."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from flywheel.proto.packing import pack_bound, pack_frame

COMPARE_CHUNK = 256  # frames compared per NumPy call: bounds the temporaries


def _word_dtype(nbytes: int) -> np.dtype:
    for size, dtype in ((8, np.uint64), (4, np.uint32), (2, np.uint16)):
        if nbytes % size == 0:
            return np.dtype(dtype)
    return np.dtype(np.uint8)


def stream_keys(actor: str, stream: np.ndarray | None) -> np.ndarray | np.uint64:
    """A 64-bit key per row naming its (actor, stream) sequence; stable across processes (no ``hash()``)."""
    import hashlib

    base = int.from_bytes(hashlib.blake2b(actor.encode(), digest_size=8).digest(), "little")
    if stream is None:
        return np.uint64(base)
    with np.errstate(over="ignore"):
        return np.uint64(base) ^ (stream.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15))


class FrameStore:
    """A ring of ``capacity`` frames addressed by global ids (id % capacity is the slot).

    Incoming frames are matched to frames stored less than ``window`` ids ago by a 64-bit key (a content
    fingerprint mixed with the sender's stream key) and every match is then checked byte for byte, so a wrong
    key or a fingerprint collision can only cost space, never return a wrong frame.
    """

    def __init__(self, capacity: int, frame_shape: tuple[int, ...], window: int | None = None,
                 pack: bool = False) -> None:
        if capacity < 2:
            raise ValueError("a frame store needs at least 2 frames")
        self.capacity = capacity
        self.frame_shape = tuple(frame_shape)
        self.frame_bytes = math.prod(self.frame_shape)
        self.frames = np.zeros((capacity, *self.frame_shape), dtype=np.uint8)  # calloc: pages appear when written
        self.keys = np.zeros(capacity, dtype=np.uint64)
        self.head = 0  # global id of the next frame written
        self.window = window if window is not None else max(1, min(65536, capacity // 4))
        table_bits = max(12, (8 * self.window - 1).bit_length())
        self.table_mask = np.uint64((1 << table_bits) - 1)
        self.table_key = np.zeros(1 << table_bits, dtype=np.uint64)
        self.table_id = np.full(1 << table_bits, -1, dtype=np.int64)
        self._word = _word_dtype(self.frame_bytes)
        words = self.frame_bytes // self._word.itemsize
        self.ring_words = self.frames.reshape(capacity, -1).view(self._word)
        self._scratch = np.empty((COMPARE_CHUNK, words), self._word)
        self._diff = np.empty((COMPARE_CHUNK, words), bool)
        self.frames_in = 0  # frames offered
        self.frames_written = 0  # frames stored (the rest reused a stored one)
        self.collisions = 0  # key matches whose bytes differed
        # frame_packing=lz4: each frame also as an LZ4 block in a slot of a quarter frame (size 0: it did not fit,
        # the frame itself travels), so TCP batches carry several times fewer bytes (proto/packing.py)
        self.pack_slot = max(1, self.frame_bytes // 4) if pack else 0
        self.packed = np.zeros((capacity, self.pack_slot), np.uint8) if pack else None
        self.packed_size = np.zeros(capacity, np.int32) if pack else None
        self._pack_scratch = np.empty(pack_bound(self.frame_bytes), np.uint8)
        self.frames_unpackable = 0  # frames LZ4 could not fit in a slot

    @property
    def oldest_id(self) -> int:
        """The oldest id whose frame is still intact."""
        return max(0, self.head - self.capacity)

    @property
    def max_insert(self) -> int:
        """The most frames one plan may add: matches must survive the insert that follows them."""
        return self.capacity - self.window

    def fingerprint(self, frames: np.ndarray, stream_key: np.ndarray | np.uint64) -> np.ndarray:
        """A 64-bit key per frame: the wrapping sum of its words xor its stream key.

        Cheap on purpose: the key only proposes a match, which ``add`` then checks byte for byte.
        """
        words = np.ascontiguousarray(frames).reshape(len(frames), -1).view(self._word)
        return words.sum(axis=1, dtype=np.uint64) ^ stream_key

    def add(self, frames: np.ndarray, keys: np.ndarray, reserve: int, make_room: Callable[[int], object],
            ) -> np.ndarray:
        """Store ``frames`` (M, *frame_shape) and return the global id that holds each one's bytes.

        A frame reuses a stored frame (less than ``window`` ids old and surviving ``reserve`` more writes) or
        the first incoming frame with the same key; every frame is then compared with the bytes its id holds
        and a mismatch (a key collision) gets a frame of its own. ``make_room(limit)`` is called before ring
        slots are overwritten: the caller must stop using ids below ``limit``.
        """
        count = len(frames)
        if reserve > self.max_insert or count > reserve:
            raise ValueError(f"insert of {reserve} frames exceeds what a {self.capacity}-frame store can take")
        unique, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
        slots = (unique & self.table_mask).astype(np.intp)
        candidate = self.table_id[slots]
        low = max(self.head - self.window, self.head + reserve - self.capacity, 0)
        stored = (self.table_key[slots] == unique) & (candidate >= low)
        rep = np.where(stored, candidate, -1)
        fresh = np.nonzero(~stored)[0]
        fresh = fresh[np.argsort(first[fresh], kind="stable")]  # keep arrival order in the ring
        rep[fresh] = self.head + np.arange(fresh.size)
        refs = rep[inverse]
        self._write(frames, first[fresh], keys, make_room)
        bad = self._mismatches(frames, refs)
        if bad.size:
            refs[bad] = self.head + np.arange(bad.size)
            self._write(frames, bad, None, make_room)
            self.collisions += int(bad.size)
        self.frames_in += count
        return refs

    def _write(self, frames: np.ndarray, src: np.ndarray, keys: np.ndarray | None,
               make_room: Callable[[int], object]) -> None:
        """Copy frames[src] to ids head.. (after ``make_room``), indexing their keys unless None."""
        count = src.size
        if count == 0:
            return
        make_room(self.head + count - self.capacity)
        start = self.head % self.capacity
        first_part = min(count, self.capacity - start)
        np.take(frames, src[:first_part], axis=0, out=self.frames[start:start + first_part], mode="clip")
        if first_part < count:
            np.take(frames, src[first_part:], axis=0, out=self.frames[: count - first_part], mode="clip")
        ids = self.head + np.arange(count, dtype=np.int64)
        if self.packed is not None:
            self.pack(ids % self.capacity)
        if keys is not None:
            new_keys = keys[src]
            self.keys[ids % self.capacity] = new_keys
            table_slots = (new_keys & self.table_mask).astype(np.intp)
            self.table_key[table_slots] = new_keys
            self.table_id[table_slots] = ids
        self.head += count
        self.frames_written += count

    def pack(self, slots: np.ndarray) -> None:
        """Compress the frames in ``slots`` into their packed slots (after they are written or restored)."""
        packed, sizes, scratch = self.packed, self.packed_size, self._pack_scratch
        assert packed is not None and sizes is not None
        flat = self.frames.reshape(self.capacity, -1)
        for slot in slots.tolist():
            size = pack_frame(flat[slot], scratch)
            if size <= self.pack_slot:
                packed[slot, :size] = scratch[:size]
                sizes[slot] = size
            else:
                sizes[slot] = 0
                self.frames_unpackable += 1

    def packed_frames(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The frames of global ``ids`` as concatenated LZ4 blocks and their sizes (SampleBatch.packed form:
        a frame that did not pack travels as itself, its size the frame's)."""
        packed, stored = self.packed, self.packed_size
        assert packed is not None and stored is not None
        slots = ids % self.capacity
        sizes = stored[slots]
        blocks, whole = packed.reshape(-1).data, self.frames.reshape(-1).data
        step, frame = self.pack_slot, self.frame_bytes
        payload = b"".join([blocks[slot * step:slot * step + size] if size else whole[slot * frame:(slot + 1) * frame]
                            for slot, size in zip(slots.tolist(), sizes.tolist(), strict=True)])
        return np.frombuffer(payload, np.uint8), np.where(sizes == 0, frame, sizes).astype(np.int64)

    def _mismatches(self, frames: np.ndarray, refs: np.ndarray) -> np.ndarray:
        """Indices i whose frame differs from the bytes id refs[i] holds."""
        words = frames.reshape(len(frames), -1).view(self._word)
        bad = []
        scratch, diff = self._scratch, self._diff
        for lo in range(0, len(refs), COMPARE_CHUNK):
            n = min(COMPARE_CHUNK, len(refs) - lo)
            np.take(self.ring_words, refs[lo:lo + n] % self.capacity, axis=0, out=scratch[:n], mode="clip")
            np.not_equal(words[lo:lo + n], scratch[:n], out=diff[:n])
            differ = np.nonzero(diff[:n].any(axis=1))[0]
            if differ.size:
                bad.append(differ + lo)
        return np.concatenate(bad) if bad else np.zeros(0, np.int64)

    def rebuild_index(self) -> None:
        """Re-index the newest ``window`` frames (after a restore), so new inserts reuse them."""
        self.table_key[:] = 0
        self.table_id[:] = -1
        ids = np.arange(max(self.oldest_id, self.head - self.window), self.head, dtype=np.int64)
        keys = self.keys[ids % self.capacity]
        slots = (keys & self.table_mask).astype(np.intp)
        self.table_key[slots] = keys
        self.table_id[slots] = ids

    @property
    def nbytes(self) -> int:
        packed = 0 if self.packed is None or self.packed_size is None else self.packed.nbytes + self.packed_size.nbytes
        return int(self.frames.nbytes + self.keys.nbytes + self.table_key.nbytes + self.table_id.nbytes + packed)
