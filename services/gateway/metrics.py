"""What the gateway knows about every instance, and its rendering as Prometheus text."""

from __future__ import annotations

import math
import re
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from flywheel import metrics_spec, proto

_NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
_KEY_RE = re.compile(r"^([a-zA-Z_][a-zA-Z0-9_]*)(?:\{(.*)\})?$")
_LABEL_RE = re.compile(r"^([a-zA-Z_][a-zA-Z0-9_]*)=\"?([^\",{}=]*)\"?$")
_RESERVED_LABELS = {"service", "instance", "le", "quantile"}
_TYPE_WORDS = ("counter", "gauge", "histogram", "summary", "untyped")
# The largest magnitude a reported value may have: beyond 2**53 a float no longer counts by one, no real counter or
# gauge gets there, and sums of many such values stay finite (JSON, int() and the live page's numbers need that).
MAX_ABS_VALUE = float(2**53)


class TelemetryRejected(proto.DecodeError):
    """A telemetry message decoded but cannot be accepted (bad service name, too many instances)."""

    fault = "malformed"


class CapacityExceeded(TelemetryRejected):
    fault = "capacity"


class BadValues(TelemetryRejected):
    """Values left out of a telemetry message that was otherwise kept (see ``value_ok``)."""

    fault = "bad_value"


def value_ok(value: float, kind: str) -> bool:
    """Whether a reported value is kept: a number within +-MAX_ABS_VALUE, or NaN for a gauge ("no value yet", as a
    learner's loss before its first update). Infinities, absurd magnitudes and NaN counters are left out."""
    if math.isnan(value):
        return kind == "gauge"
    return abs(value) <= MAX_ABS_VALUE


def bad_values_fault(msg: proto.Telemetry, bad: list[tuple[str, float]]) -> BadValues:
    """The fault to count for a message some of whose values were left out, naming the first few."""
    shown = ", ".join(f"{key[:64]!r}={value!r}" for key, value in bad[:5])
    return BadValues(f"telemetry from {msg.service[:40]} {msg.instance[:64]!r}: left out {len(bad)} value(s) that "
                     f"are infinite, NaN counters or beyond +-2**53 ({shown}); fix them in that service")


def parse_key(key: str) -> tuple[str, tuple[tuple[str, str], ...]] | None:
    """Split ``name`` or ``name{label=value,...}`` into a metric suffix and labels; None when invalid."""
    m = _KEY_RE.match(key)
    if m is None:
        return None
    name, body = m.group(1), m.group(2)
    labels: list[tuple[str, str]] = []
    if body:
        for part in body.split(","):
            lm = _LABEL_RE.match(part.strip())
            if lm is None or lm.group(1) in _RESERVED_LABELS or lm.group(1).startswith("__"):
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


@dataclass
class InstanceState:
    """The latest telemetry of one instance of one service, and a short window of its counters for rates."""

    service: str
    instance: str
    seq: int
    sent_time: float
    received: float
    first_seen: float
    counters: dict[str, float] = field(default_factory=dict)
    gauges: dict[str, float] = field(default_factory=dict)
    info: dict[str, str] = field(default_factory=dict)
    restarts: int = 0
    received_wall: float = 0.0
    down: bool = False
    window: deque[tuple[float, dict[str, float]]] = field(default_factory=deque)
    # what counters lost when they went backwards (a restart): totals add it back, so they never drop
    carried: dict[str, float] = field(default_factory=dict)

    def lifetime(self) -> dict[str, float]:
        """Counters as if the instance had never restarted: each never below its highest value seen."""
        if not self.carried:
            return dict(self.counters)
        out = dict(self.counters)
        for k, v in self.carried.items():
            out[k] = out.get(k, 0.0) + v
        return out

    def carry_drops(self, counters: dict[str, float]) -> None:
        """Before ``counters`` replace the current ones: keep what any counter that went backwards lost.

        A restarted service reports its counters from zero (or from a checkpoint); counting the drop keeps
        totals monotonic without counting twice what a resumed service restored.
        """
        for k, old in self.counters.items():
            new = counters.get(k, 0.0)
            if new < old:
                self.carried[k] = self.carried.get(k, 0.0) + (old - new)

    def age(self, now: float) -> float:
        return max(0.0, now - self.received)

    def rates(self) -> dict[str, float]:
        """Per-second rate of every counter over the window (from the oldest report in it to the latest)."""
        if len(self.window) < 2:
            return {}
        (t0, first), (t1, last) = self.window[0], self.window[-1]
        span = t1 - t0
        if span <= 0:
            return {}
        return {k: max(0.0, (v - first[k]) / span) for k, v in last.items() if k in first}


