"""The one client of the replay's sampling protocol: requests in flight, shared memory on one host, TCP elsewhere."""

from __future__ import annotations

import logging
import time

import numpy as np
import zmq
from zmq.utils.monitor import recv_monitor_message

from flywheel import proto
from flywheel.metrics_spec import ReplayClientCounters
from flywheel.proto.messages import SampleRefused
from flywheel.transport import FaultCounter, MessageTooLarge, connect, make_socket, receive

from .client_shm import BadSlot, Segment, map_slot, open_segment
from .refusals import Refused, check_fit

log = logging.getLogger("flywheel.replay.client")
TRANSPORTS = ("auto", "shm", "tcp")


class ReplayClientError(RuntimeError):
    """The client cannot do what it was asked (e.g. shared memory required but not reachable)."""


class ReplayClient:
    """Sample requests kept in flight on one DEALER socket; batches through shared memory or over the socket.

    Simple use (``poll`` keeps ``inflight`` requests outstanding; requests in flight + batches held = ``inflight``)::

        client = ReplayClient("tcp://replay:5556", batch_size=512, inflight=4)
        batch = client.poll(timeout_ms=100)           # a proto.SampleBatch, or None when none came in time
        obs = torch.from_numpy(batch.obs).to(device)  # copy out what you need first ...
        client.update_priorities(batch.index, new_priorities)   # sent at once, no reply awaited
        client.release(batch)                         # ... then hand it back: this sends the next request

    A service with its own poller (the learner's feeder) drives it instead: ``top_up(beta, limit)`` sends requests
    up to a bound, ``receive()`` takes one reply without blocking when ``sock`` is readable, ``release(batch,
    refill=False)`` hands a batch back, ``resend_stale`` re-sends after a replay restart or ``request_timeout_s``.

    Every batch handed out must be released once the caller has copied what it needs: on the shared-memory path
    ``obs``/``next_obs`` are read-only views of a slot the replay reuses after the release (which travels with the
    next request). Batches that came over the socket own their arrays.

    ``transport``: ``"auto"`` takes the replay's shared-memory offer when its segment can be opened here and its
    token matches (same host, same /dev/shm), otherwise stays on TCP; ``"shm"`` insists (ReplayClientError if the
    segment cannot be opened); ``"tcp"`` never asks. With ``compact`` (default), pixel batches over the socket come
    as distinct frames plus stack indices and are rebuilt here with one gather; a replay that keeps frames packed
    (frame_packing=lz4) sends them as LZ4 blocks (unless ``packed`` is false), unpacked here into one reused
    buffer. Replies that do not decode, or do not fit what was asked (``batch_size`` rows, ``obs_shape`` when given,
    the decode limits once expanded), are counted in ``faults`` (logged once per kind) and free their request's
    place; so does a compact batch that runs out of memory while it is expanded. A request the replay refuses for
    its size (its ``max_batch_size``) raises ReplayClientError: asking again would never be served.
    """

    def __init__(self, endpoint: str, batch_size: int, *, inflight: int = 4, beta: float = 0.4,
                 transport: str = "auto", ctx: zmq.Context | None = None, max_message_mb: int = 1024,
                 limits: proto.Limits | None = None, slots: int = 0, request_timeout_s: float = 60.0,
                 faults: FaultCounter | None = None, compact: bool = True, packed: bool = True,
                 obs_shape: tuple[int, ...] | None = None) -> None:
        if not 1 <= batch_size <= 65536 or not 1 <= inflight <= 256:
            raise ValueError("batch_size must be in 1..65536 and inflight in 1..256")
        if transport not in TRANSPORTS:
            raise ValueError(f"transport must be auto, shm or tcp, got {transport!r}")
        self.endpoint, self.batch_size, self.inflight, self.transport = endpoint, batch_size, inflight, transport
        self.obs_shape = tuple(int(d) for d in obs_shape) if obs_shape is not None else None
        self.slots = min(slots or inflight, 256)  # shared-memory slots asked for: the most this client holds
        self.beta = self._check_beta(beta)
        self.request_timeout_s, self.compact, self.packed = request_timeout_s, compact, compact and packed
        self.faults = faults if faults is not None else FaultCounter("replay client")
        self._own_ctx = ctx is None
        self.ctx = ctx if ctx is not None else zmq.Context()
        size = max_message_mb << 20
        self.limits = limits or proto.Limits(max_total_bytes=size, max_array_bytes=size)
        self.sock = make_socket(self.ctx, zmq.DEALER, sndhwm=10_000, rcvhwm=2 * inflight + 4,
                                max_msg_bytes=self.limits.max_total_bytes + (1 << 16))
        self.monitor = self.sock.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        connect(self.sock, endpoint)
        self.segment: Segment | None = None
        self.shm_refused = transport == "tcp"
        self._outstanding: dict[int, float] = {}  # request id -> when it was sent
        self.held: dict[int, tuple[str, int]] = {}  # request id -> (segment, slot) of batches handed out
        self._to_release: list[int] = []  # slots of the current segment to hand back with the next requests
        self._next_id = 1
        self._disconnected = False
        self._last_progress = time.monotonic()
        self._unpacked = np.empty(0, np.uint8)  # packed frames are unpacked here, then gathered into stacks
        self.counters = ReplayClientCounters()  # reported by the learner (``counters.as_dict()``)

    @staticmethod
    def _check_beta(beta: float) -> float:
        if not 0.0 <= beta <= 1.0:
            raise ValueError(f"beta must be in [0, 1], got {beta}")
        return float(beta)

    def set_beta(self, beta: float) -> None:
        """Importance-sampling exponent for the requests sent from now on (the learner anneals it)."""
        self.beta = self._check_beta(beta)

    @property
    def outstanding(self) -> int:
        """Requests sent and not yet answered."""
        return len(self._outstanding)

    @property
    def path(self) -> str:
        """Where batches come from now: ``shm`` once a segment is attached, else ``tcp``."""
        return "shm" if self.segment is not None else "tcp"

    # ---- requests ---------------------------------------------------------------------------------------------
    def top_up(self, beta: float | None = None, limit: int | None = None) -> None:
        """Send requests until ``inflight`` (or the smaller ``limit``) are outstanding; stops if the queue is full."""
        if beta is not None:
            self.set_beta(beta)
        target = self.inflight if limit is None else min(limit, self.inflight)
        while len(self._outstanding) < target and self._send_request():
            pass

    def _send_request(self) -> bool:
        release = self._to_release.pop() if self._to_release else -1
        request = proto.SampleRequest(
            request_id=self._next_id, batch_size=self.batch_size, beta=self.beta, shm=not self.shm_refused,
            shm_segment=self.segment.name if self.segment else "", release_slot=release, slots=self.slots,
            compact=self.compact, packed=self.packed)
        try:
            self.sock.send_multipart(proto.encode(request), flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            if release >= 0:
                self._to_release.append(release)
            return False
        self._outstanding[self._next_id] = time.monotonic()
        self._next_id += 1
        return True

    def resend_stale(self, now: float | None = None, beta: float | None = None, limit: int | None = None) -> int:
        """Forget and re-send outstanding requests when the replay reconnected (a restarted replay knows none of
        them) or no batch came for ``request_timeout_s``; returns how many were re-sent."""
        now = time.monotonic() if now is None else now
        if self._reconnected():
            self.counters.replay_reconnects_total += 1
            self._to_release.clear()  # a new replay: new segment, no slots of ours
            self._drop_segment()
            self.shm_refused = self.transport == "tcp"  # it may run elsewhere now: look at its offer again
            log.info("replay %s is back: re-sending %d sample requests", self.endpoint, len(self._outstanding))
        elif not self._outstanding or self.request_timeout_s <= 0:
            return 0
        elif now - max(self._last_progress, max(self._outstanding.values())) < self.request_timeout_s:
            return 0
        else:
            log.warning("no batch from replay %s for %.0f s: re-sending %d sample requests", self.endpoint,
                        self.request_timeout_s, len(self._outstanding))
        count = len(self._outstanding)
        self.counters.requests_resent_total += count
        self._outstanding.clear()
        self._last_progress = now
        self.top_up(beta, limit)
        return count

    def _reconnected(self) -> bool:
        back = False
        while self.monitor.poll(0):
            event = recv_monitor_message(self.monitor)["event"]
            if event == zmq.EVENT_DISCONNECTED:
                self._disconnected = True
            elif event == zmq.EVENT_CONNECTED and self._disconnected:
                self._disconnected, back = False, True
        return back

    def idle_since_now(self) -> None:
        """Restart the stale-request clock (after a pause, when silence was expected)."""
        self._last_progress = time.monotonic()

    # ---- replies ----------------------------------------------------------------------------------------------
    def poll(self, timeout_ms: int = 0) -> proto.SampleBatch | None:
        """The next batch, waiting at most ``timeout_ms`` (0: don't wait); None when none came. Keeps requests in
        flight + batches held at ``inflight``."""
        deadline = time.monotonic() + timeout_ms / 1000
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        poller.register(self.monitor, zmq.POLLIN)
        while True:
            self.resend_stale(limit=self.inflight - len(self.held))
            self.top_up(limit=self.inflight - len(self.held))
            remaining = max(0, int((deadline - time.monotonic()) * 1000))
            events = dict(poller.poll(remaining))
            if self.sock in events:
                batch = self.receive()
                if batch is not None:
                    return batch
                continue
            if remaining == 0:
                return None

    def receive(self) -> proto.SampleBatch | None:
        """The next reply if one has arrived (never blocks); None when none has or it was refused (counted)."""
        try:
            frames = receive(self.sock)
        except zmq.Again:
            return None
        except MessageTooLarge as exc:
            self._refuse(exc)
            return None
        self._last_progress = time.monotonic()
        try:
            batch = proto.decode(frames, expect=(proto.SampleBatch, SampleRefused), limits=self.limits)
        except proto.DecodeError as exc:
            self._refuse(exc)
            return None
        if isinstance(batch, SampleRefused):
            self._refused(batch)
            return None
        shm = batch.shm
        if shm.get("refused"):
            self._shm_denied(str(shm["refused"]))
        if shm.get("segment") and not self.shm_refused and (self.segment is None or
                                                            self.segment.name != shm.get("segment")):
            self._attach(shm)
        slot = shm.get("slot", -1)
        ours = (isinstance(slot, int) and slot >= 0 and self.segment is not None
                and shm.get("segment") == self.segment.name)
        if self._outstanding.pop(batch.request_id, None) is None:
            # An answer to a request re-sent after request_timeout_s (the replay had held it back, not lost it):
            # it stands in for the oldest one still outstanding; with none left it is one more than was asked
            # for and is dropped, so batches received but not yet used stay within what was asked for.
            if not self._outstanding:
                self.counters.replies_unrequested_total += 1
                if ours:
                    self._to_release.append(slot)
                return None
            self._outstanding.pop(min(self._outstanding, key=self._outstanding.__getitem__))
        if isinstance(slot, int) and slot >= 0:
            try:
                check_fit(batch, self.batch_size, self.obs_shape, self.limits.max_total_bytes, in_slot=True)
                map_slot(batch, self.segment, self.obs_shape)
            except (BadSlot, proto.DecodeError) as exc:
                self._refuse(exc, freed=True)
                if ours:
                    self._to_release.append(slot)
                return None
            self.counters.shm_batches_total += 1
            self.counters.sample_batches_total += 1
            self.held[batch.request_id] = (str(shm["segment"]), slot)
            return batch
        try:
            check_fit(batch, self.batch_size, self.obs_shape, self.limits.max_total_bytes, in_slot=False)
        except proto.DecodeError as exc:
            self._refuse(exc, freed=True)
            return None
        if batch.frames is not None or batch.packed is not None:
            packed, expanded = batch.packed is not None, batch.expanded_bytes()
            try:
                if packed and batch.packed_sizes is not None:
                    need = int(batch.packed_sizes.size * np.prod(proto.packing.parse_shape(batch.packing["shape"])))
                    if self._unpacked.size < need:
                        self._unpacked = np.empty(need, np.uint8)
                batch.expand_frames(self._unpacked)
            except proto.DecodeError as exc:
                self._refuse(exc, freed=True)
                return None
            except MemoryError:  # refused like any reply that cannot be used; the request is sent again
                self._refuse(proto.OversizedMessage(f"sample_batch: out of memory expanding {batch.action.shape[0]} "
                                                    f"rows ({expanded} bytes)"), freed=True)
                return None
            self.counters.compact_batches_total += 1
            self.counters.packed_batches_total += int(packed)
        self.counters.tcp_batches_total += 1
        self.counters.sample_batches_total += 1
        self.held[batch.request_id] = ("", -1)
        return batch

    def _refused(self, refusal: SampleRefused) -> None:
        """A sample_refused reply: counted, its request's place freed. One refused for its size would be refused
        again forever: that raises ReplayClientError (the learner stops with this line)."""
        if self._outstanding.pop(refusal.request_id, None) is None and self._outstanding:
            self._outstanding.pop(min(self._outstanding, key=self._outstanding.__getitem__))
        self._refuse(Refused(refusal.reason, f"the replay refused a request: {refusal.detail or refusal.reason}"),
                     freed=True)
        if refusal.reason == "batch_size":
            raise ReplayClientError(
                f"replay {self.endpoint} refuses sample requests of {self.batch_size} rows (its max_batch_size is "
                f"{refusal.limit}): lower the learner's batch_size x batches_per_request, or raise the replay's "
                "max_batch_size (FLYWHEEL_REPLAY_MAX_BATCH_SIZE)")

    def _shm_denied(self, why: str) -> None:
        """The replay offers shared memory only to ipc and loopback peers, and this one is neither."""
        if self.transport == "shm":
            raise ReplayClientError(f"replay {self.endpoint} refuses shared memory to this peer ({why}): it offers "
                                    "it only to ipc:// and loopback (127.0.0.1) peers; connect over one of those, "
                                    "or use sample transport auto or tcp")
        if not self.shm_refused:
            log.info("replay %s offers shared memory only to ipc and loopback peers: sampling over TCP", self.endpoint)
            self.shm_refused = True

    def _refuse(self, exc: Exception, freed: bool = False) -> None:
        """A reply that cannot be used: counted; it answered one of ours, so the oldest request's place is freed."""
        self.counters.bad_replies += 1
        self.faults.record("sample", exc)
        if not freed and self._outstanding:
            self._outstanding.pop(min(self._outstanding, key=self._outstanding.__getitem__))

    def _attach(self, offer: dict) -> None:
        try:
            segment = open_segment(offer)
        except (OSError, ValueError, TypeError) as exc:
            if self.transport == "shm":
                raise ReplayClientError(f"cannot attach the replay's shared memory {offer.get('segment')!r}: {exc}; "
                                        "the replay must run on this host and share its /dev/shm (sample transport "
                                        "shm)") from None
            log.info("replay %s offered shared memory, not reachable here (%s): sampling over TCP", self.endpoint, exc)
            self.shm_refused = True
            return
        self._drop_segment()
        self._to_release.clear()  # slots of an older segment mean nothing to the new one
        self.segment = segment
        log.info("replay %s: sampling through shared memory %s (%.1f MB)", self.endpoint, segment.name,
                 segment.size / 1e6)

    def _drop_segment(self) -> None:
        if self.segment is not None:
            self.segment.close()
            self.segment = None

    def shared(self, batch: proto.SampleBatch) -> bool:
        """Whether a batch held by this client lies in shared memory (valid only until it is released)."""
        return self.held.get(batch.request_id, ("", -1))[1] >= 0

    def release(self, batch: proto.SampleBatch, *, refill: bool = True) -> None:
        """Hand ``batch`` back (shared-memory views become invalid); its slot goes back with the next request.

        ``refill`` (the simple use) sends that request now, keeping requests in flight + batches held at
        ``inflight``; a caller that bounds its requests itself (``top_up(limit=...)``) passes False.
        """
        entry = self.held.pop(batch.request_id, None)
        if entry is None:
            raise ValueError(f"batch {batch.request_id} is not held by this client (released twice?)")
        name, slot = entry
        if slot >= 0 and self.segment is not None and name == self.segment.name:
            self._to_release.append(slot)
        if refill:
            self.top_up(limit=self.inflight - len(self.held))

    def update_priorities(self, index: np.ndarray, priority: np.ndarray) -> bool:
        """Send new priorities for sampled indices without waiting; a full queue drops them (counted)."""
        update = proto.PriorityUpdate(index=np.ascontiguousarray(index, np.int64),
                                      priority=np.ascontiguousarray(priority, np.float32))
        try:
            self.sock.send_multipart(proto.encode(update), flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            self.counters.priority_updates_dropped_total += 1
            return False
        self.counters.priority_updates += 1
        return True

    def close(self) -> None:
        self.sock.disable_monitor()
        self.monitor.close(0)
        self.sock.close(0)
        self._drop_segment()
        if self._own_ctx:
            self.ctx.term()

    def __enter__(self) -> ReplayClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
