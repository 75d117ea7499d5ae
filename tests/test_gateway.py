"""Gateway: telemetry to /metrics and /status, token-protected control, exploration leases, bad input."""

from __future__ import annotations

import re
import socket
import time

import msgpack
import pytest
import zmq
from fastapi.testclient import TestClient

from flywheel import proto
from flywheel.services.actor.nstep import apex_epsilon
from flywheel.services.actor.transport import LeaseClient
from flywheel.services.gateway.__main__ import main as gateway_main
from flywheel.services.gateway.app import GatewayService, create_app
from flywheel.services.gateway.control import COMMANDS, CommandError, ControlBook
from flywheel.services.gateway.lease import LeaseFull, LeaseTable
from flywheel.services.gateway.metrics import (
    CapacityExceeded,
    MetricsWriter,
    Registry,
    TelemetryRejected,
    format_value,
    parse_key,
    render_instances,
)
from flywheel.services.gateway.settings import GatewaySettings
from flywheel.transport import ControlSubscriber, FaultCounter, TelemetryReporter

TOKEN = "test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}

_SAMPLE = re.compile(
    r'^[a-zA-Z_:][a-zA-Z0-9_:]*(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\\n]|\\["\\n])*",?)*\})? '
    r"(-?[0-9.e+-]+|NaN|[+-]Inf)$"
)


def check_exposition(text: str) -> dict[str, str]:
    """Strict check of Prometheus text format 0.0.4; returns {family: type}."""
    assert text.endswith("\n")
    types: dict[str, str] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("# HELP "):
            continue
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            assert name not in types, f"family {name} declared twice"
            assert kind in ("counter", "gauge")
            types[name], current = kind, name
            continue
        assert _SAMPLE.match(line), f"bad sample line {line!r}"
        assert line.split("{")[0].split(" ")[0] == current, f"sample outside its family: {line!r}"
    return types


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def tel(service="actor", instance="a-0", seq=1, counters=None, gauges=None, info=None) -> proto.Telemetry:
    return proto.Telemetry(service, instance, seq, time.time(), counters or {}, gauges or {}, info or {})


# -- metrics ---------------------------------------------------------------------------------------------------------


def test_parse_key_plain_and_labelled() -> None:
    assert parse_key("env_steps") == ("env_steps", ())
    assert parse_key("policy_lag_versions{actor=a-1}") == ("policy_lag_versions", (("actor", "a-1"),))
    assert parse_key('faults{where="control",fault=malformed}') == (
        "faults", (("fault", "malformed"), ("where", "control")))
    for bad in ("1abc", "a b", "x{instance=y}", "x{a=1,a=2}", "x{=1}", "x{a=1", "x{__name__=y}", ""):
        assert parse_key(bad) is None, bad


def test_format_value() -> None:
    assert format_value(3.0) == "3"
    assert format_value(0.25) == "0.25"
    assert format_value(float("nan")) == "NaN"
    assert format_value(float("inf")) == "+Inf"
    assert format_value(float("-inf")) == "-Inf"
    assert format_value(1e300) == "1e+300"


def test_registry_render_is_valid_prometheus_text() -> None:
    clock = FakeClock()
    reg = Registry(stale_after_s=5, forget_after_s=60, clock=clock)
    reg.update(tel("actor", "a-0", counters={"env_steps": 10, "episodes_total": 2},
                   gauges={"epsilon": 0.4, "bad key": 1, "lag{actor=a-0}": 3}, info={"env": 'Sna"ke\n'}))
    reg.update(tel("actor", "a-1", counters={"env_steps": 5}, gauges={"epsilon": float("nan")}))
    reg.update(tel("learner", "l-0", counters={"updates": 7}, gauges={"loss": 0.5}))
    w = MetricsWriter()
    render_instances(reg, w, clock())
    text = w.text()
    types = check_exposition(text)
    assert types["flywheel_actor_env_steps_total"] == "counter"
    assert types["flywheel_actor_episodes_total"] == "counter"  # no doubled _total
    assert types["flywheel_actor_epsilon"] == "gauge"
    assert 'flywheel_actor_env_steps_total{service="actor",instance="a-0"} 10' in text
    assert 'flywheel_actor_lag{service="actor",instance="a-0",actor="a-0"} 3' in text
    assert 'flywheel_actor_info{service="actor",instance="a-0",env="Sna\\"ke\\n"} 1' in text
    assert 'flywheel_actor_epsilon{service="actor",instance="a-1"} NaN' in text
    assert 'flywheel_learner_updates_total{service="learner",instance="l-0"} 7' in text
    assert "bad key" not in text and reg.bad_keys == 1


