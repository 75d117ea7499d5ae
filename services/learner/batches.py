"""What the sampling thread hands the update loop: checked training batches on the device, and slot leases."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from flywheel import proto

from .staging import DeviceBatch

ROW_FIELDS = (*proto.TRANSITION_NAMES, "index", "weight", "is_demo")  # what a reply has per row


def spread_demos(batch: proto.SampleBatch, size: int) -> proto.SampleBatch:
    """Reorder a reply that holds demonstration rows (the replay puts them last) so that each consecutive
    ``size``-row training batch it is split into gets its share: part j takes rows j, j + k, j + 2k, ..."""
    rows = int(batch.action.shape[0])
    if batch.is_demo is None or rows <= size or not batch.is_demo.any():
        return batch
    parts = math.ceil(rows / size)
    order = np.concatenate([np.arange(j, rows, parts) for j in range(parts)])
    return dataclasses.replace(batch, **{name: getattr(batch, name)[order] for name in ROW_FIELDS})


@dataclass
class SlotLease:
    """A shared-memory reply whose slot the staged tensors still read (CPU, no copy): handed back to the replay
    once every training batch split from it has been trained on and its priorities sent."""

    batch: proto.SampleBatch
    parts: int


@dataclass
class ReadyBatch:
    """One training batch, checked: its replay indices and replay size, its tensors on the device, and the lease
    of the shared-memory slot they are views of (None when they own their memory)."""

    index: np.ndarray
    replay_size: int
    tensors: DeviceBatch
    lease: SlotLease | None = None
