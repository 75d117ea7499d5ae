"""Typed wire messages: one dataclass per kind, with the schema every decoder enforces (transitions: transition.py)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from .errors import BadShape, OversizedMessage
from .packing import CODEC, MAX_EXPANDED_BYTES, MAX_UNPACKED_BYTES, parse_shape, unpack_frames
from .schema import (
    BATCH_F32,
    BATCH_I64,
    BOOL,
    FLOAT,
    FLOAT_MAP,
    INT,
    SCALAR_MAP,
    STR,
    STR_MAP,
    ArraySpec,
    Message,
    batch_size,
)
from .transition import TRANSITION_ARRAYS, TRANSITION_NAMES, Transition, TransitionBatch, check_observations


@dataclass
class SampleRequest(Message):
    """Learner -> replay: ask for one batch; replies carry the same request_id."""

    KIND: ClassVar[str] = "sample_request"
    request_id: int
    batch_size: int
    beta: float = 0.4
    # Same-host fast path (services/replay/client.py): ``shm`` says the client can read shared memory;
    # ``shm_segment`` names the segment it has attached (replies may then use its slots); ``release_slot``
    # hands back a slot of that segment it has finished reading (-1: none); ``slots`` is how many slots it
    # holds at most (its requests in flight; 0: the replay's default).
    shm: bool = False
    shm_segment: str = ""
    release_slot: int = -1
    slots: int = 0
    # The client rebuilds pixel stacks from distinct frames: socket replies of a frame-deduplicating replay may
    # then come in the compact form (SampleBatch.frames). Absent (old clients): whole stacks, as before.
    compact: bool = False
    # With ``compact``, the client can also unpack LZ4-packed frames (SampleBatch.packed): a replay that keeps its
    # frames packed (frame_packing=lz4) then sends those, several times fewer bytes. Absent: unpacked frames.
    packed: bool = False

    def validate(self) -> None:
        if not 1 <= self.batch_size <= 65536:
            raise BadShape(f"sample_request: batch_size {self.batch_size} outside 1..65536")
        if not 0.0 <= self.beta <= 1.0:
            raise BadShape(f"sample_request: beta {self.beta} outside [0, 1]")
        if not -1 <= self.release_slot <= 4096 or not 0 <= self.slots <= 256:
            raise BadShape(f"sample_request: release_slot {self.release_slot} or slots {self.slots} out of range")


@dataclass
class SampleBatch(Transition[np.ndarray], Message):
    """Replay -> learner: a ready-to-use batch with replay indices and importance weights."""

    KIND: ClassVar[str] = "sample_batch"
    ARRAYS: ClassVar[dict[str, ArraySpec]] = {
        **TRANSITION_ARRAYS,
        "index": BATCH_I64,
        "weight": BATCH_F32,
        "is_demo": ArraySpec(("uint8",), optional=True),
        "frames": ArraySpec(("uint8",), 3, 3, optional=True),
        "obs_idx": ArraySpec(("int64",), 1, 2, optional=True),
        "next_idx": ArraySpec(("int64",), 1, 2, optional=True),
        "packed": ArraySpec(("uint8",), optional=True),
        "packed_sizes": ArraySpec(("int64",), optional=True),
    }
    request_id: int
    replay_size: int
    index: np.ndarray
    weight: np.ndarray
    # 1 for rows drawn from the demonstrations table (DQfD); None means no row is a demonstration.
    is_demo: np.ndarray | None = None
    # The replay's shared-memory path (services/replay/client.py): {"segment", "size", "token"} offers a
    # segment; with "slot" >= 0 (and "offset", "next_offset", "dtype", "shape") the observations are in that
    # slot and obs/next_obs travel as empty (B, 0) placeholders. Empty for an ordinary reply.
    shm: dict[str, Any] = field(default_factory=dict)
    # The compact form of a pixel batch (asked for with SampleRequest.compact): each distinct frame once,
    # ``frames`` (F, H, W), and per row the frames of its stacks, ``obs_idx``/``next_idx`` (B, K) (or (B,) for
    # single-frame observations); obs/next_obs travel as (B, 0) placeholders. ``expand_frames`` rebuilds them.
    frames: np.ndarray | None = None
    obs_idx: np.ndarray | None = None
    next_idx: np.ndarray | None = None
    # The packed compact form (asked for with SampleRequest.packed): the distinct frames as LZ4 blocks one after
    # another in ``packed``, their sizes in ``packed_sizes`` (F,) (a frame's own size: stored as is), and
    # ``packing`` = {"codec": "lz4", "shape": "84,84"}; ``frames`` is then absent (proto/packing.py).
    packing: dict[str, Any] = field(default_factory=dict)
    packed: np.ndarray | None = None
    packed_sizes: np.ndarray | None = None

    def validate(self) -> None:
        batch_size(self, (*TRANSITION_NAMES, "index", "weight", "is_demo", "obs_idx", "next_idx"))
        check_observations(self)
        slot = self.shm.get("slot", -1)
        placeholders = self.obs.shape[1:] == (0,) and self.next_obs.shape[1:] == (0,)
        in_slot = isinstance(slot, int) and slot >= 0
        if in_slot and not placeholders:
            raise BadShape("sample_batch: a shared-memory reply carries (B, 0) observation placeholders")
        if self.packed is not None or self.packed_sizes is not None or self.packing:
            self._check_packed()
        if (self.frames is not None or self.packed is not None or self.obs_idx is not None
                or self.next_idx is not None):
            self._check_frame_refs(placeholders and not in_slot)

    def _check_packed(self) -> None:
        packed, sizes = self.packed, self.packed_sizes
        if packed is None or sizes is None or self.frames is not None:
            raise BadShape("sample_batch: packed, packed_sizes and packing come together, without frames")
        if self.packing.get("codec") != CODEC:
            raise BadShape(f"sample_batch: packing codec {self.packing.get('codec')!r}, only {CODEC!r} is known")
        frame_bytes = int(np.prod(parse_shape(self.packing.get("shape"))))
        if sizes.size and (int(sizes.min()) < 1 or int(sizes.max()) > frame_bytes):
            raise BadShape(f"sample_batch: a packed frame size outside 1..{frame_bytes}")
        if sizes.size * frame_bytes > MAX_UNPACKED_BYTES:
            raise BadShape(f"sample_batch: {sizes.size} packed frames of {frame_bytes} bytes unpack to more than "
                           f"{MAX_UNPACKED_BYTES >> 20} MiB")
        if int(sizes.sum(dtype=np.int64)) != packed.size:
            raise BadShape(f"sample_batch: packed frame sizes add up to {int(sizes.sum(dtype=np.int64))}, "
                           f"{packed.size} bytes came")

    def _frame_count(self) -> int:
        if self.frames is not None:
            return int(self.frames.shape[0])
        return int(self.packed_sizes.shape[0]) if self.packed_sizes is not None else 0

    def _check_frame_refs(self, placeholders: bool) -> None:
        obs_idx, next_idx = self.obs_idx, self.next_idx
        if (self.frames is None and self.packed is None) or obs_idx is None or next_idx is None:
            raise BadShape("sample_batch: frames (or packed frames), obs_idx and next_idx come together")
        if not placeholders:
            raise BadShape("sample_batch: a compact reply carries (B, 0) observation placeholders and no slot")
        if obs_idx.shape != next_idx.shape or (obs_idx.ndim == 2 and not 1 <= obs_idx.shape[1] <= 64):
            raise BadShape(f"sample_batch: obs_idx {obs_idx.shape} and next_idx {next_idx.shape} differ or are "
                           "deeper than 64 frames")
        count = self._frame_count()
        if not 1 <= count <= 2 * obs_idx.size:
            raise BadShape(f"sample_batch: {count} frames for {obs_idx.size} stack references")
        for refs in (obs_idx, next_idx):
            if int(refs.min()) < 0 or int(refs.max()) >= count:
                raise BadShape(f"sample_batch: frame index outside 0..{count - 1}")
        if self.expanded_bytes() > MAX_EXPANDED_BYTES:  # a few KB of indices must not ask for GiBs of stacks
            raise OversizedMessage(f"sample_batch: expands to {self.expanded_bytes()} bytes, more than "
                                   f"{MAX_EXPANDED_BYTES >> 20} MiB")

    def expanded_shape(self) -> tuple[int, ...] | None:
        """The shape obs and next_obs of a compact batch take once expanded, (B, K, H, W) or (B, H, W); else None."""
        if self.obs_idx is None or (self.frames is None and self.packed is None):
            return None
        frame = self.frames.shape[1:] if self.frames is not None else parse_shape(self.packing.get("shape"))
        return (*self.obs_idx.shape, *frame)

    def expanded_bytes(self) -> int:
        """What ``expand_frames`` allocates (the stacks, and the unpacked frames of a packed batch), from the shapes
        alone: receivers check it against their limits before expanding (0 for other batches)."""
        shape, refs = self.expanded_shape(), self.obs_idx
        if shape is None or refs is None:
            return 0
        frame_bytes = math.prod(shape[refs.ndim:])
        return 2 * math.prod(shape) + (self._frame_count() * frame_bytes if self.packed is not None else 0)

    def expand_frames(self, scratch: np.ndarray | None = None) -> None:
        """Rebuild obs/next_obs of a compact batch with one gather of its frames (a no-op for other batches);
        packed frames are first unpacked, into ``scratch`` when it is a large enough uint8 buffer. Raises
        MalformedMessage when a packed frame does not decompress to one frame."""
        if self.packed is not None and self.packed_sizes is not None:
            self.frames = unpack_frames(self.packed, self.packed_sizes, parse_shape(self.packing["shape"]), scratch)
            self.packed = self.packed_sizes = None
            self.packing = {}
        if self.frames is None or self.obs_idx is None or self.next_idx is None:
            return
        rows = self.obs_idx.shape[0]
        stacks = np.take(self.frames, np.concatenate((self.obs_idx, self.next_idx)), axis=0)
        self.obs, self.next_obs = stacks[:rows], stacks[rows:]
        self.frames = self.obs_idx = self.next_idx = None

    def demo_mask(self) -> np.ndarray:
        """Boolean mask of the rows that are demonstrations (all False when ``is_demo`` is absent)."""
        if self.is_demo is None:
            return np.zeros(self.action.shape[0], dtype=bool)
        return self.is_demo.astype(bool)


_REASON = re.compile(r"^[a-z][a-z_]{0,31}$")


@dataclass
class SampleRefused(Message):
    """Replay -> learner: a request the replay will not serve (``reason``, the fault it counted: ``batch_size`` when
    above its max_batch_size, then in ``limit``), so the client need not wait for it; old clients count a wrong kind."""

    KIND: ClassVar[str] = "sample_refused"
    request_id: int
    reason: str
    detail: str = ""
    limit: int = 0

    def validate(self) -> None:
        if not _REASON.match(self.reason):
            raise BadShape(f"sample_refused: reason {self.reason[:40]!r} is not a fault name")


@dataclass
class PriorityUpdate(Message):
    """Learner -> replay: new priorities for sampled indices."""

    KIND: ClassVar[str] = "priorities"
    ARRAYS: ClassVar[dict[str, ArraySpec]] = {"index": BATCH_I64, "priority": BATCH_F32}
    index: np.ndarray
    priority: np.ndarray

    def validate(self) -> None:
        batch_size(self, ("index", "priority"))


_RUN_ID = re.compile(r"^[0-9a-f]{0,32}$")


@dataclass
class Weights(Message):
    """Learner -> actors: a full set of network parameters with a version that increases within one learner run.

    ``run_id`` names the learner process that published it (random, new at each start, a resumed one included):
    actors take the first weights of a new run whatever their version, and within one run only versions that
    grow by a bounded step. Absent (an older learner): "", one run like any other.
    """

    KIND: ClassVar[str] = "weights"
    DYNAMIC_ARRAYS: ClassVar[tuple[str, ArraySpec] | None] = (
        "tensors", ArraySpec(("float32", "float16", "int64"), 0, 4),
    )
    version: int
    network: str
    tensors: dict[str, np.ndarray] = field(default_factory=dict)
    run_id: str = ""

    def validate(self) -> None:
        if self.version < 0:
            raise BadShape(f"weights: negative version {self.version}")
        if not _RUN_ID.match(self.run_id):
            raise BadShape(f"weights: run_id {self.run_id[:40]!r} is not up to 32 lowercase hex digits")


@dataclass
class Telemetry(Message):
    """Any service -> gateway: cumulative counters, gauges and info of one instance."""

    KIND: ClassVar[str] = "telemetry"
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
    seq: int
    command: str
    target: str = "*"
    args: dict[str, Any] = field(default_factory=dict)


@dataclass
class LeaseRequest(Message):
    """Actor -> gateway: claim or renew (or release) an exploration slot."""

    KIND: ClassVar[str] = "lease_request"
    instance: str
    release: bool = False


@dataclass
class LeaseReply(Message):
    """Gateway -> actor: slot ``index`` of ``count`` live actors, valid for ``ttl`` seconds."""

    KIND: ClassVar[str] = "lease_reply"
    instance: str
    index: int
    count: int
    ttl: float

    def validate(self) -> None:
        if not 0 <= self.index < max(self.count, 1):
            raise BadShape(f"lease_reply: index {self.index} outside 0..{self.count - 1}")


CLIP_CHUNK_BYTES = 12 * 1024  # a clip travels in pieces that fit the telemetry socket's 16 KiB cap with their header


@dataclass
class ClipChunk(Message):
    """Actor -> gateway (telemetry socket): one piece of a filmed greedy episode (an mp4), with what it showed.

    Pieces of one clip share ``clip`` and arrive as ``index`` 0..count-1; the gateway puts them together.
    ``progress`` is the episode's furthest progress (the env's progress measure, flywheel.envs.measures; -1: the
    env has none) and ``success`` whether it reached the env's goal. Version 2: these replaced version 1's fields
    for one game's measures.
    """

    KIND: ClassVar[str] = "clip_chunk"
    VERSION: ClassVar[int] = 2
    ARRAYS: ClassVar[dict[str, ArraySpec]] = {"data": ArraySpec(("uint8",))}
    instance: str
    clip: int
    index: int
    count: int
    total_bytes: int
    weight_version: int
    env_id: str
    fps: float
    frames: int
    episode_return: float
    length: int
    progress: float
    success: bool
    time: float
    data: np.ndarray

    def validate(self) -> None:
        if not 0 <= self.index < self.count:
            raise BadShape(f"clip_chunk: index {self.index} outside 0..{self.count - 1}")
        if not 0 < self.data.shape[0] <= CLIP_CHUNK_BYTES:
            raise BadShape(f"clip_chunk: {self.data.shape[0]} bytes, expected 1..{CLIP_CHUNK_BYTES}")
        if not self.data.shape[0] <= self.total_bytes <= self.count * CLIP_CHUNK_BYTES:
            raise BadShape(f"clip_chunk: total_bytes {self.total_bytes} does not fit {self.count} pieces")
        if not math.isfinite(self.progress):
            raise BadShape(f"clip_chunk: progress {self.progress} is not a finite number")


__all__ = [
    "BOOL", "CLIP_CHUNK_BYTES", "FLOAT", "FLOAT_MAP", "INT", "MESSAGE_TYPES", "SCALAR_MAP", "STR",
    "STR_MAP", "ArraySpec", "ClipChunk", "Control", "LeaseReply", "LeaseRequest", "Message", "PriorityUpdate",
    "SampleBatch", "SampleRefused", "SampleRequest", "Telemetry", "TransitionBatch", "Weights",
]

MESSAGE_TYPES: dict[str, type[Message]] = {
    cls.KIND: cls
    for cls in (
        TransitionBatch, SampleRequest, SampleBatch, SampleRefused, PriorityUpdate, Weights, Telemetry, Control,
        LeaseRequest, LeaseReply, ClipChunk,
    )
}
