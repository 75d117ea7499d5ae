"""Typed control commands: the command kinds and one frozen argument class per kind, checked when built."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, fields
from enum import StrEnum
from typing import Any, ClassVar, Generic, Protocol, Self, TypeVar

from .errors import CommandError, UnknownCommand
from .messages import Control

TAG_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}$"


class CommandKind(StrEnum):
    """The commands services obey; the value is the name on the wire (``Control.command``)."""

    PAUSE = "pause"
    RESUME = "resume"
    SET_EXPLORATION = "set_exploration"
    SET_LR = "set_lr"
    SET_REPLAY_RATIO = "set_replay_ratio"
    SET_PUBLISH_INTERVAL = "set_publish_interval"
    CHECKPOINT = "checkpoint"


def _number(name: str, value: Any, low: float, high: float, low_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CommandError(f"{name} must be a number, got {value!r:.60}")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise CommandError(f"{name} must be a finite number, got {value!r:.60}")
    if number > high or number < low or (low_open and number == low):
        raise CommandError(f"{name} must be in {'(' if low_open else '['}{low:g}, {high:g}], got {value!r:.60}")
    return number


def _plain(bound: float) -> int | float:
    """A bound as the JSON schema writes it: 1, not 1.0."""
    return int(bound) if float(bound).is_integer() else bound


class Check(Protocol):
    """Checks and normalises one argument's value (given its name, for the message), and says what it accepts."""

    def __call__(self, name: str, value: Any) -> Any:
        """The value, normalised; raises CommandError."""

    def json_schema(self) -> dict[str, Any]:
        """The JSON schema of exactly the values this check accepts."""


@dataclass(frozen=True)
class NumberIn:
    """A finite number in [low, high] ((low, high] with ``low_open``), as a float; a whole one, as an int."""

    low: float
    high: float
    low_open: bool = False
    whole: bool = False

    def __call__(self, name: str, value: Any) -> float | int:
        number = _number(name, value, self.low, self.high, self.low_open)
        if not self.whole:
            return number
        if not number.is_integer():
            raise CommandError(f"{name} must be a whole number, got {value!r:.60}")
        return int(number)

    def json_schema(self) -> dict[str, Any]:
        return {"type": "integer" if self.whole else "number",
                "exclusiveMinimum" if self.low_open else "minimum": _plain(self.low), "maximum": _plain(self.high)}


@dataclass(frozen=True)
class Matches:
    """A string that matches ``pattern``; ``rule`` says which in the error message."""

    pattern: str
    rule: str

    def __call__(self, name: str, value: Any) -> str:
        if not isinstance(value, str) or not re.match(self.pattern, value):
            raise CommandError(f"{name} must be {self.rule}")
        return value

    def json_schema(self) -> dict[str, Any]:
        return {"type": "string", "pattern": self.pattern}


_TAG = Matches(TAG_PATTERN, "1-64 characters of letters, digits, '-', '_' or '.', not starting with '.' or '-'")
_LR = NumberIn(0.0, 1.0, low_open=True)
_UPDATES = NumberIn(1, 1_000_000_000, whole=True)
_SECONDS = NumberIn(0.0, 86_400.0, low_open=True)


