"""DQfD large-margin and BC losses on plain tensors; pretraining on a real demonstrations set written by DemoWriter."""

from __future__ import annotations

from pathlib import Path

import gymnasium
import numpy as np
import pytest
import torch
from torch.nn import functional as F

from flywheel.demos.experts import cartpole_expert
from flywheel.demos.format import DemoFileError, DemoSet, DemoWriter
from flywheel.services.learner.core import CoreConfig, LearnerCore
from flywheel.services.learner.losses import action_values, cross_entropy_loss, large_margin_loss
from flywheel.services.learner.pretrain import BatchPrefetcher, Pretrainer, load_demos


def test_large_margin_loss_matches_hand_computed_values() -> None:
    q = torch.tensor([[1.0, 2.0, 0.5], [3.0, 1.0, 2.5], [0.0, 0.0, 0.0]])
    expert = torch.tensor([1, 0, 2])
    # row 0: max(1.8, 2.0, 1.3) - 2.0 = 0 (expert leads by 1.0 >= 0.8)
    # row 1: max(3.0, 1.8, 3.3) - 3.0 = 0.3 (a rival is within the margin)
    # row 2: max(0.8, 0.8, 0.0) - 0.0 = 0.8 (all equal: exactly the margin)
    torch.testing.assert_close(large_margin_loss(q, expert, 0.8), torch.tensor([0.0, 0.3, 0.8]))
    # the expert ranked below another action: the gap plus the margin
    torch.testing.assert_close(large_margin_loss(torch.tensor([[5.0, 1.0]]), torch.tensor([1]), 0.5),
                               torch.tensor([4.5]))


def test_large_margin_loss_is_never_negative_and_raises_the_expert_action() -> None:
    q = torch.randn(64, 4, requires_grad=True)
    expert = torch.randint(0, 4, (64,))
    loss = large_margin_loss(q, expert, 0.8)
    assert (loss >= 0).all()
    loss.sum().backward()
    grad = q.grad
    assert grad is not None
    taken = grad.gather(1, expert.view(-1, 1)).squeeze(1)
    active = loss > 0
    assert (taken[active] == -1).all()  # descending the gradient raises Q(s, a_E) where the loss is active
    assert (grad[~active] == 0).all()


def test_large_margin_loss_on_quantiles_uses_their_means() -> None:
    z = torch.tensor([[[0.0, 2.0], [1.5, 1.5]]])  # means (1.0, 1.5)
    torch.testing.assert_close(action_values(z), torch.tensor([[1.0, 1.5]]))
    torch.testing.assert_close(large_margin_loss(z, torch.tensor([0]), 0.8), torch.tensor([1.3]))  # 1.5 + 0.8 - 1.0


def test_cross_entropy_loss_is_softmax_cross_entropy_of_q() -> None:
    q = torch.randn(16, 3)
    expert = torch.randint(0, 3, (16,))
    torch.testing.assert_close(cross_entropy_loss(q, expert), F.cross_entropy(q, expert, reduction="none"))


def write_cartpole_demos(path: Path, episodes: int = 3, steps: int = 200) -> Path:
    """A real set: the scripted expert plays CartPole-v1 (episodes cut at ``steps``, so not terminated)."""
    env = gymnasium.make("CartPole-v1")
    expert = cartpole_expert()
    with DemoWriter(path, env_id="CartPole-v1", obs_shape=(4,), obs_dtype="float32", n_step=3, gamma=0.99) as writer:
        for episode in range(episodes):
            obs, info = env.reset(seed=episode)
            observations, actions = [obs], []
            for _ in range(steps):
                action = expert(obs, info)
                obs, _, terminated, truncated, info = env.step(action)
                observations.append(obs)
                actions.append(action)
                if terminated or truncated:
                    break
            writer.add_episode(np.stack(observations).astype(np.float32), np.asarray(actions, np.int64),
                               np.ones(len(actions)), terminated=False)
    env.close()
    return path


@pytest.fixture(scope="module")
def demos_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_cartpole_demos(tmp_path_factory.mktemp("demos") / "cartpole")


def test_load_demos_reads_every_transition_with_frames_once(demos_dir: Path) -> None:
    data = load_demos(demos_dir, (4,), 2, workers=2)
    episodes = list(DemoSet(demos_dir).episodes())
    assert len(data) == sum(len(e.action) for e in episodes) == 600 and data.episodes == 3
    assert data.observations.shape == (603, 4)  # 201 observations per episode, each stored once
    np.testing.assert_array_equal(data.observations[data.rows.obs], np.concatenate([e.obs for e in episodes]))
    np.testing.assert_array_equal(data.observations[data.rows.next_obs], np.concatenate([e.next_obs for e in episodes]))
    np.testing.assert_array_equal(data.rows.action, np.concatenate([e.action for e in episodes]))
    np.testing.assert_allclose(data.rows.discount, np.concatenate([e.discount for e in episodes]))


def test_load_demos_refuses_a_set_for_another_network(demos_dir: Path) -> None:
    with pytest.raises(DemoFileError, match="shape"):
        load_demos(demos_dir, (8,), 2)
    with pytest.raises(DemoFileError, match="actions"):
        load_demos(demos_dir, (4,), 1)


def test_prefetcher_hands_out_exactly_the_batches_asked_for(demos_dir: Path) -> None:
    data = load_demos(demos_dir, (4,), 2)
    prefetch = BatchPrefetcher(data, 32, 7, seed=0)
    try:
        batches = list(prefetch)
    finally:
        prefetch.close()
    assert len(batches) == 7
    for b in batches:
        assert b.obs.shape == (32, 4) and b.next_obs.shape == (32, 4) and b.is_demo.all() and (b.weight == 1).all()


@pytest.mark.parametrize("loss", ["dqfd", "bc"])
def test_pretraining_clones_the_expert(demos_dir: Path, loss: str) -> None:
    data = load_demos(demos_dir, (4,), 2)
    core = LearnerCore((4,), 2, CoreConfig(lr=1e-3, hidden=64, tau=0.01))
    states = data.observations[data.rows.obs]
    before = float((core.q_values(states).argmax(1) == data.rows.action).mean())
    progress = Pretrainer(core, loss=loss).run(data, 1500, 128, seed=0)
    after = float((core.q_values(states).argmax(1) == data.rows.action).mean())
    assert progress.updates == 1500 and np.isfinite(progress.loss)
    assert after >= 0.8 and after > before + 0.1, (before, after)
    for target, online in zip(core.target.parameters(), core.online.parameters(), strict=True):
        torch.testing.assert_close(target, online)  # RL starts from target = the cloned network


def test_pretrainer_validates_its_settings() -> None:
    core = LearnerCore((4,), 2, CoreConfig(hidden=16))
    with pytest.raises(ValueError, match="dqfd or bc"):
        Pretrainer(core, loss="mse")
    with pytest.raises(ValueError, match="margin"):
        Pretrainer(core, margin=0.0)
