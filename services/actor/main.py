"""Actor entry point: wires ActorSettings to environments, the network and the sockets."""

from __future__ import annotations

import logging
import math
import time
from typing import Any

import numpy as np
import zmq

from flywheel.envs import UnknownEnvironmentError, env_spec
from flywheel.settings import fail
from flywheel.transport import ControlSubscriber, FaultCounter, TelemetryReporter, install_stop_signals

from .clips import ClipFilmer
from .core import ActorCore, build_core
from .exploration import ControlArgError, apex_epsilons, apply_exploration_command
from .malloc import keep_freed_frames
from .policy import build_policy, resolve_backend
from .settings import ActorSettings
from .transport import LeaseClient, TransitionSender, WeightsReceiver, auto_batch_rows

log = logging.getLogger("flywheel.actor")


def _mean(values: object) -> float:
    values = list(values)  # type: ignore[call-overload]
    return float(np.mean(values)) if values else 0.0


def _policy(settings: ActorSettings, spec: Any) -> Any:
    """The acting network as the settings describe it, on one thread."""
    return build_policy(spec.obs_shape, spec.n_actions, dueling=settings.dueling, hidden=settings.hidden,
                        head=settings.head, num_quantiles=settings.num_quantiles, backend=settings.inference,
                        threads=1, seed=settings.seed, freeze=settings.torch_freeze, obs_dtype=spec.obs_dtype)


def _build(settings: ActorSettings) -> tuple[ActorCore, Any]:
    """The network (one thread) and the acting core; a bad env id or option stops the actor with one line."""
    try:
        spec = env_spec(settings.env_id)
        policy = _policy(settings, spec)
        core = build_core(settings.env_id, settings.num_envs, policy, n_step=settings.n_step, gamma=settings.gamma,
                          eval_envs=settings.eval_envs, seed=settings.seed, vector_mode=settings.vector_mode,
                          workers=settings.workers or None)
    except UnknownEnvironmentError:
        raise
    except (TypeError, ValueError, ImportError, RuntimeError) as exc:
        raise fail(f"flywheel actor: cannot build {settings.env_id!r} x {settings.num_envs} "
                   f"(--env-id / FLYWHEEL_ACTOR_ENV_ID, --num-envs): {exc}") from None
    return core, spec


def _telemetry(core: ActorCore, sender: TransitionSender, weights: WeightsReceiver, lease: LeaseClient,
               state: dict[str, Any], rate: dict[str, float], now: float) -> tuple[dict[str, float], dict[str, float]]:
    """Counters and gauges of one report."""
    if now - rate["since"] >= 5.0:  # a 5 s window: blocked actors advance in bursts
        rate["per_s"] = (core.env_steps - rate["steps"]) / (now - rate["since"])
        rate["since"], rate["steps"] = now, core.env_steps
    stats = core.stats
    gauges = {
        "epsilon": core.epsilon, "epsilon_min": float(core.epsilons.min()), "epsilon_max": float(core.epsilons.max()),
        "exploration_slots": core.slots, "weight_version": weights.version,
        "weight_version_newest": weights.newest_seen,
        "policy_lag_versions": weights.lag, "weight_age_seconds": now - weights.updated_at,
        "env_steps_per_second": rate["per_s"], "episode_return_mean": _mean(stats.returns),
        "episode_length_mean": _mean(stats.lengths), "lease_index": lease.index, "lease_slots": lease.count,
        "paused": float(state["paused"]), "send_blocked_seconds": sender.blocked_s, "num_envs": core.num_envs,
        "slot_groups": len(core.groups),
    }
    if stats.returns:
        gauges["episode_return_last"] = stats.returns[-1]
    if stats.distances:
        gauges["mario_distance_mean"] = _mean(stats.distances)
        gauges["mario_distance_max"] = max(stats.distances)
    if stats.flags:
        gauges["mario_flag_rate"] = _mean(stats.flags)
    for key in ("world", "stage"):
        if key in stats.last_metrics:
            gauges[f"mario_{key}_last"] = stats.last_metrics[key]
    if stats.eval_returns:
        gauges["eval_return_mean"] = _mean(stats.eval_returns)
        gauges["eval_return_last"] = stats.eval_returns[-1]
    counters = {
        "env_steps_total": core.env_steps, "episodes_total": stats.episodes,
        "eval_episodes_total": stats.eval_episodes, "transitions_sent_total": sender.sent,
        "transitions_dropped_total": sender.dropped, "weights_received_total": weights.received,
        "weights_rejected_total": weights.rejected, "weights_stale_total": weights.stale,
        "messages_rejected_total": weights.faults.total, "send_seconds_total": sender.send_s,
        "send_blocked_seconds_total": sender.blocked_s, "weights_load_seconds_total": weights.load_s,
        **core.times.as_counters(),
    }
    return counters, gauges


