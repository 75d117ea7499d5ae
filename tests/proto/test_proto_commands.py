"""Typed control commands: every kind's arguments checked once, good and bad, unknown names, dispatch."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flywheel import proto
from flywheel.proto import CommandKind as K

GOOD: list[tuple[str, dict[str, Any], proto.CommandArgs]] = [
    ("pause", {}, proto.PauseArgs()),
    ("resume", {}, proto.ResumeArgs()),
    ("set_exploration", {"epsilon": 0}, proto.ExplorationArgs(epsilon=0.0)),
    ("set_exploration", {"epsilon": 1}, proto.ExplorationArgs(epsilon=1.0)),
    ("set_exploration", {"base": 0.5}, proto.ExplorationArgs(base=0.5)),
    ("set_exploration", {"base": 1, "alpha": 0}, proto.ExplorationArgs(base=1.0, alpha=0.0)),
    ("set_exploration", {"alpha": 100}, proto.ExplorationArgs(alpha=100.0)),
    ("set_lr", {"lr": 1}, proto.LrArgs(1.0)),
    ("set_lr", {"lr": 1e-4}, proto.LrArgs(1e-4)),
    ("set_replay_ratio", {"samples_per_insert": 4}, proto.ReplayRatioArgs(4.0)),
    ("set_replay_ratio", {"samples_per_insert": 8, "error_buffer": 0}, proto.ReplayRatioArgs(8.0, 0.0)),
    ("set_publish_interval", {"updates": 50.0}, proto.PublishIntervalArgs(updates=50)),
    ("set_publish_interval", {"updates": 1, "seconds": 86400}, proto.PublishIntervalArgs(1, 86400.0)),
    ("set_publish_interval", {"seconds": 0.25}, proto.PublishIntervalArgs(seconds=0.25)),
    ("checkpoint", {}, proto.CheckpointArgs()),
    ("checkpoint", {"tag": "before-lr_change.1"}, proto.CheckpointArgs("before-lr_change.1")),
]

BAD: list[tuple[str, dict[str, Any], str]] = [
    ("pause", {"x": 1}, "unknown arguments ['x']"),
    ("resume", {"now": True}, "unknown arguments"),
    ("set_exploration", {}, "give epsilon"),
    ("set_exploration", {"epsilon": 1.5}, "epsilon must be in [0, 1]"),
    ("set_exploration", {"epsilon": -0.1}, "epsilon must be in"),
    ("set_exploration", {"epsilon": "abc"}, "epsilon must be a number"),
    ("set_exploration", {"epsilon": True}, "epsilon must be a number"),
    ("set_exploration", {"epsilon": 0.1, "base": 0.4}, "cannot be combined"),
    ("set_exploration", {"epsilon": 0.1, "alpha": "x"}, "cannot be combined"),
    ("set_exploration", {"base": 0}, "base must be in (0, 1]"),
    ("set_exploration", {"base": "x"}, "base must be a number"),
    ("set_exploration", {"alpha": -1}, "alpha must be in [0, 100]"),
    ("set_exploration", {"alpha": 1e9}, "alpha must be in"),
    ("set_exploration", {"gamma": 1}, "unknown arguments ['gamma']"),
    ("set_lr", {}, "lr required"),
    ("set_lr", {"lr": 0}, "lr must be in (0, 1]"),
    ("set_lr", {"lr": 1.5}, "lr must be in"),
    ("set_lr", {"lr": float("inf")}, "finite"),
    ("set_lr", {"lr": float("nan")}, "finite"),
    ("set_lr", {"lr": 10**400}, "finite"),
    ("set_lr", {"lr": "0.1"}, "lr must be a number"),
    ("set_lr", {"lr": True}, "lr must be a number"),
    ("set_lr", {"lr": None}, "lr must have a value"),
    ("set_lr", {"rate": 2e-4}, "unknown arguments ['rate']"),
    ("set_lr", {"lr": 0.1, "rate": 2e-4}, "unknown arguments"),
    ("set_replay_ratio", {}, "samples_per_insert required"),
    ("set_replay_ratio", {"error_buffer": 10}, "samples_per_insert required"),
    ("set_replay_ratio", {"samples_per_insert": 0}, "samples_per_insert must be in (0, 1e+06]"),
    ("set_replay_ratio", {"samples_per_insert": -1}, "samples_per_insert must be in"),
    ("set_replay_ratio", {"samples_per_insert": "fast"}, "must be a number"),
    ("set_replay_ratio", {"samples_per_insert": 4, "error_buffer": -1}, "error_buffer must be in"),
    ("set_replay_ratio", {"samples_per_insert": 4, "error_buffer": float("inf")}, "finite"),
    ("set_replay_ratio", {"samples_per_insert": 4, "min_size": 1}, "unknown arguments ['min_size']"),
    ("set_publish_interval", {}, "give updates"),
    ("set_publish_interval", {"updates": 0}, "updates must be in [1, 1e+09]"),
    ("set_publish_interval", {"updates": True}, "updates must be a number"),
    ("set_publish_interval", {"updates": 1.5}, "whole number"),
    ("set_publish_interval", {"seconds": 0}, "seconds must be in (0, 86400]"),
    ("set_publish_interval", {"seconds": float("nan")}, "finite"),
    ("set_publish_interval", {"updates": 5, "seconds": "soon"}, "seconds must be a number"),
    ("set_publish_interval", {"every": 3}, "unknown arguments ['every']"),
    ("checkpoint", {"tag": "../etc"}, "tag must be"),
    ("checkpoint", {"tag": ".hidden"}, "tag must be"),
    ("checkpoint", {"tag": "é"}, "tag must be"),
    ("checkpoint", {"tag": 5}, "tag must be"),
    ("checkpoint", {"tag": "x" * 65}, "tag must be"),
]


def test_every_kind_has_one_argument_class() -> None:
    assert set(proto.COMMAND_ARGS) == set(K)
    for kind, cls in proto.COMMAND_ARGS.items():
        assert cls.KIND is kind and dataclasses.is_dataclass(cls)
        assert cls.__dataclass_params__.frozen  # type: ignore[attr-defined]


@pytest.mark.parametrize(("name", "raw", "expected"), GOOD, ids=[f"{g[0]}-{i}" for i, g in enumerate(GOOD)])
def test_good_arguments_decode_to_their_typed_value_and_back(name: str, raw: dict[str, Any],
                                                             expected: proto.CommandArgs) -> None:
    msg = proto.Control(seq=7, command=name, target="learner-0", args=raw)
    command = proto.Command.from_message(proto.decode(proto.encode(msg), proto.Control))
    assert command == proto.Command(expected, 7, "learner-0")
    assert command.kind == K(name) and command.kind == name
    wire = command.to_message()
    assert (wire.seq, wire.command, wire.target) == (7, name, "learner-0")
    assert all(type(v) is type(getattr(expected, k)) for k, v in wire.args.items())  # normalised: 50.0 -> 50
    assert proto.Command.from_message(proto.decode(proto.encode(wire), proto.Control)) == command
    assert proto.parse_args(name, raw) == expected


@pytest.mark.parametrize(("name", "raw", "reason"), BAD, ids=[f"{b[0]}-{i}" for i, b in enumerate(BAD)])
def test_bad_arguments_raise_the_one_error_with_a_reason(name: str, raw: dict[str, Any], reason: str) -> None:
    with pytest.raises(proto.CommandError) as info:
        proto.parse_args(name, raw)
    assert type(info.value) is proto.CommandError and info.value.fault == "bad_args"
    assert reason in str(info.value)
    with pytest.raises(proto.CommandError, match=f"^{name}: ") as info:  # as a service refuses it: named
        proto.Command.from_message(proto.Control(seq=1, command=name, args=raw))
    assert info.value.fault == "bad_args" and isinstance(info.value, proto.DecodeError)


@pytest.mark.parametrize("name", ["launch", "", "PAUSE", "set_lr ", "x" * 200])
def test_unknown_commands_are_refused_by_name(name: str) -> None:
    with pytest.raises(proto.UnknownCommand) as info:
        proto.Command.from_message(proto.Control(seq=1, command=name))
    assert info.value.fault == "unknown_command" and isinstance(info.value, proto.CommandError)
    assert "known: checkpoint, pause, resume" in str(info.value) and len(str(info.value)) < 300


def test_arguments_are_checked_when_built_and_stay_frozen() -> None:
    with pytest.raises(proto.CommandError, match="samples_per_insert must be in"):
        proto.ReplayRatioArgs(-1.0)
    with pytest.raises(proto.CommandError, match="lr must be a number"):
        proto.LrArgs("0.1")  # type: ignore[arg-type]
    args = proto.PublishIntervalArgs(updates=3.0)  # type: ignore[arg-type]
    assert args.updates == 3 and isinstance(args.updates, int)
    with pytest.raises(dataclasses.FrozenInstanceError):
        args.updates = 0  # type: ignore[misc]
    assert args.to_wire() == {"updates": 3}  # not given: not sent


def test_dispatch_runs_the_handler_of_the_kind_only() -> None:
    seen: list[proto.Command[Any]] = []

    def on_lr(command: proto.Command[proto.LrArgs]) -> None:
        seen.append(command)

    handlers: proto.CommandHandlers = {K.SET_LR: on_lr}
    lr = proto.Command(proto.LrArgs(0.5), seq=3)
    assert proto.dispatch(lr, handlers) is True
    assert seen == [lr] and seen[0].args.lr == 0.5
    assert proto.dispatch(proto.Command(proto.PauseArgs()), handlers) is False  # another service's command
    assert seen == [lr]


_KEYS = st.sampled_from(["epsilon", "base", "alpha", "lr", "samples_per_insert", "error_buffer", "updates",
                         "seconds", "tag", "publish_interval_updates", "publish_interval_s", "junk"])
_VALUES = st.one_of(st.integers(-(2**63), 2**64 - 1), st.floats(allow_nan=True), st.booleans(),
                    st.text(max_size=70), st.sampled_from([0, 1, 0.5, 1e-4, 4, "run-1"]))


@settings(max_examples=400, deadline=None)
@given(name=st.sampled_from([k.value for k in K] + ["nope"]), raw=st.dictionaries(_KEYS, _VALUES, max_size=4))
def test_any_wire_command_decodes_to_a_valid_command_or_one_typed_error(name: str, raw: dict[str, Any]) -> None:
    msg = proto.Control(seq=1, command=name, args=raw)
    try:
        frames = proto.encode(msg)
    except ValueError:  # e.g. lone surrogates: what msgpack cannot carry never reaches a service
        return
    try:
        command = proto.Command.from_message(proto.decode(frames, proto.Control))
    except proto.CommandError as exc:
        assert exc.fault in ("bad_args", "unknown_command") and str(exc)
        return
    rebuilt = type(command.args)(**dataclasses.asdict(command.args))  # a valid value passes its own checks
    assert rebuilt == command.args
    assert proto.Command.from_message(command.to_message()) == command


_NEAR_BOUNDS = st.one_of(
    st.floats(-0.5, 1.5), st.integers(-1, 3), st.from_regex(r"[A-Za-z0-9._-]{1,4}", fullmatch=True),
    st.sampled_from([0, 1, 0.0, 1.0, 1e-4, 50.0, 100, 100.5, 86400, 86400.5, 1e6, 1e6 + 1, 1e9, 1e12, "x" * 65]))
_JSON_VALUES = st.one_of(_NEAR_BOUNDS, st.one_of(  # half of them near the bounds: both sides of each check come up
    st.integers(-(2**70), 2**70), st.floats(allow_nan=False, allow_infinity=False), st.booleans(), st.none(),
    st.text(max_size=70)))


@settings(max_examples=500, deadline=None)
@given(data=st.data(), kind=st.sampled_from(list(K)))
def test_each_kind_json_schema_accepts_exactly_what_its_check_accepts(data: st.DataObject, kind: K) -> None:
    """The OpenAPI request schema is derived from the argument class; a JSON body passes both or neither."""
    import jsonschema  # schemathesis's validator: the one the gateway's fuzz test holds the API to

    cls = proto.COMMAND_ARGS[kind]
    names = [f.name for f in dataclasses.fields(cls)]
    keys = data.draw(st.lists(st.sampled_from(names), unique=True) if names else st.just([]))
    keys += ["junk"] if data.draw(st.integers(0, 9)) == 0 else []
    raw = {key: data.draw(_JSON_VALUES) for key in keys}
    try:
        cls.from_wire(raw)
        accepted = True
    except proto.CommandError:
        accepted = False
    assert jsonschema.Draft202012Validator(cls.json_schema()).is_valid(raw) == accepted, raw


def test_the_schemas_name_every_argument_and_its_bounds() -> None:
    assert proto.LrArgs.json_schema() == {
        "type": "object", "properties": {"lr": {"type": "number", "exclusiveMinimum": 0, "maximum": 1}},
        "additionalProperties": False, "required": ["lr"]}
    assert proto.PauseArgs.json_schema()["maxProperties"] == 0
    assert proto.PublishIntervalArgs.json_schema()["properties"]["updates"]["type"] == "integer"
    assert [sorted(s["properties"]) for s in proto.ExplorationArgs.json_schema()["oneOf"]] == [
        ["epsilon"], ["alpha", "base"]]
