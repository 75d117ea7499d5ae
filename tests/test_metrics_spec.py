"""flywheel.metrics_spec: typed parts refuse unknown names, report only what is sent, and render labelled keys."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

import pytest

from flywheel.metrics_spec import (
    REJECTED,
    ActorGauges,
    Counters,
    Family,
    ReplayClientCounters,
    ReplayCounters,
)
from flywheel.transport import FaultCounter


def test_counters_add_up_and_a_misspelt_name_is_an_error() -> None:
    counters = ReplayCounters()
    counters.transitions_received_total += 3
    counters.transitions_received_total += 2
    assert counters.as_dict()["transitions_received_total"] == 5.0
    with pytest.raises(AttributeError):
        counters.transitions_recieved_total = 1  # type: ignore[attr-defined]
    with pytest.raises(TypeError):
        ReplayCounters(transitions_recieved_total=1)  # type: ignore[call-arg]


def test_values_that_are_none_or_unsent_stay_out_of_the_report() -> None:
    gauges = ActorGauges(
        epsilon=0.4, epsilon_min=0.1, epsilon_max=0.4, exploration_slots=2, weight_version=3, weight_version_newest=4,
        policy_lag_versions=1, weight_age_seconds=0.5, env_steps_per_second=10, episode_return_mean=1.5,
        episode_length_mean=20, lease_index=0, lease_slots=1, paused=0, send_blocked_seconds=0, num_envs=2,
        slot_groups=1, n_step=3, episode_success_rate=0.25)
    report = gauges.as_dict()
    assert report["episode_success_rate"] == 0.25 and report["weight_version"] == 3.0
    assert "episode_return_last" not in report and "episode_progress_mean" not in report
    with pytest.raises(TypeError):  # a gauge every report carries cannot be left out
        ActorGauges(epsilon=0.4)  # type: ignore[call-arg]
    client = ReplayClientCounters(bad_replies=2, priority_updates=5, shm_batches_total=1)
    assert "bad_replies" not in client.as_dict() and "priority_updates" not in client.as_dict()
    assert client.as_dict()["shm_batches_total"] == 1.0 and client.bad_replies == 2


def test_a_field_without_help_is_refused_when_declared() -> None:
    @dataclass(kw_only=True, slots=True)
    class Bare(Counters):
        things_total: float = 0.0

    with pytest.raises(TypeError, match="Bare.things_total"):
        Bare().as_dict()

    @dataclass(kw_only=True, slots=True)
    class Helped(Counters):
        things_total: Annotated[float, "things"] = 0.0

    assert [(d.name, d.kind, d.help) for d in Helped.declared()] == [("things_total", "counter", "things")]


def test_family_keys_are_the_labelled_wire_keys() -> None:
    assert REJECTED.key("control", "bad_args") == 'rejected_total{where="control",reason="bad_args"}'
    assert Family("restarts_total", ("child",), "restarts").key("learner-0") == 'restarts_total{child="learner-0"}'
    with pytest.raises(ValueError, match="where, reason"):
        REJECTED.key("control")
    faults = FaultCounter("replay")
    faults.record("sample", ValueError("no fault attribute"))
    assert faults.as_counters() == {'rejected_total{where="sample",reason="malformed"}': 1.0}
