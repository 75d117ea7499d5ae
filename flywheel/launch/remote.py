"""Actors on other hosts: ``flywheel run --listen ADDR`` opens a run to them, ``flywheel actor --join URL`` joins one.

The run binds the ports remote actors use (transitions, weights, lease, telemetry, control) and the gateway's HTTP on
ADDR, with CURVE keys (the services refuse a plaintext non-loopback bind), and writes CHECKPOINT_DIR/join.json: the
env id, the preset's name, the actors' training settings, the endpoints as other hosts reach them and the servers'
public key. The gateway serves it at ``/join``; an actor started with ``--join http://HOST:PORT`` reads it and runs
with those values, below its own flags and FLYWHEEL_ACTOR_* variables.

The document comes over plain HTTP, so the actor trusts it only for what cannot redirect it or run code: an
allow-list of fields (``TRAINING``, ``CHECKED``), endpoints on the join URL's host only, no ``module:`` env id, no
preset file, and never keys or plaintext switches. The CURVE keys are this host's own (``--curve-keys-dir``, or
``--curve-server-key``): a document whose server key differs from them is refused.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import logging
import os
import re
import secrets
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flywheel import presets, security
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
ENDPOINTS = tuple(connect for _, _, connect in REMOTE_PORTS)
# What a join document may set in an actor: an allow-list. Every actor setting is in exactly one of TRAINING, CHECKED,
# IGNORED and REFUSED (tests/test_join_trust.py checks it), so a new setting is refused from documents until placed.
TRAINING = frozenset({
    "NUM_ENVS", "VECTOR_MODE", "WORKERS", "N_STEP", "CUT_AT_EXPLORATION", "EPISODE_NOOPS_MAX", "GAMMA", "DUELING",
    "HIDDEN", "HEAD", "NUM_QUANTILES", "C51_ATOMS", "INFERENCE", "TORCH_FREEZE", "EPSILON", "EPSILON_BASE",
    "EPSILON_ALPHA", "CLIP_MAX_STEPS", "SEND_BATCH", "ON_FULL", "SEND_HWM", "SEND_STALL_S", "SEND_BUFFER_KB",
    "WEIGHTS_INTERVAL_S", "START_STATE_SHARE", "START_STATE_MARGIN", "START_STATE_WINDOW", "START_STATE_POOL",
    "START_STATE_CHOICE", "START_STATE_DEATH_EPSILON", "MAX_ENV_STEPS", "SEED", "TELEMETRY_INTERVAL_S",
    "FIRST_WEIGHTS_WAIT_S"})
CHECKED = frozenset({"ENV_ID", "PRESET", *ENDPOINTS})  # allowed, each value checked (no module:, a shipped name, host)
IGNORED = frozenset({"INSTANCE", "LOG_LEVEL", "LOG_FORMAT", "EVAL_ENVS", "CLIP_INTERVAL_S", "CHECKPOINT_DIR",
                     "CHECKPOINT_INTERVAL_S", "RESUME"})  # this host's own choice
REFUSED = {  # a document that sets one of these is refused whole: each could redirect the actor or weaken it
    "CURVE_KEYS_DIR": "keys and key folders come from this host", "CURVE_SERVER_KEY": "keys come from this host",
    "CURVE_SERVER_SECRET_KEY": "keys come from this host", "CURVE_CLIENT_SECRET_KEY": "keys come from this host",
    "CURVE_AUTHORIZED_KEYS": "keys come from this host", "ALLOW_PLAINTEXT": "plaintext is this host's choice",
    "JOIN": "a document names no other run", "MAX_VERSION_JUMP": "this host's guard against forged weights"}
TOP_LEVEL = frozenset({"format", "env_id", "preset", "endpoints", "advertise", "server_key", "actor"})
MAX_DOCUMENT_BYTES = 1 << 20  # a join document is a few KiB; a larger answer is refused unread
_OPTION_TEXT = re.compile(r"[A-Za-z0-9_-]{0,64}")  # an env option's text value from a document: no path, no dot


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
    """CHECKPOINT_DIR/join.json: what an actor on another host runs with: only the fields an actor accepts (no
    secret, no local path), and the servers' public key for the actor to check against its own."""
    shipped = {presets.NONE, *presets.names()}
    actor = {k: v for k, v in env["actor"].items() if k in TRAINING or k == "ENV_ID" or (
        k == "PRESET" and v in shipped)}
    named = None if preset is None else {k: v for k, v in preset.items() if k == "sha256" or (
        k == "name" and v in shipped)}  # a user's preset file: its hash, not its path
    document: dict[str, Any] = {**join, "env_id": env_id, "preset": named, "actor": {**actor, **join["endpoints"]}}
    if (key := _server_public(env["actor"])) is not None:
        document["server_key"] = key
    path = ckpt / JOIN_FILE
    write_atomically(path, (json.dumps(document, indent=2) + "\n").encode())
    return path


