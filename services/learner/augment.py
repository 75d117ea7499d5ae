"""DrQ random-shift augmentation of image batches: each image moves by up to ``pad`` pixels, edges replicated."""

from __future__ import annotations

import torch


def random_shift(images: torch.Tensor, pad: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """A copy of a (B, C, H, W) batch in which each image (all its channels alike) is shifted by a random whole
    number of pixels in [-pad, pad] on each axis, the edge rows and columns repeated into the gap.

    The same as DrQ's pad-``pad``-with-replicate-then-random-crop (Kostrikov, Yarats and Fergus, 2020), done by
    clamped gathers: no padded copy, any dtype (uint8 frames stay uint8), on the batch's device.
    """
    if images.dim() != 4:
        raise ValueError(f"random shift needs a (batch, channels, height, width) batch, got shape "
                         f"{tuple(images.shape)}")
    if pad <= 0:
        return images
    n, _, height, width = images.shape
    device = images.device
    shifts = torch.randint(-pad, pad + 1, (2, n), generator=generator, device=device)
    rows = (torch.arange(height, device=device) + shifts[0, :, None]).clamp_(0, height - 1)  # (B, H)
    cols = (torch.arange(width, device=device) + shifts[1, :, None]).clamp_(0, width - 1)  # (B, W)
    batch = torch.arange(n, device=device)[:, None, None, None]
    channels = torch.arange(images.shape[1], device=device)[None, :, None, None]
    return images[batch, channels, rows[:, None, :, None], cols[:, None, None, :]]
