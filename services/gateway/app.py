"""The gateway: telemetry in, control and leases out over ZeroMQ; /metrics, /status, /healthz and /control over HTTP.

One asyncio event loop runs the HTTP handlers and the ZeroMQ tasks, so the state needs no locks.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import zmq
import zmq.asyncio
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from flywheel import __version__, proto
from flywheel.transport import FaultCounter, bind, make_socket

from .control import CommandError, ControlBook, UnknownCommand
from .lease import LeaseFull, LeaseTable
from .metrics import CapacityExceeded, MetricsWriter, Registry, render_instances
from .settings import GatewaySettings

log = logging.getLogger("flywheel.gateway")
PROM_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_SMALL_MSG = 64 * 1024


class GatewayService:
    """The gateway's sockets, state and background tasks."""

    def __init__(self, settings: GatewaySettings, ctx: zmq.asyncio.Context | None = None) -> None:
        self.settings = settings
        self.ctx = ctx or zmq.asyncio.Context()
        self._own_ctx = ctx is None
        self.registry = Registry(settings.stale_after_s, settings.forget_after_s, settings.max_instances)
        self.control = ControlBook(settings.one_shot_repeat_s)
        self.leases = LeaseTable(settings.lease_ttl_s, settings.max_instances)
        self.faults = FaultCounter("gateway")
        self.started = time.monotonic()
        self.endpoints: dict[str, str] = {}
        self.tasks: list[asyncio.Task[None]] = []
        self.published = 0
        self.lease_requests = 0
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
            tel = make_socket(self.ctx, zmq.PULL, rcvhwm=s.telemetry_hwm, max_msg_bytes=_SMALL_MSG)
            socks.append(tel)
            bind(tel, s.telemetry_endpoint, "gateway telemetry", "FLYWHEEL_GATEWAY_TELEMETRY_ENDPOINT")
            ctl = make_socket(self.ctx, zmq.PUB, sndhwm=1000)
            socks.append(ctl)
            bind(ctl, s.control_endpoint, "gateway control", "FLYWHEEL_GATEWAY_CONTROL_ENDPOINT")
            lease = make_socket(self.ctx, zmq.ROUTER, sndhwm=1000, rcvhwm=1000, max_msg_bytes=_SMALL_MSG)
            socks.append(lease)
            bind(lease, s.lease_endpoint, "gateway leases", "FLYWHEEL_GATEWAY_LEASE_ENDPOINT")
        except Exception:
            for sock in socks:
                sock.close(0)
            raise
        self.telemetry_sock, self.control_sock, self.lease_sock = tel, ctl, lease
        for name, sock in (("telemetry", tel), ("control", ctl), ("lease", lease)):
            self.endpoints[name] = sock.getsockopt_string(zmq.LAST_ENDPOINT)

    async def start(self) -> None:
        self.bind()
        self.tasks = [
            asyncio.create_task(self._telemetry_loop(), name="gateway-telemetry"),
            asyncio.create_task(self._lease_loop(), name="gateway-lease"),
            asyncio.create_task(self._repeat_loop(), name="gateway-repeat"),
        ]
        log.info("gateway up: %s", ", ".join(f"{k} {v}" for k, v in self.endpoints.items()))

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

    # -- loops ---------------------------------------------------------------------------------------------------

    def accept_telemetry(self, frames: list[Any]) -> bool:
        """Decode and store one telemetry message; a bad one is counted and logged once per fault."""
        try:
            msg = proto.decode(frames, expect=proto.Telemetry)
            assert isinstance(msg, proto.Telemetry)
            self.registry.update(msg)
        except proto.DecodeError as exc:  # TelemetryRejected is one too
            self.faults.record("telemetry", exc)
            return False
        return True

    async def _telemetry_loop(self) -> None:
        assert self.telemetry_sock is not None
        while True:
            frames = await self.telemetry_sock.recv_multipart(copy=False)
            self.accept_telemetry(frames)

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
            assert isinstance(request, proto.LeaseRequest)
            reply = self.leases.handle(request)
        except proto.DecodeError as exc:
            self.faults.record("lease", exc)
            return None
        except LeaseFull as exc:
            self.faults.record("lease", CapacityExceeded(str(exc)))
            return None
        return [*envelope, *proto.encode(reply)]

    async def _lease_loop(self) -> None:
        assert self.lease_sock is not None
        while True:
            frames = await self.lease_sock.recv_multipart(copy=True)
            reply = self.answer_lease(frames)
            if reply is not None:
                with contextlib.suppress(zmq.Again, zmq.ZMQError):  # the peer went away: nothing to do
                    await self.lease_sock.send_multipart(reply, flags=zmq.NOBLOCK)

    async def publish(self, msg: proto.Control) -> None:
        assert self.control_sock is not None
        await self.control_sock.send_multipart(proto.encode(msg))
        self.published += 1

    async def _repeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.control_repeat_s)
            for msg in self.control.to_repeat():
                await self.publish(msg)
            self.leases.expire()
            self.registry.forget_old()

    # -- views ---------------------------------------------------------------------------------------------------

    def metrics_text(self) -> str:
        now = time.monotonic()
        w = MetricsWriter()
        render_instances(self.registry, w, now)
        g = {"service": "gateway", "instance": self.settings.instance}
        w.add("flywheel_gateway_telemetry_received_total", "counter", "telemetry messages accepted", g,
              self.registry.received)
        for fault_key in sorted(self.faults.counts) or ["telemetry:malformed"]:
            where, fault = fault_key.split(":", 1)
            w.add("flywheel_gateway_messages_rejected_total", "counter", "messages refused, by socket and fault",
                  {**g, "socket": where, "fault": fault}, self.faults.counts.get(fault_key, 0))
        by_service = self.registry.by_service()
        for service, states in by_service.items():
            live = sum(self.registry.live(s, now) for s in states)
            w.add("flywheel_gateway_instances", "gauge", "instances known, by service and state",
                  {**g, "of_service": service, "state": "up"}, live)
            w.add("flywheel_gateway_instances", "gauge", "instances known, by service and state",
                  {**g, "of_service": service, "state": "down"}, len(states) - live)
        w.add("flywheel_gateway_leases", "gauge", "live exploration leases (the N of Ape-X eps_i)", g,
              len(self.leases))
        w.add("flywheel_gateway_lease_requests_total", "counter", "lease requests received", g, self.lease_requests)
        w.add("flywheel_gateway_leases_expired_total", "counter", "leases dropped because the actor went silent", g,
              self.leases.expired)
        for command in sorted(self.control.issued):
            w.add("flywheel_gateway_control_commands_total", "counter", "control commands accepted, by command",
                  {**g, "command": command}, self.control.issued[command])
        w.add("flywheel_gateway_control_published_total", "counter", "control messages published, repeats included",
              g, self.published)
        w.add("flywheel_gateway_invalid_metric_keys", "gauge", "telemetry keys skipped as invalid metric names", g,
              self.registry.bad_keys)
        w.add("flywheel_gateway_metric_type_conflicts", "gauge", "samples skipped: name reported as two types", g,
              w.conflicts)
        w.add("flywheel_gateway_uptime_seconds", "gauge", "seconds since the gateway started", g,
              now - self.started)
        return w.text()

    def status(self) -> dict[str, Any]:
        now = time.monotonic()
        services: dict[str, Any] = {}
        for service, states in self.registry.by_service().items():
            instances = []
            totals: dict[str, float] = {}
            for s in states:
                live = self.registry.live(s, now)
                if live:
                    for k, v in s.counters.items():
                        totals[k] = totals.get(k, 0.0) + v
                entry: dict[str, Any] = {
                    "instance": s.instance, "up": live, "age_s": round(s.age(now), 3), "seq": s.seq,
                    "sent_time": s.sent_time, "restarts": s.restarts,
                    "counters": s.counters, "gauges": s.gauges, "info": s.info,
                }
                index = self.leases.index_of(s.instance)
                if index is not None:
                    entry["lease"] = {"index": index, "count": len(self.leases)}
                instances.append(entry)
            services[service] = {
                "up": sum(1 for i in instances if i["up"]), "down": sum(1 for i in instances if not i["up"]),
                "totals": totals, "instances": instances,
            }
        return {
            "gateway": {
                "instance": self.settings.instance, "version": __version__,
                "uptime_s": round(now - self.started, 3), "endpoints": self.endpoints,
                "control_enabled": bool(self.settings.control_token.get_secret_value()),
                "telemetry_received": self.registry.received, "rejected": dict(self.faults.counts),
            },
            "services": services,
            "leases": {"count": len(self.leases), "actors": list(self.leases.slots), "ttl_s": self.leases.ttl_s},
            "control": self.control.state(),
        }


