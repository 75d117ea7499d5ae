"""Checkpoints that do not stop traffic: a forked child writes a copy-on-write snapshot while the loop goes on."""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from flywheel.processes import die_with_parent

from . import checkpoint

log = logging.getLogger("flywheel.replay")


@dataclass
class Running:
    pid: int
    why: str
    started: float
    size: int


class Snapshotter:
    """Starts background checkpoints with ``os.fork`` and reaps them; ``write_now`` blocks (for shutdown).

    The fork copies only page tables (milliseconds for gigabytes of huge pages); pages the loop writes while
    the child saves are copied by the kernel, so extra memory is what ingestion writes during the save.
    """

    def __init__(self, directory: Path, state: Callable[[], dict[str, np.ndarray | list[np.ndarray]]],
                 size: Callable[[], int], info: Callable[[], dict[str, Any]] | None = None,
                 background: bool = True) -> None:
        self.directory, self.state, self.size, self.info = directory, state, size, info or dict
        self.background = background and hasattr(os, "fork")
        self.running: Running | None = None
        self.completed = 0
        self.failed = 0
        self.last_duration_s = 0.0
        self.max_pause_s = 0.0
        self.last_pause_s = 0.0

    @property
    def in_progress(self) -> bool:
        return self.running is not None

    def start(self, why: str) -> bool:
        """Begin a checkpoint; False (and a log line) when one is already being written."""
        if self.running is not None:
            log.info("checkpoint (%s) skipped: the previous one is still being written", why)
            return False
        if not self.background:
            self.write_now(why)
            return True
        begin = time.monotonic()
        pid = os.fork()
        if pid == 0:  # the child: write and leave without running any of the parent's cleanup
            code = 1
            try:
                # SIGKILL, not SIGTERM: an orphan never renames an old snapshot over a newer one
                die_with_parent(signal.SIGKILL)
                os.nice(10)  # the loop it was forked from keeps the CPU first
                checkpoint.save(self.state(), self.directory, self.info())
                code = 0
            except BaseException as exc:  # reported through the exit code and stderr
                os.write(2, f"replay checkpoint writer failed: {type(exc).__name__}: {exc}\n".encode())
            finally:
                os._exit(code)
        self.last_pause_s = time.monotonic() - begin
        self.max_pause_s = max(self.max_pause_s, self.last_pause_s)
        self.running = Running(pid, why, begin, self.size())
        return True

    def poll(self, block: bool = False) -> bool | None:
        """Reap a finished writer: True (saved), False (failed), None (nothing finished)."""
        running = self.running
        if running is None:
            return None
        pid, status = os.waitpid(running.pid, 0 if block else os.WNOHANG)
        if pid == 0:
            return None
        self.running = None
        self.last_duration_s = time.monotonic() - running.started
        code = os.waitstatus_to_exitcode(status)
        if code == 0:
            self.completed += 1
            log.info("checkpoint (%s) of %d transitions written to %s in %.1f s (loop paused %.1f ms)",
                     running.why, running.size, self.directory, self.last_duration_s, self.last_pause_s * 1e3)
            return True
        self.failed += 1
        log.error("checkpoint (%s) failed: writer exited with %s; the previous checkpoint is kept", running.why, code)
        return False

    def write_now(self, why: str) -> None:
        """Write a checkpoint in this process (waits for a background one first); used on shutdown."""
        if self.running is not None:
            self.poll(block=True)
        begin = time.monotonic()
        try:
            checkpoint.save(self.state(), self.directory, self.info())
        except OSError as exc:
            self.failed += 1
            log.error("checkpoint (%s) failed: %s", why, exc)
            return
        self.completed += 1
        self.last_duration_s = time.monotonic() - begin
        log.info("checkpoint (%s) of %d transitions written to %s in %.1f s", why, self.size(), self.directory,
                 self.last_duration_s)
