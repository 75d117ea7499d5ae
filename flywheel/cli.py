"""The ``flywheel`` command: ``run`` the whole system, or one service as containers start it."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from pathlib import Path

from flywheel.registry import SERVICES, settings_class
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
    from flywheel.run import add_run_flags

    parser = argparse.ArgumentParser(prog="flywheel", description="Distributed Ape-X deep Q-learning over ZeroMQ.")
    parser.add_argument("--version", action="version", version=f"flywheel {package_version()}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_run_flags(sub.add_parser("run", help="run replay, learner, gateway and N actors as local processes"))
    from flywheel.bench.cli import add_bench_flags

    add_bench_flags(sub.add_parser("bench", help="run a benchmark suite side by side with its peer"))
    from flywheel.demos.cli import add_demos_flags

    add_demos_flags(sub.add_parser("demos", help="collect demonstrations in parallel, or inspect a set"))
    from flywheel.play import add_play_flags

    add_play_flags(sub.add_parser("play", help="watch a checkpoint play episodes, optionally as an mp4 or gif"))
    from flywheel.export_cli import add_export_flags

    add_export_flags(sub.add_parser("export", help="a checkpoint's policy as ONNX or TorchScript, optionally with a "
                                    "model card folder"))
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
    for name in SERVICES:
        cls = settings_class(name)
        add_settings_flags(sub.add_parser(name, help=f"run one {name} (flags or FLYWHEEL_{name.upper()}_* vars)"),
                           cls)
    return parser


def run_service(name: str, args: argparse.Namespace) -> int:
    from flywheel import security
    from flywheel.envs import UnknownEnvironmentError
    from flywheel.presets import describe_preset
    from flywheel.remote import joined_settings
    from flywheel.transport import EndpointInUse

    settings = joined_settings(settings_from_args(settings_class(name), args, name), args, name)  # actor --join
    main = SERVICES[name].entry_point()
    configure_logging(name, settings.log_level, settings.log_format, settings.instance)

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
        logging.getLogger(f"flywheel.{name}").info("%s: joined the run at %s: %s, transitions to %s", name,
                                                   settings.join, settings.env_id, settings.transitions_endpoint)
    if (preset := describe_preset(settings)) is not None:
        logging.getLogger(f"flywheel.{name}").info("%s: %s", name, preset)
    try:
        return main(settings)
    except (EndpointInUse, UnknownEnvironmentError, security.PlaintextBindRefused) as exc:
        return error(str(exc))


KEY_SET = ("server.key", "server.key_secret", "client.key", "client.key_secret", "authorized/client.key")


def run_keys(args: argparse.Namespace) -> int:
    from flywheel import security

    folder: Path = args.directory
    try:
        if args.if_missing and not args.force and (folder / "server.key_secret").exists():
            missing = [name for name in KEY_SET if not (folder / name).is_file()]
            if missing:
                raise security.CurveKeyError(f"{folder} holds an incomplete key set (no {', '.join(missing)}); "
                                             "--force replaces it (every service then needs the new keys)")
            added = add_clients(folder, args.client)
            print(f"kept the keys in {folder}" + (f"; added the clients {', '.join(added)}" if added else ""))
        elif (folder / "server.key_secret").exists() and not args.force:
            raise security.CurveKeyError(f"{folder} already holds keys: --if-missing keeps them (and adds the "
                                         "--client folders), --force replaces them (every service then needs the "
                                         "new ones)")
        else:
            written = security.generate(folder, args.client, force=args.force)
            print(f"wrote {len(written)} key files to {folder}: mount the folder on every service as "
                  "FLYWHEEL_<SERVICE>_CURVE_KEYS_DIR" + (f"; clients/<NAME>/ on the hosts {', '.join(args.client)}"
                                                         if args.client else ""))
        for name in dict.fromkeys(args.client):  # what servers elsewhere need to admit it (..._AUTHORIZED_KEYS)
            print(f"client {name}: folder {folder / 'clients' / name}, public key {client_public_key(folder, name)}")
    except (security.CurveKeyError, OSError) as exc:
        print(f"error: flywheel keys: {exc}", file=sys.stderr)
        return 2
    return 0


def client_public_key(folder: Path, name: str) -> str:
    import zmq.auth

    public, _ = zmq.auth.load_certificate(folder / "authorized" / f"{name}.key")
    return public.decode()


def add_clients(folder: Path, names: list[str]) -> list[str]:
    """One more authorized client per name that ``folder`` lacks, beside its keys (which stay): the names added.

    Servers read authorized/ when they start, so they accept a new client after a restart."""
    import re
    import shutil

    import zmq.auth

    from flywheel import security

    bad = [n for n in names if not re.fullmatch(r"[A-Za-z0-9_-]+", n) or n in ("server", "client")]
    if bad:
        raise security.CurveKeyError(f"client names must be letters, digits, '-' or '_' (and not server/client): "
                                     f"{bad}")
    added = []
    for name in dict.fromkeys(names):
        client, authorized = folder / "clients" / name, folder / "authorized" / f"{name}.key"
        if (client / "client.key_secret").is_file() and authorized.is_file():
            continue
        shutil.rmtree(client, ignore_errors=True)
        client.mkdir(parents=True, mode=0o700)
        zmq.auth.create_certificates(client, "client")
        shutil.copy(folder / "server.key", client / "server.key")
        shutil.copy(client / "client.key", authorized)
        for path in (*client.iterdir(), authorized):
            path.chmod(0o600 if path.name.endswith("_secret") else 0o644)
        added.append(name)
    return added


def _run(args: argparse.Namespace, argv: list[str] | None) -> int:
    from flywheel.run import run
    from flywheel.runconfig import given_flags

    args.given_flags = given_flags(sys.argv[1:] if argv is None else list(argv))  # --resume fills the rest
    return run(args)


def _play(args: argparse.Namespace, argv: list[str] | None) -> int:
    from flywheel.play import run_play

    return run_play(args)


def _export(args: argparse.Namespace, argv: list[str] | None) -> int:
    from flywheel.export_cli import run_export

    return run_export(args)


def _bench(args: argparse.Namespace, argv: list[str] | None) -> int:
    from flywheel.bench.cli import run_bench

    return run_bench(args)


def _demos(args: argparse.Namespace, argv: list[str] | None) -> int:
    from flywheel.demos.cli import run_demos

    return run_demos(args)


# the commands that are not a service; each takes the parsed arguments and the raw argv
COMMANDS: dict[str, Callable[[argparse.Namespace, list[str] | None], int]] = {
    "run": _run, "play": _play, "export": _export, "bench": _bench, "demos": _demos,
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
