"""LZ4-packed pixel frames: one LZ4 block per frame, the replay's at-rest and on-the-wire form for TCP batches."""

from __future__ import annotations

import cramjam
import numpy as np

from .errors import BadShape, MalformedMessage

CODEC = "lz4"
MAX_UNPACKED_BYTES = 1 << 31  # what one packed batch may unpack to: 2 GiB (a 512-batch of 84x84 stacks: 25 MB)
MAX_EXPANDED_BYTES = 1 << 31  # what one compact batch may expand to (obs + next_obs stacks and unpacked
# frames), checked before anything is allocated; receivers bound it further by their decode limits


def pack_bound(frame_bytes: int) -> int:
    """The largest LZ4 block one frame of ``frame_bytes`` can become (LZ4_COMPRESSBOUND)."""
    return frame_bytes + frame_bytes // 255 + 16


def pack_frame(frame: np.ndarray, scratch: np.ndarray) -> int:
    """Compress one C-contiguous uint8 frame into ``scratch`` (at least ``pack_bound`` bytes); returns the size."""
    return int(cramjam.lz4.compress_block_into(frame.data, scratch.data, store_size=False))


def parse_shape(text: object) -> tuple[int, ...]:
    """The frame shape a packed batch names ("84,84"), checked: 1-3 positive sides, at most 16 MiB a frame."""
    try:
        shape = tuple(int(side) for side in str(text).split(","))
    except ValueError:
        raise BadShape(f"packed frames: frame shape {text!r} is not comma-separated integers") from None
    if not 1 <= len(shape) <= 3 or any(side <= 0 for side in shape) or int(np.prod(shape)) > 1 << 24:
        raise BadShape(f"packed frames: frame shape {shape} outside 1-3 positive sides of at most 16 MiB")
    return shape


def unpack_frames(packed: np.ndarray, sizes: np.ndarray, shape: tuple[int, ...],
                  scratch: np.ndarray | None = None) -> np.ndarray:
    """Frames (F, *shape) from their concatenated blocks; a block of exactly a frame's size is the frame itself
    (one that LZ4 could not shrink). Written into ``scratch`` when it is a uint8 buffer large enough."""
    frame_bytes = int(np.prod(shape))
    count = len(sizes)
    need = count * frame_bytes
    flat = scratch[:need] if scratch is not None and scratch.size >= need else np.empty(need, np.uint8)
    source, target = packed.data.cast("B"), flat.data
    decompress = cramjam.lz4.decompress_block_into
    position = 0
    for index, size in enumerate(sizes.tolist()):
        block, out = source[position:position + size], target[index * frame_bytes:(index + 1) * frame_bytes]
        position += size
        if size == frame_bytes:
            out[:] = block
            continue
        try:
            written = decompress(block, out)
        except cramjam.DecompressionError as exc:
            raise MalformedMessage(f"packed frame {index}: {exc}") from None
        if written != frame_bytes:
            raise MalformedMessage(f"packed frame {index} holds {written} bytes, a frame is {frame_bytes}")
    return flat.reshape(count, *shape)
