"""A replay starting up removes the shared-memory segments of replays that are gone, and only those."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from flywheel.services.replay.shm import ShmSlots, sweep_stale


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@pytest.mark.system
def test_a_starting_replay_sweeps_segments_of_dead_replays_and_keeps_live_ones(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    dead, parent = _dead_pid(), os.getppid()
    stale = tmp_path / f"flywheel-replay-{dead}-1-0123abcd"
    live = tmp_path / f"flywheel-replay-{parent}-2-89abcdef"  # a replay still running (this test's parent)
    mine = tmp_path / f"flywheel-replay-{os.getpid()}-3-00000000"
    other = tmp_path / "not-flywheel-7-1-0123abcd"
    for path in (stale, live, mine, other):
        path.write_bytes(b"x" * 4096)
    with caplog.at_level(logging.INFO, logger="flywheel.replay"):
        slots = ShmSlots(directory=tmp_path)
    assert slots.swept == [stale.name]
    assert not stale.exists() and live.exists() and mine.exists() and other.exists()
    assert any("left in" in r.getMessage() and stale.name in r.getMessage() for r in caplog.records)
    assert sweep_stale(tmp_path) == []  # nothing left to sweep: a second replay starting finds it clean


def test_a_segment_created_by_this_replay_survives_its_own_sweep(tmp_path: Path) -> None:
    slots = ShmSlots(directory=tmp_path)
    segment = slots.segment_for(b"client", 8, (4, 8, 8), np.dtype(np.uint8), 2)
    assert segment is not None and (tmp_path / segment.name).exists()
    assert ShmSlots(directory=tmp_path).swept == []  # same pid: a live replay's segment is never removed
    slots.close()
    assert not (tmp_path / segment.name).exists()