@dataclass(frozen=True)
class CommandArgs:
    """Base class: the arguments of one kind. Building one checks and normalises them (raises CommandError),
    so every instance is valid; ``from_wire`` builds one from a Control args map and ``to_wire`` gives it back."""

    KIND: ClassVar[CommandKind]
    HINT: ClassVar[str] = "it takes no arguments"
    CHECKS: ClassVar[Mapping[str, Check]] = {}  # per argument; an optional one (default None) only when given
    NEED_ONE: ClassVar[str] = ""  # when set, at least one argument must be given, and this message says which
    # when set, the arguments given must all come from one of these groups, and MIXED says why not
    GROUPS: ClassVar[tuple[tuple[str, ...], ...]] = ()
    MIXED: ClassVar[str] = ""

    def __post_init__(self) -> None:
        given = {f.name for f in fields(self) if getattr(self, f.name) is not None}
        if sum(1 for group in self.GROUPS if given.intersection(group)) > 1:
            raise CommandError(self.MIXED)
        if self.NEED_ONE and not given:
            raise CommandError(self.NEED_ONE)
        for f in fields(self):
            value, check = getattr(self, f.name), self.CHECKS.get(f.name)
            if check is not None and (value is not None or f.default is not None):
                object.__setattr__(self, f.name, check(f.name, value))

    @classmethod
    def json_schema(cls) -> dict[str, Any]:
        """The JSON schema of the args map: exactly what ``from_wire`` accepts from JSON (which has no NaN)."""
        groups = cls.GROUPS or (tuple(f.name for f in fields(cls)),)
        alternatives = [cls._object_schema(group) for group in groups]
        return alternatives[0] if len(alternatives) == 1 else {"oneOf": alternatives}

    @classmethod
    def _object_schema(cls, names: tuple[str, ...]) -> dict[str, Any]:
        schema: dict[str, Any] = {"type": "object", "properties": {name: cls.CHECKS[name].json_schema()
                                                                   for name in names},
                                  "additionalProperties": False}
        required = [f.name for f in fields(cls)
                    if f.name in names and f.default is MISSING and f.default_factory is MISSING]
        if required:
            schema["required"] = required
        if not names:
            schema["maxProperties"] = 0
        elif cls.NEED_ONE and not required:
            schema["minProperties"] = 1
        return schema

    @classmethod
    def from_wire(cls, raw: Mapping[str, Any]) -> Self:
        names = [f.name for f in fields(cls)]
        extra = sorted(set(raw) - set(names))
        if extra:
            raise CommandError(f"unknown arguments {[e[:40] for e in extra[:8]]}; {cls.HINT}")
        missing = [f.name for f in fields(cls)
                   if f.default is MISSING and f.default_factory is MISSING and f.name not in raw]
        if missing:
            raise CommandError(f"{', '.join(missing)} required; {cls.HINT}")
        nulls = [name for name in names if name in raw and raw[name] is None]
        if nulls:
            raise CommandError(f"{', '.join(nulls)} must have a value, not null")
        return cls(**{name: raw[name] for name in names if name in raw})

    def to_wire(self) -> dict[str, Any]:
        """The Control args map: the given arguments only (None means not given)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}


@dataclass(frozen=True)
class PauseArgs(CommandArgs):
    """pause: stop stepping environments, inserting and sampling, and training; sockets stay up."""

    KIND: ClassVar[CommandKind] = CommandKind.PAUSE


@dataclass(frozen=True)
class ResumeArgs(CommandArgs):
    """resume: undo pause."""

    KIND: ClassVar[CommandKind] = CommandKind.RESUME


@dataclass(frozen=True)
class ExplorationArgs(CommandArgs):
    """set_exploration: a fixed ``epsilon`` for the targets, or the Ape-X schedule's ``base`` and/or ``alpha``."""

    KIND: ClassVar[CommandKind] = CommandKind.SET_EXPLORATION
    HINT: ClassVar[str] = "use epsilon, or base and alpha"
    NEED_ONE: ClassVar[str] = "give epsilon (a fixed value for the targets) or base and/or alpha (the Ape-X schedule)"
    CHECKS: ClassVar[Mapping[str, Check]] = {
        "epsilon": NumberIn(0.0, 1.0), "base": NumberIn(0.0, 1.0, low_open=True), "alpha": NumberIn(0.0, 100.0),
    }
    GROUPS: ClassVar[tuple[tuple[str, ...], ...]] = (("epsilon",), ("base", "alpha"))
    MIXED: ClassVar[str] = "epsilon fixes exploration and cannot be combined with base or alpha"
    epsilon: float | None = None
    base: float | None = None
    alpha: float | None = None


@dataclass(frozen=True)
class LrArgs(CommandArgs):
    """set_lr: the learner's new learning rate, in (0, 1]."""

    KIND: ClassVar[CommandKind] = CommandKind.SET_LR
    HINT: ClassVar[str] = "it takes exactly one argument, lr"
    CHECKS: ClassVar[Mapping[str, Check]] = {"lr": _LR}
    lr: float


