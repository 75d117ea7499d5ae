"""Shared-memory reply slots for same-host clients: one /dev/shm file per client, written only by the replay."""

from __future__ import annotations

import logging
import math
import mmap
import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import zmq

from flywheel.checkpoints import process_running
from flywheel.security import is_loopback

from .refusals import Refused

log = logging.getLogger("flywheel.replay")
SHM_DIR = Path("/dev/shm")
HEADER_BYTES = 4096  # the segment starts with a random token the client checks before trusting the file
ALIGN = 4096


def _round_up(value: int, to: int = ALIGN) -> int:
    return (value + to - 1) // to * to


class SlotSegment:
    """``slots`` equal slots of ``slot_bytes`` each in a fully allocated /dev/shm file."""

    def __init__(self, name: str, slots: int, slot_bytes: int, directory: Path = SHM_DIR) -> None:
        self.name, self.slots, self.slot_bytes = name, slots, slot_bytes
        self.size = HEADER_BYTES + slots * slot_bytes
        self.path = directory / name
        fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            # Reserve every page now: a full /dev/shm fails here with ENOSPC instead of SIGBUS on a later write.
            os.posix_fallocate(fd, 0, self.size)
            self.mm = mmap.mmap(fd, self.size)
        except BaseException:
            os.close(fd)
            self.path.unlink(missing_ok=True)
            raise
        os.close(fd)
        self.token = secrets.token_bytes(16)
        self.mm[:16] = self.token
        self.free = list(range(slots))
        self.busy: set[int] = set()

    def acquire(self) -> int | None:
        if not self.free:
            return None
        slot = self.free.pop()
        self.busy.add(slot)
        return slot

    def release(self, slot: int) -> bool:
        if slot not in self.busy:
            return False
        self.busy.discard(slot)
        self.free.append(slot)
        return True

    def views(self, slot: int, batch_size: int, obs_shape: tuple[int, ...], dtype: np.dtype,
              ) -> tuple[np.ndarray, np.ndarray, dict[str, int | str]]:
        """Writable obs and next_obs arrays inside ``slot``, and the reply fields that locate them."""
        obs_bytes = batch_size * math.prod(obs_shape) * dtype.itemsize
        offset = HEADER_BYTES + slot * self.slot_bytes
        next_offset = offset + _round_up(obs_bytes, 64)
        if next_offset + obs_bytes > offset + self.slot_bytes:
            raise ValueError("batch does not fit the slot")
        shape = (batch_size, *obs_shape)
        obs = np.ndarray(shape, dtype, buffer=self.mm, offset=offset)
        next_obs = np.ndarray(shape, dtype, buffer=self.mm, offset=next_offset)
        where: dict[str, int | str] = {
            "slot": slot, "offset": offset, "next_offset": next_offset, "dtype": dtype.name,
            "shape": ",".join(str(d) for d in obs_shape),
        }
        return obs, next_obs, where

    def offer(self) -> dict[str, int | str]:
        return {"segment": self.name, "size": self.size, "token": self.token.hex()}

    def close(self) -> None:
        self.path.unlink(missing_ok=True)
        try:
            self.mm.close()
        except BufferError:  # a view is still alive somewhere: the mapping goes with it
            pass


def peer_address(frame: object) -> str:
    """The ``Peer-Address`` of a received zmq.Frame: an IP for TCP, ``localhost:uid:gid:pid`` for ipc (Linux); ""
    when it has none (inproc, or bytes without metadata)."""
    get = getattr(frame, "get", None)
    try:
        address = get("Peer-Address") if get is not None else ""
    except zmq.ZMQError:
        return ""
    return address.decode(errors="replace") if isinstance(address, bytes) else str(address or "")


def peer_is_local(frame: object) -> bool:
    """Whether the peer that sent ``frame`` may be offered shared memory: an ipc peer, or TCP from a loopback address
    (127.0.0.0/8, ::1, ::ffff:127.x). Any other address, or none at all, is not (fail closed)."""
    address = peer_address(frame)
    if address.startswith("localhost:"):  # AF_UNIX: libzmq names no IP but localhost:uid:gid:pid
        return True
    return bool(address) and is_loopback(address)


def slot_bytes_for(batch_size: int, obs_shape: tuple[int, ...], dtype: np.dtype) -> int:
    obs_bytes = batch_size * math.prod(obs_shape) * dtype.itemsize
    return _round_up(_round_up(obs_bytes, 64) + obs_bytes)


@dataclass
class ShmClient:
    segment: SlotSegment
    last_seen: float = field(default_factory=time.monotonic)


