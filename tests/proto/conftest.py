"""Proto test setup: a connected pair of sockets, as the services receive messages (zmq.Frame objects)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import zmq


@pytest.fixture(scope="module")
def pair() -> Iterator[tuple[zmq.Socket, zmq.Socket]]:
    """Two PAIR sockets joined over inproc: send on the first, receive on the second (one pair per test module)."""
    ctx = zmq.Context()
    a, b = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    a.bind("inproc://proto-pair")
    b.connect("inproc://proto-pair")
    yield a, b
    a.close(0)
    b.close(0)
    ctx.term()
