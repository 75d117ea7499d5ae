"""The gateway's HTTP server parts: a listening socket bound with a one-line error, and uvicorn's server class."""

from __future__ import annotations

import socket
from types import FrameType

from flywheel.transport import EndpointInUse


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


def inherited_socket(fd: int) -> socket.socket:
    """The listening TCP socket a parent passed down as file descriptor ``fd`` (flywheel run binds it once)."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError as exc:
        raise EndpointInUse(f"FLYWHEEL_GATEWAY_HTTP_FD={fd} is not an open socket: {exc.strerror}") from None
    if sock.type != socket.SOCK_STREAM or not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
        sock.detach()
        raise EndpointInUse(f"FLYWHEEL_GATEWAY_HTTP_FD={fd} is not a listening TCP socket")
    return sock


def server_class() -> type:
    """uvicorn.Server that exits 0 after a graceful SIGINT/SIGTERM shutdown, like every service."""
    import uvicorn

    class Server(uvicorn.Server):
        """uvicorn re-raises SIGINT/SIGTERM after a graceful shutdown; a clean stop exits 0 like every service."""

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            super().handle_exit(sig, frame)
            captured = getattr(self, "_captured_signals", None)
            if isinstance(captured, list):
                captured.clear()

    return Server