@dataclass(frozen=True)
class ReplayRatioArgs(CommandArgs):
    """set_replay_ratio: the rate limiter's sampled transitions per inserted one (> 0), and its error buffer."""

    KIND: ClassVar[CommandKind] = CommandKind.SET_REPLAY_RATIO
    HINT: ClassVar[str] = "use samples_per_insert (sampled transitions per inserted one, > 0) and optionally " \
                          "error_buffer"
    CHECKS: ClassVar[Mapping[str, Check]] = {
        "samples_per_insert": NumberIn(0.0, 1e6, low_open=True), "error_buffer": NumberIn(0.0, 1e12),
    }
    samples_per_insert: float
    error_buffer: float | None = None


@dataclass(frozen=True)
class PublishIntervalArgs(CommandArgs):
    """set_publish_interval: publish weights every ``updates`` updates and/or at least every ``seconds``."""

    KIND: ClassVar[CommandKind] = CommandKind.SET_PUBLISH_INTERVAL
    HINT: ClassVar[str] = "use updates and/or seconds"
    NEED_ONE: ClassVar[str] = "give updates (publish every N updates) and/or seconds (at least every S seconds)"
    CHECKS: ClassVar[Mapping[str, Check]] = {"updates": _UPDATES, "seconds": _SECONDS}
    updates: int | None = None
    seconds: float | None = None


@dataclass(frozen=True)
class CheckpointArgs(CommandArgs):
    """checkpoint: write one now, with an optional ``tag`` (a file-name-safe word)."""

    KIND: ClassVar[CommandKind] = CommandKind.CHECKPOINT
    HINT: ClassVar[str] = "only tag is allowed"
    CHECKS: ClassVar[Mapping[str, Check]] = {"tag": _TAG}
    tag: str | None = None


COMMAND_ARGS: dict[CommandKind, type[CommandArgs]] = {
    cls.KIND: cls
    for cls in (PauseArgs, ResumeArgs, ExplorationArgs, LrArgs, ReplayRatioArgs, PublishIntervalArgs,
                CheckpointArgs)
}


def command_kind(name: str) -> CommandKind:
    """The kind named ``name``; raises UnknownCommand."""
    try:
        return CommandKind(name)
    except ValueError:
        known = ", ".join(sorted(k.value for k in CommandKind))
        raise UnknownCommand(f"unknown command {name[:40]!r}; known: {known}") from None


def parse_args(command: str | CommandKind, raw: Mapping[str, Any]) -> CommandArgs:
    """The checked arguments of ``command`` from a map of raw values; raises CommandError or UnknownCommand."""
    return COMMAND_ARGS[command_kind(command)].from_wire(raw)


A = TypeVar("A", bound=CommandArgs)


@dataclass(frozen=True)
class Command(Generic[A]):
    """A decoded control command: its checked arguments (whose class names the kind), sequence number and target."""

    args: A
    seq: int = 0
    target: str = "*"

    @property
    def kind(self) -> CommandKind:
        return self.args.KIND

    def to_message(self) -> Control:
        return Control(self.seq, self.kind.value, self.target, self.args.to_wire())

    @staticmethod
    def from_message(msg: Control) -> Command[CommandArgs]:
        """Check a decoded Control message's command and arguments, once; raises CommandError naming the command."""
        try:
            args = parse_args(msg.command, msg.args)
        except UnknownCommand:
            raise
        except CommandError as exc:
            raise CommandError(f"{msg.command}: {exc}") from None
        return Command(args, msg.seq, msg.target)


CommandHandlers = Mapping[CommandKind, Callable[[Command[Any]], None]]
"""What a service obeys: a handler per kind it knows; commands of other kinds are not its business."""


def dispatch(command: Command[Any], handlers: CommandHandlers) -> bool:
    """Run the handler of ``command``'s kind; False when the service has none (another service's command)."""
    handler = handlers.get(command.kind)
    if handler is None:
        return False
    handler(command)
    return True
