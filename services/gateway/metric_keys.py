"""Telemetry keys as Prometheus series: ``name`` or ``name{label=value,...}``, parsed, named and linted."""

from __future__ import annotations

import re

KEY_RE = re.compile(r"^([a-zA-Z_][a-zA-Z0-9_]*)(?:\{(.*)\})?$")
_LABEL_RE = re.compile(r"^([a-zA-Z_][a-zA-Z0-9_]*)=\"?([^\",{}=]*)\"?$")
RESERVED_LABELS = {"service", "instance", "le", "quantile"}
_TYPE_WORDS = ("counter", "gauge", "histogram", "summary", "untyped")

Resolved = tuple[str, str, tuple[tuple[str, str], ...]] | None


def parse_key(key: str) -> tuple[str, tuple[tuple[str, str], ...]] | None:
    """Split ``name`` or ``name{label=value,...}`` into a metric suffix and labels; None when invalid."""
    m = KEY_RE.match(key)
    if m is None:
        return None
    name, body = m.group(1), m.group(2)
    labels: list[tuple[str, str]] = []
    if body:
        for part in body.split(","):
            lm = _LABEL_RE.match(part.strip())
            if lm is None or lm.group(1) in RESERVED_LABELS or lm.group(1).startswith("__"):
                return None
            labels.append((lm.group(1), lm.group(2)))
    if len({k for k, _ in labels}) != len(labels):
        return None
    return name, tuple(sorted(labels))


def name_problem(name: str, kind: str) -> str | None:
    """Why ``name`` of type ``kind`` would fail Prometheus's metric lint (promtool check metrics), or None."""
    if name != name.lower():
        return "metric names are snake_case (no capitals)"
    if kind != "counter" and name.endswith("_total"):
        return "only counters end in _total"
    for suffix in ("_count", "_sum", "_bucket"):
        if name.endswith(suffix):
            return f"{suffix} is reserved for histograms and summaries"
    for word in _TYPE_WORDS:
        if f"_{word}_" in name or name.endswith(f"_{word}"):
            return f"a metric name should not include its type ({word})"
    return None


def resolve_key(service: str, kind: str, key: str) -> tuple[Resolved, str]:
    """(name, suffix, extra labels) of a telemetry key, or None and why it cannot be exported."""
    parsed = parse_key(key)
    if parsed is None:
        return None, "not a metric name (optionally with {label=value,...}), or it uses a reserved label"
    suffix, extra = parsed
    name = f"flywheel_{service}_{suffix}"
    if kind == "counter" and not name.endswith("_total"):
        name += "_total"
    problem = name_problem(name, kind)
    if problem:
        return None, f"{kind} {name}: {problem}"
    return (name, suffix, extra), ""
