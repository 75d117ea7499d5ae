"""The transport's ceiling for the replay's TCP rows: ZeroMQ alone moving batch-sized replies over loopback.

A ROUTER answers each request with one prebuilt buffer of a whole batch's bytes (no sampling, no encoding) and a
DEALER keeps ``inflight`` requests out and receives without copying (no decoding), both processes pinned to the
same cores as the replay and its client. What this moves per second bounds any sampler over the same socket pair.
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np
import zmq

from flywheel.bench.peers.cpu_clock import SideClock
from flywheel.bench.peers.replay_harness import SPAWN, spawned_result


def _server_main(endpoint_out: Any, nbytes: int, cpus: list[int], stop: Any) -> None:
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind("tcp://127.0.0.1:0")
    endpoint_out.put(sock.getsockopt_string(zmq.LAST_ENDPOINT))
    payload = np.random.default_rng(0).integers(0, 256, nbytes, dtype=np.uint8)  # resident before the first reply
    header = b"batch"
    while not stop.is_set():
        if not sock.poll(100):
            continue
        identity, _request = sock.recv_multipart()
        sock.send_multipart([identity, header, payload.data], copy=False)
    sock.close(0)
    ctx.term()


def _client_main(endpoint: str, nbytes: int, seconds: float, cpus: list[int], inflight: int, server_pid: int,
                 result: Any) -> None:
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    for _ in range(inflight):
        sock.send(b"r")
    for _ in range(3):  # warm up: connection, buffers
        frames = sock.recv_multipart(copy=False)
        sock.send(b"r")
    clock = SideClock([os.getpid(), server_pid])
    count = 0
    start = time.monotonic()
    clock.start()
    while time.monotonic() - start < seconds:
        frames = sock.recv_multipart(copy=False)
        if len(frames[1].buffer) != nbytes:
            raise SystemExit(f"a reply of {len(frames[1].buffer)} bytes, expected {nbytes}")
        count += 1
        sock.send(b"r")
    result.put(clock.rates(count) | {"shm": 0, "tcp": count})
    sock.close(0)
    ctx.term()


def zmq_ceiling_run(nbytes: int, seconds: float, cpus: list[int], inflight: int = 4) -> dict[str, Any]:
    """Replies of ``nbytes`` per second and per CPU-second of both processes, over ``seconds``."""
    endpoint_out, stop = SPAWN.Queue(), SPAWN.Event()
    server = SPAWN.Process(target=_server_main, args=(endpoint_out, nbytes, cpus, stop), daemon=True)
    server.start()
    try:
        endpoint = endpoint_out.get(timeout=60)
        return spawned_result(_client_main, lambda result: (endpoint, nbytes, seconds, cpus, inflight, server.pid,
                                                            result), seconds + 120, "ZeroMQ ceiling client")
    finally:
        stop.set()
        server.join(30)
        if server.is_alive():
            server.kill()
