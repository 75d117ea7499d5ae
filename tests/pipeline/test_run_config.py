"""run.json: a short real ``flywheel run`` saves its config, curves and clip; --resume needs nothing else."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # under any import mode (the importnb plugin's too)
from pipeline_helpers import clean_env

pytestmark = pytest.mark.system


def flywheel(*args: str | Path, timeout: float = 240, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "flywheel", *map(str, args)], env=clean_env(**env),
                          capture_output=True, text=True, timeout=timeout)


def ports() -> list[str]:
    return ["--base-port", "0", "--http-port", "0"]  # Unix sockets and an HTTP port the kernel picks


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """A short CartPole run: one actor, 3000 env steps, a --set and a FLYWHEEL_* variable, a secret token."""
    folder = tmp_path_factory.mktemp("run") / "ckpt"
    result = flywheel("run", "--env", "CartPole-v1", "--actors", "1", "--envs-per-actor", "4", "--steps", "3000",
                      "--checkpoint-dir", folder, "--progress-interval", "1", *ports(),
                      "--set", "replay.min_size_to_sample=200", "--set", "learner.lr=0.001",
                      FLYWHEEL_ACTOR_N_STEP="2", FLYWHEEL_GATEWAY_CONTROL_TOKEN="a-secret-token-of-32-characters!")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return folder, result


def test_run_json_holds_the_env_every_service_and_the_versions(
        trained: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    folder, _ = trained
    saved = json.loads((folder / "run.json").read_text())
    assert saved["format"] == "flywheel-run" and saved["env_id"] == "CartPole-v1"
    assert saved["env"] == {"id": "CartPole-v1", "options": {}}
    assert saved["flags"]["actors"] == 1 and saved["flags"]["envs_per_actor"] == 4
    services = saved["services"]
    assert set(services) == {"gateway", "replay", "learner", "actor"}
    assert services["replay"]["MIN_SIZE_TO_SAMPLE"] == "200" and services["replay"]["PRESET"] == "vector"
    assert services["learner"]["LR"] == "0.001" and "BATCH_SIZE" not in services["learner"]  # --set; the preset
    settings = saved["settings"]  # what each service ran with: the preset read
    assert settings["replay"]["capacity"] == 100_000 and settings["replay"]["min_size_to_sample"] == 200
    assert settings["learner"]["lr"] == 0.001 and settings["learner"]["batch_size"] == 128
    assert services["actor"]["N_STEP"] == "2" and services["actor"]["ENV_ID"] == "CartPole-v1"
    assert services["learner"]["CHECKPOINT_DIR"] == str(folder.resolve() / "learner")
    assert "CONTROL_TOKEN" not in services["gateway"]  # secrets stay out
    assert "a-secret-token" not in (folder / "run.json").read_text()
    assert saved["overrides"] == ["actor.n_step=2", "replay.min_size_to_sample=200", "learner.lr=0.001"]
    assert saved["versions"]["flywheel"] and saved["versions"]["torch"]
    assert saved["git"] is None or len(saved["git"]["commit"]) == 40
    assert saved["resumes"] == 0


def test_the_run_leaves_curves_and_a_clip(trained: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    folder, result = trained
    with open(folder / "progress.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert rows and int(rows[-1]["env_steps"]) >= 3000
    assert [int(r["env_steps"]) for r in rows] == sorted(int(r["env_steps"]) for r in rows)
    acc = EventAccumulator(str(folder / "tb"))
    acc.Reload()
    steps = acc.Scalars("replay/size")
    assert [e.step for e in steps] == [int(r["env_steps"]) for r in rows]
    assert "learner/updates_per_second" in acc.Tags()["scalars"]
    assert (folder / "video.mp4").stat().st_size > 0 and "video " in result.stdout
    chosen = json.loads((folder / "learner" / "preferred.json").read_text())  # the end-of-run comparison
    assert chosen["which"] in ("latest", "best") and f"{chosen['which']} weights chosen" in result.stdout


def test_resume_needs_only_the_folder_and_refuses_conflicts(
        trained: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    folder, _ = trained
    conflict = flywheel("run", "--resume", "--checkpoint-dir", folder, "--env", "Acrobot-v1", *ports())
    assert conflict.returncode == 2
    [line] = conflict.stderr.strip().splitlines()
    assert "--env Acrobot-v1 conflicts with CartPole-v1" in line and "run.json" in line
    smaller = flywheel("run", "--resume", "--checkpoint-dir", folder, "--set", "replay.capacity=5000", *ports())
    assert smaller.returncode == 2
    [line] = smaller.stderr.strip().splitlines()
    assert "replay capacity 5000 is smaller than the saved run's 100000" in line

    resumed = flywheel("run", "--resume", "--checkpoint-dir", folder, "--steps", "500", "--no-video", *ports())
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert "training CartPole-v1 with 1 actors" in resumed.stdout
    saved = json.loads((folder / "run.json").read_text())
    assert saved["resumes"] == 1 and saved["env_id"] == "CartPole-v1"
    assert saved["services"]["learner"]["RESUME"] != "false" and saved["services"]["replay"]["RESTORE"] == "true"
    assert saved["services"]["learner"]["LR"] == "0.001" and saved["services"]["actor"]["N_STEP"] == "2"
    assert "filming" not in resumed.stdout  # --no-video
