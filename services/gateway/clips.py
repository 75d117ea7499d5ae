"""The newest filmed greedy episode: clip pieces from the actors put together, bounded in count, size and time.

A clip of ``total_bytes`` travels as ``count = ceil(total_bytes / CLIP_CHUNK_BYTES)`` pieces, every one
``CLIP_CHUNK_BYTES`` long but the last (``services/actor/clips.py``). A piece that breaks this (another count, another
length, an index seen before, numbers that are not finite) is refused, so the bytes a clip in flight holds never pass
its declared total; all clips in flight together hold at most ``max_buffer_bytes``: a piece that would pass it pushes
out the oldest other clips in flight first (counted as dropped), as too many clips in flight do.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from flywheel import proto

from .metrics import MAX_ABS_VALUE

log = logging.getLogger("flywheel.gateway")
CLIP_MAX_BYTES = 16 << 20  # one clip (services/actor/clips.py MAX_CLIP_BYTES)
CLIP_BUFFER_BYTES = 64 << 20  # every clip in flight together (GatewaySettings.clip_buffer_bytes)


class ClipRejected(proto.DecodeError):
    """A clip piece that cannot be used; raised with the ``fault`` that says which kind (counted and logged once
    per kind)."""


@dataclass
class Clip:
    """A whole clip: the mp4 bytes, and what the episode did as its last piece told it."""

    piece: proto.ClipChunk
    received_wall: float
    data: bytes

    @property
    def weight_version(self) -> int:
        return self.piece.weight_version

    def newer_than(self, other: Clip | None) -> bool:
        """Whether the page shows this clip rather than ``other``: newer weights, then sent later (or no other)."""
        return other is None or (self.weight_version, self.piece.time) >= (other.weight_version, other.piece.time)

    def info(self) -> dict[str, Any]:
        p = self.piece
        return {"instance": p.instance, "weight_version": p.weight_version, "env_id": p.env_id, "fps": p.fps,
                "frames": p.frames, "episode_return": p.episode_return, "length": p.length,
                "progress": p.progress if p.progress >= 0 else None, "success": p.success, "sent_time": p.time,
                "received_time": self.received_wall, "bytes": len(self.data)}


@dataclass
class _Partial:
    first: proto.ClipChunk
    started: float
    pieces: dict[int, bytes] = field(default_factory=dict)
    held: int = 0  # bytes in pieces


class ClipAssembler:
    """Keeps the newest complete clip; clips in flight are bounded in number (``max_partial``), each in size
    (``max_bytes``), all together in bytes held (``max_buffer_bytes``) and in age (``timeout_s``: a clip whose
    pieces stop coming is dropped)."""

    def __init__(self, max_bytes: int = CLIP_MAX_BYTES, max_partial: int = 4, timeout_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic, max_buffer_bytes: int = CLIP_BUFFER_BYTES,
                 chunk_bytes: int = proto.CLIP_CHUNK_BYTES) -> None:
        if max_buffer_bytes < max_bytes:
            raise ValueError(f"max_buffer_bytes ({max_buffer_bytes}) must hold one clip of max_bytes ({max_bytes})")
        self.max_bytes, self.max_partial, self.timeout_s, self.clock = max_bytes, max_partial, timeout_s, clock
        self.max_buffer_bytes, self.chunk_bytes = max_buffer_bytes, chunk_bytes
        self.newest: Clip | None = None
        self.received = 0  # whole clips
        self.dropped = 0  # clips given up (timed out, or pushed out by newer ones)
        self.held = 0  # bytes held by the clips in flight, never above max_buffer_bytes
        self._partial: dict[tuple[str, int], _Partial] = {}
        self._logged_pushed_out = False

    def add(self, chunk: proto.ClipChunk) -> Clip | None:
        """Store one piece; the whole clip when this piece completes it. Raises ClipRejected."""
        self._check(chunk)
        now = self.clock()
        self._expire(now)
        key = (chunk.instance, chunk.clip)
        partial = self._partial.get(key)
        if partial is None:
            while len(self._partial) >= self.max_partial:  # the oldest clip in flight gives way
                self._drop(min(self._partial, key=lambda k: self._partial[k].started))
            partial = self._partial[key] = _Partial(chunk, now)
        first = partial.first
        if (chunk.count, chunk.total_bytes, chunk.weight_version) != (first.count, first.total_bytes,
                                                                      first.weight_version):
            self._drop(key)
            raise ClipRejected(f"clip_chunk: piece {chunk.index} of clip {chunk.clip} from "
                               f"{chunk.instance} disagrees with its first piece", fault="clip_mismatch")
        if chunk.index in partial.pieces:
            raise ClipRejected(f"clip_chunk: piece {chunk.index} of clip {chunk.clip} from "
                               f"{chunk.instance} came twice", fault="clip_duplicate")
        size = int(chunk.data.shape[0])
        if partial.held + size > first.total_bytes:  # cannot happen after _check; kept as the invariant
            raise ClipRejected(f"clip_chunk: clip {chunk.clip} from {chunk.instance} would pass its "
                               f"{first.total_bytes} bytes", fault="clip_piece")
        while self.held + size > self.max_buffer_bytes:  # the oldest other clips in flight give way
            self._push_out(key)
        partial.pieces[chunk.index] = chunk.data.tobytes()
        partial.held += size
        self.held += size
        if len(partial.pieces) < chunk.count:
            return None
        del self._partial[key]
        self.held -= partial.held
        data = b"".join(partial.pieces[i] for i in range(chunk.count))
        clip = Clip(chunk, time.time(), data)
        if clip.newer_than(self.newest):
            self.newest = clip
        self.received += 1
        return clip

    def _check(self, chunk: proto.ClipChunk) -> None:
        """Refuse a piece that no clip the actor sends could have (before it takes any room)."""
        where = f"clip_chunk: piece {chunk.index} of clip {chunk.clip} from {chunk.instance}"
        if chunk.total_bytes > self.max_bytes:
            raise ClipRejected(f"clip_chunk: a {chunk.total_bytes}-byte clip is larger than {self.max_bytes}",
                               fault="clip_size")
        count = -(-chunk.total_bytes // self.chunk_bytes)
        if chunk.count != count:
            raise ClipRejected(f"{where}: {chunk.count} pieces for {chunk.total_bytes} bytes, "
                               f"expected {count} of {self.chunk_bytes}", fault="clip_count")
        expected = self.chunk_bytes if chunk.index < count - 1 else chunk.total_bytes - (count - 1) * self.chunk_bytes
        if chunk.data.shape[0] != expected:
            raise ClipRejected(f"{where}: {chunk.data.shape[0]} bytes, expected {expected}", fault="clip_piece")
        for name in ("fps", "episode_return", "progress", "time"):
            value = getattr(chunk, name)
            if not (math.isfinite(value) and abs(value) <= MAX_ABS_VALUE):
                raise ClipRejected(f"{where}: {name} {value!r} is not a finite number within +-2**53",
                                   fault="clip_value")

    def _drop(self, key: tuple[str, int]) -> None:
        partial = self._partial.pop(key)
        self.held -= partial.held
        self.dropped += 1

    def _push_out(self, keep: tuple[str, int]) -> None:
        others = [k for k in self._partial if k != keep]
        if not others:  # cannot happen: one clip fits (max_bytes <= max_buffer_bytes)
            raise ClipRejected(f"clip_chunk: clip {keep[1]} from {keep[0]} does not fit {self.max_buffer_bytes} "
                               "bytes", fault="clip_size")
        oldest = min(others, key=lambda k: self._partial[k].started)
        if not self._logged_pushed_out:
            self._logged_pushed_out = True
            log.warning("clips: clip %d from %s pushed out: clips in flight hold %d bytes, the most is %d "
                        "(FLYWHEEL_GATEWAY_CLIP_BUFFER_BYTES); further ones are only counted "
                        "(flywheel_gateway_clips_dropped_total)", oldest[1], oldest[0], self.held,
                        self.max_buffer_bytes)
        self._drop(oldest)

    def _expire(self, now: float) -> None:
        for key in [k for k, p in self._partial.items() if now - p.started > self.timeout_s]:
            self._drop(key)
