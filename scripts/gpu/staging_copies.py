"""Where a host batch's time goes on its way to the GPU: the learner's BatchStager against its parts and two levers.

Run on the lent GPU machine (scripts/gpu/bench_learner.sh runs it after the suite). A Nature-CNN batch of 512
(obs and next_obs, 4x84x84 uint8, 28.9 MB) is timed six ways, each the median of 7 repeats of 20 batches after a
warm-up, synchronised at the end of each repeat:
  stager      BatchStager.stage, the product's path (np.copyto into a pinned ring slot, non_blocking copy)
  stager_direct  BatchStager(direct=True), learner.host_staging=direct: copies from the batch's own memory
  copyto      only the host copy into pinned memory
  pinned_h2d  only the device copy from pinned memory
  pageable    torch.from_numpy(x).to(cuda): the driver stages pageable memory itself
  registered  cudaHostRegister on the source arrays (as a replay's shared-memory slot could be), then a direct copy
Prints one JSON object (ms per batch and GB/s); diagnostic only, not a product path.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np
import torch

from flywheel.bench.parts.learner_loops import CASES
from flywheel.bench.suites.learner import _sample_batch
from flywheel.services.learner.staging import BatchStager

CASE = next(case for case in CASES if case.key == "nature512")
REPEATS = 7
PER_REPEAT = 20


def _time(step: Callable[[], None]) -> float:
    """Median ms per batch."""
    step()
    torch.cuda.synchronize()
    runs = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        for _ in range(PER_REPEAT):
            step()
        torch.cuda.synchronize()
        runs.append((time.perf_counter() - start) / PER_REPEAT * 1000)
    return statistics.median(runs)


def main() -> None:
    device = torch.device("cuda")
    batch = _sample_batch(CASE, seed=0)
    frames = [batch.obs, batch.next_obs]
    nbytes = sum(a.nbytes for a in frames)
    stager = BatchStager(device)
    direct = BatchStager(device, direct=True)
    pinned = [torch.empty(a.shape, dtype=torch.uint8, pin_memory=True) for a in frames]
    stream = torch.cuda.Stream(device)

    def copyto() -> None:
        for dst, src in zip(pinned, frames, strict=True):
            np.copyto(dst.numpy(), src)

    def pinned_h2d() -> None:
        with torch.cuda.stream(stream):
            for src in pinned:
                src.to(device, non_blocking=True)
        stream.synchronize()

    def pageable() -> None:
        for src in frames:
            torch.from_numpy(src).to(device)

    cudart = torch.cuda.cudart()
    sources = [torch.from_numpy(a) for a in frames]
    for src in sources:  # cudaHostRegisterDefault = 0
        err = cudart.cudaHostRegister(src.data_ptr(), src.numel() * src.element_size(), 0)
        if int(err) != 0:
            print(json.dumps({"error": f"cudaHostRegister failed: {err}"}))
            sys.exit(1)

    def registered() -> None:
        with torch.cuda.stream(stream):
            for src in sources:
                src.to(device, non_blocking=True)
        stream.synchronize()

    results = {"stager": _time(lambda: stager.stage(batch).use_on_current_stream()),
               "stager_direct": _time(lambda: direct.stage(batch).use_on_current_stream()), "copyto": _time(copyto),
               "pinned_h2d": _time(pinned_h2d), "pageable": _time(pageable), "registered": _time(registered)}
    for src in sources:
        cudart.cudaHostUnregister(src.data_ptr())
    out = {"batch": CASE.batch, "obs_shape": list(CASE.obs_shape), "frame_bytes_per_batch": nbytes,
           "repeats": REPEATS, "batches_per_repeat": PER_REPEAT, "torch_threads": torch.get_num_threads(),
           "ms_per_batch": {k: round(v, 3) for k, v in results.items()},
           "gb_per_s": {k: round(nbytes / v / 1e6, 2) for k, v in results.items()}}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
