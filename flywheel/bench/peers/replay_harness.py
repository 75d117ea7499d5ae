"""Flywheel's side of the replay benchmark: `flywheel replay` as a child process, senders and sampling clients."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import queue
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import psutil
import zmq

from flywheel import proto
from flywheel.bench.runner import BenchError
from flywheel.testing.ports import free_port
from flywheel.testing.reported import REPLAY_TCP, reported

from .cpu_clock import SideClock, pin_process
from .replay_data import sender_main

SPAWN = mp.get_context("spawn")


def spawned_result(target: Callable[..., None], make_args: Callable[[Any], tuple[Any, ...]], wait_s: float,
                   what: str) -> dict[str, Any]:
    """Run ``target(*make_args(result_queue))`` in a spawned process and return what it puts on the queue;
    BenchError naming ``what`` when it ends without an answer or none comes within ``wait_s`` seconds."""
    result = SPAWN.Queue()
    proc = SPAWN.Process(target=target, daemon=True, args=make_args(result))
    proc.start()
    deadline = time.monotonic() + wait_s
    try:
        while True:
            try:
                return result.get(timeout=1)
            except queue.Empty:
                if not proc.is_alive() or time.monotonic() > deadline:
                    break
        try:  # it may have put its answer just before it ended
            return result.get(timeout=1)
        except queue.Empty:
            raise BenchError(f"{what} gave no result (exit code {proc.exitcode})") from None
    finally:
        proc.join(30)
SHM_DIR = "/dev/shm"  # where the replay creates its clients' segments (services/replay/shm.py)


def cpu_split() -> tuple[list[int], list[int]]:
    """(the core the replay gets, the cores everything else gets); the same core twice on a 1-core machine."""
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]
    return [cpus[-1]], cpus[:-1] or cpus


class ReplayService:
    """``flywheel replay`` in a child process, its telemetry read here, control commands sent from here."""

    def __init__(self, workdir: Path, name: str, capacity: int, cpus: list[int] | None = None,
                 **settings: str) -> None:
        self.workdir = workdir
        sock = self.sock_prefix = f"/tmp/fw-bench-{os.getpid()}-{name}"
        self.transitions_ipc, self.sample_ipc = f"ipc://{sock}-tr", f"ipc://{sock}-sa"
        self.transitions_tcp = self.sample_tcp = "tcp://127.0.0.1:0"  # the kernel picks; read back once started
        self.ctx = zmq.Context()
        self.telemetry = self.ctx.socket(zmq.PULL)
        telemetry = f"ipc://{sock}-te"
        self.telemetry.bind(telemetry)
        self.control = self.ctx.socket(zmq.PUB)
        control = f"ipc://{sock}-co"
        self.control.bind(control)
        self.counters: dict[str, float] = {}
        self.gauges: dict[str, float] = {}
        self.sent_at, self.seq = 0.0, -1
        self._seq = 0
        args = {"capacity": str(capacity), "min_size_to_sample": "1000", "transitions_hwm": "8",
                "transitions_bind": f"{self.transitions_ipc},{self.transitions_tcp}",
                "sample_bind": self.sample_tcp, "telemetry_endpoint": telemetry, "control_endpoint": control,
                "telemetry_interval_s": "0.25", "log_level": "INFO", "max_message_mb": "1024"} | settings
        flags = [item for key, value in args.items() for item in (f"--{key.replace('_', '-')}", value)]
        self.log_path = workdir / f"replay-{name}.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("FLYWHEEL_")}
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "flywheel", "replay", *flags], env=env, stdout=log, stderr=subprocess.STDOUT,
                preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
        self.process = psutil.Process(self.proc.pid)
        self.wait(lambda: "size_transitions" in self.gauges, 120, "the replay to start")
        self.transitions_tcp, self.sample_tcp = reported(self.log_path, REPLAY_TCP, 30, error=BenchError)

    def poll(self) -> None:
        """Read every telemetry message that arrived."""
        while self.telemetry.poll(0):
            msg = proto.decode(self.telemetry.recv_multipart(), expect=proto.Telemetry)
            self.counters, self.gauges, self.sent_at, self.seq = msg.counters, msg.gauges, msg.time, msg.seq

    def wait(self, condition: Callable[[], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            self.telemetry.poll(250)
            self.poll()
            if condition():
                return
            if self.proc.poll() is not None:
                raise BenchError(f"replay exited while waiting for {what} (see {self.log_path})")
            if time.monotonic() > deadline:
                raise BenchError(f"timed out after {timeout_s:.0f} s waiting for {what} (see {self.log_path})")

    def received(self) -> tuple[float, float]:
        """(the replay's clock, transitions it had received) from the next telemetry message."""
        seq = self.seq
        self.wait(lambda: self.seq != seq, 30, "telemetry")
        return self.sent_at, self.counters.get("transitions_received_total", 0.0)

    def command(self, command: str, **args: Any) -> None:
        self._seq += 1
        self.control.send_multipart(proto.encode(proto.Control(seq=self._seq, command=command, target="replay",
                                                               args=args)))

    def cpu_seconds(self) -> float:
        """User + system CPU time of the replay process, all its threads."""
        times = self.process.cpu_times()
        return float(times.user + times.system)

    def rss(self) -> int:
        return int(self.process.memory_info().rss)

    def pin(self, cpus: list[int]) -> None:
        """Pin every thread of the replay process to ``cpus`` (a checkpoint writer it forks later inherits them)."""
        pin_process(self.proc.pid, cpus)

    def close(self, kill: bool = False) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
            try:
                self.proc.wait(timeout=600)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for child in psutil.Process().children(recursive=True):  # a checkpoint writer left behind by a kill
            if child.pid != os.getpid() and "flywheel" in " ".join(child.cmdline()):
                child.kill()
        for segment in Path(SHM_DIR).glob(f"flywheel-replay-{self.proc.pid}-*"):  # a killed replay leaves them
            segment.unlink(missing_ok=True)
        for sock in Path(self.sock_prefix).parent.glob(f"{Path(self.sock_prefix).name}-*"):  # ipc socket files
            sock.unlink(missing_ok=True)
        self.telemetry.close(0)
        self.control.close(0)
        self.ctx.term()


class Sender:
    """A process pushing pre-built batches to the replay (see ``replay_data.sender_main``)."""

    def __init__(self, endpoint: str, kind: str, frames_file: Path, rows: int, total: int, seconds: float,
                 cpus: list[int], seed: int = 0, distinct: int = 24) -> None:
        self.result = SPAWN.Value("q", 0)
        self.proc = SPAWN.Process(target=sender_main, daemon=True, args=(
            endpoint, kind, str(frames_file), rows, distinct, total, seconds, cpus, seed, self.result))
        self.proc.start()

    def stop(self) -> int:
        if self.proc.is_alive():
            self.proc.terminate()
        self.proc.join(30)
        return int(self.result.value)

    def join(self, timeout_s: float) -> int:
        self.proc.join(timeout_s)
        return self.stop()


def insert_rate(service: ReplayService, sender_args: dict[str, Any], warm_rows: int, seconds: float,
                ) -> tuple[float, float]:
    """(rows per second, rows per CPU-second of the replay process), measured on the replay's own counter
    after ``warm_rows`` (its ring has wrapped: steady state)."""
    service.poll()
    start_count = service.counters.get("transitions_received_total", 0.0)
    sender = Sender(**sender_args, total=10**12, seconds=3600)
    try:
        service.wait(lambda: service.counters.get("transitions_received_total", 0.0) >= start_count + warm_rows,
                     300, "the warm-up inserts")
        t0, c0 = service.received()
        cpu0 = service.cpu_seconds()
        time.sleep(seconds)
        t1, c1 = service.received()
        cpu1 = service.cpu_seconds()
    finally:
        sender.stop()
    return (c1 - c0) / (t1 - t0), (c1 - c0) / max(cpu1 - cpu0, 1e-9)


def _client_main(endpoint: str, transport: str, batch: int, seconds: float, cpus: list[int], result: Any,
                 stop: Any = None, inflight: int = 4, side_pids: tuple[int, ...] = ()) -> None:
    """Sample for ``seconds``: after each batch, its priority update, then the release that sends the next
    request; with ``inflight=1`` the update reaches the replay before the next request (synchronous). CPU-seconds
    are those of this process and ``side_pids`` (the replay) over the same window."""
    from flywheel.services.replay.client import ReplayClient

    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus)
    rng = np.random.default_rng(0)
    arrivals: list[float] = []
    clock = SideClock([os.getpid(), *side_pids])
    with ReplayClient(endpoint, batch, inflight=inflight, transport=transport) as client:
        for _ in range(3):  # warm up: the first replies carry the shared-memory offer
            got = client.poll(timeout_ms=60_000)
            if got is None:
                raise SystemExit("no batch within 60 s")
            client.release(got)
        start = time.monotonic()
        clock.start()
        while time.monotonic() - start < seconds and not (stop is not None and stop.is_set()):
            got = client.poll(timeout_ms=1000)
            if got is None:
                continue
            arrivals.append(time.monotonic())
            assert got.obs.shape[0] == batch
            client.update_priorities(got.index, rng.uniform(0.1, 2, batch).astype(np.float32))
            client.release(got)
        result.put(clock.rates(len(arrivals)) | {
            "arrivals": arrivals, "shm": int(client.counters.shm_batches_total),
            "tcp": int(client.counters.tcp_batches_total),
            "start": start})


