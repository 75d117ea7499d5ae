"""An env's own measures of how an episode went: a progress value and a success flag, declared by the env.

An env declares them in its metadata, ``metadata["measures"] = {"progress": "furthest x", "success": "flag"}``
(either key optional; the values are the labels people see), and puts them in every step's info:
``info["progress"]`` (a number: where the episode is now; the episode's measure is its maximum over the episode),
``info["success"]`` (a bool: the goal reached) and, at an episode's last step, optionally ``info["end"]`` (a short
word why it ended). The actors' episode gauges, the evaluation records, the live page and the clips read these keys
and show the labels: a new game needs nothing outside its env module.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any

PROGRESS, SUCCESS, END = "progress", "success", "end"  # the info keys
_LABEL_MAX = 40  # characters of a label kept (it travels in telemetry info and shows on the live page)


@dataclass(frozen=True)
class Measures:
    """The labels of an env's progress and success measures; None: the env has no such measure."""

    progress: str | None = None
    success: str | None = None

    @classmethod
    def from_metadata(cls, metadata: Any) -> Measures:
        """Read ``metadata["measures"]``; Measures() when absent, and a label that is not a non-empty string is
        left out."""
        declared = metadata.get("measures") if isinstance(metadata, dict) else None
        if not isinstance(declared, dict):
            return cls()

        def label(key: str) -> str | None:
            value = declared.get(key)
            return value.strip()[:_LABEL_MAX] if isinstance(value, str) and value.strip() else None

        return cls(label(PROGRESS), label(SUCCESS))

    def labels(self) -> dict[str, str]:
        """``{"progress": label, "success": label}`` with the measures the env has."""
        return {key: value for key, value in ((PROGRESS, self.progress), (SUCCESS, self.success)) if value is not None}


def measures_of(env: Any) -> Measures:
    """The measures ``env`` declares (``env.unwrapped.metadata["measures"]``); Measures() when it declares none."""
    return Measures.from_metadata(getattr(getattr(env, "unwrapped", env), "metadata", None))


def progress_in(info: dict[str, Any]) -> float | None:
    """A step's ``info["progress"]`` as a float; None where it is absent or not a finite number."""
    value = info.get(PROGRESS)
    if isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def measures_so_far(info: dict[str, Any], progress: float | None,
                    success: bool | None) -> tuple[float | None, bool | None]:
    """An episode's ``progress`` and ``success`` so far, with one more step's (or its reset's) info taken in: the
    furthest progress, and success once reached; a progress that is not a finite number is ignored."""
    now = progress_in(info)
    if now is not None:
        progress = now if progress is None else max(progress, now)
    if SUCCESS in info:
        success = bool(success) or bool(info[SUCCESS])
    return progress, success
