"""Every decoder, kind by kind, as the services call it: mutated frames over a real socket, each socket's
expected kinds and each service's limits. Decoding yields a valid message or a typed DecodeError, nothing else."""

from __future__ import annotations

from typing import Any

import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_proto_codec import STRATEGIES, _check_outcome, _mutate_frames, as_bytes

from flywheel import proto
from flywheel.proto import DecodeError, Limits, decode, encode, peek_kind
from flywheel.proto.errors import FAULTS
from flywheel.proto.messages import MESSAGE_TYPES, SampleRequest
from flywheel.services.learner.sampling import batch_limits

PER_KIND = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                            HealthCheck.function_scoped_fixture])

# What each bound socket of each service expects, with the limits it decodes with.
SOCKETS: dict[str, tuple[tuple[type[proto.Message], ...], Limits]] = {
    "replay transitions": ((proto.TransitionBatch,), Limits(max_total_bytes=16 << 20, max_array_bytes=16 << 20)),
    "replay sample": ((proto.SampleRequest, proto.PriorityUpdate), proto.DEFAULT_LIMITS),
    "learner samples": ((proto.SampleBatch,), batch_limits(32, (4,))),
    "actor weights": ((proto.Weights,), proto.DEFAULT_LIMITS),
    "gateway telemetry": ((proto.Telemetry,), proto.DEFAULT_LIMITS),
    "gateway lease": ((proto.LeaseRequest,), proto.DEFAULT_LIMITS),
    "actor lease": ((proto.LeaseReply,), proto.DEFAULT_LIMITS),
    "every service control": ((proto.Control,), proto.DEFAULT_LIMITS),
}

# SampleRequest with the shared-memory fields too (the general strategy leaves them at their defaults).
full_sample_request = st.builds(
    SampleRequest, st.integers(-(2**63), 2**63 - 1), st.integers(1, 65536), st.floats(0.0, 1.0),
    st.booleans(), st.text(max_size=40), st.integers(-1, 4096), st.integers(0, 256))


def _through(pair: Any, frames: list[bytes]) -> list[zmq.Frame]:
    """As a service receives them: zmq.Frame objects (copy=False) from a real socket."""
    a, b = pair
    a.send_multipart(frames, copy=False) if frames else a.send(b"")
    return b.recv_multipart(copy=False)


def _decode_as_service(frames: list[Any], expect: tuple[type[proto.Message], ...], limits: Limits) -> None:
    try:
        msg = decode(frames, expect=expect, limits=limits)
    except DecodeError as exc:
        assert exc.fault in FAULTS
        return
    assert isinstance(msg, expect)
    msg.validate()


@pytest.mark.parametrize("kind", sorted(MESSAGE_TYPES))
@PER_KIND
@given(data=st.data())
def test_mutations_of_each_kind_through_a_socket_and_every_decoder(kind: str, data: st.DataObject, pair: Any) -> None:
    strategy = full_sample_request if kind == "sample_request" else STRATEGIES[kind]
    frames = _mutate_frames(data, as_bytes(encode(data.draw(strategy))))
    received = _through(pair, frames)
    _check_outcome(received)
    for expect, limits in SOCKETS.values():
        _decode_as_service(received, expect, limits)
    try:
        assert peek_kind(received) in MESSAGE_TYPES
    except DecodeError as exc:
        assert exc.fault in FAULTS


@PER_KIND
@given(frames=st.lists(st.binary(max_size=64), min_size=0, max_size=6))
def test_arbitrary_frames_at_every_socket(frames: list[bytes], pair: Any) -> None:
    received = _through(pair, frames)
    for expect, limits in SOCKETS.values():
        _decode_as_service(received, expect, limits)


@pytest.mark.parametrize("kind", sorted(MESSAGE_TYPES))
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_every_kind_is_refused_at_every_socket_that_does_not_take_it(kind: str, data: st.DataObject) -> None:
    msg = data.draw(STRATEGIES[kind])
    frames = encode(msg)
    for socket_name, (expect, limits) in SOCKETS.items():
        if isinstance(msg, expect):
            continue
        with pytest.raises(DecodeError) as err:
            decode(frames, expect=expect, limits=limits)
        assert err.value.fault == "wrong_kind", (kind, socket_name)
