"""The demonstrations format: round trip, n-step returns, append, and clear errors for bad or partial sets."""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from flywheel.demos import DemoFileError, DemoSet, DemoWriter, nstep_transitions, open_demos

SHAPE = (4, 12, 12)


def episode(steps: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.integers(0, 256, (steps + 1, *SHAPE), dtype=np.uint8), rng.integers(0, 6, steps),
            rng.normal(size=steps).astype(np.float32))


def writer(path: Path, **overrides: object) -> DemoWriter:
    options = {"env_id": "SuperMarioBros-1-1-v0", "obs_shape": SHAPE, "obs_dtype": "uint8", "n_step": 3,
               "gamma": 0.9} | overrides
    return DemoWriter(path, **options)  # type: ignore[arg-type]


def test_nstep_transitions_match_the_actor_convention() -> None:
    rewards = np.array([1.0, 2.0, 3.0, 4.0])
    obs_index, next_index, ret, discount = nstep_transitions(rewards, terminated=True, n_step=2, gamma=0.5)
    assert obs_index.tolist() == [0, 1, 2, 3] and next_index.tolist() == [2, 3, 4, 4]
    np.testing.assert_allclose(ret, [1 + 0.5 * 2, 2 + 0.5 * 3, 3 + 0.5 * 4, 4])
    np.testing.assert_allclose(discount, [0.25, 0.25, 0.0, 0.0])  # the last two reach the terminal state
    _, _, _, truncated = nstep_transitions(rewards, terminated=False, n_step=2, gamma=0.5)
    np.testing.assert_allclose(truncated, [0.25, 0.25, 0.25, 0.5])  # truncated: bootstrap from the final obs


def test_round_trip_gives_stacked_transitions(tmp_path: Path) -> None:
    episodes = [episode(7, 1), episode(1, 2), episode(12, 3)]
    with writer(tmp_path / "demos") as w:
        for i, (obs, actions, rewards) in enumerate(episodes):
            assert w.add_episode(obs, actions, rewards, terminated=i != 1) == len(actions)
    demos = open_demos(tmp_path / "demos")
    assert len(demos) == 20 and demos.obs_shape == SHAPE and demos.obs_dtype == np.uint8 and demos.n_step == 3
    for (obs, actions, _rewards), loaded in zip(episodes, demos.episodes(), strict=True):
        steps = len(actions)
        next_index = np.minimum(np.arange(steps) + 3, steps)
        assert np.array_equal(loaded.obs, obs[:steps]) and np.array_equal(loaded.next_obs, obs[next_index])
        assert np.array_equal(loaded.action, actions) and loaded.reward.dtype == np.float32
    manifest = json.loads((tmp_path / "demos" / "manifest.json").read_text())
    assert manifest["format"] == "flywheel-demos" and manifest["version"] == 1 and manifest["count"] == 20
    assert [e["terminated"] for e in manifest["episodes"]] == [True, False, True]


def test_append_adds_episodes_and_refuses_a_mismatch(tmp_path: Path) -> None:
    path = tmp_path / "demos"
    with writer(path) as w:
        w.add_episode(*episode(5, 1), terminated=True)
    with pytest.raises(DemoFileError, match="append"):
        writer(path)
    with pytest.raises(DemoFileError, match="n_step"):
        writer(path, n_step=5, append=True)
    with writer(path, append=True) as w:
        w.add_episode(*episode(4, 2), terminated=True)
    assert open_demos(path).count == 9 and len(list(open_demos(path).episodes())) == 2


def test_an_unfinished_writer_leaves_the_previous_manifest(tmp_path: Path) -> None:
    path = tmp_path / "demos"
    with pytest.raises(DemoFileError, match="never finalised"):
        w = writer(path)
        w.add_episode(*episode(3, 1), terminated=True)  # written, but the writer is never closed
        open_demos(path)
    with writer(path, append=True) as w:
        w.add_episode(*episode(3, 1), terminated=True)
    with pytest.raises(RuntimeError):
        with writer(path, append=True) as w:
            w.add_episode(*episode(6, 2), terminated=True)
            raise RuntimeError("crash before close")
    assert open_demos(path).count == 3  # the crashed session's episode is not listed


