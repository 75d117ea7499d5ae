"""The ZAP handler (RFC 27) of a process's CURVE servers: pyzmq's Authenticator with Flywheel's keys and counts.

pyzmq's ``zmq.auth.Authenticator`` answers the CURVE requests: an authorized key passes through the credentials
callback registered for each of Flywheel's domains (``callback``), and ``curve_user_id`` names it. What is ours,
and why:

- the thread. ``zmq.auth.thread.ThreadAuthenticator`` must be ``stop()``-ped before its context is terminated:
  otherwise its thread dies with ContextTerminated and leaves its ZAP socket open, so ``ctx.term()`` hangs. Ours
  ends with the context (services and tests need no extra shutdown step), and it also reads the socket monitors
  that count handshakes refused before ZAP is asked (no CURVE, or the wrong server key), which ZAP never sees;
- NULL requests (plain binds of a socket with a ZAP domain) pass with no User-Id, where pyzmq names them
  "anonymous": ``flywheel.security.key_role`` would take that for an actor's key, and see IDENTITY_DOMAIN;
- PLAIN and GSSAPI are refused (pyzmq passes any GSSAPI client), and a request that cannot be answered gets a
  refusal, never a dead handler (every later handshake would hang).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Mapping
from typing import Any

import zmq
import zmq.utils.z85
from zmq.auth.base import VERSION, Authenticator

log = logging.getLogger("flywheel.security")
ZAP_ENDPOINT = "inproc://zeromq.zap.01"
ZAP_DOMAIN = b"flywheel"  # the ZAP domain of every CURVE server socket but the IDENTITY_DOMAIN ones
# The ZAP domain of sockets that read their peers' identity: their CURVE clients get the authorized key's name as
# ZeroMQ's User-Id (``zmq.Frame.get("User-Id")``). Only there: with a user id, a CURVE PULL socket of libzmq 4.3.5
# at RCVHWM 1 (the replay's transitions under the vector preset) receives nothing at all (0 of 20 messages; 20 of
# 20 at RCVHWM 2 and above: tests/reliability/test_reliability_identity.py), as if the credential libzmq queues
# with the first message took the pipe's only slot for good. Every other socket keeps an empty user id.
IDENTITY_DOMAIN = b"flywheel-identity"
# the domains the handler answers ("*": a socket without one); pyzmq refuses any other as "Unknown domain"
DOMAINS = ("*", ZAP_DOMAIN.decode(), IDENTITY_DOMAIN.decode())
_handlers: dict[int, ZapHandler] = {}
_lock = threading.Lock()


def refused_counts() -> dict[str, int]:
    """CURVE handshakes this process's servers refused, by reason (unauthorized_key, protocol, other)."""
    counts: dict[str, int] = {}
    for handler in list(_handlers.values()):
        for reason, count in handler.refused.items():
            counts[reason] = counts.get(reason, 0) + count
    return counts


def handshake_failed(ctx: zmq.Context, event: Mapping[str, Any]) -> None:
    """Count a refused handshake seen by a monitor the socket's owner reads (``flywheel.connections``)."""
    handler = _handlers.get(ctx.underlying)
    if handler is not None:
        handler.count_failure(event)


_FAILED: dict[int, str] = {zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "protocol",
                           zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: "other"}


