"""Start-state pools through a file and back: the .npz format, faulty files, and Mario's replayed states."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium
import numpy as np
import pytest

from flywheel.envs import StartStateConfig, make_env
from flywheel.envs.start_states import StartStateCurriculum, load_pool, save_pool
from flywheel.envs.vector import InProcessVector, pool_file

MARIO = "SuperMarioBros-1-1-v0"


class Walk(gymnasium.Env[np.ndarray, np.int64]):
    """A corridor: action 1 steps right, 0 stays; ends after 10 steps. Its state is its position."""

    observation_space = gymnasium.spaces.Box(0, 255, (1,), dtype=np.uint8)
    action_space = gymnasium.spaces.Discrete(2)

    def __init__(self, persistent: bool = True) -> None:
        self.x, self.t = 0, 0
        self.states: Any = (Slots if persistent else MemoryOnly)(self)

    def start_states(self) -> Any:
        return self.states

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[np.ndarray, dict[str, Any]]:
        self.x, self.t = 0, 0
        return np.array([0], dtype=np.uint8), {"x": 0}

    def step(self, action: np.int64) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.x += int(action)
        self.t += 1
        return np.array([self.x], dtype=np.uint8), 0.0, False, self.t >= 10, {"x": self.x}


class MemoryOnly:
    """Walk's start states without dump/load."""

    capacity = 4

    def __init__(self, env: Walk) -> None:
        self.env = env
        self.saved: dict[int, int] = {}

    def progress(self, info: dict[str, Any]) -> float:
        return float(info["x"])

    def starts_anew(self) -> bool:
        return True

    def level_start(self) -> None:
        pass

    def save(self, slot: int) -> None:
        self.saved[slot] = self.env.x

    def restore(self, slot: int) -> tuple[np.ndarray, dict[str, Any]]:
        self.env.x, self.env.t = self.saved[slot], 0
        return np.array([self.env.x], dtype=np.uint8), {"x": self.env.x}

    def close(self) -> None:
        pass


class Slots(MemoryOnly):
    """Walk's start states, written as one byte each."""

    def dump(self, slot: int) -> np.ndarray:
        return np.array([self.saved[slot]], dtype=np.uint8)

    def load(self, slot: int, data: np.ndarray) -> float:
        self.saved[slot] = int(data[0])
        return float(data[0])


def walk(persistent: bool = True, pool: int = 4) -> StartStateCurriculum:
    return StartStateCurriculum(Walk(persistent), StartStateConfig(share=1.0, margin=3, window=2, pool=pool), "Walk-v0")


def filled(persistent: bool = True) -> StartStateCurriculum:
    """A curriculum after three walking episodes: a frontier and kept states."""
    env = walk(persistent)
    env.reset(seed=0)
    for _ in range(3):
        truncated = False
        while not truncated:
            _, _, _, truncated, _ = env.step(np.int64(1))
        env.reset()
    return env


def test_a_pool_round_trips_through_its_file(tmp_path: Path) -> None:
    env = filled()
    assert env.kept and env.frontier is not None
    assert save_pool(tmp_path / "pool.npz", env) == len(env.kept)
    fresh = walk()
    assert load_pool(tmp_path / "pool.npz", fresh) == (len(env.kept), 0)
    assert fresh.frontier == env.frontier and list(fresh.recent) == list(env.recent)
    assert fresh.episodes == env.episodes
    assert sorted((k.progress, k.episode) for k in fresh.kept) == sorted((k.progress, k.episode) for k in env.kept)
    assert isinstance(env.states, Slots) and isinstance(fresh.states, Slots)
    by_progress = {k.progress: env.states.saved[k.slot] for k in env.kept}
    assert all(fresh.states.saved[k.slot] == by_progress[k.progress] for k in fresh.kept)
    _, info = fresh.reset(seed=1)  # share 1: a restart at a loaded state
    assert info["restarted"] and info["x"] in by_progress


def test_a_smaller_pool_takes_the_most_advanced_states(tmp_path: Path) -> None:
    env = filled()
    assert len(env.kept) >= 2
    save_pool(tmp_path / "pool.npz", env)
    fresh = walk(pool=1)
    assert load_pool(tmp_path / "pool.npz", fresh) == (1, len(env.kept) - 1)
    assert fresh.kept[0].progress == max(k.progress for k in env.kept)


def test_states_that_cannot_be_written_keep_only_the_frontier(tmp_path: Path) -> None:
    env = filled(persistent=False)
    assert env.kept
    assert save_pool(tmp_path / "pool.npz", env) == 0
    fresh = walk(persistent=False)
    assert load_pool(tmp_path / "pool.npz", fresh) == (0, 0)
    assert fresh.frontier == env.frontier and not fresh.kept


