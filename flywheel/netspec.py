"""Q-network names, kinds, parameter shapes and weights checks, shared by the torch and NumPy networks (no torch) with
their common base (:class:`QNetworkBase`), and the one network record (:class:`NetworkSpec`) the learner and its
actors both build from."""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
from pydantic import BaseModel, Field

from flywheel import proto

NATURE_MIN_SIDE = 36  # smallest H/W the Nature CNN's 8/4, 4/2, 3/1 convolutions accept
HEADS = ("q", "quantile", "c51")
Head = Literal["q", "quantile", "c51"]
C51_ATOMS = 51  # the categorical (C51) head's atoms unless told otherwise; the name says how many ("-c51")


class NetworkSpec(BaseModel):
    """The network the learner trains and every actor acts with: one record, written once. The learner's and the
    actor's settings classes take these fields by inheriting it (FLYWHEEL_LEARNER_HIDDEN, FLYWHEEL_ACTOR_HIDDEN, ...);
    ``flywheel run`` passes the learner's to the actors; an actor built otherwise refuses the weights by name."""

    dueling: bool = Field(True, description="dueling value/advantage head (the actors must build the learner's "
                          "network: flywheel run passes it to them)")
    hidden: int = Field(256, ge=8, le=8192, description="width of the MLP / small-CNN hidden layers (the Nature "
                        "CNN of images keeps its 512)")
    head: Head = Field("q", description="q: one value per action; quantile: QR-DQN quantiles; c51: a categorical "
                       "distribution over c51_atoms atoms (a c51 actor takes the learner's support with the weights)")
    num_quantiles: int = Field(51, ge=2, le=1024, description="quantiles per action of the quantile head")
    c51_atoms: int = Field(C51_ATOMS, ge=2, le=1024, description="atoms per action of the c51 head")

    def network(self) -> NetworkSpec:
        """Just the network's fields (of a settings object that inherits them), as a record of its own."""
        return NetworkSpec(**{name: getattr(self, name) for name in NetworkSpec.model_fields})


NETWORK_FIELDS = tuple(NetworkSpec.model_fields)  # dueling, hidden, head, num_quantiles, c51_atoms


class WeightsMismatch(ValueError):
    """A Weights message does not fit the network (name, keys, shapes, dtypes or values)."""

    fault = "mismatch"  # the fault counters' name for it (flywheel.transport.FaultCounter)


def network_kind(obs_shape: tuple[int, ...]) -> str:
    """"nature" (3-D, H and W >= 36), "conv" (smaller 3-D grids) or "mlp" (vectors; other ranks are flattened)."""
    if len(obs_shape) == 3 and min(obs_shape[1:]) >= NATURE_MIN_SIDE:
        return "nature"
    if len(obs_shape) == 3:
        return "conv"  # small grids (Snake, MettaGrid): 3x3 convolutions
    return "mlp"


def network_name(obs_shape: tuple[int, ...], n_actions: int, dueling: bool, *, hidden: int = 256,
                 head: str = "q", num_quantiles: int = 0, c51_atoms: int = C51_ATOMS) -> str:
    """E.g. "mlp-4-2-dueling", "nature-4x84x84-7-dueling", "nature-4x84x84-7-dueling-qr51" or
    "nature-4x84x84-7-dueling-c51" (or "-c21" for 21 atoms).

    The kind comes first, "-h<N>" is appended when hidden is not 256 (it has no effect on the pixel torso),
    "-qr<N>" for a quantile head, "-c<N>" for the categorical head of N atoms, so an actor built with another
    network or head refuses the learner's weights by name.
    """
    kind = network_kind(tuple(obs_shape))
    name = f"{kind}-{'x'.join(str(int(d)) for d in obs_shape)}-{int(n_actions)}-{'dueling' if dueling else 'plain'}"
    if kind in ("conv", "mlp") and hidden != 256:
        name += f"-h{hidden}"
    if head == "quantile":
        name += f"-qr{int(num_quantiles)}"
    elif head == "c51":
        name += f"-c{int(c51_atoms)}"
    return name


def outputs_per_action(head: str, num_quantiles: int, c51_atoms: int = C51_ATOMS) -> int:
    """How many numbers the head gives each action: 1 (q), the quantiles (quantile) or the atoms' logits (c51)."""
    return int(num_quantiles) if head == "quantile" else int(c51_atoms) if head == "c51" else 1


def check_support(v_min: float, v_max: float) -> None:
    """Raise ValueError unless [v_min, v_max] is a finite interval the C51 head can spread its atoms over."""
    if not (math.isfinite(v_min) and math.isfinite(v_max) and v_min < v_max):
        raise ValueError(f"the c51 support needs finite v_min < v_max, got [{v_min}, {v_max}]")


