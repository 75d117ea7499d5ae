"""Simulated actors for ``flywheel bench load``: many actor identities per process, each on the real actor's sockets."""

from __future__ import annotations

import json
import math
import multiprocessing as mp
import resource
import time
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from flywheel import proto, security
from flywheel.bench.runner import BenchError
from flywheel.metrics_spec import ActorCounters, ActorGauges
from flywheel.processes import stop_children
from flywheel.services.actor.nstep import Emitted
from flywheel.services.actor.transport import LeaseClient, TransitionSender, WeightsReceiver, auto_batch_rows
from flywheel.transport import ControlSubscriber, FaultCounter, TelemetryReporter

LATE_S = 1.0  # a process this far behind its schedule skips the steps it missed (counted as late_steps)
DRAIN_S = 2.0  # after the last send, the sockets stay open this long before they close (and drop what they hold)


@dataclass(frozen=True)
class SimConfig:
    """What one generator process does: its identities, the services' endpoints, the load and how long."""

    names: tuple[str, ...]
    env_id: str
    transitions: str
    weights: str
    lease: str
    telemetry: str
    control: str
    rate: float  # transitions per second per identity
    seconds: float  # most seconds of sending after "go" (the parent may stop it sooner)
    keys_dir: str = ""  # a `flywheel keys generate` folder with clients/NAME per identity; "": plain
    envs: int = 8
    gamma: float = 0.9
    send_hwm: int = 16
    telemetry_interval_s: float = 1.0
    seed: int = 0


class NullPolicy:
    """The acting network's stand-in: takes every Weights message (the codec has checked it) and acts with none."""

    name = "simulated"

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        return np.zeros((len(obs), 1), np.float32)

    def load(self, msg: proto.Weights) -> None:
        return None


@dataclass
class IdentityReport:
    """What one identity counted, sent back to the parent as JSON."""

    name: str
    sent: int
    dropped: int
    late_steps: int
    lease: bool
    lease_index: int
    lease_count: int
    versions: dict[str, float] = field(default_factory=dict)  # version -> monotonic arrival time
    telemetry_sent: int = 0
    telemetry_dropped: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    commands: int = 0


