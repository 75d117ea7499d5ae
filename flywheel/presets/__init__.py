"""Presets: the tuned settings of an env family as YAML files, read by every service through its settings.

A preset file holds one section per service (``actor``, ``replay``, ``learner``, ``gateway``), a ``common``
section applied to every service that has the field, and ``run`` for ``flywheel run``'s own choices. The files
shipped here are the only place the tuned values are written. Precedence (highest first): flags, FLYWHEEL_*
variables, the preset, the settings' defaults. The preset is named by the ``preset`` setting (``--preset``,
``FLYWHEEL_<SERVICE>_PRESET``), else by ``FLYWHEEL_PRESET``, else chosen from the env id; ``none`` turns it off.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import yaml
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource

PRESET_DIR = Path(__file__).parent
SERVICES = ("actor", "replay", "learner", "gateway")
SECTIONS = ("description", "extends", "common", "run", *SERVICES)
# flywheel run's own choices (flywheel/launch/run.py reads them)
RUN_KEYS = ("clip_interval_s", "learner_core_share", "spare_cores")
GLOBAL_VARIABLE = "FLYWHEEL_PRESET"
NONE = "none"
# The default job, the env id every service and `flywheel run` start with unless told: Super Mario Bros 1-1 over
# 42x42 frames with the score bar (the top 32 rows) cropped off before the resize, which learned faster per hour on
# 2 CPU cores than 84x84 and than the whole frame (docs/benchmarks/mario.md), and `rejump`, with which a jump
# action on the ground always jumps (more flags on three paired training seeds, docs/ENVIRONMENTS.md); any other
# size, e.g. the Nature DQN's 84, the whole frame (crop_top=0) or the plain controller of the public agents
# (rejump=false) is one option away. Its preset is mario.yaml.
DEFAULT_ENV = "SuperMarioBros-1-1-v0?size=42,crop_top=32,rejump=true"


class PresetError(ValueError):
    """A preset that cannot be used: one line naming the file or name and what is wrong."""


@dataclass(frozen=True)
class Preset:
    """One preset file: its name (the file's stem, or the path of a user's file), sections and content hash."""

    name: str
    path: Path
    description: str
    sections: dict[str, dict[str, Any]] = field(default_factory=dict)
    sha256: str = ""

    def section(self, service: str) -> dict[str, Any]:
        """The values for ``service``: the common section, then the service's own over it."""
        return {**self.sections.get("common", {}), **self.sections.get(service, {})}

    def as_variables(self, service: str) -> dict[str, str]:
        """The service's values as FLYWHEEL_<SERVICE>_* variable values (KEY -> text)."""
        return {key.upper(): text(value) for key, value in self.section(service).items()}


def text(value: Any) -> str:
    """A YAML value as a settings variable holds it (booleans lower-case, as pydantic reads them)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def names() -> list[str]:
    """The shipped presets' names."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def load(name_or_file: str) -> Preset:
    """A shipped preset by name, or a YAML file by path; SettingsError with one line when it cannot be read."""
    path = Path(name_or_file) if name_or_file.endswith((".yaml", ".yml")) or "/" in name_or_file \
        else PRESET_DIR / f"{name_or_file}.yaml"
    if path.parent == PRESET_DIR and not path.is_file():
        raise PresetError(f"unknown preset {name_or_file!r}: choose one of {', '.join(names())}, {NONE!r}, "
                            "or a YAML file (flywheel presets list)")
    return _load(path.resolve())


