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
    peer: bytes = b""  # the connection that asked for it last (the lease socket's routing id)


class LeaseFull(RuntimeError):
    """The table holds its maximum number of leases."""


class PeerLeasesFull(LeaseFull):
    """One connection already holds its maximum number of leases."""


class LeaseTable:
    """Slots 0..N-1 for the N live actors.

    A new actor takes slot N. When an actor leaves (released, or its lease expired) the actor holding the last
    slot moves into the hole, so slots stay dense and only one actor's epsilon changes; it learns its new slot
    at its next renewal, which actors do every ttl/3.
    """

    def __init__(self, ttl_s: float = 10.0, max_leases: int = 10_000,
                 clock: Callable[[], float] = time.monotonic, max_per_peer: int = 0) -> None:
        self.ttl_s, self.max_leases, self.clock = ttl_s, max_leases, clock
        self.max_per_peer = max_per_peer  # leases one connection may hold (0: no bound)
        self.by_peer: dict[bytes, int] = {}
        self.by_instance: dict[str, Lease] = {}
        self.slots: list[str] = []
        self.granted = self.renewed = self.released = self.expired = 0

    def __len__(self) -> int:
        return len(self.slots)

    def _own(self, lease: Lease, peer: bytes) -> None:
        """Count ``lease`` against ``peer`` (an actor that reconnected asks from a new connection)."""
        if lease.peer == peer:
            return
        self._disown(lease)
        lease.peer = peer
        self.by_peer[peer] = self.by_peer.get(peer, 0) + 1

    def _disown(self, lease: Lease) -> None:
        left = self.by_peer.get(lease.peer, 0) - 1
        if left > 0:
            self.by_peer[lease.peer] = left
        else:
            self.by_peer.pop(lease.peer, None)

    def _remove(self, instance: str) -> None:
        lease = self.by_instance.pop(instance)
        self._disown(lease)
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

    def handle(self, request: proto.LeaseRequest, peer: bytes = b"") -> proto.LeaseReply:
        """Grant, renew or release ``request``'s lease; ``peer`` names the connection that asked (its routing id)."""
        now = self.clock()
        self.expire(now)
        lease = self.by_instance.get(request.instance)
        if request.release:
            if lease is not None:
                self._remove(request.instance)
                self.released += 1
            return proto.LeaseReply(request.instance, 0, len(self.slots), 0.0)
        if (self.max_per_peer and (lease is None or lease.peer != peer)
                and self.by_peer.get(peer, 0) >= self.max_per_peer):
            raise PeerLeasesFull(f"one connection holds {self.max_per_peer} leases already")
        if lease is None:
            if len(self.slots) >= self.max_leases:
                raise LeaseFull(f"lease table holds {self.max_leases} actors already")
            lease = Lease(request.instance, len(self.slots), 0.0)
            self.slots.append(request.instance)
            self.by_instance[request.instance] = lease
            self.granted += 1
        else:
            self.renewed += 1
        self._own(lease, peer)
        lease.expires = now + self.ttl_s
        return proto.LeaseReply(request.instance, lease.index, len(self.slots), self.ttl_s)

    def index_of(self, instance: str) -> int | None:
        lease = self.by_instance.get(instance)
        return None if lease is None else lease.index