def _server_public(values: dict[str, str]) -> str | None:
    """The servers' public key the run's own actors use (their keys folder or variable), or None without CURVE."""
    folder = values.get("CURVE_KEYS_DIR", "")
    try:
        keys = security.load_keys(Path(folder) if folder else None, server_key=values.get("CURVE_SERVER_KEY", ""))
    except security.CurveKeyError:  # the services say what is wrong when they start
        return None
    return None if keys is None else keys.server_public.decode()


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # a redirect is answered as an error: the document comes from the URL given, or not at all


def join_host(url: str, command: str) -> str:
    """The host of ``--join URL`` (lower case, no brackets); a SettingsError unless it is http(s)://HOST[:PORT]."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SettingsError(f"flywheel {command} --join: {url!r} must look like http://HOST:PORT (the run's gateway)")
    return parts.hostname.lower()


def fetch_join(url: str, timeout: float = 10.0) -> dict[str, Any]:
    """The run's join document from its gateway (``URL/join``); a SettingsError with one line when it fails."""
    target = url.rstrip("/") + "/join"
    try:
        with urllib.request.build_opener(_NoRedirect).open(target, timeout=timeout) as response:
            body = response.read(MAX_DOCUMENT_BYTES + 1)
        if len(body) > MAX_DOCUMENT_BYTES:
            raise SettingsError(f"flywheel actor --join: {target} answered more than {MAX_DOCUMENT_BYTES} bytes")
        document = json.loads(body)
    except urllib.error.HTTPError as exc:
        why = "a redirect, not followed" if 300 <= exc.code < 400 else "is the run started with --listen?"
        raise SettingsError(f"flywheel actor --join: {target} answered {exc.code} ({why})") from None
    except (OSError, ValueError, RecursionError) as exc:
        raise SettingsError(f"flywheel actor --join: cannot read {target}: {exc}") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT or not isinstance(
            document.get("actor"), dict):
        raise SettingsError(f"flywheel actor --join: {target} is not a Flywheel run's join document")
    return document


def _endpoint_host(endpoint: str) -> str | None:
    """HOST of ``tcp://HOST:PORT`` (lower case, no brackets), or None for anything else."""
    scheme, sep, rest = endpoint.partition("://")
    host, colon, port = rest.rpartition(":")
    if scheme != "tcp" or not sep or not colon or not host or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    return host.strip("[]").lower()


def _check_env_id(env_id: Any, field: str, chosen: bool, refuse: Callable[[str], SettingsError]) -> str | None:
    """Why the document's env id is ignored (the user chose their own), or None when it is fine; refuses the rest."""
    from flywheel.envs import split_env_id

    if not isinstance(env_id, str) or not env_id or len(env_id) > 512:
        raise refuse(f"{field} is not an environment id")
    try:
        base, options = split_env_id(env_id)
    except ValueError as exc:
        raise refuse(f"{field}: {exc}") from None
    if ":" in base:  # Gymnasium's module:EnvId imports the module: code the document would choose
        if chosen:
            return f"{field} {env_id!r} (a module: id; yours is used)"
        raise refuse(f"{field} {env_id!r} names a module to import, which a join document may not: if you trust "
                     "it, give --env-id yourself")
    for name, value in options.items():
        texts = value if isinstance(value, list) else [value]
        if not all(v is None or isinstance(v, bool | int | float) or (
                isinstance(v, str) and _OPTION_TEXT.fullmatch(v)) for v in texts):
            raise refuse(f"{field} option {name}={value!r}: an option from a join document is a number, a boolean "
                         "or a word (letters, digits, '-', '_'), never a path")
    return None


