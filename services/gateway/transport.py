"""The gateway's ZeroMQ side: telemetry in, control and leases out, the sweep that marks silent instances down.

One asyncio event loop runs these tasks and the HTTP handlers, so the state needs no locks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any, cast

import zmq
import zmq.asyncio

from flywheel import proto, security
from flywheel.transport import (
    LEASE_MAX_BYTES,
    TELEMETRY_MAX_BYTES,
    FaultCounter,
    MessageTooLarge,
    bind,
    make_socket,
    receive_async,
)

from .auth import ControlAuth
from .clips import ClipAssembler
from .control import ControlBook
from .history import LearningCurve, curve_point
from .lease import LeaseFull, LeaseTable, PeerLeasesFull
from .metrics import CapacityExceeded, Registry
from .settings import GatewaySettings

log = logging.getLogger("flywheel.gateway")
# Each receive gives up after this long and starts again: a new receive looks at the socket itself, so a message
# whose edge-triggered wakeup the event loop missed (pyzmq's asyncio sockets) waits at most this long, never forever.
RECEIVE_RECHECK_S = 1.0


class GatewayService:
    """The gateway's sockets, state and background tasks."""

    def __init__(self, settings: GatewaySettings, ctx: zmq.asyncio.Context | None = None,
                 auth: ControlAuth | None = None) -> None:
        self.settings = settings
        self.auth = auth or ControlAuth.of(settings)
        self.ctx = ctx or zmq.asyncio.Context()
        self._own_ctx = ctx is None
        self.registry = Registry(settings.stale_after_s, settings.forget_after_s, settings.max_instances,
                                 rate_window_s=settings.rate_window_s,
                                 max_per_service=settings.max_instances_per_service,
                                 max_series_per_instance=settings.max_series_per_instance,
                                 max_series=settings.max_series)
        self.control = ControlBook(settings.one_shot_repeat_s)
        self.leases = LeaseTable(settings.lease_ttl_s, settings.max_instances,
                                 max_per_peer=settings.max_leases_per_peer)
        self.curve = LearningCurve(settings.history_interval_s, settings.history_points)
        self.clips = ClipAssembler(max_buffer_bytes=settings.clip_buffer_bytes)
        self.faults = FaultCounter("gateway")
        self.started = time.monotonic()
        self.endpoints: dict[str, str] = {}
        self.tasks: list[asyncio.Task[None]] = []
        self.published = 0
        self.lease_requests = 0
        self.tracking_failures = 0  # W&B calls that failed (curves_writer.py; each one retried)
        self.internal_errors = 0  # telemetry messages whose handling raised (a bug of ours: logged with its trace)
        self.missed_wakeups = 0  # receives that timed out with a message waiting (see note_waiting)
        self.http_rejected: dict[tuple[str, int], int] = {}
        self._logged_invalid: set[tuple[str, str]] = set()
        self.telemetry_sock: zmq.asyncio.Socket | None = None
        self.control_sock: zmq.asyncio.Socket | None = None
        self.lease_sock: zmq.asyncio.Socket | None = None

    # -- sockets -------------------------------------------------------------------------------------------------

    def bind(self) -> None:
        """Bind the three endpoints; raises EndpointInUse with a message that names the setting."""
        if self.telemetry_sock is not None:
            return
        s = self.settings
        socks = []
        try:
            tel = make_socket(self.ctx, zmq.PULL, rcvhwm=s.telemetry_hwm, max_msg_bytes=TELEMETRY_MAX_BYTES)
            socks.append(tel)
            security.identify_peers(tel)  # each report names the CURVE key that sent it (accept_telemetry)
            self.endpoints["telemetry"] = bind(tel, s.telemetry_endpoint, "gateway telemetry",
                                               "FLYWHEEL_GATEWAY_TELEMETRY_ENDPOINT")
            ctl = make_socket(self.ctx, zmq.PUB, sndhwm=1000, max_msg_bytes=4096)  # inbound: subscriptions
            socks.append(ctl)
            self.endpoints["control"] = bind(ctl, s.control_endpoint, "gateway control",
                                             "FLYWHEEL_GATEWAY_CONTROL_ENDPOINT")
            lease = make_socket(self.ctx, zmq.ROUTER, sndhwm=1000, rcvhwm=1000, max_msg_bytes=LEASE_MAX_BYTES)
            socks.append(lease)
            self.endpoints["lease"] = bind(lease, s.lease_endpoint, "gateway leases", "FLYWHEEL_GATEWAY_LEASE_ENDPOINT")
        except Exception:
            for sock in socks:
                sock.close(0)
            raise
        # sockets of an asyncio context are asyncio sockets (make_socket is typed for any context)
        self.telemetry_sock, self.control_sock, self.lease_sock = (
            cast(zmq.asyncio.Socket, tel), cast(zmq.asyncio.Socket, ctl), cast(zmq.asyncio.Socket, lease))

    async def start(self) -> None:
        self.bind()
        self.tasks = [
            asyncio.create_task(self._telemetry_loop(), name="gateway-telemetry"),
            asyncio.create_task(self._lease_loop(), name="gateway-lease"),
            asyncio.create_task(self._repeat_loop(), name="gateway-repeat"),
            asyncio.create_task(self._sweep_loop(), name="gateway-sweep"),
        ]
        log.info("gateway up: %s; control %s", ", ".join(f"{k} {v}" for k, v in self.endpoints.items()),
                 "on (bearer token)" if self.auth.active else
                 "off (no token set)" if self.auth.enabled else "off (FLYWHEEL_GATEWAY_CONTROL_ENABLED=false)")

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.tasks = []
        for sock in (self.telemetry_sock, self.control_sock, self.lease_sock):
            if sock is not None:
                sock.close(0)
        self.telemetry_sock = self.control_sock = self.lease_sock = None
        if self._own_ctx:
            self.ctx.term()

    def healthy(self) -> tuple[bool, str]:
        if not self.tasks:
            return False, "not started"
        for task in self.tasks:
            if task.done():
                exc = None if task.cancelled() else task.exception()
                return False, f"{task.get_name()} stopped: {exc!r}"
        return True, "ok"

    # -- telemetry -----------------------------------------------------------------------------------------------

    def accept_telemetry(self, frames: list[Any], key: str = "") -> bool:
        """Decode and store one telemetry message or clip piece; a bad one is counted and logged once per fault.

        ``key``: the name of the CURVE key that sent it ("" for a plain local peer); see ``check_identity``."""
        try:
            msg = proto.decode(frames, expect=(proto.Telemetry, proto.ClipChunk))
            check_identity(msg, key)
            if isinstance(msg, proto.ClipChunk):
                clip = self.clips.add(msg)
                if clip is not None:
                    log.info("clip from %s: %s", msg.instance, self._clip_line(clip.info()))
                return True
            self.registry.update(msg)
            for fault in self.registry.last_faults:  # kept, less values that break the views or pass a cap
                self.faults.record("telemetry", fault)
        except proto.DecodeError as exc:  # TelemetryRejected and ClipRejected are ones too
            self.faults.record("telemetry", exc)
            return False
        self.log_events()
        self.log_invalid_keys()
        return True

    def _clip_line(self, info: dict[str, Any]) -> str:
        """What a whole clip showed, its measures under the labels its actor's env declares (telemetry info)."""
        actor = self.registry.instances.get(("actor", info["instance"]))
        labels = actor.info if actor is not None else {}
        progress = (f", {labels.get('progress_label') or 'progress'} {info['progress']:g}"
                    if info["progress"] is not None else "")
        success = f", {labels.get('success_label') or 'success'}" if info["success"] else ""
        return (f"weights v{info['weight_version']}, {info['frames']} frames, return {info['episode_return']:.1f}"
                f"{progress}{success} ({info['bytes'] >> 10} KiB)")

    async def _telemetry_loop(self) -> None:
        assert self.telemetry_sock is not None
        while True:
            try:
                frames = await receive_async(self.telemetry_sock, RECEIVE_RECHECK_S)
            except MessageTooLarge as exc:
                self.faults.record("telemetry", exc)
                continue
            except zmq.Again:  # a quiet interval, or a wakeup the event loop missed: the next receive looks
                self.note_waiting(self.telemetry_sock, "telemetry")
                continue
            try:
                self.accept_telemetry(frames, security.peer_key(frames[0]))
            except Exception:  # a fault of ours must not end telemetry for every peer (the views would read all down)
                self.internal_errors += 1
                log.exception("telemetry: a message could not be handled (%d so far); the gateway goes on",
                              self.internal_errors)

    def note_waiting(self, sock: zmq.asyncio.Socket, where: str) -> None:
        """After a receive timed out: count (and log the first of) the times a message was waiting all the same,
        i.e. the event loop missed the socket's edge-triggered wakeup; the next receive takes that message."""
        with contextlib.suppress(zmq.ZMQError):
            if int(sock.get(zmq.EVENTS)) & zmq.POLLIN:
                self.missed_wakeups += 1
                if self.missed_wakeups == 1:
                    log.warning("%s: a message waited %g s without waking the event loop; taken now (further such "
                                "waits are only counted: missed_wakeups_total)", where, RECEIVE_RECHECK_S)

    def sweep(self, now: float | None = None, wall: float | None = None) -> None:
        """Mark silent instances down, forget long-silent ones, expire leases, add a learning-curve point."""
        now = time.monotonic() if now is None else now
        wall = time.time() if wall is None else wall
        self.registry.sweep(now)
        self.leases.expire(now)
        self.log_events()
        if self.curve.due(wall):
            point = curve_point(self.registry, now, wall)
            if point is not None:
                self.curve.add(point)

    def log_events(self) -> None:
        for event, state, detail in self.registry.drain_events():
            level = logging.WARNING if event == "down" else logging.INFO
            log.log(level, "%s %s %s (%s)", state.service, state.instance, event, detail)

    def log_invalid_keys(self) -> None:
        """One warning per telemetry key that /metrics leaves out, saying why (the service should rename it)."""
        if len(self._logged_invalid) == len(self.registry.invalid_keys):
            return
        for key, why in self.registry.invalid_keys.items():
            if key not in self._logged_invalid:
                self._logged_invalid.add(key)
                log.warning("%s telemetry key %r is not exported to /metrics: %s; rename it in the %s service",
                            key[0], key[1], why, key[0])

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.sweep_interval_s)
            self.sweep()

    # -- leases --------------------------------------------------------------------------------------------------

    def answer_lease(self, frames: list[Any]) -> list[Any] | None:
        """Reply frames for one ROUTER message (DEALER or REQ envelope), or None when it is refused."""
        if len(frames) < 2:
            self.faults.record("lease", proto.TruncatedMessage("lease: no payload after the routing id"))
            return None
        envelope, body = frames[:1], frames[1:]
        if len(body) > 1 and len(body[0]) == 0:  # REQ sockets add an empty delimiter frame
            envelope, body = frames[:2], frames[2:]
        self.lease_requests += 1
        try:
            request = proto.decode(body, expect=proto.LeaseRequest)
            reply = self.leases.handle(request, peer=bytes(envelope[0]))
        except proto.DecodeError as exc:
            self.faults.record("lease", exc)
            return None
        except PeerLeasesFull as exc:
            self.faults.record("lease", CapacityExceeded(str(exc), fault="leases_per_peer"))
            return None
        except LeaseFull as exc:
            self.faults.record("lease", CapacityExceeded(str(exc)))
            return None
        return [*envelope, *proto.encode(reply)]

    async def _lease_loop(self) -> None:
        assert self.lease_sock is not None
        while True:
            try:
                frames = [frame.bytes for frame in await receive_async(self.lease_sock, RECEIVE_RECHECK_S)]
            except MessageTooLarge as exc:
                self.faults.record("lease", exc)
                continue
            except zmq.Again:
                self.note_waiting(self.lease_sock, "leases")
                continue
            reply = self.answer_lease(frames)
            if reply is not None:
                with contextlib.suppress(zmq.Again, zmq.ZMQError):  # the peer went away: nothing to do
                    await self.lease_sock.send_multipart(reply, flags=zmq.NOBLOCK)

    # -- control -------------------------------------------------------------------------------------------------

    async def command(self, command: str, target: str | None, args: dict[str, Any],
                      by: dict[str, str]) -> proto.Control:
        """Check, log, record and publish one command; raises CommandError (nothing is sent then)."""
        msg = self.control.issue(command, target, args, by)
        log.info("control: %s target=%s args=%s seq=%d by %s", msg.command, msg.target, msg.args, msg.seq,
                 " ".join(f"{k}={v}" for k, v in by.items()))
        await self.publish(msg)
        return msg

    async def publish(self, msg: proto.Control) -> None:
        assert self.control_sock is not None
        await self.control_sock.send_multipart(proto.encode(msg))
        self.published += 1

    async def _repeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.control_repeat_s)
            for msg in self.control.to_repeat():
                await self.publish(msg)

    def count_http_reject(self, route: str, status: int, client: str = "?") -> None:
        """Count a 4xx answer by route template and status; the first of each kind is logged."""
        key = (route, status)
        if key not in self.http_rejected and len(self.http_rejected) >= 256:
            key = ("other", status)  # keep the label set bounded
        if key not in self.http_rejected:
            log.warning("HTTP %d on %s from %s; further ones are only counted (flywheel_gateway_http_rejected_total)",
                        status, route, client)
        self.http_rejected[key] = self.http_rejected.get(key, 0) + 1


def check_identity(msg: proto.Telemetry | proto.ClipChunk, key: str) -> None:
    """A CURVE key speaks only for its role (``security.speaks_for``: an actor's key never for the learner or the
    replay; clips come from actors); refused as ``identity``. Plain local peers speak for any. A report's info
    says which key sent it (``curve_key``; the gateway's alone, whatever the peer wrote there)."""
    service = msg.service if isinstance(msg, proto.Telemetry) else "actor"
    if not security.speaks_for(key, service):
        raise proto.DecodeError(f"the {key!r} key is the {security.key_role(key)}'s: it may not speak for the "
                                f"{service} {msg.instance!r}", fault="identity")
    if isinstance(msg, proto.Telemetry):
        msg.info.pop("curve_key", None)
        if key:
            msg.info["curve_key"] = key
