"""Atomic replay checkpoints: one .npy per array plus a JSON manifest with CRCs, read back without pickle."""

from __future__ import annotations

import json
import os
import shutil
import time
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from flywheel.checkpoints import process_running

FORMAT = "flywheel-replay"
FORMAT_VERSION = 2
CRC_CHUNK = 64 << 20
DROP_CACHE_BYTES = 256 << 20


class CheckpointError(RuntimeError):
    """A checkpoint is missing, corrupt or does not fit this replay; the message says which."""


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_array(file: Path, parts: list[np.ndarray]) -> dict[str, Any]:
    """Write the concatenation of ``parts`` (along axis 0) as one .npy without building it; return its entry."""
    first = parts[0]
    shape = (sum(p.shape[0] for p in parts), *first.shape[1:]) if first.ndim else first.shape
    crc = 0
    with open(file, "wb") as fh:
        header = {"descr": np.lib.format.dtype_to_descr(first.dtype), "fortran_order": False, "shape": shape}
        np.lib.format.write_array_header_2_0(fh, header)
        written = 0
        for part in parts:
            flat = np.ascontiguousarray(part).reshape(-1).view(np.uint8)
            for lo in range(0, flat.size, CRC_CHUNK):
                chunk = flat[lo:lo + CRC_CHUNK]
                crc = zlib.crc32(chunk.data, crc)
                fh.write(chunk.data)
                written += chunk.size
                if written >= DROP_CACHE_BYTES:  # gigabytes of dirty page cache would squeeze the running replay
                    _drop_written(fh)
                    written = 0
        fh.flush()
        os.fsync(fh.fileno())
        _drop_written(fh)
    return {"dtype": first.dtype.name, "shape": list(shape), "crc32": crc}


def _drop_written(fh: Any) -> None:
    """Write back what the file holds so far and drop it from the page cache (Linux; a no-op elsewhere)."""
    fh.flush()
    os.fdatasync(fh.fileno())
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fh.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def save(state: dict[str, np.ndarray | list[np.ndarray]], directory: Path, info: dict[str, Any] | None = None,
         ) -> Path:
    """Write ``directory/replay`` atomically: a temp dir is filled, fsynced and renamed over the old one.

    A list value is written as the concatenation of its arrays (the two halves of a ring), without copying.
    """
    directory.mkdir(parents=True, exist_ok=True)
    final = directory / "replay"
    tmp = directory / f".replay.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        _fill(tmp, state, info)
        _swap_in(tmp, directory)
    except BaseException:  # a failed save (disk full) leaves nothing behind; a killed one is swept at start-up
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _remove_stale(directory)
    return final


def _fill(tmp: Path, state: dict[str, np.ndarray | list[np.ndarray]], info: dict[str, Any] | None) -> None:
    """Write every array and the manifest into ``tmp``, fsynced."""
    manifest: dict[str, Any] = {"format": FORMAT, "version": FORMAT_VERSION, "time": time.time(),
                                "info": info or {}, "arrays": {}}
    for name, value in state.items():
        parts = value if isinstance(value, list) else [np.asarray(value)]
        manifest["arrays"][name] = _write_array(tmp / f"{name}.npy", parts)
    with open(tmp / "manifest.json", "w") as fh:
        json.dump(manifest, fh)
        fh.flush()
        os.fsync(fh.fileno())
    _fsync_dir(tmp)


def _swap_in(tmp: Path, directory: Path) -> None:
    """Rename the filled ``tmp`` to ``directory/replay``, the previous checkpoint kept aside until it is in place."""
    final = directory / "replay"
    old = directory / f".replay.old-{os.getpid()}"
    if not (final / "manifest.json").exists() and (old / "manifest.json").exists():
        os.replace(old, final)  # the fallback a killed save left (same pid after a container restart): keep it
    shutil.rmtree(old, ignore_errors=True)  # a stale one (same pid after a container restart) blocks the rename
    if final.exists():
        os.replace(final, old)
    # A kill between these two renames leaves only ``old``: ``_current`` falls back to it.
    os.replace(tmp, final)
    _fsync_dir(directory)
    shutil.rmtree(old, ignore_errors=True)


def _remove_stale(directory: Path, starting: bool = False) -> list[Path]:
    """Temp and fallback folders that killed writers left behind (their process no longer runs); the removed ones.

    ``starting`` (a replay that writes nothing yet): folders named after this process are stale too, and a fallback
    is kept while it may be the only complete checkpoint (``replay`` missing: a save killed between its renames).
    """
    fallbacks_stale = not starting or (directory / "replay" / "manifest.json").exists()
    removed: list[Path] = []
    for path in [*directory.glob(".replay.tmp-*"), *(directory.glob(".replay.old-*") if fallbacks_stale else ())]:
        pid = path.name.rsplit("-", 1)[-1]
        if not pid.isdigit():
            continue
        if starting if int(pid) == os.getpid() else not _writer_running(int(pid)):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def _writer_running(pid: int) -> bool:
    """Whether ``pid`` may still write: a killed writer not yet reaped (a zombie; an orphan's reaper can take a
    second or two) writes no more."""
    if not process_running(pid):
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True


def sweep(directory: Path) -> list[Path]:
    """At start-up: remove what killed saves left in ``directory`` (see ``_remove_stale``); the removed folders."""
    return _remove_stale(directory, starting=True) if directory.is_dir() else []


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


def load(directory: Path, verify: bool = True) -> dict[str, np.ndarray]:
    """Read a checkpoint written by ``save`` as read-only memory maps; raise CheckpointError with one line.

    ``verify`` checks every array's CRC (one pass over the data) so a damaged file is refused, not restored.
    """
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
            array = np.load(path / f"{name}.npy", mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError, EOFError) as exc:
            raise CheckpointError(f"replay checkpoint array {name} is corrupt: {exc}") from None
        if array.dtype.name != meta.get("dtype") or list(array.shape) != meta.get("shape"):
            raise CheckpointError(f"replay checkpoint array {name} does not match its manifest")
        if verify and _crc(array) != meta.get("crc32"):
            raise CheckpointError(f"replay checkpoint array {name} is corrupt: its CRC differs from the manifest")
        state[name] = array
    return state


def info(directory: Path) -> dict[str, Any]:
    """The ``info`` a checkpoint was saved with (empty when unreadable)."""
    try:
        manifest = json.loads((_current(directory) / "manifest.json").read_text())
        return dict(manifest.get("info", {}))
    except (OSError, ValueError, TypeError, AttributeError):
        return {}


def _crc(array: np.ndarray) -> int:
    flat = array.reshape(-1).view(np.uint8) if array.size else np.zeros(0, np.uint8)
    crc = 0
    for lo in range(0, flat.size, CRC_CHUNK):
        crc = zlib.crc32(flat[lo:lo + CRC_CHUNK].data, crc)
    return crc


def set_aside(directory: Path) -> Path | None:
    """Move a refused checkpoint out of the way (kept for inspection) so the next save does not replace it."""
    path = _current(directory)
    if not path.exists():
        return None
    target = directory / f"replay.refused-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    os.replace(path, target)
    return target
