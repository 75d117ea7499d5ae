"""flywheel.proto codec: property-based round trips, typed rejections and mutation fuzzing."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import msgpack
import numpy as np
import pytest
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from flywheel import proto
from flywheel.proto import (
    CLIP_CHUNK_BYTES,
    DEFAULT_LIMITS,
    FAULTS,
    SCHEMA_VERSION,
    BadDtype,
    BadShape,
    ClipChunk,
    Control,
    DecodeError,
    LeaseReply,
    LeaseRequest,
    Limits,
    MalformedMessage,
    Message,
    OversizedMessage,
    PriorityUpdate,
    SampleBatch,
    SampleRequest,
    Telemetry,
    TransitionBatch,
    TruncatedMessage,
    UnknownKind,
    VersionMismatch,
    Weights,
    WrongKind,
    decode,
    encode,
    peek_kind,
)
from flywheel.proto.messages import MESSAGE_TYPES, SampleRefused

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FUZZ = settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

# --------------------------------------------------------------------------------------------- helpers


def assert_same_array(got: Any, want: np.ndarray) -> None:
    assert isinstance(got, np.ndarray)
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    assert got.tobytes() == np.ascontiguousarray(want).tobytes()  # bit-exact, NaNs included
    if want.dtype.kind != "f":
        assert np.array_equal(got, want)


def same_scalar(got: Any, want: Any) -> bool:
    if isinstance(want, float) and math.isnan(want):
        return isinstance(got, float) and math.isnan(got)
    return type(got) is type(want) and got == want


def assert_same_message(got: Any, want: Message) -> None:
    """Field by field: arrays bit-exact, scalars equal and of the same Python type."""
    assert type(got) is type(want)
    for f in dataclasses.fields(want):
        g, w = getattr(got, f.name), getattr(want, f.name)
        if isinstance(w, np.ndarray):
            assert_same_array(g, w)
        elif w is None:
            assert g is None, f.name
        elif isinstance(w, dict):
            assert isinstance(g, dict) and list(g) == list(w), f.name
            for key, value in w.items():
                if isinstance(value, np.ndarray):
                    assert_same_array(g[key], value)
                else:
                    assert same_scalar(g[key], value), (f.name, key, g[key], value)
        else:
            assert same_scalar(g, w), (f.name, g, w)


def arrays_of(msg: Message) -> list[np.ndarray]:
    out: list[np.ndarray] = []
    for f in dataclasses.fields(msg):
        value = getattr(msg, f.name)
        if isinstance(value, np.ndarray):
            out.append(value)
        elif isinstance(value, dict):
            out.extend(v for v in value.values() if isinstance(v, np.ndarray))
    return out


def assert_read_only(msg: Message) -> None:
    for array in arrays_of(msg):
        assert not array.flags.writeable
        if array.size:
            with pytest.raises(ValueError):
                array.reshape(-1)[0] = 0


def as_bytes(frames: list[Any]) -> list[bytes]:
    return [memoryview(f).tobytes() for f in frames]


def as_memoryviews(frames: list[Any]) -> list[memoryview]:
    # Offset by one byte inside a larger buffer: views that are neither aligned nor the whole object.
    return [memoryview(bytearray(b"\x00" + b))[1:] for b in as_bytes(frames)]


def header_of(frames: list[Any]) -> dict[str, Any]:
    return msgpack.unpackb(as_bytes(frames[:1])[0], raw=False)


def with_header(frames: list[Any], header: Any) -> list[Any]:
    return [msgpack.packb(header, use_bin_type=True), *frames[1:]]


def build(kind: str, scalars: dict[str, Any], arrays: list[tuple[str, np.ndarray]], **over: Any) -> list[bytes]:
    """An independent, unchecked encoder: lets tests put on the wire what ``encode`` would refuse."""
    header = {"k": kind, "v": SCHEMA_VERSION, "f": scalars,
              "a": [[name, a.dtype.str if a.dtype.byteorder == ">" else a.dtype.name, list(a.shape)]
                    for name, a in arrays]}
    header.update(over)
    return [msgpack.packb(header, use_bin_type=True), *(a.tobytes() for _, a in arrays)]


def tb_arrays(n: int = 3, obs: np.ndarray | None = None, **over: np.ndarray) -> list[tuple[str, np.ndarray]]:
    obs = np.arange(n * 4, dtype=np.float32).reshape(n, 4) if obs is None else obs
    base = {
        "obs": obs, "action": np.arange(n, dtype=np.int64), "reward": np.ones(n, np.float32),
        "discount": np.full(n, 0.99, np.float32), "next_obs": obs.copy(),
    }
    base.update(over)
    return list(base.items())


TB_SCALARS = {"actor": "actor-0", "weight_version": 3, "seq": 9}


def valid_tb(n: int = 3) -> TransitionBatch:
    return TransitionBatch(**dict(tb_arrays(n)), **TB_SCALARS, priority=np.ones(n, np.float32))


# --------------------------------------------------------------------------------------------- zmq


@pytest.fixture(scope="module")
def pipe() -> Iterator[tuple[zmq.Socket, zmq.Socket]]:
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    push = ctx.socket(zmq.PUSH)
    for sock in (pull, push):
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVTIMEO, 5000)
        sock.setsockopt(zmq.SNDTIMEO, 5000)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    push.connect(f"tcp://127.0.0.1:{port}")
    yield push, pull
    push.close()
    pull.close()
    ctx.term()


def over_zmq(pipe: tuple[zmq.Socket, zmq.Socket], frames: list[Any]) -> list[zmq.Frame]:
    push, pull = pipe
    push.send_multipart(frames, copy=False)
    got = pull.recv_multipart(copy=False)
    assert all(isinstance(f, zmq.Frame) for f in got) and len(got) == len(frames)
    return got


TRANSPORTS = ("direct", "bytes", "memoryview", "zmq")


def carry(frames: list[Any], how: str, pipe: tuple[zmq.Socket, zmq.Socket]) -> list[Any]:
    if how == "bytes":
        return as_bytes(frames)
    if how == "memoryview":
        return as_memoryviews(frames)
    if how == "zmq":
        return over_zmq(pipe, frames)
    return frames


# --------------------------------------------------------------------------------------------- strategies

text = st.text(max_size=24)
int64 = st.integers(INT64_MIN, INT64_MAX)
finite = st.floats(allow_nan=False)
f32_elems = st.floats(width=32, allow_nan=True, allow_infinity=True)


def batch_array(dtype: Any, shape: tuple[int, ...]) -> st.SearchStrategy[np.ndarray]:
    elements = f32_elems if np.dtype(dtype) == np.float32 else None
    return hnp.arrays(dtype, shape, elements=elements)


@st.composite
def obs_pairs(draw: st.DrawFn, n: int) -> tuple[np.ndarray, np.ndarray]:
    dtype = draw(st.sampled_from([np.uint8, np.float32]))
    tail = tuple(draw(st.lists(st.integers(0, 5), min_size=1, max_size=3)))
    return draw(batch_array(dtype, (n, *tail))), draw(batch_array(dtype, (n, *tail)))


@st.composite
def transition_batches(draw: st.DrawFn) -> TransitionBatch:
    n = draw(st.integers(1, 6))
    obs, next_obs = draw(obs_pairs(n))
    priority = draw(st.none() | batch_array(np.float32, (n,)))
    return TransitionBatch(
        actor=draw(text), weight_version=draw(int64), seq=draw(int64), obs=obs,
        action=draw(batch_array(np.int64, (n,))), reward=draw(batch_array(np.float32, (n,))),
        discount=draw(batch_array(np.float32, (n,))), next_obs=next_obs, priority=priority,
    )


@st.composite
def sample_batches(draw: st.DrawFn) -> SampleBatch:
    n = draw(st.integers(1, 6))
    obs, next_obs = draw(obs_pairs(n))
    return SampleBatch(
        request_id=draw(int64), replay_size=draw(int64), obs=obs, action=draw(batch_array(np.int64, (n,))),
        reward=draw(batch_array(np.float32, (n,))), discount=draw(batch_array(np.float32, (n,))),
        next_obs=next_obs, index=draw(batch_array(np.int64, (n,))), weight=draw(batch_array(np.float32, (n,))),
    )


@st.composite
def priority_updates(draw: st.DrawFn) -> PriorityUpdate:
    n = draw(st.integers(1, 16))
    return PriorityUpdate(draw(batch_array(np.int64, (n,))), draw(batch_array(np.float32, (n,))))


tensor = st.sampled_from([np.float32, np.float16, np.int64]).flatmap(
    lambda dt: hnp.arrays(dt, hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=3))
)


@st.composite
def weights(draw: st.DrawFn) -> Weights:
    tensors = draw(st.dictionaries(text, tensor, max_size=6))
    tensors["scalar"] = draw(hnp.arrays(np.int64, ()))  # always at least one 0-d tensor
    return Weights(draw(st.integers(0, INT64_MAX)), draw(text), tensors,
                   draw(st.from_regex(r"[0-9a-f]{0,32}", fullmatch=True)))


float_map = st.dictionaries(text, finite, max_size=6)
telemetry = st.builds(
    Telemetry, text, text, int64, finite, float_map, float_map, st.dictionaries(text, text, max_size=6),
)
arg_value = st.one_of(st.integers(INT64_MIN, 2**64 - 1), finite, st.text(max_size=40), st.booleans())
control = st.builds(Control, int64, text, text, st.dictionaries(text, arg_value, max_size=8))
sample_request = st.builds(SampleRequest, int64, st.integers(1, 65536), st.floats(0.0, 1.0))
lease_request = st.builds(LeaseRequest, text, st.booleans())
sample_refused = st.builds(SampleRefused, int64, st.from_regex(r"[a-z][a-z_]{0,31}", fullmatch=True), text, int64)


@st.composite
def lease_replies(draw: st.DrawFn) -> LeaseReply:
    count = draw(st.integers(0, INT64_MAX))
    return LeaseReply(draw(text), draw(st.integers(0, max(count, 1) - 1)), count, draw(finite))


def _clip(**changes: object) -> ClipChunk:
    base = ClipChunk("a", 1, 0, 2, 100, 3, "CartPole-v1", 50.0, 10, 1.0, 9, -1, False, 0.0, np.ones(10, np.uint8))
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


@st.composite
def clip_chunks(draw: st.DrawFn) -> ClipChunk:
    count = draw(st.integers(1, 400))
    index = draw(st.integers(0, count - 1))
    data = draw(hnp.arrays(np.uint8, st.integers(1, 300)))
    total = draw(st.integers(len(data), count * CLIP_CHUNK_BYTES))
    return ClipChunk(draw(text), draw(int64), index, count, total, draw(int64), draw(text), draw(finite),
                     draw(int64), draw(finite), draw(int64), draw(st.floats(allow_nan=False, allow_infinity=False)),
                     draw(st.booleans()), draw(finite), data)  # progress: finite (validate refuses inf)


STRATEGIES: dict[str, st.SearchStrategy[Message]] = {
    "transitions": transition_batches(), "sample_request": sample_request, "sample_batch": sample_batches(),
    "priorities": priority_updates(), "weights": weights(), "telemetry": telemetry, "control": control,
    "lease_request": lease_request, "lease_reply": lease_replies(), "clip_chunk": clip_chunks(),
    "sample_refused": sample_refused,
}
any_message = st.one_of(*STRATEGIES.values())


def test_every_kind_has_a_strategy() -> None:
    assert set(STRATEGIES) == set(MESSAGE_TYPES)


# --------------------------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("kind", sorted(STRATEGIES))
@FAST
@given(data=st.data())
def test_round_trip_every_kind(kind: str, data: st.DataObject, pipe: tuple[zmq.Socket, zmq.Socket]) -> None:
    msg = data.draw(STRATEGIES[kind])
    how = data.draw(st.sampled_from(TRANSPORTS))
    frames = encode(msg)
    assert len(frames) == 1 + len(arrays_of(msg))
    assert peek_kind(carry(frames, how, pipe)) == kind
    got = decode(carry(frames, how, pipe), expect=type(msg))
    assert_same_message(got, msg)
    assert_read_only(got)


@pytest.mark.parametrize("obs", [
    np.random.default_rng(0).integers(0, 256, (32, 4, 84, 84), dtype=np.uint8),  # > zmq copy threshold
    np.random.default_rng(1).standard_normal((8, 17)).astype(np.float32),
], ids=["pixels-uint8", "vectors-float32"])
@pytest.mark.parametrize("with_priority", [True, False])
def test_transition_batch_over_a_real_socket(
    obs: np.ndarray, with_priority: bool, pipe: tuple[zmq.Socket, zmq.Socket],
) -> None:
    n = obs.shape[0]
    msg = TransitionBatch(actor="actor-7", weight_version=12, seq=345, obs=obs,
                          action=np.arange(n, dtype=np.int64), reward=np.ones(n, np.float32),
                          discount=np.full(n, 0.9, np.float32), next_obs=obs[::-1].copy(),
                          priority=np.linspace(0, 1, n, dtype=np.float32) if with_priority else None)
    frames = over_zmq(pipe, encode(msg))
    got = decode(frames, expect=(SampleBatch, TransitionBatch))
    assert_same_message(got, msg)
    assert_read_only(got)
    assert isinstance(got, TransitionBatch) and len(got) == n


def test_weights_keep_zero_d_and_empty_tensors(pipe: tuple[zmq.Socket, zmq.Socket]) -> None:
    tensors = {
        "fc.weight": np.arange(12, dtype=np.float32).reshape(3, 4), "fc.bias": np.zeros(3, np.float16),
        "bn.num_batches_tracked": np.array(17, dtype=np.int64), "temperature": np.array(0.5, np.float32),
        "empty": np.zeros((0, 3), np.float32), "conv": np.ones((2, 1, 3, 3), np.float32),
    }
    msg = Weights(5, "mlp", tensors)
    for frames in (encode(msg), over_zmq(pipe, encode(msg))):
        got = decode(frames, expect=Weights)
        assert_same_message(got, msg)
        assert got.tensors["bn.num_batches_tracked"].shape == () and int(got.tensors["bn.num_batches_tracked"]) == 17


def test_encode_normalises_layout_and_byte_order() -> None:
    obs = np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2]  # non-contiguous view
    msg = PriorityUpdate(np.arange(3, dtype=">i8"), np.array([1, 2, 3], dtype=">f4"))
    got = decode(as_bytes(encode(msg)))
    assert got.index.dtype == np.int64 and got.index.tolist() == [0, 1, 2]
    assert got.priority.dtype == np.float32 and got.priority.tolist() == [1.0, 2.0, 3.0]
    tb = TransitionBatch(actor="a", weight_version=0, seq=0, obs=obs, action=np.zeros(4, np.int64),
                         reward=np.zeros(4, np.float32), discount=np.zeros(4, np.float32), next_obs=obs.copy())
    assert np.array_equal(decode(as_bytes(encode(tb))).obs, obs)


def test_decoded_arrays_read_only_even_from_writable_buffers() -> None:
    frames = [bytearray(f) for f in as_bytes(encode(valid_tb()))]
    assert_read_only(decode(frames))


def test_scalar_extremes_round_trip() -> None:
    for msg in (
        Telemetry("s", "i", INT64_MIN, -math.inf, {"c": math.inf}, {}, {"k": "é" * 256}),
        Telemetry("s" * 256, "", INT64_MAX, 0.0),
        Control(INT64_MIN, "set", "replay-0", {"i": -(2**63), "u": 2**64 - 1, "f": 1.0, "b": True, "s": ""}),
        SampleRequest(INT64_MAX, 65536, 1.0),
        LeaseReply("x", 0, 0, 0.0),
    ):
        assert_same_message(decode(encode(msg)), msg)
    args = decode(encode(Control(1, "c", args={"one": 1, "onef": 1.0, "yes": True}))).args
    assert [type(v) for v in args.values()] == [int, float, bool]


# --------------------------------------------------------------------------------------------- peek_kind / encode


def test_peek_kind_reads_only_the_header() -> None:
    frames = encode(valid_tb())
    assert peek_kind(frames[:1]) == "transitions"
    assert peek_kind([frames[0], b"garbage"]) == "transitions"
    assert peek_kind([memoryview(as_bytes(frames)[0])]) == "transitions"
    with pytest.raises(TruncatedMessage):
        peek_kind([])
    with pytest.raises(UnknownKind):
        peek_kind(with_header(frames, {**header_of(frames), "k": "nope"}))
    with pytest.raises(VersionMismatch):
        peek_kind(with_header(frames, {**header_of(frames), "v": 99}))
    with pytest.raises(MalformedMessage):
        peek_kind([b"\xc1"])
    with pytest.raises(OversizedMessage):
        peek_kind(frames[:1], limits=Limits(max_header_bytes=8))


@pytest.mark.parametrize("make", [
    lambda: TransitionBatch(**TB_SCALARS, **dict(tb_arrays(3, reward=np.ones(2, np.float32)))),
    lambda: TransitionBatch(**TB_SCALARS, **dict(tb_arrays(0))),
    lambda: TransitionBatch(**TB_SCALARS, **dict(tb_arrays(3, next_obs=np.zeros((3, 5), np.float32)))),
    lambda: TransitionBatch(**TB_SCALARS, **dict(tb_arrays(3, next_obs=np.zeros((3, 4), np.uint8)))),
    lambda: dataclasses.replace(valid_tb(), priority=np.ones(4, np.float32)),
    lambda: SampleRequest(1, 0), lambda: SampleRequest(1, 65537), lambda: SampleRequest(1, 8, beta=1.5),
    lambda: PriorityUpdate(np.arange(3), np.ones(2, np.float32)),
    lambda: Weights(-1, "n"), lambda: LeaseReply("a", 3, 3, 1.0), lambda: LeaseReply("a", -1, 3, 1.0),
    lambda: _clip(index=2, count=2), lambda: _clip(data=np.zeros(CLIP_CHUNK_BYTES + 1, np.uint8)),
    lambda: _clip(total_bytes=3 * CLIP_CHUNK_BYTES), lambda: _clip(progress=float("inf")),
], ids=["batch", "empty", "obs-shape", "obs-dtype", "priority", "bs0", "bs-big", "beta", "prio", "wver",
        "lease-hi", "lease-neg", "clip-index", "clip-piece", "clip-total", "clip-progress"])
def test_encode_validates(make: Callable[[], Message]) -> None:
    with pytest.raises(BadShape):
        encode(make())


# --------------------------------------------------------------------------------------------- rejections


def test_error_taxonomy() -> None:
    classes = [MalformedMessage, TruncatedMessage, OversizedMessage, UnknownKind, WrongKind, VersionMismatch,
               BadDtype, BadShape, proto.CommandError, proto.UnknownCommand]
    assert [c.fault for c in classes] == list(FAULTS)
    assert all(issubclass(c, DecodeError) and issubclass(c, ValueError) for c in classes)


def test_truncated() -> None:
    frames = as_bytes(encode(valid_tb()))
    cases = [[], frames[:1], frames[:-1], [*frames[:-1], frames[-1][:-1]], [frames[0], frames[1][:3], *frames[2:]],
             [*frames[:-1], b""]]
    for case in cases:
        with pytest.raises(TruncatedMessage):
            decode(case)


def test_oversized() -> None:
    msg = valid_tb()
    frames = as_bytes(encode(msg))
    biggest = max(a.nbytes for a in arrays_of(msg))
    total = sum(a.nbytes for a in arrays_of(msg))
    limits = [
        Limits(max_header_bytes=len(frames[0]) - 1), Limits(max_array_bytes=biggest - 1),
        Limits(max_total_bytes=total - 1), Limits(max_arrays=5), Limits(max_dim=3), Limits(max_str=6),
    ]
    for lim in limits:
        with pytest.raises(OversizedMessage):
            decode(frames, limits=lim)
    decode(frames, limits=Limits(max_header_bytes=len(frames[0]), max_array_bytes=biggest, max_total_bytes=total,
                                 max_arrays=6, max_dim=4, max_str=8))
    with pytest.raises(OversizedMessage):  # a frame longer than announced
        decode([*frames[:-1], frames[-1] + b"\x00"])
    with pytest.raises(OversizedMessage):  # a header past the default limit is refused before parsing
        decode([b"\x00" * (DEFAULT_LIMITS.max_header_bytes + 1)])
    with pytest.raises(OversizedMessage):  # a huge announced array is refused before touching any frame
        decode(build("weights", {"version": 1, "network": "n"}, [], a=[["t", "float32", [2**24, 2**24]]]) + [b""])
    with pytest.raises(OversizedMessage):
        decode(build("weights", {"version": 1, "network": "n"}, [], a=[["t", "float32", [2**24 + 1]]]) + [b""])
    tensors = [(f"t{i}", np.zeros(1, np.float32)) for i in range(DEFAULT_LIMITS.max_arrays + 1)]
    with pytest.raises(OversizedMessage):  # too many arrays
        decode(build("weights", {"version": 1, "network": "n"}, tensors))


def test_oversized_strings_and_maps() -> None:
    long = "x" * (DEFAULT_LIMITS.max_str + 1)
    cases = [
        Telemetry(long, "i", 1, 0.0), Telemetry("s", "i", 1, 0.0, info={"k": long}),
        Telemetry("s", "i", 1, 0.0, counters={long: 1.0}), Control(1, "c", args={"a": long}),
        Weights(1, "n", {long: np.zeros(1, np.float32)}), LeaseRequest(long),
    ]
    for msg in cases:
        with pytest.raises(OversizedMessage):
            decode(encode(msg))
    with pytest.raises(OversizedMessage):
        decode(encode(Telemetry("s", "i", 1, 0.0, gauges={str(i): 1.0 for i in range(4)})),
               limits=Limits(max_map_entries=3))


def test_wrong_kind_and_unknown_kind() -> None:
    frames = encode(SampleRequest(1, 32))
    with pytest.raises(WrongKind):
        decode(frames, expect=TransitionBatch)
    with pytest.raises(WrongKind):
        decode(frames, expect=(TransitionBatch, Weights))
    assert isinstance(decode(frames, expect=(TransitionBatch, SampleRequest)), SampleRequest)
    header = header_of(frames)
    for kind in ("nope", "", "Sample_Request", 5, None, ["sample_request"], {"x": 1}):
        with pytest.raises(UnknownKind):
            decode(with_header(frames, {**header, "k": kind}))


def test_version_mismatch() -> None:
    frames = encode(LeaseRequest("a"))
    header = header_of(frames)
    for version in (0, 2, -1, 2**64 - 1, True, "1", 1.0, None, [1]):
        with pytest.raises(VersionMismatch):
            decode(with_header(frames, {**header, "v": version}))


def test_a_changed_message_has_its_own_version_and_the_others_keep_theirs() -> None:
    """ClipChunk changed its measures fields (version 2): a version-1 piece is refused, other kinds still speak 1."""
    clip = encode(_clip(progress=1820.0, success=True))
    assert header_of(clip)["v"] == ClipChunk.VERSION == 2 and header_of(encode(LeaseRequest("a")))["v"] == 1
    got = decode(clip, expect=ClipChunk)
    assert isinstance(got, ClipChunk) and (got.progress, got.success) == (1820.0, True)
    with pytest.raises(VersionMismatch, match="clip_chunk: schema version 1, this build speaks 2"):
        decode(with_header(clip, {**header_of(clip), "v": 1}))
    assert all(cls.VERSION == SCHEMA_VERSION for kind, cls in MESSAGE_TYPES.items() if kind != "clip_chunk")


@pytest.mark.parametrize(("arrays", "error"), [
    pytest.param(tb_arrays(action=np.arange(3, dtype=np.float64)), BadDtype, id="f64-action"),
    pytest.param(tb_arrays(action=np.arange(3, dtype=np.int32)), BadDtype, id="i32-action"),
    pytest.param(tb_arrays(reward=np.ones(3, dtype=">f4")), BadDtype, id="big-endian"),
    pytest.param(tb_arrays(obs=np.zeros((3, 4), np.float16), next_obs=np.zeros((3, 4), np.float16)), BadDtype,
                 id="f16-obs"),
    pytest.param(tb_arrays(obs=np.zeros((3, 4), np.float64), next_obs=np.zeros((3, 4), np.float64)), BadDtype,
                 id="f64-obs"),
    pytest.param(tb_arrays(obs=np.zeros(3, np.float32), next_obs=np.zeros(3, np.float32)), BadShape, id="rank1"),
    pytest.param(tb_arrays(obs=np.zeros((3, 1, 1, 1, 1), np.uint8), next_obs=np.zeros((3, 1, 1, 1, 1), np.uint8)),
                 BadShape, id="rank5"),
    pytest.param(tb_arrays(action=np.zeros((3, 1), np.int64)), BadShape, id="action-rank2"),
    pytest.param(tb_arrays(reward=np.float32(1.0).reshape(())), BadShape, id="reward-0d"),
    pytest.param(tb_arrays(next_obs=np.zeros((3, 5), np.float32)), BadShape, id="obs-mismatch"),
    pytest.param(tb_arrays(next_obs=np.zeros((3, 4), np.uint8)), BadShape, id="obs-dtype-mismatch"),
    pytest.param(tb_arrays(reward=np.ones(2, np.float32)), BadShape, id="batch"),
    pytest.param(tb_arrays(0), BadShape, id="empty"),
])
def test_bad_arrays(arrays: list[tuple[str, np.ndarray]], error: type[DecodeError]) -> None:
    with pytest.raises(error):
        decode(build("transitions", TB_SCALARS, arrays))


def with_array_spec(frames: list[Any], array: int, item: int, value: Any) -> list[Any]:
    """``frames`` with item ``item`` of array ``array``'s header spec ([name, dtype, shape]) set to ``value``."""
    header = header_of(frames)
    specs = [list(s) for s in header["a"]]
    specs[array][item] = value
    return with_header(frames, {**header, "a": specs})


