"""Atomic replay checkpoints: one .npy per array plus a JSON manifest, loaded without pickle."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import numpy as np

FORMAT = "flywheel-replay"
FORMAT_VERSION = 1


class CheckpointError(RuntimeError):
    """A checkpoint is missing, corrupt or does not fit this replay; the message says which."""


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save(state: dict[str, np.ndarray], directory: Path) -> Path:
    """Write ``directory/replay`` atomically: a temp dir is filled, fsynced and renamed over the old one."""
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / "replay"
    tmp = directory / f".replay.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    manifest = {"format": FORMAT, "version": FORMAT_VERSION, "time": time.time(), "arrays": {}}
    for name, array in state.items():
        file = tmp / f"{name}.npy"
        with open(file, "wb") as fh:
            np.save(fh, np.asarray(array, order="C"), allow_pickle=False)  # ascontiguousarray makes 0-d 1-d
            fh.flush()
            os.fsync(fh.fileno())
        manifest["arrays"][name] = {"dtype": array.dtype.name, "shape": list(array.shape)}
    with open(tmp / "manifest.json", "w") as fh:
        json.dump(manifest, fh)
        fh.flush()
        os.fsync(fh.fileno())
    _fsync_dir(tmp)
    old = directory / f".replay.old-{os.getpid()}"
    shutil.rmtree(old, ignore_errors=True)  # a stale one (same pid after a container restart) blocks the rename
    if final.exists():
        os.replace(final, old)
    # A kill between these two renames leaves only ``old``: ``_current`` falls back to it.
    os.replace(tmp, final)
    _fsync_dir(directory)
    shutil.rmtree(old, ignore_errors=True)
    return final


def _current(directory: Path) -> Path:
    """The checkpoint to read: ``replay``, or the previous one a save was killed while replacing."""
    path = directory / "replay"
    if not (path / "manifest.json").exists():
        olds = sorted(directory.glob(".replay.old-*/manifest.json"), key=lambda f: f.stat().st_mtime)
        if olds:
            return olds[-1].parent
    return path


def exists(directory: Path) -> bool:
    return (_current(directory) / "manifest.json").exists()


def load(directory: Path) -> dict[str, np.ndarray]:
    """Read a checkpoint written by ``save``; raise CheckpointError with a one-line reason."""
    path = _current(directory)
    manifest_file = path / "manifest.json"
    if not manifest_file.exists():
        raise CheckpointError(f"no replay checkpoint at {path}: point --checkpoint-dir at one or pass --restore false")
    try:
        manifest = json.loads(manifest_file.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"replay checkpoint manifest {manifest_file} is unreadable: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or manifest.get("version") != FORMAT_VERSION:
        raise CheckpointError(f"{path} is not a flywheel replay checkpoint of version {FORMAT_VERSION}")
    arrays = manifest.get("arrays")
    if not isinstance(arrays, dict) or not arrays:
        raise CheckpointError(f"replay checkpoint manifest {manifest_file} lists no arrays")
    state: dict[str, np.ndarray] = {}
    for name, meta in arrays.items():
        if not isinstance(meta, dict) or "/" in name or "\\" in name or name.startswith("."):
            raise CheckpointError(f"replay checkpoint manifest {manifest_file} has a bad entry {name!r}")
        try:
            array = np.load(path / f"{name}.npy", allow_pickle=False)
        except (OSError, ValueError, EOFError) as exc:
            raise CheckpointError(f"replay checkpoint array {name} is corrupt: {exc}") from None
        if array.dtype.name != meta.get("dtype") or list(array.shape) != meta.get("shape"):
            raise CheckpointError(f"replay checkpoint array {name} does not match its manifest")
        state[name] = array
    return state
