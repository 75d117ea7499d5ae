"""Settings shared by every service, and flags generated from settings fields with one-line errors."""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import socket
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, TextIO, TypeVar, get_args

from pydantic import Field, SecretStr, ValidationError
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from flywheel.presets import PresetError, PresetSource

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
    log_format: Literal["text", "json"] = Field("text", description="log lines as text, or json: one object per "
                                                "line (ts, level, service, instance, logger, message, exc_info)")
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
    allow_plaintext: bool = Field(False, description="let ZeroMQ sockets bind non-loopback addresses without CURVE "
                                  "(logged as a warning at every such bind); only for a network you trust")
    preset: str = Field("", max_length=4096, description="preset of tuned settings: a name (flywheel presets "
                        "list), a YAML file, or none; empty: FLYWHEEL_PRESET, else chosen from env_id. Flags and "
                        "variables override its values")

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
                                   env_settings: PydanticBaseSettingsSource,
                                   dotenv_settings: PydanticBaseSettingsSource,
                                   file_secret_settings: PydanticBaseSettingsSource,
                                   ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Flags (init values) > FLYWHEEL_* variables > the preset > the fields' defaults."""
        return init_settings, env_settings, dotenv_settings, PresetSource(settings_cls), file_secret_settings


# a learner's torch threads when sized from the cores (flywheel run's rule and a learner started alone): a 42x42 or
# 84x84 network's update gains little past this (docs/benchmarks/learner.md)
MAX_TORCH_THREADS = 8


def setting_default(cls: type[BaseSettings], name: str) -> Any:
    """A settings field's default, for a config record that mirrors the field (the value is written once)."""
    return cls.model_fields[name].default


def shared_values(settings: BaseSettings, record: type) -> dict[str, Any]:
    """The values of ``settings`` for the fields the dataclass ``record`` shares with it by name."""
    names = {f.name for f in dataclasses.fields(record)}
    return {name: getattr(settings, name) for name in names & set(type(settings).model_fields)}


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


class BoolFlag(argparse.BooleanOptionalAction):
    """``--flag`` (true) / ``--no-flag`` (false); ``--flag VALUE`` still passes a value the field validates."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.nargs = "?"

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        negative = bool(option_string and option_string.startswith("--no-"))
        if negative and values is not None:
            positive = str(option_string).replace("--no-", "--", 1)
            parser.error(f"{option_string} takes no value (use {positive} {values})")
        setattr(namespace, self.dest, False if negative else True if values is None else values)


def is_bool_field(annotation: Any) -> bool:
    """``bool``, or a union holding it (``bool | Literal["auto"]``): such fields get ``--x`` / ``--no-x``."""
    return annotation is bool or bool in get_args(annotation)


def add_settings_flags(parser: argparse.ArgumentParser, cls: type[BaseSettings]) -> None:
    """One ``--field-name`` flag per settings field (``--x`` / ``--no-x`` for booleans), env variable in its help."""
    for name, info in cls.model_fields.items():
        default = "generated" if info.default_factory is not None else info.default
        help_text = f"{info.description or name} (env {env_name(cls, name)}; default {default})"
        if is_bool_field(info.annotation):
            literals = [str(v) for a in get_args(info.annotation) for v in get_args(a)]  # e.g. "auto"
            parser.add_argument(flag_name(name), dest=f"setting_{name}", action=BoolFlag, default=None,
                                metavar="|".join(dict.fromkeys([*literals, "true", "false"])), help=help_text)
        else:
            parser.add_argument(flag_name(name), dest=f"setting_{name}", metavar="VALUE", default=None,
                                help=help_text)


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
    except PresetError as exc:
        raise SettingsError(f"flywheel {command}: {exc}") from None
    except ValidationError as exc:
        err = exc.errors()[0]
        field = str(err["loc"][0]) if err["loc"] else ""
        if field not in cls.model_fields:  # a check across fields (a model validator) names no one flag
            raise SettingsError(f"flywheel {command}: invalid settings: {err['msg']}") from None
        given = values.get(field, os.environ.get(env_name(cls, field), err.get("input")))
        raise SettingsError(
            f"flywheel {command}: invalid value {given!r} for {flag_name(field)} "
            f"(env {env_name(cls, field)}): {err['msg']}"
        ) from None


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line: ts (UTC, ISO 8601), level, service, instance, logger, message, exc_info."""

    def __init__(self, service: str, instance: str | None = None) -> None:
        super().__init__()
        self.service, self.instance = service, instance

    def format(self, record: logging.LogRecord) -> str:
        ts = datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")
        entry: dict[str, Any] = {"ts": ts.replace("+00:00", "Z"), "level": record.levelname, "service": self.service}
        if self.instance:
            entry["instance"] = self.instance
        entry.update(logger=record.name, message=record.getMessage())
        if record.exc_info:
            entry["exc_type"] = record.exc_info[0].__name__ if record.exc_info[0] else None
            entry["exc_info"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack_info"] = self.formatStack(record.stack_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


class _LogHandler(logging.StreamHandler[TextIO]):
    """The root handler configure_logging installs (and replaces when called again)."""


def configure_logging(service: str, level: str = "INFO", log_format: str = "text", instance: str | None = None) -> None:
    """The one place logging is set up for a service process: text lines, or JSON lines for log stacks.

    Calling it again replaces its own handler; like ``logging.basicConfig`` it leaves alone a process whose root
    logger already has other handlers (an embedding program, pytest).
    """
    root = logging.getLogger()
    ours = [h for h in root.handlers if isinstance(h, _LogHandler)]
    if len(ours) != len(root.handlers):
        return
    for old in ours:
        root.removeHandler(old)
    handler = _LogHandler(sys.stderr)
    if log_format == "json":
        handler.setFormatter(JsonLogFormatter(service, instance))
        logging.captureWarnings(True)  # Python warnings (torch, gymnasium) become JSON lines too
    else:
        handler.setFormatter(logging.Formatter(f"%(asctime)s {service} %(levelname)s %(message)s"))
    root.addHandler(handler)
    root.setLevel(level)


def fail(message: str, code: int = 2) -> SystemExit:
    """Print a one-line error and return the SystemExit to raise."""
    print(f"error: {message}", file=sys.stderr)
    return SystemExit(code)
