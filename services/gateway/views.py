"""What the gateway shows: /metrics in Prometheus text, /status and /history as JSON, and the join document."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flywheel import __version__, security
from flywheel.procstats import ProcessStats

from .exposition import MetricsWriter, Snapshot, render_instances, snapshot
from .metrics import InstanceState
from .models import JoinDocument
from .transport import GatewayService

_OWN_PROCESS = ProcessStats()


def _num(value: float | None, digits: int = 6) -> float | None:
    """JSON-safe number: NaN and infinities become null (JSON has neither)."""
    if value is None or not math.isfinite(value):
        return None
    return round(value, digits) if not float(value).is_integer() else value


def _count(value: float) -> int | None:
    """A whole number for JSON, or null when ``value`` is not finite (int() of an infinity raises)."""
    return int(value) if math.isfinite(value) else None


def _clean(values: dict[str, float]) -> dict[str, float]:
    """Finite values only: JSON has no NaN or infinity (/metrics still shows them)."""
    return {k: v for k, v in values.items() if math.isfinite(v)}


@dataclass(frozen=True)
class MetricsSnapshot:
    """What /metrics shows, taken on the event loop (cheap: references, and the gateway's own ~60 samples)."""

    instances: Snapshot
    own: MetricsWriter
    labels: dict[str, str]
    uptime: float
    last_render_cpu_s: float  # CPU seconds the previous /metrics took to write (0 before the first)


def metrics_snapshot(gw: GatewayService, last_render_cpu_s: float = 0.0) -> MetricsSnapshot:
    """Sweep, then take what /metrics renders; the rendering itself (``render_metrics``) may run in a thread."""
    now = time.monotonic()
    gw.registry.sweep(now)
    gw.log_events()
    gw.log_invalid_keys()
    w = MetricsWriter()
    g = {"service": "gateway", "instance": gw.settings.instance}
    w.add("flywheel_gateway_info", "gauge", "static facts about the gateway", {**g, "version": __version__}, 1)
    w.add("flywheel_gateway_telemetry_received_total", "counter", "telemetry messages accepted", g,
          gw.registry.received)
    for fault_key in sorted(gw.faults.counts) or ["telemetry:malformed"]:
        where, fault = fault_key.split(":", 1)
        w.add("flywheel_gateway_messages_rejected_total", "counter", "messages refused, by socket and fault",
              {**g, "socket": where, "fault": fault}, gw.faults.counts.get(fault_key, 0))
    for (route, status), count in sorted(gw.http_rejected.items()) or [(("/control/{command}", 401), 0)]:
        w.add("flywheel_gateway_http_rejected_total", "counter", "HTTP requests answered 4xx, by route and status",
              {**g, "route": route, "status": str(status)}, count)
    for service, states in gw.registry.by_service().items():
        live = sum(gw.registry.live(s, now) for s in states)
        w.add("flywheel_gateway_instances", "gauge", "instances known, by service and state",
              {**g, "of_service": service, "state": "up"}, live)
        w.add("flywheel_gateway_instances", "gauge", "instances known, by service and state",
              {**g, "of_service": service, "state": "down"}, len(states) - live)
    w.add("flywheel_gateway_series", "gauge", "series held for the instances: their values and 3 each (at most "
          "max_series)", g, gw.registry.series)
    w.add("flywheel_gateway_totals_dropped_total", "counter", "counter totals of restarted or forgotten instances "
          "left out by the series caps", g, gw.registry.totals_dropped)
    w.add("flywheel_gateway_instances_down_total", "counter", "times an instance went silent past stale_after_s", g,
          gw.registry.went_down)
    w.add("flywheel_gateway_instances_forgotten_total", "counter", "instances dropped after forget_after_s", g,
          gw.registry.forgotten)
    w.add("flywheel_gateway_leases", "gauge", "live exploration leases (the N of Ape-X eps_i)", g, len(gw.leases))
    w.add("flywheel_gateway_lease_requests_total", "counter", "lease requests received", g, gw.lease_requests)
    w.add("flywheel_gateway_leases_expired_total", "counter", "leases dropped because the actor went silent", g,
          gw.leases.expired)
    w.add("flywheel_gateway_control_enabled", "gauge", "1 when POST /control is on (a token is set)", g,
          float(gw.auth.active))
    for command in sorted(gw.control.issued) or ["pause"]:
        w.add("flywheel_gateway_control_commands_total", "counter", "control commands accepted, by command",
              {**g, "command": command}, gw.control.issued.get(command, 0))
    w.add("flywheel_gateway_control_auth_failures_total", "counter", "control requests without the right token", g,
          gw.auth.failures)
    w.add("flywheel_gateway_control_published_total", "counter", "control messages published, repeats included",
          g, gw.published)
    w.add("flywheel_gateway_internal_errors_total", "counter", "telemetry messages whose handling raised (a bug: "
          "logged with its trace; the gateway goes on)", g, gw.internal_errors)
    w.add("flywheel_gateway_missed_wakeups_total", "counter", "receives that timed out with a message waiting (the "
          "event loop missed its wakeup; the message was taken a second late)", g, gw.missed_wakeups)
    w.add("flywheel_gateway_clips_received_total", "counter", "filmed greedy episodes received whole", g,
          gw.clips.received)
    w.add("flywheel_gateway_clips_dropped_total", "counter", "clips given up: pieces stopped coming or pushed out",
          g, gw.clips.dropped)
    w.add("flywheel_gateway_clip_buffer_bytes", "gauge", "bytes held by filmed clips in flight (at most "
          "clip_buffer_bytes)", g, gw.clips.held)
    w.add("flywheel_gateway_curve_points", "gauge", "points in the live page's learning curve", g,
          len(gw.curve.points))
    w.add("flywheel_gateway_tracking_failures_total", "counter", "W&B tracking calls that failed (each retried)", g,
          gw.tracking_failures)
    if security.active() is not None:
        for reason, count in sorted(security.refused_counts().items()):
            w.add("flywheel_gateway_curve_handshakes_refused_total", "counter",
                  "connections refused by CURVE: unauthorized_key, protocol (no CURVE or the wrong server key), other",
                  {**g, "reason": reason}, count)
    return MetricsSnapshot(snapshot(gw.registry, now), w, g, now - gw.started, last_render_cpu_s)


def render_metrics(snap: MetricsSnapshot) -> str:
    """The Prometheus text of a snapshot: every instance's series, then the gateway's own."""
    w = MetricsWriter()
    bad = render_instances(snap.instances, w)
    w.families.update(snap.own.families)  # the gateway's own names (flywheel_gateway_*) are no instance's
    g = snap.labels
    counters, gauges = _OWN_PROCESS.sample()
    for key, value in counters.items():
        w.add(f"flywheel_gateway_{key}", "counter", f"{key} of the gateway process", g, value)
    for key, value in gauges.items():
        w.add(f"flywheel_gateway_{key}", "gauge", f"{key} of the gateway process", g, value)
    w.add("flywheel_gateway_invalid_metric_keys", "gauge", "telemetry keys skipped as invalid metric names", g, bad)
    w.add("flywheel_gateway_metric_type_conflicts", "gauge", "samples skipped: name reported as two types", g,
          w.conflicts)
    w.add("flywheel_gateway_uptime_seconds", "gauge", "seconds since the gateway started", g, snap.uptime)
    w.add("flywheel_gateway_metrics_render_cpu_seconds", "gauge", "CPU seconds the previous /metrics took to write "
          "(in a worker thread; at most max_series instance lines)", g, snap.last_render_cpu_s)
    return w.text()


def metrics_text(gw: GatewayService) -> str:
    """/metrics rendered here and now (tests; the route renders in a thread: ``MetricsRenderer``)."""
    return render_metrics(metrics_snapshot(gw))


class MetricsRenderer:
    """/metrics without blocking the event loop: the snapshot is taken on the loop, the text is written in a
    worker thread, and requests that come while one is being written share it (a scraper never queues renders)."""

    def __init__(self, gw: GatewayService) -> None:
        self.gw = gw
        self.last_cpu_s = 0.0
        self._running: asyncio.Future[str] | None = None

    def _render(self, snap: MetricsSnapshot) -> str:
        started = time.thread_time()
        text = render_metrics(snap)
        self.last_cpu_s = time.thread_time() - started
        return text

    async def text(self) -> str:
        if self._running is None or self._running.done():
            snap = metrics_snapshot(self.gw, self.last_cpu_s)
            self._running = asyncio.ensure_future(asyncio.to_thread(self._render, snap))
        return await asyncio.shield(self._running)


def _instance(gw: GatewayService, s: InstanceState, now: float) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "instance": s.instance, "role": s.service, "version": s.info.get("version"),
        "up": gw.registry.live(s, now), "age_s": round(s.age(now), 3),
        "last_report": {"sent_time": _num(s.sent_time), "received_time": round(s.received_wall, 3), "seq": s.seq},
        "restarts": s.restarts, "rates": _clean(s.rates()),
        "counters": _clean(s.counters), "gauges": _clean(s.gauges), "info": s.info,
    }
    index = gw.leases.index_of(s.instance)
    if index is not None:
        entry["lease"] = {"index": index, "count": len(gw.leases)}
    return entry


