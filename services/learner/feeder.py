"""The learner's I/O thread: batches arrive, decoded, checked and staged on the device while the GPU/CPU trains.

The update loop never touches a socket: it takes ready batches and control commands from one queue and
hands priorities back; this thread keeps the sample requests in flight and sends the priorities once their
device->host copies have landed.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import zmq

from flywheel import proto
from flywheel.transport import ControlSubscriber, FaultCounter

from .core import BadBatch, finite_priorities
from .sampling import SampleClient
from .staging import DeviceBatch, HostCopy

log = logging.getLogger("flywheel.learner")
IDLE_POLL_MS = 100
PRIORITY_POLL_MS = 2  # while priorities wait for their device->host copy


@dataclass
class ReadyBatch:
    """A checked batch: the decoded message (indices, replay size) and its tensors on the learner's device."""

    msg: proto.SampleBatch
    tensors: DeviceBatch


class Feeder:
    """Owns the sampling client and the control subscriber in one thread; ``events`` yields what arrived.

    ``events`` holds ``ReadyBatch`` and ``proto.Control`` items. Up to ``in_flight`` requests are outstanding,
    and requested plus received-but-not-yet-``taken`` batches never exceed ``2 * in_flight``: the update loop
    always has a batch ready while the next ones travel. ``beta`` and ``paused`` are set by the update loop;
    plain attribute writes are safe across threads.
    """

    def __init__(self, ctx: zmq.Context, client: SampleClient, control: ControlSubscriber, faults: FaultCounter,
                 *, check: Callable[[proto.SampleBatch], None], stage: Callable[[proto.SampleBatch], DeviceBatch],
                 beta: float) -> None:
        self.client, self.control, self.faults = client, control, faults
        # the update loop's doorbell: one byte per trained batch wakes this thread to top up and send priorities
        address = f"inproc://learner-feeder-{id(self)}"
        self._bell_rx = ctx.socket(zmq.PAIR)
        self._bell_rx.setsockopt(zmq.LINGER, 0)
        self._bell_rx.bind(address)
        self._bell_tx = ctx.socket(zmq.PAIR)
        self._bell_tx.setsockopt(zmq.LINGER, 0)
        self._bell_tx.setsockopt(zmq.SNDHWM, 16)
        self._bell_tx.connect(address)
        self.check, self.stage = check, stage
        self.events: queue.SimpleQueue[ReadyBatch | proto.Control] = queue.SimpleQueue()
        self.beta = beta
        self.paused = False
        self.delivered = 0  # written by this thread only
        self.taken = 0  # written by the update loop only
        self._priorities: deque[tuple[np.ndarray, HostCopy]] = deque()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="learner-feeder", daemon=True)
        self.error: BaseException | None = None

    def start(self) -> None:
        self._thread.start()

    def done(self, index: np.ndarray, copy: HostCopy) -> None:
        """The update loop trained on one delivered batch: send its |TD| priorities once the copy has landed.

        The thread is woken only when no reply is on its way (one would wake it anyway) and half the buffered
        batches are used up, so it then sends ``in_flight`` requests at once: waking a thread costs a context switch,
        which on a busy machine can cost the update loop its time slice. ``taken`` is counted before
        ``outstanding`` is read, so a wake-up is never lost.
        """
        self._priorities.append((index, copy))
        self.taken += 1
        if self.client.outstanding == 0 and self.delivered - self.taken <= self.client.in_flight:
            self.ring()

    def ring(self) -> None:
        """Wake the thread (it then tops up requests and sends priorities); a full bell is already ringing."""
        try:
            self._bell_tx.send(b"", zmq.NOBLOCK)
        except zmq.Again:
            pass

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        """Stop the thread after it has sent every queued priority update; the sockets are then free to close."""
        self._stop.set()
        if self._thread.is_alive():
            self.ring()
            self._thread.join(timeout=30)
        if not self._thread.is_alive():
            self._bell_rx.close(0)
            self._bell_tx.close(0)

    # ---- the thread -----------------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._loop()
        except BaseException as exc:  # surfaced by the update loop, which stops with a clear error
            self.error = exc
            log.exception("learner: the sampling thread failed")
        finally:
            self._flush_priorities(wait=True)

    def _loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self.client.sock, zmq.POLLIN)
        poller.register(self.control.sock, zmq.POLLIN)
        poller.register(self._bell_rx, zmq.POLLIN)
        while not self._stop.is_set():
            if not self.paused:
                self.client.top_up(self.beta, self._request_limit())
            waiting_copy = bool(self._priorities) and not self._priorities[0][1].ready()  # GPU copy in flight
            timeout = PRIORITY_POLL_MS if waiting_copy else IDLE_POLL_MS
            events = dict(poller.poll(timeout))
            if self._bell_rx in events:
                self._drain_bell()
            if self.control.sock in events:
                for command in self.control.drain():
                    self.events.put(command)
            if self.client.sock in events:
                self._take_batches()
            self._flush_priorities(wait=False)
            if not self.paused:
                self.client.resend_stale(time.monotonic(), self.beta, self._request_limit())

    def _request_limit(self) -> int:
        """How many requests may be outstanding now: 2 * in_flight minus the batches waiting to be trained on."""
        return 2 * self.client.in_flight - (self.delivered - self.taken)

    def _drain_bell(self) -> None:
        while True:
            try:
                self._bell_rx.recv(zmq.NOBLOCK)
            except zmq.Again:
                return

    def _take_batches(self) -> None:
        while True:
            batch = self.client.receive()
            if batch is None:
                return
            try:
                self.check(batch)
            except BadBatch as exc:
                self.faults.record("sample", exc)
                continue
            self.delivered += 1
            self.events.put(ReadyBatch(batch, self.stage(batch)))

    def _flush_priorities(self, *, wait: bool) -> None:
        while self._priorities and (wait or self._priorities[0][1].ready()):
            index, copy = self._priorities.popleft()
            copy.wait()
            self.client.send_priorities(index, finite_priorities(copy.numpy()["p"]))
