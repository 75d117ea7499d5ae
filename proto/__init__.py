"""Flywheel's wire protocol: typed messages and the one codec that encodes and decodes them."""

from .codec import DEFAULT_LIMITS, Limits, decode, encode, peek_kind
from .errors import (
    FAULTS,
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
from .messages import (
    CLIP_CHUNK_BYTES,
    SCHEMA_VERSION,
    ClipChunk,
    Control,
    LeaseReply,
    LeaseRequest,
    Message,
    PriorityUpdate,
    SampleBatch,
    SampleRequest,
    Telemetry,
    TransitionBatch,
    Weights,
)

__all__ = [
    "CLIP_CHUNK_BYTES", "DEFAULT_LIMITS", "FAULTS", "SCHEMA_VERSION", "BadDtype", "BadShape", "ClipChunk",
    "Control", "DecodeError", "LeaseReply", "LeaseRequest", "Limits", "MalformedMessage", "Message",
    "OversizedMessage", "PriorityUpdate", "SampleBatch", "SampleRequest", "Telemetry", "TransitionBatch",
    "TruncatedMessage", "UnknownKind", "VersionMismatch", "Weights", "WrongKind", "decode", "encode", "peek_kind",
]