def _summary(services: dict[str, Any]) -> dict[str, Any]:
    """The numbers the live page and `flywheel run` show, from live instances only."""

    def live(service: str) -> list[dict[str, Any]]:
        return [i for i in services.get(service, {}).get("instances", []) if i["up"]]

    def total_rate(service: str, key: str) -> float | None:
        values = [i["rates"].get(key) for i in live(service)]
        values = [v for v in values if v is not None]
        return _num(sum(values), 3) if values else None

    def gauge(service: str, key: str, how: str = "mean") -> float | None:
        values = [i["gauges"].get(key) for i in live(service)]
        values = [v for v in values if v is not None]
        if not values:
            return None
        return _num(max(values) if how == "max" else sum(values) if how == "sum" else sum(values) / len(values))

    learner_version = gauge("learner", "weight_version", "max")
    actor_versions = [i["gauges"].get("weight_version") for i in live("actor")]
    lags = [learner_version - v for v in actor_versions if v is not None and learner_version is not None]
    return {
        "env_steps_per_s": total_rate("actor", "env_steps_total"),
        "transitions_sent_per_s": total_rate("actor", "transitions_sent_total"),
        "transitions_received_per_s": total_rate("replay", "transitions_received_total"),
        "samples_per_s": total_rate("replay", "samples_total"),
        "replay_size": gauge("replay", "size_transitions", "sum"),
        "replay_capacity": gauge("replay", "capacity_transitions", "sum"),
        "updates_per_s": total_rate("learner", "updates_total"),
        "weight_version": learner_version,
        "policy_lag_versions": {"max": _num(max(lags)), "mean": _num(sum(lags) / len(lags), 3)} if lags else None,
        "data_wait_ratio": gauge("learner", "data_wait_ratio"),
        "loss": gauge("learner", "loss"),
        "episode_return_mean": gauge("actor", "episode_return_mean"),
        "eval_return_mean": gauge("actor", "eval_return_mean"),
        **_learner_evaluation(live("learner"), gauge),
        **_measures(live("actor"), gauge),
        "epsilon": {i["instance"]: i["gauges"].get("epsilon") for i in live("actor")},
        "exploration": _exploration(live("actor")),
    }


