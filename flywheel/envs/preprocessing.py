"""Pixel preprocessing shared by pixel envs: greyscale, area resize and frame stacking."""

from __future__ import annotations

import functools

import numpy as np

try:  # opencv-python-headless is optional; the NumPy path gives the same result.
    import cv2

    HAVE_CV2 = True
except ImportError:  # pragma: no cover - exercised only where cv2 is missing
    HAVE_CV2 = False

# ITU-R BT.601 luma weights, the same ones cv2.COLOR_RGB2GRAY uses.
_LUMA = np.array([0.299, 0.587, 0.114], dtype=np.float32)


def rgb_to_grey(rgb: np.ndarray, *, use_cv2: bool = HAVE_CV2) -> np.ndarray:
    """Convert an (H, W, 3) uint8 RGB image (any strides) to (H, W) uint8 luma."""
    if use_cv2:
        return cv2.cvtColor(np.ascontiguousarray(rgb), cv2.COLOR_RGB2GRAY)
    grey = rgb.astype(np.float32) @ _LUMA
    return np.clip(np.rint(grey), 0, 255).astype(np.uint8)


def bgrx_to_grey(bgrx: np.ndarray, *, use_cv2: bool = HAVE_CV2) -> np.ndarray:
    """Convert an (H, W, 4) uint8 BGRx image (e.g. nes-py's native buffer) to (H, W) uint8 luma."""
    if use_cv2:
        return cv2.cvtColor(bgrx, cv2.COLOR_BGRA2GRAY)
    return rgb_to_grey(bgrx[..., 2::-1], use_cv2=False)


@functools.lru_cache(maxsize=32)
def _area_matrix(src: int, dst: int) -> np.ndarray:
    """Return the (dst, src) matrix averaging source pixels by covered area (INTER_AREA)."""
    scale = src / dst
    weights = np.zeros((dst, src), dtype=np.float32)
    for i in range(dst):
        lo, hi = i * scale, (i + 1) * scale
        for j in range(int(np.floor(lo)), min(int(np.ceil(hi)), src)):
            weights[i, j] = min(hi, j + 1) - max(lo, j)
    weights /= weights.sum(axis=1, keepdims=True)
    return weights


def resize_area(img: np.ndarray, height: int, width: int, *, use_cv2: bool = HAVE_CV2) -> np.ndarray:
    """Downscale an (H, W) uint8 image with pixel-area averaging (cv2.INTER_AREA semantics)."""
    if use_cv2:
        return cv2.resize(img, (width, height), interpolation=cv2.INTER_AREA)
    rows = _area_matrix(img.shape[0], height)
    cols = _area_matrix(img.shape[1], width)
    out = rows @ img.astype(np.float32) @ cols.T
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


class FrameStack:
    """Fixed-size stack of the most recent (H, W) uint8 frames, oldest first."""

    def __init__(self, depth: int, height: int, width: int) -> None:
        """Allocate a zeroed (depth, height, width) uint8 buffer."""
        if depth < 1:
            raise ValueError(f"stack depth must be >= 1, got {depth}")
        self.frames = np.zeros((depth, height, width), dtype=np.uint8)

    def reset(self, frame: np.ndarray) -> np.ndarray:
        """Fill every slot with ``frame`` and return a copy of the stack."""
        self.frames[:] = frame
        return self.frames.copy()

    def push(self, frame: np.ndarray) -> np.ndarray:
        """Drop the oldest frame, append ``frame`` and return a copy of the stack."""
        self.frames[:-1] = self.frames[1:]
        self.frames[-1] = frame
        return self.frames.copy()
