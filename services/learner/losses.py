"""DQN loss terms as pure tensor functions: n-step double-DQN TD Huber, Munchausen-DQN, QR-DQN quantile Huber, C51
cross-entropy, DQfD large margin.

Each term returns per-sample losses (the core applies importance weights and averages), so terms add up per row:
the DQfD large-margin loss and behaviour cloning's cross-entropy apply to demonstration rows beside the TD loss.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.nn import functional as F


@dataclass
class LossTerms:
    """Per-sample loss (B,), |TD error| for priorities (B,) and the online Q of the taken action (B,)."""

    per_sample: torch.Tensor
    td_abs: torch.Tensor
    q_taken: torch.Tensor


def greedy_next(q_next_online: torch.Tensor | None, q_next_target: torch.Tensor) -> torch.Tensor:
    """(B, 1) next actions: argmax of the online net (double DQN) or, without it, of the target net."""
    chooser = q_next_online if q_next_online is not None else q_next_target
    return chooser.argmax(dim=1, keepdim=True)


def at_best(next_target: torch.Tensor, best: torch.Tensor) -> torch.Tensor:
    """The target net's outputs on s' (B, A) or (B, A, N) at the next actions ``best`` (B, 1): (B,) or (B, N)."""
    index = best.view(-1, 1, *([1] * (next_target.dim() - 2))).expand(-1, 1, *next_target.shape[2:])
    return next_target.gather(1, index).squeeze(1)


def q_td_loss(q_all: torch.Tensor, action: torch.Tensor, reward: torch.Tensor, discount: torch.Tensor,
              q_next_target: torch.Tensor, q_next_online: torch.Tensor | None, kappa: float = 1.0) -> LossTerms:
    """Huber loss between Q(s, a) and r + discount * Q_target(s', a*); a* from the online net when given.

    ``discount`` already holds gamma^n (0 at episode ends), so n-step returns need nothing more here.
    """
    q_all, q_next_target = q_all.float(), q_next_target.float()
    q_taken = q_all.gather(1, action.unsqueeze(1)).squeeze(1)
    best = greedy_next(None if q_next_online is None else q_next_online.float(), q_next_target)
    target = (reward + discount * at_best(q_next_target, best)).detach()
    td = target - q_taken
    per_sample = F.huber_loss(q_taken, target, reduction="none", delta=kappa)
    return LossTerms(per_sample=per_sample, td_abs=td.detach().abs(), q_taken=q_taken.detach())


def munchausen_td_loss(q_all: torch.Tensor, action: torch.Tensor, reward: torch.Tensor, discount: torch.Tensor,
                       q_next_target: torch.Tensor, q_now_target: torch.Tensor, *, alpha: float, entropy_tau: float,
                       clip_low: float, kappa: float = 1.0) -> LossTerms:
    """Munchausen-DQN (Vieillard et al., 2020): Huber loss between Q(s, a) and the target
    r + alpha * clip(tau * log pi(a|s), clip_low, 0) + discount * sum_a' pi(a'|s') (Q_t(s', a') - tau * log pi(a'|s'))
    with pi = softmax(Q_t / tau) of the target network Q_t. The paper's target is one-step; with n-step returns only
    the first action's bonus is added (an approximation: the actor sums the rewards and keeps no log-policies).
    """
    q_all, q_next_target, q_now_target = q_all.float(), q_next_target.float(), q_now_target.float()
    q_taken = q_all.gather(1, action.unsqueeze(1)).squeeze(1)
    with torch.no_grad():
        log_pi_now = F.log_softmax(q_now_target / entropy_tau, dim=1).gather(1, action.unsqueeze(1)).squeeze(1)
        bonus = alpha * (entropy_tau * log_pi_now).clamp(min=clip_low, max=0.0)
        log_pi_next = F.log_softmax(q_next_target / entropy_tau, dim=1)
        soft_next = (log_pi_next.exp() * (q_next_target - entropy_tau * log_pi_next)).sum(dim=1)
        target = reward + bonus + discount * soft_next
    per_sample = F.huber_loss(q_taken, target, reduction="none", delta=kappa)
    return LossTerms(per_sample=per_sample, td_abs=(target - q_taken).detach().abs(), q_taken=q_taken.detach())


def quantile_midpoints(n: int, device: torch.device | str | None = None) -> torch.Tensor:
    """tau_i = (2i + 1) / 2N, the quantile fractions QR-DQN regresses (N,)."""
    return (torch.arange(n, device=device, dtype=torch.float32) * 2 + 1) / (2 * n)


def quantile_huber(pred: torch.Tensor, target: torch.Tensor, kappa: float = 1.0) -> torch.Tensor:
    """Per-sample quantile Huber loss: sum_i mean_j |tau_i - 1{u_ij < 0}| * Huber_kappa(u_ij) / kappa.

    pred: (B, N) quantiles of the taken action; target: (B, M) target quantiles; u_ij = target_j - pred_i.
    """
    taus = quantile_midpoints(pred.shape[1], pred.device)
    u = target.unsqueeze(1) - pred.unsqueeze(2)  # (B, N, M)
    abs_u = u.abs()
    huber = torch.where(abs_u <= kappa, 0.5 * u * u, kappa * (abs_u - 0.5 * kappa))
    weight = (taus.view(1, -1, 1) - (u.detach() < 0).float()).abs()
    return (weight * huber / kappa).mean(dim=2).sum(dim=1)


def quantile_td_loss(z_all: torch.Tensor, action: torch.Tensor, reward: torch.Tensor, discount: torch.Tensor,
                     z_next_target: torch.Tensor, z_next_online: torch.Tensor | None,
                     kappa: float = 1.0) -> LossTerms:
    """QR-DQN: quantiles (B, A, N) of s; target quantiles r + discount * Z_target(s', a*), a* chosen on means.

    The priority is |mean target - mean prediction|, the TD error of the Q-values the quantiles imply.
    """
    z_all, z_next_target = z_all.float(), z_next_target.float()
    n = z_all.shape[2]
    z_taken = z_all.gather(1, action.view(-1, 1, 1).expand(-1, 1, n)).squeeze(1)  # (B, N)
    best = greedy_next(None if z_next_online is None else z_next_online.float().mean(dim=2),
                       z_next_target.mean(dim=2))
    z_next = z_next_target.gather(1, best.unsqueeze(2).expand(-1, 1, z_next_target.shape[2])).squeeze(1)
    target = (reward.unsqueeze(1) + discount.unsqueeze(1) * z_next).detach()
    per_sample = quantile_huber(z_taken, target, kappa)
    q_taken = z_taken.detach().mean(dim=1)
    return LossTerms(per_sample=per_sample, td_abs=(target.mean(dim=1) - q_taken).abs(), q_taken=q_taken)


def project_distribution(probs: torch.Tensor, reward: torch.Tensor, discount: torch.Tensor,
                         support: torch.Tensor) -> torch.Tensor:
    """C51's projection: the distribution ``probs`` (B, N) over ``support`` (N,) moved to r + discount * z, clipped
    to the support's ends and split between the two nearest atoms in proportion to closeness; (B, N), rows sum to 1.
    """
    n = support.shape[0]
    v_min, v_max = support[0], support[-1]
    delta = (v_max - v_min) / (n - 1)
    moved = (reward.unsqueeze(1) + discount.unsqueeze(1) * support.unsqueeze(0)).clamp(v_min, v_max)
    b = ((moved - v_min) / delta).clamp(0, n - 1)  # fractional atom index (B, N)
    lower = b.floor().long()
    upper = (lower + 1).clamp(max=n - 1)
    upper_share = b - lower.float()  # 0 when b lands on an atom: all its mass stays there
    out = torch.zeros_like(probs)
    out.scatter_add_(1, lower, probs * (1.0 - upper_share))
    out.scatter_add_(1, upper, probs * upper_share)
    return out


def categorical_td_loss(logits_all: torch.Tensor, action: torch.Tensor, reward: torch.Tensor, discount: torch.Tensor,
                        logits_next_target: torch.Tensor, logits_next_online: torch.Tensor | None,
                        support: torch.Tensor) -> LossTerms:
    """C51 (Bellemare et al., 2017): cross-entropy between the projected target distribution of
    r + discount * Z_target(s', a*) and the predicted distribution of Z(s, a); a* by the distributions' means
    (of the online net: double DQN, as in Rainbow). The priority is |mean target - mean prediction|, the TD error
    of the Q-values, as for the other heads (Rainbow uses the cross-entropy itself).
    """
    logits_all, logits_next_target, support = logits_all.float(), logits_next_target.float(), support.float()
    n = logits_all.shape[2]
    log_p = torch.log_softmax(logits_all.gather(1, action.view(-1, 1, 1).expand(-1, 1, n)).squeeze(1), dim=1)
    with torch.no_grad():
        p_next_target = torch.softmax(logits_next_target, dim=2)
        q_next_target = (p_next_target * support).sum(dim=2)
        q_next_online = None if logits_next_online is None else (
            torch.softmax(logits_next_online.float(), dim=2) * support).sum(dim=2)
        best = greedy_next(q_next_online, q_next_target)
        p_next = at_best(p_next_target, best)
        target = project_distribution(p_next, reward, discount, support)
        q_taken = (log_p.exp() * support).sum(dim=1)
        td_abs = ((target * support).sum(dim=1) - q_taken).abs()
    per_sample = -(target * log_p).sum(dim=1)
    return LossTerms(per_sample=per_sample, td_abs=td_abs, q_taken=q_taken)


def action_values(out: torch.Tensor) -> torch.Tensor:
    """Q-values (B, A) from a network's outputs: Q itself, or the quantiles' means (B, A, N) -> (B, A)."""
    return out.float().mean(dim=2) if out.dim() == 3 else out.float()


def large_margin_loss(q_all: torch.Tensor, expert_action: torch.Tensor, margin: float = 0.8) -> torch.Tensor:
    """DQfD's supervised loss per sample: J_E = max_a [Q(s, a) + l(a_E, a)] - Q(s, a_E), l = margin for a != a_E.

    It is 0 once the expert's action leads every other by at least ``margin`` and never negative; the gradient
    raises Q(s, a_E) and lowers the best rival. ``q_all`` (B, A) or quantiles (B, A, N); returns (B,).
    """
    q = action_values(q_all)
    penalty = torch.full_like(q, float(margin))
    penalty.scatter_(1, expert_action.view(-1, 1), 0.0)
    best = (q + penalty).max(dim=1).values
    return best - q.gather(1, expert_action.view(-1, 1)).squeeze(1)


def cross_entropy_loss(q_all: torch.Tensor, expert_action: torch.Tensor) -> torch.Tensor:
    """Behaviour cloning per sample: cross-entropy of softmax(Q(s, .)) against the expert's action, (B,)."""
    return F.cross_entropy(action_values(q_all), expert_action, reduction="none")
