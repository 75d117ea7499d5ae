"""How often `flywheel run --env CartPole-v1 --target-return 475 --time-limit 120` stops at its target, seed by seed,
beside Stable-Baselines3's zoo DQN on the same seeds.

Each Flywheel run (one after another, nothing else running) is the README's CartPole command with the learner and
replay seeded; afterwards its kept best plays 10 episodes on fresh seeds (`flywheel play`). The SB3 side is
`flywheel bench sb3`'s worker (rl-baselines3-zoo's DQN hyperparameters, 1 torch thread) stopping when 10 greedy
episodes, evaluated every 2 s as its own stop criterion, average the target (its cap leaves its evaluation time
out, so it may run a little past 120 s); its final model then plays 10 episodes on the same fresh seeds. Both
sides' seconds are wall clock from launch to exit (Flywheel: every service started, checkpointed and stopped).
Writes one JSON document: every run's stop line, seconds, what stopped it, the kept best, and the play returns.

    python scripts/measure_cartpole_target.py --seeds 5001-5010 --out docs/benchmarks/results/cartpole_target_DATE.json
"""

from __future__ import annotations

import argparse
import importlib.util
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

from flywheel.bench.runner import _cpu_model, median_ci

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


def one_sb3_run(seed: int) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLYWHEEL_")}
    started = time.monotonic()
    config = {"env": "CartPole-v1", "seed": seed, "deadline": started + LIMIT_S, "threads": 1,
              "eval_interval_s": 2.0, "eval_episodes": 10, "target": TARGET, "play_episodes": 10,
              "play_seed": 9000 + 10 * seed}
    worker = subprocess.run([sys.executable, "-m", "flywheel.bench.suites.sb3", "--worker", json.dumps(config)],
                            env=env, capture_output=True, text=True, timeout=900)
    events = [json.loads(line) for line in worker.stdout.splitlines() if line.startswith("{")]
    end = next((e for e in events if e["event"] == "end"), None)
    reached = next((e for e in events if e["event"] == "reached"), None)
    play = next((e for e in events if e["event"] == "play"), None)
    return {"seed": seed, "exit": worker.returncode,
            "seconds": round(end["t"] - started, 1) if end else None, "stopped_at_target": reached is not None,
            "env_steps": end["steps"] if end else None, "evaluations": sum(e["event"] == "eval" for e in events),
            "play_returns": play["returns"] if play else [], "stderr_tail": worker.stderr.strip()[-300:]}


def _flywheel_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {**_summary(runs), "by_learner_best": sum(r["stopped_by"] == "learner's kept best" for r in runs),
            "by_actor_greedy": sum(r["stopped_by"] == "actors' greedy return" for r in runs)}


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    stopped = [r["seconds"] for r in runs if r["stopped_at_target"]]
    return {"runs": len(runs), "stopped_at_target": sum(r["stopped_at_target"] for r in runs),
            "median_seconds_when_stopped": statistics.median(stopped) if stopped else None,
            "median_seconds_ci95": list(median_ci([r["seconds"] or LIMIT_S for r in runs])),
            "median_seconds_all_censored_at_exit": statistics.median(r["seconds"] or LIMIT_S for r in runs),
            "play_episodes_475": sum(x >= TARGET for r in runs for x in r["play_returns"]),
            "play_episodes_500": sum(x >= 500 for r in runs for x in r["play_returns"]),
            "play_episodes": sum(len(r["play_returns"]) for r in runs),
            "runs_whose_play_mean_reached_475": sum(bool(r["play_returns"]) and
                                                    statistics.mean(r["play_returns"]) >= TARGET for r in runs)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="4001-4010", help="learner/replay seeds, FIRST-LAST (default 4001-4010)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sides", default="flywheel,sb3", help="flywheel, sb3 or flywheel,sb3 (default: both)")
    parser.add_argument("--resummarize", action="store_true",
                        help="recompute the summaries of an existing --out document from its runs (no training)")
    args = parser.parse_args()
    if args.resummarize:
        document = json.loads(args.out.read_text())
        if document.get("runs"):
            document["summary"] = _flywheel_summary(document["runs"])
        if document.get("sb3_runs"):
            document["sb3_summary"] = _summary(document["sb3_runs"])
        args.out.write_text(json.dumps(document, indent=1) + "\n")
        print(json.dumps({"flywheel": document["summary"], "sb3": document["sb3_summary"]}))
        return 0
    sides = [s for s in args.sides.split(",") if s]
    if not sides or set(sides) - {"flywheel", "sb3"}:
        parser.error(f"--sides {args.sides!r}: expected flywheel, sb3 or flywheel,sb3")
    if "sb3" in sides and importlib.util.find_spec("stable_baselines3") is None:
        parser.error("the SB3 side needs stable-baselines3: pip install 'flywheel-rl[bench]' (or --sides flywheel)")
    runs: list[dict[str, Any]] = []
    sb3_runs: list[dict[str, Any]] = []
    loads = [" ".join(f"{x:.2f}" for x in os.getloadavg())]
    with tempfile.TemporaryDirectory(prefix="cartpole-target-") as tmp:
        for k, seed in enumerate(_seeds(args.seeds)):
            order = sides if k % 2 == 0 else sides[::-1]  # neither side always runs on a warmer machine
            for side in order:
                if side == "flywheel":
                    runs.append(one_run(seed, Path(tmp)))
                else:
                    sb3_runs.append(one_sb3_run(seed))
                loads.append(" ".join(f"{x:.2f}" for x in os.getloadavg()))
                print(side, json.dumps((runs if side == "flywheel" else sb3_runs)[-1]), flush=True)
    cpu = _cpu_model()
    git = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    document = {
        "command": f"python scripts/measure_cartpole_target.py --seeds {args.seeds} --out {args.out}",
        "run_command": f"flywheel run --env CartPole-v1 --target-return {TARGET:g} --time-limit {LIMIT_S:g} "
                       "--set learner.seed=S --set replay.seed=S (then flywheel play DIR --episodes 10)",
        "sb3_command": "python -m flywheel.bench.suites.sb3 --worker CONFIG (zoo DQN, seed S, 1 thread, 10 greedy "
                       "episodes every 2 s, stop at the target or the cap; then 10 episodes on seeds 9000+10S...)",
        "machine": f"{os.cpu_count()} CPUs ({cpu}), nothing else running", "loadavg_after_each": loads, "git": git,
        "sides": sides, "runs": runs, "sb3_runs": sb3_runs,
        "summary": _flywheel_summary(runs) if runs else None,
        "sb3_summary": _summary(sb3_runs) if sb3_runs else None,
    }
    args.out.write_text(json.dumps(document, indent=1) + "\n")
    print(json.dumps({"flywheel": document["summary"], "sb3": document["sb3_summary"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
