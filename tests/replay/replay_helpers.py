"""Helpers for the replay tests: transition batches, cores and a ReplayServer running in a thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import zmq

from flywheel import proto
from flywheel.services.replay.client import ReplayClient
from flywheel.services.replay.core import ReplayConfig, ReplayCore
from flywheel.services.replay.transport import ReplayServer
from flywheel.testing.polling import wait_until
from flywheel.transport import ControlSubscriber, FaultCounter, TelemetryReporter, make_socket

OBS_SHAPE = (4,)


def transitions(start: int, count: int, *, obs_shape: tuple[int, ...] = OBS_SHAPE, dtype: str = "float32",
                priority: np.ndarray | None = None, seq: int = 0) -> proto.TransitionBatch:
    """A batch whose rows are tagged with ids start..start+count-1 (in action, reward and obs[:, 0])."""
    ids = np.arange(start, start + count)
    obs = np.zeros((count, *obs_shape), dtype=dtype)
    obs.reshape(count, -1)[:, 0] = ids % 256 if dtype == "uint8" else ids
    return proto.TransitionBatch(
        actor="test", weight_version=1, seq=seq, obs=obs, action=ids.astype(np.int64),
        reward=ids.astype(np.float32), discount=np.full(count, 0.97, dtype=np.float32), next_obs=obs + 1,
        priority=None if priority is None else np.asarray(priority, dtype=np.float32),
    )


def make_core(capacity: int = 16, **overrides: object) -> ReplayCore:
    config = ReplayConfig(capacity=capacity, min_size_to_sample=1, seed=0)
    for key, value in overrides.items():
        setattr(config, key, value)
    return ReplayCore(config)


@dataclass
class RunningServer:
    """A ReplayServer on ephemeral loopback ports, its context and the endpoints to connect to."""

    server: ReplayServer
    ctx: zmq.Context
    transitions: str
    sample: str
    faults: FaultCounter
    control: zmq.Socket  # PUB: what the gateway would send

    def send_control(self, command: str, args: dict | None = None, seq: int = 1, target: str = "replay") -> None:
        self.control.send_multipart(proto.encode(proto.Control(seq=seq, command=command, target=target,
                                                               args=args or {})))


@contextmanager
def running_server(core: ReplayCore, *, sample_bind: str = "tcp://127.0.0.1:*",
                   **kwargs: object) -> Iterator[RunningServer]:
    """Run ``server.run()`` in a thread on ports the kernel picks (tcp://127.0.0.1:*); stop and close on exit."""
    ctx = zmq.Context()
    faults = FaultCounter("replay")
    publisher = ctx.socket(zmq.PUB)
    publisher.bind("inproc://control-source")
    telemetry = TelemetryReporter(ctx, "inproc://telemetry-sink", "replay", "test", 3600.0)
    control = ControlSubscriber(ctx, "inproc://control-source", "replay", "test", faults)
    try:
        server = ReplayServer(core, ctx, transitions_bind="tcp://127.0.0.1:*", sample_bind=sample_bind,
                              telemetry=telemetry, control=control, faults=faults, **kwargs)  # type: ignore[arg-type]
    except BaseException:  # a context left with open sockets would hang whoever collects it
        ctx.destroy(linger=0)
        raise
    endpoints = (server.endpoints["transitions"][0], server.endpoints["sample"][0])  # the ports it bound
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        yield RunningServer(server, ctx, endpoints[0], endpoints[1], faults, publisher)
    finally:
        server.stop()
        thread.join(10)
        assert not thread.is_alive(), "replay server did not stop"
        server.close()
        telemetry.close()
        control.close()
        publisher.close(0)
        ctx.term()


def wait_for(condition: Callable[[], bool], what: str, deadline_s: float = 10.0) -> None:
    wait_until(condition, deadline_s, what, interval=0.01)


class ActorStreams:
    """Transition batches shaped like an actor's: stacks of (H, W) uint8 frames, oldest first, the first frame
    repeated at reset, n-step rows (the matured row one step late, all rows newest first at an episode end).

    Every frame encodes (env, episode, step) plus noise, so two episodes never share a frame by accident;
    ``static`` is the chance a step repeats the previous frame byte for byte. ``sent`` maps each row's global
    position to the (obs, next_obs) it was sent with.
    """

    def __init__(self, envs: int = 3, depth: int = 4, n_step: int = 3, frame: tuple[int, int] = (8, 8),
                 episode: tuple[int, int] = (1, 12), static: float = 0.0, seed: int = 0,
                 stream_ids: str = "env") -> None:
        self.rng = np.random.default_rng(seed)
        self.envs, self.depth, self.n_step, self.frame, self.episode = envs, depth, n_step, frame, episode
        self.static, self.stream_ids = static, stream_ids
        self.episodes = [0] * envs
        self.history: list[list[np.ndarray]] = [[] for _ in range(envs)]
        self.stacks: list[list[np.ndarray]] = [[] for _ in range(envs)]
        self.lengths = [0] * envs
        self.pending: list[tuple[int, int]] = []  # (env, step of the row's obs) maturing one step late
        self.sent: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.position = 0
        self.seq = 0
        for env in range(envs):
            self._reset(env)

    def _frame(self, env: int) -> np.ndarray:
        hist = self.history[env]
        if hist and self.rng.random() < self.static:
            return hist[-1][-1].copy()
        frame = self.rng.integers(0, 256, self.frame, dtype=np.uint8)
        frame.reshape(-1)[:3] = (env, self.episodes[env] % 256, len(hist) % 256)
        return frame

    def _reset(self, env: int) -> None:
        self.episodes[env] += 1
        self.history[env] = []
        first = self._frame(env)
        self.stacks[env] = [first] * self.depth
        self.history[env].append(np.stack(self.stacks[env]))
        self.lengths[env] = int(self.rng.integers(self.episode[0], self.episode[1] + 1))

    def step(self) -> list[tuple[int, np.ndarray, np.ndarray]]:
        """One vector step: the rows (env, obs, next_obs) it emits, in the actor's order."""
        rows = [(env, self.history[env][t], self.history[env][t + self.n_step]) for env, t in self.pending]
        self.pending = []
        for env in range(self.envs):
            self.stacks[env] = self.stacks[env][1:] + [self._frame(env)]
            self.history[env].append(np.stack(self.stacks[env]))
            steps = len(self.history[env]) - 1
            if steps >= self.lengths[env]:
                final = self.history[env][steps]
                rows += [(env, self.history[env][t], final) for t in range(steps - 1, max(-1, steps - self.n_step - 1),
                                                                            -1)]
                self._reset(env)
            elif steps >= self.n_step:
                self.pending.append((env, steps - self.n_step))
        return rows

    def batch(self, min_rows: int, actor: str = "actor-0") -> proto.TransitionBatch:
        """At least ``min_rows`` rows (whole vector steps), recorded in ``sent``."""
        rows: list[tuple[int, np.ndarray, np.ndarray]] = []
        while len(rows) < min_rows:
            rows += self.step()
        count = len(rows)
        obs = np.stack([r[1] for r in rows])
        next_obs = np.stack([r[2] for r in rows])
        if self.depth == 1:
            obs, next_obs = obs[:, 0], next_obs[:, 0]
        ids = np.arange(self.position, self.position + count)
        for i, position in enumerate(ids):
            self.sent[int(position)] = (obs[i], next_obs[i])
        stream = {"env": np.array([r[0] for r in rows], np.int64), "none": None,
                  "random": self.rng.integers(0, 3, count).astype(np.int64)}[self.stream_ids]
        self.position += count
        self.seq += 1
        return proto.TransitionBatch(
            actor=actor, weight_version=0, seq=self.seq, obs=obs, action=ids.astype(np.int64),
            reward=np.zeros(count, np.float32), discount=np.full(count, 0.9, np.float32), next_obs=next_obs,
            stream=stream)


def assert_stored_as_sent(core: ReplayCore, sent: dict[int, tuple[np.ndarray, np.ndarray]]) -> None:
    """Every live transition rebuilds byte for byte what was sent; dead slots have no priority."""
    storage = core.storage
    positions = np.arange(storage.oldest, storage.next_position)
    slots = positions % storage.capacity
    obs = np.empty((len(slots), *storage.obs_shape), storage.obs_dtype)
    next_obs = np.empty_like(obs)
    small = storage.gather(slots, obs, next_obs)
    assert np.array_equal(small["action"], positions)
    for i, position in enumerate(positions):
        want_obs, want_next = sent[int(position)]
        assert np.array_equal(obs[i], want_obs), f"obs of position {position} differs"
        assert np.array_equal(next_obs[i], want_next), f"next_obs of position {position} differs"
    if core.tree is not None:
        leaves = core.tree.get(np.arange(storage.capacity))
        live = np.zeros(storage.capacity, bool)
        live[slots] = True
        assert np.all(leaves[live] > 0) and np.all(leaves[~live] == 0)


def first_reply_tampered(make_reply: Callable[[proto.SampleRequest], list], tamper: Callable[[list], list],
                         faults: FaultCounter) -> tuple[list[proto.SampleBatch], ReplayClient]:
    """A ReplayClient (2 in flight) against a bare ROUTER answering its two requests with ``make_reply``, the
    first passed through ``tamper``: returns the batches the client handed out and the (closed) client."""
    ctx = zmq.Context()
    router = make_socket(ctx, zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    client = ReplayClient(f"tcp://127.0.0.1:{port}", 4, inflight=2, ctx=ctx, faults=faults)
    try:
        client.top_up()
        answered, deadline = 0, time.monotonic() + 10
        while answered < 2 and time.monotonic() < deadline:
            if router.poll(100):
                frames = router.recv_multipart()
                reply = make_reply(proto.decode(frames[1:], expect=proto.SampleRequest))
                router.send_multipart([frames[0], *(tamper(reply) if answered == 0 else reply)])
                answered += 1
        got, deadline = [], time.monotonic() + 5
        while len(got) + client.counters.bad_replies < 2 and time.monotonic() < deadline:
            if client.sock.poll(100) and (batch := client.receive()) is not None:
                got.append(batch)
        return got, client
    finally:
        client.close()
        router.close(0)
        ctx.term()


def assert_demo_and_actor_rows(batch: proto.SampleBatch, demo_obs: np.ndarray, demo_next: np.ndarray,
                               streams: ActorStreams, demos: int) -> None:
    """``demos`` rows of ``batch`` are demonstrations with their own stacks; the rest are what ``streams`` sent."""
    demo = batch.demo_mask()
    assert demo.sum() == demos
    for i in np.nonzero(demo)[0]:
        row = -1 - int(batch.index[i])
        assert np.array_equal(batch.obs[i], demo_obs[row]) and np.array_equal(batch.next_obs[i], demo_next[row])
    for i in np.nonzero(~demo)[0]:
        assert np.array_equal(batch.obs[i], streams.sent[int(batch.index[i])][0])
