"""Learner checkpoints: one safetensors file (networks, Adam state, RNG) with JSON metadata, written atomically."""

from __future__ import annotations

import json
import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from flywheel.checkpoints import process_running

from .core import LearnerCore

CHECKPOINT_FILE = "learner.safetensors"
FORMAT = "flywheel-learner-checkpoint"
FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)  # version 1 had no RNG, step or gradient-scaler entries
_OPTIM_STATE = ("step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq")
_RNG_KEY = re.compile(r"rng\.(cpu|cuda\.\d{1,3})")
log = logging.getLogger("flywheel.learner")


class CheckpointError(RuntimeError):
    """A checkpoint is missing, unreadable or made for another network; the message is one line."""


@dataclass
class CheckpointInfo:
    """What a checkpoint says about the run it came from."""

    path: Path
    network: str
    updates: int
    weight_version: int
    saved_at: float


def network_spec(net: torch.nn.Module) -> dict[str, Any]:
    """What flywheel.nets.build_q_network needs to rebuild ``net`` (kept in the metadata for flywheel.policy)."""
    return {"obs_shape": [int(d) for d in net.obs_shape], "n_actions": int(net.n_actions),
            "dueling": bool(net.dueling), "hidden": int(net.hidden), "head": str(net.head),
            "num_quantiles": int(net.num_quantiles)}


def check_format(meta: object, path: Path, error: type[CheckpointError] = CheckpointError) -> dict[str, Any]:
    """The checkpoint's metadata if it is a learner checkpoint of a readable format version, else ``error``."""
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise error(f"{path} is not a flywheel learner checkpoint (no {FORMAT!r} metadata)")
    if meta.get("format_version") not in READABLE_VERSIONS:
        raise error(f"{path} has checkpoint format {meta.get('format_version')!r}, "
                    f"this build reads {', '.join(map(str, READABLE_VERSIONS))}")
    return meta


def checkpoint_path(directory: str | os.PathLike[str]) -> Path:
    return Path(directory) / CHECKPOINT_FILE


VERSIONS_FILE = "weights-versions.json"


def reserved_version(directory: str | os.PathLike[str]) -> int:
    """The highest weight version a learner with this checkpoint directory may have published (0: none noted).

    A learner killed between checkpoints has published versions above its checkpoint's; resuming above this
    number keeps versions strictly increasing for the actors, which refuse older ones as stale.
    """
    path = Path(directory) / VERSIONS_FILE
    try:
        value = json.loads(path.read_text()).get("reserved")
    except FileNotFoundError:
        return 0
    except (OSError, ValueError, AttributeError) as exc:
        raise CheckpointError(f"{path} is unreadable ({exc}); delete it only if no actor saw this run's "
                              "weights") from None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise CheckpointError(f"{path}: 'reserved' is not a non-negative int")
    return value


