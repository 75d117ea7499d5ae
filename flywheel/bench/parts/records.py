"""Evaluation records old and new: a Mario episode's furthest x and flag, whichever keys its record was written with.

flywheel.evaluation writes the env's measures under generic keys (``progress``, ``success``, ``progress_stall_rule``,
``success_stall_rule``); raw results committed before that carry Mario's own (``x_pos_max``, ``flag``,
``x_pos_max_stall_rule``, ``flag_stall_rule``). The bench reads both through these functions, so the committed
results still assemble.
"""

from __future__ import annotations

from typing import Any

_OLD = {"progress": "x_pos_max", "success": "flag", "progress_stall_rule": "x_pos_max_stall_rule",
        "success_stall_rule": "flag_stall_rule"}


def _has(record: dict[str, Any], key: str) -> bool:
    return key in record or _OLD[key] in record


def _get(record: dict[str, Any], key: str) -> Any:
    return record[key] if key in record else record.get(_OLD[key])


def furthest_x(record: dict[str, Any]) -> float:
    """The episode's furthest x (0 when the record has none)."""
    return float(_get(record, "progress") or 0)


def flag(record: dict[str, Any]) -> bool:
    """Whether the episode reached the flag."""
    return bool(_get(record, "success"))


def stall_rule(record: dict[str, Any]) -> tuple[float, bool]:
    """What the 250-step stall rule keeps of the episode: (furthest x, flag); the plain figures when the record
    predates the rule."""
    x = float(_get(record, "progress_stall_rule") or 0) if _has(record, "progress_stall_rule") else furthest_x(record)
    got = bool(_get(record, "success_stall_rule")) if _has(record, "success_stall_rule") else flag(record)
    return x, got
