"""Settings shared by every service, and flags generated from settings fields with one-line errors."""

from __future__ import annotations

import argparse
import os
import socket
import sys
from pathlib import Path
from typing import Any, TypeVar

from pydantic import Field, SecretStr, ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

S = TypeVar("S", bound=BaseSettings)


def default_instance() -> str:
    """Hostname (the pod or container name under k8s/compose) plus the process id."""
    return f"{socket.gethostname()}-{os.getpid()}"


class CommonSettings(BaseSettings):
    """Fields every service has: its identity, where telemetry and control live, logging."""

    model_config = SettingsConfigDict(extra="forbid", validate_default=True)

    instance: str = Field(default_factory=default_instance, min_length=1, max_length=128)
    telemetry_endpoint: str = "tcp://127.0.0.1:5558"
    control_endpoint: str = "tcp://127.0.0.1:5559"
    telemetry_interval_s: float = Field(1.0, gt=0, le=60)
    log_level: str = Field("INFO", pattern="^(DEBUG|INFO|WARNING|ERROR)$")
    # ZeroMQ CURVE between hosts (flywheel/security.py, docs/RELIABILITY.md): on when keys are given.
    curve_keys_dir: Path | None = Field(None, description="CURVE keys folder (flywheel keys generate DIR; e.g. a "
                                        "mounted Secret): TCP connections encrypted, clients authenticated")
    curve_server_key: str = Field("", max_length=64, description="CURVE: the servers' public key, Z85 "
                                  "(instead of server.key in the keys folder)")
    curve_server_secret_key: SecretStr = Field(SecretStr(""), description="CURVE: the servers' secret key, Z85 "
                                               "(services that bind; instead of server.key_secret)")
    curve_client_secret_key: SecretStr = Field(SecretStr(""), description="CURVE: this service's client secret "
                                               "key, Z85 (services that connect; instead of client.key_secret)")
    curve_authorized_keys: str = Field("", description="CURVE: client public keys the servers accept, Z85, "
                                       "comma-separated (besides authorized/*.key in the keys folder)")


class SettingsError(SystemExit):
    """Raised with a one-line message that says which value is wrong and how to set it."""

    def __init__(self, message: str) -> None:
        super().__init__(2)
        self.message = message

    def __str__(self) -> str:
        return self.message


def flag_name(field: str) -> str:
    return "--" + field.replace("_", "-")


def env_name(cls: type[BaseSettings], field: str) -> str:
    return f"{cls.model_config.get('env_prefix', '')}{field}".upper()


def add_settings_flags(parser: argparse.ArgumentParser, cls: type[BaseSettings]) -> None:
    """One ``--field-name`` flag per settings field, with the field's env variable in its help."""
    for name, info in cls.model_fields.items():
        default = "generated" if info.default_factory is not None else info.default
        parser.add_argument(
            flag_name(name), dest=f"setting_{name}", metavar="VALUE", default=None,
            help=f"{info.description or name} (env {env_name(cls, name)}; default {default})",
        )


def settings_from_args(cls: type[S], args: argparse.Namespace, command: str) -> S:
    """Build settings from flags (highest priority) and FLYWHEEL_* variables; one-line error on failure."""
    values: dict[str, Any] = {
        key.removeprefix("setting_"): value
        for key, value in vars(args).items()
        if key.startswith("setting_") and value is not None
    }
    return build_settings(cls, values, command)


def build_settings(cls: type[S], values: dict[str, Any], command: str) -> S:
    try:
        return cls(**values)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = str(err["loc"][0]) if err["loc"] else "?"
        given = values.get(field, os.environ.get(env_name(cls, field), err.get("input")))
        raise SettingsError(
            f"flywheel {command}: invalid value {given!r} for {flag_name(field)} "
            f"(env {env_name(cls, field)}): {err['msg']}"
        ) from None


def fail(message: str, code: int = 2) -> SystemExit:
    """Print a one-line error and return the SystemExit to raise."""
    print(f"error: {message}", file=sys.stderr)
    return SystemExit(code)
