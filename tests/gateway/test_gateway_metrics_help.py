"""The gateway takes each declared key's HELP line from flywheel.metrics_spec; declared names pass its lint."""

from __future__ import annotations

from gateway_helpers import FakeClock, check_exposition, tel

from flywheel import metrics_spec
from flywheel.services.gateway.exposition import MetricsWriter, render_instances, snapshot
from flywheel.services.gateway.metrics import Registry


def _help_lines(text: str) -> dict[str, str]:
    return {line.split(" ", 3)[2]: line.split(" ", 3)[3] for line in text.splitlines() if line.startswith("# HELP ")}


def test_declared_keys_get_their_help_and_others_the_generic_line() -> None:
    reg = Registry(clock=FakeClock())
    reg.update(tel("replay", "r-0", counters={
        "transitions_received_total": 5, 'rejected_total{where="sample",reason="malformed"}': 1,
        "process_cpu_seconds_total": 2.5, "homemade_total": 1,
    }, gauges={"size_transitions": 3, "process_threads": 4}))
    reg.update(tel("learner", "l-0", counters={"tcp_batches_total": 7}, gauges={"size_transitions": 1}))
    w = MetricsWriter()
    render_instances(snapshot(reg, reg.clock()), w)
    text = w.text()
    check_exposition(text)
    helps = _help_lines(text)
    assert helps["flywheel_replay_transitions_received_total"] == "transitions inserted into the buffer"
    assert helps["flywheel_replay_rejected_total"] == metrics_spec.REJECTED.help
    assert helps["flywheel_replay_process_cpu_seconds_total"] == "CPU seconds (user and system) of the process"
    assert helps["flywheel_replay_size_transitions"] == "transitions held"
    assert helps["flywheel_learner_tcp_batches_total"] == "sample batches received over the socket"
    # not declared: a key of another version, or a gauge the learner does not declare
    assert helps["flywheel_replay_homemade_total"] == "homemade_total reported by replay instances"
    assert helps["flywheel_learner_size_transitions"] == "size_transitions reported by learner instances"
    assert 'flywheel_replay_transitions_received_total{service="replay",instance="r-0"} 5' in text


def test_every_declared_key_exports_under_its_own_name() -> None:
    """No declared key is refused by the gateway's lint or renamed (a counter without _total would be)."""
    reg = Registry(clock=FakeClock())
    for service, parts in metrics_spec.SERVICE_PARTS.items():
        keys: list[tuple[str, str]] = [("counter", f.name) for f in metrics_spec.COMMON_FAMILIES]
        for cls in (*metrics_spec.COMMON_PARTS, *parts):
            keys += [(d.kind, d.name) for d in cls.declared() if d.sent]
        assert len(set(keys)) == len(keys), f"{service}: a key declared twice"
        for kind, key in keys:
            resolved = reg.metric(service, kind, key)
            assert resolved is not None, reg.invalid_keys.get((service, key))
            assert resolved[0] == f"flywheel_{service}_{key}"
            assert metrics_spec.help_text(service, kind, key)
    assert not reg.invalid_keys