def _json_error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def create_app(settings: GatewaySettings, service: GatewayService | None = None) -> FastAPI:
    """The FastAPI app; its lifespan binds (if not yet bound) and runs the gateway's ZeroMQ side."""
    gw = service or GatewayService(settings)

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        await gw.start()
        try:
            yield
        finally:
            await gw.stop()

    app = FastAPI(title="Flywheel gateway", version=__version__, lifespan=lifespan)
    app.state.gateway = gw

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        ok, why = gw.healthy()
        return JSONResponse({"ok": ok, "detail": why}, status_code=200 if ok else 503)

    @app.get("/metrics")
    async def metrics() -> PlainTextResponse:
        return PlainTextResponse(gw.metrics_text(), media_type=PROM_CONTENT_TYPE)

    @app.get("/status")
    async def status() -> JSONResponse:
        return JSONResponse(gw.status())

    @app.get("/control")
    async def control_state() -> JSONResponse:
        return JSONResponse(gw.control.state())

    @app.post("/control/{command}")
    async def control(command: str, request: Request, target: str | None = None) -> JSONResponse:
        token = settings.control_token.get_secret_value()
        if not token:
            return _json_error(403, "control is disabled: set FLYWHEEL_GATEWAY_CONTROL_TOKEN on the gateway")
        auth = request.headers.get("authorization", "")
        scheme, _, given = auth.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token.encode()):
            return JSONResponse({"error": "missing or wrong token: send 'Authorization: Bearer <token>'"},
                                status_code=401, headers={"WWW-Authenticate": "Bearer"})
        raw = await request.body()
        if len(raw) > 16 * 1024:
            return _json_error(413, "request body over 16 KiB")
        args: Any = {}
        if raw.strip():
            try:
                args = await request.json()
            except ValueError:
                return _json_error(400, "body must be a JSON object of command arguments")
        if not isinstance(args, dict):
            return _json_error(400, "body must be a JSON object of command arguments")
        try:
            msg = gw.control.issue(command, target, args)
        except CommandError as exc:
            status_code = 404 if isinstance(exc, UnknownCommand) else 422
            return _json_error(status_code, f"{command[:40]}: {exc}")
        await gw.publish(msg)
        return JSONResponse({"seq": msg.seq, "command": msg.command, "target": msg.target, "args": msg.args},
                            status_code=202)

    return app
