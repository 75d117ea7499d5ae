"""Gateway core: where the control token comes from, its checks, and the rules the gateway starts under."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from gateway_helpers import TOKEN

from flywheel.services.gateway.auth import ControlAuth, StartupError, fingerprint, is_loopback, startup_problem
from flywheel.services.gateway.settings import GatewaySettings


def test_token_from_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLYWHEEL_GATEWAY_CONTROL_TOKEN", TOKEN)
    auth = ControlAuth.of(GatewaySettings())
    assert auth.active
    assert auth.check(f"Bearer {TOKEN}") and auth.check(f"bearer   {TOKEN}  ")
    for bad in (None, "", TOKEN, f"Basic {TOKEN}", f"Bearer {TOKEN}x", f"Bearer {TOKEN[:-1]}", "Bearer ",
                "Bearer \udcff"):
        assert not auth.check(bad), bad
    assert auth.failures == 8
    assert auth.fingerprint() == fingerprint(TOKEN) and TOKEN not in auth.fingerprint()


def test_token_from_a_file_follows_rotation(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")  # a trailing newline, as `kubectl create secret --from-file` often leaves
    auth = ControlAuth.of(GatewaySettings(control_token_file=path))
    assert auth.check(f"Bearer {TOKEN}")
    new = "rotated-token-abcdefghijklmnop"
    path.write_text(new)
    os.utime(path, ns=(1, 1))  # a different modification time, as a Secret update gives
    assert auth.check(f"Bearer {new}") and not auth.check(f"Bearer {TOKEN}")
    path.unlink()  # unreadable later: the last good token stays in force
    assert auth.check(f"Bearer {new}")


@pytest.mark.parametrize(("values", "wanted"), [
    ({"control_token": "short"}, "at least 16"),
    ({"control_token": "has a space in the middle!"}, "spaces"),
    ({"control_token": TOKEN, "control_token_file": "/etc/hostname"}, "not both"),
    ({"control_token_file": "/nonexistent/token"}, "cannot read the control token file"),
])
def test_bad_token_settings_are_refused(values: dict[str, object], wanted: str) -> None:
    with pytest.raises(StartupError, match=wanted):
        ControlAuth.of(GatewaySettings(**values))


def test_disabled_control_ignores_the_token() -> None:
    auth = ControlAuth.of(GatewaySettings(control_enabled=False, control_token=TOKEN))
    assert not auth.active and not auth.check(f"Bearer {TOKEN}")


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.1.2.3", True), ("::1", True), ("[::1]", True), ("localhost", True),
    ("0.0.0.0", False), ("::", False), ("10.0.0.5", False), ("gateway", False), ("", False),
])
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_startup_rules() -> None:
    def problem(**values: object) -> str | None:
        settings = GatewaySettings(**values)
        return startup_problem(settings, ControlAuth.of(settings))

    assert problem() is None  # loopback without a token: starts, control off
    assert problem(http_host="0.0.0.0", control_token=TOKEN) is None
    assert problem(http_host="0.0.0.0", control_enabled=False) is None
    refused = problem(http_host="0.0.0.0")
    assert refused is not None and "FLYWHEEL_GATEWAY_CONTROL_TOKEN" in refused
    assert "FLYWHEEL_GATEWAY_CONTROL_ENABLED=false" in refused and "\n" not in refused
    windows = problem(stale_after_s=10, forget_after_s=10)
    assert windows is not None and "FORGET_AFTER_S" in windows
