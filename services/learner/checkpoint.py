"""Learner checkpoints: one safetensors file (networks, Adam state, RNG) with JSON metadata, written atomically."""

from __future__ import annotations

import json
import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from flywheel.checkpoints import (  # the format, which flywheel.policy reads too
    CHECKPOINT_FILE,
    FORMAT,
    FORMAT_VERSION,
    CheckpointError,
    check_format,
    process_running,
    write_atomically,
)

from .core import LearnerCore
from .state import StateError

_RNG_KEY = re.compile(r"rng\.(cpu|cuda\.\d{1,3})")
log = logging.getLogger("flywheel.learner")


@dataclass
class CheckpointInfo:
    """What a checkpoint says about the run it came from."""

    path: Path
    network: str
    updates: int
    weight_version: int
    saved_at: float



def checkpoint_path(directory: str | os.PathLike[str]) -> Path:
    return Path(directory) / CHECKPOINT_FILE


VERSIONS_FILE = "weights-versions.json"


def reserved_version(directory: str | os.PathLike[str]) -> int:
    """The highest weight version a learner with this checkpoint directory may have published (0: none noted).

    A learner killed between checkpoints has published versions above its checkpoint's; resuming above this
    number keeps versions strictly increasing for the actors, which refuse older ones as stale.
    """
    path = Path(directory) / VERSIONS_FILE
    try:
        value = json.loads(path.read_text()).get("reserved")
    except FileNotFoundError:
        return 0
    except (OSError, ValueError, AttributeError) as exc:
        raise CheckpointError(f"{path} is unreadable ({exc}); delete it only if no actor saw this run's "
                              "weights") from None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise CheckpointError(f"{path}: 'reserved' is not a non-negative int")
    return value


def reserve_versions(directory: str | os.PathLike[str], upto: int) -> None:
    """Note that versions up to ``upto`` may be published (tmp + fsync + os.replace: a kill leaves one of both)."""
    path = Path(directory) / VERSIONS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, json.dumps({"reserved": int(upto), "saved_at": time.time()}).encode())


def save_checkpoint(directory: str | os.PathLike[str], core: LearnerCore, weight_version: int) -> Path:
    """Write online, target, optimizer state, RNG, update step and weight version; tmp + fsync + os.replace."""
    path = checkpoint_path(directory)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {"rng.cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and core.cuda:
        for index, rng in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"rng.cuda.{index}"] = rng
    state, core_meta = core.state_dict()
    tensors.update(state)
    meta = {"format": FORMAT, "format_version": FORMAT_VERSION, **core_meta, "weight_version": int(weight_version),
            "saved_at": time.time(), "env_id": getattr(core, "env_id", None)}
    write_atomically(path, st_save(tensors, metadata={"flywheel": json.dumps(meta)}), sync_dir=True)
    _remove_stale_temps(path.parent)
    return path


def _remove_stale_temps(directory: Path) -> None:
    """Delete temp files that writers killed mid-write left behind (their process no longer runs)."""
    for tmp in directory.glob(".*.tmp"):
        pid = tmp.name.rsplit(".", 2)[-2]
        if pid.isdigit() and int(pid) != os.getpid() and not process_running(int(pid)):
            tmp.unlink(missing_ok=True)


def _read(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    if not path.is_file():
        raise CheckpointError(f"no learner checkpoint at {path}; start without --resume or fix --checkpoint-dir")
    blob = path.read_bytes()
    try:
        tensors = st_load(blob)
        header_len = int.from_bytes(blob[:8], "little")
        header = json.loads(blob[8:8 + header_len])
        meta = json.loads(header.get("__metadata__", {}).get("flywheel", "null"))
    except (SafetensorError, ValueError, TypeError, KeyError, AttributeError) as exc:
        raise CheckpointError(f"{path} is not a readable learner checkpoint: {exc}".splitlines()[0]) from None
    meta = check_format(meta, path)
    for key in ("updates", "weight_version"):
        if not isinstance(meta.get(key), int) or meta[key] < 0:
            raise CheckpointError(f"{path}: metadata field {key!r} is missing or not a non-negative int")
    return tensors, meta



def load_checkpoint(directory: str | os.PathLike[str], core: LearnerCore) -> CheckpointInfo:
    """Restore ``core`` from ``directory``; everything is checked before anything is changed."""
    path = checkpoint_path(directory)
    tensors, meta = _read(path)
    for key, value in tensors.items():
        if key.startswith("rng.") and (not _RNG_KEY.fullmatch(key) or value.dtype != torch.uint8 or value.dim() != 1):
            raise CheckpointError(f"{path}: {key} is not a torch RNG state")
    try:
        core.load_state_dict({k: v for k, v in tensors.items() if not k.startswith("rng.")}, meta)
    except StateError as exc:
        raise CheckpointError(f"{path}: {exc}") from None
    _restore_rng(path, tensors)
    return CheckpointInfo(path=path, network=str(meta["network"]), updates=core.updates,
                          weight_version=int(meta["weight_version"]), saved_at=float(meta.get("saved_at", 0.0)))


def _restore_rng(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    if "rng.cpu" in tensors:
        torch.set_rng_state(tensors["rng.cpu"])
    cuda = [tensors[k] for k in sorted((k for k in tensors if k.startswith("rng.cuda.")),
                                       key=lambda k: int(k.rsplit(".", 1)[1]))]
    if cuda and torch.cuda.is_available():
        if len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)
        else:
            log.warning("learner: %s holds RNG states of %d GPUs, this machine has %d; GPU RNG not restored",
                        path, len(cuda), torch.cuda.device_count())
