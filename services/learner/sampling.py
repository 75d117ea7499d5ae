"""The learner's side of sampling: requests kept in flight on one DEALER, batches decoded, priorities sent back.

This class is the one boundary between the learner and the replay's sampling protocol, so a different client
(e.g. one with a same-host shared-memory fast path) can replace it without touching the update loop.
"""

from __future__ import annotations

import logging
import math
import time

import numpy as np
import zmq
from zmq.utils.monitor import recv_monitor_message

from flywheel import proto
from flywheel.transport import FaultCounter, connect, make_socket

log = logging.getLogger("flywheel.learner")


def batch_limits(batch_size: int, obs_shape: tuple[int, ...]) -> proto.Limits:
    """Decoder limits that fit one batch of this shape (float32 observations, the worst case) and no more."""
    obs_bytes = math.prod(obs_shape) * 4
    max_batch = 2 * batch_size * (obs_bytes + 64) + (1 << 20)
    return proto.Limits(max_total_bytes=max_batch, max_array_bytes=max_batch)


TARGET_REQUEST_TRANSITIONS = 4096  # auto grouping: small batches are fetched this many transitions at a time
MAX_AUTO_GROUP = 32


def batches_per_request(choice: int, batch_size: int, obs_shape: tuple[int, ...]) -> int:
    """Training batches per sample request: ``choice``, or for 0 (auto) 1 with pixels, else ~4096 transitions.

    Every request, reply and priority message costs tens of microseconds on each side; for small vector
    batches that is a noticeable share of an update, so several are fetched at once.
    """
    if choice > 0:
        group = choice
    elif len(obs_shape) == 3:
        group = 1
    else:
        group = max(1, min(MAX_AUTO_GROUP, TARGET_REQUEST_TRANSITIONS // batch_size))
    return max(1, min(group, 65536 // batch_size))


class SampleClient:
    """Keeps ``in_flight`` SampleRequests (of ``batch_size`` transitions) outstanding at the replay and hands
    back decoded SampleBatches.

    ``sock`` is what the caller polls; ``receive`` never blocks. Replies that do not decode are counted in
    ``faults`` (and free their request slot); requests unanswered for ``request_timeout_s`` are re-sent.
    """

    def __init__(self, ctx: zmq.Context, endpoint: str, *, batch_size: int, obs_shape: tuple[int, ...],
                 in_flight: int, request_timeout_s: float, faults: FaultCounter) -> None:
        self.endpoint, self.batch_size, self.in_flight = endpoint, batch_size, in_flight
        self.request_timeout_s, self.faults = request_timeout_s, faults
        self.limits = batch_limits(batch_size, obs_shape)
        self.sock = make_socket(ctx, zmq.DEALER, sndhwm=10_000, rcvhwm=2 * in_flight + 4,
                                max_msg_bytes=self.limits.max_total_bytes + (1 << 16))
        self.monitor = self.sock.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        self._disconnected = False
        connect(self.sock, endpoint)
        self._next_id = 1
        self._outstanding: dict[int, float] = {}
        self._last_progress = time.monotonic()
        self.counters = {"priority_updates_dropped_total": 0.0, "requests_resent_total": 0.0,
                         "sample_batches_total": 0.0, "replay_reconnects_total": 0.0,
                         "replies_unrequested_total": 0.0}

    @property
    def outstanding(self) -> int:
        return len(self._outstanding)

    def top_up(self, beta: float, limit: int | None = None) -> None:
        """Send requests until ``in_flight`` (or the smaller ``limit``) are outstanding; stops if the queue is full."""
        target = self.in_flight if limit is None else min(limit, self.in_flight)
        while len(self._outstanding) < target:
            rid = self._next_id
            self._next_id += 1
            msg = proto.SampleRequest(request_id=rid, batch_size=self.batch_size, beta=beta)
            try:
                self.sock.send_multipart(proto.encode(msg), flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self._outstanding[rid] = time.monotonic()

    def receive(self) -> proto.SampleBatch | None:
        """The next batch if one has arrived; None when none has or the reply was refused (counted)."""
        try:
            frames = self.sock.recv_multipart(flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return None
        self._last_progress = time.monotonic()
        try:
            batch = proto.decode(frames, expect=proto.SampleBatch, limits=self.limits)
        except proto.DecodeError as exc:
            self.faults.record("sample", exc)
            if self._outstanding:  # it answered one of ours: free the oldest slot to keep the pipeline full
                self._outstanding.pop(min(self._outstanding, key=self._outstanding.__getitem__))
            return None
        if self._outstanding.pop(batch.request_id, None) is None:
            # An answer to a request re-sent after request_timeout_s (the replay had held it back, not lost it):
            # it stands in for the oldest one still outstanding; with none left it is one more than was asked
            # for and is dropped, so received-but-untrained batches stay within 2 x requests_in_flight.
            if not self._outstanding:
                self.counters["replies_unrequested_total"] += 1
                return None
            self._outstanding.pop(min(self._outstanding, key=self._outstanding.__getitem__))
        self.counters["sample_batches_total"] += 1
        return batch

    def send_priorities(self, index: np.ndarray, priority: np.ndarray) -> bool:
        """Send one PriorityUpdate without waiting; a full queue drops it (counted)."""
        update = proto.PriorityUpdate(index=index, priority=priority)
        try:
            self.sock.send_multipart(proto.encode(update), flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            self.counters["priority_updates_dropped_total"] += 1
            return False
        return True

    def _reconnected(self) -> bool:
        """Whether the replay came back since the last look: a restarted replay knows none of our requests."""
        back = False
        while self.monitor.poll(0):
            event = recv_monitor_message(self.monitor)["event"]
            if event == zmq.EVENT_DISCONNECTED:
                self._disconnected = True
            elif event == zmq.EVENT_CONNECTED and self._disconnected:
                self._disconnected, back = False, True
        return back

    def resend_stale(self, now: float, beta: float, limit: int | None = None) -> int:
        """Forget and re-send outstanding requests when the replay reconnected or no batch came for
        ``request_timeout_s``."""
        if self._reconnected():
            self.counters["replay_reconnects_total"] += 1
            log.info("learner: replay %s is back; re-sending %d sample requests", self.endpoint,
                     len(self._outstanding))
        elif not self._outstanding:
            return 0
        elif now - max(self._last_progress, max(self._outstanding.values())) < self.request_timeout_s:
            return 0
        else:
            log.warning("learner: no batch from %s for %.0f s; re-sending %d sample requests",
                        self.endpoint, self.request_timeout_s, len(self._outstanding))
        count = len(self._outstanding)
        self.counters["requests_resent_total"] += count
        self._outstanding.clear()
        self._last_progress = now
        self.top_up(beta, limit)
        return count

    def idle_since_now(self) -> None:
        """Restart the stale-request clock (after a pause, when silence was expected)."""
        self._last_progress = time.monotonic()

    def close(self) -> None:
        self.sock.disable_monitor()
        self.monitor.close(0)
        self.sock.close(0)
