"""Mario distance and flags from a real actor's telemetry reach the gateway's /metrics, /history and the Grafana panels.

A real ActorCore plays Super Mario Bros 1-1 (short episodes) until episodes finish; the actor's own ``actor_report``
builds the report, a TelemetryReporter sends it over ZeroMQ to a running gateway, and every metric the Mario
panels of the Grafana dashboards query must be in the gateway's /metrics (the names come from the gateway's own
naming, not from a list here).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import zmq
from conftest import gateway_settings
from fastapi.testclient import TestClient
from gateway_helpers import wait_for
from prometheus_helpers import dashboard_queries, metric_names

from flywheel.envs import env_spec
from flywheel.services.actor.core import build_core
from flywheel.services.actor.policy import build_policy
from flywheel.services.actor.report import StepRate
from flywheel.services.actor.report import actor_report as report_of
from flywheel.services.actor.transport import LeaseClient, TransitionSender, WeightsReceiver
from flywheel.services.gateway.app import GatewayService, create_app
from flywheel.transport import FaultCounter, TelemetryReporter

ENV_ID = "SuperMarioBros-1-1-v0?size=42,max_episode_steps=40"
DASHBOARDS = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "dashboards"


def actor_report() -> tuple[dict[str, float], dict[str, float]]:
    """Counters and gauges of one report of an actor that has finished Mario episodes (random network)."""
    spec = env_spec(ENV_ID)
    policy = build_policy(spec.obs_shape, spec.n_actions, hidden=64, threads=1, seed=0, obs_dtype=spec.obs_dtype)
    core = build_core(ENV_ID, 2, policy, n_step=3, gamma=0.9, seed=0)
    ctx = zmq.Context()
    try:
        deadline = time.monotonic() + 60
        while not core.stats.flags and time.monotonic() < deadline:
            core.step()
        assert core.stats.flags, "no Mario episode finished within 60 s"
        nowhere = "inproc://nowhere"  # connected, never bound: the report needs the parts only
        faults = FaultCounter("actor")
        sender = TransitionSender(ctx, nowhere, "actor-0", hwm=1, on_full="block", batch_rows=1)
        weights = WeightsReceiver(ctx, nowhere, policy, faults)
        lease = LeaseClient(ctx, nowhere, "actor-0", faults)
        now = time.monotonic()
        counters, gauges = report_of(core, sender, weights, lease, paused=False, rate=StepRate(now), now=now)
        for part in (sender, weights, lease):
            part.close()
        return counters.as_dict(), gauges.as_dict()
    finally:
        ctx.destroy(linger=0)
        core.close()


def test_mario_panels_query_metrics_the_gateway_exports() -> None:
    counters, gauges = actor_report()
    assert {"mario_distance_mean", "mario_distance_max", "mario_flag_rate"} <= set(gauges)

    settings = gateway_settings()
    service = GatewayService(settings)
    ctx = zmq.Context()
    try:
        with TestClient(create_app(settings, service)) as client:
            reporter = TelemetryReporter(ctx, service.endpoints["telemetry"], "actor", "actor-0")

            def reported() -> bool:
                reporter.send(counters, gauges, {"env_id": ENV_ID})
                time.sleep(0.05)
                points = client.get("/history").json()["points"]
                return bool(points) and points[-1]["flag_rate"] is not None

            wait_for(reported, timeout=10, what="the actor's report in /history")
            metrics = client.get("/metrics").text
            point = client.get("/history").json()["points"][-1]
            summary = client.get("/status").json()["summary"]
            reporter.close()
    finally:
        ctx.destroy(linger=0)

    assert point["distance_mean"] == summary["mario_distance_mean"] == round(gauges["mario_distance_mean"], 6)
    assert point["distance_max"] == summary["mario_distance_max"] == gauges["mario_distance_max"]
    assert point["flag_rate"] == summary["mario_flag_rate"] == gauges["mario_flag_rate"]

    exported = {line.split("{")[0].split(" ")[0] for line in metrics.splitlines() if not line.startswith("#")}
    mario = [(board, title, expr) for board, title, expr in dashboard_queries()
             if any(n.startswith("flywheel_actor_mario_") for n in metric_names(expr))]
    titles = {title for _, title, _ in mario}
    assert {"Mario distance", "Mario flag rate"} <= titles, titles
    for board, title, expr in mario:
        missing = metric_names(expr) - exported
        assert not missing, f"{board} / {title}: {expr} reads {missing}, which the gateway does not export"
    queried = set().union(*(metric_names(e) for _, _, e in mario))
    assert {"flywheel_actor_mario_distance_mean", "flywheel_actor_mario_distance_max",
            "flywheel_actor_mario_flag_rate"} <= queried

    learning = json.loads((DASHBOARDS / "flywheel-learning.json").read_text())
    flags = next(p for p in learning["panels"] if p["title"] == "Mario flag rate")
    assert flags["fieldConfig"]["defaults"]["unit"] == "percentunit"
