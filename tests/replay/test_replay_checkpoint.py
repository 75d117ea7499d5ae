"""Replay checkpoints: round trip, corrupt files refused with a clear message, interrupted saves."""

from __future__ import annotations

import json
import logging
import os
import re
import resource
import shutil
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from replay_helpers import ActorStreams, assert_stored_as_sent, make_core, transitions

from flywheel.services.replay import checkpoint
from flywheel.services.replay.checkpoint import CheckpointError
from flywheel.services.replay.settings import ReplaySettings
from flywheel.services.replay.snapshot import Snapshotter
from flywheel.services.replay.startup import build_core, check_state, restore, start_core
from flywheel.testing.polling import wait_until


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


# -- failed saves and what killed ones leave behind ----------------------------------------------------------------

def _file_size_limit(state: dict[str, np.ndarray | list[np.ndarray]], limit: int,
                     ) -> Callable[[], dict[str, np.ndarray | list[np.ndarray]]]:
    """The state, fetched in the forked writer after capping its file size: writes past ``limit`` bytes fail with
    a real OSError (EFBIG) from the kernel, as they would on a full disk."""
    def capped() -> dict[str, np.ndarray | list[np.ndarray]]:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the default action kills; ignored, write() raises
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
        return state
    return capped


def test_a_failed_background_save_removes_its_temp_folder(tmp_path: Path, capfd: pytest.CaptureFixture[str],
                                                          ) -> None:
    checkpoint.save(filled_state(5), tmp_path)
    big = {"storage.positions": np.array([9, 0], np.int64), "rows": np.arange(1 << 20, dtype=np.int64)}  # 8 MiB
    snap = Snapshotter(tmp_path, _file_size_limit(big, 1 << 20), lambda: 9)
    assert snap.start("test")
    assert snap.poll(block=True) is False and snap.failed == 1
    assert "File too large" in capfd.readouterr().err  # the writer's own report: the kernel refused the write
    assert sorted(p.name for p in tmp_path.iterdir()) == ["replay"], "the failed save's temp folder is removed"
    assert checkpoint.load(tmp_path)["storage.positions"][0] == 5


def test_a_failed_save_in_process_removes_its_temp_folder(tmp_path: Path) -> None:
    checkpoint.save(filled_state(5), tmp_path)
    # The second array's file cannot be created (a name longer than the file system allows): a real OSError
    # after the temp folder and the first file exist.
    with pytest.raises(OSError, match="too long"):
        checkpoint.save({"storage.positions": np.array([9, 0], np.int64), "x" * 300: np.zeros(3)}, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["replay"]
    snap = Snapshotter(tmp_path, lambda: {"x" * 300: np.zeros(3)}, lambda: 0, background=False)
    snap.write_now("exit")  # the shutdown path logs the failure and goes on
    assert snap.failed == 1 and sorted(p.name for p in tmp_path.iterdir()) == ["replay"]
    assert checkpoint.load(tmp_path)["storage.positions"][0] == 5


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


@pytest.mark.system
def test_a_starting_replay_sweeps_what_killed_writers_left(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                           ) -> None:
    settings = ReplaySettings(capacity=16, min_size_to_sample=1, checkpoint_dir=tmp_path, seed=0)
    checkpoint.save(filled_state(7), tmp_path)
    dead = _dead_pid()
    leftovers = [tmp_path / f".replay.tmp-{dead}", tmp_path / f".replay.tmp-{os.getpid()}",  # killed writers
                 tmp_path / f".replay.old-{dead}"]  # a fallback with a complete checkpoint beside it: stale
    for path in leftovers:
        path.mkdir()
        (path / "storage.obs.npy").write_bytes(b"\x93NUMPY half")
    live = subprocess.Popen(["sleep", "60"])
    try:
        busy = tmp_path / f".replay.tmp-{live.pid}"  # a writer that still runs (another process): left alone
        busy.mkdir()
        with caplog.at_level(logging.INFO, logger="flywheel.replay"):
            core = start_core(settings)
    finally:
        live.kill()
        live.wait()
    assert core is not None and core.size == 7
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["replay", busy.name])
    [line] = [r.getMessage() for r in caplog.records if "removed" in r.getMessage()]
    assert all(path.name in line for path in leftovers) and busy.name not in line