class ZapHandler(Authenticator):
    """Answers one context's ZAP requests and counts the handshakes its CURVE servers refuse.

    A CURVE client with an authorized key passes; any other is refused (``unauthorized_key``). On sockets of the
    ``IDENTITY_DOMAIN`` the reply names the key (``names``: its file name under authorized/, or ``key:`` and its
    first 8 characters for one given without a name) as the connection's User-Id. Plain (NULL) connections pass
    with no user id: only ipc and inproc sockets use them. Clients that do not even speak CURVE with the
    servers' key fail before ZAP is asked; socket monitors count those (``protocol``, ``other``). Bytes that are
    not ZMTP at all are cut by libzmq without an event, so they are not counted. The keys are the ones given at
    start (a service restarts to take new ones). The thread ends when the context is terminated.
    """

    def __init__(self, ctx: zmq.Context, authorized: frozenset[bytes],
                 names: Mapping[bytes, str] | None = None) -> None:
        # a plain context even when ``ctx`` is an asyncio one; its sockets are this thread's (ctx.destroy skips them)
        super().__init__(zmq.Context.shadow(ctx.underlying), log=log)
        self.authorized = authorized
        self.names = dict(names or {})
        self.refused: dict[str, int] = {"unauthorized_key": 0, "protocol": 0, "other": 0}
        self.accepted = 0
        self._logged: set[object] = set()
        self._request: tuple[bytes, bytes] = (b"", b"")  # the domain and address of the request being answered
        for domain in DOMAINS:
            self.configure_curve_callback(domain, self)
        self.start()  # pyzmq's: binds the REP socket at ZAP_ENDPOINT
        self.zap_socket.setsockopt(zmq.LINGER, 0)
        self._watch: list[str] = []
        self._watch_lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, name="zap-handler", daemon=True)
        self.thread.start()

    def watch(self, sock: zmq.Socket) -> None:
        """Count the handshakes ``sock`` refuses (picked up by the thread within a second)."""
        address = f"inproc://flywheel-curve-monitor-{id(self)}-{len(self._watch)}"
        sock.monitor(address, zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
        with self._watch_lock:
            self._watch.append(address)

    def _run(self) -> None:
        loop = asyncio.new_event_loop()  # runs pyzmq's handle_zap_message, a coroutine that never waits here
        poller = zmq.Poller()
        poller.register(self.zap_socket, zmq.POLLIN)
        monitors: list[zmq.Socket] = []
        try:
            while True:
                with self._watch_lock:
                    fresh = self._watch[len(monitors):]
                try:
                    for address in fresh:  # the context may end while a socket was being watched
                        mon = self.context.socket(zmq.PAIR)
                        mon.setsockopt(zmq.LINGER, 0)
                        mon.connect(address)
                        poller.register(mon, zmq.POLLIN)
                        monitors.append(mon)
                    events = dict(poller.poll(1000))
                    if self.zap_socket in events:
                        request = self.zap_socket.recv_multipart()
                        try:
                            loop.run_until_complete(self.handle_zap_message(request))
                        except zmq.ContextTerminated:
                            raise
                        except Exception as exc:  # a refusal, never a dead handler (every handshake would hang)
                            log.exception("ZAP handler: refusing a request it could not answer: %s", exc)
                            self._reply(request[1] if len(request) > 1 else b"", b"500", b"internal error")
                    for mon in monitors:
                        if mon in events:
                            self._monitor_event(mon.recv_multipart())
                except zmq.ContextTerminated:
                    return
                except zmq.ZMQError as exc:
                    log.error("ZAP handler stopped: %s", exc)
                    return
        finally:
            loop.close()
            for sock in (self.zap_socket, *monitors):
                sock.close(0)

    def _monitor_event(self, frames: list[bytes]) -> None:
        from zmq.utils.monitor import parse_monitor_message

        try:
            event = parse_monitor_message(frames)
        except (ValueError, TypeError, IndexError):
            return
        self.count_failure(event)

    def count_failure(self, event: Mapping[str, Any]) -> None:
        """Count (and log the first of each reason) a monitor's handshake-failed event; other events are ignored."""
        reason = _FAILED.get(event["event"])
        if reason is None:
            return
        self.refused[reason] += 1
        if reason not in self._logged:
            self._logged.add(reason)
            log.warning("refused a peer on %s: handshake failed (%s: no CURVE, or the wrong server key); further "
                        "ones are only counted (curve_handshakes_refused_total)",
                        event["endpoint"].decode(errors="replace"),
                        zmq.Event(event["value"]).name if reason == "protocol" else f"errno {int(event['value'])}")

    def _reply(self, request_id: bytes, status: bytes, text: bytes) -> None:
        try:
            self.zap_socket.send_multipart([VERSION, request_id, status, text, b"", b""])
        except zmq.ContextTerminated:
            raise
        except zmq.ZMQError:  # already answered
            pass

    async def handle_zap_message(self, msg: list[bytes]) -> None:
        """Answer one request: NULL and malformed ones here, CURVE by pyzmq (``callback``, ``curve_user_id``)."""
        if len(msg) < 6 or msg[0] != VERSION:  # never from libzmq; pyzmq leaves one of under 2 frames unanswered
            self._reply(msg[1] if len(msg) > 1 else b"", b"500", b"malformed ZAP request")
        elif msg[5] == b"NULL":
            self._reply(msg[1], b"200", b"OK")  # no User-Id (pyzmq's would be "anonymous")
        elif msg[5] != b"CURVE":  # PLAIN or GSSAPI (pyzmq would pass any GSSAPI client): no server of ours uses them
            self.refused["unauthorized_key"] += 1
            self._reply(msg[1], b"400", b"CURVE only")
        else:
            self._request = (msg[2], msg[3])
            await super().handle_zap_message(msg)

    def callback(self, domain: str, key: bytes) -> bool:
        """pyzmq's credentials hook: whether the CURVE client key ``key`` (Z85) may connect; refusals counted."""
        if key in self.authorized:
            self.accepted += 1
            return True
        self.refused["unauthorized_key"] += 1
        if key not in self._logged and len(self._logged) < 1024:
            self._logged.add(key)
            log.warning("refused a CURVE client from %s (domain %s, key %s...): not an authorized key; further "
                        "refusals of this key are only counted", self._request[1].decode(errors="replace"),
                        domain, key[:8].decode(errors="replace") or "none")
        return False

    def curve_user_id(self, client_public_key: bytes) -> str:
        """An accepted key's User-Id: its name on IDENTITY_DOMAIN sockets (``user_id``), none elsewhere."""
        if self._request[0] != IDENTITY_DOMAIN:  # see IDENTITY_DOMAIN: never elsewhere
            return ""
        return self.user_id(zmq.utils.z85.encode(client_public_key))

    def user_id(self, key: bytes) -> str:
        """An authorized key's name: its file name under authorized/, or ``key:`` and its first 8 characters."""
        return self.names.get(key, "") or "key:" + key[:8].decode(errors="replace")


def start_zap_handler(ctx: zmq.Context, authorized: frozenset[bytes],
                      names: Mapping[bytes, str] | None = None) -> ZapHandler:
    """The context's handler, started on first use (before any CURVE server socket binds)."""
    with _lock:
        handler = _handlers.get(ctx.underlying)
        if handler is None or not handler.thread.is_alive():
            handler = ZapHandler(ctx, authorized, names)
            _handlers[ctx.underlying] = handler
        return handler
