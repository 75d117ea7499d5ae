"""DeathPoints: which finished episodes are death points, how many are kept, and when they are due to be sent."""

from __future__ import annotations

import pytest

from flywheel.envs.vector import PROGRESS_METRIC, SUCCESS_METRIC, EpisodeEnd
from flywheel.services.actor.deaths import DeathPoints


def ended(progress: float | None, success: float | None = 0.0, restarted: bool = False) -> EpisodeEnd:
    metrics = {} if progress is None else {PROGRESS_METRIC: progress}
    if success is not None:
        metrics[SUCCESS_METRIC] = success
    return EpisodeEnd(slot=0, ret=1.0, length=10, metrics=metrics, restarted=restarted)


def test_only_level_start_deaths_of_low_exploration_slots_count() -> None:
    deaths = DeathPoints(epsilon_max=0.1, every=100)
    deaths.record(ended(700.0), epsilon=0.05)  # counts
    deaths.record(ended(800.0), epsilon=0.1)  # counts: at the limit
    deaths.record(ended(900.0), epsilon=0.4)  # explores too much
    deaths.record(ended(1000.0, restarted=True), epsilon=0.0)  # began at a kept state
    deaths.record(ended(3160.0, success=1.0), epsilon=0.0)  # reached the flag
    deaths.record(ended(None), epsilon=0.0)  # no progress measure
    deaths.record(ended(1200.0, success=None), epsilon=0.0)  # no success measure: ended short of nothing known
    assert list(deaths.points) == [700.0, 800.0, 1200.0] and deaths.counted == 3


def test_points_are_due_every_few_and_the_last_capacity_are_kept() -> None:
    deaths = DeathPoints(epsilon_max=1.0, capacity=5, every=3)
    due = [deaths.record(ended(float(x)), epsilon=0.0) for x in range(9)]
    assert due == [False, False, True] * 3
    assert list(deaths.points) == [4.0, 5.0, 6.0, 7.0, 8.0] and deaths.counted == 9


@pytest.mark.parametrize(("capacity", "every"), [(0, 1), (1, 0)])
def test_bad_sizes_are_refused(capacity: int, every: int) -> None:
    with pytest.raises(ValueError, match="must be >= 1"):
        DeathPoints(0.1, capacity=capacity, every=every)
