"""The pure learner core: double/dueling DQN targets, weighted Huber loss, target updates, priorities."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from learner_helpers import fit_one_step_rewards, make_batch

from flywheel import proto
from flywheel.services.learner.core import BadBatch, CoreConfig, LearnerCore, linear_at


def _params(net: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in net.parameters()]


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_loss_decreases_on_a_fixed_batch() -> None:
    core = LearnerCore((4,), 2, CoreConfig(lr=1e-3, target_update_interval=10_000))
    batch = make_batch(np.random.default_rng(0), 64)
    first = core.update(batch).stats()["loss"]
    for _ in range(60):
        last = core.update(batch).stats()["loss"]
    assert last < 0.5 * first
    assert core.updates == 61


def test_td_errors_match_the_double_dqn_target() -> None:
    core = LearnerCore((4,), 3, CoreConfig(target_update_interval=10_000))
    with torch.no_grad():  # make target differ from online so the double-DQN split matters
        for p in core.target.parameters():
            p.add_(0.1 * torch.randn_like(p))
    batch = make_batch(np.random.default_rng(1), 16, n_actions=3)
    obs, next_obs = torch.from_numpy(batch.obs), torch.from_numpy(batch.next_obs)
    online, target = copy.deepcopy(core.online), copy.deepcopy(core.target)
    with torch.no_grad():
        best = online(next_obs).argmax(1, keepdim=True)
        y = torch.from_numpy(batch.reward) + torch.from_numpy(batch.discount) * target(next_obs).gather(1, best)[:, 0]
        q = online(obs).gather(1, torch.from_numpy(batch.action)[:, None])[:, 0]
    result = core.update(batch)
    prio = result.priorities()
    assert prio.shape == (16,) and prio.dtype == np.float32
    np.testing.assert_allclose(prio, (y - q).abs().numpy(), rtol=1e-5, atol=1e-6)


def test_importance_weights_scale_the_loss() -> None:
    batch = make_batch(np.random.default_rng(2), 32)
    losses = []
    for scale in (1.0, 0.5):
        torch.manual_seed(0)
        core = LearnerCore((4,), 2, CoreConfig())
        scaled = proto.SampleBatch(**{**batch.__dict__, "weight": batch.weight * np.float32(scale)})
        losses.append(core.update(scaled).stats()["loss"])
    assert losses[1] == pytest.approx(0.5 * losses[0], rel=1e-5)


def test_hard_target_copy_every_k_updates() -> None:
    core = LearnerCore((4,), 2, CoreConfig(lr=1e-2, target_update_interval=3))
    batch = make_batch(np.random.default_rng(3), 32)
    start = _params(core.target)
    core.update(batch)
    core.update(batch)
    assert _same(_params(core.target), start)
    assert not _same(_params(core.online), _params(core.target))
    core.update(batch)
    assert _same(_params(core.online), _params(core.target))


def test_polyak_target_moves_by_tau() -> None:
    tau = 0.25
    core = LearnerCore((4,), 2, CoreConfig(lr=1e-2, tau=tau, target_update_interval=1))
    before = _params(core.target)
    core.update(make_batch(np.random.default_rng(4), 32))
    for t0, t1, o in zip(before, _params(core.target), _params(core.online), strict=True):
        torch.testing.assert_close(t1, t0 + tau * (o - t0))


def test_the_acting_average_follows_the_online_network_by_its_rate() -> None:
    plain = LearnerCore((4,), 2, CoreConfig())
    assert plain.acting is plain.online  # off: the online network acts
    rate = 0.25
    core = LearnerCore((4,), 2, CoreConfig(lr=1e-2, acting_ema=rate))
    assert core.acting is not core.online and _same(_params(core.acting), _params(core.online))
    assert not any(p.requires_grad for p in core.acting.parameters())
    batch = make_batch(np.random.default_rng(4), 32)
    for _ in range(3):
        before = _params(core.acting)
        core.update(batch)
        for a0, a1, o in zip(before, _params(core.acting), _params(core.online), strict=True):
            torch.testing.assert_close(a1, a0 + rate * (o - a0))
    assert not _same(_params(core.acting), _params(core.online))  # it lags the online network


def test_learns_one_step_rewards() -> None:
    q, table = fit_one_step_rewards(LearnerCore((4,), 2, CoreConfig(lr=3e-3), "cpu"), seed=5)
    np.testing.assert_allclose(q, table, atol=0.05)


def test_pixel_batches_train() -> None:
    core = LearnerCore((2, 36, 36), 4, CoreConfig(lr=1e-3))
    batch = make_batch(np.random.default_rng(6), 8, obs_shape=(2, 36, 36), n_actions=4, pixels=True)
    assert core.name.startswith("nature-2x36x36-4")
    result = core.update(batch)
    assert result.applied and result.priorities().shape == (8,)


def test_non_finite_batch_is_skipped_and_weights_stay_finite() -> None:
    core = LearnerCore((4,), 2, CoreConfig())
    batch = make_batch(np.random.default_rng(7), 16)
    reward = batch.reward.copy()
    reward[3] = np.nan
    bad = proto.SampleBatch(**{**batch.__dict__, "reward": reward})
    before = _params(core.online)
    result = core.update(bad)
    assert not result.applied and core.updates == 0 and core.skipped == 1
    assert _same(before, _params(core.online))
    assert np.isfinite(result.priorities()).all()
    assert core.update(batch).applied


def test_check_batch_rejects_what_cannot_be_trained() -> None:
    core = LearnerCore((4,), 2, CoreConfig())
    rng = np.random.default_rng(8)
    core.check_batch(make_batch(rng, 8))
    with pytest.raises(BadBatch, match="shape"):
        core.check_batch(make_batch(rng, 8, obs_shape=(5,)))
    with pytest.raises(BadBatch, match="actions"):
        core.check_batch(make_batch(rng, 8, n_actions=3))
    neg = make_batch(rng, 8)
    with pytest.raises(BadBatch, match="weights"):
        core.check_batch(proto.SampleBatch(**{**neg.__dict__, "weight": -neg.weight}))


def test_set_lr_and_beta_schedule() -> None:
    core = LearnerCore((4,), 2, CoreConfig(lr=1e-3))
    core.set_lr(5e-4)
    assert core.lr == pytest.approx(5e-4)
    with pytest.raises(ValueError):
        core.set_lr(-1.0)
    assert linear_at(0, 0.4, 1.0, 100) == pytest.approx(0.4)
    assert linear_at(50, 0.4, 1.0, 100) == pytest.approx(0.7)
    assert linear_at(500, 0.4, 1.0, 100) == pytest.approx(1.0)
    assert linear_at(0, 0.4, 1.0, 0) == pytest.approx(1.0)
