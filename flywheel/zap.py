"""The ZAP handler (RFC 27) of a process's CURVE servers: which clients pass, and the handshakes refused."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping

import zmq
import zmq.utils.z85

log = logging.getLogger("flywheel.security")
ZAP_ENDPOINT = "inproc://zeromq.zap.01"
# The ZAP domain of sockets that read their peers' identity: their CURVE clients get the authorized key's name as
# ZeroMQ's User-Id (``zmq.Frame.get("User-Id")``). Only there: with a user id, a CURVE PULL socket of libzmq 4.3.5
# at RCVHWM 1 (the replay's transitions under the vector preset) receives nothing at all (0 of 20 messages; 20 of
# 20 at RCVHWM 2 and above: tests/reliability/test_reliability_identity.py), as if the credential libzmq queues
# with the first message took the pipe's only slot for good. Every other socket keeps an empty user id.
IDENTITY_DOMAIN = b"flywheel-identity"
_handlers: dict[int, ZapHandler] = {}
_lock = threading.Lock()


def refused_counts() -> dict[str, int]:
    """CURVE handshakes this process's servers refused, by reason (unauthorized_key, protocol, other)."""
    counts: dict[str, int] = {}
    for handler in list(_handlers.values()):
        for reason, count in handler.refused.items():
            counts[reason] = counts.get(reason, 0) + count
    return counts


_FAILED: dict[int, str] = {zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL: "protocol",
                           zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL: "other"}


class ZapHandler:
    """Answers one context's ZAP requests (RFC 27) and counts the handshakes its CURVE servers refuse.

    A CURVE client with an authorized key passes; any other is refused (``unauthorized_key``). On sockets of the
    ``IDENTITY_DOMAIN`` the reply names the key (``names``: its file name under authorized/, or ``key:`` and its
    first 8 characters for one given without a name) as the connection's User-Id. Plain (NULL) connections pass
    with no user id: only ipc and inproc sockets use them. Clients that do not even speak CURVE with the
    servers' key fail before ZAP is asked; socket monitors count those (``protocol``, ``other``). Bytes that are
    not ZMTP at all are cut by libzmq without an event, so they are not counted. The thread ends when the
    context is terminated, so services need no extra shutdown step.
    """

    def __init__(self, ctx: zmq.Context, authorized: frozenset[bytes],
                 names: Mapping[bytes, str] | None = None) -> None:
        self.authorized = authorized
        self.names = dict(names or {})
        self.refused: dict[str, int] = {"unauthorized_key": 0, "protocol": 0, "other": 0}
        self.accepted = 0
        self._logged: set[object] = set()
        # a plain context even when ``ctx`` is an asyncio one
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.shadow(ctx.underlying)
        self.sock = self._ctx.socket(zmq.REP)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(ZAP_ENDPOINT)
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
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        monitors: list[zmq.Socket] = []
        try:
            while True:
                with self._watch_lock:
                    fresh = self._watch[len(monitors):]
                for address in fresh:
                    mon = self._ctx.socket(zmq.PAIR)
                    mon.setsockopt(zmq.LINGER, 0)
                    mon.connect(address)
                    poller.register(mon, zmq.POLLIN)
                    monitors.append(mon)
                try:
                    events = dict(poller.poll(1000))
                    if self.sock in events:
                        request = self.sock.recv_multipart()
                        try:
                            reply = self.answer(request)
                        except Exception as exc:  # a refusal, never a dead handler (every handshake would hang)
                            log.exception("ZAP handler: refusing a request it could not answer: %s", exc)
                            reply = [b"1.0", request[1] if len(request) > 1 else b"", b"500", b"internal error",
                                     b"", b""]
                        self.sock.send_multipart(reply)
                    for mon in monitors:
                        if mon in events:
                            self._monitor_event(mon.recv_multipart())
                except zmq.ContextTerminated:
                    return
                except zmq.ZMQError as exc:
                    log.error("ZAP handler stopped: %s", exc)
                    return
        finally:
            for sock in (self.sock, *monitors):
                sock.close(0)

    def _monitor_event(self, frames: list[bytes]) -> None:
        from zmq.utils.monitor import parse_monitor_message

        try:
            event = parse_monitor_message(frames)
        except (ValueError, TypeError, IndexError):
            return
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

    def answer(self, frames: list[bytes]) -> list[bytes]:
        if len(frames) < 6 or frames[0] != b"1.0":
            request_id = frames[1] if len(frames) > 1 else b""
            return [b"1.0", request_id, b"500", b"malformed ZAP request", b"", b""]
        request_id, domain, address, mechanism, credentials = frames[1], frames[2], frames[3], frames[5], frames[6:]
        if mechanism == b"NULL":
            return [b"1.0", request_id, b"200", b"OK", b"", b""]
        key = zmq.utils.z85.encode(credentials[0]) if mechanism == b"CURVE" and credentials else b""
        if key and key in self.authorized:
            self.accepted += 1
            user = self.user_id(key) if domain == IDENTITY_DOMAIN else b""  # see IDENTITY_DOMAIN: never elsewhere
            return [b"1.0", request_id, b"200", b"OK", user, b""]
        self.refused["unauthorized_key"] += 1
        if key not in self._logged and len(self._logged) < 1024:
            self._logged.add(key)
            log.warning("refused a %s client from %s (domain %s, key %s...): not an authorized key; further "
                        "refusals of this key are only counted", mechanism.decode(errors="replace"),
                        address.decode(errors="replace"), domain.decode(errors="replace"),
                        key[:8].decode(errors="replace") or "none")
        return [b"1.0", request_id, b"400", b"client key not authorized", b"", b""]


    def user_id(self, key: bytes) -> bytes:
        """An authorized key's name: its file name under authorized/, or ``key:`` and its first 8 characters."""
        return self.names.get(key, "").encode() or b"key:" + key[:8]


def start_zap_handler(ctx: zmq.Context, authorized: frozenset[bytes],
                      names: Mapping[bytes, str] | None = None) -> ZapHandler:
    """The context's handler, started on first use (before any CURVE server socket binds)."""
    with _lock:
        handler = _handlers.get(ctx.underlying)
        if handler is None or not handler.thread.is_alive():
            handler = ZapHandler(ctx, authorized, names)
            _handlers[ctx.underlying] = handler
        return handler
