"""Replay start-up from settings: the core, a restored checkpoint, demonstrations, the snapshotter."""

from __future__ import annotations

import logging
from collections.abc import Mapping

import numpy as np

from flywheel.demos import DemoFileError, open_demos
from flywheel.settings import shared_values

from . import checkpoint
from .core import ReplayConfig, ReplayCore
from .settings import ReplaySettings
from .snapshot import Snapshotter
from .storage import SchemaMismatch

log = logging.getLogger("flywheel.replay")

# The fields a restore reads besides the per-slot arrays (storage.py checks those): the dtype each must have and its
# shape (None: any length on that axis; no tuple: any shape), and whether a checkpoint must hold it. A crafted file
# can carry valid CRCs, so each is checked before it is read: a scalar as an array or a string crashed the restore.
_DTYPES = {"int": "an integer", "float": "a float", "uint8": "uint8", "uint64": "uint64"}
FIELDS: dict[str, tuple[str, tuple[int | None, ...] | None, bool]] = {
    "limiter.counts": ("int", (2,), True),
    "config.capacity": ("int", (), True),
    "sampler.max_priority": ("float", (), True),
    "sampler.leaves": ("float", (None,), False),
    "storage.positions": ("int", (2,), True),
    "storage.obs_shape": ("int", (None,), True),
    "storage.obs_dtype": ("uint8", (None,), True),
    "storage.frames.range": ("int", (3,), False),
    "storage.frames.frames": ("uint8", None, False),
    "storage.frames.keys": ("uint64", (None,), False),
}


def build_core(settings: ReplaySettings) -> ReplayCore:
    pack = settings.frame_packing == "lz4"
    return ReplayCore(ReplayConfig(**shared_values(settings, ReplayConfig), pack_frames=pack))


def _dtype_ok(dtype: np.dtype, want: str) -> bool:
    if want == "int":
        return dtype.kind in "iu"
    return dtype.kind == "f" if want == "float" else dtype == np.dtype(want)


def check_state(state: Mapping[str, np.ndarray]) -> None:
    """Refuse, naming the field, a checkpoint whose ``FIELDS`` are missing or of the wrong dtype or shape."""
    for name, (want, shape, required) in FIELDS.items():
        if name not in state:
            if required:
                raise checkpoint.CheckpointError(f"replay checkpoint lacks the field {name}")
            continue
        value = state[name]
        fits = shape is None or (value.ndim == len(shape) and all(
            n is None or n == m for n, m in zip(shape, value.shape, strict=True)))
        if not _dtype_ok(value.dtype, want) or not fits:
            wanted = "any shape" if shape is None else "shape (" + ", ".join(
                "n" if n is None else str(n) for n in shape) + ("," if len(shape) == 1 else "") + ")"
            raise checkpoint.CheckpointError(f"replay checkpoint field {name} is {value.dtype}{list(value.shape)}, "
                                             f"expected {_DTYPES[want]} of {wanted}")


def restore(core: ReplayCore, settings: ReplaySettings) -> ReplayCore | None:
    """Load the checkpoint if there is one; None when it is refused and starting empty was not asked for."""
    directory = settings.checkpoint_dir
    if directory is None or not settings.restore or not checkpoint.exists(directory):
        return core
    try:
        state = checkpoint.load(directory)
        check_state(state)
        core.load_state_dict(state)
    except (checkpoint.CheckpointError, ValueError, KeyError, TypeError) as exc:
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


def sweep(settings: ReplaySettings) -> None:
    """Remove the temp folders of saves killed before this start (each a checkpoint in size), in one log line."""
    if settings.checkpoint_dir is None:
        return
    removed = checkpoint.sweep(settings.checkpoint_dir)
    if removed:
        log.info("removed what killed checkpoint writers left in %s: %s", settings.checkpoint_dir,
                 ", ".join(path.name for path in removed))


def start_core(settings: ReplaySettings) -> ReplayCore | None:
    """The core, restored and with its demonstrations; None when start-up must stop (already logged)."""
    sweep(settings)
    core = restore(build_core(settings), settings)
    return core if core is not None and load_demos(core, settings) else None


def snapshotter(core: ReplayCore, settings: ReplaySettings) -> Snapshotter | None:
    """Checkpoints of ``core`` into ``settings.checkpoint_dir``; None without one."""
    if settings.checkpoint_dir is None:
        return None
    return Snapshotter(settings.checkpoint_dir, core.state_dict, lambda: core.size,
                       info=lambda: {"instance": settings.instance, "capacity": settings.capacity},
                       background=settings.checkpoint_background)
