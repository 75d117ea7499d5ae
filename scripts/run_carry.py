"""Carry a kept Mario bench training from one machine to the next through git: one xz-compressed tar of its folder.

A long run (docs/benchmarks/mario.md, "How the runs are made") is trained in parts with `flywheel bench mario --opt
workdir=DIR --opt resume=1`; a machine lives for one session, so between parts the folder travels in the
repository. ``pack DIR ARCHIVE`` writes the folder (the run's checkpoints: learner, replay, actors' start-state
pools, run.json, logs; the bench's state file) as a tar compressed with xz, leaving out the checkpoint copies whose
evaluations are all done (``ckpt-*``: 2.3 MB each, read only to evaluate them), the control token (a new one is
written every part), locks, and the temporary files of writes and replay saves (a replay save's fallback folder
travels when it is the only complete checkpoint). Beside it, ``ARCHIVE.json`` names the folder, the size and
SHA-256 of every file as stored in the tar, and what was left out; the tar is read back and checked before it
replaces an earlier one. Pack after the bench has exited: a bench that evaluates still writes its state file.
``unpack ARCHIVE`` puts the folder back where it was packed (run.json and the bench's state name it by its full
path), every file checked against the manifest; it refuses a folder that exists and is not empty. ``--to DIR`` puts
it elsewhere, for a branch (``--opt branch_from=DIR``: a new training from the packed one's end).

    python scripts/run_carry.py pack /work/long/seed11/work docs/benchmarks/carry/long-seed11.tar.xz
    python scripts/run_carry.py unpack docs/benchmarks/carry/long-seed11.tar.xz
"""

from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import shutil
import sys
import tarfile
import time
from pathlib import Path
from typing import IO, Any

from flywheel.bench.parts.mario_state import STATE_FILE, MarioState
from flywheel.bench.runner import BenchError
from flywheel.checkpoints import write_atomically
from flywheel.launch import runfolder

FORMAT = "flywheel-run-carry"
RUN_CHECKPOINTS = Path("run") / "checkpoints"
LEFT_OUT_NAMES = {runfolder.LOCK_FILE, "control-token"}
XZ_PRESET = 6
READ_ERRORS = (OSError, tarfile.TarError, lzma.LZMAError, EOFError)


class CarryError(RuntimeError):
    """A folder that cannot be packed or an archive that cannot be unpacked; the message says why."""


class _Hashing:
    """A file reader that hashes what it hands on: the manifest's digest is of the very bytes the tar stores."""

    def __init__(self, fh: IO[bytes]) -> None:
        self.fh, self.digest, self.bytes = fh, hashlib.sha256(), 0

    def read(self, size: int = -1) -> bytes:
        data = self.fh.read(size)
        self.digest.update(data)
        self.bytes += len(data)
        return data


def _digest(fh: IO[bytes]) -> tuple[int, str]:
    reader = _Hashing(fh)
    while reader.read(1 << 20):
        pass
    return reader.bytes, reader.digest.hexdigest()


def evaluated_copies(folder: Path) -> list[str]:
    """The ``ckpt-*`` folders (relative names) the bench's state says are evaluated in full: their newest weights,
    at the second epsilon when the run has one, and their kept best when they hold one (or it is marked unplayed:
    ``eval_best=0``)."""
    if not (folder / STATE_FILE).is_file():
        return []
    try:
        state = MarioState.load(folder)
    except BenchError as exc:
        raise CarryError(str(exc)) from None
    also = state.evaluation.get("also_epsilon") is not None
    done = []
    for c in state.checkpoints:
        where = Path(str(c.get("dir", ""))).resolve()
        best = c.get("best")
        if (where.parent == folder and where.name.startswith("ckpt-") and "episodes" in c
                and (not also or "episodes_also" in c) and (not best or {"episodes", "unplayed"} & set(best))):
            done.append(where.name)
    return sorted(done)


