"""The demonstrations file format (flywheel-demos, version 1): writer, reader and their errors.

A demonstrations set is a directory::

    manifest.json            written last and atomically (temp file, fsync, rename); a set without one is
                             unfinished and refused
    episode-000000.npz       one per episode, written with NumPy's savez (compressed by default), no pickle

manifest.json::

    {"format": "flywheel-demos", "version": 1, "env_id": "ALE/Pong-v5",
     "obs_shape": [4, 84, 84], "obs_dtype": "uint8", "n_step": 3, "gamma": 0.99, "count": 1234,
     "episodes": [{"file": "episode-000000.npz", "steps": 412, "transitions": 412, "return": 801.0,
                   "terminated": true, "bytes": 1830211, "crc32": 2934857123}, ...]}

Each episode file holds the episode as played and its n-step transitions (``proto.Transition``'s fields, each
observation field as a column of row numbers into ``observations``, named by its ``frame_index``):

    observations (T+1, *obs_shape) obs_dtype  o_0 .. o_T, o_T being the final observation
    actions      (T,) int64                   rewards (T,) float32 (one per step, as the env gave them)
    obs_index    (N,) int64                   next_index (N,) int64: rows of ``observations``
    action       (N,) int64                   reward (N,) float32: the n-step return
    discount     (N,) float32                 gamma ** k, or 0 when the episode terminated within the k steps

``count`` is the sum of the episodes' transitions. Anything that does not match (missing or extra files,
sizes, CRCs, shapes, dtypes, indices) raises DemoFileError with a one-line reason.
"""

from __future__ import annotations

import io
import json
import os
import threading
import zipfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from flywheel import proto
from flywheel.proto import OBS_DTYPES

FORMAT = "flywheel-demos"
VERSION = 1
# NumPy parses .npy headers with ast.literal_eval, and CPython 3.11's AST builder keeps one recursion counter per
# interpreter, so two threads parsing at once can fail with "AST constructor recursion depth mismatch"
# (python/cpython#106905). Episodes load in parallel threads, so header parses take turns; data reads do not.
_NPY_HEADER_LOCK = threading.Lock()
# The transition columns of an episode file: each observation field's row numbers first, then the per-row fields.
_COLUMNS = {spec.frame_index: spec for spec in proto.OBSERVATION_FIELDS} | {
    spec.name: spec for spec in proto.SCALAR_FIELDS}
_EPISODE_ARRAYS = ("observations", "actions", "rewards", *_COLUMNS)


class DemoFileError(ValueError):
    """A demonstrations set is missing, unfinished, corrupt or not what the caller expects."""


@dataclass
class DemoFrames:
    """Transitions as stored: observations once, and ``rows``, whose observation fields hold row numbers into them."""

    observations: np.ndarray
    rows: proto.Transition[np.ndarray]

    def __len__(self) -> int:
        return len(self.rows)

    def take(self, rows: np.ndarray | slice = slice(None)) -> proto.Transition[np.ndarray]:
        """Transitions ``rows`` (all by default) with their observations gathered."""
        picked = self.rows.select(rows)
        return proto.Transition(**{spec.name: self.observations[value] if spec.observation else value
                                   for spec, value in zip(proto.TRANSITION_FIELDS, picked.arrays().values(),
                                                          strict=True)})

    @staticmethod
    def concatenate(parts: list[DemoFrames]) -> DemoFrames:
        """One DemoFrames of several (episodes): observations one after another, row numbers shifted to match."""
        offsets = np.cumsum([0] + [len(p.observations) for p in parts[:-1]])
        columns = {spec.name: np.concatenate([getattr(p.rows, spec.name) + (o if spec.observation else 0)
                                              for p, o in zip(parts, offsets, strict=True)])
                   for spec in proto.TRANSITION_FIELDS}
        return DemoFrames(np.concatenate([p.observations for p in parts]), proto.Transition(**columns))


