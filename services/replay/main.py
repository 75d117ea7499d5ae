"""Replay entry point: wires ReplaySettings to the core (startup.py), its sockets and the event loop."""

from __future__ import annotations

import logging

import zmq

from flywheel.transport import ControlSubscriber, FaultCounter, TelemetryReporter, install_stop_signals

from .settings import ReplaySettings
from .shm import ShmSlots
from .startup import snapshotter, start_core
from .transport import ReplayServer

log = logging.getLogger("flywheel.replay")


def main(settings: ReplaySettings) -> int:
    core = start_core(settings)
    if core is None:
        return 2
    ctx = zmq.Context()
    faults = FaultCounter("replay")
    telemetry = TelemetryReporter(ctx, settings.telemetry_endpoint, "replay", settings.instance,
                                  settings.telemetry_interval_s)
    control = ControlSubscriber(ctx, settings.control_endpoint, "replay", settings.instance, faults)
    shm = ShmSlots(settings.shm_slots, settings.shm_max_slots) if settings.shm else None
    server = ReplayServer(
        core, ctx, transitions_bind=settings.transitions_bind, sample_bind=settings.sample_bind,
        telemetry=telemetry, control=control, faults=faults, transitions_hwm=settings.transitions_hwm,
        max_pending=settings.max_pending_requests, max_message_bytes=settings.max_message_mb << 20,
        snapshotter=snapshotter(core, settings), checkpoint_interval_s=settings.checkpoint_interval_s, shm=shm,
        transitions_rcvbuf=settings.transitions_buffer_kb << 10,
    )
    install_stop_signals(server.stop)
    log.info("replay %s: capacity %d, %s sampling, transitions on %s, sampling on %s%s",
             settings.instance, settings.capacity, "prioritized" if settings.prioritized else "uniform",
             ",".join(server.endpoints["transitions"]), ",".join(server.endpoints["sample"]),
             ", shared memory on" if shm else "")
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
