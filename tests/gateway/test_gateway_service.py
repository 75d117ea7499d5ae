"""The running gateway over real ZeroMQ sockets: telemetry, staleness, control to late joiners, leases, HTTP errors."""

from __future__ import annotations

import logging
import time
from typing import Any

import msgpack
import numpy as np
import pytest
import zmq
from conftest import gateway_settings
from fastapi.testclient import TestClient
from gateway_helpers import AUTH, TOKEN, check_exposition, tel, wait_for

from flywheel import __version__, proto
from flywheel.services.actor.transport import LeaseClient
from flywheel.services.gateway.app import GatewayService, create_app
from flywheel.services.gateway.auth import StartupError
from flywheel.services.gateway.settings import GatewaySettings
from flywheel.transport import ControlSubscriber, FaultCounter, TelemetryReporter


def test_defaults_mark_down_within_five_seconds() -> None:
    settings = GatewaySettings()
    assert settings.stale_after_s == 5 and settings.sweep_interval_s < 1 and settings.forget_after_s == 300


def test_telemetry_shows_in_metrics_and_status(gateway, zctx) -> None:
    client, service = gateway
    reporters = [TelemetryReporter(zctx, service.endpoints["telemetry"], "actor", f"a-{i}") for i in range(2)]
    learner = TelemetryReporter(zctx, service.endpoints["telemetry"], "learner", "l-0")

    def send_all() -> bool:
        for i, r in enumerate(reporters):
            r.send({"env_steps_total": 100 * (i + 1) * r.seq},
                   {"epsilon": 0.4 / (i + 1), "epsilon_min": 0.01 / (i + 1), "epsilon_max": 0.4 / (i + 1),
                    "exploration_slots": 4, "weight_version": 3}, {"env": "snake"})
        learner.send({"updates": 9}, {"loss": 0.25, "weight_version": 5, "policy_lag_versions{actor=a-0}": 2})
        return service.registry.received >= 9 and len(service.registry.instances) == 3

    wait_for(send_all, what="telemetry from three instances")
    assert client.get("/healthz").json() == {"ok": True, "detail": "ok"}
    resp = client.get("/metrics")
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain; version=0.0.4")
    types = check_exposition(resp.text)
    assert 'flywheel_learner_policy_lag_versions{service="learner",instance="l-0",actor="a-0"} 2' in resp.text
    assert types["flywheel_gateway_telemetry_received_total"] == "counter"
    # every service reports its process's CPU and memory through TelemetryReporter, and its version
    assert types["flywheel_actor_process_cpu_seconds_total"] == "counter"
    assert types["flywheel_learner_process_resident_memory_bytes"] == "gauge"
    assert f'flywheel_actor_info{{service="actor",instance="a-0",env="snake",version="{__version__}"}} 1' in resp.text
    assert types["flywheel_gateway_process_cpu_seconds_total"] == "counter"
    status = client.get("/status").json()
    actors = status["services"]["actor"]
    assert actors["up"] == 2 and actors["totals"]["env_steps_total"] > 0
    a1 = next(i for i in actors["instances"] if i["instance"] == "a-1")
    assert a1["role"] == "actor" and a1["version"] == __version__ and a1["up"] is True
    assert a1["last_report"]["seq"] == reporters[1].seq and a1["age_s"] < 5
    assert a1["rates"]["env_steps_total"] > 0  # counters grew between reports
    assert status["services"]["learner"]["instances"][0]["gauges"]["loss"] == 0.25
    assert status["summary"]["weight_version"] == 5
    assert status["summary"]["policy_lag_versions"] == {"max": 2, "mean": 2}
    assert status["summary"]["epsilon"] == {"a-0": 0.4, "a-1": 0.2}
    spread = status["summary"]["exploration"]  # Ape-X over every env slot of every actor
    assert (spread["slots"], spread["min"], spread["max"]) == (8, 0.005, 0.4)
    assert spread["actors"]["a-1"] == {"min": 0.005, "max": 0.2, "slots": 4}
    assert status["gateway"]["control_enabled"] is True
    for r in [*reporters, learner]:
        r.close()


