"""DeepMind Reverb on the replay benchmark's shapes: a server process and a gRPC client, in Reverb's own venv.

Not imported by Flywheel: ``flywheel bench replay`` runs it with the venv's interpreter (NumPy, Reverb,
TensorFlow, psutil, and ``cpu_clock.py`` from this folder). Create the venv with::

    python3 -m venv .venv-reverb
    .venv-reverb/bin/pip install tensorflow==2.15.1 'dm-reverb[tensorflow]==0.14.0' psutil

Usage: ``python reverb_peer.py '<json config>'`` (``kind``, ``frames``, ``fill``, ``port``, ``server_cpus``,
``client_cpus``): it fills the table with ``fill`` items, prints one JSON line (the fill's rate and the
``pids`` of its side: this client, the server), then answers commands read from stdin, one JSON line each,
so the suite can measure it in turns with Flywheel and cpprb: ``insert SECONDS``, ``sample SECONDS``, ``quit``.
Items hold the same (4, 84, 84) uint8 obs and next_obs stacks Flywheel receives (Reverb compresses chunks with
zstd; it has no frame sharing across items of this shape), a prioritized sampler with alpha 0.6 and FIFO
removal. Rates come per second and per CPU-second (user + system, psutil) of the server (inserts) or of both
processes (sampling).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import sys
from typing import TYPE_CHECKING, Any

import numpy as np
from cpu_clock import SideClock  # this folder is on sys.path: the script runs by path, without flywheel

if TYPE_CHECKING:  # Reverb's venv runs this file: nothing here is needed at run time
    import reverb

    Step = dict[str, np.ndarray | np.generic]  # a step's arrays (observations) and scalars (action, reward, ...)


def _table(kind: str, size: int) -> object:
    import reverb
    import tensorflow as tf

    obs = (4, 84, 84) if kind == "mario" else (4,)
    dtype = tf.uint8 if kind == "mario" else tf.float32
    signature = {"obs": tf.TensorSpec(obs, dtype), "next_obs": tf.TensorSpec(obs, dtype),
                 "action": tf.TensorSpec((), tf.int64), "reward": tf.TensorSpec((), tf.float32),
                 "discount": tf.TensorSpec((), tf.float32)}
    return reverb.Table(name="replay", sampler=reverb.selectors.Prioritized(0.6), remover=reverb.selectors.Fifo(),
                        max_size=size, rate_limiter=reverb.rate_limiters.MinSize(1), signature=signature)


def _serve(kind: str, size: int, port: int, cpus: list[int]) -> None:
    import reverb

    if cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus)
    server = reverb.Server(tables=[_table(kind, size)], port=port)
    server.wait()


def _steps(config: dict[str, Any], rows: int) -> list[Step]:
    rng = np.random.default_rng(0)
    if config["kind"] == "mario":
        frames = np.load(config["frames"], allow_pickle=False)
        t = np.arange(rows)
        obs = frames[(t[:, None] + np.arange(4)[None, :]) % len(frames)]
        nxt = frames[(t[:, None] + 3 + np.arange(4)[None, :]) % len(frames)]
    else:
        obs = rng.normal(size=(rows, 4)).astype(np.float32)
        nxt = obs + 0.01
    return [{"obs": obs[i], "next_obs": nxt[i], "action": np.int64(1), "reward": np.float32(1.0),
             "discount": np.float32(0.97)} for i in range(rows)]


class Writer:
    """The gRPC client's trajectory writer, kept across commands: one item per step, flushed every 32."""

    def __init__(self, client: reverb.Client, steps: list[Step], server_pid: int) -> None:
        self.writer = client.trajectory_writer(num_keep_alive_refs=1)
        self.steps, self.server_pid = steps, server_pid
        self.rng = np.random.default_rng(1)
        self.added = 0

    def insert(self, count: int | None = None, seconds: float | None = None) -> dict[str, float]:
        """Add items (``count``, or for ``seconds``); items per second and per CPU-second of the server."""
        clock, done = SideClock([self.server_pid]), 0
        clock.start()
        while (count is not None and done < count) or (seconds is not None and clock.elapsed() < seconds):
            self.writer.append(self.steps[self.added % len(self.steps)])
            self.writer.create_item("replay", float(self.rng.uniform(0.1, 2)),
                                    {k: self.writer.history[k][-1] for k in self.steps[0]})
            self.added += 1
            done += 1
            if done % 32 == 0:
                self.writer.flush()
        self.writer.flush()
        measured = clock.rates(done)
        return {"insert_rate": measured["rate"], "insert_rate_cpu": measured["rate_per_cpu"]}

    def close(self) -> None:
        self.writer.end_episode()
        self.writer.close()


def sample(address: str, client: reverb.Client, pids: list[int], seconds: float) -> dict[str, float]:
    """512-batches through Reverb's TF dataset, each followed by mutate_priorities, for ``seconds``; per second
    and per CPU-second of both processes. The dataset is built per command and dropped after, so it does not
    prefetch while the others are measured."""
    import reverb

    rng = np.random.default_rng(2)
    dataset = reverb.TrajectoryDataset.from_table_signature(address, "replay", max_in_flight_samples_per_worker=1024)
    batches = iter(dataset.batch(512, drop_remainder=True).prefetch(2))
    next(batches)
    clock, count = SideClock(pids), 0
    clock.start()
    while clock.elapsed() < seconds:
        got = next(batches)
        client.mutate_priorities("replay", dict(zip(got.info.key.numpy().tolist(),
                                                    rng.uniform(0.1, 2, 512).tolist(), strict=True)))
        count += 1
    measured = clock.rates(count)
    del batches, dataset
    return measured


def main() -> None:
    config = json.loads(sys.argv[1])
    if config.get("client_cpus") and hasattr(os, "sched_setaffinity"):  # before TensorFlow starts its threads
        os.sched_setaffinity(0, config["client_cpus"])
    import psutil
    import reverb
    import tensorflow as tf

    tf.config.threading.set_inter_op_parallelism_threads(1)
    server = mp.get_context("spawn").Process(
        target=_serve, args=(config["kind"], config["fill"], config["port"], config.get("server_cpus", [])),
        daemon=True)
    server.start()
    try:
        address = f"localhost:{config['port']}"
        client = reverb.Client(address)
        client.server_info(timeout=120)
        pids = [os.getpid(), int(server.pid or 0)]
        writer = Writer(client, _steps(config, 256), pids[1])
        filled = writer.insert(count=config["fill"])
        rss = psutil.Process(pids[1]).memory_info().rss
        print(json.dumps(filled | {"pids": pids, "server_rss_bytes": rss}), flush=True)
        for line in sys.stdin:
            command, _, arg = line.strip().partition(" ")
            if command == "insert":
                print(json.dumps(writer.insert(seconds=float(arg))), flush=True)
            elif command == "sample":
                print(json.dumps(sample(address, client, pids, float(arg))), flush=True)
            else:
                break
        writer.close()
    finally:
        server.terminate()
        server.join(30)


if __name__ == "__main__":
    main()