def test_bad_dtype_names_in_header() -> None:
    frames = build("transitions", TB_SCALARS, tb_arrays())
    for name in ("object", "O", "<f4", "float", "int", "bool", "uint8\x00", "V8", "float32 "):
        with pytest.raises(BadDtype):
            decode(with_array_spec(frames, 2, 1, name))
    bad = build("weights", {"version": 1, "network": "n"}, [("t", np.zeros(2, np.uint8))])
    with pytest.raises(BadDtype):
        decode(bad)


def test_bad_shape_dims_and_other_kinds() -> None:
    frames = build("transitions", TB_SCALARS, tb_arrays())
    for shape in ([-3], [3, -4], [3.0], [True], ["3"], [None], [[3]]):
        with pytest.raises(BadShape):
            decode(with_array_spec(frames, 1, 2, shape))
    cases = [
        build("weights", {"version": 1, "network": "n"}, [("t", np.zeros((1, 1, 1, 1, 1), np.float32))]),
        build("priorities", {}, [("index", np.arange(3)), ("priority", np.ones(4, np.float32))]),
        build("sample_request", {"request_id": 1, "batch_size": 0, "beta": 0.5}, []),
        build("weights", {"version": -1, "network": "n"}, []),
        build("lease_reply", {"instance": "a", "index": 5, "count": 2, "ttl": 1.0}, []),
    ]
    for case in cases:
        with pytest.raises(BadShape):
            decode(case)


