"""Typed keyword options for env configs: unknown names and wrong types are refused with one clear line."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, ClassVar, Self, TypeVar

C = TypeVar("C")

_SIMPLE = {"bool": (bool,), "int": (int,), "float": (int, float), "str": (str,)}


def _accepts(annotation: str, value: Any) -> bool:
    for part in (p.strip() for p in annotation.split("|")):
        if part == "None" and value is None:
            return True
        kinds = _SIMPLE.get(part)
        if kinds is not None and isinstance(value, kinds) and (part == "bool" or not isinstance(value, bool)):
            return True
        if part.startswith(("tuple", "list")) and isinstance(value, (list, tuple)):
            return True
    return False


def config_from_options(cls: type[C], family: str, **options: Any) -> C:
    """Build the frozen dataclass ``cls`` from ``options``, checking names and value types first."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls.__name__} must be a dataclass to take {family} options")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(options) - set(fields))
    if unknown:
        raise TypeError(f"unknown {family} option(s) {unknown}; valid: {sorted(fields)}")
    hints = typing.get_type_hints(cls)
    for name, value in options.items():
        annotation = str(fields[name].type) if isinstance(fields[name].type, str) else str(hints[name])
        if not _accepts(annotation, value):
            raise TypeError(f"{family} option {name} must be {annotation}, got {value!r}")
    return cls(**options)


class EnvOptions:
    """Base of the env configs (frozen dataclasses): ``from_options`` builds one from an env's keyword options."""

    FAMILY: ClassVar[str]  # the env family as error messages name it ("unknown Atari option(s) ...")

    @classmethod
    def from_options(cls, **options: Any) -> Self:
        """Build from keyword options, rejecting unknown names and values of the wrong type."""
        return config_from_options(cls, cls.FAMILY, **options)
