"""The learner checkpoint's format (file name, format tag, readable versions), which services/learner/checkpoint.py
writes and flywheel.policy reads, and what the services' checkpoint writers share."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

CHECKPOINT_FILE = "learner.safetensors"
FORMAT = "flywheel-learner-checkpoint"
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)  # version 1 had no RNG, step or gradient-scaler entries


ACTING_PREFIX = "acting"  # the learner's averaged acting network (learner.acting_ema), when it keeps one apart
POLICY_PREFIXES = (ACTING_PREFIX, "online")  # what a checkpoint's policy is: the acting average, else online


def policy_tensors(handle: Any) -> dict[str, Any]:
    """The policy's tensors in an open safetensors file (keys without their prefix): the acting average where the
    file holds one, else the online network."""
    keys = list(handle.keys())
    for prefix in POLICY_PREFIXES:
        chosen = [key for key in keys if key.startswith(prefix + ".")]
        if chosen:
            return {key[len(prefix) + 1:]: handle.get_tensor(key) for key in chosen}
    return {}


class CheckpointError(RuntimeError):
    """A checkpoint is missing, unreadable or made for another network; the message is one line."""


def check_format(meta: object, path: Path, error: type[CheckpointError] = CheckpointError) -> dict[str, Any]:
    """The checkpoint's metadata if it is a learner checkpoint of a readable format version, else ``error``."""
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise error(f"{path} is not a flywheel learner checkpoint (no {FORMAT!r} metadata)")
    if meta.get("format_version") not in READABLE_VERSIONS:
        raise error(f"{path} has checkpoint format {meta.get('format_version')!r}, "
                    f"this build reads {', '.join(map(str, READABLE_VERSIONS))}")
    return meta




def process_running(pid: int) -> bool:
    """True while ``pid`` exists (also when it belongs to another user); a writer's leftovers wait until then."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def write_atomically(path: Path, data: bytes, *, sync_dir: bool = False) -> None:
    """Write ``data`` to ``path`` so that a kill leaves the old file or the new one, never half of one: a temp file
    beside it (``.NAME.PID.tmp``), fsynced, then ``os.replace``; ``sync_dir`` also fsyncs the folder (the rename)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    if sync_dir:
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
