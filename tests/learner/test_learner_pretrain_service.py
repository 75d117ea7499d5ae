"""The learner service pretrains on a real demonstrations set, then publishes the cloned policy; bad sets exit 2."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from learner_helpers import SPEC, first_weights_then_stop
from test_learner_pretrain import write_cartpole_demos

from flywheel.demos.format import DemoSet
from flywheel.nets import build_q_network, load_weights
from flywheel.services.learner.main import main
from flywheel.services.learner.settings import LearnerSettings


@pytest.mark.system
def test_service_publishes_the_cloned_policy_after_pretraining(tmp_path: Path) -> None:
    demos = write_cartpole_demos(tmp_path / "demos")
    run = first_weights_then_stop(
        tmp_path / "ckpt", wait_s=120, stop_s=60, FLYWHEEL_LEARNER_DEMOS_PATH=str(demos),
        FLYWHEEL_LEARNER_PRETRAIN_UPDATES="1500", FLYWHEEL_LEARNER_PRETRAIN_LOSS="bc",
        FLYWHEEL_LEARNER_BATCH_SIZE="128", FLYWHEEL_LEARNER_LR="0.001", FLYWHEEL_LEARNER_HIDDEN="64",
        FLYWHEEL_LEARNER_SEED="0")
    assert run.returncode == 0, run.err
    assert "pretraining 1500/1500 updates" in run.err and "pretraining done" in run.err
    assert run.weights.version == 1  # the first weights out are the pretrained ones: actors start from them
    net = build_q_network((4,), 2, dueling=True, hidden=64)
    load_weights(net, run.weights, net.name)
    episodes = list(DemoSet(demos).episodes())
    states = np.concatenate([e.obs for e in episodes])
    expert = np.concatenate([e.action for e in episodes])
    with torch.inference_mode():
        greedy = net(torch.from_numpy(states)).argmax(dim=1).numpy()
    assert (greedy == expert).mean() >= 0.8


def _settings(tmp_path: Path, demos: Path) -> LearnerSettings:
    return LearnerSettings(demos_path=str(demos), pretrain_updates=10, device="cpu", torch_threads=1,
                           weights_bind="tcp://127.0.0.1:0")


def _one_error_line(caplog: pytest.LogCaptureFixture) -> str:
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "\n" not in errors[0], errors
    return errors[0]


def test_missing_set_exits_2_with_one_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    assert main(_settings(tmp_path, tmp_path / "nowhere"), spec=SPEC) == 2
    assert "no demonstrations directory" in _one_error_line(caplog)


def test_unfinished_set_exits_2_with_one_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    demos = write_cartpole_demos(tmp_path / "demos", episodes=1, steps=20)
    (demos / "manifest.json").unlink()  # as a writer killed before close leaves it
    assert main(_settings(tmp_path, demos), spec=SPEC) == 2
    assert "never finalised" in _one_error_line(caplog)


def test_truncated_episode_exits_2_with_one_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    demos = write_cartpole_demos(tmp_path / "demos", episodes=2, steps=20)
    episode = demos / "episode-000001.npz"
    episode.write_bytes(episode.read_bytes()[:-40])
    assert main(_settings(tmp_path, demos), spec=SPEC) == 2
    assert "partial or damaged" in _one_error_line(caplog)


def test_corrupt_episode_exits_2_with_one_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    demos = write_cartpole_demos(tmp_path / "demos", episodes=2, steps=20)
    episode = demos / "episode-000000.npz"
    data = bytearray(episode.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, one flipped byte
    episode.write_bytes(bytes(data))
    assert main(_settings(tmp_path, demos), spec=SPEC) == 2
    assert "damaged" in _one_error_line(caplog)


def test_set_for_another_env_exits_2_with_one_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    demos = write_cartpole_demos(tmp_path / "demos", episodes=1, steps=20)
    assert main(_settings(tmp_path, demos), spec=SimpleNamespace(obs_shape=(6,), n_actions=3)) == 2
    assert "shape" in _one_error_line(caplog)


def test_settings_refuse_pretraining_without_a_set() -> None:
    with pytest.raises(ValueError, match="needs --demos-path"):
        LearnerSettings(pretrain_updates=100)
    with pytest.raises(ValueError, match="pretrain-updates"):
        LearnerSettings(demos_path="/tmp/demos")
    with pytest.raises(ValueError):
        LearnerSettings(demos_path="/tmp/demos", pretrain_updates=1, pretrain_loss="mse")
    with pytest.raises(ValueError):
        LearnerSettings(demo_margin=0)
