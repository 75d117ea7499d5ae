"""Telemetry values a peer can send (1e308, -1e308, NaN, infinities, huge counters, odd info strings) never break
a view: non-finite and absurd values are dropped where telemetry is accepted, counted as a fault and logged once;
/status, /metrics, /history, /clip and the live page keep answering 200 with valid JSON and Prometheus text."""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zmq
from gateway_helpers import check_exposition, gateway_env, http_get, start_gateway, tel, wait_for
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_gateway_live_page import rendered
from test_gateway_promtool import promtool

from flywheel import proto
from flywheel.curves import Curves
from flywheel.services.gateway.metrics import Registry
from flywheel.transport import TelemetryReporter

HUGE = 1.7e308
MAX_ABS_VALUE = 2.0**53  # the largest magnitude the gateway keeps (beyond it floats stop counting by one)
NAN, INF = float("nan"), float("inf")
GAUGES = ("exploration_slots", "epsilon", "epsilon_min", "epsilon_max", "weight_version", "episode_return_mean",
          "eval_return_mean", "episode_progress_mean", "episode_progress_max", "episode_success_rate",
          "restarted_progress_mean", "restarted_success_rate", "size_transitions",
          "capacity_transitions", "data_wait_ratio", "loss", "policy_lag_versions", "env_steps_per_second",
          "updates_per_second")
COUNTERS = ("env_steps_total", "episodes_total", "updates_total", "transitions_sent_total",
            "transitions_received_total", "samples_total")
HOSTILE = (HUGE, -HUGE, 1e308, -1e308, NAN, INF, -INF, 2.0**64, -(2.0**63), MAX_ABS_VALUE, 5e-324, -0.0)
LABEL = "<img src=x onerror=\"document.title=1\">\u202e \U0001f600"  # an env's label as a hostile peer sends it


def get_all(client: Any) -> dict[str, Any]:
    """Every route that renders telemetry answers 200 (or /clip's 404 before a clip); the JSON is strict."""
    for route in ("/", "/healthz"):
        assert client.get(route).status_code == 200, route
    status = client.get("/status")
    assert status.status_code == 200, status.text[:500]
    body = json.loads(status.text, parse_constant=lambda c: pytest.fail(f"/status has {c}"))
    history = client.get("/history")
    assert history.status_code == 200 and "NaN" not in history.text and "Infinity" not in history.text
    assert client.get("/clip").status_code in (200, 404)
    metrics = client.get("/metrics")
    assert metrics.status_code == 200
    check_exposition(metrics.text)
    return body


def test_two_actors_with_huge_exploration_slots_leave_status_working(gateway, zctx, caplog) -> None:
    client, service = gateway
    caplog.set_level(logging.WARNING)
    reporters = [TelemetryReporter(zctx, service.endpoints["telemetry"], "actor", f"a-{i}") for i in range(2)]
    wait_for(lambda: [r.send({"env_steps_total": HUGE}, {"epsilon_min": 0.01, "epsilon_max": 0.4,
                                                          "exploration_slots": HUGE}) for r in reporters]
             and service.registry.received >= 4, what="two actors, twice each")
    status = get_all(client)
    assert status["summary"]["exploration"]["slots"] == 2  # the absurd slot counts are left out (1 each)
    assert "exploration_slots" not in status["services"]["actor"]["instances"][0]["gauges"]
    assert "env_steps_total" not in status["services"]["actor"]["totals"]
    assert service.faults.counts["telemetry:bad_value"] == service.registry.received >= 4
    text = client.get("/metrics").text
    assert "exploration_slots" not in text and 'flywheel_actor_epsilon_max{service="actor",instance="a-0"} 0.4' in text
    assert f'socket="telemetry",fault="bad_value"}} {service.registry.received}' in text
    lines = [r.getMessage() for r in caplog.records if "bad_value" in r.getMessage()]
    assert len(lines) == 1 and "exploration_slots" in lines[0], lines
    for r in reporters:
        r.close()


