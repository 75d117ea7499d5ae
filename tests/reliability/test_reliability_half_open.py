"""A publisher whose connection goes silent without a FIN (a killed container, a dropped network): the subscriber's
ZMTP heartbeats end the dead connection and it reconnects; without heartbeats it waits for ever. A real PUB/SUB
pair on loopback, through a TCP relay of the test's own that can freeze its open connections."""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Iterator

import pytest
import zmq

from flywheel.transport import subscriber


class FreezingRelay:
    """Forwards TCP connections from its port to ``target``; ``freeze`` stops the open ones dead (no FIN, nothing
    forwarded, nothing read), while new connections are forwarded as before."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.generation = 0  # connections of an older generation are frozen
        self.accepted = 0
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()
        self.held: list[socket.socket] = []

    def _accept(self) -> None:
        self.listener.settimeout(0.1)
        while not self.stop.is_set():
            try:
                client, _ = self.listener.accept()
            except TimeoutError:
                continue
            upstream = socket.create_connection(self.target)
            self.held += [client, upstream]
            self.accepted += 1
            thread = threading.Thread(target=self._pump, args=(client, upstream, self.generation), daemon=True)
            thread.start()
            self.threads.append(thread)

    def _pump(self, a: socket.socket, b: socket.socket, generation: int) -> None:
        while not self.stop.is_set() and generation == self.generation:
            ready, _, _ = select.select([a, b], [], [], 0.05)
            for src in ready:
                data = src.recv(65536)
                if not data:
                    return
                (b if src is a else a).sendall(data)

    def freeze(self) -> None:
        self.generation += 1

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=2)
        for sock in [self.listener, *self.held]:
            sock.close()


@pytest.fixture
def pub() -> Iterator[tuple[zmq.Socket, int]]:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUB)
    sock.setsockopt(zmq.LINGER, 0)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    yield sock, port
    ctx.destroy(linger=0)


def received_within(sub: zmq.Socket, pub: zmq.Socket, seconds: float) -> int:
    """Publish every 50 ms for ``seconds`` and count what the subscriber got."""
    got = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        pub.send(b"weights")
        while sub.poll(50):
            sub.recv()
            got += 1
    return got


@pytest.mark.timeout(60)
@pytest.mark.parametrize("heartbeat", [True, False])
def test_a_silent_publisher_connection_is_dropped_and_renewed_by_heartbeats(pub: tuple[zmq.Socket, int],
                                                                           heartbeat: bool) -> None:
    publisher, port = pub
    relay = FreezingRelay(("127.0.0.1", port))
    ctx = zmq.Context()
    try:
        sub = subscriber(ctx, f"tcp://127.0.0.1:{relay.port}", heartbeat_ivl_ms=200 if heartbeat else 0,
                         heartbeat_timeout_ms=1_000)
        assert received_within(sub, publisher, 2.0) > 0  # flowing through the relay
        relay.freeze()  # the publisher's side of the connection vanishes silently
        time.sleep(0.2)
        after = received_within(sub, publisher, 4.0)
        if heartbeat:
            assert relay.accepted >= 2 and after > 0  # the dead connection ended; a new one carries messages
        else:
            assert relay.accepted == 1 and after == 0  # without heartbeats it waits on the dead one for ever
    finally:
        ctx.destroy(linger=0)
        relay.close()