def test_status_shows_the_envs_measures_under_its_own_labels(gateway, zctx, caplog) -> None:
    """An env's progress and success measures: level-start and restarted episodes apart, named as the actors' and
    the learner's telemetry info name them; a clip's measures under those labels in the log and in /clip."""
    client, service = gateway
    caplog.set_level(logging.INFO, logger="flywheel.gateway")
    endpoint = service.endpoints["telemetry"]
    actors = [TelemetryReporter(zctx, endpoint, "actor", f"a-{i}") for i in range(2)]
    learner = TelemetryReporter(zctx, endpoint, "learner", "l-0")
    labels = {"progress_label": "cells visited", "success_label": "goal"}
    assert client.get("/status").json()["summary"]["progress_label"] is None  # no actor yet: no measures

    def send_all() -> bool:
        actors[0].send({}, {"episode_progress_mean": 6.0, "episode_progress_max": 9.0, "episode_success_rate": 0.25,
                            "restarted_progress_mean": 11.0, "restarted_success_rate": 0.5}, labels)
        actors[1].send({}, {"episode_progress_mean": 8.0, "episode_progress_max": 12.0,
                            "episode_success_rate": 0.75}, labels)
        learner.send({}, {"eval_success_rate": 0.5, "eval_progress_mean": 7.5},
                     {"eval_progress_label": "cells visited", "eval_success_label": "goal"})
        return service.registry.received >= 6 and len(service.registry.instances) == 3

    wait_for(send_all, what="telemetry from two actors and a learner")
    summary = client.get("/status").json()["summary"]
    assert {k: summary[k] for k in ("progress_mean", "progress_max", "success_rate", "restarted_progress_mean",
                                    "restarted_success_rate", "progress_label", "success_label")} == {
        "progress_mean": 7.0, "progress_max": 12.0, "success_rate": 0.5, "restarted_progress_mean": 11.0,
        "restarted_success_rate": 0.5, "progress_label": "cells visited", "success_label": "goal"}
    assert (summary["eval_success_rate"], summary["eval_progress_mean"], summary["eval_success_label"],
            summary["eval_progress_label"]) == (0.5, 7.5, "goal", "cells visited")

    def both_charted() -> dict[str, Any] | None:  # a curve point taken after both actors reported
        points = client.get("/history").json()["points"]
        last = points[-1] if points else {}
        return last if last.get("progress_max") == 12.0 and last.get("restarted_progress_mean") is not None else None

    point = wait_for(both_charted, what="a curve point of both actors")
    assert (point["progress_mean"], point["success_rate"], point["restarted_progress_mean"]) == (7.0, 0.5, 11.0)

    push = zctx.socket(zmq.PUSH)
    push.connect(endpoint)
    push.send_multipart(proto.encode(proto.ClipChunk(
        instance="a-0", clip=1, index=0, count=1, total_bytes=10, weight_version=3, env_id="measured:Grid-v0",
        fps=30.0, frames=2, episode_return=1.0, length=1, progress=14.0, success=True, time=time.time(),
        data=np.zeros(10, np.uint8))))
    wait_for(lambda: service.clips.newest is not None, what="the clip")
    clip = client.get("/clip").json()
    assert (clip["progress"], clip["success"]) == (14.0, True)
    assert any(r.getMessage() == "clip from a-0: weights v3, 2 frames, return 1.0, cells visited 14, goal (0 KiB)"
               for r in caplog.records), [r.getMessage() for r in caplog.records]
    push.close(0)
    for r in [*actors, learner]:
        r.close()


def test_keys_left_out_of_metrics_are_named_in_status_and_logged_once(gateway, zctx, caplog) -> None:
    client, service = gateway
    caplog.set_level(logging.WARNING, logger="flywheel.gateway")
    reporter = TelemetryReporter(zctx, service.endpoints["telemetry"], "actor", "a-lint")
    wait_for(lambda: reporter.send({}, {"lease_count": 3, "lease_index": 1}) or service.registry.received >= 3)
    invalid = client.get("/status").json()["gateway"]["invalid_metric_keys"]  # known before any scrape
    assert list(invalid) == ["actor:lease_count"] and "_count is reserved" in invalid["actor:lease_count"]
    text = client.get("/metrics").text
    assert "lease_count" not in text and 'flywheel_actor_lease_index{service="actor",instance="a-lint"} 1' in text
    assert 'flywheel_gateway_invalid_metric_keys{service="gateway",instance="gw-test"} 1' in text
    warnings = [r.getMessage() for r in caplog.records if "lease_count" in r.getMessage()]
    assert len(warnings) == 1 and "rename it in the actor service" in warnings[0]
    reporter.close()


