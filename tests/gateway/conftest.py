"""Fixtures for the gateway tests: a running gateway app (real ZeroMQ sockets) and a ZeroMQ context."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import zmq
from fastapi.testclient import TestClient
from gateway_helpers import TOKEN

from flywheel.services.gateway.app import GatewayService, create_app
from flywheel.services.gateway.settings import GatewaySettings


def gateway_settings(**overrides: object) -> GatewaySettings:
    values: dict[str, object] = dict(
        instance="gw-test", telemetry_endpoint="tcp://127.0.0.1:*", control_endpoint="tcp://127.0.0.1:*",
        lease_endpoint="tcp://127.0.0.1:*", control_token=TOKEN, control_repeat_s=0.05, stale_after_s=30,
        forget_after_s=600, sweep_interval_s=0.05, history_interval_s=0.05,
    )
    values.update(overrides)
    return GatewaySettings(**values)


@pytest.fixture
def gateway() -> Iterator[tuple[TestClient, GatewayService]]:
    settings = gateway_settings()
    service = GatewayService(settings)
    with TestClient(create_app(settings, service)) as client:
        yield client, service
    assert service.telemetry_sock is None  # the lifespan closed the sockets


@pytest.fixture
def zctx() -> Iterator[zmq.Context]:
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)
