"""LearnerCore's state as flat tensors plus JSON metadata: networks, Adam moments, steps and the gradient scaler.

``LearnerCore.state_dict()`` / ``load_state_dict()`` are these two functions; the checkpoint file
(services/learner/checkpoint.py) adds the format, RNG states and the weight version around them. Everything is
checked before anything is changed, so a refused state leaves the core as it was.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from flywheel.checkpoints import ACTING_PREFIX as ACTING
from flywheel.nets import QNetwork


class LearnerCore(Protocol):
    """What these functions read and set of services/learner/core.py's LearnerCore (no import of it: core imports
    this module)."""

    steps: int

    @property
    def online(self) -> QNetwork: ...
    @property
    def target(self) -> QNetwork: ...
    @property
    def acting(self) -> QNetwork: ...
    @property
    def optimizer(self) -> torch.optim.Optimizer: ...
    @property
    def scaler(self) -> torch.amp.GradScaler | None: ...
    @property
    def config(self) -> Any: ...
    @property
    def name(self) -> str: ...
    @property
    def updates(self) -> int: ...
    @property
    def skipped(self) -> int: ...
    @property
    def lr(self) -> float: ...


OPTIM_STATE = ("step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq")


class StateError(ValueError):
    """A state that does not fit this core; the message is one line."""


def network_spec(net: QNetwork) -> dict[str, Any]:
    """What flywheel.nets.build_q_network needs to rebuild ``net`` (kept in the metadata for flywheel.policy)."""
    return {"obs_shape": [int(d) for d in net.obs_shape], "n_actions": int(net.n_actions),
            "dueling": bool(net.dueling), "hidden": int(net.hidden), "head": str(net.head),
            "num_quantiles": int(net.num_quantiles), "c51_atoms": int(net.c51_atoms)}


def core_state(core: LearnerCore) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """CPU copies of the online and target networks (and the acting average, when it is one of its own) and of
    Adam's moments, and the core's counters."""
    tensors: dict[str, torch.Tensor] = {}
    nets = [("online", core.online), ("target", core.target)]
    if core.acting is not core.online:
        nets.append((ACTING, core.acting))
    for prefix, net in nets:
        for key, value in net.state_dict().items():
            tensors[f"{prefix}.{key}"] = value.detach().to("cpu", copy=True).contiguous()
    for index, entry in core.optimizer.state_dict()["state"].items():
        for name, value in entry.items():
            if name in OPTIM_STATE and isinstance(value, torch.Tensor):
                tensors[f"optim.{index}.{name}"] = value.detach().to("cpu", copy=True).contiguous()
    meta = {"network": core.name, "updates": int(core.updates), "steps": int(core.steps),
            "skipped": int(core.skipped), "lr": core.lr, "precision": core.config.precision,
            "grad_scaler": core.scaler.state_dict() if core.scaler else None,
            "network_spec": network_spec(core.online)}
    return tensors, meta


def _net(prefix: str, net: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    own = net.state_dict()
    found = {key[len(prefix) + 1:]: value for key, value in tensors.items() if key.startswith(prefix + ".")}
    if set(found) != set(own):
        missing, extra = sorted(set(own) - set(found)), sorted(set(found) - set(own))
        raise StateError(f"{prefix} network keys differ (missing {missing[:3]}, unexpected {extra[:3]})")
    for key, value in own.items():
        if found[key].shape != value.shape or found[key].dtype != value.dtype:
            raise StateError(f"{prefix}.{key} is {found[key].dtype}{tuple(found[key].shape)}, "
                             f"expected {value.dtype}{tuple(value.shape)}")
    return found


def _optimizer(core: LearnerCore, tensors: dict[str, torch.Tensor]) -> dict[int, dict[str, torch.Tensor]]:
    params = list(core.online.parameters())
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        if key.startswith(("online.", "target.", ACTING + ".")):
            continue
        parts = key.split(".")
        if parts[0] != "optim":
            raise StateError(f"unexpected entry {key!r}")
        if len(parts) != 3 or not parts[1].isdigit() or int(parts[1]) >= len(params) or parts[2] not in OPTIM_STATE:
            raise StateError(f"unexpected optimizer entry {key!r}")
        index = int(parts[1])
        if parts[2] != "step" and value.shape != params[index].shape:
            raise StateError(f"optimizer {key} has shape {tuple(value.shape)}, expected {tuple(params[index].shape)}")
        state.setdefault(index, {})[parts[2]] = value
    for index, entry in state.items():
        if not {"step", "exp_avg", "exp_avg_sq"} <= set(entry):
            raise StateError(f"optimizer state of parameter {index} is incomplete")
    return state


def load_core_state(core: LearnerCore, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
    """Load what ``core_state`` made (this run keeps its own lr, eps and flags); StateError before any change."""
    if meta.get("network") != core.name:
        raise StateError(f"it is for network {meta.get('network')!r} but this learner builds {core.name!r}; "
                         "check --env-id, --dueling, --hidden, --head, --num-quantiles and --c51-atoms")
    online, target = _net("online", core.online, tensors), _net("target", core.target, tensors)
    saved_acting = any(key.startswith(ACTING + ".") for key in tensors)
    acting = _net(ACTING, core.acting, tensors) if saved_acting and core.acting is not core.online else online
    if core.online.support is not None and not torch.allclose(online["support"].float(), core.online.support.cpu()):
        saved = online["support"]
        raise StateError(f"its c51 support is [{float(saved[0]):g}, {float(saved[-1]):g}] but this learner's is "
                         f"[{float(core.online.support[0]):g}, {float(core.online.support[-1]):g}]; "
                         "set --c51-v-min and --c51-v-max as the run had them")
    state = _optimizer(core, tensors)
    scaler_state = meta.get("grad_scaler")
    if scaler_state is not None and not (isinstance(scaler_state, dict) and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in scaler_state.values())):
        raise StateError("metadata field 'grad_scaler' is not a gradient-scaler state")
    core.online.load_state_dict(online)
    core.target.load_state_dict(target)
    if core.acting is not core.online:  # a checkpoint without an average starts it at the online network
        core.acting.load_state_dict(acting)
    optim_state = core.optimizer.state_dict()
    optim_state["state"] = state
    core.optimizer.load_state_dict(optim_state)
    skipped = meta.get("skipped", 0) if isinstance(meta.get("skipped", 0), int) else 0
    steps = meta.get("steps")
    core.steps = steps if isinstance(steps, int) and steps >= 0 else int(meta["updates"]) + skipped
    if core.scaler is not None and scaler_state:
        core.scaler.load_state_dict(scaler_state)
