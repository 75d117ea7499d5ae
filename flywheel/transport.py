"""ZeroMQ plumbing shared by the services: sockets with limits, telemetry and control."""

from __future__ import annotations

import asyncio
import ctypes
import functools
import logging
import math
import time
import weakref
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

import zmq
import zmq.asyncio

from flywheel import __version__, proto, security
from flywheel.metrics_spec import CURVE_HANDSHAKES_REFUSED, REJECTED
from flywheel.procstats import ProcessStats

log = logging.getLogger("flywheel.transport")
M = TypeVar("M", bound=proto.Message)


class EndpointInUse(RuntimeError):
    """A bind failed because another process holds the address."""


MAX_PARTS = 64  # the most parts any Flywheel message has: a header, its arrays and a ROUTER envelope
# The most one message may hold, each part and all of it, on the gateway's telemetry and lease sockets (peers reach
# them): the biggest real telemetry report measured is 1.6 KiB (about 46 values), a clip piece is
# proto.CLIP_CHUNK_BYTES (12 KiB) and a header under 1 KiB, a lease request under 1.1 KiB (an instance name of at
# most 256 characters). Small caps bound what one multipart message can make libzmq queue (docs/RELIABILITY.md).
TELEMETRY_MAX_BYTES = 16 * 1024
LEASE_MAX_BYTES = 2 * 1024


class MessageTooLarge(proto.OversizedMessage):
    """A multipart message passed its socket's part or byte budget; its remaining parts were read and dropped."""


@dataclass(frozen=True)
class MessageBudget:
    """What one inbound message may hold on a socket, checked part by part as it is received."""

    max_parts: int = MAX_PARTS
    max_bytes: int = -1  # the whole message, every part added up; -1: unbounded


_budgets: weakref.WeakKeyDictionary[zmq.Socket, MessageBudget] = weakref.WeakKeyDictionary()


def make_socket(ctx: zmq.Context, kind: int, *, sndhwm: int = 1000, rcvhwm: int = 1000,
                max_msg_bytes: int = -1, max_parts: int = MAX_PARTS, sndbuf: int = 0, rcvbuf: int = 0) -> zmq.Socket:
    """A socket with high-water marks, a zero linger, inbound message budgets and kernel buffer sizes.

    ``max_msg_bytes`` bounds one whole inbound message (libzmq's ZMQ_MAXMSGSIZE, also set, bounds each part only:
    a peer that sends a bigger part is disconnected); ``max_parts`` bounds its parts. ``receive`` enforces both.
    ``sndbuf``/``rcvbuf`` (bytes; 0: the OS default) bound what TCP itself holds in flight beyond the
    high-water marks: by default Linux lets a few MiB per connection run ahead of a receiver that stopped reading.
    """
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, sndhwm)
    sock.setsockopt(zmq.RCVHWM, rcvhwm)
    if max_msg_bytes > 0:
        sock.setsockopt(zmq.MAXMSGSIZE, max_msg_bytes)
    _budgets[sock] = MessageBudget(max_parts, max_msg_bytes)
    if sndbuf > 0:
        sock.setsockopt(zmq.SNDBUF, sndbuf)
    if rcvbuf > 0:
        sock.setsockopt(zmq.RCVBUF, rcvbuf)
    return sock


PART_OVERHEAD = 64  # bytes libzmq holds per queued part beyond its data (a zmq_msg_t in the pipe), at least
_GIVE_BACK_AFTER = 1 << 20  # a refused message that made libzmq hold this much: give the freed pages back
_given_back = -math.inf


def give_back_memory(held: int) -> None:
    """After a refused message that made libzmq hold ``held`` bytes: return the freed heap pages to the system
    (glibc ``malloc_trim``; at most once a second). Without it a process keeps its peak resident size: libzmq
    frees the parts, but malloc keeps the pages (measured: 8,000 parts of 16 KiB, +250 MiB resident, kept)."""
    global _given_back
    now = time.monotonic()
    if held < _GIVE_BACK_AFTER or now - _given_back < 1.0:
        return
    _given_back = now
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is not None:
        trim(0)