def sample_run(endpoint: str, transport: str, batch: int, seconds: float, cpus: list[int],
               stop: Any = None, inflight: int = 4, side_pids: tuple[int, ...] = ()) -> dict[str, Any]:
    """Run a sampling client in its own process (until ``seconds`` or ``stop`` is set); returns its batches per
    second (``rate``) and per CPU-second of it and ``side_pids`` (``rate_per_cpu``), arrival times and path
    counters."""
    return spawned_result(_client_main, lambda result: (endpoint, transport, batch, seconds, cpus, result, stop,
                                                        inflight, tuple(side_pids)),
                          seconds + 180, f"sampling client ({transport})")


class PeerProcess:
    """A peer in its own process(es), filled at start, answering one command at a time on stdin/stdout (one
    JSON line each: see ``cpprb_peer`` and ``reverb_peer``); its first line lists the ``pids`` of its side.
    Its stderr goes to a temporary file (TensorFlow logs a lot), whose last line names a failure."""

    name = "peer"

    def __init__(self, command: list[str]) -> None:
        self.stderr = tempfile.TemporaryFile("w+")
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr,
                                     text=True)
        self.pids: list[int] = [self.proc.pid]
        try:
            self.filled = self._answer()
        except BenchError:
            self.close()
            raise
        self.pids = [int(pid) for pid in self.filled.get("pids", self.pids)]
        self.started = {pid: psutil.Process(pid).create_time() for pid in self.pids[1:]}

    def pin(self, cpus: list[int]) -> None:
        """Pin every thread of every process of this peer's side to ``cpus``."""
        for pid in self.pids:
            pin_process(pid, cpus)

    def _answer(self) -> dict[str, Any]:
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if not line:
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                pass  # stdout closed but still running: the reason is in its stderr all the same
            self.stderr.seek(0)
            last = [text for text in self.stderr.read().strip().splitlines() if text.strip()][-1:]
            raise BenchError(f"{self.name} peer failed (exit {self.proc.returncode}): {last or 'no output'}")
        return json.loads(line)

    def ask(self, command: str) -> dict[str, Any]:
        """Send one command and return its JSON answer."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write(command + "\n")
            self.proc.stdin.flush()
        except OSError:
            pass  # it has exited: _answer says why
        return self._answer()

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.ask("quit")
            except (BenchError, OSError, ValueError, subprocess.TimeoutExpired):
                pass
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        for pid, created in getattr(self, "started", {}).items():  # a server its main process could not stop
            try:
                leftover = psutil.Process(pid)
                if leftover.create_time() == created:  # the same process, not a new one with its pid
                    leftover.kill()
            except psutil.Error:
                pass
        self.stderr.close()


class CpprbPeer(PeerProcess):
    """``cpprb_peer``: cpprb's PrioritizedReplayBuffer in-process, in its own process."""

    name = "cpprb"

    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__([sys.executable, "-m", "flywheel.bench.peers.cpprb_peer", json.dumps(config)])


