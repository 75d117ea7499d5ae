"""Control commands over HTTP: targets, JSON schemas and examples, and the book re-published for late joiners."""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from flywheel import proto
from flywheel.proto import CommandError, CommandKind, UnknownCommand

TARGET_MAX = 128
TARGET_PATTERN = r"^[^\x00-\x1f\x7f]{1,128}$"
_TARGET_RE = re.compile(TARGET_PATTERN)

__all__ = ["COMMANDS", "TARGET_PATTERN", "CommandError", "CommandSpec", "ControlBook", "Issued", "TooManyRetained",
           "UnknownCommand", "check_target"]


class TooManyRetained(CommandError):
    """Retaining the command would exceed the book's bound on distinct (group, target) pairs."""


@dataclass(frozen=True)
class CommandSpec:
    """One command as the HTTP API offers it: which state it sets (None for one-shot commands), its usual target.

    The arguments are checked by the command's proto argument class, the rule every service decodes with, and
    ``schema``, their JSON schema in the OpenAPI document, is derived from the same class; ``examples`` are
    request bodies for the documentation.
    """

    kind: CommandKind
    group: str | None
    default_target: str
    help: str
    examples: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def schema(self) -> dict[str, Any]:
        """The JSON schema of the request body: exactly what ``check`` accepts."""
        return proto.COMMAND_ARGS[self.kind].json_schema()

    def parse(self, args: dict[str, Any]) -> proto.CommandArgs:
        """The typed arguments; raises CommandError."""
        return proto.parse_args(self.kind, args)

    def check(self, args: dict[str, Any]) -> dict[str, Any]:
        """The arguments as they go on the wire (checked, numbers normalised); raises CommandError."""
        return self.parse(args).to_wire()


COMMANDS: dict[str, CommandSpec] = {
    "pause": CommandSpec(CommandKind.PAUSE, "run_state", "*",
                         "stop stepping environments and training; sockets stay up"),
    "resume": CommandSpec(CommandKind.RESUME, "run_state", "*", "undo pause"),
    "set_exploration": CommandSpec(
        CommandKind.SET_EXPLORATION, "exploration", "actor", "actors: fixed epsilon, or Ape-X base/alpha for eps_i",
        {"fixed": {"epsilon": 0.01}, "apex": {"base": 0.4, "alpha": 7}}),
    "set_lr": CommandSpec(
        CommandKind.SET_LR, "lr", "learner", "learner: new learning rate",
        {"lower": {"lr": 1e-4}}),
    "set_replay_ratio": CommandSpec(
        CommandKind.SET_REPLAY_RATIO, "replay_ratio", "replay",
        "replay: rate limiter's samples per insert (and optionally its error buffer)",
        {"ratio": {"samples_per_insert": 4}, "with_buffer": {"samples_per_insert": 8, "error_buffer": 2000}}),
    "set_publish_interval": CommandSpec(
        CommandKind.SET_PUBLISH_INTERVAL, "publish_interval", "learner",
        "learner: publish weights every N updates and/or at least every S seconds",
        {"updates": {"updates": 50}, "both": {"updates": 100, "seconds": 2.5}}),
    "checkpoint": CommandSpec(
        CommandKind.CHECKPOINT, None, "*", "replay and learner: write a checkpoint now",
        {"now": {}, "tagged": {"tag": "before-lr-change"}}),
}


def check_target(target: str) -> str:
    if not _TARGET_RE.match(target):
        raise CommandError(f"target must be '*', a service name or an instance name (1-{TARGET_MAX} printable "
                           "characters)")
    return target


@dataclass
class Issued:
    """A command as sent, with when (monotonic, for one-shot repetition, and wall clock) and who sent it."""

    msg: proto.Control
    at: float
    wall_time: float
    by: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"seq": self.msg.seq, "command": self.msg.command, "target": self.msg.target,
                "args": dict(self.msg.args), "time": self.wall_time, "by": dict(self.by)}


class ControlBook:
    """Builds commands with increasing sequence numbers and keeps the ones to re-publish.

    State commands (pause/resume, exploration, learning rate, replay ratio, publish interval) are retained until
    another command of the same group and target, or of the same group for every target ("*"), replaces them;
    they are re-published so a service that starts later still learns them. One-shot commands (checkpoint) are
    repeated for a short window only, to ride over the PUB/SUB join race; subscribers drop repeats by sequence
    number.
    """

    def __init__(self, one_shot_repeat_s: float = 5.0, clock: Callable[[], float] = time.monotonic,
                 history: int = 100, max_retained: int = 1024) -> None:
        # Start from the wall clock in microseconds so a restarted gateway's numbers stay above the old ones,
        # which subscribers would otherwise skip as duplicates.
        self.seq = time.time_ns() // 1000
        self.one_shot_repeat_s = one_shot_repeat_s
        self.clock = clock
        self.max_retained = max_retained
        self.retained: dict[tuple[str, str], Issued] = {}
        self.one_shots: deque[Issued] = deque()
        self.history: deque[Issued] = deque(maxlen=history)
        self.issued: dict[str, int] = {}

    def issue(self, command: str, target: str | None = None, args: dict[str, Any] | None = None,
              by: dict[str, str] | None = None) -> proto.Control:
        spec = COMMANDS.get(command)
        if spec is None:
            raise UnknownCommand(f"unknown command {command[:40]!r}; known: {', '.join(sorted(COMMANDS))}")
        target = check_target(spec.default_target if target is None else target)
        checked = spec.parse(dict(args or {}))
        if (spec.group is not None and target != "*" and (spec.group, target) not in self.retained
                and len(self.retained) >= self.max_retained):
            raise TooManyRetained(f"{self.max_retained} retained commands already; send this command with "
                                  "target '*' to replace every target's value")
        self._expire_one_shots(self.clock())
        if spec.group is None and len(self.one_shots) >= self.max_retained:
            raise TooManyRetained(f"{self.max_retained} one-shot commands in the last {self.one_shot_repeat_s:g} s; "
                                  "try again shortly")
        self.seq += 1
        msg = proto.Command(checked, self.seq, target).to_message()
        proto.encode(msg)  # fails here, not in the publisher, if anything is not wire-safe
        issued = Issued(msg, self.clock(), time.time(), dict(by or {}))
        if spec.group is None:
            self.one_shots.append(issued)
        else:
            if target == "*":
                for key in [k for k in self.retained if k[0] == spec.group]:
                    del self.retained[key]
            self.retained[(spec.group, target)] = issued
        self.history.append(issued)
        self.issued[command] = self.issued.get(command, 0) + 1
        return msg

    def to_repeat(self, now: float | None = None) -> list[proto.Control]:
        """Retained commands and recent one-shots, in sequence order."""
        self._expire_one_shots(self.clock() if now is None else now)
        items = list(self.retained.values()) + list(self.one_shots)
        return [i.msg for i in sorted(items, key=lambda i: i.msg.seq)]

    def _expire_one_shots(self, now: float) -> None:
        while self.one_shots and now - self.one_shots[0].at > self.one_shot_repeat_s:
            self.one_shots.popleft()

    def state(self) -> dict[str, Any]:
        return {
            "retained": [i.as_dict() for i in sorted(self.retained.values(), key=lambda i: i.msg.seq)],
            "recent": [i.as_dict() for i in self.history],
            "commands": {name: spec.help for name, spec in COMMANDS.items()},
        }