def test_values_are_kept_dropped_or_held_at_ingestion() -> None:
    """NaN gauges are kept ("no value yet", as a learner's loss before its first update); infinities, values
    beyond 2**53 and NaN counters are dropped; a counter whose report is dropped keeps its last value, so the
    totals neither fall nor count twice."""
    reg = Registry()
    reg.update(tel("learner", "l-0", 1, counters={"updates_total": 10.0}, gauges={"loss": 0.5}))
    assert reg.last_bad_values == []
    state = reg.update(tel("learner", "l-0", 2, counters={"updates_total": INF, "ok_total": 2**53},
                           gauges={"loss": NAN, "q_mean": -1e308, "lr": 1e-4, "big": 2.0**60}))
    assert state.counters == {"updates_total": 10.0, "ok_total": 2.0**53}
    assert math.isnan(state.gauges["loss"]) and state.gauges["lr"] == 1e-4 and set(state.gauges) == {"loss", "lr"}
    assert sorted(k for k, _ in reg.last_bad_values) == ["big", "q_mean", "updates_total"]
    reg.update(tel("learner", "l-0", 3, counters={"updates_total": 12.0}))
    assert reg.totals("learner")["updates_total"] == 12.0  # no restart was taken from the dropped value


def test_a_clip_with_infinite_numbers_is_refused(gateway, zctx) -> None:
    client, service = gateway
    push = zctx.socket(zmq.PUSH)
    push.connect(service.endpoints["telemetry"])
    base = dict(instance="actor-0", clip=1, index=0, count=1, total_bytes=10, weight_version=3, env_id="x",
                fps=30.0, frames=2, episode_return=1.0, length=1, progress=-1.0, success=False, time=time.time())
    bad = [dict(base, episode_return=INF), dict(base, fps=-INF, clip=2), dict(base, time=INF, clip=3),
           dict(base, episode_return=HUGE, clip=4), dict(base, progress=HUGE, clip=5)]
    for fields in bad:
        push.send_multipart(proto.encode(proto.ClipChunk(**fields, data=np.zeros(10, np.uint8))))
    wait_for(lambda: service.faults.counts["telemetry:clip_value"] == 5, what="5 clips refused")
    assert service.clips.newest is None and client.get("/clip").status_code == 404
    push.send_multipart(proto.encode(proto.ClipChunk(**base, data=np.zeros(10, np.uint8))))
    wait_for(lambda: service.clips.newest is not None, what="a good clip")
    assert client.get("/clip").json()["episode_return"] == 1.0
    get_all(client)
    push.close(0)


values = st.one_of(st.sampled_from(HOSTILE), st.floats(), st.integers(-(2**63), 2**64 - 1).map(float))
odd_text = st.text(max_size=40)
reports = st.lists(st.tuples(
    st.sampled_from(["actor", "learner", "replay"]), st.sampled_from(["i-0", "i-1", "odd \"\\ {}=é", "bad\n"]),
    st.integers(0, 2**63 - 1), st.floats(allow_nan=False),
    st.dictionaries(st.sampled_from(COUNTERS), values, max_size=4),
    st.dictionaries(st.sampled_from(GAUGES), values, max_size=8),
    st.dictionaries(st.one_of(st.sampled_from(["version", "env_id", "device"]), odd_text), odd_text, max_size=4),
), min_size=1, max_size=4)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=reports)
def test_any_telemetry_values_keep_every_view_up(gateway, zctx, tmp_path_factory, batch) -> None:
    client, service = gateway
    push = zctx.socket(zmq.PUSH)
    push.connect(service.endpoints["telemetry"])
    try:
        seen = service.registry.received + service.faults.total
        for svc, instance, seq, sent, counters, gauges, info in batch:
            push.send_multipart(proto.encode(proto.Telemetry(svc, instance, seq, sent, counters, gauges, info)))
        wait_for(lambda: service.registry.received + service.faults.total >= seen + len(batch), what="the batch")
        service.sweep(wall=time.time() + 1e6)  # a learning-curve point from these values now
        status = get_all(client)
        for entry in status["services"].values():
            for inst in entry["instances"]:
                for value in (*inst["gauges"].values(), *inst["counters"].values()):
                    assert abs(value) <= MAX_ABS_VALUE
        with Curves(tmp_path_factory.mktemp("curves")) as curves:  # what the gateway's curves writer does
            curves.record_status(1.0, status)
    finally:
        push.close(0)


