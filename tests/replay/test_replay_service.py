"""`flywheel replay` as a process: SIGTERM checkpoint, restore on start, refused checkpoints, demonstrations."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import zmq
from replay_helpers import ActorStreams

from flywheel import proto
from flywheel.demos import DemoWriter
from flywheel.processes import launch
from flywheel.services.replay.client import ReplayClient

pytestmark = pytest.mark.system


@pytest.fixture(autouse=True)
def _remove_sockets(tmp_path: Path) -> Iterator[None]:
    """The ipc socket files ``endpoints`` names live in /tmp (short paths): removed after each test."""
    yield
    for path in Path("/tmp").glob(f"fw-replay-{os.getpid()}-{tmp_path.name[-20:]}-*"):
        path.unlink(missing_ok=True)


def endpoints(tmp_path: Path) -> dict[str, str]:
    sock = Path(f"/tmp/fw-replay-{os.getpid()}-{tmp_path.name[-20:]}")  # ipc paths must stay short
    return {name: f"ipc://{sock}-{name}" for name in ("transitions", "sample", "telemetry", "control")}


def start(tmp_path: Path, ep: dict[str, str], **extra: str) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLYWHEEL_")}
    settings = {"TRANSITIONS_BIND": ep["transitions"], "SAMPLE_BIND": ep["sample"],
                "TELEMETRY_ENDPOINT": ep["telemetry"], "CONTROL_ENDPOINT": ep["control"],
                "CHECKPOINT_DIR": str(tmp_path / "ckpt"), "MIN_SIZE_TO_SAMPLE": "10", "CAPACITY": "500"} | extra
    env.update({f"FLYWHEEL_REPLAY_{k}": v for k, v in settings.items()})
    return launch(["replay"], env, tmp_path / "replay.log")


def stop(proc: subprocess.Popen[bytes]) -> int:
    proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise


def sample_one(endpoint: str) -> proto.SampleBatch:
    with ReplayClient(endpoint, 8, inflight=1) as client:
        batch = client.poll(timeout_ms=20_000)
        assert batch is not None, "the replay did not answer"
        client.release(batch)
        return batch


def test_sigterm_checkpoints_and_a_restart_restores(tmp_path: Path) -> None:
    ep = endpoints(tmp_path)
    streams = ActorStreams(envs=2, depth=4, n_step=3, frame=(16, 16), seed=41)
    proc = start(tmp_path, ep)
    try:
        ctx = zmq.Context()
        push = ctx.socket(zmq.PUSH)
        push.connect(ep["transitions"])
        for _ in range(4):
            push.send_multipart(proto.encode(streams.batch(30)))
        first = sample_one(ep["sample"])  # may be answered before every batch is in: stop only once all are
        deadline = time.monotonic() + 20
        while first.replay_size < streams.position and time.monotonic() < deadline:
            first = sample_one(ep["sample"])
        push.close(0)
        ctx.term()
    finally:
        assert stop(proc) == 0
    assert (tmp_path / "ckpt" / "replay" / "manifest.json").exists()
    proc = start(tmp_path, ep)
    try:
        batch = sample_one(ep["sample"])
        assert batch.replay_size >= first.replay_size and batch.replay_size == streams.position
        for i, position in enumerate(batch.index):
            obs, next_obs = streams.sent[int(position)]
            assert np.array_equal(batch.obs[i], obs) and np.array_equal(batch.next_obs[i], next_obs)
    finally:
        assert stop(proc) == 0
    assert "restored" in (tmp_path / "replay.log").read_text()

    # A damaged checkpoint stops the service with a clear error ...
    file = tmp_path / "ckpt" / "replay" / "storage.frames.frames.npy"
    data = bytearray(file.read_bytes())
    data[-1] ^= 0xFF
    file.write_bytes(bytes(data))
    proc = start(tmp_path, ep)
    assert proc.wait(timeout=60) == 2
    assert "cannot restore replay checkpoint" in (tmp_path / "replay.log").read_text()
    assert "CRC" in (tmp_path / "replay.log").read_text()
    # ... unless starting empty was asked for: then the bad one is kept aside, not overwritten.
    proc = start(tmp_path, ep, START_EMPTY_ON_BAD_CHECKPOINT="true")
    try:
        ctx = zmq.Context()
        push = ctx.socket(zmq.PUSH)
        push.connect(ep["transitions"])
        fresh = ActorStreams(envs=1, depth=4, n_step=3, frame=(16, 16), seed=42)
        push.send_multipart(proto.encode(fresh.batch(12)))
        assert sample_one(ep["sample"]).replay_size == fresh.position
        push.close(0)
        ctx.term()
    finally:
        assert stop(proc) == 0
    assert len(list((tmp_path / "ckpt").glob("replay.refused-*"))) == 1


def test_demonstrations_are_loaded_and_sampled(tmp_path: Path) -> None:
    ep = endpoints(tmp_path)
    rng = np.random.default_rng(43)
    with DemoWriter(tmp_path / "demos", env_id="test", obs_shape=(4, 16, 16), obs_dtype="uint8", n_step=3,
                    gamma=0.99) as writer:
        for steps in (20, 30):
            writer.add_episode(rng.integers(0, 256, (steps + 1, 4, 16, 16), dtype=np.uint8),
                               rng.integers(0, 4, steps), rng.normal(size=steps), terminated=True)
    proc = start(tmp_path, ep, DEMO_PATH=str(tmp_path / "demos"), DEMO_RATIO="0.25")
    try:
        ctx = zmq.Context()
        push = ctx.socket(zmq.PUSH)
        push.connect(ep["transitions"])
        push.send_multipart(proto.encode(ActorStreams(envs=2, depth=4, n_step=3, frame=(16, 16)).batch(20)))
        batch = sample_one(ep["sample"])
        assert int(batch.is_demo.sum()) == 2 and np.all(batch.index[batch.is_demo == 1] < 0)
        push.close(0)
        ctx.term()
    finally:
        assert stop(proc) == 0
    assert "demonstrations: 50 transitions" in (tmp_path / "replay.log").read_text()


@pytest.mark.parametrize("setup", ["missing", "wrong_shape"])
def test_bad_demonstrations_stop_the_service(tmp_path: Path, setup: str) -> None:
    if setup == "wrong_shape":
        with DemoWriter(tmp_path / "demos", env_id="test", obs_shape=(2, 16, 16), obs_dtype="uint8", n_step=3,
                        gamma=0.99) as writer:
            writer.add_episode(np.zeros((3, 2, 16, 16), np.uint8), np.zeros(2, np.int64), np.zeros(2),
                               terminated=True)
        # A checkpoint holding (4, 16, 16) frames: the demonstrations do not match what the replay holds.
        ep = endpoints(tmp_path)
        proc = start(tmp_path, ep)
        ctx = zmq.Context()
        push = ctx.socket(zmq.PUSH)
        push.connect(ep["transitions"])
        push.send_multipart(proto.encode(ActorStreams(envs=1, depth=4, n_step=3, frame=(16, 16)).batch(12)))
        sample_one(ep["sample"])
        push.close(0)
        ctx.term()
        assert stop(proc) == 0
    proc = start(tmp_path, endpoints(tmp_path), DEMO_PATH=str(tmp_path / "demos"), DEMO_RATIO="0.1")
    assert proc.wait(timeout=60) == 2
    assert "cannot load demonstrations" in (tmp_path / "replay.log").read_text()
