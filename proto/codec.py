"""The one codec: msgpack header frame plus raw, zero-copy array frames, validated against limits."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import MISSING, dataclass, fields
from typing import Any, TypeVar, overload

import msgpack
import numpy as np

from .errors import (
    BadDtype,
    BadShape,
    DecodeError,
    MalformedMessage,
    OversizedMessage,
    TruncatedMessage,
    UnknownKind,
    VersionMismatch,
    WrongKind,
)
from .messages import MESSAGE_TYPES
from .schema import BOOL, FLOAT, FLOAT_MAP, INT, SCALAR_MAP, STR, STR_MAP, ArraySpec, Message

Frame = Any  # bytes, memoryview, numpy array or zmq.Frame
_ALLOWED_DTYPES = {"uint8", "int64", "float32", "float16"}
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


@dataclass(frozen=True)
class Limits:
    """Upper bounds checked before any data is touched."""

    max_header_bytes: int = 64 * 1024
    max_array_bytes: int = 512 * 1024 * 1024
    max_total_bytes: int = 1024 * 1024 * 1024
    max_arrays: int = 512
    max_dim: int = 1 << 24
    max_str: int = 256
    max_map_entries: int = 1024


DEFAULT_LIMITS = Limits()


def _buffer(frame: Frame) -> memoryview:
    buf = getattr(frame, "buffer", None)  # zmq.Frame
    return buf if buf is not None else memoryview(frame)


def encode(msg: Message) -> list[Frame]:
    """Encode a message as [header, array frames...]; arrays are sent as-is when contiguous."""
    msg.validate()
    scalars = {name: _encode_scalar(getattr(msg, name), tag) for name, tag in msg.SCALARS.items()}
    specs: list[list[Any]] = []
    frames: list[Frame] = []
    for name, array in _arrays_of(msg):
        array = np.asarray(array, order="C")  # not ascontiguousarray: that turns 0-d arrays into shape (1,)
        if array.dtype.byteorder == ">":
            array = array.astype(array.dtype.newbyteorder("<"))
        specs.append([name, array.dtype.name, list(array.shape)])
        frames.append(array)
    header = msgpack.packb({"k": msg.KIND, "v": msg.VERSION, "f": scalars, "a": specs}, use_bin_type=True)
    return [header, *frames]


def _encode_scalar(value: Any, tag: str) -> Any:
    if tag == FLOAT_MAP:
        return {str(k): float(v) for k, v in value.items()}
    if tag == STR_MAP:
        return {str(k): str(v) for k, v in value.items()}
    if tag == FLOAT:
        return float(value)
    if tag == INT:
        return int(value)
    return value


def _arrays_of(msg: Message) -> list[tuple[str, np.ndarray]]:
    if msg.DYNAMIC_ARRAYS is not None:
        attr, _ = msg.DYNAMIC_ARRAYS
        return list(getattr(msg, attr).items())
    return [(name, getattr(msg, name)) for name in msg.ARRAYS if getattr(msg, name) is not None]


def peek_kind(frames: Sequence[Frame], limits: Limits = DEFAULT_LIMITS) -> str:
    """Return the kind named in the header without decoding arrays (raises DecodeError)."""
    return str(_header(frames, limits)["k"])


M = TypeVar("M", bound=Message)
N = TypeVar("N", bound=Message)


@overload
def decode(frames: Sequence[Frame], expect: type[M], limits: Limits = DEFAULT_LIMITS) -> M: ...


@overload
def decode(frames: Sequence[Frame], expect: tuple[type[M], type[N]], limits: Limits = DEFAULT_LIMITS) -> M | N: ...


@overload
def decode(frames: Sequence[Frame], expect: tuple[type[Message], ...] | None = None,
           limits: Limits = DEFAULT_LIMITS) -> Message: ...


def decode(
    frames: Sequence[Frame],
    expect: type[Message] | tuple[type[Message], ...] | None = None,
    limits: Limits = DEFAULT_LIMITS,
) -> Message:
    """Decode and validate a multipart message; arrays are read-only views of the frames.

    With one expected class, ``decode(frames, proto.Weights)`` is typed as returning that class, with two,
    ``decode(frames, (proto.Telemetry, proto.ClipChunk))``, as returning either; any other kind raises WrongKind.
    """
    header = _header(frames, limits)
    cls = MESSAGE_TYPES[header["k"]]
    if expect is not None:
        allowed = expect if isinstance(expect, tuple) else (expect,)
        if cls not in allowed:
            names = ", ".join(c.KIND for c in allowed)
            raise WrongKind(f"got a {cls.KIND!r} message where {names} was expected")
    values = _scalars(cls, header["f"], limits)
    arrays = _arrays(cls, header["a"], frames[1:], limits)
    if cls.DYNAMIC_ARRAYS is not None:
        values[cls.DYNAMIC_ARRAYS[0]] = arrays
    else:
        for name, spec in cls.ARRAYS.items():
            if name not in arrays and not spec.optional:
                raise MalformedMessage(f"{cls.KIND}: array {name!r} missing")
        values.update(arrays)
    try:
        msg = cls(**values)
    except TypeError as exc:  # pragma: no cover - guarded by the checks above
        raise MalformedMessage(f"{cls.KIND}: {exc}") from None
    msg.validate()
    return msg


def _header(frames: Sequence[Frame], limits: Limits) -> dict[str, Any]:
    if len(frames) == 0:
        raise TruncatedMessage("empty message: no header frame")
    raw = _buffer(frames[0])
    if raw.nbytes > limits.max_header_bytes:
        raise OversizedMessage(f"header of {raw.nbytes} bytes exceeds {limits.max_header_bytes}")
    try:
        header = msgpack.unpackb(
            raw, raw=False, strict_map_key=True, max_str_len=limits.max_header_bytes,
            max_bin_len=0, max_array_len=limits.max_arrays * 4 + 16, max_map_len=limits.max_map_entries + 16,
        )
    except Exception as exc:  # msgpack raises several unrelated types on garbage
        raise MalformedMessage(f"header is not valid msgpack: {type(exc).__name__}") from None
    if not isinstance(header, dict) or set(header) != {"k", "v", "f", "a"}:
        raise MalformedMessage("header must be a map with exactly the keys k, v, f, a")
    kind, version = header["k"], header["v"]
    if not isinstance(kind, str) or kind not in MESSAGE_TYPES:
        raise UnknownKind(f"unknown message kind {str(kind)[:40]!r}")
    speaks = MESSAGE_TYPES[kind].VERSION
    if not isinstance(version, int) or isinstance(version, bool) or version != speaks:
        raise VersionMismatch(f"{kind}: schema version {version!r}, this build speaks {speaks}")
    if not isinstance(header["f"], dict) or not isinstance(header["a"], list):
        raise MalformedMessage(f"{kind}: header fields must be a map and arrays a list")
    return header


def _scalars(cls: type[Message], raw: dict[str, Any], limits: Limits) -> dict[str, Any]:
    extra = set(raw) - set(cls.SCALARS)
    if extra:
        raise MalformedMessage(f"{cls.KIND}: unexpected fields {sorted(map(repr, extra))[:5]}")
    optional = {f.name for f in fields(cls) if f.default is not MISSING or f.default_factory is not MISSING}
    out: dict[str, Any] = {}
    for name, tag in cls.SCALARS.items():
        if name not in raw:
            if name in optional:
                continue
            raise MalformedMessage(f"{cls.KIND}: field {name!r} missing")
        out[name] = _check_scalar(cls.KIND, name, raw[name], tag, limits)
    return out


def _check_scalar(kind: str, name: str, value: Any, tag: str, limits: Limits) -> Any:
    def bad(expected: str) -> MalformedMessage:
        return MalformedMessage(f"{kind}: field {name!r} must be {expected}, got {type(value).__name__}")

    if tag == INT:
        if not isinstance(value, int) or isinstance(value, bool) or not _INT64_MIN <= value <= _INT64_MAX:
            raise bad("an int64")
        return value
    if tag == FLOAT:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad("a number")
        value = float(value)
        if math.isnan(value):
            raise bad("a number, not NaN")
        return value
    if tag == BOOL:
        if not isinstance(value, bool):
            raise bad("a bool")
        return value
    if tag == STR:
        if not isinstance(value, str):
            raise bad("a string")
        if len(value) > limits.max_str:
            raise OversizedMessage(f"{kind}: field {name!r} longer than {limits.max_str} characters")
        return value
    if tag in (FLOAT_MAP, STR_MAP, SCALAR_MAP):
        if not isinstance(value, dict):
            raise bad("a map")
        if len(value) > limits.max_map_entries:
            raise OversizedMessage(f"{kind}: field {name!r} has more than {limits.max_map_entries} entries")
        out: dict[str, Any] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise bad("a map with string keys")
            if len(key) > limits.max_str or (isinstance(item, str) and len(item) > limits.max_str):
                raise OversizedMessage(f"{kind}: field {name!r} has a string longer than {limits.max_str} characters")
            if tag == FLOAT_MAP:
                if isinstance(item, bool) or not isinstance(item, (int, float)):
                    raise bad("a map of numbers")
                out[key] = float(item)
            elif tag == STR_MAP:
                if not isinstance(item, str):
                    raise bad("a map of strings")
                out[key] = item
            else:
                if not isinstance(item, (int, float, str, bool)):
                    raise bad("a map of numbers, bools or strings")
                out[key] = item
        return out
    raise MalformedMessage(f"{kind}: field {name!r} has unknown type tag {tag}")  # pragma: no cover


def _arrays(
    cls: type[Message], specs: list[Any], frames: Sequence[Frame], limits: Limits,
) -> dict[str, np.ndarray]:
    if len(specs) > limits.max_arrays:
        raise OversizedMessage(f"{cls.KIND}: {len(specs)} arrays exceed {limits.max_arrays}")
    if len(frames) < len(specs):
        raise TruncatedMessage(f"{cls.KIND}: header announces {len(specs)} arrays, got {len(frames)} frames")
    if len(frames) > len(specs):
        raise MalformedMessage(f"{cls.KIND}: {len(frames)} array frames for {len(specs)} announced arrays")
    arrays: dict[str, np.ndarray] = {}
    total = 0
    for entry, frame in zip(specs, frames, strict=True):
        if not (isinstance(entry, list) and len(entry) == 3 and isinstance(entry[0], str)
                and isinstance(entry[1], str) and isinstance(entry[2], list)):
            raise MalformedMessage(f"{cls.KIND}: array spec must be [name, dtype, shape]")
        name, dtype_name, shape = entry
        if len(name) > limits.max_str:
            raise OversizedMessage(f"{cls.KIND}: array name {name[:40]!r} longer than {limits.max_str} characters")
        if name in arrays:
            raise MalformedMessage(f"{cls.KIND}: duplicate array name {name[:40]!r}")
        spec = _spec_for(cls, name)
        if dtype_name not in _ALLOWED_DTYPES or dtype_name not in spec.dtypes:
            raise BadDtype(f"{cls.KIND}: array {name!r} has dtype {dtype_name[:20]!r}, allowed {spec.dtypes}")
        if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
            raise BadShape(f"{cls.KIND}: array {name!r} shape must be non-negative ints")
        if not spec.min_ndim <= len(shape) <= spec.max_ndim:
            raise BadShape(
                f"{cls.KIND}: array {name!r} has rank {len(shape)}, allowed {spec.min_ndim}..{spec.max_ndim}"
            )
        if any(d > limits.max_dim for d in shape):
            raise OversizedMessage(f"{cls.KIND}: array {name!r} dimension exceeds {limits.max_dim}")
        dtype = np.dtype(dtype_name)
        expected = math.prod(shape) * dtype.itemsize
        if expected > limits.max_array_bytes:
            raise OversizedMessage(f"{cls.KIND}: array {name!r} of {expected} bytes exceeds the limit")
        total += expected
        if total > limits.max_total_bytes:
            raise OversizedMessage(f"{cls.KIND}: message exceeds {limits.max_total_bytes} bytes")
        buf = _buffer(frame)
        if buf.nbytes < expected:
            raise TruncatedMessage(f"{cls.KIND}: array {name!r} has {buf.nbytes} bytes, header says {expected}")
        if buf.nbytes > expected:
            raise OversizedMessage(f"{cls.KIND}: array {name!r} has {buf.nbytes} bytes, header says {expected}")
        array = np.frombuffer(buf, dtype=dtype).reshape(shape)
        array.flags.writeable = False
        arrays[name] = array
    return arrays


def _spec_for(cls: type[Message], name: str) -> ArraySpec:
    if cls.DYNAMIC_ARRAYS is not None:
        return cls.DYNAMIC_ARRAYS[1]
    spec = cls.ARRAYS.get(name)
    if spec is None:
        raise MalformedMessage(f"{cls.KIND}: unexpected array {name[:40]!r}")
    return spec


__all__ = ["DEFAULT_LIMITS", "DecodeError", "Limits", "decode", "encode", "peek_kind"]