def test_nan_gauges_do_not_break_status_json(gateway, zctx) -> None:
    client, service = gateway
    reporter = TelemetryReporter(zctx, service.endpoints["telemetry"], "actor", "a-nan")
    wait_for(lambda: reporter.send({}, {"episode_return_mean": float("nan"), "x": float("inf")})
             or service.registry.received)
    status = client.get("/status")
    assert status.status_code == 200
    gauges = status.json()["services"]["actor"]["instances"][0]["gauges"]
    assert "episode_return_mean" not in gauges and "x" not in gauges  # JSON has no NaN: left out
    assert 'flywheel_actor_episode_return_mean{service="actor",instance="a-nan"} NaN' in client.get("/metrics").text
    reporter.close()


def test_a_silent_instance_is_marked_down_by_the_sweep_and_logged(zctx, caplog) -> None:
    settings = gateway_settings(stale_after_s=0.3, forget_after_s=1.0)
    service = GatewayService(settings)
    caplog.set_level(logging.INFO, logger="flywheel.gateway")
    with TestClient(create_app(settings, service)) as client:
        reporter = TelemetryReporter(zctx, service.endpoints["telemetry"], "actor", "quiet-1")
        wait_for(lambda: reporter.send({}, {}) or service.registry.received, what="first report")
        assert 'flywheel_up{service="actor",instance="quiet-1"} 1' in client.get("/metrics").text
        wait_for(lambda: service.registry.went_down == 1, timeout=3, what="down by the sweep, without a scrape")
        assert 'flywheel_up{service="actor",instance="quiet-1"} 0' in client.get("/metrics").text
        assert client.get("/status").json()["services"]["actor"]["down"] == 1
        wait_for(lambda: not service.registry.instances, timeout=3, what="forgotten")
        assert "quiet-1" not in client.get("/metrics").text
        reporter.close()
    lines = [r.getMessage() for r in caplog.records if "quiet-1" in r.getMessage()]
    assert [line.split(" ")[2] for line in lines] == ["joined", "down", "forgotten"]


def test_bad_telemetry_is_counted_and_the_gateway_keeps_going(gateway, zctx) -> None:
    client, service = gateway
    push = zctx.socket(zmq.PUSH)
    push.connect(service.endpoints["telemetry"])
    good = proto.encode(tel(instance="ok"))
    wrong_kind = proto.encode(proto.LeaseRequest("x"))
    bad_version = [msgpack.packb({"k": "telemetry", "v": 99, "f": {}, "a": []})]
    bad_name = proto.encode(tel(service="NOT OK"))
    for frames in ([b"\xc1garbage"], wrong_kind, bad_version, bad_name, [good[0], b"extra"], good):
        push.send_multipart(frames)
    wait_for(lambda: service.registry.received == 1 and service.faults.total == 5, what="5 refused, 1 accepted")
    counts = service.faults.counts
    assert counts["telemetry:wrong_kind"] == 1 and counts["telemetry:version"] == 1
    assert counts["telemetry:malformed"] == 3
    text = client.get("/metrics").text
    check_exposition(text)
    assert 'flywheel_gateway_messages_rejected_total{service="gateway",instance="gw-test",socket="telemetry",' \
           'fault="malformed"} 3' in text
    assert client.get("/healthz").status_code == 200
    push.close(0)


