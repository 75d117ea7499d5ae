"""SampleBatch's is_demo and shm fields and SampleRequest's shared-memory fields: round trips and refusals."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st

from flywheel.proto import BadShape, DecodeError, SampleBatch, SampleRequest, decode, encode


def batch(n: int = 4, *, is_demo: np.ndarray | None = None, shm: dict | None = None,
          obs: np.ndarray | None = None) -> SampleBatch:
    obs = np.arange(n * 8, dtype=np.uint8).reshape(n, 2, 4) if obs is None else obs
    return SampleBatch(request_id=1, replay_size=100, obs=obs, action=np.arange(n, dtype=np.int64),
                       reward=np.ones(n, np.float32), discount=np.ones(n, np.float32), next_obs=obs.copy(),
                       index=np.arange(n, dtype=np.int64), weight=np.ones(n, np.float32), is_demo=is_demo,
                       shm=shm or {})


def test_is_demo_and_shm_round_trip_over_a_socket(pair: tuple[zmq.Socket, zmq.Socket]) -> None:
    is_demo = np.array([0, 1, 0, 1], np.uint8)
    offer = {"segment": "flywheel-replay-1-2-abcdef01", "size": 4096, "token": "00" * 16}
    for msg in (batch(is_demo=is_demo), batch(shm=offer)):
        pair[0].send_multipart(encode(msg), copy=False)
        got = decode(pair[1].recv_multipart(copy=False), expect=SampleBatch)
        assert isinstance(got, SampleBatch) and got.shm == msg.shm
        if msg.is_demo is None:
            assert got.is_demo is None and not got.demo_mask().any()
        else:
            assert np.array_equal(got.is_demo, is_demo) and got.demo_mask().tolist() == [False, True, False, True]


def test_a_slot_reply_must_carry_placeholders() -> None:
    where = {"segment": "s", "slot": 0, "offset": 4096, "next_offset": 8192, "dtype": "uint8", "shape": "2,4"}
    placeholder = np.empty((4, 0), np.uint8)
    got = decode(encode(batch(shm=where, obs=placeholder)), expect=SampleBatch)
    assert got.obs.shape == (4, 0) and got.shm["slot"] == 0
    with pytest.raises(BadShape, match="placeholders"):
        encode(batch(shm=where))  # real observations and a slot: which one is meant?
    header = msgpack.unpackb(bytes(encode(batch())[0]))
    header["f"]["shm"] = where
    with pytest.raises(DecodeError):
        decode([msgpack.packb(header), *encode(batch())[1:]], expect=SampleBatch)


def test_is_demo_must_match_the_batch_and_dtype() -> None:
    with pytest.raises(BadShape):
        encode(batch(is_demo=np.zeros(3, np.uint8)))
    frames = encode(batch(is_demo=np.zeros(4, np.uint8)))
    header = msgpack.unpackb(bytes(frames[0]))
    for spec in header["a"]:
        if spec[0] == "is_demo":
            spec[1] = "int64"
    with pytest.raises(DecodeError):
        decode([msgpack.packb(header), *frames[1:-1], np.zeros(4, np.int64)], expect=SampleBatch)


@settings(max_examples=50, deadline=None)
@given(shm=st.booleans(), segment=st.text(max_size=60), release=st.integers(-1, 4096), slots=st.integers(0, 256),
       beta=st.floats(0.0, 1.0))
def test_sample_request_fields_round_trip(shm: bool, segment: str, release: int, slots: int, beta: float) -> None:
    msg = SampleRequest(7, 512, beta, shm=shm, shm_segment=segment, release_slot=release, slots=slots)
    got = decode(encode(msg), expect=SampleRequest)
    assert got == msg


def test_requests_without_the_new_fields_still_decode() -> None:
    old = msgpack.packb({"k": "sample_request", "v": 1, "f": {"request_id": 3, "batch_size": 32, "beta": 0.5},
                         "a": []})
    got = decode([old], expect=SampleRequest)
    assert got == SampleRequest(3, 32, 0.5) and not got.shm and got.release_slot == -1


@pytest.mark.parametrize("fields", [{"release_slot": -2}, {"release_slot": 5000}, {"slots": 300}, {"slots": -1},
                                    {"shm": 1}, {"shm_segment": 5}])
def test_bad_request_fields_are_refused(fields: dict) -> None:
    header = {"k": "sample_request", "v": 1, "f": {"request_id": 3, "batch_size": 32, "beta": 0.5} | fields, "a": []}
    with pytest.raises(DecodeError):
        decode([msgpack.packb(header)], expect=SampleRequest)
