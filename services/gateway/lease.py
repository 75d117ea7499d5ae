"""Exploration leases: actor i of N, dense and correct as actors come and go (Ape-X eps_i needs both)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from flywheel import proto


@dataclass
class Lease:
    instance: str
    index: int
    expires: float


class LeaseFull(RuntimeError):
    """The table holds its maximum number of leases."""


class LeaseTable:
    """Slots 0..N-1 for the N live actors.

    A new actor takes slot N. When an actor leaves (released, or its lease expired) the actor holding the last
    slot moves into the hole, so slots stay dense and only one actor's epsilon changes; it learns its new slot
    at its next renewal, which actors do every ttl/3.
    """

    def __init__(self, ttl_s: float = 10.0, max_leases: int = 10_000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s, self.max_leases, self.clock = ttl_s, max_leases, clock
        self.by_instance: dict[str, Lease] = {}
        self.slots: list[str] = []
        self.granted = self.renewed = self.released = self.expired = 0

    def __len__(self) -> int:
        return len(self.slots)

    def _remove(self, instance: str) -> None:
        lease = self.by_instance.pop(instance)
        last = self.slots.pop()
        if last != instance:
            self.slots[lease.index] = last
            self.by_instance[last].index = lease.index

    def expire(self, now: float | None = None) -> int:
        now = self.clock() if now is None else now
        gone = [name for name, lease in self.by_instance.items() if lease.expires < now]
        for name in gone:
            self._remove(name)
        self.expired += len(gone)
        return len(gone)

    def handle(self, request: proto.LeaseRequest) -> proto.LeaseReply:
        now = self.clock()
        self.expire(now)
        lease = self.by_instance.get(request.instance)
        if request.release:
            if lease is not None:
                self._remove(request.instance)
                self.released += 1
            return proto.LeaseReply(request.instance, 0, len(self.slots), 0.0)
        if lease is None:
            if len(self.slots) >= self.max_leases:
                raise LeaseFull(f"lease table holds {self.max_leases} actors already")
            lease = Lease(request.instance, len(self.slots), 0.0)
            self.slots.append(request.instance)
            self.by_instance[request.instance] = lease
            self.granted += 1
        else:
            self.renewed += 1
        lease.expires = now + self.ttl_s
        return proto.LeaseReply(request.instance, lease.index, len(self.slots), self.ttl_s)

    def index_of(self, instance: str) -> int | None:
        lease = self.by_instance.get(instance)
        return None if lease is None else lease.index
