"""Prometheus text exposition of the gateway's registry, from a snapshot that a worker thread can render."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from flywheel import metrics_spec

from .metric_keys import KEY_RE, RESERVED_LABELS, Resolved
from .metrics import Registry


def format_value(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value.is_integer() and abs(value) < 2**53:
        return str(int(value))
    return repr(value)


def escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render_labels(items: Iterable[tuple[str, str]]) -> str:
    return ",".join(f'{k}="{escape_label(str(v))}"' for k, v in items)


class MetricsWriter:
    """Collects samples by family and writes Prometheus text exposition format 0.0.4."""

    def __init__(self) -> None:
        self.families: dict[str, tuple[str, str, list[str]]] = {}
        self.conflicts = 0

    def add(self, name: str, kind: str, help_text: str, labels: dict[str, str] | tuple[tuple[str, str], ...],
            value: float) -> None:
        items = labels.items() if isinstance(labels, dict) else labels
        self.add_rendered(name, kind, help_text, render_labels(items), value)

    def add_rendered(self, name: str, kind: str, help_text: str, labels: str, value: float) -> None:
        """``add`` with the labels already written (``render_labels``): what an instance's many samples share."""
        family = self.families.get(name)
        if family is None:
            family = self.families[name] = (kind, help_text, [])
        elif family[0] != kind:
            self.conflicts += 1  # the same name reported as counter by one instance and gauge by another
            return
        family[2].append(f"{name}{{{labels}}} {format_value(float(value))}" if labels
                         else f"{name} {format_value(float(value))}")

    @property
    def samples(self) -> int:
        return sum(len(family[2]) for family in self.families.values())

    def text(self) -> str:
        lines: list[str] = []
        for name, (kind, help_text, samples) in self.families.items():
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} {kind}")
            lines.extend(samples)
        return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class InstanceView:
    """What /metrics shows of one instance, taken on the event loop: the registry replaces an instance's dicts on
    each report and never changes them in place, so a thread may read these while the loop goes on."""

    service: str
    instance: str
    up: bool
    age: float
    counters: dict[str, float]
    gauges: dict[str, float]
    info: dict[str, str]


@dataclass(frozen=True)
class Snapshot:
    """Every instance's view, and how to name a telemetry key (``Registry.lookup``: reads, never writes)."""

    instances: list[InstanceView]
    lookup: Callable[[str, str, str], Resolved]


def snapshot(registry: Registry, now: float) -> Snapshot:
    """Every instance's view, by service and instance name (on the event loop: O(instances), no copies)."""
    return Snapshot([InstanceView(s.service, s.instance, registry.live(s, now), s.age(now), s.counters, s.gauges,
                                  s.info) for _, s in sorted(registry.instances.items())], registry.lookup)


def render_instances(snapshot: Snapshot, writer: MetricsWriter) -> int:
    """Every instance's counters and gauges as ``flywheel_<service>_<key>``, labelled service and instance; the HELP
    line of a declared key is its help text in flywheel.metrics_spec. Returns how many keys were left out.

    Keys that are not valid metric names, or that Prometheus's lint would refuse (a gauge ending in _total, a
    _count suffix, ...), are skipped (``Registry.invalid_keys`` says why), so /metrics stays clean under
    ``promtool check metrics``.
    """
    bad = 0
    for s in snapshot.instances:
        service = s.service
        base = render_labels((("service", service), ("instance", s.instance)))
        writer.add_rendered("flywheel_up", "gauge", "1 when the instance reported within the staleness window",
                            base, 1.0 if s.up else 0.0)
        writer.add_rendered("flywheel_telemetry_age_seconds", "gauge", "seconds since the instance's last telemetry",
                            base, s.age)
        for values, kind in ((s.counters, "counter"), (s.gauges, "gauge")):
            for key, value in sorted(values.items()):
                resolved = snapshot.lookup(service, kind, key)
                if resolved is None:
                    bad += 1
                    continue
                name, suffix, extra = resolved
                declared = metrics_spec.help_text(service, kind, suffix)
                writer.add_rendered(name, kind, declared or f"{suffix} reported by {service} instances",
                                    f"{base},{render_labels(extra)}" if extra else base, value)
        if s.info:
            labels = [("service", service), ("instance", s.instance)]
            for k, v in sorted(s.info.items()):
                if KEY_RE.match(k) and "{" not in k and k not in RESERVED_LABELS and not k.startswith("__"):
                    labels.append((k, v))
            writer.add(f"flywheel_{service}_info", "gauge", f"static facts about {service} instances",
                       tuple(labels), 1.0)
    return bad
