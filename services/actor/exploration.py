"""Ape-X exploration over env slots: the epsilon of every slot, and the actor's exploration setting."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from flywheel import proto


def apex_epsilon(index: int, count: int, base: float = 0.4, alpha: float = 7.0) -> float:
    """Ape-X exploration: slot i of N uses base ** (1 + alpha * i / (N - 1))."""
    if count <= 1:
        return base
    return float(base ** (1.0 + alpha * index / (count - 1)))


def apex_epsilons(actor_index: int, actor_count: int, num_envs: int, base: float = 0.4,
                  alpha: float = 7.0) -> np.ndarray:
    """The Ape-X schedule spread over all actor_count x num_envs env slots; this actor's num_envs rates.

    Actor i's env e is slot i * num_envs + e of actor_count * num_envs, so the slots of all actors together cover
    the whole schedule, from ``base`` down to ``base ** (1 + alpha)``. Every actor of a run has the same number of
    envs (one setting), so the lease's (i, N) is all an actor needs, and the rates stay exact as actors come and go.
    """
    total = actor_count * num_envs
    slots = actor_index * num_envs + np.arange(num_envs)
    if total <= 1:
        return np.full(num_envs, base, dtype=np.float64)
    return np.asarray(base ** (1.0 + alpha * slots / (total - 1)), dtype=np.float64)


@dataclass
class Exploration:
    """What an actor explores with: a fixed ``epsilon`` for all its slots, or (None) the Ape-X schedule's ``base``
    and ``alpha`` spread over the slots its lease gives it."""

    epsilon: float | None = None
    base: float = 0.4
    alpha: float = 7.0

    def apply(self, args: proto.ExplorationArgs) -> None:
        """set_exploration (checked when decoded): fix epsilon, or go back to the schedule with a new base/alpha."""
        if args.epsilon is not None:
            self.epsilon = args.epsilon
            return
        self.epsilon = None
        self.base = self.base if args.base is None else args.base
        self.alpha = self.alpha if args.alpha is None else args.alpha

    def rates(self, actor_index: int, actor_count: int, slots: int) -> np.ndarray:
        """The epsilon of each of this actor's ``slots`` env slots as actor ``actor_index`` of ``actor_count``."""
        if self.epsilon is not None:
            return np.full(slots, float(self.epsilon))
        return apex_epsilons(actor_index, actor_count, slots, self.base, self.alpha)
