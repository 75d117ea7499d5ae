"""Pure DQN learner (double, dueling, n-step, importance-weighted Huber loss); no sockets."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
from torch.nn import functional as F

from flywheel.nets import QNetwork, as_tensor, build_q_network

log = logging.getLogger("flywheel.learner")


class BadBatch(ValueError):
    """A sampled batch does not fit this learner's network; ``fault`` labels it for FaultCounter."""

    fault = "batch"


class Batch(Protocol):
    """What an update needs; proto.SampleBatch has exactly these arrays."""

    obs: np.ndarray
    action: np.ndarray
    reward: np.ndarray
    discount: np.ndarray
    next_obs: np.ndarray
    weight: np.ndarray


@dataclass
class CoreConfig:
    """Hyper-parameters of the update rule."""

    lr: float = 1e-4
    adam_eps: float = 1.5e-4
    grad_clip_norm: float = 10.0
    target_update_interval: int = 2500
    tau: float = 0.0
    double: bool = True
    dueling: bool = True
    hidden: int = 256


@dataclass
class UpdateResult:
    """One update's outcome; tensors may live on the GPU until ``priorities()``/``stats()`` are read."""

    td_abs: torch.Tensor
    loss: torch.Tensor
    q_mean: torch.Tensor
    applied: bool
    batch_size: int

    def priorities(self) -> np.ndarray:
        """|TD error| per sample as float32 (the replay applies its own exponent and epsilon); NaN/inf -> 0."""
        td = self.td_abs.detach().float().cpu().numpy()
        return np.nan_to_num(td, nan=0.0, posinf=0.0, neginf=0.0)

    def stats(self) -> dict[str, float]:
        return {
            "loss": float(self.loss), "q_mean": float(self.q_mean),
            "td_error_mean": float(self.td_abs.float().mean()),
        }


def pick_device(choice: str) -> torch.device:
    """'auto' -> cuda when available, else cpu; 'cuda' without a GPU is an error."""
    if choice == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("device 'cuda' requested but torch sees no GPU; use --device cpu or auto")
    if choice == "cuda" or (choice == "auto" and torch.cuda.is_available()):
        return torch.device("cuda")
    return torch.device("cpu")


def beta_at(updates: int, start: float, end: float, anneal_updates: int) -> float:
    """Importance-sampling exponent, linear from start to end over anneal_updates."""
    if anneal_updates <= 0:
        return end
    return start + (end - start) * min(1.0, updates / anneal_updates)


class LearnerCore:
    """Online + target Q-networks and Adam; ``update`` takes one sampled batch and returns |td| for priorities."""

    def __init__(self, obs_shape: tuple[int, ...], n_actions: int, config: CoreConfig,
                 device: torch.device | str = "cpu", *, compile: bool = False) -> None:
        self.config = config
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.online: QNetwork = build_q_network(obs_shape, n_actions, dueling=config.dueling,
                                                hidden=config.hidden).to(self.device)
        self.target: QNetwork = build_q_network(obs_shape, n_actions, dueling=config.dueling,
                                                hidden=config.hidden).to(self.device)
        self.target.load_state_dict(self.online.state_dict())
        self.target.requires_grad_(False)
        self.name = self.online.name
        self.obs_shape, self.n_actions = self.online.obs_shape, self.online.n_actions
        if self.cuda:
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
            torch.backends.cudnn.benchmark = True
        self.optimizer = torch.optim.Adam(self.online.parameters(), lr=config.lr, eps=config.adam_eps,
                                          **({"fused": True} if self.cuda else {}))
        self._online_fwd = torch.compile(self.online) if (compile and self.cuda) else self.online
        self._target_fwd = torch.compile(self.target) if (compile and self.cuda) else self.target
        self.updates = 0  # successful optimizer steps, persisted in checkpoints
        self.skipped = 0  # updates dropped because the gradient was not finite

    @property
    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def set_lr(self, lr: float) -> None:
        if not (lr > 0 and math.isfinite(lr)):
            raise ValueError(f"learning rate must be a positive number, got {lr}")
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def check_batch(self, batch: Batch) -> None:
        """Raise BadBatch when the batch cannot be trained on (shape, dtype, action range, weights)."""
        if tuple(batch.obs.shape[1:]) != self.obs_shape:
            raise BadBatch(f"batch obs shape {tuple(batch.obs.shape[1:])} does not match the network's "
                           f"{self.obs_shape}")
        action = batch.action
        if action.size and (int(action.min()) < 0 or int(action.max()) >= self.n_actions):
            raise BadBatch(f"batch actions outside 0..{self.n_actions - 1}")
        if not np.isfinite(batch.weight).all() or (batch.weight < 0).any():
            raise BadBatch("batch importance weights must be finite and non-negative")

    def update(self, batch: Batch) -> UpdateResult:
        """One gradient step on ``batch``; the target network is refreshed per the config."""
        dev = self.device
        obs, next_obs = as_tensor(batch.obs, dev), as_tensor(batch.next_obs, dev)
        action = as_tensor(batch.action, dev).long()
        reward = as_tensor(batch.reward, dev).float()
        discount = as_tensor(batch.discount, dev).float()
        weight = as_tensor(batch.weight, dev).float()
        self.online.train()
        with torch.autocast(device_type=dev.type, dtype=torch.bfloat16, enabled=self.cuda):
            q_all = self._online_fwd(obs)
            with torch.no_grad():
                q_next_target = self._target_fwd(next_obs)
                if self.config.double:
                    best = self._online_fwd(next_obs).argmax(dim=1, keepdim=True)
                    q_next = q_next_target.gather(1, best).squeeze(1)
                else:
                    q_next = q_next_target.max(dim=1).values
        q_sa = q_all.float().gather(1, action.unsqueeze(1)).squeeze(1)
        target = (reward + discount * q_next.float()).detach()
        td = target - q_sa
        loss = (weight * F.smooth_l1_loss(q_sa, target, reduction="none")).mean()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        clip = self.config.grad_clip_norm if self.config.grad_clip_norm > 0 else math.inf
        norm = torch.nn.utils.clip_grad_norm_(self.online.parameters(), clip)
        applied = bool(torch.isfinite(norm))  # one small host sync; protects the weights from NaN/inf
        if applied:
            self.optimizer.step()
            self.updates += 1
            self._refresh_target()
        else:
            self.skipped += 1
            self.optimizer.zero_grad(set_to_none=True)
            if self.skipped == 1:
                log.warning("learner: skipped an update with a non-finite gradient; further ones are only counted")
        return UpdateResult(td_abs=td.detach().abs(), loss=loss.detach(), q_mean=q_sa.detach().mean(),
                            applied=applied, batch_size=int(action.shape[0]))

    def _refresh_target(self) -> None:
        if self.config.tau > 0:
            with torch.no_grad():
                torch._foreach_lerp_(list(self.target.parameters()), list(self.online.parameters()), self.config.tau)
        elif self.updates % self.config.target_update_interval == 0:
            self.sync_target()

    def sync_target(self) -> None:
        """Hard copy online -> target."""
        self.target.load_state_dict(self.online.state_dict())

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        """Online Q-values for a batch (float32, on the host); for evaluation and tests."""
        with torch.inference_mode():
            return self.online(as_tensor(obs, self.device)).float().cpu().numpy()