def test_malformed_headers() -> None:
    frames = encode(SampleRequest(1, 8))
    header = header_of(frames)
    bad_headers: list[Any] = [
        [1, 2], "x", 3, None, {}, {"k": "sample_request"},
        {**header, "extra": 1}, {k: v for k, v in header.items() if k != "a"},
        {**header, "f": [1]}, {**header, "a": {}},
        {**header, "f": {"request_id": 1, "beta": 0.5}},  # missing required field
        {**header, "f": {**header["f"], "surprise": 1}},
        {**header, "f": {**header["f"], "request_id": "1"}},  # str for int
        {**header, "f": {**header["f"], "request_id": True}},  # bool for int
        {**header, "f": {**header["f"], "request_id": 1.0}},  # float for int
        {**header, "f": {**header["f"], "request_id": 2**64 - 1}},  # beyond int64
        {**header, "f": {**header["f"], "beta": math.nan}},
        {**header, "f": {**header["f"], "beta": "0.5"}},
        {**header, "f": {**header["f"], "beta": False}},
        {**header, "f": {**header["f"], "beta": None}},
        {**header, "f": {**header["f"], "surprise": 1, b"": 2}},  # mixed str/bytes keys
        {**header, "k": b"sample_request"},  # bin is never allowed in a header
    ]
    for bad in bad_headers:
        with pytest.raises(MalformedMessage):
            decode(with_header(frames, bad))
    raw = [b"", b"\xc1", b"\x91", frames[0] + b"\x00", frames[0][:-1], msgpack.packb({1: 2}), msgpack.packb(1.5)]
    for blob in raw:
        with pytest.raises(MalformedMessage):
            decode([blob])


