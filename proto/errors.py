"""Typed decode errors: every way a wire message can be refused."""

from __future__ import annotations


class DecodeError(ValueError):
    """A message was refused; ``fault`` names the kind of fault for metrics labels (the class's, unless one is
    given when raised)."""

    fault = "malformed"

    def __init__(self, *args: object, fault: str | None = None) -> None:
        super().__init__(*args)
        if fault is not None:
            self.fault = fault


class MalformedMessage(DecodeError):
    """The header is not valid msgpack, or fields are missing, extra or of the wrong type."""

    fault = "malformed"


class TruncatedMessage(DecodeError):
    """Fewer frames or fewer bytes than the header announces."""

    fault = "truncated"


class OversizedMessage(DecodeError):
    """A header, frame or whole message exceeds the configured limits."""

    fault = "oversized"


class UnknownKind(DecodeError):
    """The header names a message kind this codec does not know."""

    fault = "unknown_kind"


class WrongKind(DecodeError):
    """A known kind arrived on a socket that expects another kind."""

    fault = "wrong_kind"


class VersionMismatch(DecodeError):
    """The header carries a schema version this codec does not speak."""

    fault = "version"


class BadDtype(DecodeError):
    """An array has a dtype the schema does not allow."""

    fault = "dtype"


class BadShape(DecodeError):
    """An array has a rank or dimensions the schema or limits do not allow."""

    fault = "shape"


class CommandError(DecodeError):
    """A control command's arguments are missing, unknown, of the wrong type or out of range (proto/commands.py)."""

    fault = "bad_args"


class UnknownCommand(CommandError):
    """A control command names no CommandKind."""

    fault = "unknown_command"


FAULTS: tuple[str, ...] = (
    "malformed", "truncated", "oversized", "unknown_kind", "wrong_kind", "version", "dtype", "shape", "bad_args",
    "unknown_command",
)