def test_registry_marks_silent_instances_down_then_forgets_them() -> None:
    clock = FakeClock()
    reg = Registry(stale_after_s=5, forget_after_s=60, clock=clock)
    reg.update(tel(instance="a-0"))
    clock.t += 6
    reg.update(tel(instance="a-1"))
    w = MetricsWriter()
    render_instances(reg, w, clock())
    assert 'flywheel_up{service="actor",instance="a-0"} 0' in w.text()
    assert 'flywheel_up{service="actor",instance="a-1"} 1' in w.text()
    clock.t += 58
    assert reg.forget_old() == 1
    assert list(reg.instances) == [("actor", "a-1")]


def test_registry_restart_and_bad_telemetry() -> None:
    reg = Registry(max_instances=2, clock=FakeClock())
    reg.update(tel(seq=5, counters={"env_steps": 100}))
    state = reg.update(tel(seq=1, counters={"env_steps": 3}))  # same name, fresh process
    assert state.restarts == 1 and state.counters == {"env_steps": 3}
    with pytest.raises(TelemetryRejected):
        reg.update(tel(service="Bad-Name"))
    with pytest.raises(TelemetryRejected):
        reg.update(tel(instance="a\nb"))
    reg.update(tel(instance="a-1"))
    with pytest.raises(CapacityExceeded):
        reg.update(tel(instance="a-2"))
    assert len(reg.instances) == 2


def test_type_conflicts_are_skipped_not_duplicated() -> None:
    reg = Registry(clock=FakeClock())
    reg.update(tel(instance="a-0", gauges={"x_total": 1}))
    reg.update(tel(instance="a-1", counters={"x": 2}))
    w = MetricsWriter()
    render_instances(reg, w, reg.clock())
    check_exposition(w.text())
    assert w.conflicts == 1


# -- control ---------------------------------------------------------------------------------------------------------


def test_control_book_retains_state_commands_and_supersedes() -> None:
    clock = FakeClock()
    book = ControlBook(one_shot_repeat_s=5, clock=clock)
    a = book.issue("pause", "actor")
    b = book.issue("set_lr", None, {"lr": 1e-4})
    assert b.seq > a.seq and b.target == "learner"
    c = book.issue("checkpoint")
    assert [m.seq for m in book.to_repeat()] == [a.seq, b.seq, c.seq]
    d = book.issue("resume")  # '*' replaces every run_state command
    assert [m.command for m in book.to_repeat()] == ["set_lr", "checkpoint", "resume"]
    clock.t += 6  # the one-shot window has passed
    assert [m.seq for m in book.to_repeat()] == [b.seq, d.seq]
    e = book.issue("set_lr", "learner", {"lr": 3e-4})
    assert [m.seq for m in book.to_repeat()] == [d.seq, e.seq]


def test_control_book_seq_survives_a_gateway_restart() -> None:
    first = ControlBook().issue("pause")
    second = ControlBook().issue("pause")
    assert second.seq > first.seq


@pytest.mark.parametrize(("command", "args"), [
    ("pause", {"x": 1}),
    ("set_lr", {}),
    ("set_lr", {"lr": 0}),
    ("set_lr", {"lr": float("inf")}),
    ("set_lr", {"lr": "0.1"}),
    ("set_lr", {"lr": True}),
    ("set_exploration", {}),
    ("set_exploration", {"epsilon": 1.5}),
    ("set_exploration", {"epsilon": 0.1, "base": 0.4}),
    ("set_exploration", {"gamma": 1}),
    ("checkpoint", {"tag": "../etc"}),
    ("launch", {}),
])
def test_control_book_refuses_bad_commands(command: str, args: dict) -> None:
    book = ControlBook()
    with pytest.raises(CommandError):
        book.issue(command, None, args)
    assert not book.retained and not book.history


def test_every_command_encodes() -> None:
    book = ControlBook()
    examples = {"set_exploration": {"base": 0.5, "alpha": 7}, "set_lr": {"lr": 1e-3}, "checkpoint": {"tag": "t1"}}
    for name in COMMANDS:
        msg = book.issue(name, None, examples.get(name, {}))
        assert proto.decode(proto.encode(msg)) == msg


# -- leases ----------------------------------------------------------------------------------------------------------


