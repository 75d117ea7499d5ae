"""Actors on other hosts: ``flywheel run --listen ADDR`` opens a run to them, ``flywheel actor --join URL`` joins one.

The run binds the ports remote actors use (transitions, weights, lease, telemetry, control) and the gateway's HTTP on
ADDR, with CURVE keys (the services refuse a plaintext non-loopback bind), and writes CHECKPOINT_DIR/join.json: the
env id, the preset, the actors' settings and the endpoints as other hosts reach them. The gateway serves it at
``/join``; an actor started with ``--join http://HOST:PORT`` reads it and runs with those values, below its own flags
and FLYWHEEL_ACTOR_* variables. Its CURVE client keys are its own (``flywheel keys generate DIR --client NAME``).
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import secrets
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from flywheel.checkpoints import write_atomically
from flywheel.settings import SettingsError, build_settings, env_name

JOIN_FILE = "join.json"
TOKEN_FILE = "control-token"
FORMAT = "flywheel-join"
# what remote actors connect to: (the service that binds it, its bind setting, the actor's connect setting)
REMOTE_PORTS = (("replay", "TRANSITIONS_BIND", "TRANSITIONS_ENDPOINT"),
                ("learner", "WEIGHTS_BIND", "WEIGHTS_ENDPOINT"), ("gateway", "LEASE_ENDPOINT", "LEASE_ENDPOINT"),
                ("gateway", "TELEMETRY_ENDPOINT", "TELEMETRY_ENDPOINT"),
                ("gateway", "CONTROL_ENDPOINT", "CONTROL_ENDPOINT"))
LOCAL_ONLY = {"TRANSITIONS_ENDPOINT", "WEIGHTS_ENDPOINT", "LEASE_ENDPOINT", "TELEMETRY_ENDPOINT", "CONTROL_ENDPOINT",
              "CURVE_KEYS_DIR", "INSTANCE", "LOG_FORMAT", "EVAL_ENVS", "CLIP_INTERVAL_S"}


def add_listen_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--listen", default=None, metavar="ADDR",
                        help="also listen on ADDR (an IP of this host, or 0.0.0.0 with --advertise) for actors on "
                             "other hosts: needs --curve-keys-dir and TCP ports (--base-port); they join with "
                             "flywheel actor --join http://ADDR:HTTP_PORT")
    parser.add_argument("--advertise", default=None, metavar="HOST",
                        help="the address other hosts reach this one at, written into /join (default: --listen)")


def check_listen(args: argparse.Namespace) -> tuple[str, str] | None:
    """(bind address, advertised host) for ``--listen``, or None without it; a SettingsError for what cannot work."""
    listen = getattr(args, "listen", None)
    if not listen:
        return None
    try:
        address = ipaddress.ip_address(listen)
    except ValueError:
        raise SettingsError(f"flywheel run: --listen {listen!r} is not an IP address of this host (or 0.0.0.0)") \
            from None
    if not args.base_port:
        raise SettingsError("flywheel run: --listen needs TCP ports: give --base-port (not 0)")
    if args.curve_keys_dir is None:
        raise SettingsError("flywheel run: --listen needs --curve-keys-dir: traffic from other hosts is encrypted "
                            "and authenticated (flywheel keys generate DIR --client NAME makes the keys)")
    advertise = getattr(args, "advertise", None) or (None if address.is_unspecified else listen)
    if advertise is None:
        raise SettingsError("flywheel run: --listen 0.0.0.0 needs --advertise HOST (the address other hosts use)")
    return listen, advertise


def open_to_remote(env: dict[str, dict[str, str]], listen: str, advertise: str, ckpt: Path) -> dict[str, Any]:
    """Bind the remote actors' ports and the gateway's HTTP on ``listen``; local services keep connecting on the
    loopback or ``listen``. Returns the join document (written by ``write_join_file`` once the plan is final)."""
    local = "127.0.0.1" if ipaddress.ip_address(listen).is_unspecified else listen
    endpoints: dict[str, str] = {}
    for service, bind_key, connect_key in REMOTE_PORTS:
        binds = env[service][bind_key].split(",")
        tcp = next(b for b in binds if b.startswith("tcp://127.0.0.1:"))
        port = tcp.rsplit(":", 1)[1]
        for other, values in env.items():  # local services that connected on the loopback
            for key, value in values.items():
                if value == tcp and (other, key) != (service, bind_key):
                    values[key] = f"tcp://{local}:{port}"
        env[service][bind_key] = ",".join(f"tcp://{listen}:{port}" if b == tcp else b for b in binds)
        endpoints[connect_key] = f"tcp://{advertise}:{port}"
    gateway = env["gateway"]
    gateway["HTTP_HOST"] = listen
    if "CONTROL_TOKEN" not in gateway and "CONTROL_TOKEN_FILE" not in gateway:  # the gateway's rule off loopback
        token = ckpt / TOKEN_FILE
        if not token.is_file():
            ckpt.mkdir(parents=True, exist_ok=True)
            fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as fh:
                fh.write(secrets.token_hex(32))
        gateway["CONTROL_TOKEN_FILE"] = str(token)
    gateway["JOIN_FILE"] = str(ckpt / JOIN_FILE)
    return {"format": FORMAT, "endpoints": endpoints, "advertise": advertise}


def write_join_file(join: dict[str, Any], env: dict[str, dict[str, str]], env_id: str,
                    preset: dict[str, str] | None, ckpt: Path) -> Path:
    """CHECKPOINT_DIR/join.json: what an actor on another host runs with (no secrets, no local paths)."""
    actor = {k: v for k, v in env["actor"].items() if k not in LOCAL_ONLY and "SECRET" not in k}
    document = {**join, "env_id": env_id, "preset": preset, "actor": {**actor, **join["endpoints"]}}
    path = ckpt / JOIN_FILE
    write_atomically(path, (json.dumps(document, indent=2) + "\n").encode())
    return path


def fetch_join(url: str, timeout: float = 10.0) -> dict[str, Any]:
    """The run's join document from its gateway (``URL/join``); a SettingsError with one line when it fails."""
    target = url.rstrip("/") + "/join"
    try:
        with urllib.request.urlopen(target, timeout=timeout) as response:
            document = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        raise SettingsError(f"flywheel actor --join: {target} answered {exc.code} (is the run started with "
                            "--listen?)") from None
    except (OSError, ValueError) as exc:
        raise SettingsError(f"flywheel actor --join: cannot read {target}: {exc}") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT or not isinstance(
            document.get("actor"), dict):
        raise SettingsError(f"flywheel actor --join: {target} is not a Flywheel run's join document")
    return document


def join_values(document: dict[str, Any], chosen: set[str]) -> dict[str, str]:
    """The actor settings the join document gives, less those the user chose (flags, FLYWHEEL_ACTOR_* variables)."""
    return {k.lower(): str(v) for k, v in document["actor"].items() if k.lower() not in chosen}


def joined_settings(settings: Any, args: argparse.Namespace, command: str) -> Any:
    """An actor's settings with ``--join URL``: the run's values under the user's own flags and variables."""
    url = getattr(settings, "join", "")
    if not url:
        return settings
    cls = type(settings)
    flags = {k.removeprefix("setting_"): v for k, v in vars(args).items() if k.startswith("setting_") and v is not None}
    chosen = set(flags) | {f for f in cls.model_fields if os.environ.get(env_name(cls, f), "") != ""}
    document = fetch_join(url)
    unknown = sorted(k for k in join_values(document, set()) if k not in cls.model_fields)
    if unknown:
        raise SettingsError(f"flywheel {command} --join: {url} names settings this actor does not have "
                            f"({', '.join(unknown)}): is it the same Flywheel version?")
    return build_settings(cls, {**join_values(document, chosen), **flags}, command)
