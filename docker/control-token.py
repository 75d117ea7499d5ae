#!/usr/bin/env python3
"""Write the gateway's control token file once (installed as /usr/local/bin/flywheel-control-token).

docker-compose.yml runs it as a one-shot service before the gateway, on a volume the gateway mounts read-only
(FLYWHEEL_GATEWAY_CONTROL_TOKEN_FILE). The token is, in order:

1. $FLYWHEEL_CONTROL_TOKEN when set (write it, replacing what was there: rotation is a restart away);
2. the token already in the file (kept across `docker compose down` / `up`; `down -v` forgets it);
3. a new random one, 64 hex characters.

Only the fingerprint is printed, never the token; read it with
``docker compose exec gateway cat /run/flywheel/control-token``. Standard library only.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import sys
from pathlib import Path

DEFAULT_PATH = "/run/flywheel/control-token"
MIN_CHARS = 16


def fingerprint(token: str) -> str:
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()[:12]


def choose(given: str, existing: str | None) -> tuple[str, str]:
    """(token, where it came from) by the rules above; raises ValueError for an unusable given token."""
    given = given.strip()
    if given:
        if len(given) < MIN_CHARS or any(c.isspace() or ord(c) < 32 for c in given):
            raise ValueError(f"FLYWHEEL_CONTROL_TOKEN must be at least {MIN_CHARS} characters without spaces")
        return given, "FLYWHEEL_CONTROL_TOKEN"
    if existing and len(existing.strip()) >= MIN_CHARS:
        return existing.strip(), "the existing token file"
    return secrets.token_hex(32), "a new random token"


def write_private(path: Path, token: str) -> None:
    """Replace the file atomically with mode 0400 (owner read only)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o400)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    os.replace(tmp, path)


def main() -> int:
    path = Path(os.environ.get("FLYWHEEL_CONTROL_TOKEN_PATH", DEFAULT_PATH))
    try:
        existing = path.read_text() if path.exists() else None
        token, source = choose(os.environ.get("FLYWHEEL_CONTROL_TOKEN", ""), existing)
        if token != (existing or "").strip():
            write_private(path, token)
    except (OSError, ValueError) as exc:
        print(f"error: flywheel-control-token: {exc}", file=sys.stderr)
        return 1
    print(f"control token in {path} from {source} ({fingerprint(token)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
