"""The learning loop: batches in, updates, priorities out; weights, metrics, checkpoints and control; owns its parts."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from flywheel import proto
from flywheel.metrics_spec import Gauges, LearnerCounters, LearnerGauges
from flywheel.settings import setting_default, shared_values

from .batches import ReadyBatch
from .best import BestKeeper, evaluable
from .checkpoint import reserve_versions, save_checkpoint
from .core import LearnerCore, linear_at, network_for
from .metrics import GpuProbe, MetricsWindow, flops_per_update
from .publishing import WeightsSnapshots
from .resets import ResetSchedule, shrink_and_perturb
from .settings import LearnerSettings
from .transport import LearnerSockets

log = logging.getLogger("flywheel.learner")
MAX_POLL_MS = 100
CONTROL_EVERY_S = 0.01  # while training, commands are read at most this often (a read costs microseconds)
_default = partial(setting_default, LearnerSettings)  # a settings field's default: each value is written once


@dataclass(frozen=True)
class LoopConfig:
    """What the learning loop takes of the learner's settings (LearnerSettings' fields of the same names): its
    schedules, when it publishes, reports, checkpoints and stops, and its greedy evaluations."""

    env_id: str = _default("env_id")
    batch_size: int = _default("batch_size")  # the FLOPS of an update (the achieved_tflops gauge)
    lr: float = _default("lr")
    lr_final: float = _default("lr_final")
    lr_decay_updates: int = _default("lr_decay_updates")
    beta_start: float = _default("beta_start")
    beta_end: float = _default("beta_end")
    beta_anneal_updates: int = _default("beta_anneal_updates")
    publish_interval_updates: int = _default("publish_interval_updates")
    publish_interval_s: float = _default("publish_interval_s")
    metrics_interval_updates: int = _default("metrics_interval_updates")
    max_updates: int = _default("max_updates")
    checkpoint_dir: str | None = _default("checkpoint_dir")
    checkpoint_interval_s: float = _default("checkpoint_interval_s")
    best_eval_interval_s: float = _default("best_eval_interval_s")
    best_eval_episodes: int = _default("best_eval_episodes")
    best_eval_seed: int = _default("best_eval_seed")
    best_eval_max_steps: int = _default("best_eval_max_steps")
    best_eval_epsilon: float = _default("best_eval_epsilon")
    best_eval_noop_max: int = _default("best_eval_noop_max")
    reset_interval_updates: int = _default("reset_interval_updates")
    reset_start_updates: int = _default("reset_start_updates")
    reset_shrink: float = _default("reset_shrink")
    reset_end_updates: int = _default("reset_end_updates")

    @classmethod
    def of(cls, settings: LearnerSettings) -> LoopConfig:
        """The values of ``settings`` this config holds."""
        return cls(**shared_values(settings, cls))


class LearnerLoop:
    """One learner at run time: its core, the sockets it learns through and the state control commands change.

    ``run`` turns ``step`` until stopped (``stop``, safe from a signal handler) or ``max_updates``; each turn trains
    on a ready batch, hands its priorities to the sampling thread and publishes weights every K updates or T
    seconds. Control commands are read from the control socket here, as the actor's loop and the replay read
    theirs, and go through a table of handlers, one per kind the learner obeys. ``close`` closes every part.
    """

    def __init__(self, config: LoopConfig, core: LearnerCore, sockets: LearnerSockets, *,
                 start_version: int = 0, resumed: bool = False) -> None:
        self.config, self.core, self.sockets = config, core, sockets
        self.feeder, self.control, self.faults = sockets.feeder, sockets.control, sockets.faults
        self.sampler, self.group = self.feeder.client, self.feeder.group
        self.weights, self.telemetry = sockets.weights, sockets.telemetry
        self.weights_endpoint = self.weights.endpoint
        self.snapshots = WeightsSnapshots(core.acting, core.name, start_version=start_version,
                                          every_updates=config.publish_interval_updates,
                                          every_seconds=config.publish_interval_s,
                                          reserve=self._reserve_versions if config.checkpoint_dir else None)
        self.paused = False
        self.lr_scheduled = config.lr_decay_updates > 0  # until a set_lr command takes the rate over
        K = proto.CommandKind
        self.handlers: proto.CommandHandlers = {
            K.PAUSE: self._on_pause, K.RESUME: self._on_resume, K.CHECKPOINT: self._on_checkpoint,
            K.SET_LR: self._on_set_lr, K.SET_PUBLISH_INTERVAL: self._on_publish_interval,
        }
        self._stop = False
        self._next_control = 0.0
        self._metrics_step = core.steps
        self._skipped_total = 0
        self._next_checkpoint = time.monotonic() + config.checkpoint_interval_s
        self.counters = LearnerCounters()
        self.resets = ResetSchedule(config.reset_interval_updates, config.reset_start_updates, config.reset_shrink,
                                    config.reset_end_updates)
        if self.resets.interval:
            self.counters.resets_total = 0.0
        self.replay_size = 0.0
        self.window = MetricsWindow()
        self.gpu = GpuProbe(core.device)
        self._flops_per_update = flops_per_update(core, config.batch_size) if self.gpu.enabled else 0
        self.last_gauges: dict[str, float] = {}
        self.best = BestKeeper(config.checkpoint_dir, config.env_id, interval_s=config.best_eval_interval_s,
                               episodes=config.best_eval_episodes, seed=config.best_eval_seed,
                               max_steps=config.best_eval_max_steps or None, epsilon=config.best_eval_epsilon,
                               noop_max=config.best_eval_noop_max, resumed=resumed) if (
            config.checkpoint_dir and config.best_eval_interval_s > 0 and evaluable(config.env_id)) else None

    # ---- lifecycle -------------------------------------------------------------------------------------------
    @property
    def version(self) -> int:
        """The last published weight version (0 = none yet)."""
        return self.snapshots.version

    @property
    def publish_interval(self) -> int:
        return self.snapshots.every_updates

    def stop(self) -> None:
        """Ask the loop to finish (safe from a signal handler)."""
        self._stop = True

    @property
    def beta(self) -> float:
        s = self.config
        return linear_at(self.core.steps, s.beta_start, s.beta_end, s.beta_anneal_updates)

    def _schedule_lr(self) -> None:
        """Adam's rate for the next update, linear from lr to lr_final over lr_decay_updates (when scheduled)."""
        if self.lr_scheduled:
            s = self.config
            self.core.set_lr(linear_at(self.core.steps, s.lr, s.lr_final, s.lr_decay_updates))

    @property
    def waiting_batches(self) -> int:
        """Batches received and checked but not yet trained on."""
        return self.feeder.delivered - self.feeder.taken

    def run(self) -> int:
        """Loop until stopped or max_updates; then leave a checkpoint (if configured) and return 0.

        If the sampling thread dies, the learner stops with one error line, still leaving its checkpoint (1).
        """
        self.start()
        code = 0
        while not self._stop:
            if self.config.max_updates and self.core.steps >= self.config.max_updates:
                log.info("learner: reached max_updates=%d, stopping", self.config.max_updates)
                break
            if self.feeder.error is not None:
                log.error("learner: stopping, sampling failed: %s", self.feeder.error)
                code = 1
                break
            self.step(MAX_POLL_MS)
        self.finish()
        return code

    def start(self) -> None:
        """Publish the starting weights (so actors get some early) and start sampling."""
        self.snapshots.begin(self.core.steps)
        self._schedule_lr()  # a resumed run goes on where its schedule was
        self._publish_ready(wait=True)
        self.feeder.beta = self.beta
        self.feeder.start()

    def finish(self) -> None:
        """Send the last priorities and telemetry and leave a checkpoint when a directory is set."""
        self.feeder.stop()
        self.send_telemetry()
        if self.config.checkpoint_dir:
            self.checkpoint("stop")

    def step(self, timeout_ms: int) -> None:
        """One turn: control commands, then a ready batch trained on (waiting up to ``timeout_ms`` for one; while
        paused, waiting that long for a command instead, as the actor does), weights and timers."""
        if self.paused:
            self.control.sock.poll(timeout_ms)  # batches that arrive meanwhile wait in the feeder's queue
            self.take_control()
        else:
            now = time.monotonic()
            if now >= self._next_control:
                self._next_control = now + CONTROL_EVERY_S
                self.take_control()
        if not self.paused:
            start = time.monotonic()
            ready = self.feeder.take(timeout_ms)
            waited = time.monotonic() - start
            self.window.wait_s += waited
            self.counters.data_wait_seconds_total += waited
            if ready is not None:
                self.train(ready)
        self._publish_ready(wait=False)
        self._timers()

    def close(self) -> None:
        if self.best is not None:
            self.best.close()  # also when the loop died before finish() (idempotent)
        self.sockets.close()

    # ---- data path -------------------------------------------------------------------------------------------
    def train(self, ready: ReadyBatch) -> None:
        """Update on one batch; hand its priorities to the sampling thread; publish weights when due."""
        self.feeder.beta = self.beta
        self._schedule_lr()
        result = self.core.update(ready.tensors)
        self.feeder.done(ready, result.td_abs)
        self.replay_size = float(ready.replay_size)
        self.counters.samples_total += result.batch_size
        self.window.samples += result.batch_size
        if not result.stepped:
            return
        self.window.steps += 1
        steps = self.core.steps
        if steps - self._metrics_step >= self.config.metrics_interval_updates:
            self._read_metrics()
        if self.resets.due(steps):
            self._reset(steps)
        if self.snapshots.due(steps, time.monotonic()):
            self.snapshots.begin(steps)

    def _reset(self, steps: int) -> None:
        """Shrink and perturb the online network (services/learner/resets.py)."""
        core = self.core
        shrink_and_perturb(core.online, network_for(core.obs_shape, core.n_actions, core.config), self.resets.shrink)
        self.counters.resets_total = (self.counters.resets_total or 0.0) + 1
        log.info("learner: shrink-and-perturb at update %d: each online weight is now %.2f of itself and %.2f of a "
                 "fresh initialisation's", steps, self.resets.shrink, 1.0 - self.resets.shrink)

    def _read_metrics(self) -> None:
        """One device read: loss/TD/Q sums since the last read and the skipped-step total."""
        sums = self.core.drain_metrics()
        self.window.add_sums(sums)
        self.counters.demo_samples_total += sums.demo_rows
        self._skipped_total = sums.skipped_total
        self._metrics_step = self.core.steps

    def _publish_ready(self, *, wait: bool) -> None:
        msg = self.snapshots.take(time.monotonic(), wait=wait)
        if msg is None:
            return
        self.weights.publish(msg)
        self.counters.weights_published_total += 1
        if self.counters.weights_published_total == 1:
            log.info("learner: published weights version %d (%s, run id %s)", msg.version, self.core.name, msg.run_id)

    def _reserve_versions(self, upto: int) -> None:
        """Note in the checkpoint directory that versions up to ``upto`` may go out (read by --resume)."""
        assert self.config.checkpoint_dir is not None
        try:
            reserve_versions(self.config.checkpoint_dir, upto)
        except OSError as exc:
            log.error("learner: cannot note weight versions up to %d in %s (%s); a resume after a crash may "
                      "publish versions the actors refuse as stale", upto, self.config.checkpoint_dir, exc)

    # ---- timers, telemetry, control, checkpoints -------------------------------------------------------------
    def _timers(self) -> None:
        now = time.monotonic()
        if not self.paused and self.snapshots.due(self.core.steps, now):
            self.snapshots.begin(self.core.steps)  # the T-seconds timer
        if self.telemetry.due(now):
            self.send_telemetry()
        self.weights.tick(now)  # the same version again, for subscribers that joined late
        if self.config.checkpoint_dir and now >= self._next_checkpoint:
            self.checkpoint("periodic")
        if self.best is not None and not self.paused:
            self.best.tick(now, self.core, self.version)

    def send_telemetry(self) -> None:
        self._read_metrics()
        now = time.monotonic()
        counters = self.counters  # what is only read here is brought up to date here
        counters.updates_total = float(self.core.steps - self._skipped_total)
        counters.skipped_updates_total = float(self._skipped_total)
        counters.messages_rejected_total = float(self.faults.total)
        counters.control_rejected_total = float(self.control.rejected)  # refused by the subscriber
        counters.weights_fanout_bytes_total = float(self.weights.fanout_bytes_total)
        counters.weights_publishes_deferred_total = float(self.weights.shaper.deferred_total)
        training, gpu = self.window.gauges(now, self.paused), self.gpu.gauges()
        learner = LearnerGauges(
            weight_version=float(self.version), beta=self.beta, lr=self.core.lr, paused=float(self.paused),
            requests_in_flight=float(self.sampler.outstanding), batches_waiting=float(self.waiting_batches),
            update_step=float(self.core.steps), replay_size=self.replay_size,
            publish_interval_updates=float(self.snapshots.every_updates),
            publish_interval_seconds=float(self.snapshots.every_seconds),
            weights_subscribers=float(self.weights.subscribers), weights_min_interval_seconds=self.weights.min_interval)
        if gpu is not None:  # what the GPU computes: convolutions and matmuls of the updates, in TFLOPS
            learner.achieved_tflops = training.updates_per_second * self._flops_per_update / 1e12
        reported = {**counters.as_dict(), **self.sampler.counters.as_dict(), **self.faults.as_counters()}
        gauge_parts: list[Gauges] = [training, learner, *([gpu] if gpu is not None else [])]
        if self.best is not None:
            reported.update(self.best.counters().as_dict())
            gauge_parts.append(self.best.gauges())
        merged = {key: value for part in gauge_parts for key, value in part.as_dict().items()}
        gauges = {key: value for key, value in merged.items() if np.isfinite(value)}  # NaN: no value yet
        info = {"device": str(self.core.device), "network": self.core.name, "env_id": self.config.env_id,
                "state": "paused" if self.paused else "running", "precision": self.core.config.precision,
                "compile": self.core.compile_state, "sample_path": self.sampler.path,
                **(self.best.labels() if self.best is not None else {})}  # the labels of the eval_* measures
        self.telemetry.send(reported, gauges, info)
        self.last_gauges = gauges  # what was last reported; for tests and the CLI's progress line
        self.window.reset(now)

    def checkpoint(self, why: str) -> Path | None:
        if not self.config.checkpoint_dir:
            log.warning("learner: checkpoint requested (%s) but no --checkpoint-dir is set", why)
            return None
        self._next_checkpoint = time.monotonic() + self.config.checkpoint_interval_s
        try:
            path = save_checkpoint(self.config.checkpoint_dir, self.core, self.version)
        except OSError as exc:
            log.error("learner: checkpoint (%s) failed: %s", why, exc)
            return None
        self.counters.checkpoints_total += 1
        log.info("learner: checkpoint (%s) at update %d, weight version %d -> %s",
                 why, self.core.steps, self.version, path)
        return path

    def take_control(self) -> None:
        """Run the pending commands: pause | resume | set_lr | set_publish_interval | checkpoint; others are not
        ours. Commands arrive checked: bad ones were refused and counted by the subscriber
        (``control_rejected_total``)."""
        for command in self.control.drain():
            proto.dispatch(command, self.handlers)

    def _on_pause(self, command: proto.Command[proto.PauseArgs]) -> None:
        if not self.paused:
            self.paused = self.feeder.paused = True
            log.info("learner: paused by control command %d", command.seq)

    def _on_resume(self, command: proto.Command[proto.ResumeArgs]) -> None:
        if self.paused:
            self.sampler.idle_since_now()
            self.paused = self.feeder.paused = False
            log.info("learner: resumed by control command %d", command.seq)

    def _on_checkpoint(self, command: proto.Command[proto.CheckpointArgs]) -> None:
        self.checkpoint(f"control command {command.seq}")

    def _on_set_lr(self, command: proto.Command[proto.LrArgs]) -> None:
        self.core.set_lr(command.args.lr)
        log.info("learner: learning rate %.3g (control command %d)%s", command.args.lr, command.seq,
                 "; the lr_decay_updates schedule is off from here" if self.lr_scheduled else "")
        self.lr_scheduled = False

    def _on_publish_interval(self, command: proto.Command[proto.PublishIntervalArgs]) -> None:
        self.snapshots.set_interval(updates=command.args.updates, seconds=command.args.seconds)
        log.info("learner: publishing weights every %d updates / %.3g s (control command %d)",
                 self.snapshots.every_updates, self.snapshots.every_seconds, command.seq)
