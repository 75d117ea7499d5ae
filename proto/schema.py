"""The wire schema's building blocks: scalar type tags, array specs, the Message base class and its batch check."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

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


BATCH_F32 = ArraySpec(("float32",))
BATCH_I64 = ArraySpec(("int64",))


def batch_size(msg: Message, names: tuple[str, ...]) -> int:
    """The one row count the arrays ``names`` of ``msg`` share (absent ones aside); BadShape when they disagree."""
    sizes = {name: getattr(msg, name).shape[0] for name in names if getattr(msg, name) is not None}
    distinct = set(sizes.values())
    if len(distinct) != 1:
        raise BadShape(f"{msg.KIND}: arrays disagree on batch size: {sizes}")
    size = int(distinct.pop())
    if size < 1:
        raise BadShape(f"{msg.KIND}: empty batch")
    return size
