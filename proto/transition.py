"""The transition record: a transition's fields, each with its dtype and shape rule, declared once; and its message.

``Transition`` is what actors emit (services/actor/nstep.py), replay stores and samples (services/replay/), learners
stage and pretrain on (services/learner/) and demonstration files hold (flywheel/demos/). Records that carry more
(the actor's priorities, a sampled batch's weights, a batch on the learner's device) derive from it; storage,
batches, message schemas and file columns are built by iterating ``TRANSITION_FIELDS``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar, Generic, Self, TypeVar

import numpy as np

from .errors import BadShape
from .schema import ArraySpec, Message, batch_size

A = TypeVar("A")  # the array type: np.ndarray on the host, torch.Tensor on the learner's device

OBSERVATION = "observation"  # the dtype rule of an observation field: the env's (one of OBS_DTYPES)
OBS_DTYPES = ("uint8", "float32")  # pixels, or vectors
FRAME_INDEX_DTYPE = "int64"  # row numbers into stored observations (a demonstrations file's index columns)


@dataclass(frozen=True)
class FieldSpec:
    """One array field of a record: its name and dtype (a NumPy dtype name, or OBSERVATION).

    An observation field is ``(rows, *obs_shape)`` of the observation dtype; every other field is ``(rows,)``.
    ``frame_index`` names an observation field's column of row numbers into the observations that a
    demonstrations file stores once (flywheel/demos/format.py).
    """

    name: str
    dtype: str
    frame_index: str = ""

    @property
    def observation(self) -> bool:
        return self.dtype == OBSERVATION

    def dtype_of(self, obs_dtype: np.dtype | str) -> np.dtype:
        """This field's dtype when observations are ``obs_dtype``."""
        return np.dtype(obs_dtype) if self.observation else np.dtype(self.dtype)

    def shape_of(self, rows: int, obs_shape: tuple[int, ...]) -> tuple[int, ...]:
        """This field's shape for ``rows`` rows when observations are ``obs_shape``."""
        return (rows, *obs_shape) if self.observation else (rows,)

    def zeros(self, rows: int, obs_shape: tuple[int, ...], obs_dtype: np.dtype | str) -> np.ndarray:
        """Storage for ``rows`` rows of this field."""
        return np.zeros(self.shape_of(rows, obs_shape), self.dtype_of(obs_dtype))

    @property
    def wire(self) -> ArraySpec:
        """What this field may look like in a message: observations of OBS_DTYPES with 1 to 3 axes per row."""
        return ArraySpec(OBS_DTYPES, 2, 4) if self.observation else ArraySpec((self.dtype,))


_ARRAY_FIELDS: dict[type, tuple[FieldSpec, ...]] = {}


def array_fields(record: type) -> tuple[FieldSpec, ...]:
    """The array fields of a record class: its dataclass fields with a ``dtype`` in their metadata, in order."""
    specs = _ARRAY_FIELDS.get(record)
    if specs is None:
        specs = _ARRAY_FIELDS[record] = tuple(FieldSpec(f.name, **f.metadata) for f in fields(record)
                                              if "dtype" in f.metadata)
    return specs


@dataclass
class Transition(Generic[A]):
    """A batch of n-step transitions, one row each: from ``obs``, ``action`` earned ``reward`` (the n-step return)
    and led to ``next_obs``, from which the target bootstraps with ``discount`` (gamma ** k, or 0 when the episode
    terminated within the k steps).

    Derived records add fields; those declared with a ``dtype`` in their metadata are per-row arrays too.
    """

    obs: A = field(metadata={"dtype": OBSERVATION, "frame_index": "obs_index"})
    action: A = field(metadata={"dtype": "int64"})
    reward: A = field(metadata={"dtype": "float32"})
    discount: A = field(metadata={"dtype": "float32"})
    next_obs: A = field(metadata={"dtype": OBSERVATION, "frame_index": "next_index"})

    def __len__(self) -> int:
        return len(getattr(self, TRANSITION_FIELDS[0].name))

    def arrays(self) -> dict[str, Any]:
        """The record's array fields by name (absent optional ones as None)."""
        return {spec.name: getattr(self, spec.name) for spec in array_fields(type(self))}

    def transitions(self) -> Transition[A]:
        """Just the transition's fields, as a plain Transition (views, no copies)."""
        return Transition(**{spec.name: getattr(self, spec.name) for spec in TRANSITION_FIELDS})

    def select(self, rows: Any) -> Self:
        """The same record over ``rows`` (a mask, indices or a slice) of every array field; absent ones stay so."""
        picked: dict[str, Any] = {name: None if value is None else value[rows] for name, value in self.arrays().items()}
        return replace(self, **picked)


TRANSITION_FIELDS: tuple[FieldSpec, ...] = array_fields(Transition)
TRANSITION_NAMES: tuple[str, ...] = tuple(spec.name for spec in TRANSITION_FIELDS)
OBSERVATION_FIELDS: tuple[FieldSpec, ...] = tuple(spec for spec in TRANSITION_FIELDS if spec.observation)
SCALAR_FIELDS: tuple[FieldSpec, ...] = tuple(spec for spec in TRANSITION_FIELDS if not spec.observation)  # one per row
TRANSITION_ARRAYS: dict[str, ArraySpec] = {spec.name: spec.wire for spec in TRANSITION_FIELDS}


def check_observations(msg: Message) -> None:
    """BadShape unless the observation fields of ``msg`` agree in shape and dtype."""
    (first, head), *rest = ((spec.name, getattr(msg, spec.name)) for spec in OBSERVATION_FIELDS)
    for name, array in rest:
        if array.shape != head.shape or array.dtype != head.dtype:
            raise BadShape(f"{msg.KIND}: {first} {head.dtype}{head.shape} and {name} {array.dtype}{array.shape} differ")


@dataclass
class TransitionBatch(Transition[np.ndarray], Message):
    """Actor -> replay: n-step transitions with the weight version that produced them."""

    KIND: ClassVar[str] = "transitions"
    ARRAYS: ClassVar[dict[str, ArraySpec]] = {
        **TRANSITION_ARRAYS,
        "priority": ArraySpec(("float32",), optional=True),
        "stream": ArraySpec(("int64",), optional=True),
    }
    actor: str
    weight_version: int
    seq: int
    priority: np.ndarray | None = None
    # The actor's environment slot of each row: (actor, stream) names one sequence of consecutive env steps,
    # which lets replay store each frame of a stack once. Absent: replay stores every stack whole.
    stream: np.ndarray | None = None

    def validate(self) -> None:
        batch_size(self, tuple(self.ARRAYS))
        check_observations(self)
