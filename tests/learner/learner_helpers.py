"""Helpers for the learner tests: CartPole-shaped sample batches, and a learner process run until its first weights."""

from __future__ import annotations

import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import zmq

from flywheel import proto
from flywheel.services.learner.core import LearnerCore
from flywheel.testing.reported import LEARNER_WEIGHTS, reported
from flywheel.testing.run import clean_env
from flywheel.transport import subscriber

SPEC = SimpleNamespace(obs_shape=(4,), n_actions=2)  # CartPole's, without building the env

# A learner process for SPEC, configured by its environment (learner_env).
SCRIPT = """
import sys
from types import SimpleNamespace
from flywheel.services.learner.main import main
from flywheel.services.learner.settings import LearnerSettings
sys.exit(main(LearnerSettings(), spec=SimpleNamespace(obs_shape=(4,), n_actions=2)))
"""


def make_batch(rng: np.random.Generator, size: int = 32, obs_shape: tuple[int, ...] = (4,), n_actions: int = 2,
               request_id: int = 0, pixels: bool = False) -> proto.SampleBatch:
    if pixels:
        obs = rng.integers(0, 256, (size, *obs_shape), dtype=np.uint8)
        next_obs = rng.integers(0, 256, (size, *obs_shape), dtype=np.uint8)
    else:
        obs = rng.standard_normal((size, *obs_shape)).astype(np.float32)
        next_obs = rng.standard_normal((size, *obs_shape)).astype(np.float32)
    return proto.SampleBatch(
        request_id=request_id, replay_size=1000, obs=obs,
        action=rng.integers(0, n_actions, size, dtype=np.int64),
        reward=rng.standard_normal(size).astype(np.float32),
        discount=np.full(size, 0.99**3, dtype=np.float32),
        next_obs=next_obs, index=rng.integers(0, 1000, size, dtype=np.int64),
        weight=rng.uniform(0.2, 1.0, size).astype(np.float32),
    )


def fit_one_step_rewards(core: LearnerCore, seed: int, updates: int = 300) -> tuple[np.ndarray, np.ndarray]:
    """Train ``core`` (4 one-hot states, 2 actions) on transitions that end at once (discount 0), so Q(s, a) must
    converge to the reward of (s, a); returns (Q of every state after training, the rewards table)."""
    rng = np.random.default_rng(seed)
    states = np.eye(4, dtype=np.float32)
    table = rng.uniform(-1, 1, (4, 2)).astype(np.float32)
    for _ in range(updates):
        s, a = rng.integers(0, 4, 64), rng.integers(0, 2, 64)
        core.update(proto.SampleBatch(
            request_id=0, replay_size=8, obs=states[s], action=a.astype(np.int64), reward=table[s, a],
            discount=np.zeros(64, np.float32), next_obs=states[s], index=np.arange(64, dtype=np.int64),
            weight=np.ones(64, np.float32)))
    return core.q_values(states), table


def learner_env(checkpoint_dir: Path, **extra: str) -> dict[str, str]:
    """A learner process's environment: weights on a port the kernel picks, its other peers inproc endpoints
    nobody binds, one CPU thread, weights published again every 0.2 s (a late subscriber still gets the first)."""
    return clean_env(**{
        "FLYWHEEL_LEARNER_CHECKPOINT_DIR": str(checkpoint_dir),
        "FLYWHEEL_LEARNER_WEIGHTS_BIND": "tcp://127.0.0.1:0",
        "FLYWHEEL_LEARNER_SAMPLE_ENDPOINT": "inproc://no-replay",  # connected, never bound: nothing answers
        "FLYWHEEL_LEARNER_TELEMETRY_ENDPOINT": "inproc://no-gateway",
        "FLYWHEEL_LEARNER_CONTROL_ENDPOINT": "inproc://no-gateway-control",
        "FLYWHEEL_LEARNER_TORCH_THREADS": "1", "FLYWHEEL_LEARNER_DEVICE": "cpu",
        "FLYWHEEL_LEARNER_WEIGHTS_REPUBLISH_S": "0.2", **extra,
    })


@dataclass
class StoppedLearner:
    weights: proto.Weights  # the first weights it published
    returncode: int
    err: str  # its log


def first_weights_then_stop(checkpoint_dir: Path, *, wait_s: float = 60, stop_s: float = 40,
                            **extra: str) -> StoppedLearner:
    """Start a learner process (``learner_env`` with ``extra``), read the first weights it publishes within
    ``wait_s`` seconds, stop it with SIGTERM and wait up to ``stop_s`` seconds for it to exit."""
    log = checkpoint_dir.parent / f"{checkpoint_dir.name}-learner.log"
    ctx = zmq.Context()
    sub = None
    with open(log, "w") as err_out:
        proc = subprocess.Popen([sys.executable, "-c", SCRIPT], env=learner_env(checkpoint_dir, **extra),
                                stderr=err_out, text=True)
    try:
        (endpoint,) = reported(log, LEARNER_WEIGHTS, wait_s)  # its start line names the port it bound
        sub = subscriber(ctx, endpoint)
        assert sub.poll(int(wait_s * 1000)), "no weights published"
        weights = proto.decode(sub.recv_multipart(), expect=proto.Weights)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=stop_s)
    finally:
        proc.kill()
        if sub is not None:
            sub.close()
        ctx.term()
    return StoppedLearner(weights, proc.returncode, log.read_text(errors="replace"))