def test_malformed_typed_fields() -> None:
    def tel(**over: Any) -> list[bytes]:
        base = {"service": "s", "instance": "i", "seq": 1, "time": 0.0}
        return build("telemetry", {**base, **over}, [])

    assert isinstance(decode(tel()), Telemetry)
    for over in ({"service": 1}, {"service": None}, {"counters": [1.0]}, {"counters": {"a": "1"}},
                 {"counters": {"a": True}}, {"info": {"a": 1}}, {"info": "x"}, {"time": math.nan}):
        with pytest.raises(MalformedMessage):
            decode(tel(**over))
    ctl = {"seq": 1, "command": "c", "target": "*"}
    for args in ({"a": None}, {"a": [1]}, {"a": {"b": 1}}):
        with pytest.raises(MalformedMessage):
            decode(build("control", {**ctl, "args": args}, []))
    for release in (1, "true", None):
        with pytest.raises(MalformedMessage):
            decode(build("lease_request", {"instance": "a", "release": release}, []))


def test_malformed_array_specs() -> None:
    frames = build("transitions", TB_SCALARS, tb_arrays())
    header = header_of(frames)
    for specs in (
        [*header["a"][:-1], ["next_obs", "float32"]],
        [*header["a"][:-1], ["next_obs", "float32", [3, 4], 1]],
        [*header["a"][:-1], "next_obs"],
        [*header["a"][:-1], [1, "float32", [3, 4]]],
        [*header["a"][:-1], ["next_obs", 5, [3, 4]]],
        [*header["a"][:-1], ["next_obs", "float32", 12]],
        [*header["a"][:-1], ["bogus", "float32", [3, 4]]],  # unknown array name
        [*header["a"][:-1], header["a"][0]],  # duplicate name
    ):
        with pytest.raises(MalformedMessage):
            decode(with_header(frames, {**header, "a": specs}))
    with pytest.raises(MalformedMessage):  # a required array missing
        decode([with_header(frames, {**header, "a": header["a"][:-1]})[0], *frames[1:-1]])
    with pytest.raises(MalformedMessage):  # more frames than announced
        decode([*frames, b""])
    dup = build("weights", {"version": 1, "network": "n"}, [("t", np.zeros(1, np.float32))] * 2)
    with pytest.raises(MalformedMessage):
        decode(dup)


