"""The replay server: its event loop and sockets; one thread, no locks (ARCHITECTURE.md: modules on ZeroMQ)."""

from __future__ import annotations

import logging
import time
from collections import deque

import psutil
import zmq

from flywheel import proto
from flywheel.metrics_spec import ReplayCounters, ReplayGauges
from flywheel.proto.messages import SampleRefused
from flywheel.settings import setting_default
from flywheel.transport import (
    ControlSubscriber,
    FaultCounter,
    MessageTooLarge,
    TelemetryReporter,
    bind,
    make_socket,
    receive,
)

from .core import InsertRejected, ReplayCore
from .refusals import Refused
from .settings import ReplaySettings
from .shm import ShmFull, ShmSlots, SlotSegment, peer_address, peer_is_local
from .snapshot import Snapshotter
from .storage import SchemaMismatch

log = logging.getLogger("flywheel.replay")
INSERT_BURST = 32  # transition batches taken per loop turn before sample requests get a look ...
INSERT_BURST_S = 0.02  # ... or fewer, once this long was spent on them


class ReplayServer:
    """PULL transitions, ROUTER sample requests and priority updates, SUB control, PUSH telemetry.

    Endpoints may be comma-separated lists (e.g. ``ipc:///tmp/replay.ipc,tcp://*:5555``): same-host actors
    then use the Unix socket while remote ones use TCP.
    """

    def __init__(
        self, core: ReplayCore, ctx: zmq.Context, *, transitions_bind: str, sample_bind: str,
        telemetry: TelemetryReporter, control: ControlSubscriber, faults: FaultCounter,
        transitions_hwm: int = setting_default(ReplaySettings, "transitions_hwm"), max_pending: int = 256,
        max_message_bytes: int = 256 << 20,
        transitions_rcvbuf: int = 0, max_batch_size: int = 8192,
        snapshotter: Snapshotter | None = None, checkpoint_interval_s: float = 0.0, shm: ShmSlots | None = None,
    ) -> None:
        self.core, self.telemetry, self.control, self.faults = core, telemetry, control, faults
        self.limits = proto.Limits(max_total_bytes=max_message_bytes, max_array_bytes=max_message_bytes)
        self.pull = make_socket(ctx, zmq.PULL, rcvhwm=transitions_hwm, max_msg_bytes=max_message_bytes,
                                rcvbuf=transitions_rcvbuf)
        self.router = make_socket(ctx, zmq.ROUTER, sndhwm=1000, rcvhwm=1000, max_msg_bytes=64 << 20)
        self.router.setsockopt(zmq.ROUTER_MANDATORY, 0)
        self.shm, self.max_batch_size = shm, max_batch_size
        self.endpoints: dict[str, list[str]] = {"transitions": [], "sample": []}  # as bound (port 0 resolved)
        try:
            for endpoint in _split(transitions_bind):
                self.endpoints["transitions"].append(
                    bind(self.pull, endpoint, "replay transitions", "FLYWHEEL_REPLAY_TRANSITIONS_BIND"))
            for endpoint in _split(sample_bind):
                self.endpoints["sample"].append(
                    bind(self.router, endpoint, "replay sampling", "FLYWHEEL_REPLAY_SAMPLE_BIND"))
        except Exception:
            self.close()
            raise
        self.pending: deque[tuple[bytes, proto.SampleRequest, float, bool]] = deque()  # (..., shm refused)
        self.max_pending = max_pending
        self.snapshotter, self.checkpoint_interval_s = snapshotter, checkpoint_interval_s
        self._next_checkpoint = time.monotonic() + checkpoint_interval_s if checkpoint_interval_s else float("inf")
        self.running = True
        self.paused = False
        K = proto.CommandKind
        self.handlers: proto.CommandHandlers = {K.CHECKPOINT: self._on_checkpoint, K.PAUSE: self._on_pause,
                                                K.RESUME: self._on_resume, K.SET_REPLAY_RATIO: self._on_ratio}
        self.counters = ReplayCounters()
        self.max_turn_during_checkpoint_s = 0.0
        self._process = psutil.Process()
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
            turn_start = time.monotonic()
            accept_inserts = not self.paused and self.core.can_insert(1)
            if accept_inserts != pull_registered:
                if accept_inserts:
                    poller.register(self.pull, zmq.POLLIN)
                else:
                    poller.unregister(self.pull)
                pull_registered = accept_inserts
            if not accept_inserts and insert_wait_since is None:
                insert_wait_since = turn_start
            elif accept_inserts and insert_wait_since is not None:
                self.counters.rate_limiter_insert_wait_seconds_total += turn_start - insert_wait_since
                insert_wait_since = None
            timeout = 50 if self.snapshotter is not None and self.snapshotter.in_progress else 100
            events = dict(poller.poll(timeout=timeout))
            busy_start = time.monotonic()
            if self.pull in events:
                self._take_transitions()
            if self.router in events:
                self._take_requests()
            if self.control.sock in events:
                self._take_control()
            self._serve_pending()
            now = time.monotonic()
            self._tick_checkpoints(now, now - busy_start)
            if self.telemetry.due(now):
                self._report(now)

    def _tick_checkpoints(self, now: float, turn_s: float) -> None:
        snap = self.snapshotter
        if snap is None:
            return
        if snap.in_progress:
            self.max_turn_during_checkpoint_s = max(self.max_turn_during_checkpoint_s, turn_s)
            finished = snap.poll()
            if finished is not None:
                if finished:
                    self.counters.checkpoints_total += 1
                else:
                    self.counters.checkpoint_failures_total += 1
        if now >= self._next_checkpoint:
            self.checkpoint_now("periodic")
            self._next_checkpoint = now + self.checkpoint_interval_s

    def _take_transitions(self) -> None:
        deadline = time.monotonic() + INSERT_BURST_S
        for _ in range(INSERT_BURST):
            if time.monotonic() > deadline:
                return
            try:
                frames = receive(self.pull)
            except zmq.Again:
                return
            except MessageTooLarge as exc:
                self.faults.record("transitions", exc)
                self.counters.transitions_rejected_total += 1
                continue
            try:
                batch = proto.decode(frames, proto.TransitionBatch, limits=self.limits)
                inserted = self.core.insert(batch)
            except (proto.DecodeError, SchemaMismatch, InsertRejected) as exc:
                self.faults.record("transitions", exc)
                self.counters.transitions_rejected_total += 1
                continue
            self.counters.transitions_received_total += inserted
            self.counters.batches_received_total += 1
            if not self.core.can_insert(1):
                return

    def _take_requests(self) -> None:
        while True:
            try:
                frames = receive(self.router)
            except zmq.Again:
                return
            except MessageTooLarge as exc:  # unanswered: the client re-sends a request that times out
                self.faults.record("sample", exc)
                continue
            identity, body = frames[0].bytes, frames[1:]
            try:
                msg = proto.decode(body, expect=(proto.SampleRequest, proto.PriorityUpdate))
            except proto.DecodeError as exc:
                self.faults.record("sample", exc)
                continue
            if isinstance(msg, proto.PriorityUpdate):
                self.counters.priority_updates_total += self.core.update_priorities(msg.index, msg.priority)
                continue
            assert isinstance(msg, proto.SampleRequest)
            shm_refused = self.shm is not None and msg.shm and not peer_is_local(frames[0])
            if shm_refused:  # /dev/shm files only for this host's peers: others get socket replies that say so
                self.faults.record("sample", Refused("shm_peer", (
                    f"shared memory asked for by peer {peer_address(frames[0]) or '(no address)'}: only ipc and "
                    "loopback peers get it; answered over the socket")))
                msg.shm, msg.shm_segment, msg.release_slot = False, "", -1
            if self.shm is not None:
                if not msg.shm:
                    self.shm.drop(identity)  # the client reads from the socket (again): free its segment
                elif msg.release_slot >= 0:
                    segment = self.shm.current(identity)
                    if segment is not None and segment.name == msg.shm_segment:
                        segment.release(msg.release_slot)
            if msg.batch_size > self.max_batch_size:
                self._refuse(identity, msg, Refused("batch_size", (
                    f"sample request for {msg.batch_size} rows, above max_batch_size {self.max_batch_size} "
                    "(FLYWHEEL_REPLAY_MAX_BATCH_SIZE)")))
                continue
            if len(self.pending) >= self.max_pending:
                self.counters.sample_requests_dropped_total += 1
                continue
            self.pending.append((identity, msg, time.monotonic(), shm_refused))

    def _refuse(self, identity: bytes, request: proto.SampleRequest, why: Refused) -> None:
        """Count a request that will not be served and tell its client (a sample_refused reply), which stops waiting."""
        self.faults.record("sample", why)
        reply = SampleRefused(request.request_id, why.fault, str(why)[:200], self.max_batch_size)
        try:
            self.router.send_multipart([identity, *proto.encode(reply)], flags=zmq.NOBLOCK)
        except zmq.Again:
            self.counters.sample_requests_dropped_total += 1

    def _serve_pending(self) -> None:
        while self.pending and not self.paused:
            identity, request, since, shm_refused = self.pending[0]
            if not self.core.can_sample(request.batch_size):
                return
            self.pending.popleft()
            self.counters.rate_limiter_sample_wait_seconds_total += time.monotonic() - since
            reply, held = self._sample(identity, request)
            if shm_refused:
                reply.shm = {"refused": "peer"}  # the client stops asking (ReplayClient) or stops with a clear error
            try:
                self.router.send_multipart([identity, *proto.encode(reply)], flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                self.counters.sample_requests_dropped_total += 1
                if held is not None:
                    held[0].release(held[1])
                continue
            rows = request.batch_size
            self.counters.samples_total += rows
            self.counters.sample_batches_total += 1
            if reply.is_demo is not None:
                self.counters.demo_samples_total += int(reply.is_demo.sum())

    def _sample(self, identity: bytes, request: proto.SampleRequest,
                ) -> tuple[proto.SampleBatch, tuple[SlotSegment, int] | None]:
        """One reply: into the client's shared-memory slot when it has attached its segment, else inline."""
        core, rows = self.core, request.batch_size
        segment = None
        if self.shm is not None and request.shm and core.obs_schema is not None:
            shape, dtype = core.obs_schema
            try:
                segment = self.shm.segment_for(identity, rows, shape, dtype, request.slots)
            except ShmFull as exc:  # other clients hold the segments allowed: this one is answered over the socket
                self.faults.record("sample", exc)
            if segment is not None and segment.name == request.shm_segment:
                slot = segment.acquire()
                if slot is not None:
                    obs, next_obs, where = segment.views(slot, rows, shape, dtype)
                    reply = core.sample_into(rows, request.beta, obs, next_obs, request.request_id)
                    del obs, next_obs
                    self.counters.shm_batches_total += 1
                    reply.shm = {**segment.offer(), **where}  # observations travel in the slot: placeholders here
                    return reply, (segment, slot)
                self.counters.shm_slots_exhausted_total += 1
        if request.compact and core.compact_ready:  # each distinct frame once; the client rebuilds the stacks
            packed = request.packed and core.packed_ready  # and LZ4-packed, when kept so and the client unpacks
            batch = core.sample_compact(rows, request.beta, request.request_id, packed)
            self.counters.compact_batches_total += 1
            self.counters.packed_batches_total += int(packed)
        else:
            batch = core.sample(rows, request.beta, request.request_id)
        if segment is not None:
            batch.shm = segment.offer()
        self.counters.socket_batches_total += 1
        return batch, None

    def _take_control(self) -> None:
        """Commands arrive checked (bad ones were counted by the subscriber); run the ones the replay obeys."""
        for command in self.control.drain():
            self.counters.control_commands_total += 1
            proto.dispatch(command, self.handlers)

    def _on_checkpoint(self, command: proto.Command[proto.CheckpointArgs]) -> None:
        tag = command.args.tag
        self.checkpoint_now(f"requested{' ' + tag if tag else ''}")

    def _on_pause(self, _command: proto.Command[proto.PauseArgs]) -> None:
        self.paused = True
        log.info("control: paused (no inserts, no samples)")

    def _on_resume(self, _command: proto.Command[proto.ResumeArgs]) -> None:
        self.paused = False
        log.info("control: resumed")

    def _on_ratio(self, command: proto.Command[proto.ReplayRatioArgs]) -> None:
        self.core.set_ratio(command.args)
        limiter = self.core.limiter
        log.info("control: samples per insert %g, error buffer %g", limiter.samples_per_insert, limiter.error_buffer)

    def checkpoint_now(self, why: str) -> None:
        """Start a background checkpoint (the loop keeps running while a forked child writes it)."""
        if self.snapshotter is not None:
            self.snapshotter.start(why)

    def finish_checkpoints(self, why: str = "exit") -> None:
        """Wait for a running checkpoint, then write a final one in this process (shutdown)."""
        if self.snapshotter is not None:
            self.snapshotter.write_now(why)
            self.counters.checkpoints_total += 1

    def _report(self, now: float) -> None:
        since, inserted, sampled = self._rate_window
        span = now - since
        if span >= 1.0:
            self._rates = (
                (self.counters.transitions_received_total - inserted) / span,
                (self.counters.samples_total - sampled) / span,
            )
            self._rate_window = (now, self.counters.transitions_received_total, self.counters.samples_total)
        if self.shm is not None:
            self.shm.expire(now)
        counters = self.counters  # what is only read here is brought up to date here
        counters.messages_rejected_total = self.faults.total
        counters.telemetry_dropped_total = self.telemetry.dropped
        counters.stale_priority_updates_total = self.core.stale_priority_updates
        counters.priorities_clamped_total = self.core.priorities_clamped
        storage, snap = self.core.storage, self.snapshotter
        gauges = ReplayGauges(
            size_transitions=self.core.size,
            capacity_transitions=self.core.config.capacity,
            demo_size_transitions=self.core.demos.size if self.core.demos is not None else 0,
            memory_bytes=storage.nbytes,
            resident_bytes=self._process.memory_info().rss,
            shm_bytes=self.shm.nbytes if self.shm is not None else 0,
            frames_per_transition=storage.frames_stored / storage.size if storage.size else 0.0,
            evicted_for_frames_transitions=storage.frames_evicted,
            unpackable_frames=storage.frames.frames_unpackable if storage.frames is not None else 0,
            insert_rate_per_second=self._rates[0],
            sample_rate_per_second=self._rates[1],
            pending_sample_requests=len(self.pending),
            samples_per_insert=self.core.limiter.samples_per_insert,
            error_buffer=self.core.limiter.error_buffer,
            checkpoint_in_progress=float(snap is not None and snap.in_progress),
            checkpoint_duration_seconds=snap.last_duration_s if snap else 0.0,
            checkpoint_max_pause_seconds=snap.max_pause_s if snap else 0.0,
            checkpoint_max_loop_turn_seconds=self.max_turn_during_checkpoint_s,
            paused=float(self.paused),
        )
        info = {"prioritized": str(self.core.tree is not None).lower(),
                "frame_dedup": str(storage.frames is not None).lower()}
        self.telemetry.send({**counters.as_dict(), **self.faults.as_counters()}, gauges.as_dict(), info)

    def close(self) -> None:
        for sock in (self.pull, self.router):
            sock.close(0)
        if self.shm is not None:
            self.shm.close()


def _split(endpoints: str) -> list[str]:
    parts = [e.strip() for e in endpoints.split(",") if e.strip()]
    if not parts:
        raise ValueError("no endpoint given")
    return parts
