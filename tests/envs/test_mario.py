"""Tests for the Super Mario Bros env and the nes-py NumPy 2 compatibility layer."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from flywheel.envs import evaluation_env_id, make_env, nes_compat
from flywheel.envs.mario import INFO_KEYS, MarioEnv

pytestmark = pytest.mark.filterwarnings("error")

RIGHT_A, RIGHT_B, RIGHT_A_B = 2, 3, 4  # indices in the "simple" action set


@pytest.fixture(scope="module")
def env11() -> Iterator[MarioEnv]:
    env = make_env("SuperMarioBros-1-1-v0", seed=0)
    assert isinstance(env, MarioEnv)
    yield env
    env.close()


def test_rom_header_values_under_numpy2() -> None:
    nes_compat.apply()
    nes_compat.apply()  # idempotent
    from gym_super_mario_bros._roms import rom_path
    from nes_py._rom import ROM

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rom = ROM(rom_path(False, "vanilla"))
        assert rom.prg_rom_size == 32 and type(rom.prg_rom_size) is int
        assert rom.chr_rom_size == 8 and type(rom.chr_rom_size) is int
        assert rom.prg_ram_size == 8
        assert rom.mapper == 0 and rom.is_vertical_mirroring and not rom.has_trainer and not rom.is_pal
        assert rom.prg_rom_stop == 16 + 32 * 1024
        assert rom.chr_rom_stop == 16 + 32 * 1024 + 8 * 1024 == rom.raw_data.size
        assert rom.prg_rom.size == 32 * 1024 and rom.chr_rom.size == 8 * 1024


def test_compat_reports_versions() -> None:
    assert nes_compat.installed_versions() == nes_compat.SUPPORTED_VERSIONS


def test_spec_reset_and_step(env11: MarioEnv) -> None:
    assert env11.observation_space.shape == (4, 84, 84) and env11.observation_space.dtype == np.uint8
    assert env11.action_space.n == 7
    obs, info = env11.reset(seed=0)
    assert obs.shape == (4, 84, 84) and obs.dtype == np.uint8 and obs.std() > 0
    assert set(INFO_KEYS) <= set(info)
    assert (info["world"], info["stage"], info["flag_get"]) == (1, 1, False)
    assert (info["progress"], info["success"]) == (float(info["x_pos"]), False)  # its measures (flywheel.envs.measures)
    obs2, reward, terminated, truncated, info = env11.step(RIGHT_B)
    assert obs2.shape == (4, 84, 84) and obs2.dtype == np.uint8
    np.testing.assert_array_equal(obs2[:3], obs[1:])  # stack shifts by one frame
    assert isinstance(reward, float) and terminated is False and truncated is False
    for key in ("x_pos", "world", "stage", "score", "time", "life"):
        assert type(info[key]) is int, key
    assert type(info["flag_get"]) is bool
    assert info["progress"] == float(info["x_pos"]) and info["success"] is False and "end" not in info


def test_x_pos_passes_255_without_uint8_wrap(env11: MarioEnv) -> None:
    """Run right with periodic jumps: x_pos = page * 256 + x must grow well past 255."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, info = env11.reset(seed=0)
        xs, total = [info["x_pos"]], 0.0
        for t in range(300):
            _, reward, terminated, truncated, info = env11.step(RIGHT_A_B if t % 8 < 6 else RIGHT_B)
            xs.append(info["x_pos"])
            total += info["raw_reward"]  # the library's reward, before Flywheel's shaping
            if terminated or truncated:
                break
    diffs = np.diff(xs)
    assert max(xs) > 1000, xs[-5:]
    assert any(256 <= x < 512 for x in xs) and any(x >= 512 for x in xs)
    assert (diffs >= 0).mean() > 0.95 and diffs.min() >= -5  # monotonic-ish, never a wrap to ~0
    assert total > 500


def test_reset_is_deterministic(env11: MarioEnv) -> None:
    a, _ = env11.reset(seed=1)
    for _ in range(10):
        a_last = env11.step(RIGHT_B)[0]
    b, _ = env11.reset(seed=2)
    for _ in range(10):
        b_last = env11.step(RIGHT_B)[0]
    np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(a_last, b_last)


@pytest.mark.parametrize(("actions", "n"), [("right_only", 5), ("simple", 7), ("complex", 12)])
def test_action_sets(actions: str, n: int) -> None:
    env = make_env("SuperMarioBros-1-1-v0", actions=actions)
    assert env.action_space.n == n and len(env.get_action_meanings()) == n
    env.reset(seed=0)
    env.step(n - 1)
    with pytest.raises(ValueError, match="invalid action"):
        env.step(n)
    env.close()


def test_other_stage_reports_world_and_stage() -> None:
    env = make_env("SuperMarioBros-4-2-v0", seed=0)
    _, info = env.reset(seed=0)
    assert (info["world"], info["stage"]) == (4, 2)
    _, _, _, _, info = env.step(RIGHT_B)
    assert (info["world"], info["stage"]) == (4, 2)
    env.close()


