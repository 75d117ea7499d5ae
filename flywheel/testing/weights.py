"""A learner's weights followed from its PUB socket: the versions seen and a local network at the newest.

The one weights subscriber of tests and benchmarks; it connects through flywheel.transport, so CURVE keys in
this process's settings apply as they do for an actor.
"""

from __future__ import annotations

import re
import threading
import time
from typing import Any

import numpy as np
import zmq

from flywheel import proto
from flywheel.transport import queued_messages, subscriber


class WeightsWatcher:
    """Subscribes to a learner's weights PUB; records (time.monotonic(), version) of each message in ``seen``.

    With ``obs_shape`` and ``n_actions`` it also keeps a local network at the newest version, built from the
    first message's name (e.g. ``mlp-4-2-dueling-h64``), for greedy evaluation through ``q_values``.
    ``follow()`` drains the socket in a thread, for callers that only need the versions.
    """

    def __init__(self, endpoint: str, obs_shape: tuple[int, ...] | None = None, n_actions: int | None = None,
                 *, rcvhwm: int | None = None) -> None:
        self.endpoint = endpoint
        self.obs_shape, self.n_actions = obs_shape, n_actions
        self.net: Any = None
        self.version = 0
        self.rejected = 0
        self.seen: list[tuple[float, int]] = []
        self._ctx = zmq.Context()
        hwm = rcvhwm if rcvhwm is not None else (2 if obs_shape is not None else 100)  # nets are big; versions small
        self._sock = subscriber(self._ctx, endpoint, rcvhwm=hwm, max_msg_bytes=512 << 20)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def follow(self) -> WeightsWatcher:
        """Record versions in a background thread from now on (no network is loaded in this mode)."""
        if self.obs_shape is not None:
            raise ValueError("follow() records versions only; build the watcher without obs_shape")
        self._thread = threading.Thread(target=self._follow, name="weights-watcher", daemon=True)
        self._thread.start()
        return self

    def _follow(self) -> None:
        while not self._stop.is_set():
            self._drain(100)

    def _drain(self, timeout_ms: int) -> proto.Weights | None:
        """Receive what is queued (waiting up to ``timeout_ms`` for the first); the newest valid message."""
        newest = None
        if not self._sock.poll(timeout_ms):
            return None
        for msg in queued_messages(self._sock, proto.Weights, self._refused):
            self.seen.append((time.monotonic(), msg.version))
            if newest is None or msg.version > newest.version:
                newest = msg
        return newest

    def _refused(self, _exc: proto.DecodeError) -> None:
        self.rejected += 1

    def _build(self, name: str) -> Any:
        from flywheel.nets import build_q_network

        hidden = re.search(r"-h(\d+)$", name)
        assert self.obs_shape is not None and self.n_actions is not None
        return build_q_network(self.obs_shape, self.n_actions, dueling="-dueling" in name,
                               hidden=int(hidden.group(1)) if hidden else 256).eval()

    def poll(self, timeout_ms: int = 0) -> bool:
        """Wait up to ``timeout_ms`` for weights, drain the socket, load the newest; True when the net changed."""
        from flywheel.nets import WeightsMismatch, load_weights

        newest = self._drain(timeout_ms)
        if newest is None or newest.version <= self.version:
            return False
        if self.obs_shape is None:
            self.version = newest.version
            return True
        try:
            if self.net is None or self.net.name != newest.network:
                self.net = self._build(newest.network)
            load_weights(self.net, newest, self.net.name)
        except (WeightsMismatch, ValueError):
            self.rejected += 1
            return False
        self.version = newest.version
        return True

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        import torch

        torch.set_num_threads(1)
        with torch.inference_mode():
            return self.net(torch.from_numpy(np.asarray(obs))).float().numpy()

    def newest(self, since: float = float("-inf"), before: float = float("inf")) -> int:
        """The highest version that arrived in [since, before); 0 when none did."""
        return max((v for t, v in list(self.seen) if since <= t < before), default=0)

    def first(self, since: float) -> tuple[float, int] | None:
        """The first (time, version) that arrived at or after ``since``."""
        return next(((t, v) for t, v in list(self.seen) if t >= since), None)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._sock.close(0)
        self._ctx.term()
