"""CURVE key files (`flywheel keys generate`): the folder's key pairs, one per role, added clients, one role's folder.

The layout is flywheel/security.py's. Servers read authorized/ when they start, so a client added later is
accepted after a restart.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
from pathlib import Path

from flywheel.security import BINDS, CONNECTS, LEGACY_CLIENT, RESERVED_NAMES, ROLES, CurveKeyError

REQUIRED = ("server.key", "server.key_secret")  # a folder that lacks one of these is not a key folder to keep


def check_client_names(names: list[str]) -> None:
    bad = [n for n in names if not re.fullmatch(r"[A-Za-z0-9_-]+", n) or n in RESERVED_NAMES]
    if bad:
        raise CurveKeyError(f"client names must be letters, digits, '-' or '_' and not one of "
                            f"{', '.join(sorted(RESERVED_NAMES))}: {bad}")


def _set_modes(paths: list[Path]) -> None:
    for path in paths:
        os.chmod(path, 0o600 if path.name.endswith("_secret") else 0o644)


def _pair(folder: Path, name: str) -> list[Path]:
    import zmq.auth

    return [Path(p) for p in zmq.auth.create_certificates(folder, name)]


def generate(directory: Path, clients: list[str] | None = None, force: bool = False) -> list[Path]:
    """Write the servers' key pair, one client key pair per role (``ROLES``) with its authorization, and one folder
    more per named client."""
    names = clients or []
    check_client_names(names)
    if (directory / "server.key_secret").exists() and not force:
        raise CurveKeyError(f"{directory} already holds keys; pass --force to replace them (every service then "
                            "needs the new ones)")
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    shutil.rmtree(directory / "authorized", ignore_errors=True)
    for name in (LEGACY_CLIENT, *ROLES):  # --force: no client key of the old folder stays behind
        for suffix in (".key", ".key_secret"):
            (directory / f"{name}{suffix}").unlink(missing_ok=True)
    written = _pair(directory, "server") + add_role_keys(directory)
    add_clients(directory, names, replace=True)
    _set_modes(written)
    return sorted(set(written) | set((directory / "authorized").glob("*.key"))
                  | {p for name in names for p in (directory / "clients" / name).iterdir()})


def add_role_keys(directory: Path) -> list[Path]:
    """The role key pairs (and their authorizations) ``directory`` lacks; a role with some of its files but not
    all is an incomplete copy: refused (CurveKeyError), nothing written."""
    files = {role: [f"{role}.key", f"{role}.key_secret", f"authorized/{role}.key"] for role in ROLES}
    missing = {role: [f for f in names if not (directory / f).is_file()] for role, names in files.items()}
    partial = [f for role, gone in missing.items() if 0 < len(gone) < len(files[role]) for f in gone]
    if partial:
        raise CurveKeyError(f"{directory} holds an incomplete key set (no {', '.join(partial)}); --force replaces "
                            "it (every service then needs the new keys)")
    (directory / "authorized").mkdir(mode=0o700, exist_ok=True)
    written: list[Path] = []
    for role in (r for r in ROLES if missing[r]):
        written += _pair(directory, role)
        shutil.copy(directory / f"{role}.key", directory / "authorized" / f"{role}.key")
        written.append(directory / "authorized" / f"{role}.key")
    _set_modes(written)
    return written


def add_clients(folder: Path, names: list[str], replace: bool = False) -> list[str]:
    """One more authorized client per name (clients/NAME/, authorized/NAME.key) that ``folder`` lacks, or every
    one with ``replace``: the names written. Their keys speak only for actors (``security.key_role``)."""
    check_client_names(names)
    added = []
    for name in dict.fromkeys(names):
        client, authorized = folder / "clients" / name, folder / "authorized" / f"{name}.key"
        if not replace and (client / "client.key_secret").is_file() and authorized.is_file():
            continue
        shutil.rmtree(client, ignore_errors=True)
        client.mkdir(parents=True, mode=0o700)
        _pair(client, "client")
        shutil.copy(folder / "server.key", client / "server.key")
        shutil.copy(client / "client.key", authorized)
        _set_modes([*client.iterdir(), authorized])
        added.append(name)
    return added


def client_public_key(folder: Path, name: str) -> str:
    import zmq.auth

    public, _ = zmq.auth.load_certificate(folder / "authorized" / f"{name}.key")
    return public.decode()


def role_folder(directory: Path, role: str, target: Path) -> list[Path]:
    """Make ``target`` hold what ``role``'s containers need of ``directory`` and nothing more: the servers' public
    key; the servers' secret and the authorized keys where it binds; its own client key pair (``ROLE.key_secret``)
    where it connects. What ``target`` held is replaced (it may be a mount point: its entries go, not itself)."""
    if role not in BINDS | CONNECTS:
        raise CurveKeyError(f"no such role {role!r}: one of {', '.join(sorted(BINDS | CONNECTS))}")
    wanted = {"server.key": directory / "server.key"}
    if role in BINDS:
        wanted["server.key_secret"] = directory / "server.key_secret"
        wanted |= {f"authorized/{p.name}": p for p in sorted((directory / "authorized").glob("*.key"))}
    if role in CONNECTS:
        own = directory / f"{role}.key_secret"
        wanted[f"{role}.key_secret"] = own if own.is_file() else directory / f"{LEGACY_CLIENT}.key_secret"
    absent = [str(source) for source in wanted.values() if not source.is_file()]
    if absent:
        raise CurveKeyError(f"cannot lay out the {role} keys: no {', '.join(absent)} (flywheel keys generate)")
    target.mkdir(parents=True, exist_ok=True)
    for old in target.iterdir():
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old)
        else:
            old.unlink()
    written = []
    for name, source in wanted.items():
        (target / name).parent.mkdir(mode=0o700, exist_ok=True)
        shutil.copyfile(source, target / name)
        written.append(target / name)
    _set_modes(written)
    return written


def run_keys(args: argparse.Namespace) -> int:
    """``flywheel keys generate DIR [--client NAME]... [--force | --if-missing] [--roles-dir OUT]``."""
    folder: Path = args.directory
    try:
        if args.if_missing and not args.force and (folder / "server.key_secret").exists():
            missing = [name for name in REQUIRED if not (folder / name).is_file()]
            if missing:
                raise CurveKeyError(f"{folder} holds an incomplete key set (no {', '.join(missing)}); --force "
                                    "replaces it (every service then needs the new keys)")
            roles = [p.stem for p in add_role_keys(folder) if p.name.endswith(".key_secret")]
            added = add_clients(folder, args.client)
            print(f"kept the keys in {folder}" + (f"; added the role keys {', '.join(roles)}" if roles else "")
                  + (f"; added the clients {', '.join(added)}" if added else ""))
        elif (folder / "server.key_secret").exists() and not args.force:
            raise CurveKeyError(f"{folder} already holds keys: --if-missing keeps them (and adds the --client "
                                "folders), --force replaces them (every service then needs the new ones)")
        else:
            written = generate(folder, args.client, force=args.force)
            print(f"wrote {len(written)} key files to {folder}: the servers' pair and one client pair per role "
                  f"({', '.join(ROLES)}); each service needs only its own (--roles-dir lays them out)"
                  + (f"; clients/<NAME>/ on the hosts {', '.join(args.client)}" if args.client else ""))
        for name in dict.fromkeys(args.client):  # what servers elsewhere need to admit it (..._AUTHORIZED_KEYS)
            print(f"client {name}: folder {folder / 'clients' / name}, public key {client_public_key(folder, name)}")
        if args.roles_dir is not None:
            for role in ("gateway", *ROLES):
                role_folder(folder, role, args.roles_dir / role)
            print(f"the gateway's, replay's, learner's and actors' keys in {args.roles_dir}/<role>/")
    except (CurveKeyError, OSError) as exc:
        print(f"error: flywheel keys: {exc}", file=sys.stderr)
        return 2
    return 0
