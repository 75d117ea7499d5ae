"""flywheel.transport's telemetry side: process statistics ride along with every report, over a real socket."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import zmq

from flywheel import __version__, proto
from flywheel.procstats import ProcessStats
from flywheel.transport import TelemetryReporter


@pytest.mark.system
def test_process_stats_count_children_and_stay_monotonic() -> None:
    stats = ProcessStats()
    counters, gauges = stats.sample()
    assert counters["process_cpu_seconds_total"] > 0 and gauges["process_resident_memory_bytes"] > 10e6
    assert gauges["process_threads"] >= 1
    baseline = stats.sample()[1]["process_children"]  # children other tests of this process left running
    busy = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass\ntime.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", busy])
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            during, gauges = stats.sample()
            if during["process_children_cpu_seconds_total"] >= 0.25:
                break
            time.sleep(0.1)
        assert gauges["process_children"] >= baseline + 1 and gauges["process_children_resident_memory_bytes"] > 1e6
        assert during["process_children_cpu_seconds_total"] >= 0.25
    finally:
        child.kill()
        child.wait()
    after, gauges = stats.sample()
    assert gauges["process_children"] <= baseline
    assert after["process_children_cpu_seconds_total"] >= during["process_children_cpu_seconds_total"]  # kept
    assert after["process_cpu_seconds_total"] >= counters["process_cpu_seconds_total"]


def test_reporter_adds_process_stats_and_version_without_overriding_the_caller() -> None:
    ctx = zmq.Context()
    try:
        pull = ctx.socket(zmq.PULL)
        port = pull.bind_to_random_port("tcp://127.0.0.1")
        reporter = TelemetryReporter(ctx, f"tcp://127.0.0.1:{port}", "replay", "r-0", interval_s=0.5)
        gauges = {"process_threads": 99.0, "size_transitions": 3.0}
        deadline = time.monotonic() + 5
        while not pull.poll(100) and time.monotonic() < deadline:
            reporter.send({"samples_total": 1.0}, gauges, {"prioritized": "true"})
        msg = proto.decode(pull.recv_multipart(), expect=proto.Telemetry)
        assert isinstance(msg, proto.Telemetry)
        assert msg.gauges["process_threads"] == 99.0 and msg.gauges["size_transitions"] == 3.0  # the caller wins
        assert msg.gauges["process_resident_memory_bytes"] > 0 and "process_cpu_seconds_total" in msg.counters
        assert msg.info == {"version": __version__, "prioritized": "true"}
        assert gauges == {"process_threads": 99.0, "size_transitions": 3.0}  # not mutated
        assert not reporter.due() and reporter.seq >= 1
        reporter.close()
        pull.close(0)
    finally:
        ctx.term()
