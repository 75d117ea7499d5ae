"""What the gateway knows about every instance, within caps on instances and series that one peer cannot pass."""

from __future__ import annotations

import math
import re
import sys
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from flywheel import proto

from .metric_keys import Resolved, resolve_key

_NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,63}$")
# The largest magnitude a reported value may have: beyond 2**53 a float no longer counts by one, no real counter or
# gauge gets there, and sums of many such values stay finite (JSON, int() and the live page's numbers need that).
MAX_ABS_VALUE = float(2**53)
RATE_WINDOW_ENTRIES = 16  # reports a rate window keeps at most: at least rate_window_s / 16 apart, and the newest
INSTANCE_SERIES = 3  # series /metrics shows of every instance whatever it reports: up, telemetry age and info


class TelemetryRejected(proto.DecodeError):
    """A telemetry message decoded but cannot be accepted (bad service name, too many instances)."""

    fault = "malformed"


class CapacityExceeded(TelemetryRejected):
    """A cap refused a message (instances in all or per service, series) or some of its values (``fault`` says
    which: capacity, instances_per_service, series_per_instance, series)."""

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


@dataclass
class InstanceState:
    """The latest telemetry of one instance of one service, and a short window of its counters for rates.

    ``counters``, ``gauges`` and ``info`` are replaced by each report, never changed in place (/metrics renders
    them in a worker thread)."""

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
    window: deque[tuple[float, dict[str, float]]] = field(
        default_factory=lambda: deque(maxlen=RATE_WINDOW_ENTRIES + 2))
    # what counters lost when they went backwards (a restart): totals add it back, so they never drop
    carried: dict[str, float] = field(default_factory=dict)
    series: int = 0  # what the instance counts against the registry's series cap (values + INSTANCE_SERIES)

    def lifetime(self) -> dict[str, float]:
        """Counters as if the instance had never restarted: each never below its highest value seen."""
        if not self.carried:
            return dict(self.counters)
        out = dict(self.counters)
        for k, v in self.carried.items():
            out[k] = out.get(k, 0.0) + v
        return out

    def carry_drops(self, counters: dict[str, float], max_keys: int) -> int:
        """Before ``counters`` replace the current ones: keep what any counter that went backwards lost (in at most
        ``max_keys`` keys); returns how many drops could not be kept.

        A restarted service reports its counters from zero (or from a checkpoint); counting the drop keeps
        totals monotonic without counting twice what a resumed service restored.
        """
        lost = 0
        for k, old in self.counters.items():
            new = counters.get(k, 0.0)
            if new < old:
                if k in self.carried or len(self.carried) < max_keys:
                    self.carried[k] = self.carried.get(k, 0.0) + (old - new)
                else:
                    lost += 1
        return lost

    def add_to_window(self, now: float, window_s: float) -> None:
        """Keep the counters of this report for rates: reports closer than window_s / RATE_WINDOW_ENTRIES to the
        one before replace the newest, and reports older than ``window_s`` leave (the oldest stays the span's
        start), so the window holds at most RATE_WINDOW_ENTRIES + 2 reports however fast they come."""
        window = self.window
        if len(window) >= 2 and now - window[-2][0] < window_s / RATE_WINDOW_ENTRIES:
            window[-1] = (now, self.counters)
        else:
            window.append((now, self.counters))
        while len(window) > 2 and now - window[1][0] >= window_s:
            window.popleft()

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

    Bounded whatever peers send: at most ``max_instances`` instances, ``max_per_service`` of one service,
    ``max_series_per_instance`` values (counters, gauges and info entries) each, and ``max_series`` series in all
    (values plus INSTANCE_SERIES per instance); the forgotten instances' totals (``retired``) likewise. What a cap
    refuses is listed in ``last_faults`` (a whole message: CapacityExceeded raised). ``events`` collects what is
    worth one log line each (joined, restarted, down, back, forgotten) until the service drains it.
    """

    def __init__(self, stale_after_s: float = 5.0, forget_after_s: float = 300.0,
                 max_instances: int = 10_000, clock: Callable[[], float] = time.monotonic,
                 rate_window_s: float = 10.0, max_per_service: int = 1024, max_series_per_instance: int = 512,
                 max_series: int = 20_000) -> None:
        self.stale_after_s, self.forget_after_s, self.max_instances = stale_after_s, forget_after_s, max_instances
        self.clock, self.rate_window_s = clock, rate_window_s
        self.max_per_service, self.max_series_per_instance = max_per_service, max_series_per_instance
        self.max_series = max(max_series, max_series_per_instance + INSTANCE_SERIES)
        self.instances: dict[tuple[str, str], InstanceState] = {}
        self.per_service: Counter[str] = Counter()
        self.series = 0  # sum of every instance's ``series``
        self.received = 0
        self.bad_keys = 0
        self.invalid_keys: dict[tuple[str, str], str] = {}  # (service, key) -> why it is not exported (bounded)
        self._names: dict[tuple[str, str, str], Resolved] = {}  # at most max_series entries
        self.forgotten = 0
        self.went_down = 0
        self.events: deque[tuple[str, InstanceState, str]] = deque(maxlen=10_000)
        self.retired: dict[str, dict[str, float]] = {}  # per service: lifetime counters of forgotten instances
        self.retired_keys = 0  # keys in ``retired``: at most max_series_per_instance per service, max_series in all
        self.totals_dropped = 0  # counter keys whose carried or retired total a cap left out
        self.last_bad_values: list[tuple[str, float]] = []  # (key, value) left out of the last message stored
        self.last_faults: list[TelemetryRejected] = []  # what the last message stored lost (BadValues, caps)
        self._forgot_at = -math.inf

    def update(self, msg: proto.Telemetry) -> InstanceState:
        """Store one telemetry message; raises TelemetryRejected when it cannot be kept.

        Values ``value_ok`` refuses are left out and listed in ``last_bad_values``; a counter left out keeps its
        last value, so totals neither drop nor count twice. Values past the series caps are left out too (the
        first ones in the message, counters then gauges then info, are kept); ``last_faults`` says what was lost.
        """
        self.last_bad_values, self.last_faults = [], []
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
            self._admit(msg.service, now)
            state = InstanceState(msg.service, msg.instance, msg.seq, msg.time, now, now, series=INSTANCE_SERIES)
            self.instances[key] = state
            self.per_service[msg.service] += 1
            self.series += INSTANCE_SERIES
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
        if self.last_bad_values:
            self.last_faults.append(bad_values_fault(msg, self.last_bad_values))
        counters, gauges, info = self._fit(msg, state, counters, gauges, dict(msg.info))
        self.totals_dropped += state.carry_drops(counters, self.max_series_per_instance)
        state.counters, state.gauges, state.info = counters, gauges, info
        series = len(counters) + len(gauges) + len(info) + INSTANCE_SERIES
        self.series += series - state.series
        state.series = series
        for values, kind in ((state.counters, "counter"), (state.gauges, "gauge")):
            for k in values:
                self.metric(msg.service, kind, k)  # refused keys are known (and logged) from the first report
        state.add_to_window(now, self.rate_window_s)
        self.received += 1
        return state

    def _admit(self, service: str, now: float) -> None:
        """Room for one more instance of ``service``, after forgetting long-silent ones; else CapacityExceeded."""
        def full() -> CapacityExceeded | None:
            if len(self.instances) >= self.max_instances:
                return CapacityExceeded(f"telemetry: already tracking {self.max_instances} instances")
            if self.per_service[service] >= self.max_per_service:
                return CapacityExceeded(f"telemetry: already tracking {self.max_per_service} instances of "
                                        f"{service}", fault="instances_per_service")
            if self.series + INSTANCE_SERIES > self.max_series:
                return CapacityExceeded(f"telemetry: already holding {self.series} series (at most "
                                        f"{self.max_series})", fault="series")
            return None

        if full() is not None:
            if now - self._forgot_at >= 1.0:  # a scan of every instance: at most once a second, however many come
                self._forgot_at = now
                self.forget_old(now)
            refused = full()
            if refused is not None:
                raise refused

    def _fit(self, msg: proto.Telemetry, state: InstanceState, counters: dict[str, float],
             gauges: dict[str, float], info: dict[str, str]) -> tuple[dict[str, float], dict[str, float],
                                                                       dict[str, str]]:
        """The values within the caps: at most max_series_per_instance, and what the series cap leaves."""
        room = min(self.max_series_per_instance, self.max_series - (self.series - state.series) - INSTANCE_SERIES)
        count = len(counters) + len(gauges) + len(info)
        if count <= room:
            return counters, gauges, info
        fault = "series_per_instance" if room == self.max_series_per_instance else "series"  # the cap that bit
        self.last_faults.append(CapacityExceeded(
            f"telemetry from {msg.service[:40]} {msg.instance[:64]!r}: kept {room} of its {count} values "
            f"({'max_series_per_instance' if fault == 'series_per_instance' else 'max_series in all'})",
            fault=fault))
        kept_counters = dict(list(counters.items())[:room])
        kept_gauges = dict(list(gauges.items())[:room - len(kept_counters)])
        kept_info = dict(list(info.items())[:room - len(kept_counters) - len(kept_gauges)])
        return kept_counters, kept_gauges, kept_info

    def _checked(self, values: dict[str, float], kind: str, previous: dict[str, float]) -> dict[str, float]:
        out: dict[str, float] = {}
        for key, value in values.items():
            if value_ok(value, kind):
                out[sys.intern(key)] = value  # one string per key, shared by every report in the rate windows
            else:
                self.last_bad_values.append((key, value))
                if key in previous:
                    out[key] = previous[key]
        return out

    def metric(self, service: str, kind: str, key: str) -> Resolved:
        """(name, suffix, extra labels) of a telemetry key, or None when it cannot be exported.

        Refused keys are recorded in ``invalid_keys`` with the reason; answers are cached (bounded).
        """
        cache_key = (service, kind, key)
        if cache_key in self._names:
            return self._names[cache_key]
        resolved, why = resolve_key(service, kind, key)
        if resolved is None and len(self.invalid_keys) < 1000:
            self.invalid_keys.setdefault((service, key[:100]), why)
        if len(self._names) >= self.max_series:  # a peer inventing keys: start the cache again
            self._names.clear()
        self._names[cache_key] = resolved
        return resolved

    def lookup(self, service: str, kind: str, key: str) -> Resolved:
        """``metric`` without recording anything: safe from a worker thread while the event loop updates."""
        try:
            return self._names[(service, kind, key)]
        except KeyError:
            return resolve_key(service, kind, key)[0]

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
            self.per_service[state.service] -= 1
            if self.per_service[state.service] <= 0:
                del self.per_service[state.service]
            self.series -= state.series
            self._retire(state)
            self.events.append(("forgotten", state, f"silent for {state.age(now):.0f} s"))
        self.forgotten += len(old)
        return len(old)

    def _retire(self, state: InstanceState) -> None:
        """Add a forgotten instance's lifetime counters to its service's ``retired`` totals, within the caps."""
        retired = self.retired.get(state.service, {})
        for name, value in state.lifetime().items():
            if name in retired:
                retired[name] += value
            elif len(retired) < self.max_series_per_instance and self.retired_keys < self.max_series:
                retired[name] = value
                self.retired_keys += 1
            else:
                self.totals_dropped += 1
        if retired:
            self.retired[state.service] = retired

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
