"""``python -m flywheel.services.gateway``: run the gateway (flags and FLYWHEEL_GATEWAY_* variables)."""

from __future__ import annotations

import argparse
import logging
import socket
import sys

from flywheel import security
from flywheel.settings import SettingsError, add_settings_flags, configure_logging, settings_from_args
from flywheel.transport import EndpointInUse

from .settings import GatewaySettings


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    parser = parser or argparse.ArgumentParser(
        prog="flywheel gateway", description="Telemetry, /metrics, /status and control for a Flywheel system.")
    add_settings_flags(parser, GatewaySettings)
    return parser


def listen_socket(host: str, port: int) -> socket.socket:
    """Bind the HTTP port ourselves so 'address in use' is one clear line, not a uvicorn traceback."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise EndpointInUse(
            f"cannot listen on {host}:{port} (gateway HTTP): {exc.strerror}; "
            "set FLYWHEEL_GATEWAY_HTTP_PORT / --http-port or FLYWHEEL_GATEWAY_HTTP_HOST / --http-host"
        ) from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def _server_class() -> type:
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn re-raises SIGINT/SIGTERM after a graceful shutdown; a clean stop exits 0 like every service."""

        def handle_exit(self, sig: int, frame: object) -> None:
            super().handle_exit(sig, frame)
            captured = getattr(self, "_captured_signals", None)
            if isinstance(captured, list):
                captured.clear()

    return Server


def run(settings: GatewaySettings) -> int:
    import uvicorn

    from .app import GatewayService, create_app
    from .auth import StartupError

    configure_logging("gateway", settings.log_level, settings.log_format, settings.instance)
    try:
        service = GatewayService(settings)
        app = create_app(settings, service)  # refuses settings it must not start with (StartupError)
        http = listen_socket(settings.http_host, settings.http_port)
    except (StartupError, EndpointInUse) as exc:
        print(f"error: flywheel gateway: {exc}", file=sys.stderr)
        return 2
    try:
        service.bind()
    except EndpointInUse as exc:
        http.close()
        print(f"error: flywheel gateway: {exc}", file=sys.stderr)
        return 2
    host, port = http.getsockname()[:2]
    logging.getLogger("flywheel.gateway").info("HTTP on http://%s:%s (live page, metrics, status, healthz, control)",
                                               host, port)
    # log_config=None: uvicorn's lines go through the root handler above (text or JSON), not its own
    server = _server_class()(uvicorn.Config(app, log_level=settings.log_level.lower(), access_log=False,
                                            log_config=None))
    server.run(sockets=[http])
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = settings_from_args(GatewaySettings, args, "gateway")
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:  # `flywheel gateway` does this in flywheel.cli; `python -m flywheel.services.gateway` here
        security.configure(security.keys_from_settings(settings, "gateway"))
    except security.CurveKeyError as exc:
        print(f"error: flywheel gateway: {exc}", file=sys.stderr)
        return 2
    return run(settings)


if __name__ == "__main__":
    sys.exit(main())
