"""Which folder ``flywheel run`` writes to (--if-exists) and the lock a live run holds on it."""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from flywheel.settings import SettingsError

RUN_CONFIG = "run.json"
FORMAT = "flywheel-run"
FORMAT_VERSION = 1
# Flags --resume takes from run.json unless given again (stop conditions and ports are per invocation).
IF_EXISTS = ("new", "resume", "overwrite", "fail")
LOCK_FILE = ".flywheel-run.lock"
MAX_SIBLINGS = 10_000  # checkpoints-2 .. checkpoints-10000


class RunConfigError(ValueError):
    """A run.json that cannot be read; the message is one line."""


class FolderLocked(SettingsError):
    """The folder is held by a live ``flywheel run``; the message is one line naming its pid."""


def holds_run(folder: Path) -> bool:
    """Whether ``folder`` holds an earlier run: run.json, a learner or replay checkpoint, or curves."""
    if (folder / "run.json").is_file() or (folder / "progress.csv").is_file():
        return True
    return any(_has_files(folder / sub) for sub in ("learner", "replay", "tb"))


def _has_files(folder: Path) -> bool:
    try:
        return any(path.is_file() for path in folder.rglob("*"))
    except OSError:
        return False


def load_run_config(directory: str | os.PathLike[str]) -> dict[str, Any] | None:
    """DIRECTORY/run.json as a dict, None if there is none; RunConfigError if it is unreadable or foreign."""
    path = Path(directory) / RUN_CONFIG
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise RunConfigError(f"{path} is unreadable ({exc}); fix or delete it") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("env_id"), str):
        raise RunConfigError(f"{path} is not a flywheel run config (format {FORMAT!r} with an env_id)")
    if not isinstance(data.get("overrides", []), list) or not isinstance(data.get("services", {}), dict):
        raise RunConfigError(f"{path}: 'overrides' must be a list and 'services' an object")
    return data


def describe(folder: Path) -> str:
    """"a CartPole-v1 run from 2026-11-25 18:20 UTC": the env of run.json and when it last started."""

    try:
        saved = load_run_config(folder)
    except RunConfigError:
        saved = None
    env = f"{saved['env_id']} " if saved else ""
    when: float | None = None
    if saved and isinstance(saved.get("started_at"), int | float):
        when = float(saved["started_at"])
    else:
        with contextlib.suppress(OSError, ValueError):
            when = max((p.stat().st_mtime for p in folder.rglob("*") if p.is_file()), default=None)
    stamp = "" if when is None else " from " + time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(when))
    return f"a {env}run{stamp}"


def show(folder: Path) -> str:
    """The folder as the user named it, with a trailing slash."""
    return f"{folder}/"


def sibling(folder: Path, number: int) -> Path:
    """FOLDER-NUMBER next to ``folder`` (``checkpoints`` -> ``checkpoints-2``)."""
    base = folder if folder.name not in ("", ".", "..") else folder.resolve()
    return base.with_name(f"{base.name}-{number}")


@dataclass
class RunFolder:
    """The folder chosen for a run, its lock (held while this object lives), and the line saying what happened."""

    path: Path
    resume: bool
    message: str | None
    lock: IO[str]

    def release(self) -> None:
        """Drop the lock (the kernel also drops it when the process dies, however it dies)."""
        if not self.lock.closed:
            self.lock.close()

    def __enter__(self) -> RunFolder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _in_use(folder: Path, pid: str) -> FolderLocked:
    return FolderLocked(f"flywheel run: {show(folder)} is in use by a live flywheel run (pid {pid or 'unknown'}); "
                        "stop it first or pass another --checkpoint-dir")


def _flock(handle: IO[str], how: int, wait_s: float = 1.0) -> bool:
    """``flock`` without blocking, retried for ``wait_s`` (another run's probe holds it for microseconds)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(handle, how | fcntl.LOCK_NB)
            return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)


def lock(folder: Path) -> IO[str]:
    """An exclusive ``flock`` on FOLDER/.flywheel-run.lock with this pid written in it; FolderLocked if a live run
    holds it. A lock file left by a dead run is no obstacle: the kernel released its lock when that process ended,
    however it ended (kill -9 included)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle = open(folder / LOCK_FILE, "a+")  # held for the run's life (RunFolder.release)
    except OSError as exc:
        raise SettingsError(f"flywheel run: cannot use {show(folder)} as --checkpoint-dir ({exc})") from None
    if not _flock(handle, fcntl.LOCK_EX):
        handle.seek(0)
        pid = handle.read().strip()
        handle.close()
        raise _in_use(folder, pid)
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle


