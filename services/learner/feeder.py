"""The learner's I/O thread: batches arrive, decoded, checked and staged on the device while the GPU/CPU trains.

The update loop never touches a socket: it takes ready batches and control commands from one queue and
hands priorities back; this thread keeps the sample requests in flight and sends the priorities once their
device->host copies have landed.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import zmq

from flywheel import proto
from flywheel.services.replay.client import ReplayClient
from flywheel.transport import ControlSubscriber, FaultCounter

from .core import BadBatch, finite_priorities
from .staging import DeviceBatch, HostCopy

log = logging.getLogger("flywheel.learner")
IDLE_POLL_MS = 100
ROW_FIELDS = ("obs", "action", "reward", "discount", "next_obs", "index", "weight", "is_demo")


def spread_demos(batch: proto.SampleBatch, size: int) -> proto.SampleBatch:
    """Reorder a reply that holds demonstration rows (the replay puts them last) so that each consecutive
    ``size``-row training batch it is split into gets its share: part j takes rows j, j + k, j + 2k, ..."""
    rows = int(batch.action.shape[0])
    if batch.is_demo is None or rows <= size or not batch.is_demo.any():
        return batch
    parts = math.ceil(rows / size)
    order = np.concatenate([np.arange(j, rows, parts) for j in range(parts)])
    return dataclasses.replace(batch, **{name: getattr(batch, name)[order] for name in ROW_FIELDS})
PRIORITY_POLL_MS = 2  # while priorities wait for their device->host copy
MAX_COALESCED = 64  # batches' priorities sent in one PriorityUpdate at most


@dataclass
class SlotLease:
    """A shared-memory reply whose slot the staged tensors still read (CPU, no copy): handed back to the replay
    once every training batch split from it has been trained on and its priorities sent."""

    batch: proto.SampleBatch
    parts: int


@dataclass
class ReadyBatch:
    """One training batch, checked: its replay indices and replay size, its tensors on the device, and the lease
    of the shared-memory slot they are views of (None when they own their memory)."""

    index: np.ndarray
    replay_size: int
    tensors: DeviceBatch
    lease: SlotLease | None = None


class Feeder:
    """Owns the sampling client and the control subscriber in one thread; ``events`` yields what arrived.

    ``events`` holds ``ReadyBatch`` and ``proto.Command`` items; each reply of ``group * train_batch``
    transitions becomes ``group`` training batches. Up to ``in_flight`` requests are outstanding, and requests
    plus received-but-not-yet-``taken`` replies never exceed ``2 * in_flight``: the update loop always has a
    batch ready while the next ones travel. ``beta`` and ``paused`` are set by the update loop;
    plain attribute writes are safe across threads.
    """

    def __init__(self, ctx: zmq.Context, client: ReplayClient, control: ControlSubscriber, faults: FaultCounter,
                 *, check: Callable[[proto.SampleBatch], None], stage: Callable[..., DeviceBatch],
                 beta: float, train_batch: int, group: int = 1, hold_shared: bool = False) -> None:
        self.client, self.control, self.faults = client, control, faults
        # hold_shared: staging keeps views (CPU), so a shared-memory slot is handed back only after training on it
        self.hold_shared = hold_shared
        self.leases = 0  # shared-memory slots leased (written by the sampling side only)
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
        self.train_batch, self.group = train_batch, group  # each reply is split into `group` training batches
        self.events: queue.SimpleQueue[ReadyBatch | proto.Command] = queue.SimpleQueue()
        self.beta = beta
        self.paused = False
        self.delivered = 0  # written by this thread only
        self.taken = 0  # written by the update loop only
        self._priorities: deque[tuple[np.ndarray, HostCopy, SlotLease | None]] = deque()
        self._poller = zmq.Poller()
        for sock in (self.client.sock, self.control.sock, self._bell_rx):
            self._poller.register(sock, zmq.POLLIN)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def start(self) -> None:
        """Run in the sampling thread (one mode: the update loop only takes from ``events`` and calls ``done``)."""
        self._thread = threading.Thread(target=self._run, name="learner-feeder", daemon=True)
        self._thread.start()

    def done(self, index: np.ndarray, copy: HostCopy, lease: SlotLease | None = None) -> None:
        """The update loop trained on one delivered batch: send its |TD| priorities once the copy has landed.

        A thread is woken only when no reply is on its way (one would wake it anyway) and half the buffered
        batches are used up, so it then sends ``in_flight`` requests at once: waking a thread costs a context
        switch. ``taken`` is counted before ``outstanding`` is read, so a wake-up is never lost.
        """
        self._priorities.append((index, copy, lease))
        self.taken += 1
        if (self.client.outstanding == 0
                and self.delivered - self.taken <= self.client.inflight * self.group):
            self.ring()

    def ring(self) -> None:
        """Wake the thread (it then tops up requests and sends priorities); a full bell is already ringing."""
        try:
            self._bell_tx.send(b"", zmq.NOBLOCK)
        except zmq.Again:
            pass

    def stop(self) -> None:
        """Stop (joining the thread) after every queued priority update is sent; the sockets are then free."""
        self._stop.set()
        if self._thread is not None and self._thread.is_alive():
            self.ring()
            self._thread.join(timeout=30)
        elif self._thread is None:  # never started: send what was queued from here
            self._flush_priorities(wait=True)
        if self._thread is None or not self._thread.is_alive():
            self._release_untrained()
            self._bell_rx.close(0)
            self._bell_tx.close(0)

    def _release_untrained(self) -> None:
        """Hand back the slots of batches queued but never trained on (the update loop has stopped taking)."""
        leases: dict[int, SlotLease] = {}
        while True:
            try:
                item = self.events.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, ReadyBatch) and item.lease is not None:
                leases[id(item.lease)] = item.lease
        for lease in leases.values():
            self.client.release(lease.batch, refill=False)
            self.leases -= 1

    # ---- the work -------------------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                waiting_copy = bool(self._priorities) and not self._priorities[0][1].ready()  # GPU copy in flight
                self.pump(PRIORITY_POLL_MS if waiting_copy else IDLE_POLL_MS)
        except BaseException as exc:  # surfaced by the update loop, which stops with a clear error
            self.error = exc
            log.exception("learner: the sampling thread failed")
        finally:
            self._flush_priorities(wait=True)

    def pump(self, timeout_ms: int) -> None:
        """One turn of the sampling thread: top up requests, wait up to ``timeout_ms`` for replies or commands,
        queue them, send priorities."""
        if not self.paused:
            self.client.top_up(self.beta, self._request_limit())
        self._flush_priorities(wait=False)
        events = dict(self._poller.poll(timeout_ms))
        if self._bell_rx in events:
            self._drain_bell()
        if self.control.sock in events:
            for command in self.control.drain():
                self.events.put(command)
        if self.client.sock in events:
            self._take_batches()
        if not self.paused:
            self.client.top_up(self.beta, self._request_limit())
            self.client.resend_stale(time.monotonic(), self.beta, self._request_limit())

    def _request_limit(self) -> int:
        """How many requests may be outstanding now: 2 * in_flight minus the replies waiting to be trained on, and
        never more than the shared-memory slots not leased (each answer takes one), so none is answered over the
        socket for want of a slot."""
        limit = 2 * self.client.inflight - math.ceil((self.delivered - self.taken) / self.group)
        if self.leases:
            limit = min(limit, self.client.slots - self.leases)
        return limit

    def _drain_bell(self) -> None:
        while True:
            try:
                self._bell_rx.recv(zmq.NOBLOCK)
            except zmq.Again:
                return

    def _take_batches(self) -> None:
        while True:
            compact = self.client.counters["compact_batches"]
            batch = self.client.receive()
            if batch is None:
                return
            rebuilt = self.client.counters["compact_batches"] > compact  # its stacks took milliseconds to rebuild
            try:
                self.check(batch)
            except BadBatch as exc:
                self.client.release(batch, refill=False)
                self.faults.record("sample", exc)
                continue
            size = self.train_batch
            # A shared-memory batch is a view of a slot the replay reuses once released. On a CPU the staged
            # tensors stay views of it (no copy) and the slot is leased until they are trained on; on a GPU the
            # pinned buffers copy it, so it goes back at once.
            ordered = spread_demos(batch, size)
            hold = self.hold_shared and self.client.shared(batch)
            staged = self.stage(ordered, shared=self.client.shared(batch) and not hold)
            parts = staged.split(size)
            lease = SlotLease(batch, len(parts)) if hold else None
            if lease is None:
                self.client.release(batch, refill=False)
            else:
                self.leases += 1
            for i, part in enumerate(parts):
                self.delivered += 1
                self.events.put(ReadyBatch(ordered.index[i * size:(i + 1) * size], batch.replay_size, part, lease))
            if rebuilt and not self.paused:  # the next request leaves now, not after every waiting reply is rebuilt
                self.client.top_up(self.beta, self._request_limit())

    def _flush_priorities(self, *, wait: bool) -> None:
        """Send every priority update whose copy has landed, as one message (fewer sends, fewer GIL hand-offs)."""
        indices: list[np.ndarray] = []
        values: list[np.ndarray] = []
        while self._priorities and (wait or self._priorities[0][1].ready()) and len(indices) < MAX_COALESCED:
            index, copy, lease = self._priorities.popleft()
            copy.wait()
            indices.append(index)
            values.append(finite_priorities(copy.numpy()["p"]))
            if lease is not None:
                lease.parts -= 1
                if lease.parts == 0:  # every part trained on: the slot goes back with the next request
                    self.client.release(lease.batch, refill=False)
                    self.leases -= 1
        if len(indices) == 1:
            self.client.update_priorities(indices[0], values[0])
        elif indices:
            self.client.update_priorities(np.concatenate(indices), np.concatenate(values))
        if wait and self._priorities:
            self._flush_priorities(wait=True)