def nstep_transitions(rewards: np.ndarray, terminated: bool, n_step: int, gamma: float,
                      ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(obs_index, next_index, n-step return, discount) for every step of an episode of len(rewards) steps."""
    steps = len(rewards)
    t = np.arange(steps)
    k = np.minimum(n_step, steps - t)
    returns = np.zeros(steps)
    for j in range(n_step):
        valid = j < k
        returns[valid] += gamma ** j * rewards[t[valid] + j]
    discount = gamma ** k.astype(np.float64)
    if terminated:
        discount[t + k == steps] = 0.0
    return t.astype(np.int64), (t + k).astype(np.int64), returns.astype(np.float32), discount.astype(np.float32)


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class DemoWriter:
    """Appends episodes to a demonstrations set; ``close`` (or leaving the ``with`` block) finalises it.

    A set that already exists is refused unless ``append`` is set, and then it must match in env, shapes,
    n-step and gamma. Until ``close``, readers see the previous manifest (or none): a crash never leaves a
    half-listed set.
    """

    def __init__(self, path: Path | str, *, env_id: str, obs_shape: tuple[int, ...], obs_dtype: str,
                 n_step: int, gamma: float, append: bool = False, compress: bool = True) -> None:
        self.path = Path(path)
        if np.dtype(obs_dtype).name not in OBS_DTYPES:
            raise DemoFileError(f"observation dtype must be one of {OBS_DTYPES}, got {obs_dtype}")
        if n_step < 1 or not 0 < gamma <= 1:
            raise DemoFileError(f"n_step must be >= 1 and gamma in (0, 1], got {n_step} and {gamma}")
        self.manifest: dict[str, Any] = {
            "format": FORMAT, "version": VERSION, "env_id": env_id, "obs_shape": [int(d) for d in obs_shape],
            "obs_dtype": np.dtype(obs_dtype).name, "n_step": int(n_step), "gamma": float(gamma), "count": 0,
            "episodes": [],
        }
        self.compress = compress
        if (self.path / "manifest.json").exists():
            if not append:
                raise DemoFileError(f"{self.path} already holds demonstrations: pass append=True to add to them")
            existing = read_manifest(self.path)
            for key in ("env_id", "obs_shape", "obs_dtype", "n_step", "gamma"):
                if existing[key] != self.manifest[key]:
                    raise DemoFileError(f"{self.path} has {key} {existing[key]!r}, this writer {self.manifest[key]!r}")
            self.manifest = existing
        self.path.mkdir(parents=True, exist_ok=True)
        self.closed = False

    @property
    def count(self) -> int:
        return int(self.manifest["count"])

    def add_episode(self, observations: np.ndarray, actions: np.ndarray, rewards: np.ndarray,
                    terminated: bool) -> int:
        """Write one episode (T steps: T+1 observations); returns the transitions it adds."""
        if self.closed:
            raise DemoFileError("writer already closed")
        shape, dtype = tuple(self.manifest["obs_shape"]), np.dtype(self.manifest["obs_dtype"])
        observations = np.asarray(observations)
        actions = np.asarray(actions)
        rewards = np.asarray(rewards, dtype=np.float64)
        steps = len(actions)
        if steps < 1 or observations.shape != (steps + 1, *shape) or observations.dtype != dtype:
            raise DemoFileError(f"an episode of {steps} steps needs observations {dtype}{(steps + 1, *shape)}, "
                                f"got {observations.dtype}{observations.shape}")
        if rewards.shape != (steps,) or actions.ndim != 1 or actions.dtype.kind not in "iu" or np.any(actions < 0):
            raise DemoFileError("actions must be non-negative integers and rewards one per step")
        if not np.all(np.isfinite(rewards)) or (dtype.kind == "f" and not np.all(np.isfinite(observations))):
            raise DemoFileError("rewards and observations must be finite")
        obs_index, next_index, ret, discount = nstep_transitions(rewards, terminated, self.manifest["n_step"],
                                                                 self.manifest["gamma"])
        rows = proto.Transition(obs=obs_index, action=actions.astype(np.int64)[obs_index], reward=ret,
                                discount=discount, next_obs=next_index)
        arrays = {"observations": observations, "actions": actions.astype(np.int64),
                  "rewards": rewards.astype(np.float32),
                  **{column: getattr(rows, spec.name) for column, spec in _COLUMNS.items()}}
        number = max([int(e["file"][8:14]) + 1 for e in self.manifest["episodes"]], default=0)
        name = f"episode-{number:06d}.npz"
        tmp = self.path / f".{name}.tmp-{os.getpid()}"
        with open(tmp, "wb") as fh:
            (np.savez_compressed if self.compress else np.savez)(fh, **arrays)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path / name)
        data = (self.path / name).read_bytes()
        self.manifest["episodes"].append({
            "file": name, "steps": steps, "transitions": len(obs_index), "return": float(rewards.sum()),
            "terminated": bool(terminated), "bytes": len(data), "crc32": zlib.crc32(data)})
        self.manifest["count"] += len(obs_index)
        return len(obs_index)

    def close(self) -> Path:
        """Finalise: write the manifest atomically. Returns the set's directory."""
        if not self.closed:
            _atomic_write(self.path / "manifest.json", json.dumps(self.manifest, indent=1).encode())
            self.closed = True
        return self.path

    def __enter__(self) -> DemoWriter:
        return self

    def __exit__(self, exc_type: object, *_rest: object) -> None:
        if exc_type is None:
            self.close()
        else:
            self.closed = True  # keep the previous manifest: episodes written in this session stay unlisted


def read_manifest(path: Path | str) -> dict[str, Any]:
    """The validated manifest of the set at ``path``."""
    path = Path(path)
    file = path / "manifest.json"
    if not path.is_dir():
        raise DemoFileError(f"no demonstrations directory at {path}")
    if not file.exists():
        raise DemoFileError(f"{path} has no manifest.json: the demonstrations were never finalised (writer not "
                            "closed) or this is not a demonstrations set")
    try:
        manifest = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise DemoFileError(f"{file} is not readable JSON: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise DemoFileError(f"{file} is not a {FORMAT} manifest")
    if manifest.get("version") != VERSION:
        raise DemoFileError(f"{file} has format version {manifest.get('version')!r}; this build reads {VERSION}")
    try:
        shape = [int(d) for d in manifest["obs_shape"]]
        ok = (isinstance(manifest["env_id"], str) and manifest["obs_dtype"] in OBS_DTYPES and all(d > 0 for d in shape)
              and isinstance(manifest["n_step"], int) and manifest["n_step"] >= 1
              and isinstance(manifest["gamma"], (int, float)) and 0 < manifest["gamma"] <= 1
              and isinstance(manifest["episodes"], list) and isinstance(manifest["count"], int))
        counted = sum(int(e["transitions"]) for e in manifest["episodes"])
        names = [e["file"] for e in manifest["episodes"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise DemoFileError(f"{file} lacks or mangles a field: {exc}") from None
    if not ok:
        raise DemoFileError(f"{file} has a field of the wrong type or range")
    if counted != manifest["count"]:
        raise DemoFileError(f"{file} says count {manifest['count']} but its episodes hold {counted}")
    if any(not isinstance(n, str) or not n.startswith("episode-") or "/" in n or len(n) != 18 for n in names):
        raise DemoFileError(f"{file} names an episode file outside the set")
    return manifest


class DemoSet:
    """A finalised demonstrations set opened for reading; episodes are loaded one at a time."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.manifest = read_manifest(self.path)
        self.env_id: str = self.manifest["env_id"]
        self.obs_shape: tuple[int, ...] = tuple(self.manifest["obs_shape"])
        self.obs_dtype = np.dtype(self.manifest["obs_dtype"])
        self.n_step: int = self.manifest["n_step"]
        self.gamma: float = float(self.manifest["gamma"])
        self.count: int = self.manifest["count"]
        for entry in self.manifest["episodes"]:
            file = self.path / entry["file"]
            if not file.exists() or file.stat().st_size != entry.get("bytes"):
                raise DemoFileError(f"{file} is missing or has the wrong size: the set is partial or damaged")

    def __len__(self) -> int:
        return self.count

    def episodes(self) -> Iterator[proto.Transition[np.ndarray]]:
        """Each episode's transitions with observations stacked, validated against the manifest."""
        for entry in self.manifest["episodes"]:
            yield self._read(entry).take()

    def episode_frames(self, number: int) -> DemoFrames:
        """Episode ``number`` (0-based, in manifest order) as played, validated; observations are not duplicated."""
        return self._read(self.manifest["episodes"][number])

    def _read(self, entry: dict[str, Any]) -> DemoFrames:
        file = self.path / entry["file"]
        data = file.read_bytes()
        if zlib.crc32(data) != entry.get("crc32"):
            raise DemoFileError(f"{file} is damaged: its CRC differs from the manifest")
        try:
            with zipfile.ZipFile(io.BytesIO(data)) as archive:
                missing = {f"{name}.npy" for name in _EPISODE_ARRAYS} - set(archive.namelist())
                if missing:
                    raise DemoFileError(f"{file} lacks arrays {sorted(m[:-4] for m in missing)}")
                arrays = {name: _read_npy(archive, f"{name}.npy") for name in _EPISODE_ARRAYS}
        except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
            if isinstance(exc, DemoFileError):
                raise
            raise DemoFileError(f"{file} cannot be read: {exc}") from None
        steps, count = int(entry["steps"]), int(entry["transitions"])
        obs = arrays["observations"]
        if obs.shape != (steps + 1, *self.obs_shape) or obs.dtype != self.obs_dtype:
            raise DemoFileError(f"{file}: observations are {obs.dtype}{obs.shape}, the manifest says "
                                f"{self.obs_dtype}{(steps + 1, *self.obs_shape)}")
        for name, spec in _COLUMNS.items():
            dtype = np.dtype(proto.FRAME_INDEX_DTYPE if spec.observation else spec.dtype)
            if arrays[name].shape != (count,) or arrays[name].dtype != dtype:
                raise DemoFileError(f"{file}: {name} is {arrays[name].dtype}{arrays[name].shape}, expected "
                                    f"{dtype}({count},)")
            if spec.observation and count and (arrays[name].min() < 0 or arrays[name].max() > steps):
                raise DemoFileError(f"{file}: {name} points outside the episode")
        rows = proto.Transition(**{spec.name: arrays[name] for name, spec in _COLUMNS.items()})
        if not (np.all((rows.discount >= 0) & (rows.discount <= 1)) and np.all(np.isfinite(rows.reward))
                and np.all(rows.action >= 0)):
            raise DemoFileError(f"{file}: rewards, discounts or actions out of range")
        return DemoFrames(observations=obs, rows=rows)


def open_demos(path: Path | str) -> DemoSet:
    """Open and validate a finalised demonstrations set (DemoFileError when it is not one)."""
    return DemoSet(path)


def _read_npy(archive: zipfile.ZipFile, member: str) -> np.ndarray:
    """One .npy member of an episode archive, no pickle; the header is parsed under the lock, the data is not."""
    with archive.open(member) as fp:
        assert isinstance(fp, io.BufferedIOBase)  # a ZipExtFile: it reads into a buffer without a copy
        version = np.lib.format.read_magic(fp)
        if version not in ((1, 0), (2, 0)):
            raise ValueError(f"{member} has .npy format version {version}, expected 1.0 or 2.0")
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
            np.lib.format.read_array_header_2_0
        with _NPY_HEADER_LOCK:
            shape, fortran_order, dtype = read_header(fp)
        if dtype.hasobject:
            raise ValueError(f"{member} holds Python objects")
        flat = np.empty(int(np.prod(shape, dtype=np.int64)), dtype)
        got = fp.readinto(flat.view(np.uint8).data) if flat.nbytes else 0
        if got != flat.nbytes:
            raise EOFError(f"{member} is truncated: {got} of {flat.nbytes} bytes")
        return flat.reshape(shape, order="F" if fortran_order else "C")