@pytest.mark.system  # starts a browser / promtool
def test_the_live_page_renders_hostile_telemetry(tmp_path: Path) -> None:
    proc, url, telemetry = start_gateway(gateway_env(FLYWHEEL_GATEWAY_HISTORY_INTERVAL_S="0.1"), tmp_path / "gw.log")
    ctx = zmq.Context()
    try:
        wait_for(lambda: proc.poll() is None and http_get(url + "/healthz", timeout=1)[0] == 200, timeout=30,
                 what="the gateway")
        reporters = [TelemetryReporter(ctx, telemetry, "actor", f"actor-{i}") for i in range(2)]
        learner = TelemetryReporter(ctx, telemetry, "learner", "learner-0")

        def send() -> bool:
            for r in reporters:
                r.send({"env_steps_total": HUGE, "episodes_total": 3.0},
                       {"exploration_slots": HUGE, "epsilon": 0.25, "weight_version": -HUGE,
                        "episode_return_mean": 12.5, "eval_return_mean": INF, "episode_progress_mean": 40.0,
                        "episode_progress_max": HUGE, "episode_success_rate": -INF},
                       {"env_id": "</td><script>", "progress_label": LABEL, "success_label": "</b>" * 60})
            learner.send({"updates_total": 1e308}, {"weight_version": HUGE, "loss": NAN})
            return len(json.loads(http_get(url + "/history")[1])["points"]) >= 3

        wait_for(send, timeout=20, what="three curve points")
        assert http_get(url + "/status")[0] == 200
        page = rendered(tmp_path, url + "/")  # the page's error line is empty: every poll succeeded
        assert page.by_id["episode_return_mean"] == "12.5" and page.by_id["weight_version"] == "-"
        assert {r[5] for r in page.rows if r[0] == "actor"} == {"0.2500"}
        # an env's labels are text, never markup: shown as sent, the values out of range left out
        assert page.by_id["progress_title"] == LABEL + " mean" and page.by_id["progress_mean"] == "40"
        assert page.by_id["progress_max"] == "-" and page.by_id["success_rate"] == "-"
        assert page.by_id["success_title"] == "</b>" * 60 + " rate"
        for r in (*reporters, learner):
            r.close()
    finally:
        ctx.destroy(linger=0)
        proc.terminate()
        proc.wait(timeout=15)
    assert "Traceback" not in (tmp_path / "gw.log").read_text()


@pytest.mark.system  # starts a browser / promtool
def test_promtool_accepts_metrics_with_hostile_values_and_info(gateway, zctx) -> None:
    client, service = gateway
    push = zctx.socket(zmq.PUSH)
    push.connect(service.endpoints["telemetry"])
    info = {"version": "1\r\n\"x\"\\ \t\x00\x7f \u2028 \U0001f600", "device": "", "Weird_Key": "a" * 250}
    for i, value in enumerate(HOSTILE):
        push.send_multipart(proto.encode(tel("replay", f"r-{i}", counters={"samples_total": value},
                                             gauges={"size_transitions": value, "loss": value}, info=info)))
    wait_for(lambda: service.registry.received == len(HOSTILE), what="every report")
    get_all(client)
    done = promtool("check", "metrics", stdin=client.get("/metrics").text)
    assert done.returncode == 0 and not done.stdout.strip() and not done.stderr.strip(), done.stdout + done.stderr
    push.close(0)