@FUZZ
@given(blob=st.binary(max_size=200))
def test_random_header_bytes_never_escape(blob: bytes) -> None:
    _check_outcome([blob])
    try:
        peek_kind([blob])
    except DecodeError:
        pass


# --------------------------------------------------------------------------------------------- fuzzing

junk = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=8)
    | st.sampled_from(["transitions", "weights", "float32", "uint8", "int64", "obs", "action", b""]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4) | st.just(b""), inner, max_size=4),
    max_leaves=8,
)


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(node, dict):
        for key, value in node.items():
            out.extend(_paths(value, (*prefix, key)))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            out.extend(_paths(value, (*prefix, i)))
    return out


def _replace(node: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(node, dict):
        return {**node, head: _replace(node[head], rest, value)}
    return [_replace(v, rest, value) if i == head else v for i, v in enumerate(node)]


def _mutate_frames(data: st.DataObject, frames: list[bytes]) -> list[bytes]:
    frames = list(frames)
    for _ in range(data.draw(st.integers(1, 3))):
        op = data.draw(st.sampled_from(["flip", "set", "truncate", "extend", "drop", "dup", "insert", "swap"]))
        i = data.draw(st.integers(0, max(len(frames) - 1, 0)))
        if not frames and op != "insert":
            continue
        if op in ("flip", "set") and frames[i]:
            j = data.draw(st.integers(0, len(frames[i]) - 1))
            byte = frames[i][j] ^ (1 << data.draw(st.integers(0, 7))) if op == "flip" else data.draw(
                st.integers(0, 255))
            frames[i] = frames[i][:j] + bytes([byte]) + frames[i][j + 1:]
        elif op == "truncate":
            frames[i] = frames[i][: data.draw(st.integers(0, len(frames[i])))]
        elif op == "extend":
            frames[i] = frames[i] + data.draw(st.binary(min_size=1, max_size=16))
        elif op == "drop":
            del frames[i]
        elif op == "dup":
            frames.insert(i, frames[i])
        elif op == "insert":
            frames.insert(i, data.draw(st.binary(max_size=16)))
        elif op == "swap" and len(frames) > 1:
            k = data.draw(st.integers(0, len(frames) - 1))
            frames[i], frames[k] = frames[k], frames[i]
    return frames


def _check_outcome(frames: list[Any], limits: Limits = DEFAULT_LIMITS) -> None:
    """Decoding either yields a valid, read-only message that survives re-encoding, or a typed DecodeError."""
    try:
        msg = decode(frames, limits=limits)
    except DecodeError as exc:
        assert exc.fault in FAULTS
        return
    assert isinstance(msg, Message)
    msg.validate()
    assert_read_only(msg)
    # Re-encoding may grow the header (e.g. float32 -> float64), so only that limit is relaxed.
    relaxed = dataclasses.replace(limits, max_header_bytes=DEFAULT_LIMITS.max_header_bytes)
    assert_same_message(decode(encode(msg), limits=relaxed), msg)


@FUZZ
@given(msg=any_message, data=st.data())
def test_fuzz_byte_and_frame_mutations(msg: Message, data: st.DataObject) -> None:
    frames = _mutate_frames(data, as_bytes(encode(msg)))
    _check_outcome(frames)
    _check_outcome(frames, Limits(max_header_bytes=256, max_array_bytes=64, max_total_bytes=128, max_arrays=4,
                                  max_dim=4, max_str=8, max_map_entries=2))


@FUZZ
@given(msg=any_message, data=st.data())
def test_fuzz_header_structure(msg: Message, data: st.DataObject) -> None:
    frames = as_bytes(encode(msg))
    header = header_of(frames)
    for _ in range(data.draw(st.integers(1, 2))):
        path = data.draw(st.sampled_from(_paths(header)))
        header = _replace(header, path, data.draw(junk))
    _check_outcome(with_header(frames, header))


def test_module_exports() -> None:
    assert set(proto.__all__) >= {"decode", "encode", "peek_kind", "Limits", "DecodeError", "FAULTS"}


def test_scalar_tags_are_read_off_the_field_annotations() -> None:
    """Each message's scalar fields carry their codec tag from their own annotation; arrays and ClassVars are not
    scalars; a field type the codec cannot carry fails when the class is made, naming the field."""
    from dataclasses import dataclass as make_dataclass

    from flywheel.proto import schema

    assert proto.Telemetry.SCALARS == {"service": "str", "instance": "str", "seq": "int", "time": "float",
                                       "counters": "float_map", "gauges": "float_map", "info": "str_map"}
    assert proto.TransitionBatch.SCALARS == {"actor": "str", "weight_version": "int", "seq": "int"}
    assert proto.PriorityUpdate.SCALARS == {}  # arrays only
    assert "args" in proto.Control.SCALARS and proto.Control.SCALARS["args"] == "scalar_map"

    @make_dataclass
    class Probe(schema.Message):
        KIND: ClassVar[str] = "probe"
        ARRAYS: ClassVar[dict[str, schema.ArraySpec]] = {"data": schema.BATCH_F32}
        name: str
        data: np.ndarray
        ratio: float = 0.5

    assert Probe.SCALARS == {"name": "str", "ratio": "float"}

    with pytest.raises(TypeError, match=r"Bad\.when: list\[int\] is not a type the codec carries"):
        class Bad(schema.Message):
            KIND: ClassVar[str] = "bad"
            when: list[int]
