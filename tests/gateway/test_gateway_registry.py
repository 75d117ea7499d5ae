"""Gateway core: telemetry registry, Prometheus rendering, staleness, rates, the learning curve (plain data)."""

from __future__ import annotations

import math

import pytest
from gateway_helpers import FakeClock, check_exposition, tel

from flywheel.services.gateway.exposition import MetricsWriter, format_value, render_instances, snapshot
from flywheel.services.gateway.history import LearningCurve, curve_point
from flywheel.services.gateway.metric_keys import name_problem, parse_key
from flywheel.services.gateway.metrics import CapacityExceeded, Registry, TelemetryRejected


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
    bad = render_instances(snapshot(reg, clock()), w)
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
    assert "bad key" not in text and bad == 1


def test_silent_instances_are_down_within_the_window_then_forgotten() -> None:
    clock = FakeClock()
    reg = Registry(stale_after_s=5, forget_after_s=60, clock=clock)
    reg.update(tel(instance="a-0"))
    reg.update(tel(instance="a-1"))
    assert [e[0] for e in reg.drain_events()] == ["joined", "joined"]
    clock.t += 4.9
    reg.update(tel(instance="a-1", seq=2))
    reg.sweep()
    assert reg.drain_events() == []  # 4.9 s of silence is not yet down
    clock.t += 0.2  # a-0 has been silent 5.1 s
    reg.sweep()
    events = reg.drain_events()
    assert [(e[0], e[1].instance) for e in events] == [("down", "a-0")] and reg.went_down == 1
    w = MetricsWriter()
    render_instances(snapshot(reg, clock()), w)
    assert 'flywheel_up{service="actor",instance="a-0"} 0' in w.text()
    assert 'flywheel_up{service="actor",instance="a-1"} 1' in w.text()
    reg.sweep()
    assert reg.drain_events() == []  # down is reported once
    reg.update(tel(instance="a-0", seq=2))
    assert [e[0] for e in reg.drain_events()] == ["back"]
    clock.t += 61
    reg.update(tel(instance="a-0", seq=3))
    reg.sweep()
    assert [(e[0], e[1].instance) for e in reg.drain_events()] == [("down", "a-1"), ("forgotten", "a-1")]
    assert list(reg.instances) == [("actor", "a-0")] and reg.forgotten == 1


def test_registry_restart_and_bad_telemetry() -> None:
    reg = Registry(max_instances=2, clock=FakeClock())
    reg.update(tel(seq=5, counters={"env_steps": 100}))
    state = reg.update(tel(seq=1, counters={"env_steps": 3}))  # same name, fresh process
    assert state.restarts == 1 and state.counters == {"env_steps": 3}
    assert [e[0] for e in reg.drain_events()] == ["joined", "restarted"]
    for bad in (tel(service="Bad-Name"), tel(instance="a\nb"), tel(instance=""), tel(instance="x" * 129),
                tel(service="")):
        with pytest.raises(TelemetryRejected):
            reg.update(bad)
    reg.update(tel(instance="a-1"))
    with pytest.raises(CapacityExceeded):
        reg.update(tel(instance="a-2"))
    assert len(reg.instances) == 2


def test_totals_never_drop_when_an_instance_restarts_goes_down_or_is_forgotten() -> None:
    clock = FakeClock()
    reg = Registry(stale_after_s=5, forget_after_s=60, clock=clock)
    reg.update(tel(instance="a-0", seq=1, counters={"env_steps_total": 900.0}))
    reg.update(tel(instance="a-1", seq=1, counters={"env_steps_total": 100.0}))
    assert reg.totals("actor") == {"env_steps_total": 1000.0}
    reg.update(tel(instance="a-0", seq=1, counters={"env_steps_total": 40.0}))  # kill -9, restarted by the supervisor
    assert reg.totals("actor") == {"env_steps_total": 1000.0}  # the drop is carried: never below what was seen
    reg.update(tel(instance="a-0", seq=2, counters={"env_steps_total": 140.0}))
    assert reg.totals("actor") == {"env_steps_total": 1100.0}  # and it grows with the new process
    learner = reg.update(tel(service="learner", instance="l-0", seq=9, counters={"updates_total": 5200.0}))
    reg.update(tel(service="learner", instance="l-0", seq=1, counters={"updates_total": 5000.0}))  # resumed
    assert reg.totals("learner") == {"updates_total": 5200.0} and learner.restarts == 1  # restored, not doubled
    clock.t += 30
    reg.update(tel(instance="a-0", seq=3, counters={"env_steps_total": 240.0}))
    reg.sweep()  # a-1 is down: its work still counts
    assert reg.totals("actor") == {"env_steps_total": 1200.0}
    clock.t += 40
    reg.update(tel(instance="a-0", seq=4, counters={"env_steps_total": 340.0}))
    reg.sweep()  # a-1 is forgotten: its work is kept as retired
    assert ("actor", "a-1") not in reg.instances and reg.totals("actor") == {"env_steps_total": 1300.0}


