"""When to publish weights and how: every K updates or T seconds, copied off the device without stalling."""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable

import torch

from flywheel import proto

from .staging import HostCopy


class WeightsSnapshots:
    """Versioned weight snapshots of ``net``: ``begin`` starts a device->host copy, ``take`` returns the message.

    Versions are assigned when a snapshot is taken, one more than the last, so they strictly increase (also
    across restarts: ``start_version`` comes from the checkpoint, or from ``reserve``'s notes when a kill left
    versions published after it). ``reserve(upto)`` is called before a version above the last reservation goes
    out, ``reserve_ahead`` versions at a time. One snapshot is in flight at a time.

    Every message carries ``run_id``, random and new for each learner start (a resumed one too): actors take the
    first weights of a run they have not seen whatever their version, so a rogue version far ahead from another
    run id pins nobody once this learner publishes again.
    """

    def __init__(self, net: torch.nn.Module, name: str, *, start_version: int, every_updates: int,
                 every_seconds: float, reserve: Callable[[int], None] | None = None,
                 reserve_ahead: int = 1000, run_id: str | None = None) -> None:
        self.net, self.name = net, name
        self.run_id = secrets.token_hex(8) if run_id is None else run_id
        self.version = start_version
        self.reserve, self.reserve_ahead, self.reserved = reserve, reserve_ahead, start_version
        self.every_updates, self.every_seconds = every_updates, every_seconds
        self.steps_at_last = 0
        self.time_of_last = -math.inf
        self._pending: HostCopy | None = None
        self._pending_steps = 0

    def set_interval(self, *, updates: int | None = None, seconds: float | None = None) -> None:
        if updates is not None:
            self.every_updates = updates
        if seconds is not None:
            self.every_seconds = seconds

    @property
    def pending(self) -> bool:
        return self._pending is not None

    def due(self, steps: int, now: float) -> bool:
        """K updates since the last version, or T seconds and at least one update (0 seconds = no timer)."""
        if self._pending is not None:
            return False
        since = steps - self.steps_at_last
        if since >= self.every_updates:
            return True
        return since > 0 and self.every_seconds > 0 and now - self.time_of_last >= self.every_seconds

    def begin(self, steps: int) -> None:
        """Start copying the current weights to host memory (non-blocking on a GPU)."""
        if self._pending is None:
            self._pending = HostCopy(self.net.state_dict(), dtype=torch.float32)
            self._pending_steps = steps

    def take(self, now: float, *, wait: bool = False) -> proto.Weights | None:
        """The next version once its copy has landed (``wait`` blocks until it has); else None."""
        if self._pending is None:
            return None
        if not self._pending.ready():
            if not wait:
                return None
            self._pending.wait()
        tensors = self._pending.numpy()
        self._pending = None
        self.version += 1
        if self.reserve is not None and self.version > self.reserved:
            self.reserved = self.version + self.reserve_ahead
            self.reserve(self.reserved)
        self.steps_at_last, self.time_of_last = self._pending_steps, now
        return proto.Weights(version=self.version, network=self.name, tensors=tensors, run_id=self.run_id)