class Registry:
    """Latest telemetry per (service, instance); down after ``stale_after_s``, forgotten after ``forget_after_s``.

    ``events`` collects what is worth one log line each (joined, restarted, down, back, forgotten) until the
    service drains it.
    """

    def __init__(self, stale_after_s: float = 5.0, forget_after_s: float = 300.0,
                 max_instances: int = 10_000, clock: Callable[[], float] = time.monotonic,
                 rate_window_s: float = 10.0) -> None:
        self.stale_after_s, self.forget_after_s, self.max_instances = stale_after_s, forget_after_s, max_instances
        self.clock, self.rate_window_s = clock, rate_window_s
        self.instances: dict[tuple[str, str], InstanceState] = {}
        self.received = 0
        self.bad_keys = 0
        self.invalid_keys: dict[tuple[str, str], str] = {}  # (service, key) -> why it is not exported (bounded)
        self._names: dict[tuple[str, str, str], tuple[str, str, tuple[tuple[str, str], ...]] | None] = {}
        self.forgotten = 0
        self.went_down = 0
        self.events: deque[tuple[str, InstanceState, str]] = deque(maxlen=10_000)
        self.retired: dict[str, dict[str, float]] = {}  # per service: lifetime counters of forgotten instances
        self.last_bad_values: list[tuple[str, float]] = []  # (key, value) left out of the last message stored

    def update(self, msg: proto.Telemetry) -> InstanceState:
        """Store one telemetry message; raises TelemetryRejected when it cannot be kept.

        Values ``value_ok`` refuses are left out and listed in ``last_bad_values``; a counter left out keeps its
        last value, so totals neither drop nor count twice.
        """
        self.last_bad_values = []
        if not _NAME_RE.match(msg.service):
            raise TelemetryRejected(f"telemetry: service name {msg.service[:40]!r} must match {_NAME_RE.pattern}")
        if msg.service == "gateway":
            raise TelemetryRejected("telemetry: the service name 'gateway' is the gateway's own")
        if not msg.instance or len(msg.instance) > 128 or any(ord(c) < 32 or ord(c) == 127 for c in msg.instance):
            raise TelemetryRejected("telemetry: instance must be 1-128 printable characters")
        now = self.clock()
        key = (msg.service, msg.instance)
        state = self.instances.get(key)
        if state is None:
            if len(self.instances) >= self.max_instances:
                self.forget_old(now)
                if len(self.instances) >= self.max_instances:
                    raise CapacityExceeded(f"telemetry: already tracking {self.max_instances} instances")
            state = InstanceState(msg.service, msg.instance, msg.seq, msg.time, now, now)
            self.instances[key] = state
            self.events.append(("joined", state, f"version {msg.info.get('version', '?')}"))
        elif msg.seq <= state.seq:
            # Same name, lower sequence number: the instance restarted (its counters start again from zero,
            # which Prometheus reads as a counter reset).
            state.restarts += 1
            state.window.clear()
            self.events.append(("restarted", state, f"sequence {state.seq} -> {msg.seq}"))
        if state.down:
            state.down = False
            self.events.append(("back", state, f"after {now - state.received:.1f} s of silence"))
        state.seq, state.sent_time, state.received, state.received_wall = msg.seq, msg.time, now, time.time()
        counters = self._checked(msg.counters, "counter", state.counters)
        gauges = self._checked(msg.gauges, "gauge", {})
        state.carry_drops(counters)
        state.counters, state.gauges, state.info = counters, gauges, dict(msg.info)
        for values, kind in ((state.counters, "counter"), (state.gauges, "gauge")):
            for k in values:
                self.metric(msg.service, kind, k)  # refused keys are known (and logged) from the first report
        state.window.append((now, state.counters))
        while len(state.window) > 2 and now - state.window[1][0] >= self.rate_window_s:
            state.window.popleft()
        self.received += 1
        return state

    def _checked(self, values: dict[str, float], kind: str, previous: dict[str, float]) -> dict[str, float]:
        out: dict[str, float] = {}
        for key, value in values.items():
            if value_ok(value, kind):
                out[key] = value
            else:
                self.last_bad_values.append((key, value))
                if key in previous:
                    out[key] = previous[key]
        return out

    def metric(self, service: str, kind: str, key: str) -> tuple[str, str, tuple[tuple[str, str], ...]] | None:
        """(name, suffix, extra labels) of a telemetry key, or None when it cannot be exported.

        Refused keys are recorded in ``invalid_keys`` with the reason; answers are cached (bounded).
        """
        cache_key = (service, kind, key)
        if cache_key in self._names:
            return self._names[cache_key]
        resolved: tuple[str, str, tuple[tuple[str, str], ...]] | None = None
        parsed = parse_key(key)
        if parsed is None:
            why = "not a metric name (optionally with {label=value,...}), or it uses a reserved label"
        else:
            suffix, extra = parsed
            name = f"flywheel_{service}_{suffix}"
            if kind == "counter" and not name.endswith("_total"):
                name += "_total"
            problem = name_problem(name, kind)
            why = f"{kind} {name}: {problem}" if problem else ""
            if not problem:
                resolved = (name, suffix, extra)
        if resolved is None and len(self.invalid_keys) < 1000:
            self.invalid_keys.setdefault((service, key[:100]), why)
        if len(self._names) >= 100_000:  # a peer inventing keys: start the cache again
            self._names.clear()
        self._names[cache_key] = resolved
        return resolved

    def sweep(self, now: float | None = None) -> None:
        """Mark silent instances down (one event each) and drop the ones silent for ``forget_after_s``."""
        now = self.clock() if now is None else now
        for state in self.instances.values():
            if not state.down and not self.live(state, now):
                state.down = True
                self.went_down += 1
                self.events.append(("down", state, f"no telemetry for {state.age(now):.1f} s"))
        self.forget_old(now)

    def forget_old(self, now: float | None = None) -> int:
        now = self.clock() if now is None else now
        old = [k for k, s in self.instances.items() if s.age(now) > self.forget_after_s]
        for k in old:
            state = self.instances.pop(k)
            retired = self.retired.setdefault(state.service, {})
            for name, value in state.lifetime().items():
                retired[name] = retired.get(name, 0.0) + value
            self.events.append(("forgotten", state, f"silent for {state.age(now):.0f} s"))
        self.forgotten += len(old)
        return len(old)

    def drain_events(self) -> list[tuple[str, InstanceState, str]]:
        events = list(self.events)
        self.events.clear()
        return events

    def live(self, state: InstanceState, now: float) -> bool:
        return state.age(now) <= self.stale_after_s

    def totals(self, service: str) -> dict[str, float]:
        """Counters summed over every instance the service ever had (down, restarted and forgotten included),
        so a total never drops when an instance dies or restarts."""
        out = dict(self.retired.get(service, {}))
        for (svc, _), state in self.instances.items():
            if svc == service:
                for k, v in state.lifetime().items():
                    out[k] = out.get(k, 0.0) + v
        return out

    def by_service(self) -> dict[str, list[InstanceState]]:
        out: dict[str, list[InstanceState]] = {}
        for (service, _), state in sorted(self.instances.items()):
            out.setdefault(service, []).append(state)
        return out


