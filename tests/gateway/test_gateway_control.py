"""Gateway core: control commands (checks agree with their JSON schemas), the control book, leases."""

from __future__ import annotations

import re
from typing import Any

import pytest
from gateway_helpers import FakeClock

from flywheel import proto
from flywheel.services.actor.exploration import apex_epsilon
from flywheel.services.gateway.control import (
    COMMANDS,
    TARGET_PATTERN,
    CommandError,
    ControlBook,
    TooManyRetained,
    UnknownCommand,
    check_target,
)
from flywheel.services.gateway.lease import LeaseFull, LeaseTable, PeerLeasesFull


def test_control_book_retains_state_commands_and_supersedes() -> None:
    clock = FakeClock()
    book = ControlBook(one_shot_repeat_s=5, clock=clock)
    a = book.issue("pause", "actor")
    b = book.issue("set_lr", None, {"lr": 1e-4})
    assert b.seq > a.seq and b.target == "learner"
    c = book.issue("checkpoint")
    assert [m.seq for m in book.to_repeat()] == [a.seq, b.seq, c.seq]
    d = book.issue("resume")  # '*' replaces every run_state command
    assert [m.command for m in book.to_repeat()] == ["set_lr", "checkpoint", "resume"]
    clock.t += 6  # the one-shot window has passed
    assert [m.seq for m in book.to_repeat()] == [b.seq, d.seq]
    e = book.issue("set_lr", "learner", {"lr": 3e-4})
    assert [m.seq for m in book.to_repeat()] == [d.seq, e.seq]


def test_new_commands_default_targets_and_retention() -> None:
    book = ControlBook()
    ratio = book.issue("set_replay_ratio", None, {"samples_per_insert": 4})
    assert (ratio.target, ratio.args) == ("replay", {"samples_per_insert": 4.0})
    both = book.issue("set_replay_ratio", None, {"samples_per_insert": 8, "error_buffer": 2000})
    assert both.args == {"samples_per_insert": 8.0, "error_buffer": 2000.0}
    pub = book.issue("set_publish_interval", None, {"updates": 50.0})
    assert (pub.target, pub.args) == ("learner", {"updates": 50}) and isinstance(pub.args["updates"], int)
    pub2 = book.issue("set_publish_interval", None, {"seconds": 2.5})
    assert [m.seq for m in book.to_repeat()] == [both.seq, pub2.seq]  # each group keeps its latest


def test_control_book_seq_survives_a_gateway_restart() -> None:
    first = ControlBook().issue("pause")
    second = ControlBook().issue("pause")
    assert second.seq > first.seq


def test_issued_commands_record_who_sent_them() -> None:
    book = ControlBook()
    book.issue("pause", None, {}, {"client": "127.0.0.1", "operator": "alice", "token": "sha256:abc"})
    assert book.state()["recent"][0]["by"] == {"client": "127.0.0.1", "operator": "alice", "token": "sha256:abc"}


BAD: list[tuple[str, dict[str, Any]]] = [
    ("pause", {"x": 1}),
    ("set_lr", {}),
    ("set_lr", {"lr": 0}),
    ("set_lr", {"lr": float("inf")}),
    ("set_lr", {"lr": "0.1"}),
    ("set_lr", {"lr": True}),
    ("set_lr", {"lr": 10**400}),
    ("set_exploration", {}),
    ("set_exploration", {"epsilon": 1.5}),
    ("set_exploration", {"epsilon": 0.1, "base": 0.4}),
    ("set_exploration", {"gamma": 1}),
    ("set_exploration", {"base": 0}),
    ("set_replay_ratio", {}),
    ("set_replay_ratio", {"samples_per_insert": 0}),
    ("set_replay_ratio", {"samples_per_insert": -1}),
    ("set_replay_ratio", {"error_buffer": 10}),
    ("set_replay_ratio", {"samples_per_insert": 4, "error_buffer": -1}),
    ("set_replay_ratio", {"samples_per_insert": 4, "min_size": 1}),
    ("set_publish_interval", {}),
    ("set_publish_interval", {"updates": 0}),
    ("set_publish_interval", {"updates": 1.5}),
    ("set_publish_interval", {"seconds": 0}),
    ("set_publish_interval", {"seconds": float("nan")}),
    ("set_publish_interval", {"every": 3}),
    ("checkpoint", {"tag": "../etc"}),
    ("checkpoint", {"tag": ".hidden"}),
    ("checkpoint", {"tag": "é"}),
    ("checkpoint", {"tag": 5}),
    ("launch", {}),
]


