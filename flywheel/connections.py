"""A bound socket's open connections, counted from its socket monitor (accepted and disconnected, by fd)."""

from __future__ import annotations

import itertools

import zmq
from zmq.utils.monitor import parse_monitor_message

from flywheel import security, zap

_EVENTS = (zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
           | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
_ids = itertools.count()


class ConnectionCount:
    """The connections a bound socket has open now, for its owner to read in its own thread (``poll``).

    Made before the socket binds. A socket has one monitor; this one takes it, and passes the handshakes a CURVE
    server refuses on to the process's ZAP handler (``flywheel.zap``), which would otherwise watch the socket
    itself. A connection counts from its accept (a CURVE peer before its handshake is done, too) to its
    disconnect; inproc connections make no monitor events, so ``count`` is None on a socket bound only there.
    """

    def __init__(self, sock: zmq.Socket) -> None:
        self.sock = sock
        self.open: set[int] = set()  # the file descriptors of the open connections
        self.accepted_total = 0
        address = f"inproc://flywheel-connections-{next(_ids)}"
        security.monitored_by_owner(sock)
        sock.monitor(address, _EVENTS)
        self.monitor = sock.context.socket(zmq.PAIR)
        self.monitor.setsockopt(zmq.LINGER, 0)
        self.monitor.connect(address)

    @property
    def count(self) -> int | None:
        """Open connections now (after ``poll``); None when the socket binds only inproc endpoints."""
        endpoint = self.sock.getsockopt_string(zmq.LAST_ENDPOINT)
        return None if endpoint.startswith("inproc://") else len(self.open)

    def poll(self) -> None:
        """Take the monitor's events so far (never waits)."""
        while self.monitor.poll(0):
            try:
                event = parse_monitor_message(self.monitor.recv_multipart())
            except (ValueError, TypeError, IndexError):
                continue
            kind, value = event["event"], int(event["value"])
            if kind == zmq.EVENT_ACCEPTED:
                self.open.add(value)
                self.accepted_total += 1
            elif kind == zmq.EVENT_DISCONNECTED:
                self.open.discard(value)
            else:
                zap.handshake_failed(self.sock.context, event)

    def close(self) -> None:
        """Stop the monitor and close its socket (before the monitored socket closes)."""
        try:
            self.sock.disable_monitor()
        except zmq.ZMQError:
            pass
        self.monitor.close(0)