@functools.cache
def _libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(None)  # the C library the interpreter runs on (malloc_trim: glibc only)
    except OSError:
        return None


class _Intake:
    """One message's parts as they are received, kept only while within the budget."""

    def __init__(self, budget: MessageBudget) -> None:
        self.budget, self.size, self.parts, self.why = budget, 0, 0, ""
        self.frames: list[zmq.Frame] = []

    def add(self, frame: zmq.Frame) -> bool:
        """Take one part; whether more parts follow."""
        self.size += len(frame)
        self.parts += 1
        if not self.why:
            if len(self.frames) + 1 > self.budget.max_parts:
                self.why = f"more than {self.budget.max_parts} parts"
            elif 0 < self.budget.max_bytes < self.size:
                self.why = f"more than {self.budget.max_bytes} bytes in all"
            else:
                self.frames.append(frame)
        return bool(frame.more)

    def message(self) -> list[zmq.Frame]:
        if self.why:
            give_back_memory(self.size + PART_OVERHEAD * self.parts)
            raise MessageTooLarge(f"message of {self.size} bytes in {self.parts} parts refused: {self.why}")
        return self.frames


def receive(sock: zmq.Socket, flags: int = zmq.NOBLOCK) -> list[zmq.Frame]:
    """One multipart message, received part by part within the socket's ``MessageBudget`` (zero copy).

    Raises ``zmq.Again`` when none is waiting (with NOBLOCK) and ``MessageTooLarge`` when the message passes the
    budget: its other parts are received and dropped at once, so the process never holds more than the budget of
    it (libzmq queues a whole message before the first part can be read; see docs/RELIABILITY.md)."""
    intake = _Intake(_budgets.get(sock, MessageBudget()))
    more = intake.add(sock.recv(flags, copy=False))
    while more:
        more = intake.add(sock.recv(copy=False))  # the rest of a message is already queued: this never waits
    return intake.message()


async def receive_async(sock: zmq.asyncio.Socket, timeout_s: float | None = None) -> list[zmq.Frame]:
    """``receive`` for an asyncio socket: waits for the first part, then takes the rest within the budget.

    It first lets the event loop run its other tasks once: pyzmq hands over a queued message without yielding, so
    a loop reading a socket that one peer keeps full would otherwise starve every other task (leases, HTTP).
    With ``timeout_s`` it raises ``zmq.Again`` when no message came in that time (nothing is lost: a message is
    taken only by a receive still waiting)."""
    await asyncio.sleep(0)
    intake = _Intake(_budgets.get(sock, MessageBudget()))
    if timeout_s is None:
        first = await sock.recv(copy=False)
    else:
        try:
            first = await asyncio.wait_for(sock.recv(copy=False), timeout_s)
        except TimeoutError:
            raise zmq.Again() from None
    more = intake.add(first)
    while more:
        more = intake.add(await sock.recv(copy=False))
    return intake.message()


def bind(sock: zmq.Socket, endpoint: str, what: str, setting: str) -> str:
    """Bind, turning 'address in use' into an error that says what to do; a CURVE server when keys are set.

    Returns the endpoint bound, which each service logs in its start line: with port 0 (``tcp://127.0.0.1:0``)
    the kernel picks a free port, and this is how a caller (a test, a launcher) learns which. Without CURVE keys an
    address other hosts can reach is refused (``security.PlaintextBindRefused``) unless ``allow_plaintext`` is on."""
    security.check_bind(endpoint, what, setting)
    security.prepare_bind(sock, endpoint)
    try:
        sock.bind(endpoint)
    except zmq.ZMQError as exc:
        if exc.errno == zmq.EADDRINUSE:
            raise EndpointInUse(
                f"{endpoint} ({what}) is already in use: stop the process holding it or set {setting}"
            ) from None
        raise EndpointInUse(f"cannot bind {endpoint} ({what}): {exc.strerror}; check {setting}") from None
    bound = sock.getsockopt_string(zmq.LAST_ENDPOINT)
    log.debug("%s bound at %s", what, bound)
    return bound