@cache
def _load(path: Path) -> Preset:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise PresetError(f"preset file {path}: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(raw) or {}
    except yaml.YAMLError as exc:
        raise PresetError(f"preset file {path}: not valid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        raise PresetError(f"preset file {path}: expected a mapping of sections ({', '.join(SECTIONS)})")
    unknown = sorted(set(data) - set(SECTIONS))
    if unknown:
        raise PresetError(f"preset file {path}: unknown section(s) {', '.join(unknown)} "
                            f"(sections: {', '.join(SECTIONS)})")
    base = _base(path, data.get("extends"))
    sections: dict[str, dict[str, Any]] = {k: dict(v) for k, v in base.sections.items()} if base else {}
    for name, values in data.items():
        if name in ("description", "extends"):
            continue
        if not isinstance(values, dict) or not all(isinstance(k, str) for k in values):
            raise PresetError(f"preset file {path}: section {name!r} must map setting names to values")
        bad = [k for k, v in values.items() if not isinstance(v, str | int | float | bool)]
        if bad:
            raise PresetError(f"preset file {path}: {name}.{bad[0]} must be a single value")
        unknown_run = sorted(set(values) - set(RUN_KEYS)) if name == "run" else []
        if unknown_run:
            raise PresetError(f"preset file {path}: run.{unknown_run[0]} is not one of flywheel run's choices "
                              f"({', '.join(RUN_KEYS)})")
        sections[name] = {**sections.get(name, {}), **values}
    stem = path.stem if path.parent == PRESET_DIR else str(path)
    digest = hashlib.sha256(raw + (base.sha256.encode() if base else b"")).hexdigest()  # the base's values too
    return Preset(stem, path, str(data.get("description", "")), sections, digest)


_LOADING: list[Path] = []  # the files whose ``extends`` are being followed, to refuse a loop


def _base(path: Path, extends: Any) -> Preset | None:
    """The preset named by ``extends`` (a shipped name, or a file relative to this one): its values come first."""
    if extends is None:
        return None
    if not isinstance(extends, str) or not extends:
        raise PresetError(f"preset file {path}: extends must name one preset")
    target = extends if not extends.endswith((".yaml", ".yml")) else str(path.parent / extends)
    if path in _LOADING:
        raise PresetError(f"preset file {path}: extends loops back to itself")
    _LOADING.append(path)
    try:
        return load(target)
    finally:
        _LOADING.pop()


def name_for_env(env_id: str, obs_dtype: str | None = None) -> str:
    """The shipped preset of an env id: atari for ale-py ids, mario for single-stage Super Mario Bros ids, grid for
    Snake and MettaGrid, pixel for other images (whole-game Mario too), vector otherwise."""
    from flywheel.envs import env_family, env_spec, start_states_refusal

    family = env_family(env_id)
    if family == "mario":  # mario's recipe holds the start-state curriculum: ids that cannot keep states get pixel's
        return "mario" if start_states_refusal(env_id) is None else "pixel"
    if family in ("atari", "snake", "mettagrid"):
        return {"atari": "atari"}.get(family, "grid")
    if obs_dtype is None:
        obs_dtype = env_spec(env_id).obs_dtype
    return "pixel" if obs_dtype == "uint8" else "vector"


def resolve(named: str, env_id: str | None) -> Preset | None:
    """The preset ``named`` (a name or file), or the env id's when empty; None for ``none`` or no env id."""
    if named == NONE:
        return None
    if named:
        return load(named)
    if not env_id:
        return None
    try:
        name = name_for_env(env_id)
    except Exception:  # an unknown or unavailable env: the service reports it in its own words
        return None
    return load(name)  # a shipped file that cannot be read is an error, never a silent fall-back to defaults


def service_of(settings_cls: type[BaseSettings]) -> str:
    """``actor`` for FLYWHEEL_ACTOR_ settings, and so on."""
    return str(settings_cls.model_config.get("env_prefix", "")).removeprefix("FLYWHEEL_").rstrip("_").lower()


class PresetSource(PydanticBaseSettingsSource):
    """The settings source that reads the chosen preset's section for this service (below variables and flags)."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # __call__ reads the whole section at once

    def __call__(self) -> dict[str, Any]:
        state = self.current_state
        named = str(state.get("preset") or os.environ.get(GLOBAL_VARIABLE, "")).strip()
        env_default = self.settings_cls.model_fields.get("env_id")
        env_id = state.get("env_id") or (env_default.default if env_default is not None else None)
        preset = resolve(named, str(env_id) if env_id else None)
        if preset is None:
            return {}
        service, fields = service_of(self.settings_cls), self.settings_cls.model_fields
        own = preset.sections.get(service, {})
        unknown = sorted(k for k in own if k not in fields)
        if unknown:
            raise PresetError(f"preset {preset.name}: {service} has no setting {unknown[0]!r}")
        return {k: v for k, v in preset.section(service).items() if k in fields}


def describe_preset(settings: BaseSettings) -> str | None:
    """The start line's words for the preset a service's settings came from; None when none was used."""
    named = str(getattr(settings, "preset", "") or os.environ.get(GLOBAL_VARIABLE, "")).strip()
    preset = resolve(named, getattr(settings, "env_id", None) or None)
    if preset is None:
        return None
    return f"preset {preset.name} (sha256 {preset.sha256[:12]}), below flags and FLYWHEEL_* variables"


def add_presets_flags(parser: Any) -> None:
    """``flywheel presets list`` and ``flywheel presets show NAME|FILE``."""
    sub = parser.add_subparsers(dest="presets_command", required=True, metavar="ACTION")
    sub.add_parser("list", help="the shipped presets, which env ids choose them, and their descriptions")
    show = sub.add_parser("show", help="print a preset's YAML (a name or a file), checked, with its sha256")
    show.add_argument("name", metavar="NAME|FILE")


def run_presets(args: Any) -> int:
    """Print the list, or one preset's file; a PresetError (one line) for an unknown name or a bad file."""
    if args.presets_command == "list":
        for name in names():
            print(f"{name:8s} {load(name).description}")
        print("chosen from the env id: atari for ale-py ids, mario for single-stage Super Mario Bros ids, grid for "
              "Snake and MettaGrid, pixel for other image envs, vector otherwise; --preset NAME|FILE or "
              "FLYWHEEL_PRESET names another, none turns it off")
        return 0
    preset = load(args.name)
    print(f"# preset {preset.name} ({preset.path}), sha256 {preset.sha256}")
    print(preset.path.read_text(), end="")
    if yaml.safe_load(preset.path.read_bytes()).get("extends"):  # what the services read, the base's values too
        print("# resolved (the base's values, this file's over them):")
        print(yaml.safe_dump(preset.sections, sort_keys=False), end="")
    return 0