def _label(instances: list[dict[str, Any]], key: str) -> str | None:
    """A label an instance's telemetry info carries (the first live instance that has one), else None."""
    return next((i["info"][key] for i in instances if i["info"].get(key)), None)


def _measures(actors: list[dict[str, Any]], gauge: Callable[..., float | None]) -> dict[str, Any]:
    """The env's own progress and success measures over the actors' last 100 episodes (flywheel.envs.measures),
    level-start and restarted episodes apart, with the labels the actors' env declares; null for envs without."""
    return {"progress_mean": gauge("actor", "episode_progress_mean"),
            "progress_max": gauge("actor", "episode_progress_max", "max"),
            "success_rate": gauge("actor", "episode_success_rate"),
            "restarted_progress_mean": gauge("actor", "restarted_progress_mean"),
            "restarted_success_rate": gauge("actor", "restarted_success_rate"),
            "progress_label": _label(actors, "progress_label"), "success_label": _label(actors, "success_label")}


def _learner_evaluation(learners: list[dict[str, Any]], gauge: Callable[..., float | None]) -> dict[str, Any]:
    """The learner's last evaluation under its preset's protocol, with the labels of its env's measures (the
    learner's telemetry info)."""
    return {"eval_version": gauge("learner", "eval_greedy_version", "max"),
            "eval_return": gauge("learner", "eval_greedy_return"),
            "eval_success_rate": gauge("learner", "eval_success_rate"),
            "eval_progress_mean": gauge("learner", "eval_progress_mean"),
            "eval_progress_median": gauge("learner", "eval_progress_median"),
            "eval_success_label": _label(learners, "eval_success_label"),
            "eval_progress_label": _label(learners, "eval_progress_label")}


