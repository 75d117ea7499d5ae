"""``flywheel eval CHECKPOINT_DIR``: the project's evaluation protocol as a command, a table and a JSON file."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from flywheel.evaluation import EPISODES, EPSILON, FIRST_SEED, Protocol, run_protocol

WORKERS = max(1, min(4, os.cpu_count() or 1))


def add_eval_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint_dir", type=Path, metavar="CHECKPOINT_DIR",
                        help="a flywheel run --checkpoint-dir (or its learner/ folder, or a .safetensors file)")
    parser.add_argument("--episodes", type=int, default=EPISODES, help=f"episodes per epsilon (default {EPISODES})")
    parser.add_argument("--seed", type=int, default=FIRST_SEED,
                        help=f"the first episode's seed; episode i plays seed SEED+i (default {FIRST_SEED}, the "
                             "seeds the benchmarks evaluate on)")
    parser.add_argument("--epsilon", nargs="+", default=[f"{EPSILON:g}"], metavar="EPS",
                        help=f"exploration rates, one row each on the same seeds (default {EPSILON:g}; e.g. "
                             "--epsilon 0.05 0.001)")
    parser.add_argument("--noop-max", type=int, default=None, metavar="N",
                        help="each episode starts with 0..N actions 0, the no-op of emulated games (default: the "
                             "env's preset's, as the learner's evaluations play; 0 where it sets none)")
    parser.add_argument("--stall-steps", type=int, default=0, metavar="N",
                        help="end an episode after N agent steps without progress (default 0: never)")
    parser.add_argument("--max-steps", type=int, default=None, metavar="N",
                        help="cut an episode at N agent steps (default: none; the env's own limits hold)")
    parser.add_argument("--which", choices=("latest", "best", "auto"), default="latest",
                        help="latest (default): the newest weights; best: the weights that did best in the "
                             "learner's evaluations; auto: the weights flywheel play takes by default")
    parser.add_argument("--env", default=None, help="environment id (default: the checkpoint's or run.json's)")
    parser.add_argument("--workers", type=int, default=WORKERS,
                        help=f"evaluation processes (default {WORKERS}: the CPU count, at most 4); the figures do "
                             "not depend on it")
    parser.add_argument("--json", type=Path, default=None, metavar="PATH",
                        help="where the results go (default CHECKPOINT_DIR/eval-WHICH-DATE-TIME.json)")


class EvalError(Exception):
    """Input ``flywheel eval`` cannot use: one line for the user."""


def _epsilons(raw: list[str]) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in raw)
    except ValueError:
        raise EvalError(f"--epsilon takes numbers in [0, 1], got {' '.join(raw)}") from None
    if any(not 0.0 <= v <= 1.0 for v in values) or len(set(values)) != len(values):
        raise EvalError(f"--epsilon takes distinct numbers in [0, 1], got {' '.join(raw)}")
    return values


def _protocol(args: argparse.Namespace) -> Protocol:
    for flag, value, least in (("--episodes", args.episodes, 1), ("--seed", args.seed, 0),
                               ("--workers", args.workers, 1), ("--stall-steps", args.stall_steps, 0),
                               ("--noop-max", args.noop_max, 0), ("--max-steps", args.max_steps, 1)):
        if value is not None and value < least:
            raise EvalError(f"{flag} must be at least {least}, got {value}")
    return Protocol(episodes=args.episodes, seed=args.seed, epsilons=_epsilons(args.epsilon),
                    noop_max=args.noop_max, stall_steps=args.stall_steps, max_steps=args.max_steps)


class Progress:
    """Episodes done / total on stderr: one line rewritten on a terminal, else a line every tenth."""

    def __init__(self, total: int, stream: TextIO | None = None) -> None:
        self.stream = sys.stderr if stream is None else stream  # the stderr of the call, not of the import
        self.total, self.done = total, 0
        self.tty = self.stream.isatty()

    def __call__(self, epsilon: float, record: dict[str, Any]) -> None:
        self.done += 1
        line = f"flywheel eval: {self.done}/{self.total} episodes (epsilon {epsilon:g})"
        if self.tty:
            print("\r" + line, end="\n" if self.done == self.total else "", file=self.stream, flush=True)
        elif self.done == self.total or self.done % max(1, self.total // 10) == 0:
            print(line, file=self.stream, flush=True)


def _cell(s: dict[str, Any], key: str, low: str, high: str, pct: bool = False) -> str:
    if pct:
        return f"{s[key]:.0%} ({s[low]:.0%}-{s[high]:.0%})"
    return f"{s[key]:,.1f} ({s[low]:,.1f}-{s[high]:,.1f})"


def table(result: dict[str, Any]) -> str:
    """One row per epsilon: mean and median return, and the env's progress and success measures, with 95%
    intervals (bootstrap; Wilson for a rate)."""
    named = result["measures"]  # the env's measures' labels, those it has
    head = ["epsilon", "mean return (95% CI)", "median return (95% CI)"]
    if "progress" in named:
        head += [f"mean {named['progress']} (95% CI)", f"median {named['progress']} (95% CI)"]
    if "success" in named:
        head.append(f"{named['success']} rate (95% CI)")
    rows = [head]
    for row in result["rows"]:
        r = row["return"]
        cells = [f"{row['epsilon']:g}", _cell(r, "mean", "ci_low", "ci_high"),
                 _cell(r, "median", "median_ci_low", "median_ci_high")]
        if "progress" in named:
            p = row["progress"]
            cells += ["-", "-"] if p is None else [_cell(p, "mean", "ci_low", "ci_high"),
                                                   _cell(p, "median", "median_ci_low", "median_ci_high")]
        if "success" in named:
            cells.append(_cell(row["success"], "rate", "ci_low", "ci_high", pct=True))
        rows.append(cells)
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)


def run_eval(args: argparse.Namespace) -> int:
    from flywheel.envs import UnknownEnvironmentError
    from flywheel.tools.play import PlayError, load_policy

    try:
        protocol = _protocol(args)
        try:
            policy = load_policy(args.checkpoint_dir, args.env, args.which)
        except (PlayError, UnknownEnvironmentError) as exc:
            raise EvalError(str(exc)) from None
        out = args.json if args.json is not None else (
            args.checkpoint_dir if args.checkpoint_dir.is_dir() else args.checkpoint_dir.parent
        ) / f"eval-{args.which}-{time.strftime('%Y%m%d-%H%M%S')}.json"
        print(f"flywheel eval: {policy.path} (weight version {policy.weight_version}, {policy.updates:,} updates) "
              f"on {policy.env_id}", flush=True)
        progress = Progress(protocol.episodes * len(protocol.epsilons))
        started = time.monotonic()
        result = run_protocol(policy.env_id, str(policy.path), protocol, workers=args.workers, progress=progress)
        print(f"protocol: {result['described']}; {args.workers} worker{'s' if args.workers > 1 else ''}, "
              f"{time.monotonic() - started:.0f} s", flush=True)
        print(table(result), flush=True)
        result = {"checkpoint": str(policy.path), "which": args.which, "weight_version": policy.weight_version,
                  "updates": policy.updates, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                  "command": "flywheel eval " + " ".join(sys.argv[2:]) if sys.argv[1:2] == ["eval"] else None,
                  **result}
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {out}", flush=True)
    except (EvalError, ValueError, OSError, RuntimeError) as exc:
        text = str(exc).strip()
        print(f"error: flywheel eval: {text.splitlines()[0] if text else type(exc).__name__}", file=sys.stderr)
        return 2
    return 0