@pytest.mark.parametrize(("command", "args"), BAD)
def test_control_book_refuses_bad_commands(command: str, args: dict[str, Any]) -> None:
    book = ControlBook()
    with pytest.raises(CommandError) as info:
        book.issue(command, None, args)
    assert str(info.value)  # a reason, always
    assert isinstance(info.value, UnknownCommand) == (command == "launch")
    assert not book.retained and not book.history


@pytest.mark.parametrize("target", ["", "a\nb", "x" * 129, "tab\there", "del\x7f"])
def test_bad_targets(target: str) -> None:
    with pytest.raises(CommandError):
        check_target(target)
    assert re.match(TARGET_PATTERN, target) is None  # the OpenAPI pattern refuses it too


def _schema_accepts(schema: dict[str, Any], value: dict[str, Any]) -> bool:
    """A small JSON-schema evaluator for the subset the command schemas use."""
    if "oneOf" in schema:
        return sum(_schema_accepts(s, value) for s in schema["oneOf"]) == 1
    if not isinstance(value, dict):
        return False
    props = schema.get("properties", {})
    if schema.get("additionalProperties") is False and set(value) - set(props):
        return False
    if len(value) < schema.get("minProperties", 0) or len(value) > schema.get("maxProperties", 10**9):
        return False
    if set(schema.get("required", ())) - set(value):
        return False
    for key, item in value.items():
        rule = props[key]
        if rule["type"] == "string":
            if not isinstance(item, str) or not re.match(rule["pattern"], item):
                return False
            continue
        if isinstance(item, bool) or not isinstance(item, (int, float)) or item != item:
            return False
        if rule["type"] == "integer" and not float(item).is_integer():
            return False
        if item < rule.get("minimum", -float("inf")) or item > rule.get("maximum", float("inf")):
            return False
        if "exclusiveMinimum" in rule and item <= rule["exclusiveMinimum"]:
            return False
    return True


def _accepts(command: str, args: dict[str, Any]) -> bool:
    try:
        COMMANDS[command].check(dict(args))
    except CommandError:
        return False
    return True


@pytest.mark.parametrize(("command", "args"), [case for case in BAD if case[0] in COMMANDS] + [
    (name, example) for name, spec in COMMANDS.items() for example in spec.examples.values()
] + [("pause", {}), ("set_publish_interval", {"updates": 1, "seconds": 86400}), ("set_exploration", {"alpha": 0})])
def test_schema_and_check_agree(command: str, args: dict[str, Any]) -> None:
    """The OpenAPI schema of each command says exactly what its check accepts (schemathesis relies on it)."""
    assert _schema_accepts(COMMANDS[command].schema, args) == _accepts(command, args), (command, args)


@pytest.mark.parametrize(("command", "args"), BAD)
def test_the_gateway_refuses_what_every_service_refuses(command: str, args: dict[str, Any]) -> None:
    """One rule: the HTTP check is the proto argument class every service decodes with."""
    with pytest.raises(proto.CommandError):
        proto.Command.from_message(proto.Control(seq=1, command=command, args=args))
    if command in COMMANDS:
        assert COMMANDS[command].kind == command


def test_what_the_gateway_sends_decodes_to_the_same_typed_command() -> None:
    book = ControlBook()
    for name, spec in COMMANDS.items():
        for example in spec.examples.values() or [{}]:
            msg = book.issue(name, None, example)
            command = proto.Command.from_message(proto.decode(proto.encode(msg), proto.Control))
            assert command.args == spec.parse(example) == proto.parse_args(name, example)
            assert (command.seq, command.target, command.to_message()) == (msg.seq, msg.target, msg)


