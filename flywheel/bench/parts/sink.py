"""The actor benchmark's stand-in for the replay: a process that receives transition batches and discards them."""

from __future__ import annotations

import multiprocessing as mp
import os
from multiprocessing.connection import Connection

import zmq

from flywheel.bench.runner import BenchError


def _sink_main(conn: Connection, cpus: list[int]) -> None:
    """Receive and discard transition batches until the pipe says stop (runs in its own process)."""
    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus)
    zctx = zmq.Context()
    sock = zctx.socket(zmq.PULL)
    sock.bind("tcp://127.0.0.1:*")
    conn.send_bytes(sock.getsockopt_string(zmq.LAST_ENDPOINT).encode())
    poller = zmq.Poller()
    poller.register(sock, zmq.POLLIN)
    poller.register(conn.fileno(), zmq.POLLIN)
    messages = 0
    while True:
        events = dict(poller.poll(1000))
        if sock in events:
            sock.recv_multipart(copy=False)
            messages += 1
        if conn.fileno() in events:
            break
    conn.send_bytes(str(messages).encode())
    sock.close(0)
    zctx.term()


class Sink:
    """Replay's stand-in: a process with a PULL socket on TCP loopback that discards what it gets.

    It runs on the cores the actor is not pinned to (the same one if there is only one), so the
    actor pays for encoding and sending, and replay's receiving is not charged to it.
    """

    def __init__(self, actor_cpu: int | None) -> None:
        usable = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        actor = actor_cpu if actor_cpu is not None else (max(usable) if usable else None)
        others = [c for c in usable if c != actor] or usable
        mpctx = mp.get_context("spawn")
        self.conn, child = mpctx.Pipe()
        self.proc = mpctx.Process(target=_sink_main, args=(child, others), daemon=True, name="flywheel-bench-sink")
        self.proc.start()
        child.close()
        if not self.conn.poll(60):
            raise BenchError("the sink process did not start")
        self.endpoint = self.conn.recv_bytes().decode()
        self.messages = 0

    def close(self) -> None:
        try:
            self.conn.send_bytes(b"stop")
            if self.conn.poll(10):
                self.messages = int(self.conn.recv_bytes())
        except (OSError, EOFError):
            pass
        self.proc.join(5)
        if self.proc.is_alive():
            self.proc.terminate()
