"""ZeroMQ CURVE between hosts: keys from a mounted directory or the environment, key generation (ZAP: flywheel.zap).

CURVE encrypts every TCP connection and authenticates both ends: a client must know the servers' public key,
and a server accepts only clients whose public key is authorized. Unix sockets (``ipc://``) and ``inproc://``
stay plain: they never leave the host and file permissions guard them.

One key layout, made by ``flywheel keys generate DIR``::

    DIR/server.key          the servers' public key (every service)
    DIR/server.key_secret   the servers' key pair (services that bind: replay, learner, gateway)
    DIR/ROLE.key_secret     one client key pair per role that connects (learner, replay, actor)
    DIR/authorized/NAME.key client public keys the servers accept; NAME is the key's identity (``key_role``)
    DIR/clients/NAME/       a ready-to-mount folder for one more client (``--client NAME``: an actor elsewhere)
    DIR/client.key_secret   folders made before per-role keys: one client key every service shared (any role)

A service reads ``ROLE.key_secret`` where the folder has it, else ``client.key_secret``. ``role_folder`` writes
what one role's containers mount and nothing more (compose's per-role volumes; k8s picks the same files by
Secret items). The gateway's telemetry socket learns which key sent each report (flywheel.zap.IDENTITY_DOMAIN):
a key may speak only for its role.
"""

from __future__ import annotations

import hashlib
import ipaddress
import logging
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq
import zmq.utils.z85

from flywheel.zap import IDENTITY_DOMAIN, start_zap_handler
from flywheel.zap import ZAP_DOMAIN as ZAP_DOMAIN  # re-exported: the domain of every other CURVE server socket
from flywheel.zap import refused_counts as refused_counts  # re-exported: transport and gateway count refusals here

log = logging.getLogger("flywheel.security")
PLAIN_TRANSPORTS = ("ipc://", "inproc://")
BINDS = {"replay", "learner", "gateway"}
CONNECTS = {"replay", "learner", "actor"}
ROLES = ("learner", "replay", "actor")  # the client key pairs `flywheel keys generate` writes, one per role
LEGACY_CLIENT = "client"  # the one client key of folders made before per-role keys: it may speak for any role
RESERVED_NAMES = frozenset({"server", LEGACY_CLIENT, "gateway", *ROLES})  # not for --client NAME


class CurveKeyError(ValueError):
    """CURVE settings that cannot work; the message is one line naming the file or variable to fix."""


class PlaintextBindRefused(CurveKeyError):
    """A bind on an address other hosts can reach, with no CURVE keys and no explicit ``allow_plaintext``."""


@dataclass(frozen=True)
class CurveKeys:
    """Z85 keys (40 characters each) of one process."""

    server_public: bytes
    server_secret: bytes | None = None
    client_public: bytes | None = None
    client_secret: bytes | None = None
    authorized: frozenset[bytes] = frozenset()
    names: tuple[tuple[bytes, str], ...] = ()  # authorized keys' names (authorized/NAME.key): their identities


def _z85(value: str | bytes, what: str) -> bytes:
    key = value.encode() if isinstance(value, str) else value
    key = key.strip()
    try:
        if len(key) != 40 or len(zmq.utils.z85.decode(key)) != 32:
            raise ValueError
    except (ValueError, KeyError, IndexError, TypeError):
        raise CurveKeyError(f"{what} is not a Z85 CURVE key (40 characters)") from None
    return key


def key_fingerprint(key: str | bytes) -> str:
    """A CURVE public key's short name in messages: the first 8 hex characters of the sha256 of its 32 bytes."""
    return hashlib.sha256(zmq.utils.z85.decode(_z85(key, "a CURVE key"))).hexdigest()[:8]


def public_key(value: str | bytes, what: str) -> bytes:
    """``value`` as a Z85 CURVE key (40 characters), or a CurveKeyError naming ``what``."""
    return _z85(value, what)


