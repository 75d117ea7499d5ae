"""cpprb's PrioritizedReplayBuffer on the replay benchmark's shapes, in-process, in its own process.

Run as ``python -m flywheel.bench.peers.cpprb_peer '<json config>'``: it fills a buffer, prints one JSON line,
then answers commands read from stdin, one JSON line each, so the suite can interleave its measurements with
Flywheel's (the same load for both): ``insert SECONDS``, ``sample SECONDS``, ``checkpoint``, ``memory``, ``quit``.
Rates come per second and per CPU-second of this process (user + system, psutil).
Mario data is one in-order stream of 1-step transitions, cpprb's best case: ``stack_compress`` and ``next_of``
only work when consecutive adds are consecutive steps of one episode.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from typing import Any

import numpy as np
import psutil

from flywheel.bench.peers.cpu_clock import SideClock

EPISODE = 500


class Peer:
    """A filled cpprb buffer and the batches it keeps adding."""

    def __init__(self, config: dict[str, Any]) -> None:
        from cpprb import PrioritizedReplayBuffer

        self.config, self.rows = config, config["batch_rows"]
        self.rng = np.random.default_rng(0)
        if config["kind"] == "mario":
            frames = np.load(config["frames"], allow_pickle=False)
            self.batches = [self._mario_rows(frames, i * self.rows) for i in range(16)]
            env = {"obs": {"shape": (4, 84, 84), "dtype": np.uint8}, "act": {"dtype": np.int64}, "rew": {},
                   "done": {}}
            extra = {"next_of": "obs", "stack_compress": "obs"}
        else:
            obs = self.rng.normal(size=(self.rows, 4)).astype(np.float32)
            self.batches = [{"obs": obs, "next_obs": obs + 0.01, "act": np.zeros(self.rows, np.int64),
                             "rew": np.ones(self.rows, np.float32), "done": np.zeros(self.rows, np.float32)}]
            env = {"obs": {"shape": (4,), "dtype": np.float32}, "next_obs": {"shape": (4,), "dtype": np.float32},
                   "act": {"dtype": np.int64}, "rew": {}, "done": {}}
            extra = {}
        self.process = psutil.Process()
        self.base_rss = self.process.memory_info().rss
        self.rb = PrioritizedReplayBuffer(config["fill"], env, alpha=0.6, eps=1e-6, **extra)
        self.added = 0

    def _mario_rows(self, frames: np.ndarray, start: int) -> dict[str, np.ndarray]:
        t = np.arange(start, start + self.rows + 1)
        index = np.maximum(t[:, None] + np.arange(-3, 1)[None, :], (t // EPISODE * EPISODE)[:, None])
        stacks = frames[index % len(frames)]
        return {"obs": stacks[:-1], "next_obs": stacks[1:], "act": np.zeros(self.rows, np.int64),
                "rew": np.ones(self.rows, np.float32), "done": np.zeros(self.rows, np.float32)}

    def insert(self, count: int | None = None, seconds: float | None = None) -> dict[str, float]:
        """Add batches (``count`` rows, or for ``seconds``); rows per second and per CPU-second."""
        clock, done = SideClock([os.getpid()]), 0
        clock.start()
        while (count is not None and done < count) or (seconds is not None and clock.elapsed() < seconds):
            self.rb.add(**self.batches[(self.added // self.rows) % len(self.batches)])
            self.added += self.rows
            done += self.rows
            if self.config["kind"] == "mario" and self.added % (EPISODE // self.rows * self.rows) == 0:
                self.rb.on_episode_end()
        measured = clock.rates(done)
        return {"insert_rate": measured["rate"], "insert_rate_cpu": measured["rate_per_cpu"]}

    def sample(self, seconds: float) -> dict[str, float]:
        """512-batches, each followed by its priority update (synchronous, in-process), for ``seconds``."""
        clock, batches = SideClock([os.getpid()]), 0
        clock.start()
        while clock.elapsed() < seconds:
            sample = self.rb.sample(512, beta=0.4)
            self.rb.update_priorities(sample["indexes"], self.rng.uniform(0.1, 2, 512))
            batches += 1
        return clock.rates(batches)

    def checkpoint(self) -> dict[str, float]:
        with tempfile.TemporaryDirectory(dir=self.config.get("tmp")) as tmp:
            start = time.perf_counter()
            self.rb.save_transitions(os.path.join(tmp, "cpprb"), safe=True)
            return {"checkpoint_s": time.perf_counter() - start}

    def memory(self) -> dict[str, float]:
        rss = self.process.memory_info().rss
        return {"rss_bytes": rss, "rss_growth_bytes": rss - self.base_rss, "stored": self.rb.get_stored_size()}


def main() -> None:
    config = json.loads(sys.argv[1])
    if config.get("cpus") and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, config["cpus"])
    peer = Peer(config)
    print(json.dumps(peer.insert(count=config["fill"]) | peer.memory() | {"pids": [os.getpid()]}), flush=True)
    for line in sys.stdin:
        command, _, arg = line.strip().partition(" ")
        if command == "insert":
            print(json.dumps(peer.insert(seconds=float(arg))), flush=True)
        elif command == "sample":
            print(json.dumps(peer.sample(float(arg))), flush=True)
        elif command == "checkpoint":
            print(json.dumps(peer.checkpoint()), flush=True)
        elif command == "memory":
            print(json.dumps(peer.memory()), flush=True)
        else:
            return


if __name__ == "__main__":
    main()
