"""Ape-X exploration over env slots: the epsilon of every slot, and the set_exploration command's arguments."""

from __future__ import annotations

import numpy as np


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


class ControlArgError(ValueError):
    """A control command's arguments are out of range or of the wrong type; it is refused and counted."""

    fault = "control_args"


def _unit(args: dict, name: str, low_open: bool = False) -> float:
    value = args[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ControlArgError(f"set_exploration: {name} must be a number, got {value!r}")
    if not (0 < value <= 1 if low_open else 0 <= value <= 1):
        raise ControlArgError(f"set_exploration: {name} {value!r} is out of range")
    return float(value)


def apply_exploration_command(state: dict, args: dict) -> None:
    """Apply set_exploration args (epsilon | base, alpha) to ``state``; raise ControlArgError and change nothing."""
    epsilon = _unit(args, "epsilon") if "epsilon" in args else None
    base = _unit(args, "base", low_open=True) if "base" in args else state["base"]
    alpha = state["alpha"]
    if "alpha" in args:
        value = args["alpha"]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 100:
            raise ControlArgError(f"set_exploration: alpha must be a number in [0, 100], got {value!r}")
        alpha = float(value)
    state.update(epsilon_override=epsilon, base=base, alpha=alpha)