def reserve_versions(directory: str | os.PathLike[str], upto: int) -> None:
    """Note that versions up to ``upto`` may be published (tmp + fsync + os.replace: a kill leaves one of both)."""
    path = Path(directory) / VERSIONS_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as fh:
        json.dump({"reserved": int(upto), "saved_at": time.time()}, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def save_checkpoint(directory: str | os.PathLike[str], core: LearnerCore, weight_version: int) -> Path:
    """Write online, target, optimizer state, RNG, update step and weight version; tmp + fsync + os.replace."""
    path = checkpoint_path(directory)
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {"rng.cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and core.cuda:
        for index, state in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"rng.cuda.{index}"] = state
    for prefix, net in (("online", core.online), ("target", core.target)):
        for key, value in net.state_dict().items():
            tensors[f"{prefix}.{key}"] = value.detach().to("cpu", copy=True).contiguous()
    for index, state in core.optimizer.state_dict()["state"].items():
        for name, value in state.items():
            if name in _OPTIM_STATE and isinstance(value, torch.Tensor):
                tensors[f"optim.{index}.{name}"] = value.detach().to("cpu", copy=True).contiguous()
    meta = {
        "format": FORMAT, "format_version": FORMAT_VERSION, "network": core.name,
        "updates": int(core.updates), "steps": int(core.steps), "skipped": int(core.skipped),
        "weight_version": int(weight_version), "lr": core.lr, "saved_at": time.time(),
        "precision": core.config.precision, "grad_scaler": core.scaler.state_dict() if core.scaler else None,
        "env_id": getattr(core, "env_id", None), "network_spec": network_spec(core.online),
    }
    blob = st_save(tensors, metadata={"flywheel": json.dumps(meta)})
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as fh:
            fh.write(blob)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    _remove_stale_temps(path.parent)
    return path


def _remove_stale_temps(directory: Path) -> None:
    """Delete temp files that writers killed mid-write left behind (their process no longer runs)."""
    for tmp in directory.glob(".*.tmp"):
        pid = tmp.name.rsplit(".", 2)[-2]
        if pid.isdigit() and int(pid) != os.getpid() and not process_running(int(pid)):
            tmp.unlink(missing_ok=True)


def _read(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    if not path.is_file():
        raise CheckpointError(f"no learner checkpoint at {path}; start without --resume or fix --checkpoint-dir")
    blob = path.read_bytes()
    try:
        tensors = st_load(blob)
        header_len = int.from_bytes(blob[:8], "little")
        header = json.loads(blob[8:8 + header_len])
        meta = json.loads(header.get("__metadata__", {}).get("flywheel", "null"))
    except (SafetensorError, ValueError, TypeError, KeyError, AttributeError) as exc:
        raise CheckpointError(f"{path} is not a readable learner checkpoint: {exc}".splitlines()[0]) from None
    meta = check_format(meta, path)
    for key in ("updates", "weight_version"):
        if not isinstance(meta.get(key), int) or meta[key] < 0:
            raise CheckpointError(f"{path}: metadata field {key!r} is missing or not a non-negative int")
    return tensors, meta


def _check_net(path: Path, prefix: str, net: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> dict:
    own = net.state_dict()
    found = {key[len(prefix) + 1:]: value for key, value in tensors.items() if key.startswith(prefix + ".")}
    if set(found) != set(own):
        missing, extra = sorted(set(own) - set(found)), sorted(set(found) - set(own))
        raise CheckpointError(f"{path}: {prefix} network keys differ (missing {missing[:3]}, unexpected {extra[:3]})")
    for key, value in own.items():
        if found[key].shape != value.shape or found[key].dtype != value.dtype:
            raise CheckpointError(f"{path}: {prefix}.{key} is {found[key].dtype}{tuple(found[key].shape)}, "
                                  f"expected {value.dtype}{tuple(value.shape)}")
    return found


def load_checkpoint(directory: str | os.PathLike[str], core: LearnerCore) -> CheckpointInfo:
    """Restore ``core`` from ``directory``; everything is checked before anything is changed."""
    path = checkpoint_path(directory)
    tensors, meta = _read(path)
    if meta.get("network") != core.name:
        raise CheckpointError(f"{path} is for network {meta.get('network')!r} but this learner builds "
                              f"{core.name!r}; check --env-id, --dueling, --hidden, --head and --num-quantiles")
    online = _check_net(path, "online", core.online, tensors)
    target = _check_net(path, "target", core.target, tensors)
    optim_state = core.optimizer.state_dict()
    n_params = len(optim_state["param_groups"][0]["params"])
    params = list(core.online.parameters())
    state: dict[int, dict[str, torch.Tensor]] = {}
    for key, value in tensors.items():
        if key.startswith("rng."):
            if not _RNG_KEY.fullmatch(key) or value.dtype != torch.uint8 or value.dim() != 1:
                raise CheckpointError(f"{path}: {key} is not a torch RNG state")
            continue
        if key.startswith(("online.", "target.")):
            continue
        if not key.startswith("optim."):
            raise CheckpointError(f"{path}: unexpected entry {key!r}")
        parts = key.split(".")
        if len(parts) != 3 or not parts[1].isdigit() or int(parts[1]) >= n_params or parts[2] not in _OPTIM_STATE:
            raise CheckpointError(f"{path}: unexpected optimizer entry {key!r}")
        index = int(parts[1])
        if parts[2] != "step" and value.shape != params[index].shape:
            raise CheckpointError(f"{path}: optimizer {key} has shape {tuple(value.shape)}, "
                                  f"expected {tuple(params[index].shape)}")
        state.setdefault(index, {})[parts[2]] = value
    for index, entry in state.items():
        if not {"step", "exp_avg", "exp_avg_sq"} <= set(entry):
            raise CheckpointError(f"{path}: optimizer state of parameter {index} is incomplete")
    scaler_state = meta.get("grad_scaler")
    if scaler_state is not None and not (isinstance(scaler_state, dict) and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in scaler_state.values())):
        raise CheckpointError(f"{path}: metadata field 'grad_scaler' is not a gradient-scaler state")
    core.online.load_state_dict(online)
    core.target.load_state_dict(target)
    optim_state["state"] = state
    core.optimizer.load_state_dict(optim_state)  # keeps this run's lr / eps / flags
    skipped = meta.get("skipped", 0) if isinstance(meta.get("skipped", 0), int) else 0
    steps = meta.get("steps")
    core.steps = steps if isinstance(steps, int) and steps >= 0 else int(meta["updates"]) + skipped
    _restore_rng(path, tensors)
    if core.scaler is not None and scaler_state:
        core.scaler.load_state_dict(scaler_state)
    return CheckpointInfo(path=path, network=str(meta["network"]), updates=core.updates,
                          weight_version=int(meta["weight_version"]), saved_at=float(meta.get("saved_at", 0.0)))


def _restore_rng(path: Path, tensors: dict[str, torch.Tensor]) -> None:
    if "rng.cpu" in tensors:
        torch.set_rng_state(tensors["rng.cpu"])
    cuda = [tensors[k] for k in sorted((k for k in tensors if k.startswith("rng.cuda.")),
                                       key=lambda k: int(k.rsplit(".", 1)[1]))]
    if cuda and torch.cuda.is_available():
        if len(cuda) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all(cuda)
        else:
            log.warning("learner: %s holds RNG states of %d GPUs, this machine has %d; GPU RNG not restored",
                        path, len(cuda), torch.cuda.device_count())
