"""The ``flywheel`` command: ``run`` the whole system, or one service as containers start it."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from pathlib import Path

from flywheel.launch.registry import SERVICES, settings_class
from flywheel.settings import SettingsError, add_settings_flags, configure_logging, settings_from_args


def package_version() -> str:
    """The installed distribution's version, else flywheel.__version__ (a source tree that is not installed)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("flywheel-rl")
    except PackageNotFoundError:
        import flywheel

        return str(getattr(flywheel, "__version__", "unknown"))


def build_parser() -> argparse.ArgumentParser:
    from flywheel.launch.runplan import add_run_flags

    parser = argparse.ArgumentParser(prog="flywheel", description="Distributed Ape-X deep Q-learning over ZeroMQ.")
    parser.add_argument("--version", action="version", version=f"flywheel {package_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_run_flags(sub.add_parser("run", help="run replay, learner, gateway and N actors as local processes"))
    from flywheel.bench.cli import add_bench_flags

    add_bench_flags(sub.add_parser("bench", help="run a benchmark suite side by side with its peer"))
    from flywheel.demos.cli import add_demos_flags

    add_demos_flags(sub.add_parser("demos", help="collect demonstrations in parallel, or inspect a set"))
    from flywheel.tools.play import add_play_flags

    add_play_flags(sub.add_parser("play", help="watch a checkpoint play episodes, optionally as an mp4 or gif"))
    from flywheel.tools.export_cli import add_export_flags

    add_export_flags(sub.add_parser("export", help="a checkpoint's policy as ONNX or TorchScript, optionally with a "
                                    "model card folder"))
    from flywheel.tools.eval_cli import add_eval_flags

    add_eval_flags(sub.add_parser("eval", help="judge a checkpoint by the evaluation protocol: a table of returns "
                                  "(and the env's progress and success) with 95%% intervals, and a JSON file"))
    from flywheel.presets import add_presets_flags

    add_presets_flags(sub.add_parser("presets", help="the tuned settings every service reads: list them, show one"))
    keys = sub.add_parser("keys", help="ZeroMQ CURVE keys for encrypted, authenticated traffic between hosts")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    generate = keys_sub.add_parser("generate", help="write server and client key pairs into a new folder")
    generate.add_argument("directory", type=Path, help="folder for the keys (mount it as FLYWHEEL_<SERVICE>_"
                          "CURVE_KEYS_DIR)")
    generate.add_argument("--client", action="append", default=[], metavar="NAME",
                          help="one more authorized client, in clients/NAME/ (e.g. a remote actor host; repeatable)")
    generate.add_argument("--force", action="store_true", help="replace keys already in the folder")
    generate.add_argument("--if-missing", action="store_true",
                          help="keep the keys already in the folder (exit 0) and add only the --client folders it "
                          "lacks; write them all when it holds none (idempotent, e.g. a one-shot container)")
    generate.add_argument("--roles-dir", type=Path, default=None, metavar="OUT",
                          help="also write OUT/gateway, OUT/replay, OUT/learner and OUT/actor: exactly the key files "
                          "each role's containers mount (rewritten every time: compose's per-role volumes)")
    for name in SERVICES:
        cls = settings_class(name)
        add_settings_flags(sub.add_parser(name, help=f"run one {name} (flags or FLYWHEEL_{name.upper()}_* vars)"),
                           cls)
    return parser


def run_service(name: str, args: argparse.Namespace) -> int:
    from flywheel import security
    from flywheel.envs import UnknownEnvironmentError
    from flywheel.launch.remote import joined_settings
    from flywheel.presets import describe_preset
    from flywheel.transport import EndpointInUse

    settings = settings_from_args(settings_class(name), args, name)
    configure_logging(name, settings.log_level, settings.log_format, settings.instance)  # --join never sets these
    settings = joined_settings(settings, args, name)  # actor --join: the run's values under the user's own
    main = SERVICES[name].entry_point()

    def error(message: str) -> int:  # one line: plain text, or a JSON line where a log stack reads them
        if settings.log_format == "json":
            logging.getLogger(f"flywheel.{name}").error("flywheel %s: %s", name, message)
        else:
            print(f"error: flywheel {name}: {message}", file=sys.stderr)
        return 2

    try:
        security.configure(security.keys_from_settings(settings, name), allow_plaintext=settings.allow_plaintext,
                           service=name)
    except security.CurveKeyError as exc:
        return error(str(exc))
    if getattr(settings, "join", ""):
        keys = security.active()
        logging.getLogger(f"flywheel.{name}").info(
            "%s: joined the run at %s: %s, transitions to %s, server key sha256 %s (this host's)", name,
            settings.join, settings.env_id, settings.transitions_endpoint,
            security.key_fingerprint(keys.server_public) if keys is not None else "-")
    if (preset := describe_preset(settings)) is not None:
        logging.getLogger(f"flywheel.{name}").info("%s: %s", name, preset)
    try:
        return main(settings)
    except (EndpointInUse, UnknownEnvironmentError, security.PlaintextBindRefused) as exc:
        return error(str(exc))


def run_keys(args: argparse.Namespace) -> int:
    from flywheel.keyfiles import run_keys as run

    return run(args)


def _run(args: argparse.Namespace, argv: list[str] | None) -> int:
    from flywheel.launch.run import run
    from flywheel.launch.runconfig import given_flags

    args.given_flags = given_flags(sys.argv[1:] if argv is None else list(argv))  # --resume fills the rest
    return run(args)


def _play(args: argparse.Namespace, argv: list[str] | None) -> int:
    from flywheel.tools.play import run_play

    return run_play(args)


def _export(args: argparse.Namespace, argv: list[str] | None) -> int:
    from flywheel.tools.export_cli import run_export

    return run_export(args)


def _eval(args: argparse.Namespace, argv: list[str] | None) -> int:
    from flywheel.tools.eval_cli import run_eval

    return run_eval(args)


def _bench(args: argparse.Namespace, argv: list[str] | None) -> int:
    from flywheel.bench.cli import run_bench

    return run_bench(args)


def _demos(args: argparse.Namespace, argv: list[str] | None) -> int:
    from flywheel.demos.cli import run_demos

    return run_demos(args)


# the commands that are not a service; each takes the parsed arguments and the raw argv
COMMANDS: dict[str, Callable[[argparse.Namespace, list[str] | None], int]] = {
    "run": _run, "play": _play, "export": _export, "eval": _eval, "bench": _bench, "demos": _demos,
    "keys": lambda args, _argv: run_keys(args), "presets": lambda args, _argv: _presets(args),
}


def _presets(args: argparse.Namespace) -> int:
    from flywheel.presets import PresetError, run_presets

    try:
        return run_presets(args)
    except PresetError as exc:
        raise SettingsError(f"flywheel presets: {exc}") from None


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        command = COMMANDS.get(args.command)
        return command(args, argv) if command else run_service(args.command, args)
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