def sweep_stale(directory: Path = SHM_DIR) -> list[str]:
    """Remove the segments of replays that are gone (killed with SIGKILL, they cannot unlink theirs): a name
    carries its replay's pid. Returns the names removed."""
    removed = []
    for path in directory.glob("flywheel-replay-*-*-*"):
        pid = path.name.split("-")[2]
        if not pid.isdigit() or int(pid) == os.getpid() or process_running(int(pid)):
            continue
        try:
            path.unlink()
        except OSError:
            continue  # another replay swept it first, or it is not ours to remove
        removed.append(path.name)
    if removed:
        log.info("removed %d shared-memory segment(s) left in %s by replays that are gone: %s", len(removed),
                 directory, ", ".join(sorted(removed)[:4]) + (" ..." if len(removed) > 4 else ""))
    return removed


class ShmFull(Refused):
    """No segment for this client: ``max_clients`` others hold one, or it would take the total past ``max_bytes``."""

    def __init__(self, message: str) -> None:
        super().__init__("shm_full", message)


class ShmSlots:
    """Per-client segments, created on a client's first shared-memory request and dropped when it leaves.

    At most ``max_clients`` segments of ``max_bytes`` in all exist at once (they are RAM, kept ``idle_s`` after a
    client's last request): one more is refused with ShmFull and that client is answered over the socket.
    """

    def __init__(self, default_slots: int = 4, max_slots: int = 16, idle_s: float = 300.0,
                 directory: Path = SHM_DIR, *, max_clients: int = 4, max_bytes: int = 4096 << 20) -> None:
        self.default_slots, self.max_slots, self.idle_s, self.directory = default_slots, max_slots, idle_s, directory
        self.max_clients, self.max_bytes = max_clients, max_bytes
        self.clients: dict[bytes, ShmClient] = {}
        self.available = directory.is_dir() and os.access(directory, os.W_OK)
        self.swept = sweep_stale(directory) if self.available else []
        self._seq = 0
        self.failures = 0

    def segment_for(self, identity: bytes, batch_size: int, obs_shape: tuple[int, ...], dtype: np.dtype,
                    slots: int) -> SlotSegment | None:
        """The client's segment, (re)created when missing or too small; None when shared memory fails; ShmFull
        (nothing made) when a new one would pass ``max_clients`` or ``max_bytes``."""
        if not self.available:
            return None
        need = slot_bytes_for(batch_size, obs_shape, dtype)
        client = self.clients.get(identity)
        if client is not None:
            client.last_seen = time.monotonic()
            if client.segment.slot_bytes >= need:
                return client.segment
            self.drop(identity)
        count = min(max(slots or self.default_slots, 1), self.max_slots)
        size = HEADER_BYTES + count * need
        if len(self.clients) >= self.max_clients:
            raise ShmFull(f"{len(self.clients)} sampling clients hold shared-memory segments, the most allowed "
                          "(FLYWHEEL_REPLAY_SHM_MAX_CLIENTS): this one is answered over the socket")
        if self.nbytes + size > self.max_bytes:
            raise ShmFull(f"a {size >> 20} MiB shared-memory segment would take the replay's segments past "
                          f"{self.max_bytes >> 20} MiB (FLYWHEEL_REPLAY_SHM_MAX_MB): answered over the socket")
        self._seq += 1
        name = f"flywheel-replay-{os.getpid()}-{self._seq}-{secrets.token_hex(4)}"
        try:
            segment = SlotSegment(name, count, need, self.directory)
        except OSError as exc:
            self.failures += 1
            if self.failures == 1:
                log.warning("cannot create a %d MB shared-memory segment in %s (%s): replying over the socket; "
                            "give the container more /dev/shm (compose shm_size) to use the fast path",
                            (count * need) >> 20, self.directory, exc)
            return None
        self.clients[identity] = ShmClient(segment)
        log.info("shared-memory segment %s: %d slots of %.1f MB for a sampling client", name, count, need / 1e6)
        return segment

    def current(self, identity: bytes) -> SlotSegment | None:
        client = self.clients.get(identity)
        if client is None:
            return None
        client.last_seen = time.monotonic()
        return client.segment

    def drop(self, identity: bytes) -> None:
        client = self.clients.pop(identity, None)
        if client is not None:
            client.segment.close()

    def expire(self, now: float) -> int:
        """Drop the segments of clients silent for ``idle_s``; returns how many."""
        gone = [i for i, c in self.clients.items() if now - c.last_seen > self.idle_s]
        for identity in gone:
            self.drop(identity)
        return len(gone)

    @property
    def nbytes(self) -> int:
        return sum(c.segment.size for c in self.clients.values())

    def close(self) -> None:
        for identity in list(self.clients):
            self.drop(identity)
