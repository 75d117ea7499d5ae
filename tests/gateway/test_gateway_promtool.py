"""promtool (Debian's prometheus package) checks the scrape config, the alert rules and their unit tests, the
/metrics text of a gateway fed by real reporters; and the Grafana dashboards are what the generator writes."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import zmq
from conftest import gateway_settings
from fastapi.testclient import TestClient
from gateway_helpers import wait_for

from flywheel.services.gateway.app import GatewayService, create_app
from flywheel.transport import TelemetryReporter

ROOT = Path(__file__).resolve().parents[2]
PROM = ROOT / "deploy" / "prometheus"
GRAFANA = ROOT / "deploy" / "grafana"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"

pytestmark = pytest.mark.system  # runs promtool (Debian's prometheus package)


def promtool(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    assert Path(PROMTOOL).exists(), "promtool missing: install Debian's prometheus package (make system-deps)"
    return subprocess.run([PROMTOOL, *args], input=stdin, capture_output=True, text=True, timeout=60, cwd=PROM)


def test_promtool_check_config() -> None:
    done = promtool("check", "config", "prometheus.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 rule files found" in done.stdout + done.stderr  # the alert rules are wired in


def test_promtool_check_rules() -> None:
    done = promtool("check", "rules", "alerts.yml")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 9 rules found" in done.stdout


def test_promtool_unit_tests_of_the_alerts() -> None:
    tests = sorted(p.name for p in PROM.glob("*test*.yml"))
    assert tests == ["alerts_test.yml"]
    done = promtool("test", "rules", *tests)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_every_alert_has_a_unit_test() -> None:
    import yaml

    rules = [r["alert"] for g in yaml.safe_load((PROM / "alerts.yml").read_text())["groups"] for r in g["rules"]]
    tested = yaml.safe_load((PROM / "alerts_test.yml").read_text())["tests"]
    firing = {case["alertname"] for t in tested for case in t["alert_rule_test"] if case["exp_alerts"]}
    quiet = {case["alertname"] for t in tested for case in t["alert_rule_test"] if not case["exp_alerts"]}
    assert set(rules) <= firing, f"alerts never shown firing: {set(rules) - firing}"
    assert set(rules) <= quiet, f"alerts never shown quiet: {set(rules) - quiet}"
    wanted = {"FlywheelNoActorReporting", "FlywheelLearnerStarved", "FlywheelReplayDropping", "FlywheelWeightsStale",
              "FlywheelServiceDown", "FlywheelInstanceDown", "FlywheelGatewayDown"}
    assert wanted <= set(rules)


def test_promtool_check_metrics_on_gateway_output() -> None:
    settings = gateway_settings()
    service = GatewayService(settings)
    ctx = zmq.Context()
    try:
        with TestClient(create_app(settings, service)) as client:
            reporters = [TelemetryReporter(ctx, service.endpoints["telemetry"], s, f"{s}-0")
                         for s in ("actor", "replay", "learner")]

            def report() -> bool:
                reporters[0].send({"env_steps_total": 10, "episodes_total": 1},
                                  {"epsilon": 0.4, "policy_lag_versions": 1, "weight_age_seconds": 0.5},
                                  {"env_id": "CartPole-v1"})
                reporters[1].send({"samples_total": 5, 'rejected_total{where="transitions",reason="malformed"}': 1},
                                  {"size_transitions": 4.0, "memory_bytes": 1e6})
                reporters[2].send({"updates_total": 3}, {"loss": 0.5, "data_wait_ratio": 0.1},
                                  {"device": "cpu"})
                time.sleep(0.02)
                return len(service.registry.instances) == 3

            wait_for(report, what="three services reporting")
            client.post("/control/pause")  # a 401: the HTTP reject counter has a sample
            text = client.get("/metrics").text
            for r in reporters:
                r.close()
    finally:
        ctx.destroy(linger=0)
    done = promtool("check", "metrics", stdin=text)
    assert done.returncode == 0 and not done.stdout.strip() and not done.stderr.strip(), done.stdout + done.stderr
    assert re.search(r'^flywheel_replay_rejected_total\{.*reason="malformed".*\} 1$', text, re.M)


def test_dashboards_are_what_the_generator_writes() -> None:
    spec = importlib.util.spec_from_file_location("build_dashboards", GRAFANA / "build_dashboards.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    rendered = module.render()
    on_disk = {p.name: p.read_text() for p in (GRAFANA / "dashboards").glob("*.json")}
    assert rendered == on_disk, "run: python deploy/grafana/build_dashboards.py"
    for name, text in on_disk.items():
        board = json.loads(text)
        ids = [p["id"] for p in board["panels"]]
        assert len(ids) == len(set(ids)), name
        for p in board["panels"]:
            assert p["targets"] and all(t["expr"] for t in p["targets"]), f"{name}: {p['title']}"
            refs = [t["refId"] for t in p["targets"]]
            assert len(refs) == len(set(refs))
    assert {"flywheel-overview.json", "flywheel-learning.json", "flywheel-hardware.json"} <= set(on_disk)