def _certificate(path: Path, want_secret: bool) -> tuple[bytes, bytes | None]:
    import zmq.auth

    try:
        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise CurveKeyError(f"cannot read the CURVE certificate {path}: {exc}") from None
    if want_secret and secret is None:
        raise CurveKeyError(f"{path} holds no secret key")
    return _z85(public, str(path)), _z85(secret, str(path)) if secret is not None else None


def load_keys(keys_dir: Path | None = None, *, server_key: str = "", server_secret_key: str = "",
              client_secret_key: str = "", authorized_keys: str = "", env_prefix: str = "FLYWHEEL_*_",
              role: str = "") -> CurveKeys | None:
    """Keys from ``keys_dir`` and/or explicit Z85 values (which win); None when CURVE is not asked for.

    The client key pair is ``ROLE.key_secret`` when the folder has one for ``role``, else ``client.key_secret``."""
    if keys_dir is None and not (server_key or server_secret_key or client_secret_key or authorized_keys):
        return None
    server_public = server_secret = client_public = client_secret = None
    authorized: set[bytes] = set()
    names: dict[bytes, str] = {}
    if keys_dir is not None:
        if not keys_dir.is_dir():
            raise CurveKeyError(f"CURVE keys folder {keys_dir} does not exist ({env_prefix}CURVE_KEYS_DIR); "
                                "make one with: flywheel keys generate DIR")
        if (keys_dir / "server.key_secret").exists():
            server_public, server_secret = _certificate(keys_dir / "server.key_secret", True)
        elif (keys_dir / "server.key").exists():
            server_public, _ = _certificate(keys_dir / "server.key", False)
        own = keys_dir / f"{role}.key_secret"
        client_file = own if role in ROLES and own.exists() else keys_dir / f"{LEGACY_CLIENT}.key_secret"
        if client_file.exists():
            client_public, client_secret = _certificate(client_file, True)
        folder = keys_dir / "authorized"
        if folder.is_dir():
            names |= {_certificate(path, False)[0]: path.stem for path in sorted(folder.glob("*.key"))}
            authorized |= set(names)
    if server_secret_key:
        server_secret = _z85(server_secret_key, f"{env_prefix}CURVE_SERVER_SECRET_KEY")
        server_public = zmq.curve_public(server_secret)
    if server_key:
        given = _z85(server_key, f"{env_prefix}CURVE_SERVER_KEY")
        if server_public is not None and server_secret is not None and given != server_public:
            raise CurveKeyError(f"{env_prefix}CURVE_SERVER_KEY does not belong to the server secret key")
        server_public = given
    if client_secret_key:
        client_secret = _z85(client_secret_key, f"{env_prefix}CURVE_CLIENT_SECRET_KEY")
        client_public = zmq.curve_public(client_secret)
    for i, item in enumerate(k for k in authorized_keys.replace("\n", ",").split(",") if k.strip()):
        authorized.add(_z85(item, f"{env_prefix}CURVE_AUTHORIZED_KEYS entry {i + 1}"))
    if server_public is None:
        raise CurveKeyError(f"CURVE is on but the servers' public key is missing: put server.key in the keys "
                            f"folder or set {env_prefix}CURVE_SERVER_KEY")
    return CurveKeys(server_public, server_secret, client_public, client_secret, frozenset(authorized),
                     tuple(sorted(names.items())))


def keys_from_settings(settings: Any, service: str) -> CurveKeys | None:
    """Load and check the keys a service's settings name, for what that service does (bind and/or connect)."""
    prefix = f"FLYWHEEL_{service.upper()}_"
    keys = load_keys(getattr(settings, "curve_keys_dir", None),
                     server_key=getattr(settings, "curve_server_key", ""),
                     server_secret_key=_secret(getattr(settings, "curve_server_secret_key", "")),
                     client_secret_key=_secret(getattr(settings, "curve_client_secret_key", "")),
                     authorized_keys=getattr(settings, "curve_authorized_keys", ""), env_prefix=prefix, role=service)
    if keys is None:
        return None
    if service in BINDS and keys.server_secret is None:
        raise CurveKeyError(f"flywheel {service} binds sockets, so CURVE needs the server secret key: "
                            f"server.key_secret in the keys folder or {prefix}CURVE_SERVER_SECRET_KEY")
    if service in BINDS and not keys.authorized:
        raise CurveKeyError(f"flywheel {service}: no client is authorized, so no one could connect: add "
                            f"authorized/*.key to the keys folder or set {prefix}CURVE_AUTHORIZED_KEYS")
    if service in CONNECTS and keys.client_secret is None:
        raise CurveKeyError(f"flywheel {service} connects to other services, so CURVE needs a client key pair: "
                            f"{service}.key_secret (or client.key_secret) in the keys folder or "
                            f"{prefix}CURVE_CLIENT_SECRET_KEY")
    return keys


