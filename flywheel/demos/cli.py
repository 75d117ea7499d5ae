"""The ``flywheel demos`` subcommand: ``collect`` demonstrations, or ``info`` on a set (validating every file)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def add_demos_flags(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="demos_command", required=True, metavar="ACTION")
    collect = sub.add_parser("collect", help="play episodes in parallel and write a demonstrations set")
    collect.add_argument("--env", required=True, help="environment id, e.g. CartPole-v1 or Snake-v0")
    collect.add_argument("--episodes", type=int, required=True)
    collect.add_argument("--workers", default="auto", help="'auto' (cores minus one) or a number")
    collect.add_argument("--out", type=Path, required=True, help="directory of the set")
    collect.add_argument("--policy", default="expert", help="expert, random, or checkpoint:DIR (a learner "
                                                           "checkpoint)")
    collect.add_argument("--n-step", type=int, default=3, help="n of the n-step returns stored (match the actors)")
    collect.add_argument("--gamma", type=float, default=0.99)
    collect.add_argument("--seed", type=int, default=0)
    collect.add_argument("--append", action="store_true", help="add to an existing set")
    info = sub.add_parser("info", help="validate a set and print its summary as JSON")
    info.add_argument("path", type=Path)


def run_demos(args: argparse.Namespace) -> int:
    from flywheel.demos.experts import PolicyError
    from flywheel.demos.format import DemoFileError, DemoSet
    from flywheel.envs import UnknownEnvironmentError

    try:
        if args.demos_command == "info":
            demos = DemoSet(args.path)
            episodes = 0
            for _ in demos.episodes():  # loads and checks every episode file
                episodes += 1
            summary = {k: demos.manifest[k] for k in ("env_id", "obs_shape", "obs_dtype", "n_step", "gamma", "count")}
            returns = [e["return"] for e in demos.manifest["episodes"]]
            print(json.dumps(summary | {"episodes": episodes, "mean_return": sum(returns) / max(1, len(returns))}))
            return 0
        from flywheel.demos.collect import collect

        summary = collect(args.env, args.episodes, args.out, workers=args.workers, policy=args.policy,
                          n_step=args.n_step, gamma=args.gamma, seed=args.seed, append=args.append)
        print(json.dumps(summary))
        return 0
    except (DemoFileError, PolicyError, UnknownEnvironmentError, ValueError, RuntimeError) as exc:
        print(f"error: flywheel demos {args.demos_command}: {exc}", file=sys.stderr)
        return 2