def test_rates_over_the_window_survive_restarts() -> None:
    clock = FakeClock()
    reg = Registry(clock=clock, rate_window_s=10)
    for i in range(30):
        state = reg.update(tel(seq=i + 1, counters={"env_steps_total": 100.0 * i, "episodes_total": 1.0 * i}))
        clock.t += 1.0
    rates = state.rates()
    assert rates["env_steps_total"] == pytest.approx(100.0)
    assert rates["episodes_total"] == pytest.approx(1.0)
    assert 2 <= len(state.window) <= 12  # bounded by the window, not by the run's length
    state = reg.update(tel(seq=1, counters={"env_steps_total": 5.0}))  # restarted: no negative rate
    assert state.rates() == {}
    clock.t += 2
    state = reg.update(tel(seq=2, counters={"env_steps_total": 105.0}))
    assert state.rates()["env_steps_total"] == pytest.approx(50.0)


def test_one_name_never_has_two_types() -> None:
    reg = Registry(clock=FakeClock())
    reg.update(tel(instance="a-0", gauges={"x_total": 1}))  # a gauge may not end in _total: left out
    reg.update(tel(instance="a-1", counters={"x": 2}))
    w = MetricsWriter()
    bad = render_instances(snapshot(reg, reg.clock()), w)
    assert check_exposition(w.text())["flywheel_actor_x_total"] == "counter"
    assert w.conflicts == 0 and bad == 1
    with pytest.raises(TelemetryRejected):
        reg.update(tel(service="gateway"))  # the gateway's own families are not for others to fill


def test_curve_point_from_live_instances() -> None:
    clock = FakeClock()
    reg = Registry(stale_after_s=5, clock=clock)
    assert curve_point(reg, clock(), 1e9) is None
    reg.update(tel("actor", "a-0", counters={"env_steps_total": 100, "episodes_total": 3},
                   gauges={"episode_return_mean": 10.0, "eval_return_mean": 20.0}))
    reg.update(tel("actor", "a-1", counters={"env_steps_total": 50, "episodes_total": 1},
                   gauges={"episode_return_mean": 30.0, "episode_progress_mean": float("nan")}))
    reg.update(tel("learner", "l-0", counters={"updates_total": 7}, gauges={"weight_version": 4}))
    point = curve_point(reg, clock(), 1e9)
    assert point == {"t": 1e9, "env_steps": 150, "episodes": 4, "return_mean": 20.0, "eval_return_mean": 20.0,
                     "progress_mean": None, "progress_max": None, "success_rate": None,
                     "restarted_progress_mean": None, "updates": 7, "weight_version": 4}
    # an env with measures: progress is the mean of the actors' rolling means and the max of their maxima, the
    # success rate a mean; restarted episodes' progress apart, from the actors that report it
    reg.update(tel("actor", "a-0", seq=2, counters={"env_steps_total": 200, "episodes_total": 5},
                   gauges={"episode_progress_mean": 400.0, "episode_progress_max": 900.0,
                           "episode_success_rate": 0.1, "restarted_progress_mean": 1500.0}))
    reg.update(tel("actor", "a-1", seq=2, counters={"env_steps_total": 60, "episodes_total": 2},
                   gauges={"episode_progress_mean": 600.0, "episode_progress_max": 3161.0,
                           "episode_success_rate": 0.3}))
    point = curve_point(reg, clock(), 1e9 + 1)
    assert point is not None and point["progress_mean"] == 500.0 and point["progress_max"] == 3161.0
    assert point["success_rate"] == pytest.approx(0.2) and point["restarted_progress_mean"] == 1500.0
    clock.t += 6
    assert curve_point(reg, clock(), 1e9 + 6) is None  # everyone went silent


def test_learning_curve_is_bounded_and_keeps_the_whole_run() -> None:
    curve = LearningCurve(interval_s=1.0, max_points=8)
    t = 0.0
    added = 0
    while t < 200:
        if curve.due(t):
            curve.add({"t": t, "return_mean": t})
            added += 1
        t += 0.5
    assert added > 8 and len(curve.points) <= 8
    assert curve.points[0]["t"] == 0.0 and curve.points[-1]["t"] >= 180  # first and recent points kept
    assert curve.thinned >= 3 and curve.interval_s == 2.0 ** curve.thinned
    ts = [p["t"] for p in curve.points]
    assert ts == sorted(ts) and len(set(ts)) == len(ts)
    assert curve.since(ts[-2]) == [curve.points[-1]]
    curve.add({"t": ts[-1] - 5, "return_mean": 0})  # a clock step backwards is ignored
    assert curve.points[-1]["t"] == ts[-1]
    assert not math.isnan(curve.points[-1]["return_mean"])


