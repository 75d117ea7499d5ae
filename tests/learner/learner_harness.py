"""A learner loop on real sockets with a tiny fake replay, a telemetry sink and a control publisher."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import zmq
from learner_helpers import make_batch

from flywheel import proto
from flywheel.services.learner.checkpoint import load_checkpoint
from flywheel.services.learner.core import CoreConfig, LearnerCore
from flywheel.services.learner.loop import LearnerLoop, LoopConfig
from flywheel.services.learner.settings import LearnerSettings
from flywheel.services.learner.transport import open_sockets
from flywheel.transport import queued_frames, subscriber


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
        for frames in queued_frames(self.sock):
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
                batch.index[:] = np.arange(req.batch_size) + 100_000 * req.request_id
                self.sent_index[req.request_id] = batch.index.copy()
                self.sock.send_multipart([identity, *proto.encode(batch)], copy=False)
            self.pending.clear()


class Harness:
    """A learner loop plus the peers it talks to, all bound to port 0 on 127.0.0.1 (the kernel picks)."""

    def __init__(self, tmp_path: Path, device: str = "cpu", **overrides: object) -> None:
        self.ctx = zmq.Context()
        self.replay = FakeReplay(self.ctx)
        self.telemetry = self.ctx.socket(zmq.PULL)
        tel_port = self.telemetry.bind_to_random_port("tcp://127.0.0.1")
        self.control = self.ctx.socket(zmq.PUB)
        ctl_port = self.control.bind_to_random_port("tcp://127.0.0.1")
        values = dict(
            instance="learner-test", env_id="CartPole-v1", batch_size=32, lr=1e-3, requests_in_flight=3,
            publish_interval_updates=5, telemetry_interval_s=0.1, telemetry_endpoint=f"tcp://127.0.0.1:{tel_port}",
            control_endpoint=f"tcp://127.0.0.1:{ctl_port}", sample_endpoint=f"tcp://127.0.0.1:{self.replay.port}",
            weights_bind="tcp://127.0.0.1:0", checkpoint_dir=str(tmp_path), torch_threads=1,
        )
        values.update(overrides)
        self.settings = LearnerSettings(**values)
        self.core = LearnerCore((4,), 2, CoreConfig(lr=self.settings.lr, acting_ema=self.settings.acting_ema),
                                device=device)
        self.start_version = 0
        if self.settings.resume:
            self.start_version = load_checkpoint(tmp_path, self.core).weight_version
        sockets = open_sockets(self.settings, self.core, self.ctx)
        self.loop = LearnerLoop(LoopConfig.of(self.settings), self.core, sockets, start_version=self.start_version)
        self.sub = subscriber(self.ctx, self.loop.weights_endpoint)  # the port the kernel picked
        self.versions: list[int] = []
        self.weights: list[proto.Weights] = []
        self.reports: list[proto.Telemetry] = []
        self.control_seq = 0
        time.sleep(0.3)  # let SUB sockets (weights, control) connect before anything is published

    def collect(self) -> None:
        for sock, sink in ((self.sub, self.weights), (self.telemetry, self.reports)):
            sink.extend(proto.decode(frames) for frames in queued_frames(sock))
        self.versions = [w.version for w in self.weights]

    def drive(self, until: Callable[[], bool], timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while not until():
            assert time.monotonic() < deadline, "condition not reached in time"
            self.loop.step(5)
            self.replay.pump()
            self.collect()

    def send_control(self, command: str, **args: object) -> None:
        self.control_seq += 1
        msg = proto.Control(seq=self.control_seq, command=command, target="learner", args=dict(args))
        self.control.send_multipart(proto.encode(msg))

    def counter(self, name: str) -> float:
        return self.reports[-1].counters.get(name, 0.0) if self.reports else 0.0

    def close(self) -> None:
        self.loop.close()
        for sock in (self.replay.sock, self.telemetry, self.control, self.sub):
            sock.close(0)
        self.ctx.term()