class ReverbPeer(PeerProcess):
    """``reverb_peer.py`` run by Reverb's own venv interpreter ``python``: a server process and a gRPC client."""

    name = "Reverb"

    def __init__(self, python: Path, config: dict[str, Any]) -> None:
        script = Path(__file__).resolve().parent / "reverb_peer.py"
        super().__init__([str(python), str(script), json.dumps(config)])


def reverb_maker(python: Path | None, config: dict[str, Any]) -> Callable[[], PeerProcess] | None:
    """What starts a Reverb peer with ``config`` and a free port (None without Reverb's ``python``)."""
    if python is None:
        return None
    return lambda: ReverbPeer(python, config | {"port": free_port()})


class OptionalPeer:
    """A peer (Reverb) whose failure costs its rows, not the whole run: ``on_failure`` gets the reason once and
    every later ``ask`` answers None."""

    def __init__(self, make: Callable[[], PeerProcess] | None, on_failure: Callable[[str], None]) -> None:
        self.on_failure, self.peer = on_failure, None
        if make is not None:
            try:
                self.peer = make()
            except BenchError as exc:
                self._failed(str(exc))

    def _failed(self, why: str) -> None:
        self.on_failure(why)
        self.close()

    def ask(self, command: str) -> dict[str, Any] | None:
        if self.peer is None:
            return None
        try:
            return self.peer.ask(command)
        except BenchError as exc:
            self._failed(str(exc))
            return None

    def pin(self, cpus: list[int]) -> None:
        if self.peer is not None:
            try:
                self.peer.pin(cpus)
            except psutil.Error as exc:
                self._failed(f"cannot pin its processes: {exc}")

    def close(self) -> None:
        if self.peer is not None:
            self.peer.close()
            self.peer = None