@pytest.mark.parametrize(("key", "kind"), [
    ("lease_count", "gauge"), ("x_sum", "gauge"), ("le_bucket", "gauge"), ("queued_total", "gauge"),
    ("queue_gauge", "gauge"), ("my_counter_value", "counter"), ("envSteps", "counter"), ("x{le=1}", "gauge"),
    ("x{quantile=0.5}", "gauge"),
])
def test_keys_prometheus_lint_would_refuse_are_left_out_with_a_reason(key: str, kind: str) -> None:
    reg = Registry(clock=FakeClock())
    values = {key: 1.0, "fine_seconds": 2.0}
    reg.update(tel("actor", "a-0", counters=values if kind == "counter" else {},
                   gauges=values if kind == "gauge" else {}))
    w = MetricsWriter()
    bad = render_instances(snapshot(reg, reg.clock()), w)
    assert "fine_seconds" in w.text() and bad == 1
    assert list(reg.invalid_keys) == [("actor", key)] and reg.invalid_keys[("actor", key)]


def test_every_name_the_gateway_itself_writes_passes_the_lint() -> None:
    for name, (kind, _, _) in _gateway_families().items():
        assert name_problem(name, kind) is None, name


def _gateway_families() -> dict[str, tuple[str, str, list[str]]]:
    from flywheel.services.gateway.settings import GatewaySettings
    from flywheel.services.gateway.transport import GatewayService
    from flywheel.services.gateway.views import metrics_text

    gw = GatewayService(GatewaySettings())
    text = metrics_text(gw)
    families: dict[str, tuple[str, str, list[str]]] = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split(" ")
            families[name] = (kind, "", [])
    assert families
    return families


def test_instances_per_service_and_series_are_capped_and_counted() -> None:
    clock = FakeClock()
    reg = Registry(forget_after_s=60, clock=clock, max_per_service=2, max_series_per_instance=16, max_series=40)
    reg.update(tel(instance="a-0", counters={"x_total": 1}))
    reg.update(tel(instance="a-1"))
    with pytest.raises(CapacityExceeded) as refused:
        reg.update(tel(instance="a-2"))
    assert refused.value.fault == "instances_per_service"
    many = {f"k{i}_total": float(i) for i in range(20)}
    state = reg.update(tel(service="learner", instance="l-0", counters=many, info={"version": "1"}))
    assert len(state.counters) == 16 and not state.gauges and not state.info  # the first 16 values, in order
    assert [f.fault for f in reg.last_faults] == ["series_per_instance"]
    assert reg.series == (1 + 3) + 3 + (16 + 3) == 26
    state = reg.update(tel(service="replay", instance="r-0", counters=many))  # 40 - 26 - 3 = 11 left
    assert len(state.counters) == 11 and [f.fault for f in reg.last_faults] == ["series"]
    assert reg.series == 40
    with pytest.raises(CapacityExceeded) as refused:
        reg.update(tel(service="other", instance="o-0"))
    assert refused.value.fault == "series"
    clock.t += 61  # everyone silent: forgotten, their room free again
    reg.update(tel(service="other", instance="o-0"))
    assert reg.series == 3 and not reg.per_service["actor"] and reg.last_faults == []


def test_retired_totals_and_carried_drops_are_bounded() -> None:
    clock = FakeClock()
    reg = Registry(forget_after_s=1, clock=clock, max_series_per_instance=16, max_series=1000)
    for cycle in range(5):  # five forget cycles of instances with counters no one else has
        for i in range(10):
            reg.update(tel(instance=f"a-{cycle}-{i}", counters={f"c{cycle}_{i}_{j}_total": 1.0 for j in range(10)}))
        clock.t += 2
        reg.sweep()
    assert len(reg.retired["actor"]) == 16 and reg.retired_keys == 16  # 500 keys retired, 16 kept
    assert reg.totals_dropped == 500 - 16
    state = reg.update(tel(instance="b-0", seq=5, counters={f"k{j}_total": 5.0 for j in range(16)}))
    for seq in range(4, 0, -1):  # restarts that report other keys each time: what is carried stays bounded
        reg.update(tel(instance="b-0", seq=seq, counters={f"n{seq}_{j}_total": 1.0 for j in range(16)}))
    assert len(state.carried) == 16


def test_the_rate_window_is_bounded_in_entries_however_fast_reports_come() -> None:
    clock = FakeClock()
    reg = Registry(clock=clock, rate_window_s=10)
    for i in range(20_000):  # 2,000 reports a second for 10 s
        state = reg.update(tel(seq=i + 1, counters={"env_steps_total": 10.0 * i}))
        clock.t += 0.0005
    assert len(state.window) <= 18
    assert state.rates()["env_steps_total"] == pytest.approx(20_000.0)


def test_series_settings_are_checked_at_start() -> None:
    from flywheel.services.gateway.settings import GatewaySettings

    with pytest.raises(ValueError, match="max_series_per_instance"):
        GatewaySettings(max_series_per_instance=2048, max_series=2000)
    assert GatewaySettings(max_series_per_instance=2048, max_series=2051).max_series == 2051
