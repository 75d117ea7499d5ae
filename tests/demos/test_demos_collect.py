"""Demonstration collection: scripted experts, the worker pool, merging into one set, and its clear errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from flywheel.cli import main
from flywheel.demos.collect import collect, play_episode, resolve_workers
from flywheel.demos.experts import PolicyError, build_policy, checkpoint_policy, platformer_expert
from flywheel.demos.format import DemoFileError, DemoSet
from flywheel.envs import make_env


@pytest.mark.system
def test_cartpole_collection_with_two_workers_makes_one_valid_set(tmp_path: Path) -> None:
    out = tmp_path / "cartpole"
    summary = collect("CartPole-v1", 4, out, workers="2", show_progress=False)
    assert summary["workers"] == 2 and summary["episodes"] == 4
    demos = DemoSet(out)
    episodes = list(demos.episodes())
    assert len(episodes) == 4 and demos.count == summary["transitions"] == 2000  # the expert balances 500 steps
    assert all(e["return"] == 500.0 for e in demos.manifest["episodes"])
    assert sorted(p.name for p in out.iterdir()) == [f"episode-00000{i}.npz" for i in range(4)] + [
        "manifest.json"]
    # n-step data as actors send it: next_obs of row t is obs of row t + 3 within the episode
    first = episodes[0]
    np.testing.assert_array_equal(first.next_obs[0], first.obs[3])
    assert first.discount[0] == pytest.approx(0.99 ** 3)

    more = collect("CartPole-v1", 2, out, workers="1", append=True, show_progress=False, seed=7)
    assert more["total_count"] == 3000 and len(list(DemoSet(out).episodes())) == 6
    with pytest.raises(DemoFileError, match="--append"):
        collect("CartPole-v1", 1, out, workers="1", show_progress=False)


def test_snake_expert_beats_random() -> None:
    env = make_env("Snake-v0", seed=0)
    expert, rand = build_policy("expert", "Snake-v0", env, 0), build_policy("random", "Snake-v0", env, 0)
    expert_food = sum(float(play_episode(env, expert, s)[2].clip(0).sum()) for s in range(3))
    random_food = sum(float(play_episode(env, rand, s)[2].clip(0).sum()) for s in range(3))
    assert expert_food >= 15 and expert_food > 3 * random_food


def test_the_platformer_expert_runs_right_on_mario() -> None:
    """Chosen by the env's NES action set (right+A+B and right+B), not by its name."""
    env = make_env("SuperMarioBros-1-1-v0", seed=0)
    policy = build_policy("expert", "SuperMarioBros-1-1-v0", env, 0)
    observations, actions, rewards, _, info = play_episode(env, policy, 0)
    assert observations.shape[1:] == (4, 84, 84) and observations.dtype == np.uint8
    assert info["x_pos"] > 250 and rewards.sum() > 0
    env.close()
    with pytest.raises(PolicyError, match=r"needs right\+A\+B and right\+B"):
        platformer_expert(["NOOP", "right", "A"])


@pytest.mark.system
def test_bad_requests_are_clear_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="--workers"):
        resolve_workers("0", 3)
    assert resolve_workers("8", 3) == 3
    env = make_env("Acrobot-v1", seed=0)
    with pytest.raises(PolicyError, match="no scripted expert for Acrobot-v1"):
        build_policy("expert", "Acrobot-v1", env, 0)
    with pytest.raises(PolicyError, match="unknown policy"):
        build_policy("greedy", "Acrobot-v1", env, 0)
    with pytest.raises(PolicyError, match="no learner checkpoint"):
        checkpoint_policy(tmp_path / "nothing", (6,), 3)
    (tmp_path / "bad.safetensors").write_bytes(b"not a checkpoint")
    with pytest.raises(PolicyError, match="not a readable learner checkpoint"):
        checkpoint_policy(tmp_path / "bad.safetensors", (6,), 3)
    assert main(["demos", "collect", "--env", "NoSuchEnv-v9", "--episodes", "1", "--workers", "1",
                 "--out", str(tmp_path / "x")]) == 2
    assert "NoSuchEnv-v9" in capsys.readouterr().err
    assert main(["demos", "info", str(tmp_path / "missing")]) == 2
    assert "no demonstrations directory" in capsys.readouterr().err
    assert not (tmp_path / "x" / "manifest.json").exists()


def test_checkpoint_policy_plays_the_saved_network(tmp_path: Path) -> None:
    import torch
    from safetensors.torch import save_file

    from flywheel.nets import QNetwork

    net = QNetwork((4,), 2, dueling=True)
    tensors = {f"online.{k}": v.contiguous() for k, v in net.state_dict().items()}
    save_file(tensors, str(tmp_path / "learner.safetensors"), metadata={"flywheel": f'{{"network": "{net.name}"}}'})
    policy = checkpoint_policy(tmp_path, (4,), 2)
    obs = np.array([0.1, -0.2, 0.05, 0.3], dtype=np.float32)
    with torch.inference_mode():
        expected = int(net(torch.from_numpy(obs[None])).argmax())
    assert policy(obs, {}) == expected
    with pytest.raises(PolicyError, match="needs"):
        checkpoint_policy(tmp_path, (4,), 3)