def test_control_requires_token_and_valid_commands(gateway) -> None:
    client, service = gateway
    r = client.post("/control/pause")
    assert r.status_code == 401 and r.headers["www-authenticate"].startswith("Bearer") and r.json()["error"]
    assert client.post("/control/pause", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.post("/control/pause", headers={"Authorization": TOKEN}).status_code == 401
    assert client.post("/control/launch").status_code == 401  # no probing of names without the token
    r = client.post("/control/launch", headers=AUTH)
    assert r.status_code == 404 and "set_lr" in r.json()["error"]
    r = client.post("/control/set_lr", headers=AUTH, json={"lr": -1})
    assert r.status_code == 422 and "lr must be" in r.json()["error"]
    assert client.post("/control/set_lr", headers=AUTH, content=b"{not json").status_code == 400
    assert client.post("/control/set_lr", headers=AUTH, json=[1]).status_code == 400
    assert client.post("/control/set_lr", headers=AUTH, content=b"[" * 100_000).status_code == 413
    assert client.post("/control/set_lr", headers=AUTH, content=b"[" * 60_000).status_code == 400  # deep nesting
    r = client.post("/control/pause", headers=AUTH, params={"target": ""})
    assert r.status_code == 422 and "target" in r.json()["error"]
    r = client.post("/control/pause", headers=AUTH, params={"targt": "a-0"})
    assert r.status_code == 422 and "targt" in r.json()["error"]
    r = client.post("/control/pause", headers={**AUTH, "X-Flywheel-Operator": "\x01bad"})
    assert r.status_code == 422
    r = client.post("/control/pause", headers=AUTH, content=b"x" * (64 * 1024 + 1))
    assert r.status_code == 413 and "limit" in r.json()["error"]
    assert client.get("/history", params={"since": "yesterday"}).status_code == 422
    assert client.get("/nothing-here").status_code == 404
    assert not service.control.history
    assert service.auth.failures == 4
    text = client.get("/metrics").text
    assert 'flywheel_gateway_http_rejected_total{service="gateway",instance="gw-test",route="/control/pause",' \
           'status="401"} 3' in text
    assert 'flywheel_gateway_control_auth_failures_total{service="gateway",instance="gw-test"} 4' in text


def test_accepted_commands_are_logged_with_who_sent_them(gateway, caplog) -> None:
    client, service = gateway
    caplog.set_level(logging.INFO, logger="flywheel.gateway")
    r = client.post("/control/set_replay_ratio", headers={**AUTH, "X-Flywheel-Operator": "alice"},
                    content=b'{"samples_per_insert": 4}')  # curl -d sends a form content type: still JSON
    assert r.status_code == 202 and r.json()["target"] == "replay"
    line = next(r.getMessage() for r in caplog.records if "set_replay_ratio" in r.getMessage())
    assert "operator=alice" in line and "client=testclient" in line and "token=sha256:" in line
    assert TOKEN not in line
    assert service.control.state()["recent"][-1]["by"]["operator"] == "alice"


def test_control_reaches_subscribers_including_late_joiners(gateway, zctx) -> None:
    client, service = gateway
    r = client.post("/control/pause", headers=AUTH)
    assert r.status_code == 202
    pause_seq = r.json()["seq"]
    r = client.post("/control/set_exploration", headers=AUTH, json={"epsilon": 0.05}, params={"target": "a-0"})
    assert r.json()["target"] == "a-0"
    client.post("/control/set_lr", headers=AUTH, json={"lr": 0.001})
    client.post("/control/set_publish_interval", headers=AUTH, json={"updates": 25})
    # Subscribers that join after the commands were sent still get the retained state, once each.
    actor = ControlSubscriber(zctx, service.endpoints["control"], "actor", "a-0", FaultCounter("actor"))
    other = ControlSubscriber(zctx, service.endpoints["control"], "actor", "a-1", FaultCounter("actor"))
    learner = ControlSubscriber(zctx, service.endpoints["control"], "learner", "l-0", FaultCounter("learner"))
    got: list[proto.Command] = []
    wait_for(lambda: got.extend(actor.drain()) or len(got) >= 2)
    time.sleep(0.2)
    got.extend(actor.drain())
    assert [c.args for c in got] == [proto.PauseArgs(), proto.ExplorationArgs(epsilon=0.05)]  # typed, as sent
    assert got[0].seq == pause_seq and [c.target for c in got] == ["*", "a-0"]
    other_got: list[proto.Command] = []
    wait_for(lambda: other_got.extend(other.drain()) or other_got)
    assert [c.kind for c in other_got] == [proto.CommandKind.PAUSE]  # set_exploration was for a-0 only
    learner_got: list[proto.Command] = []
    wait_for(lambda: learner_got.extend(learner.drain()) or len(learner_got) >= 3)
    assert [c.args for c in learner_got] == [proto.PauseArgs(), proto.LrArgs(0.001),
                                             proto.PublishIntervalArgs(updates=25)]
    assert actor.rejected == other.rejected == learner.rejected == 0
    client.post("/control/resume", headers=AUTH)
    wait_for(lambda: any(c.kind == "resume" for c in actor.drain()))
    state = client.get("/control").json()
    assert [c["command"] for c in state["retained"]] == ["set_exploration", "set_lr", "set_publish_interval",
                                                         "resume"]
    assert 'command="set_lr"} 1' in client.get("/metrics").text
    for sub in (actor, other, learner):
        sub.close()


def test_control_off_without_token_on_loopback() -> None:
    settings = gateway_settings(control_token="")
    with TestClient(create_app(settings)) as client:
        r = client.post("/control/pause", headers={"Authorization": "Bearer "})
        assert r.status_code == 403 and "FLYWHEEL_GATEWAY_CONTROL_TOKEN" in r.json()["error"]
        assert client.get("/status").json()["gateway"]["control_enabled"] is False


def test_no_app_without_a_token_beyond_loopback() -> None:
    with pytest.raises(StartupError, match="CONTROL_TOKEN"):
        create_app(gateway_settings(control_token="", http_host="0.0.0.0"))


def test_leases_over_zmq_dealer_and_req(gateway, zctx) -> None:
    client, service = gateway
    endpoint = service.endpoints["lease"]
    faults = FaultCounter("actor")
    a = LeaseClient(zctx, endpoint, "a-0", faults)
    b = LeaseClient(zctx, endpoint, "a-1", faults)
    assert a.wait_first(5) and (a.index, a.count) == (0, 1)
    assert b.wait_first(5) and (b.index, b.count) == (1, 2)
    req = zctx.socket(zmq.REQ)
    req.connect(endpoint)
    req.send_multipart(proto.encode(proto.LeaseRequest("a-2")))
    assert req.poll(5000)
    assert proto.decode(req.recv_multipart()) == proto.LeaseReply("a-2", 2, 3, 10.0)
    a.release()
    a.close()

    def renewed_count() -> int:
        b.next_request = 0.0  # renew now rather than at ttl/3
        b.tick(time.monotonic())
        b.sock.poll(200)
        b.tick(time.monotonic())
        return b.count

    wait_for(lambda: renewed_count() == 2)
    status = client.get("/status").json()
    assert status["leases"]["count"] == 2 and sorted(status["leases"]["actors"]) == ["a-1", "a-2"]
    # garbage on the lease socket is counted, gets no reply, and the socket keeps serving
    dealer = zctx.socket(zmq.DEALER)
    dealer.connect(endpoint)
    dealer.send_multipart([b"\x00junk"])
    dealer.send_multipart(proto.encode(tel()))
    wait_for(lambda: service.faults.counts["lease:malformed"] == 1 and service.faults.counts["lease:wrong_kind"] == 1)
    assert renewed_count() == 2
    for s in (req, dealer):
        s.close(0)
    b.close()
    assert faults.total == 0


def test_fake_lease_holders_on_one_connection_leave_room_for_a_real_actor(gateway, zctx) -> None:
    client, service = gateway
    endpoint = service.endpoints["lease"]
    rogue = zctx.socket(zmq.DEALER)
    rogue.connect(endpoint)
    for i in range(1000):  # 1,000 invented actors asking from one connection
        rogue.send_multipart(proto.encode(proto.LeaseRequest(f"fake-{i}")))
    per_peer = service.settings.max_leases_per_peer
    replies = 0
    while rogue.poll(1000):
        rogue.recv_multipart()
        replies += 1
    assert replies == per_peer
    wait_for(lambda: service.faults.counts["lease:leases_per_peer"] == 1000 - per_peer)
    actor = LeaseClient(zctx, endpoint, "real-actor", FaultCounter("actor"))
    assert actor.wait_first(5) and (actor.index, actor.count) == (per_peer, per_peer + 1)
    assert client.get("/status").json()["leases"]["count"] == per_peer + 1
    actor.close()
    rogue.close(0)


def test_lease_client_keeps_acting_without_gateway(zctx) -> None:
    client = LeaseClient(zctx, "tcp://127.0.0.1:1", "lonely", FaultCounter("actor"))
    started = time.monotonic()
    assert not client.wait_first(0.3)
    assert time.monotonic() - started < 2 and (client.index, client.count) == (0, 1)
    client.close()


def test_history_grows_while_actors_report(gateway, zctx) -> None:
    client, service = gateway
    reporter = TelemetryReporter(zctx, service.endpoints["telemetry"], "actor", "a-0")
    for i in range(5):
        reporter.send({"env_steps_total": 100 * i, "episodes_total": i}, {"episode_return_mean": 10.0 + i})
        time.sleep(0.08)
    points = wait_for(lambda: len(client.get("/history").json()["points"]) >= 3 and client.get("/history").json()
                      ["points"], what="curve points")
    assert all(p["return_mean"] is not None for p in points)
    assert [p["t"] for p in points] == sorted(p["t"] for p in points)
    later = client.get("/history", params={"since": points[-2]["t"]}).json()["points"]
    assert later and later[0]["t"] > points[-2]["t"]
    reporter.close()