@pytest.mark.parametrize("bad", [
    lambda obs, a, r: (obs[:-1], a, r),  # one observation short
    lambda obs, a, r: (obs.astype(np.float32), a, r),  # wrong dtype
    lambda obs, a, r: (obs, -a - 1, r),  # negative actions
    lambda obs, a, r: (obs, a, np.full_like(r, np.nan)),  # NaN rewards
    lambda obs, a, r: (obs, a[:0], r[:0]),  # empty episode
])
def test_bad_episodes_are_refused(tmp_path: Path, bad: Callable) -> None:
    with writer(tmp_path / "demos") as w:
        with pytest.raises(DemoFileError):
            w.add_episode(*bad(*episode(5, 1)), terminated=True)


def make_set(path: Path) -> Path:
    with writer(path) as w:
        w.add_episode(*episode(5, 1), terminated=True)
        w.add_episode(*episode(6, 2), terminated=False)
    return path


@pytest.mark.parametrize("damage, match", [
    (lambda p: (p / "episode-000001.npz").unlink(), "missing"),
    (lambda p: (p / "episode-000000.npz").write_bytes((p / "episode-000000.npz").read_bytes()[:-10]), "size"),
    (lambda p: (p / "manifest.json").write_text("{nope"), "JSON"),
    (lambda p: (p / "manifest.json").write_text(json.dumps({"format": "other"})), "manifest"),
    (lambda p: _edit(p, version=2), "version"),
    (lambda p: _edit(p, count=99), "count"),
    (lambda p: _edit(p, obs_dtype="int16"), "wrong type"),
    (lambda p: _edit(p, episodes=[{"file": "../../etc/passwd", "transitions": 11}]), "outside"),
    (lambda p: (p / "manifest.json").unlink(), "never finalised"),
])
def test_damaged_sets_are_refused_on_open(tmp_path: Path, damage: Callable, match: str) -> None:
    path = make_set(tmp_path / "demos")
    damage(path)
    with pytest.raises(DemoFileError, match=match) as info:
        open_demos(path)
    assert "\n" not in str(info.value)


def _edit(path: Path, **changes: object) -> None:
    manifest = json.loads((path / "manifest.json").read_text())
    (path / "manifest.json").write_text(json.dumps(manifest | changes))


def test_same_size_corruption_is_caught_when_reading(tmp_path: Path) -> None:
    path = make_set(tmp_path / "demos")
    file = path / "episode-000001.npz"
    data = bytearray(file.read_bytes())
    data[len(data) // 2] ^= 0xFF
    file.write_bytes(bytes(data))
    demos = DemoSet(path)  # sizes still match
    with pytest.raises(DemoFileError, match="CRC"):
        list(demos.episodes())


def test_no_pickle_is_ever_loaded(tmp_path: Path) -> None:
    path = make_set(tmp_path / "demos")
    file = path / "episode-000000.npz"
    with np.load(file) as npz:
        arrays = {name: npz[name] for name in npz.files}
    np.savez(file, **(arrays | {"observations": np.array([object()], dtype=object)}))  # a pickled object array
    data = file.read_bytes()
    entries = json.loads((path / "manifest.json").read_text())["episodes"]
    entries[0] |= {"bytes": len(data), "crc32": zlib.crc32(data)}  # a consistent manifest: only the pickle is bad
    _edit(path, episodes=entries)
    with pytest.raises(DemoFileError, match="Python objects"):
        list(open_demos(path).episodes())


@pytest.mark.parametrize("compress", [True, False])
def test_episodes_read_in_parallel_threads_are_exact(tmp_path: Path, compress: bool) -> None:
    """load_demos reads episodes in threads; NumPy parses .npy headers with ast, which CPython 3.11 cannot run in two
    threads at once (python/cpython#106905: "AST constructor recursion depth mismatch"), so header parses take turns."""
    episodes = [episode(3 + i, i) for i in range(24)]
    with writer(tmp_path / "demos", compress=compress) as w:
        for obs, actions, rewards in episodes:
            w.add_episode(obs, actions, rewards, terminated=True)
    demos = open_demos(tmp_path / "demos")
    with ThreadPoolExecutor(8) as pool:
        for _ in range(25):
            for (obs, actions, _), frames in zip(episodes, pool.map(demos.episode_frames, range(24)), strict=True):
                assert np.array_equal(frames.observations, obs) and np.array_equal(frames.rows.action, actions)
