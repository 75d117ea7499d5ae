"""Snake-v0 trained by ``flywheel run`` with each preset for the same minutes, then each checkpoint played greedy.

Why the grid preset exists: before it, Snake and MettaGrid took the pixel preset (Mario's recipe). Each preset
trains ``--minutes`` of wall clock (``flywheel run --time-limit``, one actor, training seed ``--seed``), and its
final checkpoint plays ``--episodes`` greedy episodes on evaluation seeds 300000.. through flywheel.evaluation
(epsilon 0, cut at 2,000 agent steps); returns are summarised with a 95% bootstrap CI. Writes one JSON document.

    python scripts/compare_grid_presets.py --minutes 4 --out docs/benchmarks/results/grid_preset_snake.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from flywheel.bench.runner import _cpu_model
from flywheel.evaluation import evaluate
from flywheel.stats import summarize
from flywheel.testing.run import FlywheelRun

ENV = "Snake-v0"


def train_and_play(preset: str, minutes: float, seed: int, episodes: int, work: Path) -> dict[str, object]:
    run = FlywheelRun(ENV, work / preset, actors=1, progress_interval=30.0,
                      sets=[f"actor.seed={seed}", f"learner.seed={seed}"],
                      args=["--preset", preset, "--time-limit", str(60 * minutes), "--no-video"])
    started = time.monotonic()
    with run:
        run.proc.wait(timeout=60 * minutes + 300)  # type: ignore[union-attr]
    wall = time.monotonic() - started
    checkpoint = work / preset / "checkpoints" / "learner"
    records = evaluate(ENV, list(range(300_000, 300_000 + episodes)), checkpoint=str(checkpoint), epsilon=0.0,
                       workers=2, max_steps=2000)
    returns = [r["return"] for r in records]
    last = [line for line in run.log.read_text().splitlines() if "env steps" in line][-1:]
    print(f"{preset}: {summarize(returns)}", flush=True)
    return {"preset": preset, "wall_s": round(wall, 1), "summary": summarize(returns), "returns": returns,
            "lengths": [r["length"] for r in records], "last_progress_line": last}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=4.0)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--episodes", type=int, default=30)
    parser.add_argument("--presets", default="pixel,grid")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    loads = [os.getloadavg()]
    with tempfile.TemporaryDirectory(prefix="grid-presets-") as tmp:
        results = [train_and_play(p, args.minutes, args.seed, args.episodes, Path(tmp))
                   for p in args.presets.split(",")]
    loads.append(os.getloadavg())
    cpu = _cpu_model()
    document = {"command": f"python scripts/compare_grid_presets.py --minutes {args.minutes:g} --seed {args.seed} "
                           f"--episodes {args.episodes} --presets {args.presets} --out {args.out}",
                "env": ENV, "training_seed": args.seed, "evaluation_seeds": [300_000, 300_000 + args.episodes - 1],
                "machine": f"{os.cpu_count()} CPUs ({cpu}); nothing else running", "loadavg_start_end": loads,
                "results": results}
    args.out.write_text(json.dumps(document, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
