"""The learner over real ZeroMQ sockets against a tiny fake replay, telemetry sink and control publisher."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import zmq
from learner_helpers import free_port, make_batch

from flywheel import proto
from flywheel.nets import build_q_network, load_weights
from flywheel.services.learner.checkpoint import CHECKPOINT_FILE, load_checkpoint
from flywheel.services.learner.core import CoreConfig, LearnerCore
from flywheel.services.learner.settings import LearnerSettings
from flywheel.services.learner.transport import LearnerService


class FakeReplay:
    """A ROUTER that answers every SampleRequest with a random CartPole-shaped batch and records priorities."""

    def __init__(self, ctx: zmq.Context, obs_shape: tuple[int, ...] = (4,)) -> None:
        self.sock = ctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.port = self.sock.bind_to_random_port("tcp://127.0.0.1")
        self.obs_shape = obs_shape
        self.rng = np.random.default_rng(0)
        self.pending: list[tuple[bytes, proto.SampleRequest]] = []
        self.sent_index: dict[int, np.ndarray] = {}
        self.priorities: list[proto.PriorityUpdate] = []
        self.requests = 0
        self.max_pending = 0
        self.answer = True
        self.identity = b""

    def pump(self) -> None:
        while True:
            try:
                frames = self.sock.recv_multipart(flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            self.identity = frames[0].bytes
            msg = proto.decode(frames[1:], expect=(proto.SampleRequest, proto.PriorityUpdate))
            if isinstance(msg, proto.SampleRequest):
                self.requests += 1
                self.pending.append((self.identity, msg))
            else:
                self.priorities.append(msg)
        self.max_pending = max(self.max_pending, len(self.pending))
        if self.answer:
            for identity, req in self.pending:
                batch = make_batch(self.rng, req.batch_size, self.obs_shape, request_id=req.request_id)
                batch.index[:] = np.arange(req.batch_size) + 1000 * req.request_id
                self.sent_index[req.request_id] = batch.index.copy()
                self.sock.send_multipart([identity, *proto.encode(batch)], copy=False)
            self.pending.clear()


class Harness:
    """Learner service plus the peers it talks to, all on free 127.0.0.1 ports."""

    def __init__(self, tmp_path: Path, **overrides: object) -> None:
        self.ctx = zmq.Context()
        self.replay = FakeReplay(self.ctx)
        self.telemetry = self.ctx.socket(zmq.PULL)
        tel_port = self.telemetry.bind_to_random_port("tcp://127.0.0.1")
        self.control = self.ctx.socket(zmq.PUB)
        ctl_port = self.control.bind_to_random_port("tcp://127.0.0.1")
        self.weights_port = free_port()
        values = dict(
            instance="learner-test", env_id="CartPole-v1", batch_size=32, lr=1e-3, requests_in_flight=3,
            publish_interval_updates=5, telemetry_interval_s=0.1, telemetry_endpoint=f"tcp://127.0.0.1:{tel_port}",
            control_endpoint=f"tcp://127.0.0.1:{ctl_port}", sample_endpoint=f"tcp://127.0.0.1:{self.replay.port}",
            weights_bind=f"tcp://127.0.0.1:{self.weights_port}", checkpoint_dir=str(tmp_path), torch_threads=1,
        )
        values.update(overrides)
        self.settings = LearnerSettings(**values)
        self.core = LearnerCore((4,), 2, CoreConfig(lr=self.settings.lr))
        self.start_version = 0
        if self.settings.resume:
            self.start_version = load_checkpoint(tmp_path, self.core).weight_version
        self.service = LearnerService(self.settings, self.core, self.ctx, start_version=self.start_version)
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(f"tcp://127.0.0.1:{self.weights_port}")
        self.versions: list[int] = []
        self.weights: list[proto.Weights] = []
        self.reports: list[proto.Telemetry] = []
        self.control_seq = 0
        time.sleep(0.3)  # let SUB sockets (weights, control) connect before anything is published

    def collect(self) -> None:
        for sock, sink in ((self.sub, self.weights), (self.telemetry, self.reports)):
            while True:
                try:
                    frames = sock.recv_multipart(flags=zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                sink.append(proto.decode(frames))
        self.versions = [w.version for w in self.weights]

    def drive(self, until: Callable[[], bool], timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while not until():
            assert time.monotonic() < deadline, "condition not reached in time"
            self.service.step(5)
            self.replay.pump()
            self.collect()

    def send_control(self, command: str, **args: object) -> None:
        self.control_seq += 1
        msg = proto.Control(seq=self.control_seq, command=command, target="learner", args=dict(args))
        self.control.send_multipart(proto.encode(msg))

    def counter(self, name: str) -> float:
        return self.reports[-1].counters.get(name, 0.0) if self.reports else 0.0

    def close(self) -> None:
        self.service.close()
        for sock in (self.replay.sock, self.telemetry, self.control, self.sub):
            sock.close(0)
        self.ctx.term()


@pytest.fixture
def harness(tmp_path: Path):
    made: list[Harness] = []

    def make(**overrides: object) -> Harness:
        made.append(Harness(tmp_path, **overrides))
        return made[-1]

    yield make
    for h in made:
        h.close()


def test_trains_keeps_requests_in_flight_and_sends_priorities(harness) -> None:
    h = harness()
    h.service.start()
    h.drive(lambda: h.core.updates >= 20 and len(h.replay.priorities) >= 20)
    assert h.replay.max_pending == 3  # requests_in_flight, never more
    for update in h.replay.priorities:
        assert update.priority.dtype == np.float32 and np.isfinite(update.priority).all()
        assert (update.priority >= 0).all()
        rid = int(update.index[0]) // 1000
        np.testing.assert_array_equal(update.index, h.replay.sent_index[rid])
    h.drive(lambda: len(set(h.versions)) >= 5)
    distinct = [v for i, v in enumerate(h.versions) if i == 0 or v != h.versions[i - 1]]
    assert distinct[0] == 1
    assert all(b > a for a, b in zip(distinct, distinct[1:], strict=False))
    net = build_q_network((4,), 2)
    load_weights(net, h.weights[-1], "mlp-4-2-dueling")


def test_telemetry_reports_contract_metrics(harness) -> None:
    h = harness()
    h.service.start()
    h.drive(lambda: h.counter("updates_total") >= 10)
    last = h.reports[-1]
    assert (last.service, last.instance) == ("learner", "learner-test")
    for name in ("updates_total", "samples_total", "weights_published_total", "rejected_messages_total"):
        assert name in last.counters
    for name in ("loss", "td_error_mean", "q_mean", "updates_per_second", "data_wait_ratio", "weight_version",
                 "beta", "lr"):
        assert name in last.gauges, name
    assert 0.0 <= last.gauges["data_wait_ratio"] <= 1.0
    assert last.counters["samples_total"] == 32 * last.counters["updates_total"]
    assert last.info["network"] == "mlp-4-2-dueling"


def test_control_pause_resume_set_and_checkpoint(harness, tmp_path: Path) -> None:
    h = harness()
    h.service.start()
    h.drive(lambda: h.core.updates >= 3)
    h.send_control("set", lr=5e-4, publish_interval_updates=2, epsilon=0.1)
    h.drive(lambda: h.core.lr == pytest.approx(5e-4) and h.service.publish_interval == 2)
    h.drive(lambda: bool(h.reports) and h.reports[-1].gauges["lr"] == pytest.approx(5e-4))
    h.send_control("pause")
    h.drive(lambda: h.service.paused)
    frozen = h.core.updates
    deadline = time.monotonic() + 0.5
    h.drive(lambda: time.monotonic() > deadline)
    assert h.core.updates == frozen
    assert h.reports[-1].info["state"] == "paused"
    h.send_control("resume")
    h.drive(lambda: h.core.updates >= frozen + 5)
    h.send_control("set", lr="fast")  # wrong type: counted, ignored
    h.drive(lambda: h.service.faults.total >= 1)
    assert h.core.lr == pytest.approx(5e-4)
    h.send_control("checkpoint")
    h.drive(lambda: (tmp_path / CHECKPOINT_FILE).exists())


def test_bad_replies_are_counted_and_dropped(harness) -> None:
    h = harness()
    h.service.start()
    h.drive(lambda: h.core.updates >= 2)
    h.replay.answer = False
    h.drive(lambda: len(h.replay.pending) == 3)
    identity, _ = h.replay.pending.pop()
    h.replay.sock.send_multipart([identity, b"\x93garbage"])
    identity, req = h.replay.pending.pop()
    wrong = make_batch(h.replay.rng, 32, obs_shape=(5,), request_id=req.request_id)
    h.replay.sock.send_multipart([identity, *proto.encode(wrong)])
    h.drive(lambda: h.service.faults.total >= 2)
    h.replay.answer = True
    before = h.core.updates
    h.drive(lambda: h.core.updates >= before + 5 and h.counter("rejected_messages_total") >= 2)
    assert h.replay.max_pending <= 3


def test_unanswered_requests_are_resent_after_the_timeout(harness) -> None:
    h = harness(request_timeout_s=0.3)
    h.replay.answer = False
    h.service.start()
    h.drive(lambda: h.replay.requests >= 6)
    assert h.core.updates == 0


def test_max_updates_checkpoint_and_resume_continue_versions(harness, tmp_path: Path) -> None:
    h = harness(max_updates=12)
    codes: list[int] = []
    thread = threading.Thread(target=lambda: codes.append(h.service.run()))
    thread.start()
    deadline = time.monotonic() + 20
    while thread.is_alive() and time.monotonic() < deadline:
        h.replay.pump()
        h.collect()
        time.sleep(0.002)
    thread.join(timeout=5)
    assert codes == [0]
    saved = load_checkpoint(tmp_path, LearnerCore((4,), 2, CoreConfig()))
    assert saved.updates == 12 and saved.weight_version == h.service.version >= 3
    h2 = harness(resume=True, max_updates=0)
    assert h2.core.updates == 12
    h2.service.start()
    h2.drive(lambda: len(h2.versions) >= 1)
    assert h2.versions[0] == saved.weight_version + 1
