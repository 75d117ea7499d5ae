"""glibc malloc tuning for an actor: frame batches are reused from the heap instead of fresh mmap'd pages.

Actors allocate and free arrays of a few hundred KB every step (n-step rows of frame stacks).
glibc serves allocations above M_MMAP_THRESHOLD (128 KB at first) with a fresh ``mmap`` each time,
so every row batch pays page faults on first touch: about 4x the cost of the copy itself on the
2-core machines measured here. Raising the mmap and trim thresholds keeps freed blocks in the heap.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger("flywheel.actor")

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def keep_freed_frames(mmap_threshold: int = 64 << 20, trim_threshold: int = 256 << 20) -> bool:
    """Apply the thresholds (glibc only); returns whether they were applied."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False  # not glibc (musl, macOS): the defaults stay
    applied = bool(mallopt(_M_MMAP_THRESHOLD, mmap_threshold)) and bool(mallopt(_M_TRIM_THRESHOLD, trim_threshold))
    if not applied:
        log.debug("mallopt refused the thresholds; glibc defaults stay")
    return applied
