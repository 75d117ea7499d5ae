"""Flywheel's wire protocol: typed messages and the one codec that encodes and decodes them."""

from . import packing
from .codec import DEFAULT_LIMITS, Limits, decode, encode, peek_kind
from .commands import (
    COMMAND_ARGS,
    CheckpointArgs,
    Command,
    CommandArgs,
    CommandHandlers,
    CommandKind,
    ExplorationArgs,
    LrArgs,
    PauseArgs,
    PublishIntervalArgs,
    ReplayRatioArgs,
    ResumeArgs,
    command_kind,
    dispatch,
    parse_args,
)
from .errors import (
    FAULTS,
    BadDtype,
    BadShape,
    CommandError,
    DecodeError,
    MalformedMessage,
    OversizedMessage,
    TruncatedMessage,
    UnknownCommand,
    UnknownKind,
    VersionMismatch,
    WrongKind,
)
from .messages import (
    CLIP_CHUNK_BYTES,
    ClipChunk,
    Control,
    LeaseReply,
    LeaseRequest,
    Message,
    PriorityUpdate,
    SampleBatch,
    SampleRequest,
    Telemetry,
    Weights,
)
from .schema import SCHEMA_VERSION
from .transition import (
    FRAME_INDEX_DTYPE,
    OBS_DTYPES,
    OBSERVATION_FIELDS,
    SCALAR_FIELDS,
    TRANSITION_FIELDS,
    TRANSITION_NAMES,
    FieldSpec,
    Transition,
    TransitionBatch,
    array_fields,
)

__all__ = [
    "CLIP_CHUNK_BYTES", "DEFAULT_LIMITS", "FAULTS", "SCHEMA_VERSION", "BadDtype", "BadShape", "ClipChunk",
    "Control", "DecodeError", "LeaseReply", "LeaseRequest", "Limits", "MalformedMessage", "Message",
    "OversizedMessage", "PriorityUpdate", "SampleBatch", "SampleRequest", "Telemetry", "TransitionBatch",
    "TruncatedMessage", "UnknownKind", "VersionMismatch", "Weights", "WrongKind", "decode", "encode", "peek_kind",
    # control commands (proto/commands.py)
    "COMMAND_ARGS", "CheckpointArgs", "Command", "CommandArgs", "CommandError", "CommandHandlers", "CommandKind",
    "ExplorationArgs", "LrArgs", "PauseArgs", "PublishIntervalArgs", "ReplayRatioArgs", "ResumeArgs",
    "UnknownCommand", "command_kind", "dispatch", "parse_args",
    # the transition record and its field specs (proto/transition.py)
    "FRAME_INDEX_DTYPE", "OBSERVATION_FIELDS", "OBS_DTYPES", "SCALAR_FIELDS", "TRANSITION_FIELDS", "TRANSITION_NAMES",
    "FieldSpec", "Transition", "array_fields",
    # LZ4-packed frames (proto/packing.py)
    "packing",
]
