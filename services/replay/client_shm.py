"""The replay client's side of shared memory: opening the segment a replay offers and reading a reply's slot."""

from __future__ import annotations

import mmap
import os
import re
from dataclasses import dataclass

import numpy as np

from flywheel import proto

from .shm import SHM_DIR

SEGMENT_RE = re.compile(r"^flywheel-replay-[0-9]+-[0-9]+-[0-9a-f]{8}$")
DTYPES = {"uint8": np.uint8, "float32": np.float32}


class BadSlot(ValueError):
    """A reply's shared-memory slot cannot be read: no such segment here, or a description that does not fit."""


@dataclass
class Segment:
    """A replay's segment mapped read-only here."""

    name: str
    mm: mmap.mmap
    size: int

    def close(self) -> None:
        try:
            self.mm.close()
        except BufferError:  # batches still held keep the mapping alive until they are gone
            pass


def open_segment(offer: dict) -> Segment:
    """Map the segment a replay offers ({"segment", "size", "token"}); OSError (or ValueError, TypeError) when it
    is malformed or not reachable here, e.g. another host's segment of the same name (its token differs)."""
    name, size, token = offer.get("segment"), offer.get("size"), offer.get("token")
    if not (isinstance(name, str) and SEGMENT_RE.match(name) and isinstance(size, int) and size > 16):
        raise OSError("malformed offer")
    fd = os.open(SHM_DIR / name, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        if os.fstat(fd).st_size != size:
            raise OSError("segment size differs from the offer")
        mm = mmap.mmap(fd, size, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    if mm[:16].hex() != token:
        mm.close()
        raise OSError("token differs: another host's segment of the same name")
    return Segment(name, mm, size)


def map_slot(batch: proto.SampleBatch, segment: Segment | None, obs_shape: tuple[int, ...] | None) -> None:
    """Point ``batch.obs``/``next_obs`` at the slot its reply names in ``segment`` (read-only views); BadSlot when
    the reply names another segment or a slot that does not fit (``obs_shape`` when given, the segment's size)."""
    shm = batch.shm
    if segment is None or shm.get("segment") != segment.name:
        raise BadSlot("the reply names a shared-memory segment this client has not attached")
    dtype = DTYPES.get(str(shm.get("dtype")))
    try:
        shape = tuple(int(d) for d in str(shm.get("shape")).split(","))
        offsets = int(shm["offset"]), int(shm["next_offset"])
    except (KeyError, ValueError):
        raise BadSlot("malformed shared-memory slot description") from None
    if dtype is None or not shape or any(d <= 0 for d in shape):
        raise BadSlot(f"bad slot dtype {shm.get('dtype')!r} or shape {shm.get('shape')!r}")
    if obs_shape is not None and shape != obs_shape:
        raise BadSlot(f"slot observations {shape}, this client expects {obs_shape}")
    full = (batch.action.shape[0], *shape)
    nbytes = int(np.prod(full)) * np.dtype(dtype).itemsize
    if any(off < 0 or off + nbytes > segment.size for off in offsets):
        raise BadSlot("shared-memory slot lies outside the segment")
    batch.obs = np.ndarray(full, dtype, buffer=segment.mm, offset=offsets[0])
    batch.next_obs = np.ndarray(full, dtype, buffer=segment.mm, offset=offsets[1])
