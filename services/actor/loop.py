"""The acting loop: steps the envs, sends rows, follows weights, lease and control, reports; owns its parts."""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

from flywheel import proto
from flywheel.transport import ControlSubscriber, FaultCounter, TelemetryReporter

from .clips import ClipFilmer
from .core import ActorCore
from .exploration import Exploration
from .report import StepRate, actor_report
from .start_pools import StartPools
from .transport import LeaseClient, TransitionSender, WeightsReceiver

log = logging.getLogger("flywheel.actor")
PAUSED_POLL_MS = 200  # while paused, wait this long on the control socket per turn


class ActorLoop:
    """One actor at run time: its core, the sockets it acts through and the state control commands change.

    ``run`` turns ``step`` until stopped (``stop``, safe from a signal handler) or ``max_env_steps``; control
    commands go through a table of handlers, one per kind the actor obeys (pause, resume, set_exploration).
    ``close`` writes the start-state pools (if any), sends what is buffered, gives the lease back and closes every
    part.
    """

    def __init__(self, core: ActorCore, *, sender: TransitionSender, weights: WeightsReceiver, lease: LeaseClient,
                 control: ControlSubscriber, telemetry: TelemetryReporter, faults: FaultCounter,
                 exploration: Exploration, clips: ClipFilmer | None = None, max_env_steps: int = 0,
                 info: dict[str, str] | None = None, pools: StartPools | None = None) -> None:
        self.core, self.sender, self.weights, self.lease = core, sender, weights, lease
        self.pools = pools  # the envs' start-state pools, written now and then and at close
        self.control, self.telemetry, self.faults, self.clips = control, telemetry, faults, clips
        self.exploration = exploration
        self.max_env_steps = max_env_steps
        self.info = dict(info or {})
        self.running = True
        self.paused = False
        self.closed = False
        self.rate = StepRate(time.monotonic())
        K = proto.CommandKind
        self.handlers: proto.CommandHandlers = {
            K.PAUSE: self._on_pause, K.RESUME: self._on_resume, K.SET_EXPLORATION: self._on_exploration,
        }

    def stop(self) -> None:
        """Ask the loop to finish after this turn (only sets a flag)."""
        self.running = False

    # ---- exploration -----------------------------------------------------------------------------------------
    def set_epsilon(self) -> None:
        """Give the core the rates of the exploration setting over the slots of the current lease."""
        core, lease = self.core, self.lease
        rates = self.exploration.rates(lease.index, lease.count, core.slots)
        if not np.array_equal(rates, core.epsilons):
            log.info("epsilon %.5f-%.5f over %d env slots (actor %d of %d, slots %d-%d of %d)", rates.min(),
                     rates.max(), core.slots, lease.index, lease.count, lease.index * core.slots,
                     (lease.index + 1) * core.slots - 1, lease.count * core.slots)
        core.epsilon = rates

    def _tick_lease(self, now: float) -> None:
        if self.lease.tick(now) and self.exploration.epsilon is None:
            self.set_epsilon()

    # ---- control ---------------------------------------------------------------------------------------------
    def take_control(self) -> None:
        """Run the pending commands (checked when decoded; bad ones were counted and dropped)."""
        for command in self.control.drain():
            log.info("control: %s %s", command.kind, command.args.to_wire())
            proto.dispatch(command, self.handlers)

    def _on_pause(self, _command: proto.Command[proto.PauseArgs]) -> None:
        self.paused = True

    def _on_resume(self, _command: proto.Command[proto.ResumeArgs]) -> None:
        self.paused = False

    def _on_exploration(self, command: proto.Command[proto.ExplorationArgs]) -> None:
        self.exploration.apply(command.args)
        self.set_epsilon()

    # ---- the loop --------------------------------------------------------------------------------------------
    def step(self) -> None:
        """One turn: control, lease, weights, then one env step sent (or a wait while paused), telemetry."""
        now = time.monotonic()
        self.take_control()
        self._tick_lease(now)
        self.weights.poll(now)
        if self.paused:
            self.control.sock.poll(PAUSED_POLL_MS)
        else:
            self.sender.add(self.core.step(), self.weights.version, self._running, self._idle)
            if self.pools is not None and self.pools.due(now):
                self.sender.add(self.pools.save(self.core, now), self.weights.version, self._running, self._idle)
        self.report()

    def run(self) -> int:
        """Turn until stopped or ``max_env_steps``; 0, or 1 when an environment failed (one error line)."""
        try:
            while self.running:
                self.step()
                if self.max_env_steps and self.core.env_steps >= self.max_env_steps:
                    log.info("reached %d env steps, stopping", self.core.env_steps)
                    break
        except RuntimeError as exc:  # EnvWorkerError and env failures: one clear line, non-zero exit
            log.error("actor stopping: %s", exc)
            return 1
        return 0

    def wait_for_weights(self, timeout_s: float) -> bool:
        """Before the first step: wait up to ``timeout_s`` for the learner's first weights, lease and telemetry going
        on (stopping ends the wait); whether weights came. Which network made the first rows then depends on the
        learner's seed only, not on which process started first."""
        deadline = time.monotonic() + timeout_s
        while self.running and self.weights.version == 0 and time.monotonic() < deadline:
            self.weights.sock.poll(100)
            self._idle()
        return self.weights.version > 0

    def _running(self) -> bool:
        return self.running

    def _idle(self) -> None:
        """While a send blocks: keep the lease, the weights and the telemetry going."""
        now = time.monotonic()
        self._tick_lease(now)
        self.weights.poll(now)
        self.report()

    def report(self) -> None:
        """Send a telemetry report when one is due."""
        now = time.monotonic()
        if not self.telemetry.due(now):
            return
        counters, gauges = actor_report(self.core, self.sender, self.weights, self.lease, paused=self.paused,
                                        rate=self.rate, now=now)
        counters.telemetry_dropped_total = self.telemetry.dropped
        if self.clips is not None:
            counters.clips_sent_total, counters.clips_failed_total = self.clips.sent, self.clips.failed
            counters.clip_seconds_total = self.clips.seconds
        self.telemetry.send({**counters.as_dict(), **self.faults.as_counters()}, gauges.as_dict(), self.info)

    def close(self) -> None:
        """Send what is buffered (without waiting), give the lease back and close every socket and the filmer."""
        if self.closed:
            return
        self.closed = True
        if self.pools is not None:
            try:
                self.sender.add(self.pools.save(self.core, time.monotonic()), self.weights.version, lambda: False)
            except RuntimeError as exc:  # an env worker that failed: its pools stay as last written
                log.warning("start states: pools not written at stop: %s", exc)
        self.sender.flush(self.weights.version, lambda: False)
        self.lease.release()
        parts: list[Any] = [self.clips, self.sender, self.weights, self.lease, self.telemetry, self.control]
        for part in parts:
            if part is not None:
                part.close()