def check_spec(obs_shape: tuple[int, ...], n_actions: int, head: str, num_quantiles: int,
               c51_atoms: int = C51_ATOMS) -> None:
    """Raise ValueError for a network that cannot be built."""
    if n_actions < 1 or not obs_shape or any(d < 1 for d in obs_shape):
        raise ValueError(f"bad network spec: obs_shape={obs_shape}, n_actions={n_actions}")
    if head not in HEADS:
        raise ValueError(f"unknown head {head!r}; expected one of {', '.join(HEADS)}")
    if head == "quantile" and not 2 <= num_quantiles <= 1024:
        raise ValueError(f"num_quantiles must be in 2..1024, got {num_quantiles}")
    if head == "c51" and not 2 <= c51_atoms <= 1024:
        raise ValueError(f"c51_atoms must be in 2..1024, got {c51_atoms}")


def mlp_parameter_shapes(obs_shape: tuple[int, ...], n_actions: int, *, dueling: bool, hidden: int,
                         outputs_per_action: int = 1, support: bool = False) -> dict[str, tuple[int, ...]]:
    """The state_dict keys and shapes of QNetwork's MLP: torso.1 (in -> hidden), fc.0, advantage, value, and for
    the c51 head (``support``) the atoms' values, a buffer that travels with the weights."""
    features, outputs = math.prod(obs_shape), n_actions * outputs_per_action
    shapes: dict[str, tuple[int, ...]] = {
        "torso.1.weight": (hidden, features), "torso.1.bias": (hidden,),
        "fc.0.weight": (hidden, hidden), "fc.0.bias": (hidden,),
        "advantage.weight": (outputs, hidden), "advantage.bias": (outputs,),
    }
    if dueling:
        shapes["value.weight"] = (outputs_per_action, hidden)
        shapes["value.bias"] = (outputs_per_action,)
    if support:
        shapes["support"] = (outputs_per_action,)
    return shapes


class QNetworkBase:
    """What the torch and the NumPy Q-networks both are: the checked spec each was built with, its kind, name and
    outputs per action (set by ``_specify``)."""

    obs_shape: tuple[int, ...]
    n_actions: int
    dueling: bool
    hidden: int
    head: str
    num_quantiles: int  # 1 unless the head is "quantile"
    c51_atoms: int  # C51_ATOMS unless the head is "c51"
    per_action: int
    kind: str
    name: str

    def _specify(self, obs_shape: tuple[int, ...], n_actions: int, *, dueling: bool, hidden: int, head: str,
                 num_quantiles: int, c51_atoms: int, v_min: float, v_max: float) -> None:
        """Check the spec (ValueError for a network that cannot be built) and record it."""
        check_spec(tuple(obs_shape), n_actions, head, num_quantiles, c51_atoms)
        check_support(v_min, v_max)
        self.obs_shape = tuple(int(d) for d in obs_shape)
        self.n_actions = int(n_actions)
        self.dueling = bool(dueling)
        self.hidden = int(hidden)
        self.head = head
        self.num_quantiles = int(num_quantiles) if head == "quantile" else 1
        self.c51_atoms = int(c51_atoms) if head == "c51" else C51_ATOMS
        self.per_action = outputs_per_action(head, num_quantiles, c51_atoms)
        self.kind = network_kind(self.obs_shape)
        self.name = network_name(self.obs_shape, self.n_actions, self.dueling, hidden=self.hidden, head=head,
                                 num_quantiles=self.num_quantiles, c51_atoms=self.c51_atoms)


def check_weights(msg: proto.Weights, expected_name: str, shapes: dict[str, tuple[int, ...]]) -> None:
    """Raise WeightsMismatch unless ``msg`` is called ``expected_name`` and holds exactly ``shapes``, finite float32."""
    if msg.network != expected_name:
        raise WeightsMismatch(f"weights are for network {msg.network!r}, this one is {expected_name!r}")
    missing, extra = sorted(set(shapes) - set(msg.tensors)), sorted(set(msg.tensors) - set(shapes))
    if missing or extra:
        raise WeightsMismatch(f"weights keys differ: missing {missing[:3]}, unexpected {extra[:3]}")
    for key, shape in shapes.items():
        array = msg.tensors[key]
        if tuple(array.shape) != tuple(shape):
            raise WeightsMismatch(f"weights {key!r} has shape {tuple(array.shape)}, expected {tuple(shape)}")
        if array.dtype != np.float32:
            raise WeightsMismatch(f"weights {key!r} has dtype {array.dtype}, expected float32")
        if not np.isfinite(array).all():
            raise WeightsMismatch(f"weights {key!r} holds NaN or infinite values")