def connect(sock: zmq.Socket, endpoint: str) -> None:
    """Connect (ZeroMQ reconnects by itself); a CURVE client on network endpoints when keys are set."""
    security.prepare_connect(sock, endpoint)
    sock.connect(endpoint)


HEARTBEAT_IVL_MS = 2_000  # a subscriber PINGs its publisher this often (ZMTP 3.1 heartbeats) ...
HEARTBEAT_TIMEOUT_MS = 15_000  # ... and reconnects when nothing at all came back for this long


def subscriber(ctx: zmq.Context, endpoint: str, *, rcvhwm: int = 1000, max_msg_bytes: int = -1,
               heartbeat_ivl_ms: int = HEARTBEAT_IVL_MS, heartbeat_timeout_ms: int = HEARTBEAT_TIMEOUT_MS,
               ) -> zmq.Socket:
    """A SUB socket that takes every message published at ``endpoint`` (``make_socket`` limits, ``connect``).

    A subscriber only listens, so a connection whose far end vanished without a FIN (a publisher's container
    killed, its network gone) would look alive for ever and the subscriber would never reconnect to the restarted
    publisher: in CI's compose test one actor of eight kept the killed learner's connection and its weights for
    good. ZMTP heartbeats (libzmq answers PINGs by itself, on any socket type) end such a connection within
    ``heartbeat_timeout_ms``; the publisher's own traffic counts as an answer.
    """
    sock = make_socket(ctx, zmq.SUB, rcvhwm=rcvhwm, max_msg_bytes=max_msg_bytes)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    if heartbeat_ivl_ms > 0:
        sock.setsockopt(zmq.HEARTBEAT_IVL, heartbeat_ivl_ms)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, heartbeat_timeout_ms)
    connect(sock, endpoint)
    return sock


def queued_frames(sock: zmq.Socket, refused: Callable[[proto.DecodeError], None] | None = None,
                  ) -> Iterator[list[zmq.Frame]]:
    """The multipart messages waiting on ``sock``, oldest first, received without blocking until none is left;
    each one past the socket's budget goes to ``refused`` instead (raised when there is none)."""
    while True:
        try:
            frames = receive(sock)
        except zmq.Again:
            return
        except MessageTooLarge as exc:
            if refused is None:
                raise
            refused(exc)
            continue
        yield frames


def queued_messages(sock: zmq.Socket, expect: type[M], refused: Callable[[proto.DecodeError], None]) -> Iterator[M]:
    """The queued messages of kind ``expect``, decoded; each one refused by the codec goes to ``refused`` instead."""
    for frames in queued_frames(sock, refused):
        try:
            msg = proto.decode(frames, expect)
        except proto.DecodeError as exc:
            refused(exc)
            continue
        yield msg


class FaultCounter:
    """Counts refused messages by kind of fault and logs the first of each kind once."""

    def __init__(self, service: str) -> None:
        self.service = service
        self.counts: Counter[str] = Counter()

    def record(self, where: str, exc: Exception) -> None:
        fault = getattr(exc, "fault", "malformed")
        key = f"{where}:{fault}"
        if self.counts[key] == 0:
            log.warning("%s: refused a message on %s (%s): %s; further %s faults are only counted",
                        self.service, where, fault, exc, fault)
        self.counts[key] += 1

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def as_counters(self) -> dict[str, float]:
        """``rejected_total{where=...,reason=...}`` counters of every fault seen, for telemetry."""
        out: dict[str, float] = {}
        for key, count in self.counts.items():
            where, _, fault = key.partition(":")
            out[REJECTED.key(where, fault)] = float(count)
        return out