def probe(folder: Path) -> None:
    """FolderLocked if a live run holds ``folder``'s lock; creates and changes nothing (an earlier run's folder stays
    as it was: without a lock file no live run holds it)."""
    try:
        handle = open(folder / LOCK_FILE)  # closed below; flock needs no write access
    except OSError:
        return
    with handle:
        if not _flock(handle, fcntl.LOCK_SH):
            raise _in_use(folder, handle.read().strip())


def resolve_mode(if_exists: str | None, resume: bool) -> str:
    """The --if-exists mode, with --resume as ``resume``; a contradiction is a SettingsError."""
    if resume and if_exists not in (None, "resume"):
        raise SettingsError(f"flywheel run: --resume contradicts --if-exists {if_exists}; pass one of them")
    return "resume" if resume else if_exists or "new"


def choose(folder: Path, if_exists: str | None, resume: bool = False) -> RunFolder:
    """The folder this run writes to, locked; SettingsError (exit 2) for ``fail`` on a used folder or a live lock.

    ``new`` (the default) takes FOLDER when it holds no run, else the first of FOLDER-2, FOLDER-3, ... that holds
    none and no live run; ``resume`` continues FOLDER; ``overwrite`` reuses FOLDER as it is; ``fail`` refuses."""
    mode = resolve_mode(if_exists, resume)
    if mode in ("resume", "overwrite"):
        handle = lock(folder)
        if mode == "resume":
            return RunFolder(folder, True, f"flywheel: resuming {describe(folder)} in {show(folder)}"
                             if holds_run(folder) else
                             f"flywheel: --resume: {show(folder)} holds no run yet; starting a new one there", handle)
        return RunFolder(folder, False, f"flywheel: {show(folder)} holds {describe(folder)}: --if-exists overwrite "
                         "replaces it (its curves now, its checkpoints as this run writes them)"
                         if holds_run(folder) else None, handle)
    probe(folder)
    if not holds_run(folder):
        handle = lock(folder)
        if not holds_run(folder):
            return RunFolder(folder, False, None, handle)
        handle.close()  # another run wrote there between the two looks
    old = f"{show(folder)} holds {describe(folder)}"
    if mode == "fail":
        free = next((sibling(folder, n) for n in range(2, MAX_SIBLINGS + 1) if not holds_run(sibling(folder, n))),
                    None)
        raise SettingsError(f"flywheel run: {old} and --if-exists fail was given (--if-exists new writes to "
                            f"{show(free) if free else 'a numbered sibling'}, --resume continues it, --if-exists "
                            "overwrite replaces it)")
    for number in range(2, MAX_SIBLINGS + 1):
        candidate = sibling(folder, number)
        if holds_run(candidate):
            continue
        try:
            handle = lock(candidate)
        except FolderLocked:  # a live run starting there that has not written anything yet
            continue
        if holds_run(candidate):  # another run got there between the two looks
            handle.close()
            continue
        return RunFolder(candidate, False, f"flywheel: {old}: this run writes to {show(candidate)} (--resume "
                                           "continues the old one, --if-exists overwrite replaces it)", handle)
    raise SettingsError(f"flywheel run: {show(folder)} and its {MAX_SIBLINGS - 1} numbered siblings all hold runs; "
                        "pass another --checkpoint-dir")


def take(args: argparse.Namespace) -> RunFolder:
    """Choose and lock the run's folder for ``args`` (--checkpoint-dir, --if-exists, --resume), point ``args`` at it,
    and print the one line saying what happened to an earlier run there."""
    folder = choose(args.checkpoint_dir, getattr(args, "if_exists", None), args.resume)
    args.checkpoint_dir, args.resume = folder.path, folder.resume
    if folder.message:
        print(folder.message, flush=True)
    return folder