@pytest.mark.parametrize("fault", ["garbage", "truncated", "other_env", "empty"])
def test_a_faulty_file_is_reported_and_its_slot_starts_empty(tmp_path: Path, fault: str) -> None:
    source = filled()
    good = tmp_path / "good.npz"
    save_pool(good, source)
    if fault == "other_env":
        source.env_id = "Other-v0"
        save_pool(good, source)
    raw = good.read_bytes()
    content = {"garbage": b"\x00not an npz" * 50, "truncated": raw[:len(raw) // 2], "other_env": raw, "empty": b""}
    vec = InProcessVector([walk(), walk()])
    Path(pool_file(str(tmp_path), "actor-0", 0)).write_bytes(content[fault])
    report = vec.load_start_states(str(tmp_path), "actor-0")
    assert report.slots == 2 and report.files == 0 and report.missing == [1]
    assert len(report.failed) == 1 and report.failed[0].startswith("slot 0: ")
    env = vec.envs[0]
    assert isinstance(env, StartStateCurriculum) and not env.kept and env.frontier is None and env.episodes == 0
    vec.reset()  # and the vector goes on
    vec.close()


def test_a_vector_saves_and_loads_each_slot_under_its_key(tmp_path: Path) -> None:
    vec = InProcessVector([filled(), filled(), walk()], slot_offset=4)
    report = vec.save_start_states(str(tmp_path), "actor-1")
    assert (report.slots, report.files, report.failed) == (3, 3, [])
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"actor-1-env{i}.npz" for i in (4, 5, 6)]
    fewer = InProcessVector([walk(), walk()], slot_offset=4)  # a resume with fewer envs: what matches loads
    loaded = fewer.load_start_states(str(tmp_path), "actor-1")
    assert (loaded.files, loaded.missing, loaded.failed) == (2, [], [])
    assert loaded.states == report.states
    assert fewer.load_start_states(str(tmp_path), "actor-2").missing == [4, 5]


def run_and_jump(t: int) -> int:
    """Hold right + B (run), press A (jump) for 10 steps of every 12 ("simple" actions 4 and 3)."""
    return 4 if t % 12 < 10 else 3


def mario(**options: Any) -> StartStateCurriculum:
    env = make_env(MARIO, max_episode_steps=150, **options)
    return StartStateCurriculum(env, StartStateConfig(share=1.0, margin=50.0, window=1, pool=4), MARIO)


def play(env: StartStateCurriculum, offset: int = 0) -> tuple[list[int], int | None]:
    """One scripted episode (its t-th action is ``run_and_jump(offset + t)``): x after each step, and the step
    whose state was kept (None: none)."""
    xs: list[int] = []
    kept_at, t, done = None, 0, False
    while not done:
        saved = env.saved
        _, _, terminated, truncated, info = env.step(run_and_jump(offset + t))
        xs.append(info["x_pos"])
        if env.saved and not saved:
            kept_at = t
        done, t = terminated or truncated, t + 1
    return xs, kept_at


def restored(env: StartStateCurriculum, seed: int | None = None) -> tuple[np.ndarray, int, np.ndarray, np.ndarray]:
    """Restart at the kept state (share 1): observation, x, the emulator's RAM and screen."""
    obs, info = env.reset(seed=seed)
    assert info["restarted"]
    nes = env.unwrapped._active  # type: ignore[attr-defined]
    return obs, info["x_pos"], np.array(nes.ram), np.array(nes.screen)


@pytest.mark.parametrize("options", [{}, {"rejump": True}], ids=["plain", "rejump"])
def test_a_mario_state_from_a_file_is_the_very_state(tmp_path: Path, options: dict[str, Any]) -> None:
    """The frames as played (rejump's let-go frames among them) replay to the very state, and play on alike."""
    env = mario(**options)
    try:
        env.reset(seed=3)
        assert play(env)[1] is None  # no frontier yet: nothing kept
        env.reset()
        _, kept_at = play(env)  # keeps a state past frontier - margin
        assert kept_at is not None
        offset = kept_at + 1  # script steps from the level start to the kept state
        for round_ in range(2):  # then a state kept in an episode that began at a kept state (its frames chained)
            save_pool(tmp_path / "pool.npz", env)
            other = mario(**options)  # a fresh env, its state replayed from the file
            try:
                assert load_pool(tmp_path / "pool.npz", other) == (1, 0)
                assert other.frontier == env.frontier and other.kept[0].progress == env.kept[0].progress
                obs, x, ram, screen = restored(env)
                obs2, x2, ram2, screen2 = restored(other, seed=round_)
                assert x2 == x == env.kept[0].progress
                assert np.array_equal(obs2, obs) and np.array_equal(ram2, ram) and np.array_equal(screen2, screen)
                frames = len(env.states.kept_frames)  # type: ignore[attr-defined]
                xs, kept_at = play(env, offset)
                assert play(other, offset)[0] == xs  # and the same game goes on from there
            finally:
                other.close()
            assert kept_at is not None and len(env.states.kept_frames) > frames  # type: ignore[attr-defined]
            offset += kept_at + 1
    finally:
        env.close()
