"""What Flywheel reads off a Gymnasium space: an observation shape and a discrete action count, checked."""

from __future__ import annotations

from typing import Any

import gymnasium


def action_count(space: gymnasium.Space[Any]) -> int:
    """The number of actions of a Discrete action space; any other space is a ValueError."""
    if not isinstance(space, gymnasium.spaces.Discrete):
        raise ValueError(f"action space {space} is not Discrete; Flywheel's DQN needs Discrete actions")
    return int(space.n)


def observation_shape(space: gymnasium.Space[Any]) -> tuple[int, ...]:
    """The shape of an observation space that has one; a space without (Dict, Text, ...) is a ValueError."""
    if space.shape is None:
        raise ValueError(f"observation space {space} has no fixed shape")
    return tuple(int(d) for d in space.shape)
