"""The ``flywheel`` command: ``run`` the whole system, or one service as containers start it."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from typing import Any

from flywheel.settings import SettingsError, add_settings_flags, settings_from_args

SERVICES = ("actor", "replay", "learner", "gateway")


def _service_main(name: str) -> Callable[[Any], int]:
    """Import lazily so ``flywheel gateway`` does not pay for torch, and so on."""
    if name == "actor":
        from flywheel.services.actor.main import main
        return main
    if name == "replay":
        from flywheel.services.replay.main import main
        return main
    if name == "learner":
        from flywheel.services.learner.main import main
        return main
    from flywheel.services.gateway.__main__ import run
    return run


def _settings_class(name: str) -> type:
    if name == "actor":
        from flywheel.services.actor.settings import ActorSettings
        return ActorSettings
    if name == "replay":
        from flywheel.services.replay.settings import ReplaySettings
        return ReplaySettings
    if name == "learner":
        from flywheel.services.learner.settings import LearnerSettings
        return LearnerSettings
    from flywheel.services.gateway.settings import GatewaySettings
    return GatewaySettings


def build_parser() -> argparse.ArgumentParser:
    from flywheel.run import add_run_flags

    parser = argparse.ArgumentParser(prog="flywheel", description="Distributed Ape-X deep Q-learning over ZeroMQ.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_run_flags(sub.add_parser("run", help="run replay, learner, gateway and N actors as local processes"))
    from flywheel.bench.cli import add_bench_flags

    add_bench_flags(sub.add_parser("bench", help="run a benchmark suite side by side with its peer"))
    from flywheel.demos.cli import add_demos_flags

    add_demos_flags(sub.add_parser("demos", help="collect demonstrations in parallel, or inspect a set"))
    for name in SERVICES:
        cls = _settings_class(name)
        add_settings_flags(sub.add_parser(name, help=f"run one {name} (flags or FLYWHEEL_{name.upper()}_* vars)"),
                           cls)
    return parser


def run_service(name: str, args: argparse.Namespace) -> int:
    from flywheel.envs import UnknownEnvironmentError
    from flywheel.transport import EndpointInUse

    settings = settings_from_args(_settings_class(name), args, name)
    main = _service_main(name)
    logging.basicConfig(level=settings.log_level, format=f"%(asctime)s {name} %(levelname)s %(message)s")
    try:
        return main(settings)
    except (EndpointInUse, UnknownEnvironmentError) as exc:
        print(f"error: flywheel {name}: {exc}", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "run":
            from flywheel.run import run

            return run(args)
        if args.command == "bench":
            from flywheel.bench.cli import run_bench

            return run_bench(args)
        if args.command == "demos":
            from flywheel.demos.cli import run_demos

            return run_demos(args)
        return run_service(args.command, args)
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
