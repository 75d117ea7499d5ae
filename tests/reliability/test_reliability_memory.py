"""Memory bounds that hold against one peer: a live gateway under an address-space limit, fed floods in turn."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import zmq
from reliability_helpers import transitions

from flywheel import metrics_spec, proto
from flywheel.processes import die_with_parent
from flywheel.services.gateway.settings import GatewaySettings
from flywheel.testing.cluster import Cluster
from flywheel.testing.reported import GATEWAY_HTTP, GATEWAY_UP, reported
from flywheel.testing.run import clean_env
from flywheel.transport import TELEMETRY_MAX_BYTES, make_socket

pytestmark = [pytest.mark.system, pytest.mark.timeout(240)]
# Address space, not memory: a healthy idle gateway maps about 490 MiB with OpenBLAS held to one thread (OpenBLAS
# reserves buffers per core, which RLIMIT_AS counts though they are never touched; a container's memory limit
# counts resident pages only), and each worker thread reserves a 64 MiB malloc arena and an 8 MiB stack.
AS_LIMIT = 1 << 30  # bytes: prlimit 2.38 crashes on a suffix such as 1G
RSS_LIMIT_MIB = 400
MAX_SERIES = GatewaySettings.model_fields["max_series"].default
PER_INSTANCE = GatewaySettings.model_fields["max_series_per_instance"].default
OWN_SERIES = 200  # the gateway's own samples, on top of the instances' (about 60)


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


def _get(url: str, timeout: float = 10.0) -> tuple[str, float]:
    started = time.monotonic()
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        body = resp.read().decode()
    return body, time.monotonic() - started


def _wait(check: object, timeout: float, what: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the gateway died ({proc.returncode}) waiting for {what}"
        if check():  # type: ignore[operator]
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def _gauge(text: str, name: str) -> float:
    (line,) = [line for line in text.splitlines() if line.startswith(f"flywheel_gateway_{name}{{")]
    return float(line.split()[-1])


def _seq(status: dict, instance: str) -> int | None:  # type: ignore[type-arg]
    for svc in status["services"].values():
        for i in svc["instances"]:
            if i["instance"] == instance:
                return int(i["last_report"]["seq"])
    return None


class LeaseProbe(threading.Thread):
    """An actor asking for its lease every 50 ms the whole test long; every request must be answered."""

    def __init__(self, ctx: zmq.Context, endpoint: str) -> None:
        super().__init__(daemon=True)
        self.sock = make_socket(ctx, zmq.DEALER, sndhwm=4, rcvhwm=16)
        self.sock.connect(endpoint)
        self.halt = threading.Event()
        self.latencies: list[float] = []
        self.worst_at = 0.0  # when the slowest request was sent (time.monotonic)
        self.unanswered = 0

    def run(self) -> None:
        while not self.halt.is_set():
            started = time.monotonic()
            self.sock.send_multipart(proto.encode(proto.LeaseRequest("actor-probe")))
            if self.sock.poll(10_000):
                reply = proto.decode(self.sock.recv_multipart(), proto.LeaseReply)
                assert reply.instance == "actor-probe"
                self.latencies.append(time.monotonic() - started)
                if self.latencies[-1] >= max(self.latencies):
                    self.worst_at = started
            else:
                self.unanswered += 1
            self.halt.wait(0.05)
        self.sock.close(0)


_COUNTERS = {d.name: 1.0 for part in (metrics_spec.ProcessCounters, metrics_spec.ActorCounters)
             for d in part.declared() if d.sent}
_GAUGES = {d.name: 0.5 for part in (metrics_spec.ProcessGauges, metrics_spec.ActorGauges)
           for d in part.declared() if d.sent}


class RealActor(threading.Thread):
    """A real actor's telemetry, twice a second, on its own connection."""

    def __init__(self, ctx: zmq.Context, endpoint: str) -> None:
        super().__init__(daemon=True)
        self.sock = make_socket(ctx, zmq.PUSH, sndhwm=100)
        self.sock.connect(endpoint)
        self.halt = threading.Event()
        self.seq = 0

    def run(self) -> None:
        while not self.halt.is_set():
            self.seq += 1
            self.sock.send_multipart(_report("actor-1", self.seq))
            self.halt.wait(0.5)
        self.sock.close(0)


def _report(instance: str, seq: int) -> list[bytes]:
    """A real actor's report: every declared counter and gauge of an actor (about 60 values, 2 KiB)."""
    counters = {**_COUNTERS, "env_steps_total": float(seq * 100)}
    msg = proto.Telemetry("actor", instance, seq, time.time(), counters, _GAUGES, {"version": "probe"})
    return [bytes(f) for f in proto.encode(msg)]


def _invented(cycle: int, index: int) -> list[bytes]:
    """An invented actor with as many invented counters as fit the telemetry cap (about 14 KiB)."""
    counters = {f"c{cycle}_{index}_{j}_{'x' * 80}_total": float(j) for j in range(120)}
    msg = proto.Telemetry("actor", f"fake-{cycle}-{index}", 1, time.time(), counters, {}, {})
    frames = [bytes(f) for f in proto.encode(msg)]
    assert sum(map(len, frames)) <= TELEMETRY_MAX_BYTES
    return frames


