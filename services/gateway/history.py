"""The learning curve the live page draws: a bounded series that thins itself so a whole run stays visible."""

from __future__ import annotations

import math
from typing import Any

from .metrics import Registry

CURVE_FIELDS = ("env_steps", "episodes", "return_mean", "eval_return_mean", "progress_mean", "progress_max",
                "success_rate", "restarted_progress_mean", "updates", "weight_version")


def _finite(values: list[float]) -> list[float]:
    return [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]


def curve_point(registry: Registry, now: float, wall: float) -> dict[str, Any] | None:
    """One point from what the live instances last reported; None when no actor or learner is live."""
    actors = [s for s in registry.instances.values() if s.service == "actor"]
    learners = [s for s in registry.instances.values() if s.service == "learner"]
    live_actors = [s for s in actors if registry.live(s, now)]
    if not live_actors and not any(registry.live(s, now) for s in learners):
        return None

    def mean_of(key: str) -> float | None:
        values = _finite([s.gauges[key] for s in live_actors if key in s.gauges])
        return sum(values) / len(values) if values else None

    def max_of(key: str) -> float | None:
        return max(_finite([s.gauges[key] for s in live_actors if key in s.gauges]), default=None)

    return {
        "t": round(wall, 3),
        "env_steps": sum(s.counters.get("env_steps_total", 0.0) for s in actors),
        "episodes": sum(s.counters.get("episodes_total", 0.0) for s in actors),
        "return_mean": mean_of("episode_return_mean"),
        "eval_return_mean": mean_of("eval_return_mean"),
        # the env's own measures (flywheel.envs.measures), null for envs without: the mean of the actors' rolling
        # means over level-start episodes, the furthest any live actor got in its last 100, the mean success rate,
        # and apart from them the mean progress of episodes restarted at a kept start state (the curriculum)
        "progress_mean": mean_of("episode_progress_mean"),
        "progress_max": max_of("episode_progress_max"),
        "success_rate": mean_of("episode_success_rate"),
        "restarted_progress_mean": mean_of("restarted_progress_mean"),
        "updates": sum(s.counters.get("updates_total", 0.0) for s in learners),
        "weight_version": max(_finite([s.gauges.get("weight_version", math.nan) for s in learners]), default=None),
    }


class LearningCurve:
    """Points at least ``interval_s`` apart, at most ``max_points`` of them.

    When full, every other point is dropped and the spacing doubles: memory stays bounded and the curve still
    covers the run from its start, at a coarser resolution the longer it runs.
    """

    def __init__(self, interval_s: float = 2.0, max_points: int = 1800) -> None:
        if max_points < 4:
            raise ValueError("max_points must be at least 4")
        self.interval_s, self.max_points = interval_s, max_points
        self.points: list[dict[str, Any]] = []
        self.thinned = 0

    def due(self, wall: float) -> bool:
        return not self.points or wall - self.points[-1]["t"] >= self.interval_s

    def add(self, point: dict[str, Any]) -> None:
        if self.points and point["t"] <= self.points[-1]["t"]:
            return  # the wall clock went backwards: keep the series ordered
        self.points.append(point)
        if len(self.points) > self.max_points:
            kept = self.points[::2]
            if kept[-1] is not self.points[-1]:
                kept.append(self.points[-1])
            self.points = kept
            self.interval_s *= 2
            self.thinned += 1

    def since(self, t: float | None = None) -> list[dict[str, Any]]:
        """Points after wall time ``t`` (all of them when None)."""
        if t is None:
            return list(self.points)
        return [p for p in self.points if p["t"] > t]
