"""Actor sockets: transitions out (block or drop), newest weights in, an exploration lease."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import numpy as np
import zmq

from flywheel import proto
from flywheel.netspec import WeightsMismatch
from flywheel.transport import FaultCounter, connect, make_socket, queued_messages, subscriber

from .nstep import Emitted
from .policy import Policy

log = logging.getLogger("flywheel.actor")


class StaleWeights(ValueError):
    """A weights version of the acting learner run older than the one acting."""

    fault = "stale_version"


class VersionJump(ValueError):
    """A weights version of the acting learner run further ahead of the newest one than ``max_version_jump``."""

    fault = "version_jump"


RUN_LOGS = 5  # learner run changes logged; more (two publishers on one endpoint?) are only counted in ``runs``


def auto_batch_rows(num_envs: int, row_bytes: int, *, min_rows: int = 256, max_bytes: int = 256 << 10) -> int:
    """Rows per message when ``send_batch`` is 0: whole vector steps until ``min_rows`` rows or ``max_bytes``.

    Every message costs a fixed amount (encoding, a syscall, waking ZeroMQ's I/O thread), which
    dominates for small rows (CartPole: 40 bytes); pixel rows reach the byte cap in one or two steps,
    so their messages need no concatenation.
    """
    steps = 1
    while steps * num_envs < min_rows and steps * num_envs * row_bytes < max_bytes:
        steps += 1
    return steps * num_envs


class TransitionSender:
    """Batches emitted rows into TransitionBatch messages and PUSHes them to replay.

    In block mode a send waits while replay pushes back (its samples-per-insert limit holds every actor while no
    learner samples). A wait of ``stall_s`` during which the learner went on publishing (``learner_versions``, a
    count of new weight versions seen, grew by 3 or more) is not that: the replay takes other actors' batches but not
    this connection's (seen once in ~6 compose runs, an actor at send high-water mark 1 stuck for good). The
    sender then reconnects, which gives it a new connection and pipe: what was queued in the old one is lost and
    counted as ``reconnects``; the batch being sent is kept.
    """

    def __init__(self, ctx: zmq.Context, endpoint: str, actor: str, *, hwm: int, on_full: str,
                 batch_rows: int, clock: Callable[[], float] = time.perf_counter, sndbuf: int = 0,
                 stall_s: float = 0.0, learner_versions: Callable[[], int] = lambda: 0) -> None:
        self.sock = make_socket(ctx, zmq.PUSH, sndhwm=hwm, sndbuf=sndbuf)
        connect(self.sock, endpoint)
        self.endpoint, self.stall_s, self.learner_versions = endpoint, stall_s, learner_versions
        self.reconnects = 0
        self.actor, self.on_full, self.batch_rows = actor, on_full, batch_rows
        self.buffer: list[Emitted] = []
        self.buffer_version = 0
        self.buffered = 0
        self.seq = 0
        self.sent = 0
        self.dropped = 0
        self.blocked_s = 0.0
        self.send_s = 0.0  # concatenating, encoding and handing to ZeroMQ (blocked time excluded)
        self.clock = clock

    def add(self, rows: list[Emitted], weight_version: int, running: Callable[[], bool],
            idle: Callable[[], None] = lambda: None) -> None:
        """Buffer rows made with ``weight_version``; a batch never mixes versions, so each carries its own."""
        if self.buffer and weight_version != self.buffer_version:
            self.flush(self.buffer_version, running, idle)
        self.buffer_version = weight_version
        for r in rows:
            self.buffer.append(r)
            self.buffered += len(r)
        if self.buffered >= self.batch_rows:
            self.flush(weight_version, running, idle)

    def flush(self, weight_version: int, running: Callable[[], bool], idle: Callable[[], None] = lambda: None) -> None:
        """Send what is buffered; in block mode wait (calling ``idle`` every 200 ms) until replay takes it."""
        if not self.buffer:
            return
        began = self.clock()
        parts, self.buffer, count = self.buffer, [], self.buffered
        self.buffered = 0
        cat = (lambda name: np.concatenate([getattr(p, name) for p in parts])) if len(parts) > 1 else (
            lambda name: getattr(parts[0], name))
        streams = None if any(p.stream is None for p in parts) else cat("stream")
        msg = proto.TransitionBatch(
            actor=self.actor, weight_version=weight_version, seq=self.seq, priority=cat("priority"), stream=streams,
            **{name: cat(name) for name in proto.TRANSITION_NAMES},
        )
        frames = proto.encode(msg)
        self.seq += 1
        if self.on_full == "drop":
            try:
                self.sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
                self.sent += count
            except zmq.Again:
                self.dropped += count
            self.send_s += self.clock() - began
            return
        if self.sock.poll(0, zmq.POLLOUT):  # the common case: room at the high-water mark
            self.sock.send_multipart(frames, copy=False)
            self.sent += count
            self.send_s += self.clock() - began
            return
        self.send_s += self.clock() - began
        start = waiting_since = time.monotonic()
        versions_then = self.learner_versions()
        while True:  # block, but wake up to notice a stop request; always try once (the final flush on exit)
            if self.sock.poll(200, zmq.POLLOUT):
                self.sock.send_multipart(frames, copy=False)
                self.sent += count
                break
            if not running():
                self.dropped += count
                break
            now = time.monotonic()  # counted as it goes, so reports show an actor that is blocked right now
            self.blocked_s += now - start
            start = now
            idle()  # telemetry, control and weights keep flowing while replay pushes back
            if self.stall_s > 0 and now - waiting_since >= self.stall_s:
                if self.learner_versions() - versions_then >= 3:
                    self._reconnect(now - waiting_since, self.learner_versions() - versions_then)
                waiting_since, versions_then = now, self.learner_versions()
        self.blocked_s += time.monotonic() - start

    def _reconnect(self, waited_s: float, versions: int) -> None:
        self.reconnects += 1
        log.warning("no room at %s for %.0f s while the learner published %d weight versions (the replay takes "
                    "other actors' batches, not this connection's): reconnecting (reconnect %d; what the old "
                    "connection held is lost)", self.endpoint, waited_s, versions, self.reconnects)
        self.sock.disconnect(self.endpoint)
        connect(self.sock, self.endpoint)

    def close(self) -> None:
        self.sock.close(0)


class WeightsReceiver:
    """SUBscribes to the learner's weights and loads the newest version at most every ``interval_s``.

    Every ``poll`` drains the socket (so the queue never holds stale versions) and remembers only
    the newest decodable message; loading it into the acting network happens when the interval has
    passed, so a fast learner never stalls acting. Weights carry their learner's run id, new at every learner
    start: the first weights of a run other than the newest one seen are taken whatever their version (a learner
    restarted without --resume starts again at 1; a rogue version 2^63-1 from another run pins nobody, as the
    real learner's next message is again another run). Within one run, versions older than the one acting and
    versions more than ``max_version_jump`` ahead of the newest seen are refused, counted and logged once per
    kind, as are weights that do not fit the network; the acting version again (the learner republishes its newest
    for late subscribers) is ignored. Acting goes on with the weights it has.
    """

    def __init__(self, ctx: zmq.Context, endpoint: str, policy: Policy, faults: FaultCounter, *,
                 interval_s: float = 0.0, max_version_jump: int = 10**8) -> None:
        self.sock = subscriber(ctx, endpoint, rcvhwm=2, max_msg_bytes=512 << 20)
        self.policy, self.faults = policy, faults
        self.interval_s, self.max_version_jump = interval_s, max_version_jump
        self.version = 0  # the version acting now
        self.run_id: str | None = None  # the learner run of the acting version (None: none loaded yet)
        self.newest_seen = 0  # the newest version of the acting run that arrived (loaded or waiting)
        self.arrived = 0  # new versions taken from the socket (loaded, waiting, or superseded while waiting)
        self.runs = 0  # learner runs switched to
        self.received = 0
        self.rejected = 0
        self.stale = 0
        self.pending: proto.Weights | None = None
        self.acting: proto.Weights | None = None  # the message of the version acting now (the clip filmer reads it)
        self.updated_at = time.monotonic()
        self.loaded_at = float("-inf")
        self.load_s = 0.0

    @property
    def lag(self) -> int:
        """Policy lag in versions: the newest version of the acting run known minus the version acting."""
        return max(0, self.newest_seen - self.version)

    def _refuse(self, kind: str, exc: Exception) -> None:
        self.faults.record(kind, exc)
        self.rejected += 1

    def _take(self, msg: proto.Weights) -> None:
        """Keep ``msg`` as the version to load next when it is newer than what is acting or waiting."""
        newest = self.pending if self.pending is not None else self.acting
        if newest is None or msg.run_id != newest.run_id:  # a learner run not seen last: its first weights
            self.pending = msg
            self.arrived += 1
            return
        if msg.version <= newest.version:  # the acting version again (a republish) is ignored, not counted
            if msg.version < self.version and msg.run_id == self.run_id:
                self.stale += 1
                self._refuse("weights", StaleWeights(
                    f"weights version {msg.version} of learner run {msg.run_id or '(none)'} is older than the "
                    f"acting version {self.version}"))
            return  # older than one already waiting: the waiting one wins
        if msg.version - newest.version > self.max_version_jump:
            self._refuse("weights", VersionJump(
                f"weights version {msg.version} of learner run {msg.run_id or '(none)'} is more than "
                f"max_version_jump {self.max_version_jump} ahead of version {newest.version} "
                "(FLYWHEEL_ACTOR_MAX_VERSION_JUMP): not from that learner"))
            return
        self.pending = msg
        self.arrived += 1
        if msg.run_id == self.run_id:
            self.newest_seen = max(self.newest_seen, msg.version)

    def poll(self, now: float | None = None) -> bool:
        """Drain waiting messages; load the newest if the interval allows. Returns whether the network changed."""
        for msg in queued_messages(self.sock, proto.Weights, lambda exc: self._refuse("weights", exc)):
            self._take(msg)
        now = time.monotonic() if now is None else now
        if self.pending is None or now < self.loaded_at + self.interval_s:
            return False
        newest, self.pending = self.pending, None
        began = time.perf_counter()
        try:
            self.policy.load(newest)
        except WeightsMismatch as exc:  # counted as weights:mismatch (its ``fault``)
            self._refuse("weights", exc)
            self.newest_seen = self.version  # nothing newer that fits is known
            return False
        finally:
            self.load_s += time.perf_counter() - began
        if newest.run_id != self.run_id:
            self.runs += 1
            self.newest_seen = newest.version
            if self.runs <= RUN_LOGS:
                log.info("%s weights received: version %d of learner run %s%s", "first" if self.version == 0
                         else "new learner run's", newest.version, newest.run_id or "(none)",
                         "; further run changes are only counted" if self.runs == RUN_LOGS else "")
        self.version, self.run_id = newest.version, newest.run_id
        self.newest_seen = max(self.newest_seen, newest.version)
        self.acting = newest
        self.received += 1
        self.updated_at = self.loaded_at = now
        return True

    def close(self) -> None:
        self.sock.close(0)


class LeaseClient:
    """Asks the gateway for an exploration slot (index of count) and renews it before it expires."""

    def __init__(self, ctx: zmq.Context, endpoint: str, instance: str, faults: FaultCounter) -> None:
        self.sock = make_socket(ctx, zmq.DEALER, sndhwm=4, rcvhwm=16, max_msg_bytes=64 * 1024)
        connect(self.sock, endpoint)
        self.instance, self.faults = instance, faults
        self.index, self.count = 0, 1
        self.valid_until = 0.0
        self.next_request = 0.0
        self.have_lease = False

    def tick(self, now: float) -> bool:
        """Send a renewal when due and read replies; returns whether index or count changed."""
        if now >= self.next_request:
            try:
                self.sock.send_multipart(proto.encode(proto.LeaseRequest(self.instance)), flags=zmq.NOBLOCK)
            except zmq.Again:
                pass
            self.next_request = now + 1.0 if not self.have_lease else now + max(0.5, (self.valid_until - now) / 3)
        changed = False
        for reply in queued_messages(self.sock, proto.LeaseReply, lambda exc: self.faults.record("lease", exc)):
            if reply.instance != self.instance:
                continue
            if (reply.index, reply.count) != (self.index, self.count) or not self.have_lease:
                changed = True
                log.info("lease: actor %d of %d", reply.index, reply.count)
            self.index, self.count, self.have_lease = reply.index, reply.count, True
            self.valid_until = now + reply.ttl
            self.next_request = now + max(0.5, reply.ttl / 3)
        return changed

    def wait_first(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while not self.have_lease and time.monotonic() < deadline:
            self.tick(time.monotonic())
            self.sock.poll(100, zmq.POLLIN)
        self.tick(time.monotonic())
        return self.have_lease

    def release(self) -> None:
        try:
            self.sock.send_multipart(proto.encode(proto.LeaseRequest(self.instance, release=True)), flags=zmq.NOBLOCK)
        except zmq.Again:
            pass

    def close(self) -> None:
        self.sock.close(0)
