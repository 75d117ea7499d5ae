"""The wire schema's building blocks: scalar type tags, array specs, the Message base class and its batch check."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .errors import BadShape

SCHEMA_VERSION = 1  # a message's version unless it declares its own (VERSION): one that changed incompatibly

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


# The codec tag of each scalar field's annotation (as written: the modules use postponed annotations).
_TAGS = {"int": INT, "float": FLOAT, "str": STR, "bool": BOOL, "dict[str, float]": FLOAT_MAP,
         "dict[str, str]": STR_MAP, "dict[str, Any]": SCALAR_MAP}


@dataclass
class Message:
    """Base class: subclasses declare KIND and ARRAYS (or DYNAMIC_ARRAYS) and their fields; SCALARS, each
    scalar field's codec tag, is read off the fields' annotations when the class is made."""

    KIND: ClassVar[str] = ""
    VERSION: ClassVar[int] = SCHEMA_VERSION  # the header's "v": raised when a message's fields change incompatibly
    SCALARS: ClassVar[dict[str, str]] = {}
    ARRAYS: ClassVar[dict[str, ArraySpec]] = {}
    # When set, arrays are free-named entries of this dict attribute, each checked against the spec.
    DYNAMIC_ARRAYS: ClassVar[tuple[str, ArraySpec] | None] = None

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        cls.SCALARS = scalar_tags(cls)

    def validate(self) -> None:
        """Cross-field checks after decoding (and before encoding); raise BadShape."""


def scalar_tags(cls: type[Message]) -> dict[str, str]:
    """``{field: tag}`` of a message class's scalar fields, in field order (bases first): every annotated field
    that is not a ClassVar or an array; a TypeError at import for a field type the codec cannot carry."""
    arrays = set(cls.ARRAYS) | ({cls.DYNAMIC_ARRAYS[0]} if cls.DYNAMIC_ARRAYS else set())
    tags: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        for name, annotation in vars(klass).get("__annotations__", {}).items():
            written = str(annotation)
            if written.startswith("ClassVar") or name in arrays or name in tags:
                continue
            if written not in _TAGS:
                raise TypeError(f"{cls.__name__}.{name}: {written} is not a type the codec carries "
                                f"({', '.join(_TAGS)}, or an array named in ARRAYS)")
            tags[name] = _TAGS[written]
    return tags


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
