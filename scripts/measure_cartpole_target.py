"""How often `flywheel run --env CartPole-v1 --target-return 475 --time-limit 120` stops at its target, seed by seed.

Each run (one after another, nothing else running) is the README's CartPole command with the learner and replay
seeded; afterwards its kept best plays 10 episodes on fresh seeds (`flywheel play`). Writes one JSON document:
every run's stop line, seconds, what stopped it, the kept best, and the play returns.

    python scripts/measure_cartpole_target.py --seeds 4001-4010 --out docs/benchmarks/results/cartpole_target.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from flywheel.bench.runner import _cpu_model

TARGET, LIMIT_S = 475.0, 120.0
STOP = re.compile(r"flywheel: stopping \((?P<why>.*)\) after (?P<s>\d+) s")


def _seeds(text: str) -> list[int]:
    first, _, last = text.partition("-")
    return list(range(int(first), int(last or first) + 1))


def one_run(seed: int, workdir: Path) -> dict[str, Any]:
    ckpt = workdir / f"cp{seed}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLYWHEEL_")}
    started = time.monotonic()
    run = subprocess.run([sys.executable, "-m", "flywheel", "run", "--env", "CartPole-v1", "--target-return",
                          f"{TARGET:g}", "--time-limit", f"{LIMIT_S:g}", "--checkpoint-dir", str(ckpt),
                          "--base-port", "0", "--http-port", "0", "--no-video", "--set", f"learner.seed={seed}",
                          "--set", f"replay.seed={seed}"], env=env, capture_output=True, text=True, timeout=600)
    seconds = time.monotonic() - started
    stop = STOP.search(run.stdout)
    why = stop.group("why") if stop else "?"
    best_file = ckpt / "learner" / "best.json"
    best = json.loads(best_file.read_text()) if best_file.is_file() else None
    play = subprocess.run([sys.executable, "-m", "flywheel", "play", str(ckpt), "--episodes", "10", "--seed",
                           str(9000 + 10 * seed)], env=env, capture_output=True, text=True, timeout=600)
    returns = [float(m) for m in re.findall(r"episode \d+: return ([\d.]+)", play.stdout)]
    return {"seed": seed, "exit": run.returncode, "seconds": round(seconds, 1),
            "stop_line": stop.group(0) if stop else None, "stopped_at_target": "target" in why,
            "stopped_by": ("learner's kept best" if "kept best" in why else "actors' greedy return"
                           if "target" in why else why),
            "best": None if best is None else {k: best.get(k) for k in ("weight_version", "mean_return")},
            "play_returns": returns, "play_first_line": (play.stdout.splitlines() or [""])[0]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="4001-4010", help="learner/replay seeds, FIRST-LAST (default 4001-4010)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    runs, loads = [], [" ".join(f"{x:.2f}" for x in os.getloadavg())]
    with tempfile.TemporaryDirectory(prefix="cartpole-target-") as tmp:
        for seed in _seeds(args.seeds):
            runs.append(one_run(seed, Path(tmp)))
            loads.append(" ".join(f"{x:.2f}" for x in os.getloadavg()))
            print(json.dumps(runs[-1]), flush=True)
    stopped = [r["seconds"] for r in runs if r["stopped_at_target"]]
    cpu = _cpu_model()
    git = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    document = {
        "command": f"python scripts/measure_cartpole_target.py --seeds {args.seeds} --out {args.out}",
        "run_command": f"flywheel run --env CartPole-v1 --target-return {TARGET:g} --time-limit {LIMIT_S:g} "
                       "--set learner.seed=S --set replay.seed=S (then flywheel play DIR --episodes 10)",
        "machine": f"{os.cpu_count()} CPUs ({cpu}), nothing else running", "loadavg_after_each": loads, "git": git,
        "runs": runs,
        "summary": {"runs": len(runs), "stopped_at_target": sum(r["stopped_at_target"] for r in runs),
                    "by_learner_best": sum(r["stopped_by"] == "learner's kept best" for r in runs),
                    "by_actor_greedy": sum(r["stopped_by"] == "actors' greedy return" for r in runs),
                    "median_seconds_when_stopped": statistics.median(stopped) if stopped else None,
                    "play_episodes_500": sum(x >= 500 for r in runs for x in r["play_returns"]),
                    "play_episodes": sum(len(r["play_returns"]) for r in runs)},
    }
    args.out.write_text(json.dumps(document, indent=1) + "\n")
    print(json.dumps(document["summary"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
