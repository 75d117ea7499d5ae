"""Shrink-and-perturb: on a schedule, the online network is pulled part of the way towards a fresh initialisation.

Ash and Adams (2020) shrink the weights and add noise to keep a network that trains on and on able to learn; BBF
(Schwarzer et al., 2023) and Nikishin et al. (2022) reset networks for the same reason (plasticity). Here, every
``interval`` updates from update ``start`` on, each online parameter becomes ``shrink * itself + (1 - shrink) *
the same parameter of a freshly initialised network`` (BBF's interpolation, with its noise drawn from the
network's own initialisation). The target network, the acting average and Adam's moments are left as they are:
targets keep coming from the network before the reset while the online one recovers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ResetSchedule:
    """When to shrink and perturb: every ``interval`` updates from update ``start`` on (interval 0: never), none
    after update ``end`` (0: no end), so the stretch before a checkpoint that is reported can be left free of them."""

    interval: int = 0
    start: int = 0
    shrink: float = 0.8
    end: int = 0

    def __post_init__(self) -> None:
        """Reject bad values with a clear message."""
        if self.interval < 0 or self.start < 0 or self.end < 0:
            raise ValueError(f"reset interval, start and end must be >= 0, got {self.interval}, {self.start} and "
                             f"{self.end}")
        if not 0.0 <= self.shrink <= 1.0:
            raise ValueError(f"reset shrink must be in [0, 1], got {self.shrink}")

    def due(self, updates: int) -> bool:
        """Whether the update count just reached makes a reset (``start``, ``start + interval``, ... up to ``end``)."""
        return (self.interval > 0 and updates >= self.start and (updates - self.start) % self.interval == 0
                and (self.end == 0 or updates <= self.end))


def shrink_and_perturb(online: torch.nn.Module, fresh: torch.nn.Module, shrink: float) -> None:
    """Move every parameter of ``online`` to ``shrink * itself + (1 - shrink) * fresh``'s (in place)."""
    params: list[torch.Tensor] = list(online.parameters())
    fresh_params: list[torch.Tensor] = list(fresh.parameters())
    if len(params) != len(fresh_params) or any(a.shape != b.shape for a, b in zip(params, fresh_params, strict=True)):
        raise ValueError("shrink-and-perturb needs a fresh network of the same architecture")
    with torch.no_grad():
        torch._foreach_lerp_(params, [f.to(device=p.device, dtype=p.dtype)
                                      for p, f in zip(params, fresh_params, strict=True)], 1.0 - shrink)