def test_frame_skip_stack_and_time_limit_options() -> None:
    env = make_env("SuperMarioBros-1-1-v0", frame_skip=2, stack=2, max_episode_steps=3)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (2, 84, 84)
    flags = [env.step(RIGHT_B)[2:4] for _ in range(3)]
    assert flags == [(False, False), (False, False), (False, True)]
    with pytest.raises(RuntimeError, match="reset"):
        env.step(RIGHT_B)
    env.close()
    env.close()  # closing twice is harmless


def test_crop_top_drops_the_hud_rows_before_the_resize() -> None:
    """crop_top=32 (the env-id option) resizes screen rows 32..239: the HUD's clock digits, which change every
    tick, no longer reach the frame, and what does equals resizing the cropped screen by hand."""
    from flywheel.envs.preprocessing import resize_area

    env = make_env("SuperMarioBros-1-1-v0?size=42,crop_top=32,frame_skip=1", seed=0)  # one frame: no max-pool
    assert isinstance(env, MarioEnv) and env.config.crop_top == 32
    env.reset(seed=0)
    before = env._grey().copy()
    for _ in range(80):
        obs, *_ = env.step(RIGHT_B)
    after = env._grey()
    assert (before[16:32] != after[16:32]).any()  # the HUD's digits moved (the clock)
    np.testing.assert_array_equal(obs[-1], resize_area(after[32:], 42, 42))
    with pytest.raises(ValueError, match="crop_top must be 0..200"):
        make_env("SuperMarioBros-1-1-v0?crop_top=240")
    env.close()


def test_frontier_progress_reward_pays_only_for_a_new_furthest_x() -> None:
    """progress_reward=frontier keeps the library's clock term but pays x only past the episode's furthest point:
    walking back costs nothing and walking forward again earns nothing until Mario passes where he had been."""
    plain = "SuperMarioBros-1-1-v0?reward_scale=1,flag_bonus=0,death_penalty=0"
    envs = [make_env(plain, seed=0), make_env(plain + ",progress_reward=frontier", seed=0)]
    xs = [int(env.reset(seed=0)[1]["x_pos"]) for env in envs]
    assert xs[0] == xs[1]
    right, left = 1, 6  # "simple": walk right, walk left
    rewards: list[list[float]] = [[], []]
    trace: list[int] = []
    for action in [right] * 14 + [left] * 12 + [right] * 18:  # x about 40 -> 126 -> 70 -> 156, short of a Goomba
        (_, r_x, done, cut, info), (_, r_front, done_f, _, info_f) = (env.step(action) for env in envs)
        assert not (done or cut or done_f) and info["x_pos"] == info_f["x_pos"]
        assert info["raw_reward"] == info_f["raw_reward"] == r_x  # raw_reward stays the library's sum
        rewards[0].append(r_x)
        rewards[1].append(r_front)
        trace.append(int(info["x_pos"]))
    x_plain, x_front = np.array(rewards[0]), np.array(rewards[1])
    best = max(trace[:38])
    assert trace[28] < best - 20 and trace[37] < best < trace[-1]  # back, not yet where it had been, then past
    assert x_front[:14].sum() == pytest.approx(x_plain[:14].sum()) and x_plain[:14].sum() > 50  # all new: same
    # back (steps 17-28) and forward again short of the furthest x (29-37): free and unpaid against costly and paid
    assert (x_front[17:38] <= 0).all() and x_plain[17:29].sum() < -20 < 0 < x_plain[29:38].sum()
    # the x terms come to (furthest - start) against (last - start); the clock terms are the same
    assert x_front[:38].sum() - x_plain[:38].sum() == pytest.approx(best - trace[37])
    assert x_front[38:].sum() > 0 and x_front.sum() - x_plain.sum() == pytest.approx(max(trace) - trace[-1])
    with pytest.raises(ValueError, match="progress_reward must be 'x' or 'frontier'"):
        make_env("SuperMarioBros-1-1-v0?progress_reward=furthest")
    for env in envs:
        env.close()


