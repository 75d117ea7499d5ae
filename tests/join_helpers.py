"""A join document served at /join by a real HTTP server on the loopback, the keys of the run an actor joins, and
the settings ``flywheel actor --join`` takes: shared by tests/test_remote.py and tests/test_join_trust.py."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from flywheel.cli import build_parser, main
from flywheel.launch import remote
from flywheel.launch.registry import settings_class
from flywheel.settings import settings_from_args


@dataclass
class Served:
    """What the loopback server answers at /join: a document (or raw bytes), a status and headers; and the count."""

    url: str
    document: dict[str, Any] = field(default_factory=dict)
    body: bytes | None = None
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    requests: int = 0


@contextmanager
def serving() -> Iterator[Served]:
    """The server, up for the block: it answers what the Served it yields says when asked, 404 off /join."""
    state = Served("")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            state.requests += 1
            body = state.body if state.body is not None else json.dumps(state.document).encode()
            self.send_response(state.status if self.path == "/join" else 404)
            for name, value in {"Content-Type": "application/json", **state.headers}.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


def run_keys(folder: Path) -> Path:
    """The run's keys (flywheel keys generate, in this process), with a client folder clients/far for the joining
    host."""
    assert main(["keys", "generate", str(folder), "--client", "far"]) == 0
    return folder


def joined_actor(argv: list[str], keys: Path | None) -> Any:
    """``flywheel actor ARGV``'s settings, with the client folder ``keys/clients/far`` when given."""
    own = ["--curve-keys-dir", str(keys / "clients" / "far")] if keys is not None else []
    args = build_parser().parse_args(["actor", *argv, *own])
    settings = settings_from_args(settings_class("actor"), args, "actor")
    return remote.joined_settings(settings, args, "actor")
