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
    """A whole clip: the mp4 bytes and what the episode did."""

    instance: str
    weight_version: int
    env_id: str
    fps: float
    frames: int
    episode_return: float
    length: int
    x_pos: int | None
    flag: bool
    sent_time: float
    received_wall: float
    data: bytes

    def info(self) -> dict[str, Any]:
        return {"instance": self.instance, "weight_version": self.weight_version, "env_id": self.env_id,
                "fps": self.fps, "frames": self.frames, "episode_return": self.episode_return,
                "length": self.length, "x_pos": self.x_pos, "flag": self.flag, "sent_time": self.sent_time,
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
        clip = Clip(chunk.instance, chunk.weight_version, chunk.env_id, chunk.fps, chunk.frames,
                    chunk.episode_return, chunk.length, chunk.x_pos if chunk.x_pos >= 0 else None, chunk.flag,
                    chunk.time, time.time(), data)
        if self.newest is None or (clip.weight_version, clip.sent_time) >= (self.newest.weight_version,
                                                                            self.newest.sent_time):
            self.newest = clip
        self.received += 1
        return clip

    def _expire(self, now: float) -> None:
        for key in [k for k, p in self._partial.items() if now - p.started > self.timeout_s]:
            del self._partial[key]
            self.dropped += 1
