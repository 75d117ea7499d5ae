"""Loss terms against hand-computed values and plain references: QR-DQN quantile Huber, C51 projection and
cross-entropy, double/dueling targets, Munchausen-DQN."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from flywheel.nets import build_q_network
from flywheel.services.learner.losses import (
    categorical_td_loss,
    munchausen_td_loss,
    project_distribution,
    q_td_loss,
    quantile_huber,
    quantile_midpoints,
    quantile_td_loss,
)


def test_quantile_midpoints() -> None:
    torch.testing.assert_close(quantile_midpoints(4), torch.tensor([0.125, 0.375, 0.625, 0.875]))


def test_quantile_huber_matches_a_hand_computed_example() -> None:
    # taus (0.25, 0.75); pred (0, 1); target (0.5, 3); kappa 1.
    # i=0: u=(0.5, 3.0) -> 0.25 * mean(0.125, 2.5) = 0.328125
    # i=1: u=(-0.5, 2.0) -> mean(0.25 * 0.125, 0.75 * 1.5) = 0.578125      total 0.90625
    loss = quantile_huber(torch.tensor([[0.0, 1.0]]), torch.tensor([[0.5, 3.0]]), kappa=1.0)
    torch.testing.assert_close(loss, torch.tensor([0.90625]))
    # kappa 2: every |u| <= 2 is quadratic, and the loss is divided by kappa
    # i=0: 0.25 * mean(0.125, 2*(3-1)=4.0) = 0.515625; i=1: mean(0.25*0.125, 0.75*2.0) = 0.765625 -> /2
    loss2 = quantile_huber(torch.tensor([[0.0, 1.0]]), torch.tensor([[0.5, 3.0]]), kappa=2.0)
    torch.testing.assert_close(loss2, torch.tensor([(0.515625 + 0.765625) / 2]))


def _qr_case() -> dict[str, torch.Tensor]:
    z_all = torch.tensor([[[9.0, 9.0], [0.0, 1.0]]])  # (B=1, A=2, N=2); the taken action is 1: quantiles (0, 1)
    z_next_target = torch.tensor([[[0.0, 5.0], [4.0, 4.0]]])  # target means: a0 2.5, a1 4.0
    z_next_online = torch.tensor([[[1.0, 1.0], [0.0, 0.0]]])  # online means: a0 1.0, a1 0.0
    return {"z_all": z_all, "action": torch.tensor([1]), "reward": torch.tensor([0.5]),
            "discount": torch.tensor([0.5]), "z_next_target": z_next_target, "z_next_online": z_next_online}


def test_quantile_td_loss_double_picks_on_online_means() -> None:
    case = _qr_case()
    terms = quantile_td_loss(**case)  # double: a* = 0 -> target 0.5 + 0.5 * (0, 5) = (0.5, 3.0)
    torch.testing.assert_close(terms.per_sample, torch.tensor([0.90625]))
    torch.testing.assert_close(terms.td_abs, torch.tensor([1.25]))  # |mean(0.5, 3) - mean(0, 1)|
    torch.testing.assert_close(terms.q_taken, torch.tensor([0.5]))


def test_quantile_td_loss_without_double_picks_on_target_means() -> None:
    case = {**_qr_case(), "z_next_online": None}
    terms = quantile_td_loss(**case)  # a* = 1 -> target (2.5, 2.5); i=0: 0.25 * 2.0, i=1: 0.75 * 1.0
    torch.testing.assert_close(terms.per_sample, torch.tensor([1.25]))
    torch.testing.assert_close(terms.td_abs, torch.tensor([2.0]))


def test_quantile_loss_gradient_moves_quantiles_towards_their_fractions() -> None:
    pred = torch.zeros(1, 4, requires_grad=True)
    target = torch.linspace(-1, 1, 101).unsqueeze(0)
    for _ in range(400):
        loss = quantile_huber(pred, target, kappa=0.01).sum()
        (grad,) = torch.autograd.grad(loss, pred)
        pred = (pred - 0.05 * grad).detach().requires_grad_(True)
    expected = torch.quantile(target[0], quantile_midpoints(4))
    torch.testing.assert_close(pred.detach()[0], expected, atol=0.03, rtol=0)


@pytest.mark.parametrize("double", [True, False])
def test_q_td_loss_matches_a_plain_reference(double: bool) -> None:
    g = torch.Generator().manual_seed(0)
    q_all, q_next_t, q_next_o = (torch.randn(8, 3, generator=g) for _ in range(3))
    action, reward = torch.randint(0, 3, (8,), generator=g), torch.randn(8, generator=g)
    discount = torch.full((8,), 0.99**3)
    discount[2] = 0.0  # an episode end inside the n steps
    terms = q_td_loss(q_all, action, reward, discount, q_next_t, q_next_o if double else None, kappa=1.0)
    best = (q_next_o if double else q_next_t).argmax(1)
    y = reward + discount * q_next_t[torch.arange(8), best]
    q = q_all[torch.arange(8), action]
    torch.testing.assert_close(terms.td_abs, (y - q).abs())
    torch.testing.assert_close(terms.per_sample, F.smooth_l1_loss(q, y, reduction="none"))
    assert terms.td_abs[2] == pytest.approx(abs(float(reward[2] - q[2])), rel=1e-6)


def test_munchausen_target_matches_a_plain_reference() -> None:
    """Row by row with Python floats: bonus alpha * clip(tau * log pi(a|s), l0, 0) from the target net on s, soft
    bootstrap sum pi(a'|s') (Q_t(s', a') - tau * log pi(a'|s')), cut by a zero discount."""
    import math

    g = torch.Generator().manual_seed(1)
    q_all, q_now_t, q_next_t = (torch.randn(6, 3, generator=g) for _ in range(3))
    q_now_t[0] = torch.tensor([0.0, 5.0, 0.0])  # action 0 far from greedy: tau * log pi is clipped at l0
    action, reward = torch.tensor([0, 1, 2, 0, 1, 2]), torch.randn(6, generator=g)
    discount = torch.full((6,), 0.9**3)
    discount[4] = 0.0
    alpha, tau, low = 0.9, 0.5, -1.0
    terms = munchausen_td_loss(q_all, action, reward, discount, q_next_t, q_now_t, alpha=alpha, entropy_tau=tau,
                               clip_low=low, kappa=1.0)

    def log_pi(row: list[float]) -> list[float]:
        top = max(row)
        norm = top + tau * math.log(sum(math.exp((v - top) / tau) for v in row))
        return [(v - norm) / tau for v in row]

    for i in range(6):
        now, nxt = q_now_t[i].tolist(), q_next_t[i].tolist()
        a = int(action[i])
        bonus = alpha * min(max(tau * log_pi(now)[a], low), 0.0)
        soft = sum(math.exp(lp) * (v - tau * lp) for v, lp in zip(nxt, log_pi(nxt), strict=True))
        y = float(reward[i]) + bonus + float(discount[i]) * soft
        assert float(terms.td_abs[i]) == pytest.approx(abs(y - float(q_all[i, a])), rel=1e-5, abs=1e-6)
        assert float(terms.per_sample[i]) == pytest.approx(float(F.smooth_l1_loss(
            q_all[i, a], torch.tensor(y), reduction="none")), rel=1e-5, abs=1e-6)
    assert tau * log_pi(q_now_t[0].tolist())[0] < low  # row 0 took the clip


def test_munchausen_without_bonus_at_a_low_temperature_is_the_max_target() -> None:
    """alpha 0 and tau -> 0: the soft bootstrap becomes max_a' Q_t(s', a'), DQN's target without double."""
    g = torch.Generator().manual_seed(2)
    q_all, q_now_t, q_next_t = (torch.randn(8, 4, generator=g) for _ in range(3))
    action, reward = torch.randint(0, 4, (8,), generator=g), torch.randn(8, generator=g)
    discount = torch.full((8,), 0.9)
    m = munchausen_td_loss(q_all, action, reward, discount, q_next_t, q_now_t, alpha=0.0, entropy_tau=1e-4,
                           clip_low=-1.0)
    plain = q_td_loss(q_all, action, reward, discount, q_next_t, None)
    torch.testing.assert_close(m.td_abs, plain.td_abs, atol=1e-3, rtol=0)
    torch.testing.assert_close(m.per_sample, plain.per_sample, atol=1e-3, rtol=0)


def test_dueling_head_is_value_plus_centred_advantage() -> None:
    net = build_q_network((5,), 4, hidden=16)
    x = torch.randn(6, 5)
    with torch.no_grad():
        h = net.fc(net.torso(x))
        adv, value = net.advantage(h), net.value(h)
        torch.testing.assert_close(net(x), value + adv - adv.mean(1, keepdim=True))


def test_quantile_network_forward_is_the_quantile_mean() -> None:
    net = build_q_network((5,), 4, hidden=16, head="quantile", num_quantiles=8)
    x = torch.randn(6, 5)
    with torch.no_grad():
        z = net.outputs(x)
        assert z.shape == (6, 4, 8)
        torch.testing.assert_close(net(x), z.mean(2))
        h = net.fc(net.torso(x))
        adv, value = net.advantage(h).view(6, 4, 8), net.value(h).view(6, 1, 8)
        torch.testing.assert_close(z, value + adv - adv.mean(1, keepdim=True))


def project_by_hand(probs: list[float], reward: float, discount: float, support: list[float]) -> list[float]:
    """C51's projection written out atom by atom (Bellemare et al., 2017, Algorithm 1), for one row."""
    n, v_min, v_max = len(support), support[0], support[-1]
    delta = (v_max - v_min) / (n - 1)
    out = [0.0] * n
    for p, z in zip(probs, support, strict=True):
        moved = min(max(reward + discount * z, v_min), v_max)
        b = (moved - v_min) / delta
        lower, upper = int(b // 1), min(int(b // 1) + 1, n - 1)
        frac = b - lower
        out[lower] += p * (1 - frac)
        out[upper] += p * frac
    return out


def test_c51_projection_matches_a_hand_worked_example() -> None:
    support = torch.tensor([-1.0, 0.0, 1.0])  # atoms 1 apart
    probs = torch.tensor([[0.2, 0.3, 0.5]])
    # r = 0.5, discount 0.5: atoms move to 0, 0.5, 1 -> 0.2 all on 0; 0.3 split 0.15/0.15 between 0 and 1; 0.5 on 1
    got = project_distribution(probs, torch.tensor([0.5]), torch.tensor([0.5]), support)
    torch.testing.assert_close(got, torch.tensor([[0.0, 0.35, 0.65]]))
    # an episode end (discount 0) puts everything at r: 0.25 lies a quarter of the way from 0 to 1
    end = project_distribution(probs, torch.tensor([0.25]), torch.tensor([0.0]), support)
    torch.testing.assert_close(end, torch.tensor([[0.0, 0.75, 0.25]]))
    # returns beyond the support are clipped to its ends
    high = project_distribution(probs, torch.tensor([5.0]), torch.tensor([0.9]), support)
    torch.testing.assert_close(high, torch.tensor([[0.0, 0.0, 1.0]]))


def test_c51_projection_matches_the_papers_algorithm_on_random_rows() -> None:
    gen = torch.Generator().manual_seed(3)
    support = torch.linspace(-10.0, 10.0, 51)
    probs = torch.softmax(torch.randn(64, 51, generator=gen) * 2, dim=1)
    reward = torch.randn(64, generator=gen) * 4
    discount = torch.where(torch.rand(64, generator=gen) < 0.2, 0.0, 0.9 ** torch.randint(1, 11, (64,), generator=gen))
    got = project_distribution(probs, reward, discount, support)
    want = torch.tensor([project_by_hand(probs[i].tolist(), float(reward[i]), float(discount[i]), support.tolist())
                         for i in range(64)])
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    torch.testing.assert_close(got.sum(dim=1), torch.ones(64))
    # inside the support the projection keeps the mean: E = r + discount * E[Z]
    inside = (reward.abs() + discount * 10 <= 10)
    torch.testing.assert_close((got * support).sum(1)[inside], (reward + discount * (probs * support).sum(1))[inside],
                               atol=1e-4, rtol=0)


def test_c51_loss_is_the_cross_entropy_to_the_double_dqn_target() -> None:
    support = torch.tensor([-1.0, 0.0, 1.0])
    logits = torch.tensor([[[0.0, 0.0, 0.0], [1.0, 2.0, 3.0]]], requires_grad=True)  # (B=1, A=2, N=3), action 1
    next_target = torch.log(torch.tensor([[[0.2, 0.3, 0.5], [1.0, 1e-9, 1e-9]]]))  # target means 0.3 and -1
    next_online = torch.tensor([[[0.0, 0.0, 9.0], [0.0, 0.0, 0.0]]])  # the online net prefers action 0
    kwargs = dict(action=torch.tensor([1]), reward=torch.tensor([0.5]), discount=torch.tensor([0.5]),
                  logits_next_target=next_target, support=support)
    terms = categorical_td_loss(logits, logits_next_online=next_online, **kwargs)  # type: ignore[arg-type]
    target = torch.tensor([0.0, 0.35, 0.65])  # the hand-worked projection above, of the target net's action 0
    log_p = F.log_softmax(torch.tensor([1.0, 2.0, 3.0]), dim=0)
    torch.testing.assert_close(terms.per_sample, -(target * log_p).sum().view(1))
    q_taken = (log_p.exp() * support).sum()
    torch.testing.assert_close(terms.q_taken, q_taken.view(1))
    torch.testing.assert_close(terms.td_abs, (0.65 - q_taken).abs().view(1))
    terms.per_sample.sum().backward()
    assert logits.grad is not None and logits.grad[0, 0].abs().sum() == 0  # only the taken action learns
    # without the online net a* comes from the target means: action 0 (0.3 > -1) again; flip them to see it move
    flipped = categorical_td_loss(logits.detach(), logits_next_online=None, **{  # type: ignore[arg-type]
        **kwargs, "logits_next_target": next_target.flip(1)})
    torch.testing.assert_close(flipped.per_sample, terms.per_sample)


def test_c51_network_forward_is_the_distribution_mean() -> None:
    net = build_q_network((5,), 4, hidden=16, head="c51", v_min=-2.0, v_max=6.0)
    assert net.name == "mlp-5-4-dueling-h16-c51"
    torch.testing.assert_close(net.support, torch.linspace(-2.0, 6.0, 51))
    assert "support" in net.state_dict()
    x = torch.randn(6, 5)
    with torch.no_grad():
        logits = net.outputs(x)
        assert logits.shape == (6, 4, 51)
        torch.testing.assert_close(net(x), (torch.softmax(logits, 2) * net.support).sum(2))
        assert ((net(x) > -2.0) & (net(x) < 6.0)).all()
