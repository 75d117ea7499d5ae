"""Learner-side replay client: requests in flight, zero-copy shared-memory batches on one host, TCP elsewhere.

Usage::

    client = ReplayClient("tcp://replay:5556", batch_size=512, inflight=4)
    while training:
        batch = client.poll(timeout_ms=100)        # a proto.SampleBatch, or None when nothing arrived in time
        if batch is None:
            continue
        obs = torch.from_numpy(batch.obs).to(device)   # copy out what you need first ...
        ...
        client.update_priorities(batch.index, new_priorities)   # sent at once, no reply awaited
        client.release(batch)                      # ... then hand the batch back: this sends the next request

Every batch ``poll`` returns must be passed to ``release`` once the caller has copied what it needs: on the
shared-memory path ``obs``/``next_obs`` are read-only views of a slot the replay reuses after the release, and
the release is what keeps ``inflight`` requests outstanding (requests in flight + batches held = ``inflight``).

Transport: ``"auto"`` (default) takes the replay's shared-memory offer when its segment can be opened here and
its token matches (same host, same /dev/shm), otherwise stays on TCP; ``"shm"`` insists (ReplayClientError if
the segment cannot be opened); ``"tcp"`` never asks. Several clients may sample from one replay at once; each
gets its own segment. When the replay restarts, the client notices the reconnection and re-sends its requests.
Only flywheel.proto, flywheel.transport, zmq and NumPy are used.
"""

from __future__ import annotations

import logging
import mmap
import os
import re
import time
from dataclasses import dataclass

import numpy as np
import zmq
from zmq.utils.monitor import recv_monitor_message

from flywheel import proto
from flywheel.transport import connect, make_socket

log = logging.getLogger("flywheel.replay.client")
SHM_DIR = "/dev/shm"
_SEGMENT_RE = re.compile(r"^flywheel-replay-[0-9]+-[0-9]+-[0-9a-f]{8}$")
_DTYPES = {"uint8": np.uint8, "float32": np.float32}


class ReplayClientError(RuntimeError):
    """The client cannot do what it was asked (e.g. shared memory required but not reachable)."""


@dataclass
class _Segment:
    name: str
    mm: mmap.mmap
    size: int