def test_every_example_is_accepted_and_encodes() -> None:
    book = ControlBook()
    for name, spec in COMMANDS.items():
        for example in spec.examples.values() or [{}]:
            msg = book.issue(name, None, example)
            assert proto.decode(proto.encode(msg)) == msg
    assert {"set_replay_ratio", "set_publish_interval"} <= set(COMMANDS)
    for name in ("set_exploration", "set_lr", "set_replay_ratio", "set_publish_interval", "checkpoint"):
        assert COMMANDS[name].examples, f"{name} has no documented example"


# -- leases ----------------------------------------------------------------------------------------------------------


def test_apex_epsilon() -> None:
    assert apex_epsilon(0, 1) == 0.4
    assert apex_epsilon(0, 8) == pytest.approx(0.4)
    assert apex_epsilon(7, 8) == pytest.approx(0.4 ** 8)
    assert apex_epsilon(0, 2, base=0.5, alpha=1) == 0.5


def test_lease_table_stays_dense_as_actors_come_and_go() -> None:
    clock = FakeClock()
    table = LeaseTable(ttl_s=10, clock=clock)
    replies = [table.handle(proto.LeaseRequest(f"a{i}")) for i in range(4)]
    assert [(r.index, r.count) for r in replies] == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert table.handle(proto.LeaseRequest("a1")).index == 1  # renewal keeps the slot
    table.handle(proto.LeaseRequest("a1", release=True))
    assert table.index_of("a3") == 1 and len(table) == 3  # the last slot fills the hole
    assert table.handle(proto.LeaseRequest("a3")) == proto.LeaseReply("a3", 1, 3, 10.0)
    clock.t += 5
    table.handle(proto.LeaseRequest("a0"))
    table.handle(proto.LeaseRequest("a3"))
    clock.t += 6  # a2 went silent
    reply = table.handle(proto.LeaseRequest("a5"))
    assert (reply.index, reply.count) == (2, 3) and table.expired == 1
    assert sorted(table.slots) == ["a0", "a3", "a5"]
    assert {table.index_of(n) for n in table.slots} == {0, 1, 2}


def test_lease_table_release_of_unknown_and_capacity() -> None:
    table = LeaseTable(max_leases=1)
    assert table.handle(proto.LeaseRequest("nobody", release=True)).count == 0
    table.handle(proto.LeaseRequest("a"))
    with pytest.raises(LeaseFull):
        table.handle(proto.LeaseRequest("b"))


def test_one_connection_holds_at_most_its_share_of_leases_and_a_reconnect_moves_them() -> None:
    table = LeaseTable(max_per_peer=2)
    table.handle(proto.LeaseRequest("a"), peer=b"p1")
    table.handle(proto.LeaseRequest("b"), peer=b"p1")
    assert table.handle(proto.LeaseRequest("a"), peer=b"p1").index == 0  # renewals are never refused
    with pytest.raises(PeerLeasesFull):
        table.handle(proto.LeaseRequest("c"), peer=b"p1")
    assert table.handle(proto.LeaseRequest("c"), peer=b"p2").index == 2  # another connection gets its slot
    table.handle(proto.LeaseRequest("a"), peer=b"p3")  # "a" reconnected: its lease now counts for p3
    table.handle(proto.LeaseRequest("d"), peer=b"p1")  # so p1 has room for one more
    table.handle(proto.LeaseRequest("b", release=True), peer=b"p1")
    assert table.by_peer == {b"p1": 1, b"p2": 1, b"p3": 1} and len(table) == 3


def test_control_book_bounds_what_it_retains() -> None:
    clock = FakeClock()
    book = ControlBook(one_shot_repeat_s=5, clock=clock, max_retained=3)
    for i in range(3):
        book.issue("set_lr", f"learner-{i}", {"lr": 0.1})
    book.issue("set_lr", "learner-0", {"lr": 0.2})  # replacing a retained one is fine
    with pytest.raises(TooManyRetained):
        book.issue("set_lr", "learner-9", {"lr": 0.1})
    book.issue("set_lr", "*", {"lr": 0.3})  # '*' replaces the group's targets
    assert len(book.retained) == 1
    for _ in range(3):
        book.issue("checkpoint")
    with pytest.raises(TooManyRetained):
        book.issue("checkpoint")
    clock.t += 6
    book.issue("checkpoint")  # the window passed
