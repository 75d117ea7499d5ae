"""The learner's ZeroMQ side: sample requests in flight, priority updates, weights PUB, telemetry and control."""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path

import zmq

from flywheel import proto
from flywheel.nets import weights_message
from flywheel.transport import ControlSubscriber, FaultCounter, TelemetryReporter, bind, make_socket

from .checkpoint import save_checkpoint
from .core import BadBatch, LearnerCore, beta_at
from .settings import LearnerSettings

log = logging.getLogger("flywheel.learner")
SERVICE = "learner"
MAX_POLL_MS = 100


class ControlArgError(ValueError):
    """A control command carried an argument of the wrong type or range."""

    fault = "bad_args"


class LearnerService:
    """Runs the learner loop: one batch in, one update, priorities out; weights every K updates."""

    def __init__(self, settings: LearnerSettings, core: LearnerCore, ctx: zmq.Context, *,
                 start_version: int = 0) -> None:
        self.settings, self.core, self.ctx = settings, core, ctx
        self.faults = FaultCounter(SERVICE)
        obs_bytes = math.prod(core.obs_shape) * 4  # float32 worst case
        max_batch = 2 * settings.batch_size * (obs_bytes + 64) + (1 << 20)
        self.limits = proto.Limits(max_total_bytes=max_batch, max_array_bytes=max_batch)
        self.dealer = make_socket(ctx, zmq.DEALER, sndhwm=10_000, rcvhwm=2 * settings.requests_in_flight + 4,
                                  max_msg_bytes=max_batch + (1 << 16))
        self.dealer.connect(settings.sample_endpoint)
        self.pub = make_socket(ctx, zmq.PUB, sndhwm=4)
        try:
            bind(self.pub, settings.weights_bind, "learner weights PUB", "--weights-bind")
        except Exception:
            self.dealer.close(0)
            self.pub.close(0)
            raise
        self.telemetry = TelemetryReporter(ctx, settings.telemetry_endpoint, SERVICE, settings.instance,
                                           settings.telemetry_interval_s)
        self.control = ControlSubscriber(ctx, settings.control_endpoint, SERVICE, settings.instance, self.faults)
        self.poller = zmq.Poller()
        self.poller.register(self.dealer, zmq.POLLIN)
        self.poller.register(self.control.sock, zmq.POLLIN)

        self.version = start_version  # last published weight version (0 = none yet)
        self.publish_interval = settings.publish_interval_updates
        self.paused = False
        self._stop = False
        self._next_request_id = 1
        self._outstanding: dict[int, float] = {}
        self._last_progress = time.monotonic()
        self._since_publish = 0
        self._weights_frames: list | None = None
        self._last_publish = 0.0
        self._next_checkpoint = time.monotonic() + settings.checkpoint_interval_s
        self.counters = {"updates_total": 0.0, "samples_total": 0.0, "weights_published_total": 0.0,
                         "rejected_messages_total": 0.0, "skipped_updates_total": 0.0,
                         "priority_updates_dropped_total": 0.0, "requests_resent_total": 0.0,
                         "checkpoints_total": 0.0}
        self.gauges: dict[str, float] = {"loss": math.nan, "td_error_mean": math.nan, "q_mean": math.nan,
                                         "replay_size": 0.0}
        self._window = {"t": time.monotonic(), "wait": 0.0, "updates": 0, "loss": 0.0, "td": 0.0, "q": 0.0}
        self.last_gauges: dict[str, float] = {}

    # ---- lifecycle -------------------------------------------------------------------------------------------
    def stop(self) -> None:
        """Ask the loop to finish (safe from a signal handler)."""
        self._stop = True

    @property
    def beta(self) -> float:
        s = self.settings
        return beta_at(self.core.updates, s.beta_start, s.beta_end, s.beta_anneal_updates)

    def run(self) -> int:
        """Loop until stopped or max_updates; then leave a checkpoint (if configured) and return 0."""
        self.start()
        while not self._stop:
            if self.settings.max_updates and self.core.updates >= self.settings.max_updates:
                log.info("learner: reached max_updates=%d, stopping", self.settings.max_updates)
                break
            self.step(MAX_POLL_MS)
        self.finish()
        return 0

    def start(self) -> None:
        """Publish the starting weights (so actors get some early) and put the first requests in flight."""
        self.publish()
        self._fill_requests()

    def finish(self) -> None:
        """Send a last telemetry report and leave a checkpoint when a directory is set."""
        self.send_telemetry()
        if self.settings.checkpoint_dir:
            self.checkpoint("stop")

    def step(self, timeout_ms: int) -> None:
        """One poll: handle control, at most one batch, then timers."""
        start = time.monotonic()
        events = dict(self.poller.poll(timeout_ms))
        if not self.paused:
            self._window["wait"] += time.monotonic() - start
        if self.control.sock in events:
            for command in self.control.drain():
                self.handle_control(command)
        if not self.paused and self.dealer in events:
            self._receive_batch()
        self._timers()

    def close(self) -> None:
        for sock in (self.dealer, self.pub):
            sock.close(0)
        self.telemetry.close()
        self.control.close()

    # ---- data path -------------------------------------------------------------------------------------------
    def _fill_requests(self) -> None:
        beta = self.beta
        while len(self._outstanding) < self.settings.requests_in_flight:
            rid = self._next_request_id
            self._next_request_id += 1
            msg = proto.SampleRequest(request_id=rid, batch_size=self.settings.batch_size, beta=beta)
            try:
                self.dealer.send_multipart(proto.encode(msg), flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self._outstanding[rid] = time.monotonic()

    def _receive_batch(self) -> None:
        try:
            frames = self.dealer.recv_multipart(flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return
        self._last_progress = time.monotonic()
        try:
            batch = proto.decode(frames, expect=proto.SampleBatch, limits=self.limits)
        except proto.DecodeError as exc:
            self._reject("sample", exc)
            if self._outstanding:  # it answered one of ours: keep the pipeline full
                self._outstanding.pop(min(self._outstanding, key=self._outstanding.__getitem__))
            self._fill_requests()
            return
        assert isinstance(batch, proto.SampleBatch)
        self._outstanding.pop(batch.request_id, None)
        self._fill_requests()  # ask for the next batch before training on this one
        try:
            self.core.check_batch(batch)
        except BadBatch as exc:
            self._reject("sample", exc)
            return
        self.train(batch)

    def train(self, batch: proto.SampleBatch) -> None:
        """Update on one batch, send its priorities, publish weights when due."""
        result = self.core.update(batch)
        update = proto.PriorityUpdate(index=batch.index, priority=result.priorities())
        try:
            self.dealer.send_multipart(proto.encode(update), flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            self.counters["priority_updates_dropped_total"] += 1
        self.gauges["replay_size"] = float(batch.replay_size)
        if not result.applied:
            self.counters["skipped_updates_total"] += 1
            return
        stats = result.stats()
        w = self._window
        w["updates"] += 1
        w["loss"] += stats["loss"]
        w["td"] += stats["td_error_mean"]
        w["q"] += stats["q_mean"]
        self.counters["updates_total"] += 1
        self.counters["samples_total"] += result.batch_size
        self._since_publish += 1
        if self._since_publish >= self.publish_interval:
            self.publish()

    def publish(self) -> None:
        """Publish the online network as the next version."""
        self.version += 1
        msg = weights_message(self.core.online, self.version, self.core.name)
        self._weights_frames = proto.encode(msg)
        self._send_weights()
        self._since_publish = 0
        self.counters["weights_published_total"] += 1
        if self.version == 1 or self.counters["weights_published_total"] == 1:
            log.info("learner: published weights version %d (%s)", self.version, self.core.name)

    def _send_weights(self) -> None:
        assert self._weights_frames is not None
        try:
            self.pub.send_multipart(self._weights_frames, flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:  # PUB drops instead of blocking; kept for safety
            pass
        self._last_publish = time.monotonic()

    def _reject(self, where: str, exc: Exception) -> None:
        self.faults.record(where, exc)
        self.counters["rejected_messages_total"] = float(self.faults.total)

    # ---- timers, telemetry, control, checkpoints -------------------------------------------------------------
    def _timers(self) -> None:
        now = time.monotonic()
        if self.telemetry.due(now):
            self.send_telemetry()
        if self._weights_frames is not None and now - self._last_publish >= self.settings.weights_republish_s:
            self._send_weights()  # same version again, for subscribers that joined late
        if self.settings.checkpoint_dir and now >= self._next_checkpoint:
            self.checkpoint("periodic")
        if (not self.paused and self._outstanding
                and now - max(self._last_progress, max(self._outstanding.values()))
                >= self.settings.request_timeout_s):
            log.warning("learner: no batch from %s for %.0f s; re-sending %d sample requests",
                        self.settings.sample_endpoint, self.settings.request_timeout_s, len(self._outstanding))
            self.counters["requests_resent_total"] += len(self._outstanding)
            self._outstanding.clear()
            self._last_progress = now
            self._fill_requests()

    def send_telemetry(self) -> None:
        now = time.monotonic()
        w = self._window
        elapsed = max(now - w["t"], 1e-9)
        if w["updates"]:
            n = w["updates"]
            self.gauges.update(loss=w["loss"] / n, td_error_mean=w["td"] / n, q_mean=w["q"] / n)
        gauges = {
            **self.gauges,
            "updates_per_second": w["updates"] / elapsed,
            "data_wait_ratio": min(1.0, w["wait"] / elapsed) if not self.paused else 0.0,
            "weight_version": float(self.version), "beta": self.beta, "lr": self.core.lr,
            "paused": float(self.paused), "requests_in_flight": float(len(self._outstanding)),
            "update_step": float(self.core.updates),
        }
        gauges = {k: v for k, v in gauges.items() if math.isfinite(v)}
        self.counters["rejected_messages_total"] = float(self.faults.total)
        info = {"device": str(self.core.device), "network": self.core.name, "env_id": self.settings.env_id,
                "state": "paused" if self.paused else "running"}
        self.telemetry.send(dict(self.counters), gauges, info)
        self.last_gauges = gauges  # what was last reported; for tests and the CLI's progress line
        self._window = {"t": now, "wait": 0.0, "updates": 0, "loss": 0.0, "td": 0.0, "q": 0.0}

    def checkpoint(self, why: str) -> Path | None:
        if not self.settings.checkpoint_dir:
            log.warning("learner: checkpoint requested (%s) but no --checkpoint-dir is set", why)
            return None
        self._next_checkpoint = time.monotonic() + self.settings.checkpoint_interval_s
        try:
            path = save_checkpoint(self.settings.checkpoint_dir, self.core, self.version)
        except OSError as exc:
            log.error("learner: checkpoint (%s) failed: %s", why, exc)
            return None
        self.counters["checkpoints_total"] += 1
        log.info("learner: checkpoint (%s) at update %d, weight version %d -> %s",
                 why, self.core.updates, self.version, path)
        return path

    def handle_control(self, command: proto.Control) -> None:
        """pause | resume | set_lr / set {lr, publish_interval_updates} | checkpoint; others are not ours."""
        name = command.command
        if name == "pause" and not self.paused:
            self.paused = True
            self.poller.unregister(self.dealer)
            log.info("learner: paused by control command %d", command.seq)
        elif name == "resume" and self.paused:
            self.paused = False
            self.poller.register(self.dealer, zmq.POLLIN)
            self._last_progress = time.monotonic()
            log.info("learner: resumed by control command %d", command.seq)
        elif name == "checkpoint":
            self.checkpoint(f"control command {command.seq}")
        elif name in ("set", "set_lr"):  # the gateway sends set_lr {"lr": x}
            self._set(command)

    def _set(self, command: proto.Control) -> None:
        for key, value in command.args.items():
            try:
                if key == "lr":
                    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
                        raise ControlArgError(f"set lr needs a number in (0, 1], got {value!r}")
                    self.core.set_lr(float(value))
                elif key == "publish_interval_updates":
                    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                        raise ControlArgError(f"set publish_interval_updates needs an int >= 1, got {value!r}")
                    self.publish_interval = value
                else:
                    continue  # meant for another service (e.g. epsilon for actors)
            except ControlArgError as exc:
                self._reject("control", exc)
                continue
            log.info("learner: set %s=%r by control command %d", key, value, command.seq)
