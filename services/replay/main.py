"""Replay entry point: wires ReplaySettings to the core, checkpoints, demonstrations and the event loop."""

from __future__ import annotations

import logging

import zmq

from flywheel.demos import DemoFileError, open_demos
from flywheel.transport import ControlSubscriber, FaultCounter, TelemetryReporter, install_stop_signals

from . import checkpoint
from .core import ReplayConfig, ReplayCore
from .settings import ReplaySettings
from .shm import ShmSlots
from .snapshot import Snapshotter
from .storage import SchemaMismatch
from .transport import ReplayServer

log = logging.getLogger("flywheel.replay")


def build_core(settings: ReplaySettings) -> ReplayCore:
    return ReplayCore(ReplayConfig(
        capacity=settings.capacity, prioritized=settings.prioritized, alpha=settings.alpha,
        min_size_to_sample=settings.min_size_to_sample, samples_per_insert=settings.samples_per_insert,
        error_buffer=settings.error_buffer, block_inserts=settings.block_inserts, seed=settings.seed,
        dedup_frames=settings.dedup_frames, frame_ratio=settings.frame_ratio, demo_ratio=settings.demo_ratio,
        gather_threads=settings.gather_threads,
    ))


def restore(core: ReplayCore, settings: ReplaySettings) -> ReplayCore | None:
    """Load the checkpoint if there is one; None when it is refused and starting empty was not asked for."""
    directory = settings.checkpoint_dir
    if directory is None or not settings.restore or not checkpoint.exists(directory):
        return core
    try:
        core.load_state_dict(checkpoint.load(directory))
    except (checkpoint.CheckpointError, ValueError, KeyError) as exc:
        reason = f"cannot restore replay checkpoint from {directory}: {exc}"
        if not settings.start_empty_on_bad_checkpoint:
            log.error("%s (fix or move it, pass --restore false, or --start-empty-on-bad-checkpoint true)", reason)
            return None
        aside = checkpoint.set_aside(directory)
        log.warning("%s; starting empty as asked, the refused checkpoint is kept at %s", reason, aside)
        return build_core(settings)
    log.info("restored %d transitions from %s", core.size, directory)
    return core


def main(settings: ReplaySettings) -> int:
    core = restore(build_core(settings), settings)
    if core is None:
        return 2
    if settings.demo_path is not None:
        try:
            demos = open_demos(settings.demo_path)
            count = core.load_demos(demos.count, demos.obs_shape, demos.obs_dtype, demos.episodes())
        except (DemoFileError, SchemaMismatch, ValueError) as exc:
            log.error("cannot load demonstrations from %s: %s", settings.demo_path, exc)
            return 2
        log.info("demonstrations: %d transitions of %s from %s, %.0f%% of every batch", count, demos.env_id,
                 settings.demo_path, 100 * settings.demo_ratio)
    directory = settings.checkpoint_dir
    snapshotter = None
    if directory is not None:
        snapshotter = Snapshotter(directory, core.state_dict, lambda: core.size,
                                  info=lambda: {"instance": settings.instance, "capacity": settings.capacity},
                                  background=settings.checkpoint_background)
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
        snapshotter=snapshotter, checkpoint_interval_s=settings.checkpoint_interval_s, shm=shm,
        transitions_rcvbuf=settings.transitions_buffer_kb << 10,
    )
    install_stop_signals(server.stop)
    log.info("replay %s: capacity %d, %s sampling, transitions on %s, sampling on %s%s",
             settings.instance, settings.capacity, "prioritized" if settings.prioritized else "uniform",
             settings.transitions_bind, settings.sample_bind, ", shared memory on" if shm else "")
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
