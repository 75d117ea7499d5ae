"""Replay entry point: wires ReplaySettings to the core (startup.py), its sockets and the event loop."""

from __future__ import annotations

import logging

import zmq

from flywheel.transport import ControlSubscriber, FaultCounter, TelemetryReporter, install_stop_signals

from .settings import ReplaySettings, env_contract
from .shm import ShmSlots
from .startup import snapshotter, start_core
from .storage import SchemaMismatch
from .transport import ReplayServer

log = logging.getLogger("flywheel.replay")


def main(settings: ReplaySettings) -> int:
    try:
        env = env_contract(settings)
    except ValueError as exc:
        log.error("%s", exc)
        return 2
    core = start_core(settings)
    if core is None:
        return 2
    core.check_actions(env.num_actions)
    if env.obs_shape is not None and env.obs_dtype is not None:
        try:
            core.expect_obs(env.obs_shape, env.obs_dtype)
        except SchemaMismatch as exc:
            log.error("%s: %s (another env's checkpoint in %s?)", settings.env_id, exc, settings.checkpoint_dir)
            return 2
    ctx = zmq.Context()
    faults = FaultCounter("replay")
    telemetry = TelemetryReporter(ctx, settings.telemetry_endpoint, "replay", settings.instance,
                                  settings.telemetry_interval_s)
    control = ControlSubscriber(ctx, settings.control_endpoint, "replay", settings.instance, faults)
    shm = ShmSlots(settings.shm_slots, settings.shm_max_slots, max_clients=settings.shm_max_clients,
                   max_bytes=settings.shm_max_mb << 20) if settings.shm else None
    server = ReplayServer(
        core, ctx, transitions_bind=settings.transitions_bind, sample_bind=settings.sample_bind,
        telemetry=telemetry, control=control, faults=faults, transitions_hwm=settings.transitions_hwm,
        max_pending=settings.max_pending_requests, max_message_bytes=settings.max_message_mb << 20,
        snapshotter=snapshotter(core, settings), checkpoint_interval_s=settings.checkpoint_interval_s, shm=shm,
        transitions_rcvbuf=settings.transitions_buffer_kb << 10, max_batch_size=settings.max_batch_size,
    )
    install_stop_signals(server.stop)
    log.info("replay %s: capacity %d, %s sampling, transitions on %s, sampling on %s%s",
             settings.instance, settings.capacity, "prioritized" if settings.prioritized else "uniform",
             ",".join(server.endpoints["transitions"]), ",".join(server.endpoints["sample"]),
             ", shared memory on" if shm else "")
    if env.num_actions:
        log.info("stored transitions are checked against the env: actions 0..%d%s", env.num_actions - 1,
                 f", observations {env.obs_dtype}{env.obs_shape}" if env.obs_shape is not None else "")
    else:
        log.warning("actions of stored transitions are unchecked: set FLYWHEEL_REPLAY_ENV_ID (or NUM_ACTIONS) so "
                    "that rows with actions the learner's network lacks are refused, not sampled")
    try:
        server.run()
    finally:
        server.finish_checkpoints("exit")
        server.close()
        telemetry.close()
        control.close()
        ctx.term()
    log.info("replay stopped with %d transitions", core.size)
    return 0
