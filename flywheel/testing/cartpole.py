"""A CartPole learner whose greedy policy is a known linear rule: it balances the pole, or drops it at once."""

from __future__ import annotations

from typing import Any

import torch

from flywheel.services.learner.core import CoreConfig, LearnerCore

BALANCE = (0.0, 0.0, 3.0, 1.0)  # push right when 3*angle + angular velocity > 0: 500 steps on CartPole-v1


def cartpole_core() -> LearnerCore:
    """A small plain (not dueling) CartPole learner, as services/learner/main.py builds one."""
    core = LearnerCore((4,), 2, CoreConfig(hidden=8, dueling=False))
    core.env_id = "CartPole-v1"  # type: ignore[attr-defined]  # what services/learner/main.py sets
    return core


def set_policy(core: LearnerCore, *, right_when_leaning_right: bool) -> None:
    """Online weights that act as the linear rule BALANCE (or its reverse, which drops the pole at once)."""
    net: Any = core.online  # the plain MLP QNetwork: torso, fc and advantage layers
    with torch.no_grad():
        for p in net.parameters():
            p.zero_()
        net.torso[1].weight[0] = torch.tensor(BALANCE)  # h0 = relu(s), h1 = relu(-s)
        net.torso[1].weight[1] = -torch.tensor(BALANCE)
        net.fc[0].weight[0, 0] = net.fc[0].weight[1, 1] = 1.0
        right, left = (0, 1) if right_when_leaning_right else (1, 0)
        net.advantage.weight[1, right] = 1.0  # Q(right) grows with h0 (or h1)
        net.advantage.weight[0, left] = 1.0
