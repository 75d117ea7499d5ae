"""Moving data between host and device without stalling: pinned staging ring in, event-fenced copies out."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from flywheel import proto


def _silence_read_only_warning() -> None:
    """torch warns once per process about read-only arrays (decoded batches are); take that once, silently."""
    array = np.zeros(1, np.float32)
    array.flags.writeable = False
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*not writable.*")
        torch.from_numpy(array)

STAGING_SLOTS = 3  # batches whose host->device copies may be in flight at once


Batch = proto.SampleBatch  # what an update takes: transitions with importance weights (and, optionally, is_demo)


@dataclass
class DeviceBatch(proto.Transition[torch.Tensor]):
    """A batch as tensors on the learner's device (pixels stay uint8; they are scaled inside the network)."""

    weight: torch.Tensor = field(metadata={"dtype": "float32"})
    ready: torch.cuda.Event | None = None  # CUDA: recorded on the copy stream once the tensors are there
    # uint8, 1 for rows from the replay's demonstrations table (DQfD)
    is_demo: torch.Tensor | None = field(default=None, metadata={"dtype": "uint8"})

    @property
    def size(self) -> int:
        return len(self)

    def split(self, size: int) -> list[DeviceBatch]:
        """Consecutive sub-batches of ``size`` rows (views, no copies; the last may be smaller)."""
        if self.size <= size:
            return [self]
        return [self.select(slice(i, i + size)) for i in range(0, self.size, size)]

    def use_on_current_stream(self) -> None:
        """CUDA: make the current stream wait for the copies (on the GPU, not the host) and tell the caching
        allocator these tensors are used there, so their memory is not handed out again too early."""
        if self.ready is None:
            return
        stream = torch.cuda.current_stream()
        stream.wait_event(self.ready)
        for tensor in self.arrays().values():
            if tensor is not None:
                tensor.record_stream(stream)
        self.ready = None


STAGED = tuple(spec.name for spec in proto.array_fields(DeviceBatch))  # the transition's, weight and is_demo
OBSERVED = tuple(spec.name for spec in proto.OBSERVATION_FIELDS)  # views of a shared-memory slot, when ``shared``


class BatchStager:
    """Host batches -> device tensors.

    CPU: zero-copy ``torch.from_numpy`` views. CUDA: each batch is copied into one of ``slots`` pinned host
    buffers and sent with ``non_blocking`` copies on a separate copy stream, so transfers overlap the training
    kernels; a slot is reused only after the event recorded behind its copies has passed (copies are quick and
    wait for nothing else, so this rarely blocks). CUDA with ``direct``: no ring; each array goes to the device
    straight from the batch's own (pageable) memory on the copy stream. The driver takes the bytes into its own
    staging memory before the call returns, so the caller may reuse the source at once (a shared-memory slot
    goes back as with the ring); the host thread pays that copy instead of ``np.copyto``'s. The consumer calls
    ``DeviceBatch.use_on_current_stream``.
    """

    def __init__(self, device: torch.device, slots: int = STAGING_SLOTS, *, direct: bool = False) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.direct = direct
        self._slots: list[dict[str, torch.Tensor]] = [{} for _ in range(slots)]
        self._events: list[torch.cuda.Event | None] = [None] * slots
        self._next = 0
        self.staged = 0
        self._stream = torch.cuda.Stream(device) if self.cuda else None
        _silence_read_only_warning()

    @property
    def keeps_views(self) -> bool:
        """Whether staged tensors are views of the batch's own arrays (CPU), which must then outlive the update."""
        return not self.cuda

    def stage(self, batch: Batch, *, shared: bool = False) -> DeviceBatch:
        """The batch on the device; its optional ``is_demo`` column comes along when present.

        ``shared``: the observations are views of memory the caller hands back right after (a replay's
        shared-memory slot), so they are copied here; on CUDA the pinned buffers copy anyway.
        """
        self.staged += 1
        arrays = {name: getattr(batch, name, None) for name in STAGED}
        arrays = {name: array for name, array in arrays.items() if array is not None}  # is_demo may be absent
        tensors: dict[str, Any] = {}
        if not self.cuda:  # zero-copy views; the update never writes to its inputs
            if shared:
                arrays |= {name: np.array(arrays[name]) for name in OBSERVED}
            tensors = {name: torch.from_numpy(array) for name, array in arrays.items()}
            return DeviceBatch(**tensors)
        if self.direct:
            with torch.cuda.stream(self._stream):
                for name, given in arrays.items():
                    tensors[name] = torch.from_numpy(np.asarray(given)).to(self.device, non_blocking=True)
                done = torch.cuda.Event()
                done.record(self._stream)
            return DeviceBatch(**tensors, ready=done)
        slot = self._next
        self._next = (slot + 1) % len(self._slots)
        event = self._events[slot]
        if event is not None:
            event.synchronize()  # the copies out of this slot's buffers were enqueued `slots` batches ago
        buffers = self._slots[slot]
        with torch.cuda.stream(self._stream):
            for name, given in arrays.items():
                array = np.asarray(given)
                pinned = buffers.get(name)
                if pinned is None or tuple(pinned.shape) != array.shape or pinned.numpy().dtype != array.dtype:
                    pinned = buffers[name] = torch.empty(array.shape, dtype=_torch_dtype(array.dtype),
                                                         pin_memory=True)
                np.copyto(pinned.numpy(), array)  # numpy releases the GIL for big copies
                tensors[name] = pinned.to(self.device, non_blocking=True)
            done = torch.cuda.Event()
            done.record(self._stream)
        self._events[slot] = done
        return DeviceBatch(**tensors, ready=done)


def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.empty(0, dtype=dtype)).dtype


class HostCopy:
    """Device tensors copied into fresh host buffers; ``ready()`` says when the bytes are there.

    CUDA: pinned buffers, ``non_blocking`` copies and an event, so the caller never waits for the GPU; the buffers
    are new each time, so a message still being sent by ZeroMQ is never overwritten. CPU: an immediate copy
    (``copy=False`` keeps a view when the tensor is not going to change, e.g. a fresh TD-error tensor).
    """

    def __init__(self, tensors: Mapping[str, torch.Tensor], *, dtype: torch.dtype | None = None,
                 copy: bool = True) -> None:
        self.event: torch.cuda.Event | None = None
        self.host: dict[str, torch.Tensor] = {}
        cuda = any(t.device.type == "cuda" for t in tensors.values())
        with torch.no_grad():
            for key, value in tensors.items():
                value = value.detach()
                want = dtype or value.dtype
                if value.device.type == "cuda":
                    out = torch.empty(value.shape, dtype=want, pin_memory=True)
                    out.copy_(value, non_blocking=True)
                elif copy or value.dtype != want:
                    out = value.to(dtype=want, copy=True)
                else:
                    out = value
                self.host[key] = out
        if cuda:
            self.event = torch.cuda.Event()
            self.event.record()

    def ready(self) -> bool:
        return self.event is None or bool(self.event.query())

    def wait(self) -> None:
        if self.event is not None:
            self.event.synchronize()

    def numpy(self) -> dict[str, np.ndarray]:
        """The host arrays (contiguous); call only once ``ready()`` (or after ``wait()``)."""
        return {key: value.contiguous().numpy() for key, value in self.host.items()}
