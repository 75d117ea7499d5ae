"""Filming the greedy policy for the gateway's live page: one episode per interval, in a thread of its own.

The filmer builds its own network from the weights the actor is acting with, plays one greedy episode on an env
of its own with flywheel.video (an mp4 at the env's frame rate and full resolution), and PUSHes it to the
gateway's telemetry socket in ClipChunk pieces, with the episode's progress and success (flywheel.envs.measures).
Acting never waits for it.
"""

from __future__ import annotations

import logging
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import zmq

from flywheel import proto
from flywheel.transport import connect, make_socket

from .policy import Policy

log = logging.getLogger("flywheel.actor")
MAX_CLIP_BYTES = 16 << 20  # the gateway's cap for one clip
FIRST_CLIP_DELAY_S = 30.0  # the live page gets its first clip soon after the first weights


class _Greedy:
    """flywheel.video's policy interface over an actor network: argmax Q."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy

    def predict(self, obs: np.ndarray, *, epsilon: float = 0.0, rng: Any = None) -> np.ndarray:
        return np.argmax(self.policy.q_values(obs), axis=-1)


class ClipFilmer:
    """Films a greedy episode every ``interval_s`` once weights act (a new version each time), in a thread.

    ``weights`` is the actor's WeightsReceiver (its ``acting`` message is read, never changed); ``make_policy``
    builds a network like the actor's.
    """

    def __init__(self, ctx: zmq.Context, endpoint: str, instance: str, env_id: str, weights: Any,
                 make_policy: Callable[[], Policy], *, interval_s: float, max_steps: int) -> None:
        self.ctx, self.endpoint, self.instance, self.env_id = ctx, endpoint, instance, env_id
        self.weights, self.make_policy = weights, make_policy
        self.interval_s, self.max_steps = interval_s, max_steps
        self.sent = 0
        self.failed = 0
        self.seconds = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="clip-filmer", daemon=True)

    def start(self) -> ClipFilmer:
        self._thread.start()
        log.info("clips: one greedy episode of %s every %g s (at most %d steps) to %s", self.env_id,
                 self.interval_s, self.max_steps, self.endpoint)
        return self

    def _run(self) -> None:
        sock = make_socket(self.ctx, zmq.PUSH, sndhwm=512)
        sock.setsockopt(zmq.SNDTIMEO, 10_000)
        connect(sock, self.endpoint)
        filmed_version, wait, env = 0, min(self.interval_s, FIRST_CLIP_DELAY_S), None
        policy: Policy | None = None
        try:
            while not self._stop.wait(wait):
                msg = self.weights.acting
                if msg is None or msg.version == filmed_version:
                    wait = min(self.interval_s, 5.0)  # no (new) weights yet: look again soon
                    continue
                wait = self.interval_s
                began = time.monotonic()
                try:
                    if env is None or policy is None:
                        from flywheel.video import make_play_env

                        env, fps = make_play_env(self.env_id, True)
                        policy = self.make_policy()
                    policy.load(msg)
                    self._send(sock, self._film(_Greedy(policy), env, fps, msg.version))
                    filmed_version = msg.version
                    self.sent += 1
                except Exception as exc:  # a clip is a bonus: acting goes on whatever filming does
                    self.failed += 1
                    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                    if "extra" in first and "pip install" in first:  # missing the video extra: it stays missing
                        log.warning("clips: no clips for the live page: %s", first)
                        return
                    log.warning("clips: filming weights v%d failed: %s", msg.version, first)
                self.seconds += time.monotonic() - began
        finally:
            sock.close(0)
            if env is not None:
                env.close()

    def _film(self, policy: _Greedy, env: Any, fps: float, version: int) -> tuple[dict[str, Any], bytes]:
        from flywheel.video import VideoWriter, play_episodes

        with tempfile.TemporaryDirectory(prefix="flywheel-clip-") as tmp:
            path = Path(tmp) / "clip.mp4"
            with VideoWriter(path, fps) as video:
                [episode] = play_episodes(policy, env, 1, seed=self.sent, video=video, max_steps=self.max_steps)
            data = path.read_bytes()
        if not 0 < len(data) <= MAX_CLIP_BYTES:
            raise ValueError(f"the clip has {len(data)} bytes (at most {MAX_CLIP_BYTES}); lower clip_max_steps")
        log.info("clips: filmed weights v%d: %s (%d frames, %d KiB)", version, episode.line(), episode.frames,
                 len(data) >> 10)
        meta = {"weight_version": version, "fps": fps, "frames": episode.frames, "episode_return": episode.ret,
                "length": episode.length, "progress": -1.0 if episode.progress is None else episode.progress,
                "success": bool(episode.success)}
        return meta, data

    def _send(self, sock: zmq.Socket, clip: tuple[dict[str, Any], bytes]) -> None:
        meta, data = clip
        size = proto.CLIP_CHUNK_BYTES
        count = -(-len(data) // size)
        raw = np.frombuffer(data, dtype=np.uint8)
        clip_id, now = int(time.time() * 1000), time.time()
        for index in range(count):
            piece = proto.ClipChunk(self.instance, clip_id, index, count, len(data), env_id=self.env_id, time=now,
                                    data=raw[index * size:(index + 1) * size], **meta)
            sock.send_multipart(proto.encode(piece), copy=False)  # waits up to SNDTIMEO, then zmq.Again

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
