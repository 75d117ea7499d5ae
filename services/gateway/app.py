"""The gateway's HTTP API (FastAPI): /, /metrics, /status, /history, /healthz, /clip, /join and token-protected
/control, from the routers in ``api/routes``.

Every route is in the OpenAPI document (/openapi.json, /docs), with a response model per JSON route and a request
schema and examples per control command; every 4xx answer is JSON ``{"error": "<reason>"}``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from fastapi import FastAPI

from flywheel import __version__

from .api.errors import install_error_handling
from .api.main import api_router
from .auth import StartupError, startup_problem
from .curves_writer import write_curves
from .settings import GatewaySettings
from .transport import GatewayService
from .views import MetricsRenderer

__all__ = ["GatewayService", "create_app"]


def create_app(settings: GatewaySettings, service: GatewayService | None = None) -> FastAPI:
    """The FastAPI app; its lifespan binds (if not yet bound) and runs the gateway's ZeroMQ side."""
    gw = service or GatewayService(settings)
    problem = startup_problem(settings, gw.auth)
    if problem is not None:
        raise StartupError(problem)

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        await gw.start()
        if settings.curves_dir is not None:  # stopped with the gateway's other tasks (the last point at the stop)
            gw.tasks.append(asyncio.create_task(
                write_curves(gw, settings.curves_dir, settings.curves_interval_s), name="gateway-curves"))
        try:
            yield
        finally:
            await gw.stop()

    app = FastAPI(
        title="Flywheel gateway", version=__version__, lifespan=lifespan,
        description="Metrics, status and control of a Flywheel (distributed Ape-X DQN) system. POST /control/* "
                    "needs `Authorization: Bearer <token>` (FLYWHEEL_GATEWAY_CONTROL_TOKEN or _FILE); bodies are "
                    "JSON objects whatever the Content-Type.",
    )
    app.state.gateway, app.state.settings, app.state.metrics = gw, settings, MetricsRenderer(gw)
    install_error_handling(app, gw)
    app.include_router(api_router)
    return app
