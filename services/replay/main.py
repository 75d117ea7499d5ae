"""Replay entry point: wires ReplaySettings to the core, checkpoints and the event loop."""

from __future__ import annotations

import logging

import zmq

from flywheel.transport import ControlSubscriber, FaultCounter, TelemetryReporter, install_stop_signals

from . import checkpoint
from .core import ReplayConfig, ReplayCore
from .settings import ReplaySettings
from .transport import ReplayServer

log = logging.getLogger("flywheel.replay")


def main(settings: ReplaySettings) -> int:
    core = ReplayCore(ReplayConfig(
        capacity=settings.capacity, prioritized=settings.prioritized, alpha=settings.alpha,
        min_size_to_sample=settings.min_size_to_sample, samples_per_insert=settings.samples_per_insert,
        error_buffer=settings.error_buffer, block_inserts=settings.block_inserts, seed=settings.seed,
    ))
    directory = settings.checkpoint_dir
    if directory is not None and settings.restore and checkpoint.exists(directory):
        try:
            core.load_state_dict(checkpoint.load(directory))
        except (checkpoint.CheckpointError, ValueError, KeyError) as exc:
            log.error("cannot restore replay checkpoint from %s: %s (fix or move it, or pass --restore false)",
                      directory, exc)
            return 2
        log.info("restored %d transitions from %s", core.size, directory)

    def save() -> None:
        if directory is not None:
            checkpoint.save(core.state_dict(), directory)

    ctx = zmq.Context()
    faults = FaultCounter("replay")
    telemetry = TelemetryReporter(ctx, settings.telemetry_endpoint, "replay", settings.instance,
                                  settings.telemetry_interval_s)
    control = ControlSubscriber(ctx, settings.control_endpoint, "replay", settings.instance, faults)
    server = ReplayServer(
        core, ctx, transitions_bind=settings.transitions_bind, sample_bind=settings.sample_bind,
        telemetry=telemetry, control=control, faults=faults, transitions_hwm=settings.transitions_hwm,
        max_pending=settings.max_pending_requests, max_message_bytes=settings.max_message_mb << 20,
        checkpoint=save if directory is not None else None, checkpoint_interval_s=settings.checkpoint_interval_s,
    )
    install_stop_signals(server.stop)
    log.info("replay %s: capacity %d, %s sampling, transitions on %s, sampling on %s",
             settings.instance, settings.capacity, "prioritized" if settings.prioritized else "uniform",
             settings.transitions_bind, settings.sample_bind)
    try:
        server.run()
    finally:
        if directory is not None:
            server.checkpoint_now("exit")
        server.close()
        telemetry.close()
        control.close()
        ctx.term()
    log.info("replay stopped with %d transitions", core.size)
    return 0
