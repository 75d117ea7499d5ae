"""What the replay's telemetry carries on the wire: the same keys as before typed declarations, with live values."""

from __future__ import annotations

import threading
import time

import zmq
from replay_helpers import make_core, transitions

from flywheel import proto
from flywheel.metrics_spec import REJECTED, ProcessCounters, ProcessGauges, ReplayCounters, ReplayGauges
from flywheel.services.replay.transport import ReplayServer
from flywheel.transport import ControlSubscriber, FaultCounter, TelemetryReporter

# The replay's telemetry keys as the services and dashboards have always read them: renaming one is a change of
# the product (Prometheus names, Grafana queries), never a side effect of a refactor.
REPLAY_COUNTERS = {
    "transitions_received_total", "batches_received_total", "transitions_rejected_total", "samples_total",
    "sample_batches_total", "demo_samples_total", "priority_updates_total", "sample_requests_dropped_total",
    "rate_limiter_sample_wait_seconds_total", "rate_limiter_insert_wait_seconds_total", "checkpoints_total",
    "checkpoint_failures_total", "shm_batches_total", "socket_batches_total", "shm_slots_exhausted_total",
    "compact_batches_total", "packed_batches_total", "control_commands_total", "messages_rejected_total",
    "telemetry_dropped_total", "stale_priority_updates_total", "priorities_clamped_total",
}
REPLAY_GAUGES = {
    "size_transitions", "capacity_transitions", "demo_size_transitions", "memory_bytes", "resident_bytes",
    "shm_bytes", "frames_per_transition", "evicted_for_frames_transitions", "unpackable_frames",
    "insert_rate_per_second", "sample_rate_per_second", "pending_sample_requests", "samples_per_insert",
    "error_buffer", "checkpoint_in_progress", "checkpoint_duration_seconds", "checkpoint_max_pause_seconds",
    "checkpoint_max_loop_turn_seconds", "paused",
}
PROCESS = {"process_cpu_seconds_total", "process_children_cpu_seconds_total"}
PROCESS_GAUGES = {"process_resident_memory_bytes", "process_threads", "process_children_resident_memory_bytes",
                  "process_children"}


def test_the_declarations_are_the_replays_wire_keys() -> None:
    assert {d.name for d in ReplayCounters.declared()} == REPLAY_COUNTERS
    assert {d.name for d in ReplayGauges.declared()} == REPLAY_GAUGES
    assert {d.name for d in ProcessCounters.declared()} == PROCESS
    assert {d.name for d in ProcessGauges.declared()} == PROCESS_GAUGES


def test_the_replay_reports_its_counts_under_the_same_keys() -> None:
    ctx = zmq.Context()
    sink = ctx.socket(zmq.PULL)
    port = sink.bind_to_random_port("tcp://127.0.0.1")
    faults = FaultCounter("replay")
    telemetry = TelemetryReporter(ctx, f"tcp://127.0.0.1:{port}", "replay", "test", interval_s=0.05)
    control = ControlSubscriber(ctx, "inproc://no-control", "replay", "test", faults)
    server = ReplayServer(make_core(16), ctx, transitions_bind="tcp://127.0.0.1:*", sample_bind="tcp://127.0.0.1:*",
                          telemetry=telemetry, control=control, faults=faults)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    push = ctx.socket(zmq.PUSH)
    try:
        push.connect(server.endpoints["transitions"][0])
        push.send_multipart(proto.encode(transitions(0, 10)))
        push.send_multipart([b"\xc1garbage"])
        report = None
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if sink.poll(200):
                report = proto.decode(sink.recv_multipart(), proto.Telemetry)
                if report.counters.get("transitions_rejected_total") == 1 and \
                        report.counters.get("transitions_received_total") == 10:
                    break
        assert report is not None and report.counters["transitions_received_total"] == 10
        labelled = {k for k in report.counters if "{" in k}
        assert labelled == {REJECTED.key("transitions", "malformed")}
        assert report.counters['rejected_total{where="transitions",reason="malformed"}'] == 1
        assert set(report.counters) - labelled == REPLAY_COUNTERS | PROCESS
        assert set(report.gauges) == REPLAY_GAUGES | PROCESS_GAUGES
        assert report.counters["batches_received_total"] == 1 and report.counters["messages_rejected_total"] == 1
        assert report.gauges["size_transitions"] == 10 and report.gauges["capacity_transitions"] == 16
        assert server.counters.transitions_received_total == 10  # the typed counts the report was made from
    finally:
        server.stop()
        thread.join(10)
        server.close()
        for sock in (push, sink, telemetry, control):
            sock.close()
        ctx.term()
