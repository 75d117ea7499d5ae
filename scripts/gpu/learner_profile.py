"""Where a GPU learner update's time goes: variants side by side on a device-resident batch, then a profile.

Ran on the lent H200 by scripts/gpu/profile.sh; raw result docs/benchmarks/results/gpu/variants.json and
profile.txt. ``python scripts/gpu/learner_profile.py cpu`` runs the same on a CPU (a smoke check).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from flywheel import proto
from flywheel.bench.parts.learner_loops import CASES, BareLoop, random_batch
from flywheel.services.learner.core import CoreConfig, LearnerCore

DEVICE = torch.device(sys.argv[1] if len(sys.argv) > 1 else "cuda")
CASE = {c.key: c for c in CASES}
UPDATES = int(os.environ.get("N", "200"))
WARMUP = 30
OUT = os.environ.get("OUT", "/tmp")
rows: list[dict[str, Any]] = []


def sync() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def report(row: dict[str, Any]) -> None:
    print(json.dumps(row), flush=True)
    rows.append(row)


def core_rate(key: str, threads: int, **config: Any) -> tuple[LearnerCore, Any]:
    """Updates/s of the real LearnerCore on one staged (device-resident) batch, and CPU ms per update."""
    torch.set_num_threads(threads)
    case = CASE[key]
    core = LearnerCore(case.obs_shape, case.n_actions, CoreConfig(lr=1e-4, adam_eps=1.5e-4, **config), DEVICE)
    rng = np.random.default_rng(0)
    host = proto.SampleBatch(request_id=0, replay_size=case.fill, index=np.arange(case.batch, dtype=np.int64),
                             weight=np.ones(case.batch, np.float32), **random_batch(case, rng, case.batch))
    batch = core.stager.stage(host)
    start = time.perf_counter()
    for _ in range(WARMUP):
        core.update(batch)
    sync()
    warmup = time.perf_counter() - start
    start, cpu = time.perf_counter(), time.process_time()
    for _ in range(UPDATES):
        core.update(batch)
    sync()
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    report({"case": key, "threads": threads, **config, "updates_per_s": UPDATES / elapsed,
            "cpu_s_per_update_ms": 1e3 * cpu / UPDATES, "warmup_s": warmup, "compile_state": core.compile_state})
    return core, batch


def bare_rate(key: str, threads: int, amp: torch.dtype | None) -> None:
    torch.set_num_threads(threads)
    bare = BareLoop(CASE[key], DEVICE, amp, 0)
    bare.seconds(WARMUP)
    report({"case": key, "threads": threads, "bare": True, "amp": str(amp),
            "updates_per_s": UPDATES / bare.seconds(UPDATES)})


def main() -> None:
    gpu = DEVICE.type == "cuda"
    precision = "bf16" if gpu else "fp32"
    for threads in (15, 1):
        bare_rate("mlp128", threads, torch.bfloat16 if gpu else None)
        bare_rate("nature512", threads, torch.bfloat16 if gpu else None)
        core_rate("nature512", threads, precision=precision, compile=False)
    core_rate("nature512", 1, precision=precision, compile=True)
    core_rate("mlp128", 1, precision=precision, compile=True)
    if gpu:
        core_rate("nature512", 1, precision=precision, compile=True, compile_mode="reduce-overhead")
        core_rate("mlp128", 1, precision=precision, compile=True, compile_mode="reduce-overhead")
    core, batch = core_rate("nature512", 1, precision=precision, compile=True)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])
    with profile(activities=activities) as prof:
        for _ in range(20):
            core.update(batch)
        sync()
    by_cpu = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30)
    by_device = prof.key_averages().table(sort_by="self_device_time_total" if gpu else "cpu_time_total",
                                          row_limit=30)
    with open(os.path.join(OUT, "profile.txt"), "w") as fh:
        fh.write(by_cpu + "\n\n" + by_device)
    with open(os.path.join(OUT, "variants.json"), "w") as fh:
        json.dump({"device": torch.cuda.get_device_name(0) if gpu else "cpu", "rows": rows}, fh, indent=1)
    print(by_device[:6000])


if __name__ == "__main__":
    main()