def _exploration(actors: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The spread of exploration rates over every live actor's env slots (Ape-X over N x E slots)."""
    spans = {a["instance"]: (a["gauges"].get("epsilon_min", a["gauges"].get("epsilon")),
                             a["gauges"].get("epsilon_max", a["gauges"].get("epsilon")),
                             a["gauges"].get("exploration_slots", 1.0)) for a in actors}
    spans = {k: v for k, v in spans.items() if v[0] is not None and v[1] is not None}
    if not spans:
        return None
    return {"slots": _count(sum(v[2] for v in spans.values())), "min": _num(min(v[0] for v in spans.values())),
            "max": _num(max(v[1] for v in spans.values())),
            "actors": {k: {"min": _num(v[0]), "max": _num(v[1]), "slots": _count(v[2])} for k, v in spans.items()}}


def status(gw: GatewayService) -> dict[str, Any]:
    now = time.monotonic()
    gw.registry.sweep(now)
    gw.log_events()
    services: dict[str, Any] = {}
    for service, states in gw.registry.by_service().items():
        instances = [_instance(gw, s, now) for s in states]
        totals = gw.registry.totals(service)
        services[service] = {
            "up": sum(1 for i in instances if i["up"]), "down": sum(1 for i in instances if not i["up"]),
            "totals": _clean(totals), "instances": instances,
        }
    return {
        "gateway": {
            "instance": gw.settings.instance, "version": __version__,
            "uptime_s": round(now - gw.started, 3), "time": round(time.time(), 3), "endpoints": gw.endpoints,
            "control_enabled": gw.auth.active, "stale_after_s": gw.settings.stale_after_s,
            "forget_after_s": gw.settings.forget_after_s,
            "telemetry_received": gw.registry.received, "rejected": dict(gw.faults.counts),
            "internal_errors": gw.internal_errors, "missed_wakeups": gw.missed_wakeups,
            "invalid_metric_keys": {f"{svc}:{key}": why for (svc, key), why in gw.registry.invalid_keys.items()},
        },
        "summary": _summary(services),
        "services": services,
        "leases": {"count": len(gw.leases), "actors": list(gw.leases.slots), "ttl_s": gw.leases.ttl_s},
        "control": gw.control.state(),
        "clip": gw.clips.newest.info() if gw.clips.newest is not None else None,
    }


def history(gw: GatewayService, since: float | None) -> dict[str, Any]:
    points = [{k: (_num(v) if isinstance(v, float) else v) for k, v in p.items()} for p in gw.curve.since(since)]
    return {"interval_s": gw.curve.interval_s, "thinned": gw.curve.thinned, "points": points}


def join_document(path: Path | None) -> JoinDocument | None:
    """The run's join document (flywheel/launch/remote.py), or None when there is none or it cannot be read."""
    if path is None:
        return None
    try:
        return JoinDocument.model_validate_json(path.read_bytes())
    except (OSError, ValueError):  # pydantic's ValidationError is a ValueError
        return None
