"""The Q-network shared by actors and the learner, and its exchange as versioned Weights messages."""

from __future__ import annotations

import math
import warnings

import numpy as np
import torch
from torch import nn

from flywheel import proto
from flywheel.netspec import (  # noqa: F401  (re-exported: flywheel.nets is where users look for them)
    C51_ATOMS,
    HEADS,
    NATURE_MIN_SIDE,
    Head,
    QNetworkBase,
    WeightsMismatch,
    check_spec,
    check_support,
    check_weights,
    network_kind,
    network_name,
    outputs_per_action,
)


class QNetwork(nn.Module, QNetworkBase):
    """Maps a batch of observations (uint8 pixels or float32 vectors) to (B, n_actions) float32 Q-values.

    With ``head="quantile"`` (QR-DQN) the last layers produce ``num_quantiles`` return quantiles per action;
    ``forward`` still returns their mean, so an actor acts greedily on Q without knowing the head. With
    ``head="c51"`` (C51, Bellemare et al., 2017) they produce the logits of ``c51_atoms`` atoms spread evenly over
    [v_min, v_max]; the atoms' values are the buffer ``support``, part of the state_dict, so the learner's support
    reaches the actors with the weights, and ``forward`` returns sum(softmax(logits) * support).
    """

    def __init__(self, obs_shape: tuple[int, ...], n_actions: int, *, dueling: bool = True, hidden: int = 256,
                 head: str = "q", num_quantiles: int = 51, v_min: float = -10.0,
                 v_max: float = 10.0, c51_atoms: int = C51_ATOMS) -> None:
        super().__init__()
        self._specify(obs_shape, n_actions, dueling=dueling, hidden=hidden, head=head, num_quantiles=num_quantiles,
                      c51_atoms=c51_atoms, v_min=v_min, v_max=v_max)
        self.support: torch.Tensor | None
        if head == "c51":
            self.register_buffer("support", torch.linspace(float(v_min), float(v_max), self.per_action))
        else:
            self.support = None
        if self.kind == "nature":
            c = self.obs_shape[0]
            self.torso: nn.Module = nn.Sequential(
                nn.Conv2d(c, 32, 8, stride=4), nn.ReLU(),
                nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
                nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(),
                nn.Flatten(),
            )
            width = 512
        elif self.kind == "conv":
            c = self.obs_shape[0]
            self.torso = nn.Sequential(
                nn.Conv2d(c, 32, 3, padding=1), nn.ReLU(),
                nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(),
                nn.Flatten(),
            )
            width = self.hidden
        else:
            self.torso = nn.Sequential(
                nn.Flatten(), nn.Linear(math.prod(self.obs_shape), self.hidden), nn.ReLU(),
            )
            width = self.hidden
        with torch.no_grad():
            features = self.torso(torch.zeros(1, *self.obs_shape)).shape[1]
        self.fc = nn.Sequential(nn.Linear(features, width), nn.ReLU())
        self.advantage = nn.Linear(width, self.n_actions * self.per_action)
        self.value = nn.Linear(width, self.per_action) if self.dueling else None

    def outputs(self, obs: torch.Tensor) -> torch.Tensor:
        """The head's own output: (B, A) Q-values, (B, A, N) quantiles (quantile) or atom logits (c51)."""
        x = obs.float() / 255.0 if obs.dtype == torch.uint8 else obs.float()
        h = self.fc(self.torso(x))
        adv = self.advantage(h)
        if self.head != "q":
            n = self.per_action
            adv = adv.view(-1, self.n_actions, n)
            return adv if self.value is None else self.value(h).view(-1, 1, n) + adv - adv.mean(dim=1, keepdim=True)
        return adv if self.value is None else self.value(h) + adv - adv.mean(dim=1, keepdim=True)

    def q_values(self, out: torch.Tensor) -> torch.Tensor:
        """(B, A) Q-values from ``outputs``: Q itself, the quantiles' mean, or the c51 distribution's mean."""
        if self.head == "q":
            return out
        if self.support is not None:
            return (torch.softmax(out.float(), dim=2) * self.support).sum(dim=2)
        return out.mean(dim=2)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Q-values for a (B, *obs_shape) batch; uint8 input is scaled by 1/255 on the tensor's device."""
        return self.q_values(self.outputs(obs))


def build_q_network(obs_shape: tuple[int, ...], n_actions: int, *, dueling: bool = True, hidden: int = 256,
                    head: str = "q", num_quantiles: int = 51, v_min: float = -10.0,
                    v_max: float = 10.0, c51_atoms: int = C51_ATOMS) -> QNetwork:
    """3-D (C,H,W) with H,W >= 36 -> Nature CNN (512 fc); smaller 3-D -> 3x3 CNN; otherwise an MLP.

    ``v_min``/``v_max``: the c51 head's support (an actor's net takes the learner's with the first weights);
    ``c51_atoms``: its atoms.
    """
    return QNetwork(tuple(obs_shape), n_actions, dueling=dueling, hidden=hidden, head=head,
                    num_quantiles=num_quantiles, v_min=v_min, v_max=v_max, c51_atoms=c51_atoms)


def forward_macs(net: QNetwork) -> int:
    """Multiply-accumulates of one forward pass for one observation (convolutions and linear layers)."""
    total = 0

    def count(module: nn.Module, _inputs: object, output: torch.Tensor) -> None:
        nonlocal total
        if isinstance(module, nn.Conv2d):
            per_output = (module.in_channels // module.groups) * math.prod(module.kernel_size)
            total += output.numel() * per_output
        elif isinstance(module, nn.Linear):
            total += module.in_features * module.out_features

    hooks = [m.register_forward_hook(count) for m in net.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]
    try:
        device = next(net.parameters()).device
        with torch.no_grad():
            net(torch.zeros(1, *net.obs_shape, device=device))
    finally:
        for hook in hooks:
            hook.remove()
    return total


def as_tensor(array: np.ndarray, device: torch.device | str = "cpu") -> torch.Tensor:
    """A tensor over a (possibly read-only, e.g. decoded) array, moved to ``device``; never written to."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*not writable.*")
        tensor = torch.from_numpy(np.asarray(array))
    return tensor.to(device, non_blocking=True) if torch.device(device).type != "cpu" else tensor


def weights_message(net: QNetwork, version: int, name: str) -> proto.Weights:
    """A Weights message holding float32, contiguous CPU copies of the network's state_dict."""
    tensors = {
        key: value.detach().to("cpu", dtype=torch.float32, copy=True).contiguous().numpy()
        for key, value in net.state_dict().items()
    }
    return proto.Weights(version=int(version), network=name, tensors=tensors)


def load_weights(net: QNetwork, msg: proto.Weights, expected_name: str) -> None:
    """Copy a Weights message into ``net``; raises WeightsMismatch before touching the net if anything differs."""
    own = net.state_dict()
    check_weights(msg, expected_name, {key: tuple(param.shape) for key, param in own.items()})
    with torch.no_grad():
        for key, param in own.items():
            param.copy_(as_tensor(msg.tensors[key]))