def test_apex_epsilon() -> None:
    assert apex_epsilon(0, 1) == 0.4
    assert apex_epsilon(0, 8) == pytest.approx(0.4)
    assert apex_epsilon(7, 8) == pytest.approx(0.4 ** 8)
    assert apex_epsilon(0, 2, base=0.5, alpha=1) == 0.5


def test_lease_table_stays_dense_as_actors_come_and_go() -> None:
    clock = FakeClock()
    table = LeaseTable(ttl_s=10, clock=clock)
    replies = [table.handle(proto.LeaseRequest(f"a{i}")) for i in range(4)]
    assert [(r.index, r.count) for r in replies] == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert table.handle(proto.LeaseRequest("a1")).index == 1  # renewal keeps the slot
    table.handle(proto.LeaseRequest("a1", release=True))
    assert table.index_of("a3") == 1 and len(table) == 3  # the last slot fills the hole
    assert table.handle(proto.LeaseRequest("a3")) == proto.LeaseReply("a3", 1, 3, 10.0)
    clock.t += 5
    table.handle(proto.LeaseRequest("a0"))
    table.handle(proto.LeaseRequest("a3"))
    clock.t += 6  # a2 went silent
    reply = table.handle(proto.LeaseRequest("a5"))
    assert (reply.index, reply.count) == (2, 3) and table.expired == 1
    assert sorted(table.slots) == ["a0", "a3", "a5"]
    assert {table.index_of(n) for n in table.slots} == {0, 1, 2}


def test_lease_table_release_of_unknown_and_capacity() -> None:
    table = LeaseTable(max_leases=1)
    assert table.handle(proto.LeaseRequest("nobody", release=True)).count == 0
    table.handle(proto.LeaseRequest("a"))
    with pytest.raises(LeaseFull):
        table.handle(proto.LeaseRequest("b"))


# -- the running service ---------------------------------------------------------------------------------------------


@pytest.fixture
def gateway():
    settings = GatewaySettings(
        instance="gw-test", telemetry_endpoint="tcp://127.0.0.1:*", control_endpoint="tcp://127.0.0.1:*",
        lease_endpoint="tcp://127.0.0.1:*", control_token=TOKEN, control_repeat_s=0.05, stale_after_s=30,
    )
    service = GatewayService(settings)
    with TestClient(create_app(settings, service)) as client:
        yield client, service
    assert service.telemetry_sock is None  # the lifespan closed the sockets


@pytest.fixture
def zctx():
    ctx = zmq.Context()
    yield ctx
    ctx.destroy(linger=0)


def wait_for(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.02)
    raise AssertionError("condition not met in time")


