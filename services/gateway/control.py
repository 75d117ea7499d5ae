"""Control commands: their schemas, and the book of commands the gateway re-publishes for late joiners."""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from flywheel import proto

_TARGET_MAX = 128


class CommandError(ValueError):
    """A control request that cannot be sent; the message says why."""


class UnknownCommand(CommandError):
    """The command name is not one of COMMANDS."""


def _no_args(args: dict[str, Any]) -> dict[str, Any]:
    if args:
        raise CommandError(f"takes no arguments, got {sorted(args)}")
    return {}


def _number(args: dict[str, Any], name: str, low: float, high: float, low_open: bool = False) -> float:
    value = args[name]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise CommandError(f"{name} must be a finite number, got {value!r}")
    if value > high or value < low or (low_open and value == low):
        bracket = "(" if low_open else "["
        raise CommandError(f"{name} must be in {bracket}{low}, {high}], got {value!r}")
    return float(value)


def _exploration(args: dict[str, Any]) -> dict[str, Any]:
    extra = set(args) - {"epsilon", "base", "alpha"}
    if extra:
        raise CommandError(f"unknown arguments {sorted(extra)}; use epsilon, or base and alpha")
    if not args:
        raise CommandError("give epsilon (a fixed value for the targets) or base and/or alpha (the Ape-X schedule)")
    if "epsilon" in args and len(args) > 1:
        raise CommandError("epsilon fixes exploration and cannot be combined with base or alpha")
    out: dict[str, Any] = {}
    if "epsilon" in args:
        out["epsilon"] = _number(args, "epsilon", 0.0, 1.0)
    if "base" in args:
        out["base"] = _number(args, "base", 0.0, 1.0, low_open=True)
    if "alpha" in args:
        out["alpha"] = _number(args, "alpha", 0.0, 100.0)
    return out


def _lr(args: dict[str, Any]) -> dict[str, Any]:
    if set(args) != {"lr"}:
        raise CommandError(f"takes exactly one argument, lr; got {sorted(args)}")
    return {"lr": _number(args, "lr", 0.0, 1.0, low_open=True)}


def _checkpoint(args: dict[str, Any]) -> dict[str, Any]:
    extra = set(args) - {"tag"}
    if extra:
        raise CommandError(f"unknown arguments {sorted(extra)}; only tag is allowed")
    if "tag" in args:
        tag = args["tag"]
        if not isinstance(tag, str) or not tag or len(tag) > 64 or not all(c.isalnum() or c in "-_." for c in tag):
            raise CommandError("tag must be 1-64 characters of letters, digits, '-', '_' or '.'")
        return {"tag": tag}
    return {}


@dataclass(frozen=True)
class CommandSpec:
    """One command: which state it sets (None for one-shot commands), its usual target and its argument check."""

    group: str | None
    default_target: str
    check: Callable[[dict[str, Any]], dict[str, Any]]
    help: str


COMMANDS: dict[str, CommandSpec] = {
    "pause": CommandSpec("run_state", "*", _no_args, "stop stepping environments and training; sockets stay up"),
    "resume": CommandSpec("run_state", "*", _no_args, "undo pause"),
    "set_exploration": CommandSpec(
        "exploration", "actor", _exploration, "actors: fixed epsilon, or Ape-X base/alpha for eps_i"),
    "set_lr": CommandSpec("lr", "learner", _lr, "learner: new learning rate"),
    "checkpoint": CommandSpec(None, "*", _checkpoint, "replay and learner: write a checkpoint now"),
}


def check_target(target: str) -> str:
    if not target or len(target) > _TARGET_MAX or any(ord(c) < 32 for c in target):
        raise CommandError(f"target must be '*', a service name or an instance name (1-{_TARGET_MAX} characters)")
    return target


@dataclass
class Issued:
    """A command as sent, with when it was sent (monotonic) for one-shot repetition."""

    msg: proto.Control
    at: float
    wall_time: float

    def as_dict(self) -> dict[str, Any]:
        return {"seq": self.msg.seq, "command": self.msg.command, "target": self.msg.target,
                "args": dict(self.msg.args), "time": self.wall_time}


class ControlBook:
    """Builds commands with increasing sequence numbers and keeps the ones to re-publish.

    State commands (pause/resume, exploration, learning rate) are retained until another command of the same
    group and target, or of the same group for every target ("*"), replaces them; they are re-published so a
    service that starts later still learns them. One-shot commands (checkpoint) are repeated for a short window
    only, to ride over the PUB/SUB join race; subscribers drop repeats by sequence number.
    """

    def __init__(self, one_shot_repeat_s: float = 5.0, clock=time.monotonic, history: int = 100) -> None:
        # Start from the wall clock in microseconds so a restarted gateway's numbers stay above the old ones,
        # which subscribers would otherwise skip as duplicates.
        self.seq = time.time_ns() // 1000
        self.one_shot_repeat_s = one_shot_repeat_s
        self.clock = clock
        self.retained: dict[tuple[str, str], Issued] = {}
        self.one_shots: deque[Issued] = deque()
        self.history: deque[Issued] = deque(maxlen=history)
        self.issued: dict[str, int] = {}

    def issue(self, command: str, target: str | None = None, args: dict[str, Any] | None = None) -> proto.Control:
        spec = COMMANDS.get(command)
        if spec is None:
            raise UnknownCommand(f"unknown command {command[:40]!r}; known: {', '.join(sorted(COMMANDS))}")
        target = check_target(spec.default_target if target is None else target)
        checked = spec.check(dict(args or {}))
        self.seq += 1
        msg = proto.Control(self.seq, command, target, checked)
        proto.encode(msg)  # fails here, not in the publisher, if anything is not wire-safe
        issued = Issued(msg, self.clock(), time.time())
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
        now = self.clock() if now is None else now
        while self.one_shots and now - self.one_shots[0].at > self.one_shot_repeat_s:
            self.one_shots.popleft()
        items = list(self.retained.values()) + list(self.one_shots)
        return [i.msg for i in sorted(items, key=lambda i: i.msg.seq)]

    def state(self) -> dict[str, Any]:
        return {
            "retained": [i.as_dict() for i in sorted(self.retained.values(), key=lambda i: i.msg.seq)],
            "recent": [i.as_dict() for i in self.history],
            "commands": {name: spec.help for name, spec in COMMANDS.items()},
        }
