"""``flywheel play``: a real learner checkpoint plays; its mp4 / gif has one frame per shown env frame."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import imageio_ffmpeg
import numpy as np
import pytest
from PIL import Image

from flywheel.services.learner.checkpoint import save_checkpoint
from flywheel.services.learner.core import CoreConfig, LearnerCore
from flywheel.video import PlayError, VideoWriter

pytestmark = pytest.mark.system

MARIO_STEPS = 12  # agent steps before truncation in the Mario test
EPISODE = re.compile(r"^episode 1: return (?P<ret>-?[0-9.]+), length (?P<length>\d+)(?P<rest>.*)$", re.M)


def _checkpoint(folder: Path, obs_shape: tuple[int, ...], n_actions: int) -> Path:
    """An untrained learner's checkpoint written by the learner's own code, laid out as flywheel run does."""
    save_checkpoint(folder / "learner", LearnerCore(obs_shape, n_actions, CoreConfig()), weight_version=1)
    return folder


@pytest.fixture(scope="module")
def cartpole(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _checkpoint(tmp_path_factory.mktemp("cartpole"), (4,), 2)


def flywheel_play(*args: str | Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLYWHEEL_")}
    return subprocess.run([sys.executable, "-m", "flywheel", "play", *map(str, args)], env=env,
                          capture_output=True, text=True, timeout=timeout)


def _episode(result: subprocess.CompletedProcess[str]) -> re.Match[str]:
    assert result.returncode == 0, result.stderr
    match = EPISODE.search(result.stdout)
    assert match is not None, result.stdout
    return match


def read_mp4(path: Path) -> tuple[dict[str, object], list[np.ndarray]]:
    reader = imageio_ffmpeg.read_frames(str(path))
    meta = reader.__next__()
    width, height = meta["size"]
    frames = [np.frombuffer(f, np.uint8).reshape(height, width, 3) for f in reader]
    return meta, frames


def test_cartpole_mp4_has_the_reset_frame_and_one_frame_per_step(cartpole: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.mp4"
    result = flywheel_play(cartpole, "--env", "CartPole-v1", "--episodes", "1", "--seed", "0", "--video", out)
    match = _episode(result)
    assert result.stderr == "" and len(result.stdout.splitlines()) == 3  # no pygame banner or SDL complaint
    assert result.stdout.startswith(f"playing {cartpole / 'learner' / 'learner.safetensors'} (weight version ")
    length = int(match["length"])
    assert float(match["ret"]) == length  # CartPole: +1 per step
    meta, frames = read_mp4(out)
    assert len(frames) == length + 1
    assert meta["size"] == (600, 400) and frames[0].shape == (400, 600, 3)
    assert meta["fps"] == 50  # CartPole's render_fps: real speed
    assert "codec" not in meta or "h264" in str(meta["codec"])
    assert frames[0].mean() > 200  # the white background with the cart, not a black frame
    assert f"video {out} ({length + 1} frames)" in match.string


def test_cartpole_gif_plays_at_real_speed(cartpole: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.gif"
    match = _episode(flywheel_play(cartpole, "--env", "CartPole-v1", "--episodes", "1", "--seed", "0",
                                   "--video", out))
    length = int(match["length"])
    assert f"({length + 1} frames)" in match.string
    with Image.open(out) as gif:
        assert gif.size == (600, 400)
        durations = []
        for index in range(gif.n_frames):
            gif.seek(index)
            durations.append(gif.info["duration"])
    # Pillow stores a frame equal to the one before as a longer delay of that one: the time is exact
    assert sum(durations) == 20 * (length + 1)  # 50 fps: 20 ms a frame
    assert all(d % 20 == 0 for d in durations) and length // 2 < len(durations) <= length + 1


def test_play_reads_the_env_from_run_json_and_prints_every_episode(cartpole: Path, tmp_path: Path) -> None:
    (cartpole / "run.json").write_text(json.dumps({"format": "flywheel-run", "env_id": "CartPole-v1"}))
    try:
        result = flywheel_play(cartpole, "--episodes", "2", "--epsilon", "0.5", "--seed", "3")
    finally:
        (cartpole / "run.json").unlink()
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert lines[0].startswith("playing ") and lines[0].endswith(  # the file (best or latest), and why
        ", update 0): the newest weights (the run kept no best)")
    assert [line.split(":")[0] for line in lines[1:3]] == ["episode 1", "episode 2"]
    assert lines[3].startswith("mean return ") and "over 2 episodes" in lines[3]


def _one_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: flywheel play: ")
    return lines[0]


def test_bad_input_is_one_line(cartpole: Path, tmp_path: Path) -> None:
    assert "use a file name ending in .mp4 or .gif" in _one_line(
        flywheel_play(cartpole, "--env", "CartPole-v1", "--video", tmp_path / "clip.avi"))
    assert "does not exist" in _one_line(flywheel_play(tmp_path / "nowhere", "--env", "CartPole-v1"))
    assert "no learner checkpoint" in _one_line(flywheel_play(tmp_path, "--env", "CartPole-v1"))
    assert "--env" in _one_line(flywheel_play(cartpole))  # no run.json: which env?
    line = _one_line(flywheel_play(cartpole, "--env", "Acrobot-v1"))  # 6 observations, 3 actions: not this net
    assert "Acrobot-v1" in line


def test_mario_video_has_every_emulator_frame_at_full_resolution(tmp_path: Path) -> None:
    folder = _checkpoint(tmp_path / "mario", (4, 84, 84), 7)
    out = tmp_path / "mario.mp4"
    env_id = f"SuperMarioBros-1-1-v0?max_episode_steps={MARIO_STEPS}"
    match = _episode(flywheel_play(folder, "--env", env_id, "--episodes", "1", "--seed", "0", "--video", out))
    assert int(match["length"]) == MARIO_STEPS  # truncated, not dead, in 0.8 s of game time
    assert re.fullmatch(r", furthest x [\d,]+, flag no", match["rest"])  # the env's measures, by its labels
    meta, frames = read_mp4(out)
    assert meta["fps"] == 60 and meta["size"] == (256, 240)
    assert len(frames) == MARIO_STEPS * 4 + 1  # the reset frame, then every frame of the 4-frame skip
    assert frames[0].shape == (240, 256, 3)
    assert frames[0][..., 2].mean() > 100  # the blue sky of 1-1


def test_video_writer_pads_odd_mp4_sizes_and_thins_fast_gifs(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 255, (17, 31, 3), dtype=np.uint8) for _ in range(7)]
    with VideoWriter(tmp_path / "odd.mp4", 24) as video:
        for frame in frames:
            video.append(frame)
    meta, back = read_mp4(tmp_path / "odd.mp4")
    assert meta["size"] == (32, 18) and len(back) == 7
    with VideoWriter(tmp_path / "fast.gif", 60) as gif:  # 60 fps: every other frame at 30 fps
        for frame in frames:
            gif.append(frame)
    assert (gif.frames, gif.fps) == (4, 30)
    with Image.open(tmp_path / "fast.gif") as image:
        total = 0
        for index in range(image.n_frames):
            image.seek(index)
            total += image.info["duration"]
    assert image.n_frames == 4 and total == 130  # 4 frames at 30 fps, in whole centiseconds
    with pytest.raises(PlayError, match=r"\.mp4 or \.gif"):
        VideoWriter(tmp_path / "x.webm", 30)