def test_stall_steps_truncates_a_training_episode_without_new_ground() -> None:
    """stall_steps=N truncates (not terminates) an episode N agent steps after its furthest x last grew; walking
    right never stalls; evaluation plays the id without the option (no cut-off in an evaluated episode)."""
    env = make_env("SuperMarioBros-1-1-v0?stall_steps=8", seed=0)
    _, info = env.reset(seed=0)
    flags = [env.step(0)[2:4] for _ in range(8)]  # standing still from the level start
    assert flags == [(False, False)] * 7 + [(False, True)]
    _, info = env.reset(seed=0)
    best, since, cut_at = int(info["x_pos"]), 0, None
    right, left = 1, 6  # "simple": walk right, walk left
    for t, action in enumerate([right] * 14 + [left] * 14):
        _, _, done, cut, info = env.step(action)
        x = int(info["x_pos"])
        best, since = (x, 0) if x > best else (best, since + 1)
        assert not done and cut == (since == 8), (t, x, best, since)
        if cut:
            cut_at = t
            break
    assert cut_at is not None and cut_at >= 14 + 8  # the cut came while walking back
    env.close()
    assert evaluation_env_id("SuperMarioBros-1-1-v0?size=42,stall_steps=250,crop_top=32") == \
        "SuperMarioBros-1-1-v0?size=42,crop_top=32"
    assert evaluation_env_id("SuperMarioBros-1-1-v0?stall_steps=250") == "SuperMarioBros-1-1-v0"
    assert evaluation_env_id("SuperMarioBros-1-1-v0?size=42") == "SuperMarioBros-1-1-v0?size=42"
    with pytest.raises(ValueError, match="stall_steps must be >= 1 or None, got 0"):
        make_env("SuperMarioBros-1-1-v0?stall_steps=0")
    for bad in ("2.5", "true", '"250"'):
        with pytest.raises(TypeError, match="option stall_steps must be int"):
            make_env(f"SuperMarioBros-1-1-v0?stall_steps={bad}")


def jumps_holding_right_a(env_id: str, steps: int = 30) -> tuple[list[int], list[int]]:
    """Hold "right A" from the level start: (the frames each jump took off at, the apex screen y of each jump), read
    from RAM after every frame (0x1D: the player's float state, 0 on the ground; 0x3B8: his y on the screen)."""
    env = make_env(env_id, seed=0)
    assert isinstance(env, MarioEnv)
    state: dict[str, Any] = {"frame": 0, "ground": True, "takeoffs": [], "apexes": []}

    def watch(_screen: np.ndarray) -> None:
        ram = env._nes.ram
        ground, y = int(ram[0x1D]) == 0, int(ram[0x3B8])
        if state["ground"] and not ground:
            state["takeoffs"].append(state["frame"])
            state["apexes"].append(y)
        elif not ground:
            state["apexes"][-1] = min(state["apexes"][-1], y)  # screen y grows downwards
        state["ground"] = ground
        state["frame"] += 1

    env.reset(seed=0)
    env.frame_hook = watch
    for _ in range(steps):
        assert not any(env.step(RIGHT_A)[2:4])
    env.close()
    return state["takeoffs"], state["apexes"]


def test_rejump_lets_a_held_jump_button_jump_again_after_each_landing() -> None:
    """The game jumps only on a fresh press of A: held "right A" jumps once, then walks. With rejump=true A is let go
    for one frame on the ground, so the held action jumps again after each landing, each jump as high as the first;
    evaluation plays the option as it is (it is how the buttons work, not a training-only rule). Screen y grows
    downwards: an apex is the jump's least y."""
    takeoffs, apexes = jumps_holding_right_a("SuperMarioBros-1-1-v0")
    assert len(takeoffs) == 1, takeoffs
    again, again_apexes = jumps_holding_right_a("SuperMarioBros-1-1-v0?rejump=true")
    assert len(again) >= 3 and again[0] == takeoffs[0], again
    assert again_apexes[0] == apexes[0], (apexes, again_apexes)  # the first jump is not cut short
    assert all(abs(apex - apexes[0]) <= 8 for apex in again_apexes[1:3]), (apexes, again_apexes)  # full jumps
    assert evaluation_env_id("SuperMarioBros-1-1-v0?size=42,rejump=true") == "SuperMarioBros-1-1-v0?size=42,rejump=true"
    with pytest.raises(TypeError, match="option rejump must be bool"):
        make_env("SuperMarioBros-1-1-v0?rejump=1")


@pytest.mark.parametrize(
    "env_id", ["SuperMarioBros-v0", "SuperMarioBros-v3", "SuperMarioBros2-v1", "SuperMarioBros-8-4-v1"]
)
def test_rom_variants_build_and_step(env_id: str) -> None:
    env = make_env(env_id, seed=0)
    obs, info = env.reset(seed=0)
    for _ in range(5):
        obs, *_, info = env.step(RIGHT_B)
    assert obs.shape == (4, 84, 84) and info["life"] == 2
    env.close()


def test_render_rgb_array() -> None:
    env = make_env("SuperMarioBros-1-1-v0", render_mode="rgb_array")
    env.reset(seed=0)
    frame = env.render()
    assert frame is not None and frame.shape == (240, 256, 3) and frame.dtype == np.uint8
    env.close()


@pytest.mark.slow  # thousands of emulator frames
def test_random_stages_respects_stage_subset() -> None:
    env = make_env("SuperMarioBrosRandomStages-v0", stages=["4-2", "7-1"])  # builds 32 emulators (~8 s)
    seen = set()
    for seed in range(6):
        _, info = env.reset(seed=seed)
        seen.add((info["world"], info["stage"]))
        env.step(RIGHT_B)
    assert seen <= {(4, 2), (7, 1)} and len(seen) == 2
    env.close()
