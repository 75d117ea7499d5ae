"""cpprb's PrioritizedReplayBuffer on the replay benchmark's shapes, in-process, in its own process.

Run as ``python -m flywheel.bench.peers.cpprb_peer '<json config>'``; prints one JSON line of results.
Mario data is one in-order stream of 1-step transitions, cpprb's best case: ``stack_compress`` and ``next_of``
only work when consecutive adds are consecutive steps of one episode.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

import numpy as np
import psutil


def _mario_buffer(size: int) -> object:
    from cpprb import PrioritizedReplayBuffer

    env = {"obs": {"shape": (4, 84, 84), "dtype": np.uint8}, "act": {"dtype": np.int64}, "rew": {}, "done": {}}
    return PrioritizedReplayBuffer(size, env, next_of="obs", stack_compress="obs", alpha=0.6, eps=1e-6)


def _mario_rows(frames: np.ndarray, start: int, rows: int, episode: int) -> dict[str, np.ndarray]:
    t = np.arange(start, start + rows + 1)
    index = np.maximum(t[:, None] + np.arange(-3, 1)[None, :], (t // episode * episode)[:, None])
    stacks = frames[index % len(frames)]
    return {"obs": stacks[:-1], "next_obs": stacks[1:], "act": np.zeros(rows, np.int64),
            "rew": np.ones(rows, np.float32), "done": np.zeros(rows, np.float32)}


def mario(config: dict) -> dict:
    frames = np.load(config["frames"], allow_pickle=False)
    size, rows, episode = config["fill"], config["batch_rows"], 500
    prebuilt = [_mario_rows(frames, i * rows, rows, episode) for i in range(16)]
    process = psutil.Process()
    base_rss = process.memory_info().rss
    rb = _mario_buffer(size)
    start, cpu = time.perf_counter(), time.process_time()
    added = 0
    while added < size:
        batch = prebuilt[(added // rows) % len(prebuilt)]
        rb.add(**batch)  # type: ignore[attr-defined]
        added += rows
        if added % (episode // rows * rows) == 0:
            rb.on_episode_end()  # type: ignore[attr-defined]
    insert_s, insert_cpu = time.perf_counter() - start, time.process_time() - cpu
    rss = process.memory_info().rss
    result = {"insert_rate": added / insert_s, "insert_rate_cpu": added / insert_cpu, "rss_bytes": rss,
              "rss_growth_bytes": rss - base_rss, "stored": rb.get_stored_size()}  # type: ignore[attr-defined]
    rng = np.random.default_rng(0)
    batches = 0
    start = time.perf_counter()
    while time.perf_counter() - start < config["seconds"]:
        sample = rb.sample(512, beta=0.4)  # type: ignore[attr-defined]
        rb.update_priorities(sample["indexes"], rng.uniform(0.1, 2, 512))  # type: ignore[attr-defined]
        batches += 1
    result["sample_rate"] = batches / (time.perf_counter() - start)
    if config.get("checkpoint"):
        with tempfile.TemporaryDirectory(dir=config.get("tmp")) as tmp:
            start = time.perf_counter()
            rb.save_transitions(os.path.join(tmp, "cpprb"), safe=True)  # type: ignore[attr-defined]
            result["checkpoint_s"] = time.perf_counter() - start
    return result


def cartpole(config: dict) -> dict:
    from cpprb import PrioritizedReplayBuffer

    size, rows = config["fill"], config["batch_rows"]
    env = {"obs": {"shape": (4,), "dtype": np.float32}, "next_obs": {"shape": (4,), "dtype": np.float32},
           "act": {"dtype": np.int64}, "rew": {}, "done": {}}
    rb = PrioritizedReplayBuffer(size, env, alpha=0.6, eps=1e-6)
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(rows, 4)).astype(np.float32)
    batch = {"obs": obs, "next_obs": obs + 0.01, "act": np.zeros(rows, np.int64), "rew": np.ones(rows, np.float32),
             "done": np.zeros(rows, np.float32), "priorities": rng.uniform(0.1, 2, rows)}
    added = 0
    start, cpu = time.perf_counter(), time.process_time()
    while added < size:
        rb.add(**batch)
        added += rows
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    return {"insert_rate": added / wall, "insert_rate_cpu": added / cpu}


def main() -> None:
    config = json.loads(sys.argv[1])
    if config.get("cpus") and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, config["cpus"])
    print(json.dumps(mario(config) if config["kind"] == "mario" else cartpole(config)), flush=True)


if __name__ == "__main__":
    main()
