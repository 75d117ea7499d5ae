"""Actor entry point: wires ActorSettings to the acting core (startup.py), its sockets and the loop (loop.py)."""

from __future__ import annotations

import logging

import zmq

from flywheel.transport import ControlSubscriber, FaultCounter, TelemetryReporter, install_stop_signals

from .clips import ClipFilmer
from .exploration import Exploration
from .loop import ActorLoop
from .malloc import keep_freed_frames
from .settings import ActorSettings
from .start_pools import start_pools
from .startup import acting_policy, build_acting, describe, send_batch_rows
from .transport import LeaseClient, TransitionSender, WeightsReceiver

log = logging.getLogger("flywheel.actor")


def main(settings: ActorSettings) -> int:
    keep_freed_frames()
    pools = start_pools(settings)
    core, spec = build_acting(settings, pools)  # before any ZeroMQ context: env workers are started first
    ctx = zmq.Context()
    faults = FaultCounter("actor")
    rows = send_batch_rows(settings, spec)
    weights = WeightsReceiver(ctx, settings.weights_endpoint, core.policy, faults,
                              interval_s=settings.weights_interval_s, max_version_jump=settings.max_version_jump)
    clips = ClipFilmer(ctx, settings.telemetry_endpoint, settings.instance, settings.env_id, weights,
                       lambda: acting_policy(settings, spec), interval_s=settings.clip_interval_s,
                       max_steps=settings.clip_max_steps).start() if settings.clip_interval_s > 0 else None
    loop = ActorLoop(
        core, weights=weights, clips=clips, faults=faults, max_env_steps=settings.max_env_steps,
        sender=TransitionSender(ctx, settings.transitions_endpoint, settings.instance, hwm=settings.send_hwm,
                                on_full=settings.on_full, batch_rows=rows, sndbuf=settings.send_buffer_kb << 10,
                                stall_s=settings.send_stall_s, learner_versions=lambda: weights.arrived),
        lease=LeaseClient(ctx, settings.lease_endpoint, settings.instance, faults),
        control=ControlSubscriber(ctx, settings.control_endpoint, "actor", settings.instance, faults),
        telemetry=TelemetryReporter(ctx, settings.telemetry_endpoint, "actor", settings.instance,
                                    settings.telemetry_interval_s),
        exploration=Exploration(settings.epsilon, settings.epsilon_base, settings.epsilon_alpha),
        pools=pools,
        info={"env_id": settings.env_id, "network": core.policy.name, "vector_mode": settings.vector_mode,
              **{f"{key}_label": label for key, label in spec.measures.labels().items()}})  # the env's measures
    install_stop_signals(loop.stop)
    if settings.epsilon is None and not loop.lease.wait_first(3.0):
        log.warning("no lease from %s yet: acting as actor 0 of 1 until one arrives", settings.lease_endpoint)
    loop.set_epsilon()
    if settings.first_weights_wait_s > 0 and not loop.wait_for_weights(settings.first_weights_wait_s):
        log.warning("no weights from %s within %g s: acting with the actor's own network until they come",
                    settings.weights_endpoint, settings.first_weights_wait_s)
    log.info("%s", describe(settings, core, spec, rows))
    try:
        code = loop.run()
    finally:
        loop.close()
        ctx.term()
        core.close()
    log.info("actor stopped after %d env steps, %d episodes", core.env_steps, core.stats.episodes)
    return code