def test_one_peer_cannot_run_a_live_gateway_out_of_memory(tmp_path: Path) -> None:
    log = tmp_path / "gateway.log"
    env = clean_env(
        FLYWHEEL_GATEWAY_HTTP_HOST="127.0.0.1", FLYWHEEL_GATEWAY_HTTP_PORT="0",
        FLYWHEEL_GATEWAY_TELEMETRY_ENDPOINT="tcp://127.0.0.1:*", FLYWHEEL_GATEWAY_CONTROL_ENDPOINT="tcp://127.0.0.1:*",
        FLYWHEEL_GATEWAY_LEASE_ENDPOINT="tcp://127.0.0.1:*", FLYWHEEL_GATEWAY_CONTROL_ENABLED="false",
        FLYWHEEL_GATEWAY_STALE_AFTER_S="0.5", FLYWHEEL_GATEWAY_FORGET_AFTER_S="3",
        FLYWHEEL_GATEWAY_SWEEP_INTERVAL_S="0.2", OPENBLAS_NUM_THREADS="1")
    with open(log, "ab") as out:
        proc = subprocess.Popen(["prlimit", f"--as={AS_LIMIT}", sys.executable, "-m", "flywheel", "gateway"],
                                env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                preexec_fn=die_with_parent)
    ctx = zmq.Context()
    probe: LeaseProbe | None = None
    rss: dict[str, float] = {}
    t0 = time.monotonic()
    marks: dict[str, float] = {}
    try:
        (url,) = reported(log, GATEWAY_HTTP)
        telemetry, _control, lease = reported(log, GATEWAY_UP)
        probe = LeaseProbe(ctx, lease)
        probe.start()
        push = make_socket(ctx, zmq.PUSH, sndhwm=100)
        push.connect(telemetry)

        def status() -> dict:  # type: ignore[type-arg]
            return json.loads(_get(f"{url}/status")[0])  # type: ignore[no-any-return]

        rss["idle"] = _rss_mib(proc.pid)
        # 1. One message of 8,000 parts, each at the socket's cap (125 MiB that libzmq queues before the gateway
        # sees its first part), then a valid report behind it.
        part = np.zeros(TELEMETRY_MAX_BYTES, np.uint8)
        push.send_multipart([part] * 8000, copy=False)
        push.send_multipart(_report("actor-0", 1))
        _wait(lambda: "actor-0" in str(status()["services"]), 60, "the report behind the flood", proc)
        assert status()["gateway"]["rejected"].get("telemetry:oversized") == 1
        rss["8000 parts"] = _rss_mib(proc.pid)
        assert rss["8000 parts"] < RSS_LIMIT_MIB, rss
        marks["8000 parts"] = time.monotonic() - t0
        # 2. 20,000 valid reports from one instance in 10 s.
        started = time.monotonic()
        for seq in range(2, 20_002):
            push.send_multipart(_report("actor-0", seq))
            if seq % 200 == 0:
                time.sleep(max(0.0, started + seq / 2000 - time.monotonic()))
        _wait(lambda: status()["gateway"]["telemetry_received"] >= 20_001, 60, "20,000 reports", proc)
        rss["20,000 reports"] = _rss_mib(proc.pid)
        assert rss["20,000 reports"] < RSS_LIMIT_MIB, rss
        marks["20,000 reports"] = time.monotonic() - t0
        # 3. 1,000 invented instances with 120 invented counters each, then 5 more waves; each is forgotten.
        metrics_at_cap: tuple[str, float, float] | None = None

        def fakes() -> list[str]:
            actors = status()["services"].get("actor", {}).get("instances", [])
            return [i["instance"] for i in actors if i["instance"].startswith("fake-")]

        def series_held() -> float:
            """/metrics with the series the gateway holds; kept when they fill the cap (it is then at its largest)."""
            nonlocal metrics_at_cap
            text, took = _get(f"{url}/metrics")
            held = [line for line in text.splitlines() if line.startswith("flywheel_gateway_series{")]
            if held and float(held[0].split()[-1]) > 0.9 * MAX_SERIES and metrics_at_cap is None:
                metrics_at_cap = (text, took, _gauge(_get(f"{url}/metrics")[0], "metrics_render_cpu_seconds"))
            return float(held[0].split()[-1])

        real = RealActor(ctx, telemetry)  # a real actor reports twice a second from here on: it keeps its place
        real.start()
        for cycle in range(6):  # 1,000 invented instances, then 5 forget cycles of 300 each (36,000 keys)
            for index in range(1000 if cycle == 0 else 300):
                push.send_multipart(_invented(cycle, index))
            push.send(b"end of wave")  # refused as malformed: counted once the wave before it was taken in
            if cycle == 0:
                _wait(lambda: series_held() > 0.9 * MAX_SERIES, 30, "the series cap filled", proc)
            _wait(lambda c=cycle: status()["gateway"]["rejected"].get("telemetry:malformed") == c + 1, 30,
                  f"wave {cycle}", proc)
            marks[f"wave {cycle} in"] = time.monotonic() - t0
            if cycle == 0:
                rss["1,000 instances"] = _rss_mib(proc.pid)
                assert rss["1,000 instances"] < RSS_LIMIT_MIB, rss
            _wait(lambda: not fakes(), 30, f"wave {cycle} forgotten", proc)
            marks[f"wave {cycle} out"] = time.monotonic() - t0
        real.halt.set()
        real.join(timeout=15)
        rss["5 forget cycles"] = _rss_mib(proc.pid)
        assert rss["5 forget cycles"] < RSS_LIMIT_MIB, rss
        # Afterwards: alive, bounded, /metrics within the series cap and fast, leases answered throughout.
        assert proc.poll() is None
        assert metrics_at_cap is not None
        text, took, cpu = metrics_at_cap
        samples = [line for line in text.splitlines() if line and not line.startswith("#")]
        assert len(samples) <= MAX_SERIES + OWN_SERIES, len(samples)
        # Written in under 1 s of CPU; over HTTP, while the gateway takes in the wave, within a generous bound.
        assert cpu < 1.0 and took < 5.0, f"/metrics took {cpu:.2f} s of CPU, {took:.2f} s over HTTP"
        rejected = status()["gateway"]["rejected"]
        assert rejected.get("telemetry:series", 0) > 0, rejected
        assert (_seq(status(), "actor-1") or 0) >= real.seq - 4  # the real actor was never refused
        totals = status()["services"]["actor"]["totals"]
        assert len(totals) <= 2 * PER_INSTANCE, len(totals)  # retired: one service's keys, bounded
        probe.halt.set()
        probe.join(timeout=15)
        assert probe.unanswered == 0 and len(probe.latencies) > 50
        assert max(probe.latencies) < 5.0, (max(probe.latencies), probe.worst_at - t0, marks)  # generous: CI is noisy
        print(f"rss MiB {rss}; /metrics {len(samples)} samples in {cpu:.3f} s CPU, {took:.3f} s over HTTP; lease "
              f"latency max {max(probe.latencies) * 1000:.0f} ms (sent at {probe.worst_at - t0:.1f} s) over "
              f"{len(probe.latencies)} requests; phases {marks}")
    finally:
        if probe is not None:
            probe.halt.set()
            probe.join(timeout=15)
        ctx.destroy(linger=0)
        proc.terminate()
        code = proc.wait(timeout=30)
    assert code == 0, log.read_text()[-3000:]
    assert "Traceback" not in log.read_text()