def _secret(value: Any) -> str:
    return value.get_secret_value() if hasattr(value, "get_secret_value") else str(value or "")


# ---- the process's keys and the sockets ------------------------------------------------------------------------
_active: CurveKeys | None = None
_allow_plaintext = False
_service = "<service>"
_watched: weakref.WeakSet[zmq.Socket] = weakref.WeakSet()


def configure(keys: CurveKeys | None, *, allow_plaintext: bool = False, service: str = "") -> None:
    """Set the keys every later ``flywheel.transport.bind``/``connect`` of this process uses (None: plain).

    Without keys, a bind on an address other hosts can reach is refused unless ``allow_plaintext`` says otherwise
    (``check_bind``); ``service`` names the settings prefix in that refusal."""
    global _active, _allow_plaintext, _service
    _active = keys
    _allow_plaintext = allow_plaintext
    _service = service or "<service>"
    if keys is not None:
        log.info("CURVE on: TCP connections encrypted; servers accept %d client key(s)", len(keys.authorized))
    elif allow_plaintext:
        log.warning("allow_plaintext is on and CURVE is off: ZeroMQ sockets bound on non-loopback addresses accept "
                    "anyone who reaches them, unencrypted (push transitions, read batches, send priorities)")


LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})


def is_loopback(host: str) -> bool:
    """True when ``host`` is reachable only from this machine (127.0.0.0/8, ::1, ::ffff:127.x, localhost)."""
    host = host.strip().strip("[]").lower().partition("%")[0]
    if host in LOOPBACK_NAMES:
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False  # a host name, an interface or a wildcard: assume reachable from elsewhere
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped.is_loopback
    return ip.is_loopback


def loopback_only(endpoint: str) -> bool:
    """Whether other hosts cannot reach ``endpoint``: ipc and inproc, or tcp on a loopback address or ``lo``."""
    scheme, _, rest = endpoint.partition("://")
    if scheme in ("ipc", "inproc"):
        return True
    if scheme != "tcp":
        return False  # pgm, epgm, udp, ws...: network transports
    host = rest.rpartition(":")[0].split(";")[-1]
    return host == "lo" or is_loopback(host)  # "lo": the loopback interface, as ZeroMQ names one


def check_bind(endpoint: str, what: str, setting: str) -> None:
    """Refuse a plaintext bind that other hosts can reach (the gateway's token rule, for the data plane)."""
    if _active is not None or loopback_only(endpoint):
        return
    prefix = f"FLYWHEEL_{_service.upper()}_"
    if not _allow_plaintext:
        raise PlaintextBindRefused(
            f"refusing to bind {endpoint} ({what}) without CURVE: other hosts could push, read and change "
            f"training data. Make keys with `flywheel keys generate DIR` and set {prefix}CURVE_KEYS_DIR=DIR, bind "
            f"127.0.0.1 or ipc:// ({setting}), or set {prefix}ALLOW_PLAINTEXT=true on a network you trust")
    log.warning("PLAINTEXT bind of %s (%s): CURVE is off and allow_plaintext is on, so anyone who reaches this "
                "port can use it", endpoint, what)


def active() -> CurveKeys | None:
    return _active


def secured(endpoint: str) -> bool:
    """Whether CURVE applies to this endpoint: every transport that can leave the host."""
    return _active is not None and not endpoint.startswith(PLAIN_TRANSPORTS)


