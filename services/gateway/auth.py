"""The control token: from a variable or a mounted file, compared in constant time; and the startup rules."""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from flywheel.security import is_loopback

from .settings import GatewaySettings

log = logging.getLogger("flywheel.gateway")
MIN_TOKEN_CHARS = 16


class StartupError(RuntimeError):
    """The gateway must not start with these settings; the message says what to set."""


def fingerprint(token: str) -> str:
    """A short, non-reversible name for a token, for logs ('which token was used')."""
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()[:12]


def _check_token(token: str, where: str) -> str:
    if len(token) < MIN_TOKEN_CHARS:
        raise StartupError(f"the control token from {where} has {len(token)} characters; use at least "
                           f"{MIN_TOKEN_CHARS}, e.g. $(openssl rand -hex 32)")
    if any(c.isspace() or ord(c) < 32 for c in token):
        raise StartupError(f"the control token from {where} contains spaces or control characters")
    return token


@dataclass
class _FileState:
    mtime_ns: int
    size: int


class ControlAuth:
    """Where the token comes from and whether a request carries it.

    A token file (a Kubernetes Secret mounted as a volume) is re-read when its modification time or size
    changes, so a rotated Secret takes effect without a restart; if it becomes unreadable the last good token
    stays in force and the problem is logged once.
    """

    def __init__(self, enabled: bool, token: str = "", token_file: Path | None = None) -> None:
        """``token`` (from a variable) or ``token_file``, not both; neither: control stays off. Raises StartupError."""
        self.enabled = enabled
        self.file = token_file
        self._token = token.strip()
        self._file_state: _FileState | None = None
        self._file_problem = False
        self.failures = 0
        if self.file is not None and self._token:
            raise StartupError("set the control token once: FLYWHEEL_GATEWAY_CONTROL_TOKEN or "
                               "FLYWHEEL_GATEWAY_CONTROL_TOKEN_FILE, not both")
        if self.file is not None:
            self._token = self._read_file()
        elif self._token:
            _check_token(self._token, "FLYWHEEL_GATEWAY_CONTROL_TOKEN")
        if not self.enabled:
            self._token = ""

    @classmethod
    def of(cls, settings: GatewaySettings) -> ControlAuth:
        """The control token of ``settings`` (control_enabled, control_token, control_token_file)."""
        return cls(settings.control_enabled, settings.control_token.get_secret_value(), settings.control_token_file)

    def fingerprint(self) -> str:
        """The fingerprint of the token in force (empty when none)."""
        return fingerprint(self._token) if self._token else ""

    @property
    def active(self) -> bool:
        """Control is on: enabled and a token is set."""
        return self.enabled and bool(self._token)

    def _read_file(self) -> str:
        assert self.file is not None
        try:
            st = os.stat(self.file)
            token = self.file.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise StartupError(f"cannot read the control token file {self.file} "
                               f"(FLYWHEEL_GATEWAY_CONTROL_TOKEN_FILE): {exc}") from None
        self._file_state = _FileState(st.st_mtime_ns, st.st_size)
        return _check_token(token, str(self.file))

    def current(self) -> str:
        """The token in force, re-reading the file when it changed."""
        if self.file is not None and self.enabled:
            try:
                st = os.stat(self.file)
                changed = self._file_state is None or (st.st_mtime_ns, st.st_size) != (
                    self._file_state.mtime_ns, self._file_state.size)
                if changed:
                    old = self._token
                    self._token = self._read_file()
                    if self._token != old:
                        log.info("control token re-read from %s (now %s)", self.file, fingerprint(self._token))
                self._file_problem = False
            except (OSError, StartupError) as exc:
                if not self._file_problem:
                    log.warning("control token file %s: %s; keeping the previous token", self.file, exc)
                self._file_problem = True
        return self._token

    def check(self, authorization: str | None) -> bool:
        """True when the ``Authorization`` header carries the token (constant-time comparison)."""
        token = self.current()
        scheme, _, given = (authorization or "").partition(" ")
        ok = bool(token) and scheme.lower() == "bearer" and hmac.compare_digest(
            given.strip().encode("utf-8", "surrogateescape"), token.encode())
        if not ok:
            self.failures += 1
        return ok


def startup_problem(settings: GatewaySettings, auth: ControlAuth) -> str | None:
    """Why the gateway must not start with these settings, or None."""
    if settings.forget_after_s <= settings.stale_after_s:
        return (f"FLYWHEEL_GATEWAY_FORGET_AFTER_S ({settings.forget_after_s:g}) must be larger than "
                f"FLYWHEEL_GATEWAY_STALE_AFTER_S ({settings.stale_after_s:g}): instances read as down before "
                "they are dropped")
    if auth.enabled and not auth.active and not is_loopback(settings.http_host):
        return (f"control needs a token when HTTP listens beyond loopback (http_host={settings.http_host}): set "
                "FLYWHEEL_GATEWAY_CONTROL_TOKEN or FLYWHEEL_GATEWAY_CONTROL_TOKEN_FILE (at least "
                f"{MIN_TOKEN_CHARS} characters, e.g. $(openssl rand -hex 32)), or FLYWHEEL_GATEWAY_CONTROL_ENABLED="
                "false to run without control")
    return None
