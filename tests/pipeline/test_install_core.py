"""`pip install flywheel-rl` with no extras, for real, in a fresh virtual environment: it trains CartPole with
`flywheel run` (gateway and curves included), and each feature of a missing extra fails in one line naming it."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from flywheel.testing.run import clean_env

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
NOT_IN_THE_CORE = ("nes-py", "gym-super-mario-bros", "gym", "ale-py", "imageio-ffmpeg", "pygame",
                   "opencv-python-headless", "mettagrid", "wandb", "onnx", "onnxruntime", "pytest")
CHEAP = ["--actors", "1", "--envs-per-actor", "2", "--base-port", "0", "--http-port", "0", "--progress-interval", "1",
         "--set", "replay.min_size_to_sample=200"]


def run(argv: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    env = clean_env()
    env.pop("PYTHONPATH", None)  # nothing of the test's own environment leaks in
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def one_error_line(result: subprocess.CompletedProcess[str], extra: str) -> str:
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert f"pip install 'flywheel-rl[{extra}]'" in lines[0], lines[0]
    return lines[0]


def link_torch(venv: Path, folder: Path) -> None:
    """Make this venv's torch (its package folders and dist-info, nothing else) importable in ``venv`` through a .pth
    line, so pip sees torch installed and resolves the rest of the core (torch's own dependencies included) for
    real. Unpacking the torch wheel again would test pip, not Flywheel, and take a share of CI."""
    dist = importlib.metadata.distribution("torch")
    top = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
    folder.mkdir()
    site_packages = Path(str(dist.locate_file("")))
    for name in top:
        (folder / name).symlink_to(site_packages / name)
    (next((venv / "lib").glob("python3*")) / "site-packages" / "linked-torch.pth").write_text(f"{folder}\n")


@pytest.mark.timeout(900)  # a venv, the core's dependencies from the local package index, a short run
def test_the_core_install_trains_cartpole_and_names_missing_extras(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    link_torch(venv, tmp_path / "torch-linked")
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    source = tmp_path / "src"  # pip builds in the source folder (build/, *.egg-info): a copy, not the checkout
    skip = shutil.ignore_patterns(".git", ".venv*", "build", "*.egg-info", "__pycache__", ".pytest_cache",
                                  ".ruff_cache", ".hypothesis", "tests")
    shutil.copytree(ROOT, source, ignore=skip)
    installed = run([*pip, str(source)], tmp_path, timeout=600)
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    listed = run([str(venv / "bin" / "python"), "-m", "pip", "list", "--format", "freeze"], tmp_path, timeout=120)
    names = {line.split("==")[0].lower() for line in listed.stdout.splitlines()}
    assert "flywheel-rl" in names and not names & set(NOT_IN_THE_CORE), sorted(names & set(NOT_IN_THE_CORE))

    flywheel = str(venv / "bin" / "flywheel")
    trained = run([flywheel, "run", "--env", "CartPole-v1", *CHEAP, "--steps", "3000", "--checkpoint-dir", "ckpt"],
                  tmp_path, timeout=300)
    assert trained.returncode == 0, trained.stdout + trained.stderr
    assert any(line.startswith("[") and "env steps" in line for line in trained.stdout.splitlines()), trained.stdout
    assert (tmp_path / "ckpt" / "learner" / "learner.safetensors").is_file()
    assert (tmp_path / "ckpt" / "progress.csv").is_file()  # the gateway's curves: TensorBoard is in the core
    # the end-of-run clip needs the video extra: a warning, and the run itself succeeded
    assert "pip install 'flywheel-rl[video]'" in trained.stderr, trained.stderr[-3000:]
    played = run([flywheel, "play", "ckpt", "--episodes", "1"], tmp_path, timeout=120)
    assert played.returncode == 0 and "mean return" in played.stdout, played.stdout + played.stderr

    one_error_line(run([flywheel, "play", "ckpt", "--video", "out.mp4"], tmp_path, timeout=120), "video")
    one_error_line(run([flywheel, "run", "--env", "SuperMarioBros-1-1-v0", *CHEAP], tmp_path, timeout=120), "mario")
    one_error_line(run([flywheel, "run", "--env", "ALE/Breakout-v5", *CHEAP], tmp_path, timeout=120), "atari")
    one_error_line(run([flywheel, "export", "ckpt"], tmp_path, timeout=120), "export")
    assert not os.path.exists(tmp_path / "ckpt-2" / "learner")  # refused before anything started