def prepare_bind(sock: zmq.Socket, endpoint: str) -> None:
    """Make the next bind of ``sock`` a CURVE server (network endpoints) or plain (ipc, inproc)."""
    keys = _active
    if keys is None or not secured(endpoint):
        if keys is not None:
            sock.setsockopt(zmq.CURVE_SERVER, 0)  # this socket may also bind a network endpoint: plain here
        return
    if keys.server_secret is None:
        raise CurveKeyError(f"cannot bind {endpoint} with CURVE: this process has no server secret key")
    handler = start_zap_handler(sock.context, keys.authorized, dict(keys.names))
    if sock not in _watched:  # one monitor per socket, whatever it binds
        _watched.add(sock)
        handler.watch(sock)
    if not sock.getsockopt(zmq.ZAP_DOMAIN):  # identify_peers may have set its own
        sock.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN)
    sock.setsockopt(zmq.CURVE_SECRETKEY, keys.server_secret)
    sock.setsockopt(zmq.CURVE_SERVER, 1)


def monitored_by_owner(sock: zmq.Socket) -> None:
    """``sock``'s owner reads its one monitor (``flywheel.connections``) and passes refused handshakes on to the
    ZAP handler: ``prepare_bind`` then leaves it unwatched."""
    _watched.add(sock)


def identify_peers(sock: zmq.Socket) -> None:
    """Before its binds: ``sock``'s CURVE clients are named on each message (``peer_key``); no-op without CURVE."""
    if _active is None:
        return
    if sock.getsockopt(zmq.RCVHWM) == 1:  # a user id stalls a CURVE socket at RCVHWM 1 (flywheel.zap)
        sock.setsockopt(zmq.RCVHWM, 2)
    sock.setsockopt(zmq.ZAP_DOMAIN, IDENTITY_DOMAIN)


def peer_key(frame: zmq.Frame) -> str:
    """The name of the CURVE key that sent ``frame`` on an ``identify_peers`` socket; "" for a plain (local) peer."""
    try:
        return str(frame.get("User-Id") or "")
    except (zmq.ZMQError, AttributeError, TypeError):  # no user id at all (a plain connection), or bytes
        return ""


def key_role(name: str) -> str:
    """Whose key it is: ``learner`` or ``learner-*`` the learner's, ``replay``/``replay-*`` the replay's, ""
    (a plain local peer) and the legacy shared ``client`` key anyone's ("*"), every other key an actor's."""
    if not name or name == LEGACY_CLIENT:
        return "*"
    for role in ("learner", "replay"):
        if name == role or name.startswith(f"{role}-"):
            return role
    return "actor"


# The services each role's key may report for: an actor's key also for `flywheel run`'s launcher (flywheel/
# supervisor.py reports with the actors' keys), never for the learner or the replay.
SPEAKS_FOR = {"learner": frozenset({"learner"}), "replay": frozenset({"replay"}),
              "actor": frozenset({"actor", "supervisor"})}


def speaks_for(name: str, service: str) -> bool:
    """Whether the key named ``name`` (``peer_key``) may report for ``service``."""
    role = key_role(name)
    return role == "*" or service in SPEAKS_FOR[role]


def prepare_connect(sock: zmq.Socket, endpoint: str) -> None:
    """Make the next connect of ``sock`` a CURVE client (network endpoints) or plain (ipc, inproc)."""
    keys = _active
    if keys is None or not secured(endpoint):
        if keys is not None:
            sock.setsockopt(zmq.CURVE_SERVER, 0)
        return
    if keys.client_secret is None or keys.client_public is None:
        raise CurveKeyError(f"cannot connect to {endpoint} with CURVE: this process has no client key pair")
    sock.setsockopt(zmq.CURVE_SERVERKEY, keys.server_public)
    sock.setsockopt(zmq.CURVE_PUBLICKEY, keys.client_public)
    sock.setsockopt(zmq.CURVE_SECRETKEY, keys.client_secret)
