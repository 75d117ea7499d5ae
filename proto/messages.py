"""Typed wire messages: one dataclass per kind, with the schema every decoder enforces."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from .errors import BadShape

SCHEMA_VERSION = 1

# Scalar type tags understood by the codec.
INT, FLOAT, STR, BOOL, FLOAT_MAP, STR_MAP, SCALAR_MAP = (
    "int", "float", "str", "bool", "float_map", "str_map", "scalar_map",
)


@dataclass(frozen=True)
class ArraySpec:
    """What an array field may look like on the wire."""

    dtypes: tuple[str, ...]
    min_ndim: int = 1
    max_ndim: int = 1
    optional: bool = False


@dataclass
class Message:
    """Base class: subclasses declare KIND, SCALARS and ARRAYS (or DYNAMIC_ARRAYS)."""

    KIND: ClassVar[str] = ""
    SCALARS: ClassVar[dict[str, str]] = {}
    ARRAYS: ClassVar[dict[str, ArraySpec]] = {}
    # When set, arrays are free-named entries of this dict attribute, each checked against the spec.
    DYNAMIC_ARRAYS: ClassVar[tuple[str, ArraySpec] | None] = None

    def validate(self) -> None:
        """Cross-field checks after decoding (and before encoding); raise BadShape."""


PIXELS_OR_VECTORS = ArraySpec(("uint8", "float32"), 2, 4)
BATCH_F32 = ArraySpec(("float32",))
BATCH_I64 = ArraySpec(("int64",))


def _batch_size(msg: Message, names: tuple[str, ...]) -> int:
    sizes = {name: getattr(msg, name).shape[0] for name in names if getattr(msg, name) is not None}
    distinct = set(sizes.values())
    if len(distinct) != 1:
        raise BadShape(f"{msg.KIND}: arrays disagree on batch size: {sizes}")
    size = distinct.pop()
    if size < 1:
        raise BadShape(f"{msg.KIND}: empty batch")
    return size


def _same_obs(msg: Message) -> None:
    obs, next_obs = msg.obs, msg.next_obs  # type: ignore[attr-defined]
    if obs.shape != next_obs.shape or obs.dtype != next_obs.dtype:
        raise BadShape(
            f"{msg.KIND}: obs {obs.dtype}{obs.shape} and next_obs {next_obs.dtype}{next_obs.shape} differ"
        )


@dataclass
class TransitionBatch(Message):
    """Actor -> replay: n-step transitions with the weight version that produced them."""

    KIND: ClassVar[str] = "transitions"
    SCALARS: ClassVar[dict[str, str]] = {"actor": STR, "weight_version": INT, "seq": INT}
    ARRAYS: ClassVar[dict[str, ArraySpec]] = {
        "obs": PIXELS_OR_VECTORS,
        "action": BATCH_I64,
        "reward": BATCH_F32,
        "discount": BATCH_F32,
        "next_obs": PIXELS_OR_VECTORS,
        "priority": ArraySpec(("float32",), optional=True),
        "stream": ArraySpec(("int64",), optional=True),
    }
    actor: str
    weight_version: int
    seq: int
    obs: np.ndarray
    action: np.ndarray
    reward: np.ndarray
    discount: np.ndarray
    next_obs: np.ndarray
    priority: np.ndarray | None = None
    # The actor's environment slot of each row: (actor, stream) names one sequence of consecutive env steps,
    # which lets replay store each frame of a stack once. Absent: replay stores every stack whole.
    stream: np.ndarray | None = None

    def validate(self) -> None:
        _batch_size(self, ("obs", "action", "reward", "discount", "next_obs", "priority", "stream"))
        _same_obs(self)

    def __len__(self) -> int:
        return int(self.action.shape[0])


@dataclass
class SampleRequest(Message):
    """Learner -> replay: ask for one batch; replies carry the same request_id."""

    KIND: ClassVar[str] = "sample_request"
    SCALARS: ClassVar[dict[str, str]] = {"request_id": INT, "batch_size": INT, "beta": FLOAT}
    request_id: int
    batch_size: int
    beta: float = 0.4

    def validate(self) -> None:
        if not 1 <= self.batch_size <= 65536:
            raise BadShape(f"sample_request: batch_size {self.batch_size} outside 1..65536")
        if not 0.0 <= self.beta <= 1.0:
            raise BadShape(f"sample_request: beta {self.beta} outside [0, 1]")


@dataclass
class SampleBatch(Message):
    """Replay -> learner: a ready-to-use batch with replay indices and importance weights."""

    KIND: ClassVar[str] = "sample_batch"
    SCALARS: ClassVar[dict[str, str]] = {"request_id": INT, "replay_size": INT}
    ARRAYS: ClassVar[dict[str, ArraySpec]] = {
        "obs": PIXELS_OR_VECTORS,
        "action": BATCH_I64,
        "reward": BATCH_F32,
        "discount": BATCH_F32,
        "next_obs": PIXELS_OR_VECTORS,
        "index": BATCH_I64,
        "weight": BATCH_F32,
    }
    request_id: int
    replay_size: int
    obs: np.ndarray
    action: np.ndarray
    reward: np.ndarray
    discount: np.ndarray
    next_obs: np.ndarray
    index: np.ndarray
    weight: np.ndarray

    def validate(self) -> None:
        _batch_size(self, ("obs", "action", "reward", "discount", "next_obs", "index", "weight"))
        _same_obs(self)


@dataclass
class PriorityUpdate(Message):
    """Learner -> replay: new priorities for sampled indices."""

    KIND: ClassVar[str] = "priorities"
    ARRAYS: ClassVar[dict[str, ArraySpec]] = {"index": BATCH_I64, "priority": BATCH_F32}
    index: np.ndarray
    priority: np.ndarray

    def validate(self) -> None:
        _batch_size(self, ("index", "priority"))


@dataclass
class Weights(Message):
    """Learner -> actors: a full set of network parameters with a strictly increasing version."""

    KIND: ClassVar[str] = "weights"
    SCALARS: ClassVar[dict[str, str]] = {"version": INT, "network": STR}
    DYNAMIC_ARRAYS: ClassVar[tuple[str, ArraySpec] | None] = (
        "tensors", ArraySpec(("float32", "float16", "int64"), 0, 4),
    )
    version: int
    network: str
    tensors: dict[str, np.ndarray] = field(default_factory=dict)

    def validate(self) -> None:
        if self.version < 0:
            raise BadShape(f"weights: negative version {self.version}")


@dataclass
class Telemetry(Message):
    """Any service -> gateway: cumulative counters, gauges and info of one instance."""

    KIND: ClassVar[str] = "telemetry"
    SCALARS: ClassVar[dict[str, str]] = {
        "service": STR, "instance": STR, "seq": INT, "time": FLOAT,
        "counters": FLOAT_MAP, "gauges": FLOAT_MAP, "info": STR_MAP,
    }
    service: str
    instance: str
    seq: int
    time: float
    counters: dict[str, float] = field(default_factory=dict)
    gauges: dict[str, float] = field(default_factory=dict)
    info: dict[str, str] = field(default_factory=dict)


@dataclass
class Control(Message):
    """Gateway -> services: a command for a service kind ("*" for all) or one instance."""

    KIND: ClassVar[str] = "control"
    SCALARS: ClassVar[dict[str, str]] = {"seq": INT, "command": STR, "target": STR, "args": SCALAR_MAP}
    seq: int
    command: str
    target: str = "*"
    args: dict[str, Any] = field(default_factory=dict)


@dataclass
class LeaseRequest(Message):
    """Actor -> gateway: claim or renew (or release) an exploration slot."""

    KIND: ClassVar[str] = "lease_request"
    SCALARS: ClassVar[dict[str, str]] = {"instance": STR, "release": BOOL}
    instance: str
    release: bool = False


@dataclass
class LeaseReply(Message):
    """Gateway -> actor: slot ``index`` of ``count`` live actors, valid for ``ttl`` seconds."""

    KIND: ClassVar[str] = "lease_reply"
    SCALARS: ClassVar[dict[str, str]] = {"instance": STR, "index": INT, "count": INT, "ttl": FLOAT}
    instance: str
    index: int
    count: int
    ttl: float

    def validate(self) -> None:
        if not 0 <= self.index < max(self.count, 1):
            raise BadShape(f"lease_reply: index {self.index} outside 0..{self.count - 1}")


MESSAGE_TYPES: dict[str, type[Message]] = {
    cls.KIND: cls
    for cls in (
        TransitionBatch, SampleRequest, SampleBatch, PriorityUpdate, Weights, Telemetry, Control,
        LeaseRequest, LeaseReply,
    )
}
