"""The gateway's receive loops never stall: a wakeup the event loop misses costs a second, a fault of ours one message.

pyzmq's asyncio sockets wake on an edge-triggered file descriptor; anything that reads the socket's events outside
the event loop (here a second handle on the same socket, as libzmq's own ``getsockopt(ZMQ_EVENTS)`` does) can eat
the edge, and a receive waiting on it would then wait until the next message, or forever. Real sockets throughout.
"""

from __future__ import annotations

import asyncio
import time

import pytest
import zmq
import zmq.asyncio
from conftest import gateway_settings
from fastapi.testclient import TestClient
from gateway_helpers import check_exposition, tel, wait_for

from flywheel import proto
from flywheel.services.gateway.app import GatewayService, create_app
from flywheel.services.gateway.transport import RECEIVE_RECHECK_S
from flywheel.transport import make_socket, receive_async


def test_a_receive_that_times_out_raises_again_and_loses_nothing() -> None:
    async def main() -> tuple[bool, bytes]:
        ctx = zmq.asyncio.Context()
        pull = make_socket(ctx, zmq.PULL)
        port = pull.bind_to_random_port("tcp://127.0.0.1")
        push = zmq.Context.instance().socket(zmq.PUSH)
        push.connect(f"tcp://127.0.0.1:{port}")
        try:
            try:
                await receive_async(pull, 0.05)  # type: ignore[arg-type]
                timed_out = False
            except zmq.Again:
                timed_out = True
            push.send(b"after the timeout")
            frames = await receive_async(pull, 5.0)  # type: ignore[arg-type]
            return timed_out, frames[0].bytes
        finally:
            push.close(0)
            pull.close(0)
            ctx.term()

    assert asyncio.run(main()) == (True, b"after the timeout")


def test_a_message_whose_wakeup_was_eaten_is_taken_within_the_recheck() -> None:
    async def main() -> tuple[float, int, int]:
        service = GatewayService(gateway_settings())
        await service.start()
        assert service.telemetry_sock is not None
        push = zmq.Context.instance().socket(zmq.PUSH)
        push.connect(service.endpoints["telemetry"])
        other_handle = zmq.Socket.shadow(service.telemetry_sock.underlying)  # reads events outside the loop
        try:
            push.send_multipart(proto.encode(tel(instance="first")))
            while service.registry.received < 1:  # the loop took the first one normally and waits again
                await asyncio.sleep(0.01)
            push.send_multipart(proto.encode(tel(instance="second")))
            deadline = time.monotonic() + 5
            while not other_handle.get(zmq.EVENTS) & zmq.POLLIN:  # the edge is eaten here, before the loop runs
                assert time.monotonic() < deadline, "the second message never reached the gateway's socket"
                time.sleep(0.01)
            sent = time.monotonic()
            while service.registry.received < 2 and time.monotonic() - sent < 10 * RECEIVE_RECHECK_S:
                await asyncio.sleep(0.01)
            return time.monotonic() - sent, service.registry.received, service.missed_wakeups
        finally:
            push.close(0)
            await service.stop()

    waited, received, missed = asyncio.run(main())
    assert received == 2, f"the second report was never taken ({waited:.1f} s)"
    assert waited < 3 * RECEIVE_RECHECK_S and missed == 1, (waited, missed)


def test_a_report_whose_handling_raises_is_logged_and_the_loop_goes_on(zctx: zmq.Context,
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    settings = gateway_settings()
    service = GatewayService(settings)
    update = service.registry.update

    def update_or_fail(msg: proto.Telemetry) -> object:
        if msg.instance == "boom":
            raise RuntimeError("a bug in the gateway, not in the report")
        return update(msg)

    service.registry.update = update_or_fail  # type: ignore[method-assign]
    with TestClient(create_app(settings, service)) as client:
        push = zctx.socket(zmq.PUSH)
        push.connect(service.endpoints["telemetry"])
        for instance in ("boom", "after"):
            push.send_multipart(proto.encode(tel(instance=instance)))
        wait_for(lambda: service.registry.received == 1, what="the report after the failing one")
        push.close(0)
        assert client.get("/healthz").json() == {"ok": True, "detail": "ok"}
        status = client.get("/status").json()
        assert status["gateway"]["internal_errors"] == 1 and status["services"]["actor"]["up"] == 1
        text = client.get("/metrics").text
        check_exposition(text)
        assert 'flywheel_gateway_internal_errors_total{service="gateway",instance="gw-test"} 1' in text
    assert any("could not be handled" in r.getMessage() and r.exc_info for r in caplog.records)
