"""Validation of the control commands the learner obeys; pure functions, bad arguments raise ControlArgError."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


class ControlArgError(ValueError):
    """A control command carried an argument of the wrong type or range."""

    fault = "bad_args"


@dataclass
class PublishInterval:
    """New publishing cadence; None leaves that part as it is."""

    updates: int | None = None
    seconds: float | None = None


def _int_at_least_1(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ControlArgError(f"{name} needs an int >= 1, got {value!r}")
    return value


def _positive_seconds(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (0 < value <= 86_400) \
            or not math.isfinite(value):
        raise ControlArgError(f"{name} needs seconds in (0, 86400], got {value!r}")
    return float(value)


def parse_lr(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ControlArgError(f"lr needs a number in (0, 1], got {value!r}")
    return float(value)


def parse_set_lr(args: dict[str, Any]) -> float:
    """set_lr {"lr": x}."""
    extra = sorted(set(args) - {"lr"})
    if "lr" not in args or extra:
        raise ControlArgError(f"set_lr takes exactly {{'lr': number}}, got keys {sorted(args)}")
    return parse_lr(args["lr"])


def parse_publish_interval(args: dict[str, Any]) -> PublishInterval:
    """set_publish_interval {"updates": int >= 1} and/or {"seconds": float > 0}; all checked before any applies."""
    extra = sorted(set(args) - {"updates", "seconds"})
    if extra or not args:
        raise ControlArgError(f"set_publish_interval takes 'updates' and/or 'seconds', got keys {sorted(args)}")
    interval = PublishInterval()
    if "updates" in args:
        interval.updates = _int_at_least_1("set_publish_interval updates", args["updates"])
    if "seconds" in args:
        interval.seconds = _positive_seconds("set_publish_interval seconds", args["seconds"])
    return interval


def parse_set(args: dict[str, Any]) -> dict[str, Any]:
    """Generic set: the learner's keys (lr, publish_interval_updates, publish_interval_s), others ignored.

    Raises on the first bad value of one of ours, so nothing of a half-bad command is applied.
    """
    changes: dict[str, Any] = {}
    for key, value in args.items():
        if key == "lr":
            changes[key] = parse_lr(value)
        elif key == "publish_interval_updates":
            changes[key] = _int_at_least_1("set publish_interval_updates", value)
        elif key == "publish_interval_s":
            changes[key] = _positive_seconds("set publish_interval_s", value)
    return changes
