"""Data for the replay benchmark: Mario frames, actor-shaped transition batches, and a sender process."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from flywheel import proto

if TYPE_CHECKING:
    from multiprocessing.sharedctypes import Synchronized

MARIO_ID = "SuperMarioBros-1-1-v0"


def mario_frames(count: int, cache: Path, seed: int = 0) -> tuple[np.ndarray, str]:
    """``count`` consecutive 84x84 frames of Mario played with random right-leaning actions (cached), or
    synthetic frames (a scrolling pattern with noise) when the emulator is not available."""
    file = cache / f"replay_mario_frames_{count}.npy"
    if file.exists():
        return np.load(file, allow_pickle=False), "Mario 1-1 (emulator, cached)"
    try:
        from flywheel.envs import make_env

        env = make_env(MARIO_ID, seed=seed)
        obs, _ = env.reset(seed=seed)
        rng = np.random.default_rng(seed)
        frames = np.empty((count, 84, 84), np.uint8)
        for i in range(count):
            frames[i] = obs[-1]
            obs, _, term, trunc, _ = env.step(int(rng.choice([1, 2, 3, 4, 0], p=[0.3, 0.3, 0.2, 0.1, 0.1])))
            if term or trunc:
                obs, _ = env.reset()
        env.close()
        cache.mkdir(parents=True, exist_ok=True)
        np.save(file, frames, allow_pickle=False)
        return frames, "Mario 1-1 (emulator)"
    except Exception:  # any emulator trouble: fall back to synthetic frames
        rng = np.random.default_rng(seed)
        base = rng.integers(0, 256, (84, 84 + count), dtype=np.uint8)
        frames = np.stack([base[:, i:i + 84] for i in range(count)])
        return frames, "synthetic scrolling frames (no emulator)"


class MarioStreams:
    """Transition batches as an actor with ``streams`` envs sends them: (4, 84, 84) stacks oldest first, the
    first frame repeated at reset, 3-step rows (one per env and step, all of an episode's last rows newest first
    at its end) and the ``stream`` column. Env frames walk the pool from their own offsets and carry a stamp
    (step counter, env), as a game's timer or score would, so no two steps share bytes by accident and the
    replay can only share what stacks really share.
    """

    def __init__(self, frames: np.ndarray, streams: int = 16, n_step: int = 3, depth: int = 4,
                 episode: tuple[int, int] = (200, 1000), seed: int = 0, actor: str = "bench-actor",
                 max_steps_per_batch: int = 64) -> None:
        self.frames, self.streams, self.n_step, self.depth = frames, streams, n_step, depth
        self.rng = np.random.default_rng(seed)
        self.episode, self.actor = episode, actor
        self.ring = depth + n_step + 2 + max_steps_per_batch
        self.history = np.zeros((streams * self.ring, *frames.shape[1:]), np.uint8)
        self.cursor = self.rng.integers(0, len(frames), streams)
        self.t = np.zeros(streams, np.int64)
        self.written = np.zeros(streams, np.int64)  # frames written per env: its ring position
        self.length = self.rng.integers(*episode, size=streams)
        self.clock = int(self.rng.integers(0, 2**40))
        self.episode_start = np.zeros(streams, np.int64)  # ring position of each env's reset frame
        self.seq = 0
        self._write_frames(np.arange(streams))

    def _write_frames(self, envs: np.ndarray) -> None:
        """The frame of step t[env] for each env, appended to its history ring."""
        self.clock += 1
        new = self.frames[(self.cursor[envs] + self.t[envs]) % len(self.frames)]
        stamp = np.zeros((len(envs), 2), np.int64)
        stamp[:, 0], stamp[:, 1] = self.clock, envs
        new.reshape(len(envs), -1)[:, :16] = stamp.view(np.uint8)
        self.history[envs * self.ring + self.written[envs] % self.ring] = new
        self.written[envs] += 1

    def _stack_index(self, envs: np.ndarray, steps: np.ndarray) -> np.ndarray:
        """History rows of the stacks at ``steps`` (steps since each env's reset; the reset frame repeats)."""
        window = np.maximum(steps[:, None] + np.arange(1 - self.depth, 1)[None, :], 0)
        return envs[:, None] * self.ring + (self.episode_start[envs][:, None] + window) % self.ring

    def _step(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One vector step: history rows of the obs and next_obs stacks it emits, and their streams."""
        self.t += 1
        envs = np.arange(self.streams)
        self._write_frames(envs)
        done = self.t >= self.length
        ready = np.nonzero(~done & (self.t >= self.n_step))[0]
        parts = [(ready, self.t[ready] - self.n_step, self.t[ready])]
        for env in np.nonzero(done)[0]:
            t = int(self.t[env])
            starts = np.arange(t - 1, max(-1, t - self.n_step - 1), -1)
            parts.append((np.full(starts.size, env), starts, np.full(starts.size, t)))
        env_ids, obs_t, next_t = (np.concatenate([p[i] for p in parts]).astype(np.int64) for i in range(3))
        out = self._stack_index(env_ids, obs_t), self._stack_index(env_ids, next_t), env_ids
        ended = np.nonzero(done)[0]
        if ended.size:
            self.cursor[ended] = (self.cursor[ended] + self.t[ended] + 1) % len(self.frames)
            self.t[ended] = 0
            self.length[ended] = self.rng.integers(*self.episode, size=ended.size)
            self.episode_start[ended] = self.written[ended] % self.ring
            self._write_frames(ended)
        return out

    def batch(self, rows: int, out: tuple[np.ndarray, np.ndarray] | None = None) -> proto.TransitionBatch:
        """At least ``rows`` rows (whole vector steps); observations go into ``out`` buffers when given."""
        parts = []
        count = 0
        while count < rows:
            parts.append(self._step())
            count += len(parts[-1][2])
        obs_index, next_index, stream = (np.concatenate([p[i] for p in parts]) for i in range(3))
        if out is None:
            out = (np.empty((count, self.depth, *self.frames.shape[1:]), np.uint8),) * 2
            out = (out[0], np.empty_like(out[0]))
        obs, next_obs = out[0][:count], out[1][:count]
        np.take(self.history, obs_index.reshape(-1), axis=0, out=obs.reshape(-1, *self.frames.shape[1:]))
        np.take(self.history, next_index.reshape(-1), axis=0, out=next_obs.reshape(-1, *self.frames.shape[1:]))
        self.seq += 1
        return proto.TransitionBatch(
            actor=self.actor, weight_version=0, seq=self.seq, obs=obs, action=self.rng.integers(0, 7, count),
            reward=self.rng.normal(size=count).astype(np.float32), discount=np.full(count, 0.97, np.float32),
            next_obs=next_obs, priority=self.rng.uniform(0.1, 2, count).astype(np.float32), stream=stream)


def cartpole_batch(rows: int, seed: int) -> proto.TransitionBatch:
    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(rows, 4)).astype(np.float32)
    return proto.TransitionBatch(
        actor="bench-actor", weight_version=0, seq=seed, obs=obs, action=rng.integers(0, 2, rows),
        reward=np.ones(rows, np.float32), discount=np.full(rows, 0.97, np.float32), next_obs=obs + 0.01,
        priority=rng.uniform(0.1, 2, rows).astype(np.float32), stream=np.arange(rows, dtype=np.int64) % 16)


def sender_main(endpoint: str, kind: str, frames_file: str, batch_rows: int, distinct: int, total_rows: int,
                seconds: float, cpus: list[int], seed: int, result: Synchronized[int]) -> None:
    """Push pre-built batches (``distinct`` of them, cycled) until ``total_rows`` rows or ``seconds`` passed."""
    import zmq

    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus)
    trackers: list = []
    if kind == "mario":
        streams = MarioStreams(np.load(frames_file, allow_pickle=False), seed=seed)
        most = batch_rows + streams.streams * streams.n_step
        buffers = [(np.zeros((most, 4, 84, 84), np.uint8), np.zeros((most, 4, 84, 84), np.uint8)) for _ in range(16)]
        trackers = [None] * len(buffers)

        def next_batch(i: int) -> list:
            slot = i % len(buffers)
            if trackers[slot] is not None:
                trackers[slot].wait()  # zmq has sent what this buffer held: reuse it (no page faults)
            return proto.encode(streams.batch(batch_rows, out=buffers[slot]))  # fresh frames, as actors send
    else:
        prebuilt = [proto.encode(cartpole_batch(batch_rows, seed + i)) for i in range(distinct)]

        def next_batch(i: int) -> list:
            return prebuilt[i % len(prebuilt)]
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.SNDHWM, 8)
    push.setsockopt(zmq.LINGER, 2000)
    push.connect(endpoint)
    sent = 0
    start = time.monotonic()
    i = 0
    while sent < total_rows and time.monotonic() - start < seconds:
        frames = next_batch(i)
        tracker = push.send_multipart(frames, copy=False, track=True)
        if trackers:
            trackers[i % len(trackers)] = tracker
        sent += batch_rows_of(frames)
        i += 1
    push.close()
    ctx.term()
    result.value = sent


def batch_rows_of(frames: list) -> int:
    """Rows of an encoded transition batch (its header lists the arrays' shapes)."""
    import msgpack

    header = msgpack.unpackb(bytes(frames[0]))
    return int(next(shape[0] for name, _, shape in header["a"] if name == "action"))
