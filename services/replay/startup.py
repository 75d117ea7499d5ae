"""Replay start-up from settings: the core, a restored checkpoint, demonstrations, the snapshotter."""

from __future__ import annotations

import logging

from flywheel.demos import DemoFileError, open_demos

from . import checkpoint
from .core import ReplayConfig, ReplayCore
from .settings import ReplaySettings
from .snapshot import Snapshotter
from .storage import SchemaMismatch

log = logging.getLogger("flywheel.replay")


def build_core(settings: ReplaySettings) -> ReplayCore:
    return ReplayCore(ReplayConfig(
        capacity=settings.capacity, prioritized=settings.prioritized, alpha=settings.alpha,
        min_size_to_sample=settings.min_size_to_sample, samples_per_insert=settings.samples_per_insert,
        error_buffer=settings.error_buffer, block_inserts=settings.block_inserts, seed=settings.seed,
        dedup_frames=settings.dedup_frames, frame_ratio=settings.frame_ratio, demo_ratio=settings.demo_ratio,
        pack_frames=settings.frame_packing == "lz4",
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


def load_demos(core: ReplayCore, settings: ReplaySettings) -> bool:
    """Load ``settings.demo_path`` into the core when set; False (and one error line) when it cannot be used."""
    if settings.demo_path is None:
        return True
    try:
        demos = open_demos(settings.demo_path)
        count = core.load_demos(demos.count, demos.obs_shape, demos.obs_dtype, demos.episodes())
    except (DemoFileError, SchemaMismatch, ValueError) as exc:
        log.error("cannot load demonstrations from %s: %s", settings.demo_path, exc)
        return False
    log.info("demonstrations: %d transitions of %s from %s, %.0f%% of every batch", count, demos.env_id,
             settings.demo_path, 100 * settings.demo_ratio)
    return True


def start_core(settings: ReplaySettings) -> ReplayCore | None:
    """The core, restored and with its demonstrations; None when start-up must stop (already logged)."""
    core = restore(build_core(settings), settings)
    return core if core is not None and load_demos(core, settings) else None


def snapshotter(core: ReplayCore, settings: ReplaySettings) -> Snapshotter | None:
    """Checkpoints of ``core`` into ``settings.checkpoint_dir``; None without one."""
    if settings.checkpoint_dir is None:
        return None
    return Snapshotter(settings.checkpoint_dir, core.state_dict, lambda: core.size,
                       info=lambda: {"instance": settings.instance, "capacity": settings.capacity},
                       background=settings.checkpoint_background)
