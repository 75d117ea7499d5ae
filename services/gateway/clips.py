"""The newest filmed greedy episode: clip pieces from the actors put together, bounded in count, size and time."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from flywheel import proto


class ClipRejected(proto.DecodeError):
    """A clip piece that cannot be used (inconsistent with its clip's other pieces, or too large)."""

    fault = "clip"


@dataclass
class Clip:
    """A whole clip: the mp4 bytes, and what the episode did as its last piece told it."""

    piece: proto.ClipChunk
    received_wall: float
    data: bytes

    @property
    def weight_version(self) -> int:
        return self.piece.weight_version

    @property
    def sent_time(self) -> float:
        return self.piece.time

    def info(self) -> dict[str, Any]:
        p = self.piece
        return {"instance": p.instance, "weight_version": p.weight_version, "env_id": p.env_id, "fps": p.fps,
                "frames": p.frames, "episode_return": p.episode_return, "length": p.length,
                "x_pos": p.x_pos if p.x_pos >= 0 else None, "flag": p.flag, "sent_time": p.time,
                "received_time": self.received_wall, "bytes": len(self.data)}


@dataclass
class _Partial:
    first: proto.ClipChunk
    started: float
    pieces: dict[int, bytes] = field(default_factory=dict)


class ClipAssembler:
    """Keeps the newest complete clip; clips in flight are bounded (``max_partial``), as are their sizes
    (``max_bytes``) and their age (``timeout_s``: a clip whose pieces stop coming is dropped)."""

    def __init__(self, max_bytes: int = 16 << 20, max_partial: int = 4, timeout_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_bytes, self.max_partial, self.timeout_s, self.clock = max_bytes, max_partial, timeout_s, clock
        self.newest: Clip | None = None
        self.received = 0  # whole clips
        self.dropped = 0  # clips given up (timed out, or pushed out by newer ones)
        self._partial: dict[tuple[str, int], _Partial] = {}

    def add(self, chunk: proto.ClipChunk) -> Clip | None:
        """Store one piece; the whole clip when this piece completes it. Raises ClipRejected."""
        if chunk.total_bytes > self.max_bytes:
            raise ClipRejected(f"clip_chunk: a {chunk.total_bytes}-byte clip is larger than {self.max_bytes}")
        now = self.clock()
        self._expire(now)
        key = (chunk.instance, chunk.clip)
        partial = self._partial.get(key)
        if partial is None:
            while len(self._partial) >= self.max_partial:  # the oldest clip in flight gives way
                oldest = min(self._partial, key=lambda k: self._partial[k].started)
                del self._partial[oldest]
                self.dropped += 1
            partial = self._partial[key] = _Partial(chunk, now)
        first = partial.first
        if (chunk.count, chunk.total_bytes, chunk.weight_version) != (first.count, first.total_bytes,
                                                                      first.weight_version):
            del self._partial[key]
            self.dropped += 1
            raise ClipRejected(f"clip_chunk: piece {chunk.index} of clip {chunk.clip} from {chunk.instance} "
                               "disagrees with its first piece")
        partial.pieces[chunk.index] = chunk.data.tobytes()
        if len(partial.pieces) < chunk.count:
            return None
        del self._partial[key]
        data = b"".join(partial.pieces[i] for i in range(chunk.count))
        if len(data) != chunk.total_bytes:
            self.dropped += 1
            raise ClipRejected(f"clip_chunk: clip {chunk.clip} from {chunk.instance} has {len(data)} bytes, "
                               f"its pieces said {chunk.total_bytes}")
        clip = Clip(chunk, time.time(), data)
        if self.newest is None or (clip.weight_version, clip.sent_time) >= (self.newest.weight_version,
                                                                            self.newest.sent_time):
            self.newest = clip
        self.received += 1
        return clip

    def _expire(self, now: float) -> None:
        for key in [k for k, p in self._partial.items() if now - p.started > self.timeout_s]:
            del self._partial[key]
            self.dropped += 1