def _temporary(folder: Path, rel: Path) -> bool:
    """A write's temp file (``.NAME.PID.tmp``), a replay save's temp folder, or its fallback folder while a complete
    checkpoint stands beside it (without one, the fallback is the checkpoint a resumed replay reads)."""
    for depth, part in enumerate(rel.parts):
        if part.startswith(".replay.tmp-") or (part.startswith(".") and part.endswith(".tmp")):
            return True
        if part.startswith(".replay.old-"):
            return (folder.joinpath(*rel.parts[:depth]) / "replay" / "manifest.json").is_file()
    return False


def _members(folder: Path, leave_out: list[str]) -> list[Path]:
    """The files to pack, relative to ``folder``; a symbolic link is refused (a tar would carry the link only)."""
    files = []
    for path in sorted(folder.rglob("*")):
        rel = path.relative_to(folder)
        if path.is_symlink():
            raise CarryError(f"{path} is a symbolic link: copy what it points to into the folder, or remove it")
        if rel.parts[0] in leave_out or path.name in LEFT_OUT_NAMES or _temporary(folder, rel) or not path.is_file():
            continue
        files.append(rel)
    return files


def _write_tar(folder: Path, files: list[Path], partial: Path) -> dict[str, dict[str, Any]]:
    """The files into ``partial`` (tar.xz); each file's size and SHA-256 as stored."""
    stored: dict[str, dict[str, Any]] = {}
    started = time.monotonic()
    with tarfile.open(partial, "w:xz", preset=XZ_PRESET) as tar:
        for k, rel in enumerate(files, 1):
            with (folder / rel).open("rb") as fh:
                info = tar.gettarinfo(arcname=str(rel), fileobj=fh)
                if info.size > 16 << 20:
                    print(f"run_carry: [{k}/{len(files)}] {rel} ({info.size / 1e6:,.0f} MB), from "
                          f"{time.monotonic() - started:.0f} s", flush=True)
                reader = _Hashing(fh)
                tar.addfile(info, reader)  # type: ignore[arg-type]  # a reader is all addfile uses
            stored[str(rel)] = {"bytes": info.size, "sha256": reader.digest.hexdigest()}
    return stored


def _check_tar(archive: Path, files: dict[str, dict[str, Any]]) -> None:
    """Read ``archive`` back: the files the manifest lists, each of its size and SHA-256; CarryError if not."""
    try:
        with tarfile.open(archive, "r:xz") as tar:
            members = [m for m in tar.getmembers() if m.isfile()]
            if sorted(m.name for m in members) != sorted(files):
                raise CarryError(f"{archive} does not hold the files its manifest lists")
            for member in members:
                fh = tar.extractfile(member)
                assert fh is not None  # a regular file always has its data
                if _digest(fh) != (files[member.name]["bytes"], files[member.name]["sha256"]):
                    raise CarryError(f"{member.name} in {archive} differs from its manifest: the archive is damaged")
    except READ_ERRORS as exc:
        raise CarryError(f"{archive} cannot be read ({exc})") from None


def pack(folder: Path, archive: Path) -> dict[str, Any]:
    """Write ``archive`` (a .tar.xz) and ``archive``.json from ``folder``; the manifest."""
    folder = folder.resolve()
    if not (folder / RUN_CHECKPOINTS / "run.json").is_file():
        raise CarryError(f"{folder} holds no kept run ({RUN_CHECKPOINTS / 'run.json'} is missing): name the folder "
                         "given to flywheel bench mario as --opt workdir")
    try:
        runfolder.probe(folder / RUN_CHECKPOINTS)
    except runfolder.FolderLocked:
        raise CarryError(f"{folder / RUN_CHECKPOINTS} is in use by a live flywheel run: let the bench finish, "
                         "then pack") from None
    leave_out = evaluated_copies(folder)
    files = _members(folder, leave_out)
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_name(archive.name + ".partial")
    started = time.monotonic()
    try:
        stored = _write_tar(folder, files, partial)
        _check_tar(partial, stored)
    except READ_ERRORS as exc:  # a file that shrank or went while it was read: something still writes there
        partial.unlink(missing_ok=True)
        raise CarryError(f"{folder} changed while it was packed ({exc}): pack it once nothing runs there") from None
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    manifest = {"format": FORMAT, "version": 1, "folder": str(folder), "packed": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "left_out": leave_out, "archive_bytes": partial.stat().st_size, "files": stored}
    partial.replace(archive)
    write_atomically(Path(f"{archive}.json"), (json.dumps(manifest, indent=1) + "\n").encode())
    total = sum(f["bytes"] for f in stored.values())
    print(f"run_carry: packed {len(files)} files of {folder} ({total / 1e6:,.1f} MB) into {archive} "
          f"({manifest['archive_bytes'] / 1e6:,.1f} MB) in {time.monotonic() - started:.0f} s, checked; left out "
          f"{', '.join(leave_out) or 'no checkpoint copy'}")
    return manifest


