"""Gateway entry point: wires GatewaySettings to the ZeroMQ side, the FastAPI app and the HTTP server."""

from __future__ import annotations

import logging
import sys

from flywheel.transport import EndpointInUse

from .settings import GatewaySettings

log = logging.getLogger("flywheel.gateway")


def _refuse(exc: Exception) -> int:
    print(f"error: flywheel gateway: {exc}", file=sys.stderr)
    return 2


def main(settings: GatewaySettings) -> int:
    import uvicorn

    from flywheel.tracking import TrackingUnavailable, require_wandb

    from .app import GatewayService, create_app
    from .auth import StartupError
    from .server import inherited_socket, listen_socket, server_class

    try:
        if settings.track:
            require_wandb()  # TrackingUnavailable: one line naming the extra to install
        service = GatewayService(settings)
        app = create_app(settings, service)  # refuses settings it must not start with (StartupError)
        http = (inherited_socket(settings.http_fd) if settings.http_fd >= 0
                else listen_socket(settings.http_host, settings.http_port))
    except (StartupError, EndpointInUse, TrackingUnavailable) as exc:
        return _refuse(exc)
    try:
        service.bind()
    except EndpointInUse as exc:
        http.close()
        return _refuse(exc)
    host, port = http.getsockname()[:2]
    log.info("HTTP on http://%s:%s (live page, metrics, status, healthz, control)", host, port)
    # log_config=None: uvicorn's lines go through the root handler flywheel.cli set up (text or JSON)
    server = server_class()(uvicorn.Config(app, log_level=settings.log_level.lower(), access_log=False,
                                           log_config=None))
    server.run(sockets=[http])
    return 0