class ReplayClient:
    """Keeps ``inflight`` sample requests outstanding on one DEALER socket; see the module docstring."""

    def __init__(self, endpoint: str, batch_size: int, *, inflight: int = 4, beta: float = 0.4,
                 transport: str = "auto", ctx: zmq.Context | None = None, max_message_mb: int = 1024) -> None:
        if not 1 <= batch_size <= 65536 or not 1 <= inflight <= 256:
            raise ValueError("batch_size must be in 1..65536 and inflight in 1..256")
        if transport not in ("auto", "shm", "tcp"):
            raise ValueError(f"transport must be auto, shm or tcp, got {transport!r}")
        self.batch_size, self.inflight, self.transport = batch_size, inflight, transport
        self.beta = self._check_beta(beta)
        self._own_ctx = ctx is None
        self.ctx = ctx if ctx is not None else zmq.Context()
        limit = max_message_mb << 20
        self.sock = make_socket(self.ctx, zmq.DEALER, sndhwm=10_000, rcvhwm=10_000, max_msg_bytes=limit)
        self.monitor = self.sock.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        connect(self.sock, endpoint)
        self.limits = proto.Limits(max_total_bytes=limit, max_array_bytes=limit)
        self.segment: _Segment | None = None
        self.shm_refused = transport == "tcp"
        self.outstanding: set[int] = set()
        self.held: dict[int, tuple[str, int]] = {}  # request id -> (segment, slot) of batches handed out
        self._to_release: list[int] = []  # slots of replies nobody waits for any more
        self._next_id = 0
        self._disconnected = False
        self.counters = {"shm_batches": 0, "tcp_batches": 0, "bad_replies": 0, "stale_replies": 0,
                         "priority_updates": 0, "reconnects": 0}
        for _ in range(inflight):
            self._request()

    @staticmethod
    def _check_beta(beta: float) -> float:
        if not 0.0 <= beta <= 1.0:
            raise ValueError(f"beta must be in [0, 1], got {beta}")
        return float(beta)

    def set_beta(self, beta: float) -> None:
        """Importance-sampling exponent for the requests sent from now on (the learner anneals it)."""
        self.beta = self._check_beta(beta)

    def _request(self, release_slot: int = -1) -> None:
        if release_slot < 0 and self._to_release:
            release_slot = self._to_release.pop()
        request = proto.SampleRequest(
            request_id=self._next_id, batch_size=self.batch_size, beta=self.beta, shm=not self.shm_refused,
            shm_segment=self.segment.name if self.segment else "", release_slot=release_slot, slots=self.inflight)
        self._next_id += 1
        self.sock.send_multipart(proto.encode(request), copy=False)
        self.outstanding.add(request.request_id)

    def poll(self, timeout_ms: int = 0) -> proto.SampleBatch | None:
        """The next ready batch, waiting at most ``timeout_ms`` (0: don't wait); None when none came."""
        deadline = time.monotonic() + timeout_ms / 1000
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        poller.register(self.monitor, zmq.POLLIN)
        while True:
            remaining = max(0, int((deadline - time.monotonic()) * 1000))
            events = dict(poller.poll(remaining))
            if self.monitor in events:
                self._on_monitor()
            if self.sock in events:
                batch = self._receive()
                if batch is not None:
                    return batch
                continue
            if remaining == 0:
                return None

    def _on_monitor(self) -> None:
        while self.monitor.poll(0):
            event = recv_monitor_message(self.monitor)["event"]
            if event == zmq.EVENT_DISCONNECTED:
                self._disconnected = True
            elif event == zmq.EVENT_CONNECTED and self._disconnected:
                # A restarted replay knows nothing of our requests or segment: start over, keep held batches.
                self._disconnected = False
                self.counters["reconnects"] += 1
                self.outstanding.clear()
                self._to_release.clear()
                self._drop_segment()
                log.info("replay reconnected: re-sending %d sample requests", self.inflight - len(self.held))
                for _ in range(self.inflight - len(self.held)):
                    self._request()

    def _receive(self) -> proto.SampleBatch | None:
        frames = self.sock.recv_multipart(copy=False)
        try:
            batch = proto.decode(frames, expect=proto.SampleBatch, limits=self.limits)
        except proto.DecodeError as exc:
            self.counters["bad_replies"] += 1
            if self.counters["bad_replies"] == 1:
                log.warning("refused a reply from replay: %s", exc)
            return None
        shm = batch.shm
        if shm.get("segment") and not self.shm_refused and (self.segment is None or
                                                            self.segment.name != shm.get("segment")):
            self._attach(shm)
        slot = shm.get("slot", -1)
        in_segment = isinstance(slot, int) and slot >= 0
        if batch.request_id not in self.outstanding:
            self.counters["stale_replies"] += 1
            if in_segment and self.segment is not None and shm.get("segment") == self.segment.name:
                self._to_release.append(slot)
            return None
        self.outstanding.discard(batch.request_id)
        if in_segment:
            try:
                self._map_slot(batch)
            except ReplayClientError as exc:
                self.counters["bad_replies"] += 1
                log.warning("cannot read a shared-memory batch: %s; asking again", exc)
                self._request()
                return None
            self.counters["shm_batches"] += 1
            self.held[batch.request_id] = (str(shm["segment"]), slot)
        else:
            self.counters["tcp_batches"] += 1
            self.held[batch.request_id] = ("", -1)
        if batch.is_demo is None:
            batch.is_demo = np.zeros(batch.action.shape[0], np.uint8)
        return batch

    def _map_slot(self, batch: proto.SampleBatch) -> None:
        shm, segment = batch.shm, self.segment
        if segment is None or shm.get("segment") != segment.name:
            raise ReplayClientError("the reply names a segment this client has not attached")
        dtype = _DTYPES.get(str(shm.get("dtype")))
        try:
            shape = tuple(int(d) for d in str(shm.get("shape")).split(","))
            offsets = int(shm["offset"]), int(shm["next_offset"])
        except (KeyError, ValueError):
            raise ReplayClientError("malformed slot description") from None
        if dtype is None or not shape or any(d <= 0 for d in shape):
            raise ReplayClientError(f"bad slot dtype {shm.get('dtype')!r} or shape {shm.get('shape')!r}")
        full = (batch.action.shape[0], *shape)
        nbytes = int(np.prod(full)) * np.dtype(dtype).itemsize
        if any(off < 0 or off + nbytes > segment.size for off in offsets):
            raise ReplayClientError("slot lies outside the segment")
        batch.obs = np.ndarray(full, dtype, buffer=segment.mm, offset=offsets[0])
        batch.next_obs = np.ndarray(full, dtype, buffer=segment.mm, offset=offsets[1])

    def _attach(self, offer: dict) -> None:
        name, size, token = offer.get("segment"), offer.get("size"), offer.get("token")
        try:
            if not (isinstance(name, str) and _SEGMENT_RE.match(name) and isinstance(size, int) and size > 16):
                raise OSError("malformed offer")
            fd = os.open(os.path.join(SHM_DIR, name), os.O_RDONLY | os.O_NOFOLLOW)
            try:
                if os.fstat(fd).st_size != size:
                    raise OSError("segment size differs from the offer")
                mm = mmap.mmap(fd, size, prot=mmap.PROT_READ)
            finally:
                os.close(fd)
            if mm[:16].hex() != token:
                mm.close()
                raise OSError("token differs: another host's segment of the same name")
        except (OSError, ValueError, TypeError) as exc:
            if self.transport == "shm":
                raise ReplayClientError(f"cannot attach the replay's shared memory {name!r}: {exc}") from None
            log.info("replay shared memory not reachable (%s): sampling over the socket", exc)
            self.shm_refused = True
            return
        self._drop_segment()
        self.segment = _Segment(name, mm, size)
        log.info("sampling through shared memory %s (%.0f MB)", name, size / 1e6)

    def _drop_segment(self) -> None:
        if self.segment is not None:
            try:
                self.segment.mm.close()
            except BufferError:  # batches still held keep the mapping alive until they are gone
                pass
            self.segment = None

    def release(self, batch: proto.SampleBatch) -> None:
        """Hand ``batch`` back (its views become invalid) and send the request that replaces it."""
        entry = self.held.pop(batch.request_id, None)
        if entry is None:
            raise ValueError(f"batch {batch.request_id} is not held by this client (released twice?)")
        name, slot = entry
        current = self.segment is not None and name == self.segment.name
        self._request(slot if current else -1)

    def update_priorities(self, index: np.ndarray, priority: np.ndarray) -> None:
        """Send new priorities for sampled indices; no reply is awaited."""
        update = proto.PriorityUpdate(index=np.ascontiguousarray(index, np.int64),
                                      priority=np.ascontiguousarray(priority, np.float32))
        self.sock.send_multipart(proto.encode(update), copy=False)
        self.counters["priority_updates"] += 1

    def close(self) -> None:
        self.sock.disable_monitor()
        self.monitor.close(0)
        self.sock.close(0)
        self._drop_segment()
        if self._own_ctx:
            self.ctx.term()

    def __enter__(self) -> ReplayClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