class Frames:
    """Per env slot a stack of frames that slides by one new, distinct frame each step."""

    def __init__(self, envs: int, obs_shape: tuple[int, ...], dtype: str, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.pool = rng.integers(0, 256, (64, *obs_shape[1:])).astype(dtype)
        self.stack = np.stack([self.pool[rng.integers(0, 64, obs_shape[0])] for _ in range(envs)])
        self.count = np.uint64(seed) << np.uint64(40)
        self.rng = rng

    def step(self) -> tuple[np.ndarray, np.ndarray]:
        """(obs, next_obs) of one step of every slot: new arrays, next_obs sharing all but one frame with obs."""
        envs = len(self.stack)
        new = self.pool[self.rng.integers(0, len(self.pool), envs)]  # fancy indexing copies
        stamp = np.arange(envs, dtype=np.uint64) + self.count  # 8 bytes of a counter: every frame distinct
        self.count += np.uint64(envs)
        flat = new.reshape(envs, -1).view(np.uint8)
        flat[:, :8] = stamp.view(np.uint8).reshape(envs, 8)
        obs = self.stack
        self.stack = np.concatenate([obs[:, 1:], new[:, None]], axis=1)
        return obs, self.stack


class SimActor:
    """One simulated actor identity: what one actor process is to the services, without its envs and network.

    Its own transitions PUSH (``TransitionSender``), weights SUB (``WeightsReceiver``), lease DEALER
    (``LeaseClient``), control SUB (``ControlSubscriber``) and telemetry PUSH (``TelemetryReporter``), made while
    its own CURVE client key is configured (``clients/NAME`` of a ``flywheel keys generate`` folder); every message
    is the codec's. It sends a vector step of ``envs`` rows every ``envs / rate`` seconds, frame stacks sliding one
    new frame a step per env slot (so the replay stores about one frame a row, as from a real actor), and drops
    what the replay does not take (``on_full=drop``, counted), so one identity never holds up the others of its
    process. Each weights version's arrival time is kept (``time.monotonic``: one clock for every process).
    """

    def __init__(self, ctx: zmq.Context, cfg: SimConfig, name: str, obs_shape: tuple[int, ...], obs_dtype: str,
                 n_actions: int, index: int, start: float) -> None:
        self.name, self.cfg, self.n_actions = name, cfg, n_actions
        self.faults = FaultCounter("actor")
        row_bytes = 2 * math.prod(obs_shape) * np.dtype(obs_dtype).itemsize
        self.sender = TransitionSender(ctx, cfg.transitions, name, hwm=cfg.send_hwm, on_full="drop",
                                       batch_rows=auto_batch_rows(cfg.envs, row_bytes))
        self.weights = WeightsReceiver(ctx, cfg.weights, NullPolicy(), self.faults)
        self.lease = LeaseClient(ctx, cfg.lease, name, self.faults)
        self.control = ControlSubscriber(ctx, cfg.control, "actor", name, self.faults)
        self.telemetry = TelemetryReporter(ctx, cfg.telemetry, "actor", name, cfg.telemetry_interval_s,
                                           process_stats=False)  # one process hosts many: its figures are not one's
        self.frames = Frames(cfg.envs, obs_shape, obs_dtype, cfg.seed * 100_003 + index)
        self.period = cfg.envs / cfg.rate if cfg.rate > 0 else math.inf
        self.next_step = start + self.period * ((index * 0.618) % 1.0)  # spread over the period, not in lockstep
        self.steps = self.late_steps = self.commands = 0
        self.paused = False
        self.versions: dict[str, float] = {}
        self.discount = np.full(cfg.envs, cfg.gamma, np.float32)
        self.streams = np.arange(cfg.envs, dtype=np.int64)

    def sockets(self) -> list[zmq.Socket]:
        """The sockets that receive: weights, lease replies, control."""
        return [self.weights.sock, self.lease.sock, self.control.sock]

    def receive(self, now: float) -> None:
        """Take what arrived: newer weights (their arrival time kept), lease replies, control commands."""
        if self.weights.poll(now):
            self.versions.setdefault(str(self.weights.version), now)
        self.lease.tick(now)
        for command in self.control.drain():
            self.commands += 1
            if command.kind == proto.CommandKind.PAUSE:
                self.paused = True
            elif command.kind == proto.CommandKind.RESUME:
                self.paused = False

    def tick(self, now: float) -> None:
        """Send the steps that are due, renew the lease and report when due."""
        if now - self.next_step > LATE_S:
            missed = int((now - self.next_step) / self.period)
            self.late_steps += missed
            self.next_step += missed * self.period
        while self.next_step <= now:
            self.next_step += self.period
            if not self.paused:
                self._step()
        if now >= self.lease.next_request:
            self.lease.tick(now)
        if self.telemetry.due(now):
            self.report(now)

    def _step(self) -> None:
        envs = self.cfg.envs
        obs, next_obs = self.frames.step()
        row = Emitted(obs=obs, action=self.frames.rng.integers(0, self.n_actions, envs),
                      reward=np.zeros(envs, np.float32), discount=self.discount, next_obs=next_obs,
                      priority=np.ones(envs, np.float32), stream=self.streams)
        self.sender.add([row], self.weights.version, lambda: False)
        self.steps += 1

    def report(self, now: float) -> None:
        """One telemetry report, with the actor's keys (what an actor without envs can say)."""
        s, w, lease = self.sender, self.weights, self.lease
        counters = ActorCounters(
            env_steps_total=self.steps * self.cfg.envs, episodes_total=0, eval_episodes_total=0,
            transitions_sent_total=s.sent, transitions_dropped_total=s.dropped, weights_received_total=w.received,
            weights_rejected_total=w.rejected, weights_stale_total=w.stale, messages_rejected_total=self.faults.total,
            send_seconds_total=s.send_s, send_blocked_seconds_total=s.blocked_s, send_reconnects_total=s.reconnects,
            weights_load_seconds_total=w.load_s, env_seconds_total=0, inference_seconds_total=0,
            bookkeeping_seconds_total=0, telemetry_dropped_total=self.telemetry.dropped)
        gauges = ActorGauges(
            epsilon=0.0, epsilon_min=0.0, epsilon_max=0.0, exploration_slots=self.cfg.envs, weight_version=w.version,
            weight_version_newest=w.newest_seen, policy_lag_versions=w.lag, weight_age_seconds=now - w.updated_at,
            env_steps_per_second=self.cfg.rate, episode_return_mean=0.0, episode_length_mean=0.0,
            lease_index=lease.index, lease_slots=lease.count, paused=float(self.paused),
            send_blocked_seconds=s.blocked_s, num_envs=self.cfg.envs, slot_groups=1, n_step=1)
        self.telemetry.send({**counters.as_dict(), **self.faults.as_counters()}, gauges.as_dict(),
                            {"env_id": self.cfg.env_id, "network": NullPolicy.name, "simulated": "true"})

    def flush(self) -> None:
        """Send what is buffered and give the lease back (the sockets stay open for a while: LINGER is 0)."""
        self.sender.flush(self.weights.version, lambda: False)
        self.lease.release()

    def close(self) -> IdentityReport:
        """Close every socket; what this identity counted."""
        report = IdentityReport(
            self.name, self.sender.sent, self.sender.dropped, self.late_steps, self.lease.have_lease,
            self.lease.index, self.lease.count, self.versions, self.telemetry.seq, self.telemetry.dropped,
            dict(self.faults.counts), self.commands)
        for part in (self.sender, self.weights, self.lease, self.control, self.telemetry):
            part.close()
        return report


def _raise_open_files(sockets: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, max(soft, 8 * sockets + 256))
    if want > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def _weights_cost(msg: proto.Weights | None) -> dict[str, float]:
    """Bytes of one weights message as the learner encodes it, and the CPU seconds that encoding takes here."""
    if msg is None:
        return {}
    began = time.thread_time()  # this thread only: the ZeroMQ I/O thread is not the encoder
    frames = proto.encode(msg)
    return {"weights_bytes": float(sum(memoryview(f).nbytes for f in frames)),
            "weights_encode_cpu_s": time.thread_time() - began}


def serve(cfg: SimConfig, conn: Connection) -> None:
    """A generator process: make every identity's sockets, say ready, send from "go" until ``seconds`` or "stop"."""
    from flywheel.envs import env_spec

    spec = env_spec(cfg.env_id)
    _raise_open_files(6 * len(cfg.names))
    ctx = zmq.Context()
    ctx.set(zmq.MAX_SOCKETS, 6 * len(cfg.names) + 64)
    start = time.monotonic()
    actors: list[SimActor] = []
    for i, name in enumerate(cfg.names):
        keys = security.load_keys(Path(cfg.keys_dir) / "clients" / name) if cfg.keys_dir else None
        security.configure(keys)  # the sockets made next are this identity's: its own client key
        actors.append(SimActor(ctx, cfg, name, spec.obs_shape, spec.obs_dtype, spec.n_actions, i, start))
    poller = zmq.Poller()
    owner: dict[zmq.Socket, SimActor] = {}
    for actor in actors:
        for sock in actor.sockets():
            poller.register(sock, zmq.POLLIN)
            owner[sock] = actor
    conn.send_bytes(b"ready")
    while not conn.poll(0.05):  # the parent says go once every process is ready; meanwhile leases and weights
        now = time.monotonic()
        for actor in actors:
            actor.receive(now)
    try:
        told = conn.recv_bytes()
    except (EOFError, OSError):  # the parent is gone: close down
        told = b"stop"
    if told == b"go":
        began = time.monotonic()
        for actor in actors:
            actor.next_step += began - start
        deadline = began + cfg.seconds
        while time.monotonic() < deadline and not conn.poll(0):
            now = time.monotonic()
            due = min(min(a.next_step for a in actors), now + 0.05)
            for sock, _ in poller.poll(math.ceil(max(0.0, due - now) * 1000)):
                owner[sock].receive(time.monotonic())
            now = time.monotonic()
            for actor in actors:
                actor.tick(now)
    for actor in actors:
        actor.flush()
    time.sleep(DRAIN_S)  # what the sockets still hold reaches the replay before they close
    cost = _weights_cost(actors[0].weights.acting if actors else None)
    reports = [asdict(actor.close()) for actor in actors]
    usage = resource.getrusage(resource.RUSAGE_SELF)
    ctx.term()
    try:
        conn.send_bytes(json.dumps({"identities": reports, "cpu_s": usage.ru_utime + usage.ru_stime,
                                    "max_rss_bytes": usage.ru_maxrss * 1024, **cost}).encode())
    except OSError:  # the parent is gone
        pass


class SimActors:
    """The generator: ``processes`` processes sharing the identities ``names``; ready, go, stop and collect."""

    def __init__(self, base: SimConfig, processes: int) -> None:
        if base.rate <= 0 or base.envs < 1 or not base.names:
            raise BenchError("simulated actors need a rate above 0, at least one env slot and at least one name")
        names = list(base.names)
        processes = max(1, min(processes, len(names)))
        mpctx = mp.get_context("spawn")
        self.procs: list[Any] = []
        self.conns: list[Connection] = []
        for p in range(processes):
            cfg = SimConfig(**{**asdict(base), "names": tuple(names[p::processes]), "seed": base.seed + p})
            parent, child = mpctx.Pipe()
            proc = mpctx.Process(target=serve, args=(cfg, child), daemon=True, name=f"flywheel-sim-actors-{p}")
            proc.start()
            child.close()
            self.procs.append(proc)
            self.conns.append(parent)

    def pids(self) -> list[int]:
        return [int(p.pid) for p in self.procs if p.pid is not None]

    def wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        for conn, proc in zip(self.conns, self.procs, strict=True):
            if not conn.poll(max(0.0, deadline - time.monotonic())):
                self.close()
                raise BenchError(f"{proc.name} did not make its sockets within {timeout:.0f} s "
                                 f"(exit code {proc.exitcode})")
            try:
                conn.recv_bytes()
            except EOFError:
                self.close()
                raise BenchError(f"{proc.name} exited while making its sockets (exit code {proc.exitcode})") from None

    def go(self) -> None:
        for conn in self.conns:
            conn.send_bytes(b"go")

    def finish(self, timeout: float = 60.0) -> dict[str, Any]:
        """Stop sending, and what every process counted: its identities, CPU seconds and the weights' cost."""
        for conn in self.conns:
            try:
                conn.send_bytes(b"stop")
            except OSError:
                pass
        out: dict[str, Any] = {"identities": [], "cpu_s": 0.0, "max_rss_bytes": 0.0}
        for conn, proc in zip(self.conns, self.procs, strict=True):
            if not conn.poll(timeout):
                raise BenchError(f"{proc.name} did not report within {timeout:.0f} s (exit code {proc.exitcode})")
            try:
                part = json.loads(conn.recv_bytes())
            except EOFError:
                raise BenchError(f"{proc.name} exited before it reported (exit code {proc.exitcode})") from None
            out["identities"] += part.pop("identities")
            out["cpu_s"] += part.pop("cpu_s")
            out["max_rss_bytes"] = max(out["max_rss_bytes"], part.pop("max_rss_bytes"))
            for key, value in part.items():
                out.setdefault(key, value)
        self.close()
        return out

    def close(self) -> None:
        """Stop every process that still runs (a stop request, then SIGTERM after 5 s)."""
        stop_children(self.conns, self.procs, b"stop")
