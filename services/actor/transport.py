"""Actor sockets: transitions out (block or drop), newest weights in, an exploration lease."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import numpy as np
import zmq

from flywheel import proto
from flywheel.nets import QNetwork, WeightsMismatch, load_weights
from flywheel.transport import FaultCounter, make_socket

from .nstep import Emitted

log = logging.getLogger("flywheel.actor")


class TransitionSender:
    """Batches emitted rows into TransitionBatch messages and PUSHes them to replay."""

    def __init__(self, ctx: zmq.Context, endpoint: str, actor: str, *, hwm: int, on_full: str,
                 batch_rows: int) -> None:
        self.sock = make_socket(ctx, zmq.PUSH, sndhwm=hwm)
        self.sock.connect(endpoint)
        self.actor, self.on_full, self.batch_rows = actor, on_full, batch_rows
        self.buffer: list[Emitted] = []
        self.buffered = 0
        self.seq = 0
        self.sent = 0
        self.dropped = 0
        self.blocked_s = 0.0

    def add(self, rows: list[Emitted], weight_version: int, running: Callable[[], bool],
            idle: Callable[[], None] = lambda: None) -> None:
        for r in rows:
            self.buffer.append(r)
            self.buffered += len(r)
        if self.buffered >= self.batch_rows:
            self.flush(weight_version, running, idle)

    def flush(self, weight_version: int, running: Callable[[], bool], idle: Callable[[], None] = lambda: None) -> None:
        """Send what is buffered; in block mode wait (calling ``idle`` every 200 ms) until replay takes it."""
        if not self.buffer:
            return
        parts, self.buffer, count = self.buffer, [], self.buffered
        self.buffered = 0
        cat = (lambda name: np.concatenate([getattr(p, name) for p in parts])) if len(parts) > 1 else (
            lambda name: getattr(parts[0], name))
        msg = proto.TransitionBatch(
            actor=self.actor, weight_version=weight_version, seq=self.seq, obs=cat("obs"), action=cat("action"),
            reward=cat("reward"), discount=cat("discount"), next_obs=cat("next_obs"), priority=cat("priority"),
        )
        frames = proto.encode(msg)
        self.seq += 1
        if self.on_full == "drop":
            try:
                self.sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
                self.sent += count
            except zmq.Again:
                self.dropped += count
            return
        start = time.monotonic()
        while True:  # block, but wake up to notice a stop request; always try once (the final flush on exit)
            if self.sock.poll(200, zmq.POLLOUT):
                self.sock.send_multipart(frames, copy=False)
                self.sent += count
                break
            if not running():
                self.dropped += count
                break
            idle()  # telemetry and control keep flowing while replay pushes back
        self.blocked_s += time.monotonic() - start

    def close(self) -> None:
        self.sock.close(0)


class WeightsReceiver:
    """SUBscribes to the learner's weights; only the newest pending version is loaded."""

    def __init__(self, ctx: zmq.Context, endpoint: str, net: QNetwork, faults: FaultCounter) -> None:
        self.sock = make_socket(ctx, zmq.SUB, rcvhwm=2, max_msg_bytes=512 << 20)
        self.sock.setsockopt(zmq.SUBSCRIBE, b"")
        self.sock.connect(endpoint)
        self.net, self.faults = net, faults
        self.version = 0
        self.received = 0
        self.rejected = 0
        self.updated_at = time.monotonic()

    def poll(self) -> bool:
        """Load the newest weights waiting, if any; returns whether the network changed."""
        newest: proto.Weights | None = None
        while True:
            try:
                frames = self.sock.recv_multipart(flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            try:
                msg = proto.decode(frames, expect=proto.Weights)
            except proto.DecodeError as exc:
                self.faults.record("weights", exc)
                self.rejected += 1
                continue
            assert isinstance(msg, proto.Weights)
            if msg.version <= (self.version if newest is None else newest.version):
                continue  # older or repeated: keep what we have (or the newest seen in this drain)
            newest = msg
        if newest is None:
            return False
        try:
            load_weights(self.net, newest, self.net.name)
        except WeightsMismatch as exc:
            self.faults.record("weights", exc)
            self.rejected += 1
            return False
        if self.version == 0:
            log.info("first weights received: version %d", newest.version)
        self.version = newest.version
        self.received += 1
        self.updated_at = time.monotonic()
        return True

    def close(self) -> None:
        self.sock.close(0)


class LeaseClient:
    """Asks the gateway for an exploration slot (index of count) and renews it before it expires."""

    def __init__(self, ctx: zmq.Context, endpoint: str, instance: str, faults: FaultCounter) -> None:
        self.sock = make_socket(ctx, zmq.DEALER, sndhwm=4, rcvhwm=16, max_msg_bytes=64 * 1024)
        self.sock.connect(endpoint)
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
        while True:
            try:
                frames = self.sock.recv_multipart(flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return changed
            try:
                reply = proto.decode(frames, expect=proto.LeaseReply)
            except proto.DecodeError as exc:
                self.faults.record("lease", exc)
                continue
            assert isinstance(reply, proto.LeaseReply)
            if reply.instance != self.instance:
                continue
            if (reply.index, reply.count) != (self.index, self.count) or not self.have_lease:
                changed = True
                log.info("lease: actor %d of %d", reply.index, reply.count)
            self.index, self.count, self.have_lease = reply.index, reply.count, True
            self.valid_until = now + reply.ttl
            self.next_request = now + max(0.5, reply.ttl / 3)

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