class MetricsWriter:
    """Collects samples by family and writes Prometheus text exposition format 0.0.4."""

    def __init__(self) -> None:
        self.families: dict[str, tuple[str, str, list[str]]] = {}
        self.conflicts = 0

    def add(self, name: str, kind: str, help_text: str, labels: dict[str, str] | tuple[tuple[str, str], ...],
            value: float) -> None:
        family = self.families.get(name)
        if family is None:
            family = self.families[name] = (kind, help_text, [])
        elif family[0] != kind:
            self.conflicts += 1  # the same name reported as counter by one instance and gauge by another
            return
        items = labels.items() if isinstance(labels, dict) else labels
        rendered = ",".join(f'{k}="{escape_label(str(v))}"' for k, v in items)
        family[2].append(f"{name}{{{rendered}}} {format_value(float(value))}" if rendered
                         else f"{name} {format_value(float(value))}")

    def text(self) -> str:
        lines: list[str] = []
        for name, (kind, help_text, samples) in self.families.items():
            lines.append(f"# HELP {name} {help_text}")
            lines.append(f"# TYPE {name} {kind}")
            lines.extend(samples)
        return "\n".join(lines) + "\n"


def render_instances(registry: Registry, writer: MetricsWriter, now: float) -> None:
    """Every instance's counters and gauges as ``flywheel_<service>_<key>``, labelled service and instance; the HELP
    line of a declared key is its help text in flywheel.metrics_spec.

    Keys that are not valid metric names, or that Prometheus's lint would refuse (a gauge ending in _total, a
    _count suffix, ...), are skipped (``registry.invalid_keys`` says why), so /metrics stays clean under
    ``promtool check metrics``.
    """
    bad = 0
    for service, states in registry.by_service().items():
        for s in states:
            base = {"service": service, "instance": s.instance}
            writer.add("flywheel_up", "gauge", "1 when the instance reported within the staleness window",
                       base, 1.0 if registry.live(s, now) else 0.0)
            writer.add("flywheel_telemetry_age_seconds", "gauge", "seconds since the instance's last telemetry",
                       base, s.age(now))
            for values, kind in ((s.counters, "counter"), (s.gauges, "gauge")):
                for key, value in sorted(values.items()):
                    resolved = registry.metric(service, kind, key)
                    if resolved is None:
                        bad += 1
                        continue
                    name, suffix, extra = resolved
                    declared = metrics_spec.help_text(service, kind, suffix)
                    writer.add(name, kind, declared or f"{suffix} reported by {service} instances",
                               (("service", service), ("instance", s.instance), *extra), value)
            if s.info:
                labels = [("service", service), ("instance", s.instance)]
                for k, v in sorted(s.info.items()):
                    if _KEY_RE.match(k) and "{" not in k and k not in _RESERVED_LABELS and not k.startswith("__"):
                        labels.append((k, v))
                writer.add(f"flywheel_{service}_info", "gauge", f"static facts about {service} instances",
                           tuple(labels), 1.0)
    registry.bad_keys = bad