def main(settings: ActorSettings) -> int:
    keep_freed_frames()
    core, spec = _build(settings)  # before any ZeroMQ context: env workers are started first
    policy = core.policy
    ctx = zmq.Context()
    faults = FaultCounter("actor")
    telemetry = TelemetryReporter(ctx, settings.telemetry_endpoint, "actor", settings.instance,
                                  settings.telemetry_interval_s)
    control = ControlSubscriber(ctx, settings.control_endpoint, "actor", settings.instance, faults)
    row_bytes = 2 * math.prod(spec.obs_shape) * np.dtype(spec.obs_dtype).itemsize  # obs and next_obs
    batch_rows = settings.send_batch or auto_batch_rows(settings.num_envs, row_bytes)
    sender = TransitionSender(ctx, settings.transitions_endpoint, settings.instance, hwm=settings.send_hwm,
                              on_full=settings.on_full, batch_rows=batch_rows, sndbuf=settings.send_buffer_kb << 10)
    weights = WeightsReceiver(ctx, settings.weights_endpoint, policy, faults, interval_s=settings.weights_interval_s)
    lease = LeaseClient(ctx, settings.lease_endpoint, settings.instance, faults)
    clips = ClipFilmer(ctx, settings.telemetry_endpoint, settings.instance, settings.env_id, weights,
                       lambda: _policy(settings, spec), interval_s=settings.clip_interval_s,
                       max_steps=settings.clip_max_steps).start() if settings.clip_interval_s > 0 else None
    state: dict[str, Any] = {"running": True, "paused": False, "epsilon_override": settings.epsilon,
                             "base": settings.epsilon_base, "alpha": settings.epsilon_alpha}
    install_stop_signals(lambda: state.update(running=False))

    def running() -> bool:
        return bool(state["running"])

    def set_epsilon() -> None:
        fixed = state["epsilon_override"]
        rates = np.full(core.slots, float(fixed)) if fixed is not None else apex_epsilons(
            lease.index, lease.count, core.slots, state["base"], state["alpha"])
        if not np.array_equal(rates, core.epsilons):
            log.info("epsilon %.5f-%.5f over %d env slots (actor %d of %d, slots %d-%d of %d)", rates.min(),
                     rates.max(), core.slots, lease.index, lease.count, lease.index * core.slots,
                     (lease.index + 1) * core.slots - 1, lease.count * core.slots)
        core.epsilon = rates

    if settings.epsilon is None and not lease.wait_first(3.0):
        log.warning("no lease from %s yet: acting as actor 0 of 1 until one arrives", settings.lease_endpoint)
    set_epsilon()
    log.info("actor %s: %d x %s (%s, %s inference, %d actions, %s, %d slot group(s)), epsilon up to %.4f, sending "
             "%d rows a message to %s", settings.instance, settings.num_envs, settings.env_id, policy.name,
             resolve_backend(spec.obs_shape, settings.inference), spec.n_actions, settings.vector_mode,
             len(core.groups), core.epsilon, batch_rows, settings.transitions_endpoint)
    rate = {"since": time.monotonic(), "steps": 0.0, "per_s": 0.0}

    def report() -> None:
        now = time.monotonic()
        if telemetry.due(now):
            counters, gauges = _telemetry(core, sender, weights, lease, state, rate, now)
            counters["telemetry_dropped_total"] = telemetry.dropped
            if clips is not None:
                counters.update(clips_sent_total=clips.sent, clips_failed_total=clips.failed,
                                clip_seconds_total=clips.seconds)
            telemetry.send(counters, gauges, {"env_id": settings.env_id, "network": policy.name,
                                              "vector_mode": settings.vector_mode})

    def idle() -> None:
        if lease.tick(time.monotonic()) and state["epsilon_override"] is None:
            set_epsilon()
        report()

    code = 0
    try:
        while state["running"]:
            now = time.monotonic()
            for command in control.drain():
                log.info("control: %s %s", command.command, command.args)
                if command.command == "pause":
                    state["paused"] = True
                elif command.command == "resume":
                    state["paused"] = False
                elif command.command == "set_exploration":
                    try:
                        apply_exploration_command(state, command.args)
                    except ControlArgError as exc:
                        faults.record("control", exc)
                        continue
                    set_epsilon()
            if lease.tick(now) and state["epsilon_override"] is None:
                set_epsilon()
            weights.poll(now)
            if state["paused"]:
                control.sock.poll(200)
            else:
                sender.add(core.step(), weights.version, running, idle)
            report()
            if settings.max_env_steps and core.env_steps >= settings.max_env_steps:
                log.info("reached %d env steps, stopping", core.env_steps)
                break
    except RuntimeError as exc:  # EnvWorkerError and env failures: one clear line, non-zero exit
        log.error("actor stopping: %s", exc)
        code = 1
    finally:
        sender.flush(weights.version, lambda: False)
        lease.release()
        for part in (clips, sender, weights, lease, telemetry, control):
            if part is not None:
                part.close()
        ctx.term()
        core.close()
    log.info("actor stopped after %d env steps, %d episodes", core.env_steps, core.stats.episodes)
    return code