def test_a_replay_gives_back_what_a_multipart_flood_made_libzmq_hold(tmp_path: Path) -> None:
    """Three messages of 3,000 parts of 60 KiB (176 MiB each, every part within the 16 MiB cap) into the replay's
    transitions socket: each is refused and counted, the valid batch behind them is stored, and the replay gives the
    pages libzmq held back instead of keeping its peak (issue 70: 105 -> 277 MiB on 3,001 parts, kept)."""
    cluster = Cluster(tmp_path, settings={"replay": {"MAX_MESSAGE_MB": "16", "MIN_SIZE_TO_SAMPLE": "64"}})
    cluster.add("gateway")
    cluster.add("replay")
    ctx = zmq.Context()
    try:
        cluster.start_all()
        cluster.wait(lambda: cluster.is_up("replay-0"), 90, "the replay to report", alive=["gateway-0", "replay-0"])
        actor = make_socket(ctx, zmq.PUSH, sndhwm=100)
        actor.connect(cluster.endpoint("transitions"))
        time.sleep(0.3)
        before = cluster.rss("replay-0") / 2**20
        part = np.zeros(60 * 1024, np.uint8)
        for seq in range(3):
            actor.send_multipart([part] * 3000, copy=False)
            actor.send_multipart(proto.encode(transitions(8, seq=seq)))
            cluster.wait(lambda s=seq: cluster.value("replay-0", "transitions_received_total") >= 8 * (s + 1), 60,
                         "the valid batch behind the flood", alive=["replay-0"])
            time.sleep(1.1)  # memory is given back at most once a second
        time.sleep(1.0)  # the replay's next report
        after = cluster.rss("replay-0") / 2**20
        replay = cluster.instance("replay-0")
        assert replay is not None
        assert replay["counters"]['rejected_total{where="transitions",reason="oversized"}'] == 3
        assert after - before < 64, f"replay resident {before:.0f} -> {after:.0f} MiB"
        print(f"replay resident {before:.0f} -> {after:.0f} MiB after three 176 MiB floods")
        actor.close(0)
    finally:
        ctx.destroy(linger=0)
        codes = cluster.stop()
    assert all(code == 0 for code in codes.values()), codes