def test_telemetry_shows_in_metrics_and_status(gateway, zctx) -> None:
    client, service = gateway
    reporters = [TelemetryReporter(zctx, service.endpoints["telemetry"], "actor", f"a-{i}") for i in range(2)]
    learner = TelemetryReporter(zctx, service.endpoints["telemetry"], "learner", "l-0")

    def send_all() -> bool:
        for i, r in enumerate(reporters):
            r.send({"env_steps": 100 * (i + 1)}, {"epsilon": 0.4 / (i + 1)}, {"env": "snake"})
        learner.send({"updates": 9}, {"loss": 0.25, "policy_lag_versions{actor=a-0}": 2})
        return service.registry.received >= 3 and len(service.registry.instances) == 3

    wait_for(send_all)
    assert client.get("/healthz").json()["ok"] is True
    resp = client.get("/metrics")
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/plain; version=0.0.4")
    types = check_exposition(resp.text)
    assert 'flywheel_actor_env_steps_total{service="actor",instance="a-1"} 200' in resp.text
    assert 'flywheel_learner_policy_lag_versions{service="learner",instance="l-0",actor="a-0"} 2' in resp.text
    assert types["flywheel_gateway_telemetry_received_total"] == "counter"
    status = client.get("/status").json()
    assert status["services"]["actor"]["up"] == 2
    assert status["services"]["actor"]["totals"]["env_steps"] == 300
    assert status["services"]["learner"]["instances"][0]["gauges"]["loss"] == 0.25
    assert status["gateway"]["control_enabled"] is True
    for r in [*reporters, learner]:
        r.close()


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
    wait_for(lambda: service.registry.received == 1 and service.faults.total == 5)
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
    assert client.post("/control/pause").status_code == 401
    assert client.post("/control/pause", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.post("/control/pause", headers={"Authorization": TOKEN}).status_code == 401
    assert client.post("/control/launch", headers=AUTH).status_code == 404
    r = client.post("/control/set_lr", headers=AUTH, json={"lr": -1})
    assert r.status_code == 422 and "lr must be" in r.json()["error"]
    assert client.post("/control/set_lr", headers=AUTH, content=b"{not json").status_code == 400
    assert client.post("/control/set_lr", headers=AUTH, json=[1]).status_code == 400
    assert client.post("/control/pause", headers=AUTH, params={"target": ""}).status_code == 422
    assert client.post("/control/pause", headers=AUTH, content=b"x" * 20000).status_code == 413
    assert not service.control.history


def test_control_reaches_subscribers_including_late_joiners(gateway, zctx) -> None:
    client, service = gateway
    r = client.post("/control/pause", headers=AUTH)
    assert r.status_code == 202
    pause_seq = r.json()["seq"]
    r = client.post("/control/set_exploration", headers=AUTH, json={"epsilon": 0.05}, params={"target": "a-0"})
    assert r.json()["target"] == "a-0"
    client.post("/control/set_lr", headers=AUTH, json={"lr": 0.001})
    # Subscribers that join after the commands were sent still get the retained state, once each.
    actor = ControlSubscriber(zctx, service.endpoints["control"], "actor", "a-0", FaultCounter("actor"))
    other = ControlSubscriber(zctx, service.endpoints["control"], "actor", "a-1", FaultCounter("actor"))
    got: list[proto.Control] = []
    wait_for(lambda: got.extend(actor.drain()) or len(got) >= 2)
    time.sleep(0.2)
    got.extend(actor.drain())
    assert [(c.command, c.args) for c in got] == [("pause", {}), ("set_exploration", {"epsilon": 0.05})]
    assert got[0].seq == pause_seq
    other_got: list[proto.Control] = []
    wait_for(lambda: other_got.extend(other.drain()) or other_got)
    assert [c.command for c in other_got] == ["pause"]  # set_exploration was for a-0 only
    client.post("/control/resume", headers=AUTH)
    wait_for(lambda: any(c.command == "resume" for c in actor.drain()))
    state = client.get("/control").json()
    assert [c["command"] for c in state["retained"]] == ["set_exploration", "set_lr", "resume"]
    assert "flywheel_gateway_control_commands_total" in client.get("/metrics").text


def test_control_disabled_without_token(zctx) -> None:
    settings = GatewaySettings(telemetry_endpoint="tcp://127.0.0.1:*", control_endpoint="tcp://127.0.0.1:*",
                               lease_endpoint="tcp://127.0.0.1:*")
    with TestClient(create_app(settings)) as client:
        r = client.post("/control/pause", headers={"Authorization": "Bearer "})
        assert r.status_code == 403 and "FLYWHEEL_GATEWAY_CONTROL_TOKEN" in r.json()["error"]


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


def test_lease_client_keeps_acting_without_gateway(zctx) -> None:
    client = LeaseClient(zctx, "tcp://127.0.0.1:1", "lonely", FaultCounter("actor"))
    started = time.monotonic()
    assert not client.wait_first(0.3)
    assert time.monotonic() - started < 2 and (client.index, client.count) == (0, 1)
    client.close()


# -- the command line ------------------------------------------------------------------------------------------------


def test_main_refuses_a_bad_setting(capsys) -> None:
    assert gateway_main(["--http-port", "99999"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--http-port" in err and "FLYWHEEL_GATEWAY_HTTP_PORT" in err


def test_main_reports_a_busy_port_in_one_line(capsys) -> None:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    port = holder.getsockname()[1]
    try:
        assert gateway_main(["--http-port", str(port), "--telemetry-endpoint", "tcp://127.0.0.1:*"]) == 2
    finally:
        holder.close()
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--http-port" in err and str(port) in err


def test_main_reports_a_busy_zmq_endpoint(capsys, zctx) -> None:
    holder = zctx.socket(zmq.PULL)
    port = holder.bind_to_random_port("tcp://127.0.0.1")
    assert gateway_main(["--http-port", "0", "--telemetry-endpoint", f"tcp://127.0.0.1:{port}"]) == 2
    err = capsys.readouterr().err.strip()
    assert "FLYWHEEL_GATEWAY_TELEMETRY_ENDPOINT" in err and "already in use" in err
    holder.close(0)
