"""Where the actor's evaluation-like episodes die: the death points of the start-state curriculum's "deaths" choice.

An episode counts when it began at the level start (not at a kept state), its env slot explores at no more than
``epsilon_max`` (the evaluation's condition, give or take: the Ape-X ladder's low slots), and it ended short of the
env's goal (its success measure 0: a death or a time-out). Its furthest progress is a death point. The last
``capacity`` of them are sent to the training vector's envs (``VectorEnv.set_start_targets``) every ``every`` new
ones; each env then draws one per episode, uniformly, so restarts come before the places where such episodes die,
as often as they die there (flywheel.envs.start_states).
"""

from __future__ import annotations

from collections import deque

from flywheel.envs import EpisodeEnd
from flywheel.envs.vector import PROGRESS_METRIC, SUCCESS_METRIC


class DeathPoints:
    """The last ``capacity`` death points of evaluation-like episodes, and when to send them."""

    def __init__(self, epsilon_max: float, capacity: int = 100, every: int = 8) -> None:
        """Count episodes of slots exploring at no more than ``epsilon_max``; send every ``every`` new points."""
        if capacity < 1 or every < 1:
            raise ValueError(f"capacity and every must be >= 1, got {capacity} and {every}")
        self.epsilon_max = epsilon_max
        self.every = every
        self.points: deque[float] = deque(maxlen=capacity)
        self.fresh = 0  # points since the last send
        self.counted = 0  # death points ever counted (telemetry)

    def record(self, episode: EpisodeEnd, epsilon: float) -> bool:
        """Count ``episode`` (played at ``epsilon``) if it is a death of an evaluation-like episode; whether the
        points are due to be sent."""
        metrics = episode.metrics
        if (episode.restarted or epsilon > self.epsilon_max or PROGRESS_METRIC not in metrics
                or metrics.get(SUCCESS_METRIC, 0.0) > 0):
            return False
        self.points.append(float(metrics[PROGRESS_METRIC]))
        self.counted += 1
        self.fresh += 1
        if self.fresh < self.every:
            return False
        self.fresh = 0
        return True