@pytest.mark.system
def test_the_sweep_counts_an_unreaped_writer_as_dead(tmp_path: Path) -> None:
    """A writer killed with its replay is an orphan zombie until a reaper gets to it (1-2 s here): it writes no more."""
    checkpoint.save(filled_state(3), tmp_path)
    zombie = subprocess.Popen(["true"])  # exits at once and stays a zombie: this test does not reap it yet
    try:
        wait_until(lambda: Path(f"/proc/{zombie.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z", 10,
                   "the child to exit")
        leftover = tmp_path / f".replay.tmp-{zombie.pid}"
        leftover.mkdir()
        assert checkpoint.sweep(tmp_path) == [leftover] and not leftover.exists()
    finally:
        zombie.wait()

@pytest.mark.system
def test_the_start_up_sweep_keeps_the_fallback_of_a_save_killed_between_renames(tmp_path: Path) -> None:
    settings = ReplaySettings(capacity=16, min_size_to_sample=1, checkpoint_dir=tmp_path, seed=0)
    checkpoint.save(filled_state(6), tmp_path)
    dead = _dead_pid()
    os.replace(tmp_path / "replay", tmp_path / f".replay.old-{dead}")  # the only complete checkpoint
    (tmp_path / f".replay.tmp-{dead}").mkdir()  # the new one, complete or not, never took its place
    core = start_core(settings)
    assert core is not None and core.size == 6
    assert sorted(p.name for p in tmp_path.iterdir()) == [f".replay.old-{dead}"]

# -- crafted checkpoints: valid CRCs, wrong-shaped or wrong-typed fields -------------------------------------------

def _wrong_shape(value: np.ndarray) -> np.ndarray:
    """A scalar stored as a shape-(3,) array, a vector as a scalar, an array with one axis more."""
    if value.ndim == 0:
        return np.full(3, value, dtype=value.dtype)
    if value.ndim == 1 and value.size <= 8:
        return np.asarray(value[0] if value.size else 0, dtype=value.dtype)
    return value[..., None]


# Every field the restore reads besides the per-slot arrays storage.py checks itself, and how to spoil it.
CRAFTED = [(name, how) for name in ("limiter.counts", "config.capacity", "sampler.max_priority",
                                    "storage.positions", "storage.obs_shape", "storage.obs_dtype",
                                    "storage.frames.range") for how in ("shape", "string")] + [
    ("sampler.leaves", "string"), ("storage.frames.frames", "float"), ("storage.frames.keys", "string"),
]


def _pixel_checkpoint(tmp_path: Path) -> tuple[ReplaySettings, dict[str, np.ndarray | list[np.ndarray]]]:
    """Settings of a pixel replay (frames deduplicated, prioritized) and a state to save."""
    settings = ReplaySettings(capacity=120, min_size_to_sample=1, checkpoint_dir=tmp_path / "ckpt", seed=0)
    core = build_core(settings)
    streams = ActorStreams(envs=2, depth=4, n_step=3, frame=(8, 8), seed=5)
    for _ in range(3):
        core.insert(streams.batch(20))
    return settings, core.state_dict()


def test_valid_checkpoints_pass_the_field_checks(tmp_path: Path) -> None:
    settings, state = _pixel_checkpoint(tmp_path)
    assert settings.checkpoint_dir is not None
    checkpoint.save(state, settings.checkpoint_dir)
    check_state(checkpoint.load(settings.checkpoint_dir))
    restored = restore(build_core(settings), settings)
    next_position, oldest = np.asarray(state["storage.positions"])
    assert restored is not None and restored.size == next_position - oldest > 0
    uniform = make_core(16, prioritized=False)  # no sampler.leaves, no frames: optional fields
    uniform.insert(transitions(0, 5))
    for core in (uniform, make_core(16)):  # the second empty: no observation schema yet
        checkpoint.save(core.state_dict(), tmp_path / "other")
        check_state(checkpoint.load(tmp_path / "other"))


@pytest.mark.parametrize(("name", "how"), CRAFTED)
def test_crafted_field_is_refused_naming_it(tmp_path: Path, caplog: pytest.LogCaptureFixture, name: str,
                                            how: str) -> None:
    settings, state = _pixel_checkpoint(tmp_path)
    directory = settings.checkpoint_dir
    assert directory is not None
    value = state[name]
    value = np.concatenate(value) if isinstance(value, list) else np.asarray(value)
    state[name] = (_wrong_shape(value) if how == "shape" else value.astype(np.float32) if how == "float"
                   else value.astype(str))
    checkpoint.save(state, directory)
    loaded = checkpoint.load(directory)  # the CRCs are valid: only the field checks can tell
    with pytest.raises(CheckpointError, match=re.escape(name)) as info:
        check_state(loaded)
    assert "\n" not in str(info.value)
    # The service refuses to start, saying which field ...
    assert restore(build_core(settings), settings) is None
    assert name in caplog.text and "cannot restore replay checkpoint" in caplog.text
    assert checkpoint.exists(directory)
    # ... or, asked to, sets the checkpoint aside and starts empty.
    empty = settings.model_copy(update={"start_empty_on_bad_checkpoint": True})
    core = restore(build_core(empty), empty)
    assert core is not None and core.size == 0
    assert not checkpoint.exists(directory) and len(list(directory.glob("replay.refused-*"))) == 1
