"""Replay checkpoints: round trip, corrupt files refused with a clear message, interrupted saves."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from replay_helpers import ActorStreams, assert_stored_as_sent, make_core, transitions

from flywheel.services.replay import checkpoint
from flywheel.services.replay.checkpoint import CheckpointError
from flywheel.services.replay.snapshot import Snapshotter


def filled_state(count: int = 10) -> dict[str, np.ndarray]:
    core = make_core(16)
    core.insert(transitions(0, count, priority=np.linspace(0.5, 2.0, count)))
    return core.state_dict()


def assert_same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert set(a) == set(b)
    for name in a:
        assert a[name].dtype == b[name].dtype and np.array_equal(a[name], b[name]), name


def test_round_trip(tmp_path: Path) -> None:
    state = filled_state()
    final = checkpoint.save(state, tmp_path)
    assert final == tmp_path / "replay" and checkpoint.exists(tmp_path)
    loaded = checkpoint.load(tmp_path)
    assert_same(state, loaded)
    core = make_core(16)
    core.load_state_dict(loaded)
    assert core.size == 10
    # Saving again replaces it and leaves no temporary directories behind.
    state2 = filled_state(12)
    checkpoint.save(state2, tmp_path)
    assert_same(state2, checkpoint.load(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["replay"]


def test_missing_checkpoint(tmp_path: Path) -> None:
    assert not checkpoint.exists(tmp_path)
    with pytest.raises(CheckpointError, match="no replay checkpoint"):
        checkpoint.load(tmp_path)


@pytest.mark.parametrize("damage", ["empty", "truncated", "garbage", "missing"])
def test_corrupt_array_is_refused(tmp_path: Path, damage: str) -> None:
    checkpoint.save(filled_state(), tmp_path)
    file = tmp_path / "replay" / "storage.obs.npy"
    data = file.read_bytes()
    if damage == "empty":
        file.write_bytes(b"")
    elif damage == "truncated":
        file.write_bytes(data[: len(data) - 20])
    elif damage == "garbage":
        file.write_bytes(b"\x00garbage" * 10)
    else:
        file.unlink()
    with pytest.raises(CheckpointError, match="storage.obs") as info:
        checkpoint.load(tmp_path)
    assert "\n" not in str(info.value)


def test_array_not_matching_manifest_is_refused(tmp_path: Path) -> None:
    checkpoint.save(filled_state(), tmp_path)
    np.save(tmp_path / "replay" / "storage.reward.npy", np.zeros(3, dtype=np.float64))
    with pytest.raises(CheckpointError, match="storage.reward does not match its manifest"):
        checkpoint.load(tmp_path)


@pytest.mark.parametrize("manifest", [
    "{not json", "[]", json.dumps({"format": "other", "version": 1, "arrays": {}}),
    json.dumps({"format": "flywheel-replay", "version": 99, "arrays": {}}),
    json.dumps({"format": "flywheel-replay", "version": 1, "arrays": []}),
    json.dumps({"format": "flywheel-replay", "version": 1, "arrays": {"../../etc/passwd": {}}}),
    json.dumps({"format": "flywheel-replay", "version": 1, "arrays": {"storage.obs": "x"}}),
    json.dumps({"format": "flywheel-replay", "version": 1, "arrays": {"storage.obs": {"dtype": "float32"}}}),
])
def test_corrupt_manifest_is_refused(tmp_path: Path, manifest: str) -> None:
    checkpoint.save(filled_state(), tmp_path)
    (tmp_path / "replay" / "manifest.json").write_text(manifest)
    with pytest.raises(CheckpointError) as info:
        checkpoint.load(tmp_path)
    assert "\n" not in str(info.value) and "replay" in str(info.value)


def test_kill_mid_write_leaves_previous_checkpoint_loadable(tmp_path: Path) -> None:
    state = filled_state()
    checkpoint.save(state, tmp_path)
    # A save killed while writing leaves a half-filled temp dir behind.
    tmp = tmp_path / ".replay.tmp-99999"
    tmp.mkdir()
    (tmp / "storage.obs.npy").write_bytes(b"\x93NUMPY half")
    assert_same(state, checkpoint.load(tmp_path))
    # The next save (even from a process with that pid) cleans up and succeeds.
    state2 = filled_state(7)
    checkpoint.save(state2, tmp_path)
    assert_same(state2, checkpoint.load(tmp_path))


def test_kill_between_renames_falls_back_to_previous(tmp_path: Path) -> None:
    state = filled_state()
    checkpoint.save(state, tmp_path)
    # Killed after moving the old checkpoint aside, before the new one took its place.
    os.replace(tmp_path / "replay", tmp_path / ".replay.old-12345")
    assert checkpoint.exists(tmp_path)
    assert_same(state, checkpoint.load(tmp_path))


def test_stale_old_directory_does_not_break_save(tmp_path: Path) -> None:
    checkpoint.save(filled_state(), tmp_path)
    stale = tmp_path / f".replay.old-{os.getpid()}"  # left by an earlier process with the same pid
    shutil.copytree(tmp_path / "replay", stale)
    state = filled_state(5)
    checkpoint.save(state, tmp_path)
    assert_same(state, checkpoint.load(tmp_path))


def test_flipped_byte_is_refused_by_crc(tmp_path: Path) -> None:
    checkpoint.save(filled_state(), tmp_path)
    file = tmp_path / "replay" / "storage.obs.npy"
    data = bytearray(file.read_bytes())
    data[-5] ^= 0xFF  # same size, same header: only the CRC can tell
    file.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="CRC"):
        checkpoint.load(tmp_path)
    assert checkpoint.load(tmp_path, verify=False)["storage.obs"].shape == (16, 4)


def test_wrapped_frame_ring_round_trip_through_files(tmp_path: Path) -> None:
    streams = ActorStreams(envs=3, depth=4, n_step=3, episode=(2, 15), seed=11)
    core = make_core(120, frame_ratio=1.5, seed=1)
    for _ in range(25):  # well past the ring's size: its live range wraps around
        core.insert(streams.batch(20))
    state = core.state_dict()
    assert isinstance(state["storage.frames.frames"], list)
    checkpoint.save(state, tmp_path)
    restored = make_core(120, frame_ratio=1.5, seed=1)
    restored.load_state_dict(checkpoint.load(tmp_path))
    assert restored.size == core.size
    assert_stored_as_sent(restored, streams.sent)
    a, b = core.sample(32, 0.5), restored.sample(32, 0.5)
    assert np.array_equal(a.index, b.index) and np.array_equal(a.obs, b.obs) and np.array_equal(a.weight, b.weight)


def test_background_snapshot_is_the_state_at_fork_time(tmp_path: Path) -> None:
    streams = ActorStreams(envs=2, depth=4, n_step=3, episode=(3, 12), seed=12)
    core = make_core(300, seed=2)
    for _ in range(5):
        core.insert(streams.batch(20))
    size_at_fork = core.size
    snap = Snapshotter(tmp_path, core.state_dict, lambda: core.size)
    assert snap.start("test") and snap.in_progress
    assert not snap.start("again")  # one at a time
    for _ in range(5):  # the parent goes on changing its state while the child writes
        core.insert(streams.batch(20))
    assert snap.poll(block=True) is True and not snap.in_progress
    assert snap.completed == 1 and snap.max_pause_s < 5.0
    restored = make_core(300)
    restored.load_state_dict(checkpoint.load(tmp_path))
    assert restored.size == size_at_fork < core.size
    assert_stored_as_sent(restored, streams.sent)


def test_failed_background_snapshot_keeps_the_previous_one(tmp_path: Path) -> None:
    core = make_core(16)
    core.insert(transitions(0, 5))
    checkpoint.save(core.state_dict(), tmp_path)

    def broken() -> dict[str, np.ndarray]:
        raise OSError("disk full")

    snap = Snapshotter(tmp_path, broken, lambda: 5)
    assert snap.start("test")
    assert snap.poll(block=True) is False and snap.failed == 1
    assert checkpoint.load(tmp_path)["storage.positions"][0] == 5