def _read_manifest(archive: Path) -> tuple[Path, dict[str, dict[str, Any]]]:
    """The folder and files an archive's manifest names; CarryError for a missing or malformed one."""
    manifest_file = Path(f"{archive}.json")
    try:
        manifest = json.loads(manifest_file.read_text())
    except (OSError, ValueError) as exc:
        raise CarryError(f"{manifest_file} cannot be read ({exc}): it is written beside the archive by pack") from None
    files = manifest.get("files") if isinstance(manifest, dict) else None
    well_formed = (isinstance(manifest, dict) and manifest.get("format") == FORMAT
                   and isinstance(manifest.get("folder"), str) and Path(manifest["folder"]).is_absolute()
                   and isinstance(files, dict) and all(
                       isinstance(m, dict) and isinstance(m.get("bytes"), int) and isinstance(m.get("sha256"), str)
                       for m in files.values()))
    if not well_formed:
        raise CarryError(f"{manifest_file} is not a {FORMAT} manifest")
    return Path(manifest["folder"]), files  # type: ignore[return-value]  # checked just above


def unpack(archive: Path, to: Path | None = None) -> Path:
    """Put the packed folder back where it was packed (or in ``to``), every file checked against the manifest; the
    folder."""
    packed, files = _read_manifest(archive)
    folder = packed if to is None else to.resolve()
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise CarryError(f"{folder} exists and is not an empty folder: move it away, or go on from it as it is")
    partial = folder.with_name(folder.name + ".unpacking")
    shutil.rmtree(partial, ignore_errors=True)  # what an unpacking cut off left
    try:
        with tarfile.open(archive, "r:xz") as tar:
            if sorted(m.name for m in tar.getmembers()) != sorted(files):
                raise CarryError(f"{archive} does not hold the files its manifest lists")
            tar.extractall(partial, filter="data")  # regular files under the folder only: no links, no escapes
        for name, meta in files.items():  # what was written, read back: damage anywhere shows here
            with (partial / name).open("rb") as fh:
                if _digest(fh) != (meta["bytes"], meta["sha256"]):
                    raise CarryError(f"{name} in {archive} differs from its manifest: the archive is damaged")
        folder.parent.mkdir(parents=True, exist_ok=True)
        if folder.exists():
            folder.rmdir()
        partial.replace(folder)
    except READ_ERRORS as exc:
        shutil.rmtree(partial, ignore_errors=True)
        raise CarryError(f"{archive} cannot be read ({exc})") from None
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    go_on = (f"go on with flywheel bench mario --opt workdir={folder} --opt resume=1" if folder == packed else
             f"branch from it with flywheel bench mario --opt branch_from={folder} --opt workdir=NEW (its state's "
             f"checkpoint copies name {packed})")
    print(f"run_carry: unpacked {len(files)} files into {folder}, checked; {go_on}")
    return folder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("pack", help="compress a kept bench training folder into ARCHIVE (.tar.xz) and ARCHIVE.json")
    p.add_argument("folder", type=Path)
    p.add_argument("archive", type=Path)
    u = sub.add_parser("unpack", help="put an archive's folder back where it was packed")
    u.add_argument("archive", type=Path)
    u.add_argument("--to", type=Path, default=None, help="another folder to put it in (to branch from it with "
                   "--opt branch_from while the packed folder goes on, or from an earlier version of the archive)")
    args = parser.parse_args(argv)
    try:
        if args.command == "pack":
            pack(args.folder, args.archive)
        else:
            unpack(args.archive, args.to)
    except CarryError as exc:
        print(f"run_carry: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
