"""CPU-seconds and core pinning of a benchmark side's processes (every thread), for per-CPU-second rates.

Only psutil and the standard library: ``reverb_peer.py`` imports it by path from Reverb's own venv.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable

import psutil


def cpu_seconds(pids: Iterable[int]) -> float:
    """User + system CPU time of the processes ``pids`` (all their threads), summed; a process that is gone
    raises psutil.NoSuchProcess (its seconds are unknown, so a rate would be wrong)."""
    total = 0.0
    for pid in pids:
        times = psutil.Process(pid).cpu_times()
        total += times.user + times.system
    return total


def rates(count: float, wall_s: float, cpu_s: float) -> dict[str, float]:
    """``count`` per wall-clock second and per CPU-second; refuses an interval that is not positive."""
    if wall_s <= 0 or cpu_s <= 0:
        raise ValueError(f"a measured interval must be positive (wall {wall_s} s, CPU {cpu_s} s)")
    return {"rate": count / wall_s, "rate_per_cpu": count / cpu_s, "wall_s": wall_s, "cpu_s": cpu_s}


class SideClock:
    """Wall time and the CPU-seconds of one side's processes between ``start()`` and ``rates(count)``."""

    def __init__(self, pids: Iterable[int]) -> None:
        self.pids = list(pids)
        self.wall0 = self.cpu0 = 0.0

    def start(self) -> None:
        self.wall0, self.cpu0 = time.perf_counter(), cpu_seconds(self.pids)

    def elapsed(self) -> float:
        return time.perf_counter() - self.wall0

    def rates(self, count: float) -> dict[str, float]:
        """``count`` per second and per CPU-second of the side since ``start()``."""
        wall = time.perf_counter() - self.wall0
        return rates(count, wall, max(cpu_seconds(self.pids) - self.cpu0, 1e-9))


def pin_process(pid: int, cpus: Iterable[int]) -> None:
    """Pin every thread of ``pid`` to ``cpus`` (``sched_setaffinity(pid)`` alone moves only its main thread;
    threads started later inherit their creator's set). Threads that end meanwhile are skipped."""
    cores = set(cpus)
    if not hasattr(os, "sched_setaffinity"):  # pragma: no cover - not Linux
        return
    try:
        threads = [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
    except FileNotFoundError:
        raise psutil.NoSuchProcess(pid) from None
    for tid in threads:
        try:
            os.sched_setaffinity(tid, cores)
        except ProcessLookupError:
            continue


def thread_affinities(pid: int) -> list[set[int]]:
    """The core set of every thread of ``pid`` (what ``pin_process`` sets)."""
    out = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            out.append(set(os.sched_getaffinity(int(tid))))
        except ProcessLookupError:
            continue
    return out
