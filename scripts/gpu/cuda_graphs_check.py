"""CUDA graphs (compile_mode reduce-overhead) against eager and default compile: same seed, same 60 batches.

Ran on the lent H200 by scripts/gpu/cuda_graphs.sh; raw result docs/benchmarks/results/gpu/graphs_check.json.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import numpy as np
import torch

from flywheel import proto
from flywheel.bench.parts.learner_loops import CASES, random_batch
from flywheel.services.learner.core import CoreConfig, LearnerCore

MODES: dict[str, dict[str, Any]] = {"eager": {"compile": False}, "default": {"compile": True},
                                    "reduce-overhead": {"compile": True, "compile_mode": "reduce-overhead"}}


def main() -> None:
    device = torch.device(sys.argv[1] if len(sys.argv) > 1 else "cuda")
    case = {c.key: c for c in CASES}["nature512"]
    precision = "bf16" if device.type == "cuda" else "fp32"
    rng = np.random.default_rng(1)
    batches = [proto.SampleBatch(request_id=0, replay_size=case.fill, index=np.arange(case.batch, dtype=np.int64),
                                 weight=rng.uniform(0.1, 1, case.batch).astype(np.float32),
                                 **random_batch(case, rng, case.batch)) for _ in range(60)]
    runs = {}
    for name, config in MODES.items():
        torch.manual_seed(0)
        core = LearnerCore(case.obs_shape, case.n_actions,
                           CoreConfig(precision=precision, target_update_interval=20, **config), device)
        results = [core.update(core.stager.stage(b)) for b in batches]
        priorities = np.stack([r.priorities() for r in results[:5]])  # read 55 updates later: still their own?
        losses = [float(r.loss) for r in results]
        params = torch.cat([p.detach().float().flatten().cpu() for p in core.params])
        runs[name] = (losses, priorities, params, core.compile_state, core.drain_metrics())
    eager_losses, eager_priorities, eager_params = runs["eager"][:3]
    report = {name: {"compile_state": state, "loss_first": losses[0], "loss_last": losses[-1],
                     "max_loss_rel_diff_vs_eager": max(abs(a - b) / max(abs(b), 1e-6)
                                                       for a, b in zip(losses, eager_losses, strict=True)),
                     "priorities_first5_max_abs_diff_vs_eager": float(np.abs(priorities - eager_priorities).max()),
                     "priorities_distinct_rows": len({p.tobytes() for p in priorities}),
                     "param_rel_diff_vs_eager": float((params - eager_params).norm() / eager_params.norm()),
                     "metric_batches": sums.batches, "loss_sum": sums.loss}
              for name, (losses, priorities, params, state, sums) in runs.items()}
    print(json.dumps(report, indent=1))
    with open(os.path.join(os.environ.get("OUT", "/tmp"), "graphs_check.json"), "w") as fh:
        json.dump(report, fh, indent=1)


if __name__ == "__main__":
    main()