class TelemetryReporter:
    """PUSHes an instance's counters and gauges to the gateway; never blocks, drops when full.

    Every report also carries the process's CPU seconds, resident memory and thread count (unless the caller
    reports those keys itself) and the Flywheel version in ``info``, so every service gets them for free.
    """

    def __init__(self, ctx: zmq.Context, endpoint: str, service: str, instance: str,
                 interval_s: float = 1.0, process_stats: bool = True) -> None:
        self.sock = make_socket(ctx, zmq.PUSH, sndhwm=4)
        self.sock.setsockopt(zmq.IMMEDIATE, 1)
        connect(self.sock, endpoint)
        self.service, self.instance, self.interval_s = service, instance, interval_s
        self.seq = 0
        self.dropped = 0  # reports not sent: the queue to the gateway was full, or one was over its cap (oversized)
        self.oversized = 0
        self._next = 0.0
        self.process = ProcessStats() if process_stats else None

    def due(self, now: float | None = None) -> bool:
        return (now if now is not None else time.monotonic()) >= self._next

    def send(self, counters: dict[str, float], gauges: dict[str, float], info: dict[str, str] | None = None) -> None:
        """One report; ``counters`` and ``gauges`` by telemetry key (the ``as_dict()`` of flywheel.metrics_spec parts,
        with ``Family`` keys such as ``FaultCounter.as_counters()``)."""
        self._next = time.monotonic() + self.interval_s
        self.seq += 1
        info = {"version": __version__, **(info or {})}
        if self.process is not None:
            proc_counters, proc_gauges = self.process.sample()
            counters = {**proc_counters, **counters}
            gauges = {**proc_gauges, **gauges}
        if security.active() is not None:
            refused = {CURVE_HANDSHAKES_REFUSED.key(why): float(n) for why, n in security.refused_counts().items()}
            counters = {**refused, **counters}
            info["curve"] = "on"
        msg = proto.Telemetry(self.service, self.instance, self.seq, time.time(), counters, gauges, info)
        frames = proto.encode(msg)
        if len(frames[0]) > TELEMETRY_MAX_BYTES:  # the gateway would cut the connection at it: say so, send none
            if not self.oversized:
                log.warning("telemetry report of %d bytes is over the gateway's %d-byte cap (%d values): not sent",
                            len(frames[0]), TELEMETRY_MAX_BYTES, len(counters) + len(gauges) + len(info))
            self.oversized += 1
            self.dropped += 1
            return
        try:
            self.sock.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            self.dropped += 1

    def close(self) -> None:
        self.sock.close(0)


class ControlSubscriber:
    """SUBscribes to the gateway's control channel and yields the typed commands meant for this instance.

    A command is checked once, here (``proto.Command.from_message``); one with bad arguments or an unknown name is
    dropped, counted in ``rejected`` and in the fault counter (``control:bad_args``, ``control:unknown_command``).
    """

    def __init__(self, ctx: zmq.Context, endpoint: str, service: str, instance: str,
                 faults: FaultCounter) -> None:
        self.sock = subscriber(ctx, endpoint, rcvhwm=100, max_msg_bytes=64 * 1024)
        self.service, self.instance, self.faults = service, instance, faults
        self.seen: set[int] = set()
        self.rejected = 0

    def drain(self) -> list[proto.Command[Any]]:
        """All pending commands for this instance (non-blocking); duplicates by seq are skipped."""
        commands: list[proto.Command[Any]] = []
        for msg in queued_messages(self.sock, proto.Control, lambda exc: self.faults.record("control", exc)):
            if msg.target not in ("*", self.service, self.instance):
                continue
            if msg.seq in self.seen:  # the gateway repeats retained commands for late joiners
                continue
            if len(self.seen) > 4096:
                self.seen.clear()
            self.seen.add(msg.seq)
            try:
                commands.append(proto.Command.from_message(msg))
            except proto.CommandError as exc:
                self.rejected += 1
                self.faults.record("control", exc)
        return commands

    def close(self) -> None:
        self.sock.close(0)


def install_stop_signals(stop: Callable[[], None]) -> None:
    """SIGINT and SIGTERM call ``stop`` (which must only set a flag)."""
    import signal

    def handler(signum: int, _frame: object) -> None:
        log.info("received %s, stopping", signal.Signals(signum).name)
        stop()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