def checked_actor(document: dict[str, Any], host: str, server_key: bytes, chosen: set[str], fields: set[str],
                  where: str, warn: Callable[[str], None]) -> dict[str, str]:
    """The actor values of a join document that passes every check; a SettingsError with one line for the first
    field that fails (keys, plaintext, a module: env id, a preset file, an endpoint off ``host``, another key).
    ``chosen``: the settings the user set (theirs win); ``fields``: the actor's settings."""
    def refuse(why: str) -> SettingsError:
        return SettingsError(f"{where}: refused: {why}")

    ignored = sorted(k for k in document if k not in TOP_LEVEL)  # nothing reads them; said once
    values: dict[str, str] = {}
    unknown: list[str] = []
    for key, value in document["actor"].items():
        name = key.upper()
        if name in REFUSED or name.startswith("CURVE_"):
            raise refuse(f"it sets {name}, which a join document may not ({REFUSED.get(name, 'keys are local')})")
        if not isinstance(value, str | bool | int | float) or len(str(value)) > 4096:
            raise refuse(f"{name} is not a single value")
        if name in IGNORED:
            ignored.append(f"actor.{name}")
        elif name in TRAINING or name in CHECKED:
            values[name] = str(value)
        elif name.lower() in fields:  # a setting no one placed in the lists above: not the document's to set
            raise refuse(f"it sets {name}, which is not one of the actors' training settings")
        else:
            unknown.append(name.lower())
    if unknown:
        raise SettingsError(f"{where} names settings this actor does not have ({', '.join(sorted(unknown))}): is "
                            "it the same Flywheel version?")
    for name in ENDPOINTS:
        if name in values and _endpoint_host(values[name]) != host:
            raise refuse(f"{name} {values[name]!r} is not tcp://{host}:PORT (the join URL's host)")
    endpoints = document.get("endpoints") or {}
    if not isinstance(endpoints, dict) or any(k not in ENDPOINTS or not isinstance(v, str) or _endpoint_host(v) != host
                                              for k, v in endpoints.items()):
        raise refuse(f"its endpoints {endpoints!r} are not tcp://{host}:PORT each (the join URL's host)")
    advertise = document.get("advertise")
    if advertise is not None and str(advertise).strip("[]").lower() != host:
        raise refuse(f"it advertises {advertise!r}, not the join URL's host {host}")
    for field, env_id, own in (("env_id", document.get("env_id"), "env_id" in chosen),
                               ("actor.ENV_ID", values.get("ENV_ID"), "env_id" in chosen)):
        if env_id is not None and (why := _check_env_id(env_id, field, own, refuse)) is not None:
            ignored.append(why)
            values.pop("ENV_ID", None)
    shipped = {presets.NONE, *presets.names()}
    if values.get("PRESET", presets.NONE) not in {"", *shipped}:
        raise refuse(f"actor.PRESET {values['PRESET']!r} is not a shipped preset's name ({', '.join(sorted(shipped))})"
                     "; a join document names no preset file")
    preset = document.get("preset")
    if preset is not None and (not isinstance(preset, dict) or str(preset.get("name", presets.NONE)) not in shipped):
        raise refuse(f"preset {preset!r} is not a shipped preset's name; a join document names no preset file")
    offered = document.get("server_key")
    if offered is not None:
        try:
            key = security.public_key(str(offered), "its server_key")
        except security.CurveKeyError as exc:
            raise refuse(str(exc)) from None
        if key != server_key:
            raise refuse(f"its CURVE server key (sha256 {security.key_fingerprint(key)}) differs from this host's "
                         f"(sha256 {security.key_fingerprint(server_key)}): is something between this host and "
                         "the run? The key always comes from --curve-keys-dir or --curve-server-key")
    if ignored:
        warn(f"{where}: ignored {', '.join(ignored)}: not for a join document to set")
    return values


def joined_settings(settings: Any, args: argparse.Namespace, command: str) -> Any:
    """An actor's settings with ``--join URL``: the run's values under the user's own flags and variables, with this
    host's CURVE keys (refused without them, and when the document's server key is another)."""
    url = getattr(settings, "join", "")
    if not url:
        return settings
    host = join_host(url, command)
    try:
        keys = security.keys_from_settings(settings, command)
    except security.CurveKeyError as exc:
        raise SettingsError(f"flywheel {command} --join: {exc}") from None
    if keys is None:
        raise SettingsError(f"flywheel {command} --join: needs this host's CURVE keys, never the network's: "
                            "--curve-keys-dir DIR (clients/NAME/ from flywheel keys generate DIR --client NAME on "
                            f"the run's host) or {env_name(type(settings), 'curve_server_key')} and "
                            f"{env_name(type(settings), 'curve_client_secret_key')}")
    cls = type(settings)
    flags = {k.removeprefix("setting_"): v for k, v in vars(args).items() if k.startswith("setting_") and v is not None}
    chosen = set(flags) | {f for f in cls.model_fields if os.environ.get(env_name(cls, f), "") != ""}
    document = fetch_join(url)
    where = f"flywheel {command} --join: {url.rstrip('/')}/join"
    values = checked_actor(document, host, keys.server_public, chosen, set(cls.model_fields), where,
                           logging.getLogger(f"flywheel.{command}").warning)
    joined = build_settings(cls, {**{k.lower(): v for k, v in values.items() if k.lower() not in chosen}, **flags},
                            command)
    used = security.keys_from_settings(joined, command)
    if used is None or used.server_public != keys.server_public:  # the document cannot reach them: kept so
        raise SettingsError(f"flywheel {command} --join: the joined settings changed this host's CURVE keys")
    return joined
