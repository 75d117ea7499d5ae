"""The replay event loop: the only part that touches ZeroMQ; one thread, no locks."""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable

import zmq

from flywheel import proto
from flywheel.transport import ControlSubscriber, FaultCounter, TelemetryReporter, bind, make_socket

from .core import ReplayCore
from .storage import SchemaMismatch

log = logging.getLogger("flywheel.replay")
INSERT_BURST = 32  # transition batches taken per loop turn before sample requests get a look


class ReplayServer:
    """PULL transitions, ROUTER sample requests and priority updates, SUB control, PUSH telemetry."""

    def __init__(
        self, core: ReplayCore, ctx: zmq.Context, *, transitions_bind: str, sample_bind: str,
        telemetry: TelemetryReporter, control: ControlSubscriber, faults: FaultCounter,
        transitions_hwm: int = 64, max_pending: int = 256, max_message_bytes: int = 256 << 20,
        checkpoint: Callable[[], None] | None = None, checkpoint_interval_s: float = 0.0,
    ) -> None:
        self.core, self.telemetry, self.control, self.faults = core, telemetry, control, faults
        limits = proto.Limits(max_total_bytes=max_message_bytes, max_array_bytes=max_message_bytes)
        self.limits = limits
        self.pull = make_socket(ctx, zmq.PULL, rcvhwm=transitions_hwm, max_msg_bytes=max_message_bytes)
        bind(self.pull, transitions_bind, "replay transitions", "FLYWHEEL_REPLAY_TRANSITIONS_BIND")
        self.router = make_socket(ctx, zmq.ROUTER, sndhwm=1000, rcvhwm=1000, max_msg_bytes=64 << 20)
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 0)
        bind(self.router, sample_bind, "replay sampling", "FLYWHEEL_REPLAY_SAMPLE_BIND")
        self.pending: deque[tuple[bytes, proto.SampleRequest, float]] = deque()
        self.max_pending = max_pending
        self.checkpoint, self.checkpoint_interval_s = checkpoint, checkpoint_interval_s
        self._next_checkpoint = time.monotonic() + checkpoint_interval_s if checkpoint_interval_s else float("inf")
        self.running = True
        self.counters: dict[str, float] = {
            "transitions_received_total": 0, "batches_received_total": 0, "transitions_rejected_total": 0,
            "samples_total": 0, "sample_batches_total": 0, "priority_updates_total": 0,
            "sample_requests_dropped_total": 0, "rate_limiter_sample_wait_seconds_total": 0.0,
            "rate_limiter_insert_wait_seconds_total": 0.0, "checkpoints_total": 0,
        }
        self.max_checkpoint_pause_s = 0.0
        self.paused = False
        self._rate_window = (time.monotonic(), 0.0, 0.0)
        self._rates = (0.0, 0.0)

    def stop(self) -> None:
        self.running = False

    def run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        poller.register(self.control.sock, zmq.POLLIN)
        pull_registered = False
        insert_wait_since: float | None = None
        while self.running:
            accept_inserts = not self.paused and self.core.can_insert(1)
            if accept_inserts != pull_registered:
                if accept_inserts:
                    poller.register(self.pull, zmq.POLLIN)
                else:
                    poller.unregister(self.pull)
                pull_registered = accept_inserts
            now = time.monotonic()
            if not accept_inserts and insert_wait_since is None:
                insert_wait_since = now
            elif accept_inserts and insert_wait_since is not None:
                self.counters["rate_limiter_insert_wait_seconds_total"] += now - insert_wait_since
                insert_wait_since = None
            events = dict(poller.poll(timeout=100))
            if self.pull in events:
                self._take_transitions()
            if self.router in events:
                self._take_requests()
            if self.control.sock in events:
                self._take_control()
            self._serve_pending()
            now = time.monotonic()
            if now >= self._next_checkpoint:
                self.checkpoint_now("periodic")
                self._next_checkpoint = now + self.checkpoint_interval_s
            if self.telemetry.due(now):
                self._report(now)

    def _take_transitions(self) -> None:
        for _ in range(INSERT_BURST):
            try:
                frames = self.pull.recv_multipart(flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            try:
                batch = proto.decode(frames, expect=proto.TransitionBatch, limits=self.limits)
                assert isinstance(batch, proto.TransitionBatch)
                inserted = self.core.insert(batch)
            except (proto.DecodeError, SchemaMismatch) as exc:
                self.faults.record("transitions", exc)
                self.counters["transitions_rejected_total"] += 1
                continue
            self.counters["transitions_received_total"] += inserted
            self.counters["batches_received_total"] += 1
            if not self.core.can_insert(1):
                return

    def _take_requests(self) -> None:
        while True:
            try:
                frames = self.router.recv_multipart(flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            identity, body = frames[0].bytes, frames[1:]
            try:
                msg = proto.decode(body, expect=(proto.SampleRequest, proto.PriorityUpdate))
            except proto.DecodeError as exc:
                self.faults.record("sample", exc)
                continue
            if isinstance(msg, proto.PriorityUpdate):
                self.counters["priority_updates_total"] += self.core.update_priorities(msg.index, msg.priority)
                continue
            assert isinstance(msg, proto.SampleRequest)
            if len(self.pending) >= self.max_pending:
                self.counters["sample_requests_dropped_total"] += 1
                continue
            self.pending.append((identity, msg, time.monotonic()))

    def _serve_pending(self) -> None:
        while self.pending and not self.paused:
            identity, request, since = self.pending[0]
            if not self.core.can_sample(request.batch_size):
                return
            self.pending.popleft()
            waited = time.monotonic() - since
            self.counters["rate_limiter_sample_wait_seconds_total"] += waited
            batch = self.core.sample(request.batch_size, request.beta, request.request_id)
            try:
                self.router.send_multipart([identity, *proto.encode(batch)], flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                self.counters["sample_requests_dropped_total"] += 1
                continue
            self.counters["samples_total"] += request.batch_size
            self.counters["sample_batches_total"] += 1

    def _take_control(self) -> None:
        for command in self.control.drain():
            log.info("control: %s %s", command.command, command.args)
            if command.command == "checkpoint":
                self.checkpoint_now("requested")
            elif command.command == "pause":
                self.paused = True
            elif command.command == "resume":
                self.paused = False

    def checkpoint_now(self, why: str) -> None:
        if self.checkpoint is None:
            return
        start = time.monotonic()
        self.checkpoint()
        pause = time.monotonic() - start
        self.max_checkpoint_pause_s = max(self.max_checkpoint_pause_s, pause)
        self.counters["checkpoints_total"] += 1
        log.info("checkpoint (%s) of %d transitions written in %.2f s", why, self.core.size, pause)

    def _report(self, now: float) -> None:
        since, inserted, sampled = self._rate_window
        span = now - since
        if span >= 1.0:
            self._rates = (
                (self.counters["transitions_received_total"] - inserted) / span,
                (self.counters["samples_total"] - sampled) / span,
            )
            self._rate_window = (now, self.counters["transitions_received_total"], self.counters["samples_total"])
        counters = dict(self.counters)
        counters["messages_rejected_total"] = self.faults.total
        counters["telemetry_dropped_total"] = self.telemetry.dropped
        gauges = {
            "size_transitions": self.core.size,
            "capacity_transitions": self.core.config.capacity,
            "memory_bytes": self.core.storage.nbytes,
            "insert_rate_per_second": self._rates[0],
            "sample_rate_per_second": self._rates[1],
            "pending_sample_requests": len(self.pending),
            "checkpoint_max_pause_seconds": self.max_checkpoint_pause_s,
            "paused": float(self.paused),
        }
        self.telemetry.send(counters, gauges, {"prioritized": str(self.core.tree is not None).lower()})

    def close(self) -> None:
        for sock in (self.pull, self.router):
            sock.close(0)
