"""An env's measures from a real actor's telemetry reach the gateway's /metrics, /status, /history and Grafana.

A real ActorCore plays Super Mario Bros 1-1 (short episodes; an env that declares a progress and a success measure)
until episodes finish; the actor's own ``actor_report`` builds the report, a TelemetryReporter sends it over ZeroMQ
to a running gateway with the labels the env declares, and every metric the progress and success panels of the
Grafana dashboards query must be in the gateway's /metrics (the names come from the gateway's own naming, not from a
list here), or be a declared actor gauge of restarted episodes, which this actor (no start-state curriculum) has none
of.
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
from flywheel.metrics_spec import help_text
from flywheel.services.actor.core import build_core
from flywheel.services.actor.policy import build_policy
from flywheel.services.actor.report import StepRate
from flywheel.services.actor.report import actor_report as report_of
from flywheel.services.actor.transport import LeaseClient, TransitionSender, WeightsReceiver
from flywheel.services.gateway.app import GatewayService, create_app
from flywheel.transport import FaultCounter, TelemetryReporter

ENV_ID = "SuperMarioBros-1-1-v0?size=42,max_episode_steps=40"
DASHBOARDS = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "dashboards"
MEASURES = ("flywheel_actor_episode_progress_", "flywheel_actor_episode_success_", "flywheel_actor_restarted_")


def actor_report() -> tuple[dict[str, float], dict[str, float], dict[str, str]]:
    """Counters, gauges and info of one report of an actor that has finished episodes (random network)."""
    spec = env_spec(ENV_ID)
    policy = build_policy(spec.obs_shape, spec.n_actions, hidden=64, threads=1, seed=0, obs_dtype=spec.obs_dtype)
    core = build_core(ENV_ID, 2, policy, n_step=3, gamma=0.9, seed=0)
    ctx = zmq.Context()
    nowhere = "inproc://nowhere"  # connected, never bound: the report needs the parts only
    faults = FaultCounter("actor")
    sender = TransitionSender(ctx, nowhere, "actor-0", hwm=1, on_full="block", batch_rows=1)
    weights = WeightsReceiver(ctx, nowhere, policy, faults)
    lease = LeaseClient(ctx, nowhere, "actor-0", faults)
    try:
        deadline = time.monotonic() + 60
        gauges: dict[str, float] = {}
        while "episode_success_rate" not in gauges and time.monotonic() < deadline:
            for _ in range(20):
                core.step()
            now = time.monotonic()
            counters, report = report_of(core, sender, weights, lease, paused=False, rate=StepRate(now), now=now)
            gauges = report.as_dict()
        assert "episode_success_rate" in gauges, "no episode finished within 60 s"
        labels = {f"{key}_label": label for key, label in spec.measures.labels().items()}  # as services/actor/main.py
        return counters.as_dict(), gauges, {"env_id": ENV_ID, **labels}
    finally:
        for part in (sender, weights, lease):
            part.close()
        ctx.destroy(linger=0)
        core.close()


def test_progress_panels_query_metrics_the_gateway_exports() -> None:
    counters, gauges, info = actor_report()
    assert {"episode_progress_mean", "episode_progress_max", "episode_success_rate"} <= set(gauges)
    assert (info["progress_label"], info["success_label"]) == ("furthest x", "flag")

    settings = gateway_settings()
    service = GatewayService(settings)
    ctx = zmq.Context()
    try:
        with TestClient(create_app(settings, service)) as client:
            reporter = TelemetryReporter(ctx, service.endpoints["telemetry"], "actor", "actor-0")

            def reported() -> bool:
                reporter.send(counters, gauges, info)
                time.sleep(0.05)
                points = client.get("/history").json()["points"]
                return bool(points) and points[-1]["success_rate"] is not None

            wait_for(reported, timeout=10, what="the actor's report in /history")
            metrics = client.get("/metrics").text
            point = client.get("/history").json()["points"][-1]
            summary = client.get("/status").json()["summary"]
            reporter.close()
    finally:
        ctx.destroy(linger=0)

    assert point["progress_mean"] == summary["progress_mean"] == round(gauges["episode_progress_mean"], 6)
    assert point["progress_max"] == summary["progress_max"] == gauges["episode_progress_max"]
    assert point["success_rate"] == summary["success_rate"] == gauges["episode_success_rate"]
    assert point["restarted_progress_mean"] is None and summary["restarted_progress_mean"] is None
    assert (summary["progress_label"], summary["success_label"]) == ("furthest x", "flag")
    assert 'progress_label="furthest x"' in metrics and 'success_label="flag"' in metrics  # the panels' legends

    exported = {line.split("{")[0].split(" ")[0] for line in metrics.splitlines() if not line.startswith("#")}
    measured = [(board, title, expr) for board, title, expr in dashboard_queries()
                if any(n.startswith(MEASURES) for n in metric_names(expr))]
    assert {"Episode progress", "Episode success rate"} <= {title for _, title, _ in measured}
    for board, title, expr in measured:
        missing = metric_names(expr) - exported
        assert all(n.startswith("flywheel_actor_restarted_") for n in missing), (
            f"{board} / {title}: {expr} reads {missing}, which the gateway does not export")
        for name in missing:  # restarted episodes only: a gauge the actor declares, reported with the curriculum
            assert help_text("actor", "gauge", name.removeprefix("flywheel_actor_")), name
    queried = set().union(*(metric_names(e) for _, _, e in measured))
    assert {"flywheel_actor_episode_progress_mean", "flywheel_actor_episode_progress_max",
            "flywheel_actor_episode_success_rate", "flywheel_actor_restarted_progress_mean",
            "flywheel_actor_restarted_success_rate", "flywheel_actor_info"} <= queried

    learning = json.loads((DASHBOARDS / "flywheel-learning.json").read_text())
    success = next(p for p in learning["panels"] if p["title"] == "Episode success rate")
    assert success["fieldConfig"]["defaults"]["unit"] == "percentunit"
