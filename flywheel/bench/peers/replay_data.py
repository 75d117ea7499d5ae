"""Data for the replay benchmark: Mario frames, actor-shaped transition batches, and a sender process."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from flywheel import proto

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
    """Transition batches as an actor with ``streams`` envs sends them: (4, 84, 84) stacks, n-step rows,
    the ``stream`` column set. Each env walks the frame pool from its own offset; episodes last
    ``episode`` steps."""

    def __init__(self, frames: np.ndarray, streams: int = 16, n_step: int = 3, depth: int = 4,
                 episode: tuple[int, int] = (200, 1000), seed: int = 0, actor: str = "bench-actor") -> None:
        self.frames, self.streams, self.n_step, self.depth = frames, streams, n_step, depth
        self.rng = np.random.default_rng(seed)
        self.episode, self.actor = episode, actor
        self.cursor = self.rng.integers(0, len(frames), streams)
        self.t = np.zeros(streams, np.int64)
        self.length = self.rng.integers(*episode, size=streams)
        self.seq = 0

    def _stack(self, env: int, t: int) -> np.ndarray:
        # Frame of step s is pool[cursor + s]; steps before 0 repeat the first frame (reset fills the stack).
        steps = np.maximum(np.arange(t - self.depth + 1, t + 1), 0)
        return self.frames[(self.cursor[env] + steps) % len(self.frames)]

    def batch(self, rows: int) -> proto.TransitionBatch:
        obs, next_obs, streams = [], [], []
        while len(obs) < rows:
            for env in range(self.streams):
                self.t[env] += 1
                t = int(self.t[env])
                if t >= self.length[env]:  # episode end: the last rows, newest first
                    for start in range(t - 1, max(-1, t - self.n_step - 1), -1):
                        obs.append(self._stack(env, start))
                        next_obs.append(self._stack(env, t))
                        streams.append(env)
                    self.cursor[env] = (self.cursor[env] + t + 1) % len(self.frames)
                    self.t[env] = 0
                    self.length[env] = self.rng.integers(*self.episode)
                elif t >= self.n_step:
                    obs.append(self._stack(env, t - self.n_step))
                    next_obs.append(self._stack(env, t))
                    streams.append(env)
        count = len(obs)
        self.seq += 1
        return proto.TransitionBatch(
            actor=self.actor, weight_version=0, seq=self.seq, obs=np.stack(obs), action=self.rng.integers(0, 7, count),
            reward=self.rng.normal(size=count).astype(np.float32), discount=np.full(count, 0.97, np.float32),
            next_obs=np.stack(next_obs), priority=self.rng.uniform(0.1, 2, count).astype(np.float32),
            stream=np.array(streams, np.int64))


def cartpole_batch(rows: int, seed: int) -> proto.TransitionBatch:
    rng = np.random.default_rng(seed)
    obs = rng.normal(size=(rows, 4)).astype(np.float32)
    return proto.TransitionBatch(
        actor="bench-actor", weight_version=0, seq=seed, obs=obs, action=rng.integers(0, 2, rows),
        reward=np.ones(rows, np.float32), discount=np.full(rows, 0.97, np.float32), next_obs=obs + 0.01,
        priority=rng.uniform(0.1, 2, rows).astype(np.float32), stream=np.arange(rows, dtype=np.int64) % 16)


def sender_main(endpoint: str, kind: str, frames_file: str, batch_rows: int, distinct: int, total_rows: int,
                seconds: float, cpus: list[int], seed: int, result: object) -> None:
    """Push pre-built batches (``distinct`` of them, cycled) until ``total_rows`` rows or ``seconds`` passed."""
    import zmq

    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus)
    if kind == "mario":
        streams = MarioStreams(np.load(frames_file, allow_pickle=False), seed=seed)
        batches = [proto.encode(streams.batch(batch_rows)) for _ in range(distinct)]
    else:
        batches = [proto.encode(cartpole_batch(batch_rows, seed + i)) for i in range(distinct)]
    rows = [batch_rows_of(frames) for frames in batches]
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.SNDHWM, 8)
    push.setsockopt(zmq.LINGER, 2000)
    push.connect(endpoint)
    sent = 0
    start = time.monotonic()
    i = 0
    while sent < total_rows and time.monotonic() - start < seconds:
        push.send_multipart(batches[i % len(batches)], copy=False)
        sent += rows[i % len(batches)]
        i += 1
    push.close()
    ctx.term()
    result.value = sent  # type: ignore[attr-defined]


def batch_rows_of(frames: list) -> int:
    """Rows of an encoded transition batch (its header lists the arrays' shapes)."""
    import msgpack

    header = msgpack.unpackb(bytes(frames[0]))
    return int(next(shape[0] for name, _, shape in header["a"] if name == "action"))
