"""The learner's sockets, the one learner module that touches ZeroMQ: the sampling thread (sample requests in
flight, replies checked and staged, priorities back), the weights PUB, and the control, telemetry and fault parts.

The update loop (loop.py) never waits on a socket of the sampling thread: it takes ready batches from the
``Feeder``'s queue and hands their |TD| errors to ``Feeder.done``; the thread keeps the sample requests in flight and
sends the priorities once their device->host copies have landed.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import zmq

from flywheel import proto
from flywheel.connections import ConnectionCount
from flywheel.services.replay.client import ReplayClient
from flywheel.settings import setting_default
from flywheel.transport import ControlSubscriber, FaultCounter, TelemetryReporter, bind, make_socket, queued_frames

from .batches import ReadyBatch, SlotLease, spread_demos
from .core import BadBatch, LearnerCore, finite_priorities
from .fanout import FanoutShaper
from .sampling import FeedConfig, batch_limits, batches_per_request
from .settings import LearnerSettings
from .staging import DeviceBatch, HostCopy

log = logging.getLogger("flywheel.learner")
SERVICE = "learner"
IDLE_POLL_MS = 100
PRIORITY_POLL_MS = 2  # while priorities wait for their device->host copy
MAX_COALESCED = 64  # batches' priorities sent in one PriorityUpdate at most


class Feeder:
    """The sampling thread: owns the replay client; ``take`` yields the training batches that arrived.

    Each reply of ``group * train_batch`` transitions becomes ``group`` training batches. Up to ``in_flight``
    requests are outstanding, and requests plus received-but-not-yet-taken replies never exceed ``2 * in_flight``:
    the update loop always has a batch ready while the next ones travel. ``beta`` and ``paused`` are set by the
    update loop; plain attribute writes are safe across threads.
    """

    def __init__(self, ctx: zmq.Context, client: ReplayClient, faults: FaultCounter, *,
                 check: Callable[[proto.SampleBatch], None], stage: Callable[..., DeviceBatch],
                 beta: float, train_batch: int, group: int = 1, hold_shared: bool = False) -> None:
        self.client, self.faults = client, faults
        # hold_shared: staging keeps views (CPU), so a shared-memory slot is handed back only after training on it
        self.hold_shared = hold_shared
        self.leases = 0  # shared-memory slots leased (written by the sampling side only)
        # the update loop's doorbell: a byte wakes this thread to top up requests (it carries no data)
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
        self.events: queue.SimpleQueue[ReadyBatch] = queue.SimpleQueue()
        self.beta = beta
        self.paused = False
        self.delivered = 0  # written by this thread only
        self.taken = 0  # written by the update loop only
        self._priorities: deque[tuple[np.ndarray, HostCopy, SlotLease | None]] = deque()
        self._poller = zmq.Poller()
        for sock in (self.client.sock, self._bell_rx):
            self._poller.register(sock, zmq.POLLIN)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def start(self) -> None:
        """Run in the sampling thread (one mode: the update loop only calls ``take`` and ``done``)."""
        self._thread = threading.Thread(target=self._run, name="learner-feeder", daemon=True)
        self._thread.start()

    def take(self, timeout_ms: int) -> ReadyBatch | None:
        """The next ready batch, waiting up to ``timeout_ms``; None when none came."""
        try:
            return self.events.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            return None

    def done(self, ready: ReadyBatch, td_abs: torch.Tensor) -> None:
        """The update loop trained on ``ready``: its |TD| errors (a fresh tensor: kept as a view on a CPU, copied
        off a GPU) go to the replay as priorities once the copy has landed.

        A thread is woken only when no reply is on its way (one would wake it anyway) and half the buffered
        batches are used up, so it then sends ``in_flight`` requests at once: waking a thread costs a context
        switch. ``taken`` is counted before ``outstanding`` is read, so a wake-up is never lost.
        """
        self._priorities.append((ready.index, HostCopy({"p": td_abs}, copy=False), ready.lease))
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

    def close(self) -> None:
        """Stop (queued priorities are sent first), then close the replay client."""
        self.stop()
        self.client.close()

    def _release_untrained(self) -> None:
        """Hand back the slots of batches queued but never trained on (the update loop has stopped taking)."""
        leases: dict[int, SlotLease] = {}
        while True:
            try:
                item = self.events.get_nowait()
            except queue.Empty:
                break
            if item.lease is not None:
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
        """One turn of the sampling thread: top up requests, wait up to ``timeout_ms`` for replies or the bell,
        queue the batches, send priorities."""
        if not self.paused:
            self.client.top_up(self.beta, self._request_limit())
        self._flush_priorities(wait=False)
        events = dict(self._poller.poll(timeout_ms))
        if self._bell_rx in events:
            self._drain_bell()
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
            compact = self.client.counters.compact_batches_total
            batch = self.client.receive()
            if batch is None:
                return
            rebuilt = self.client.counters.compact_batches_total > compact  # its stacks took milliseconds to rebuild
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


def open_feeder(config: FeedConfig, core: LearnerCore, ctx: zmq.Context, faults: FaultCounter) -> Feeder:
    """The replay client and sampling thread the learner samples through (``FeedConfig.of(learner_settings)``);
    batches are checked and staged by ``core``. Not started: set ``beta`` (it starts at ``beta_start``), then call
    ``start``."""
    group = batches_per_request(config.batches_per_request, config.batch_size, core.obs_shape)
    rows = config.batch_size * group
    # Up to 2 x requests_in_flight requests are outstanding or queued (the feeder's bound); on a CPU a reply's slot
    # is leased until it is trained on, so the one in training and one whose priorities wait come on top. Should
    # they all be taken, the replay answers over the socket instead (shm_slots_exhausted_total).
    client = ReplayClient(config.sample_endpoint, rows, inflight=config.requests_in_flight,
                          beta=config.beta_start, transport=config.sample_transport, ctx=ctx,
                          limits=batch_limits(rows, core.obs_shape), slots=2 * config.requests_in_flight + 2,
                          request_timeout_s=config.request_timeout_s, faults=faults,
                          packed=config.sample_packed, obs_shape=core.obs_shape)
    try:
        return Feeder(ctx, client, faults, check=core.check_batch, stage=core.stager.stage, beta=config.beta_start,
                      train_batch=config.batch_size, group=group, hold_shared=core.stager.keeps_views)
    except BaseException:
        client.close()
        raise


class WeightsPublisher:
    """The weights XPUB: each new version once, the newest again when a subscriber joins and every ``republish_s``,
    within a fan-out budget of ``fanout_bytes_per_s`` over all subscribers (0: none; ``FanoutShaper``).

    Subscribers are counted from their subscriptions (XPUB_VERBOSER: a SUB subscribes on each connection, a
    reconnect is a new one, and libzmq hands up an unsubscribe when it ends), at most one per open connection
    (``flywheel.connections``): a peer that repeats its subscribe message counts once, not once per message, so it
    cannot shrink everyone's fan-out budget. A republish for a joining subscriber is owed once per new connection.
    """

    def __init__(self, ctx: zmq.Context, endpoint: str, republish_s: float,
                 fanout_bytes_per_s: float = setting_default(LearnerSettings, "weights_fanout_mb_per_s") * 1e6,
                 ) -> None:
        self.sock = make_socket(ctx, zmq.XPUB, sndhwm=4, max_msg_bytes=4096)  # inbound: subscriptions only
        self.sock.setsockopt(zmq.XPUB_VERBOSER, 1)  # every subscribe, and every unsubscribe of a leaving peer
        self.connections = ConnectionCount(self.sock)  # before the bind: its monitor sees every connection
        try:
            self.endpoint = bind(self.sock, endpoint, "learner weights PUB", "--weights-bind")
        except Exception:
            self.connections.close()
            self.sock.close(0)
            raise
        self.shaper = FanoutShaper(fanout_bytes_per_s, republish_s)
        self.subscriptions = 0  # subscribe messages less unsubscribes
        self.subscribers = 0  # the subscriptions, at most one per open connection
        self._joined_upto = 0  # connections accepted when a republish was last owed to a joining subscriber
        self.fanout_bytes_total = 0  # the message's bytes times the subscribers, summed over sends
        self._frames: list | None = None
        self._bytes = 0

    @property
    def min_interval(self) -> float:
        """Seconds between sends the budget asks for now (0: not shaped)."""
        return self.shaper.interval(self.subscribers, self._bytes)

    def publish(self, msg: proto.Weights, now: float | None = None) -> None:
        """A new version: sent now when the budget allows, else when it does unless a newer one comes first."""
        self._frames = proto.encode(msg)
        self._bytes = sum(memoryview(frame).nbytes for frame in self._frames)
        self._count_subscribers()
        now, binding = time.monotonic() if now is None else now, self.shaper.binding
        if self.shaper.offer(now, self.subscribers, self._bytes):
            self._send(now)
        if self.shaper.binding != binding:
            self._log_binding()

    def tick(self, now: float) -> None:
        """Send the waiting version once the budget allows, or the newest again after ``republish_s``."""
        self._count_subscribers()
        if self._frames is not None and self.shaper.due(now, self.subscribers, self._bytes):
            self._send(now)

    def _count_subscribers(self) -> None:
        subscribed = False
        for frames in queued_frames(self.sock, refused=lambda exc: None):  # not a subscription: ignored
            first = frames[0].bytes[:1]
            if len(frames) == 1 and first in (b"\x00", b"\x01"):
                self.subscriptions = max(0, self.subscriptions + (1 if first == b"\x01" else -1))
                subscribed = subscribed or first == b"\x01"
        self.connections.poll()  # after the subscriptions: each one's connection was accepted before it came
        connections = self.connections.count
        self.subscribers = self.subscriptions if connections is None else min(self.subscriptions, connections)
        accepted = self.connections.accepted_total
        if subscribed and self._frames is not None and (connections is None or accepted > self._joined_upto):
            self.shaper.joined()
            self._joined_upto = accepted

    def _send(self, now: float) -> None:
        assert self._frames is not None
        try:
            self.sock.send_multipart(self._frames, flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:  # XPUB drops instead of blocking; kept for safety
            pass
        self.shaper.sent(now)
        self.fanout_bytes_total += self._bytes * self.subscribers

    def _log_binding(self) -> None:
        if self.shaper.binding:
            log.info("learner: the weights fan-out budget binds: %d subscribers x %.0f KiB at %.3g MB/s allow one "
                     "send every %.2f s; newer versions replace waiting ones (weights_fanout_mb_per_s)",
                     self.subscribers, self._bytes / 1024, self.shaper.bytes_per_s / 1e6, self.min_interval)
        else:
            log.info("learner: the weights fan-out budget no longer binds (%d subscribers, %.2f s between sends; "
                     "%d versions deferred so far)", self.subscribers, self.min_interval, self.shaper.deferred_total)

    def close(self) -> None:
        self.connections.close()
        self.sock.close(0)


@dataclass
class LearnerSockets:
    """Every ZeroMQ part of one learner, opened together by ``open_sockets`` and closed together."""

    feeder: Feeder
    control: ControlSubscriber
    weights: WeightsPublisher
    telemetry: TelemetryReporter
    faults: FaultCounter
    ctx: zmq.Context
    own_ctx: bool  # made by open_sockets: terminated by close

    def close(self) -> None:
        """Stop the sampling thread (its queued priorities are sent first), then close every socket."""
        self.feeder.close()
        self.control.close()
        self.weights.close()
        self.telemetry.close()
        if self.own_ctx:
            self.ctx.term()


def open_sockets(settings: LearnerSettings, core: LearnerCore, ctx: zmq.Context | None = None) -> LearnerSockets:
    """The learner's parts that touch ZeroMQ, from ``settings`` (in ``ctx``, else a context of their own); raises
    EndpointInUse, with nothing left open, when the weights address is taken."""
    context = zmq.Context() if ctx is None else ctx
    faults = FaultCounter(SERVICE)
    opened: list[Feeder | ControlSubscriber | WeightsPublisher] = []
    try:
        feeder = open_feeder(FeedConfig.of(settings), core, context, faults)
        opened.append(feeder)
        control = ControlSubscriber(context, settings.control_endpoint, SERVICE, settings.instance, faults)
        opened.append(control)
        weights = WeightsPublisher(context, settings.weights_bind, settings.weights_republish_s,
                                   settings.weights_fanout_mb_per_s * 1e6)
        opened.append(weights)
        telemetry = TelemetryReporter(context, settings.telemetry_endpoint, SERVICE, settings.instance,
                                      settings.telemetry_interval_s)
    except BaseException:
        for part in reversed(opened):
            part.close()
        if ctx is None:
            context.term()
        raise
    return LearnerSockets(feeder, control, weights, telemetry, faults, context, own_ctx=ctx is None)
