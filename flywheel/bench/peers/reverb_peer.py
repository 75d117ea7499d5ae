"""DeepMind Reverb on the replay benchmark's shapes: a server process and a gRPC client, in Reverb's own venv.

Not imported by Flywheel: ``flywheel bench replay`` runs it with the venv's interpreter (NumPy, Reverb and
TensorFlow only). Create the venv with::

    python3 -m venv .venv-reverb
    .venv-reverb/bin/pip install tensorflow==2.15.1 'dm-reverb[tensorflow]==0.14.0'

Usage: ``python reverb_peer.py '<json config>'``; prints one JSON line. Items hold the same (4, 84, 84) uint8
obs and next_obs stacks Flywheel receives (Reverb compresses chunks with zstd; it has no frame sharing across
items of this shape), a prioritized sampler with alpha 0.6 and FIFO removal.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import sys
import time

import numpy as np


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


def _steps(config: dict, rows: int) -> list[dict[str, np.ndarray]]:
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


def main() -> None:
    config = json.loads(sys.argv[1])
    import reverb
    import tensorflow as tf

    tf.config.threading.set_inter_op_parallelism_threads(1)
    server = mp.get_context("spawn").Process(
        target=_serve, args=(config["kind"], config["fill"], config["port"], config.get("server_cpus", [])),
        daemon=True)
    server.start()
    address = f"localhost:{config['port']}"
    client = reverb.Client(address)
    client.server_info(timeout=120)
    steps = _steps(config, 256)
    rng = np.random.default_rng(1)
    start = time.perf_counter()
    with client.trajectory_writer(num_keep_alive_refs=1) as writer:
        for i in range(config["fill"]):
            writer.append(steps[i % len(steps)])
            writer.create_item("replay", float(rng.uniform(0.1, 2)),
                               {k: writer.history[k][-1] for k in steps[0]})
            if i % 32 == 31:
                writer.flush()
        writer.end_episode()
        writer.flush()
    result = {"insert_rate": config["fill"] / (time.perf_counter() - start)}
    if config["kind"] == "mario":
        dataset = reverb.TrajectoryDataset.from_table_signature(address, "replay",
                                                                max_in_flight_samples_per_worker=1024)
        batches = iter(dataset.batch(512, drop_remainder=True).prefetch(2))
        next(batches)
        count = 0
        start = time.perf_counter()
        while time.perf_counter() - start < config["seconds"]:
            sample = next(batches)
            client.mutate_priorities("replay", dict(zip(sample.info.key.numpy().tolist(),
                                                        rng.uniform(0.1, 2, 512).tolist(), strict=True)))
            count += 1
        result["sample_rate"] = count / (time.perf_counter() - start)
        import psutil

        result["server_rss_bytes"] = psutil.Process(server.pid).memory_info().rss
    server.terminate()
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
