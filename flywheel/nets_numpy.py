"""QNetwork's MLP (vector observations) in NumPy, loaded from Weights messages: acting without importing torch."""

from __future__ import annotations

import math

import numpy as np

from flywheel import proto
from flywheel.netspec import C51_ATOMS, QNetworkBase, check_weights, mlp_parameter_shapes


class NumpyQNetwork(QNetworkBase):
    """The forward pass of ``flywheel.nets.QNetwork`` for the "mlp" kind, in float32 NumPy.

    Same parameters (the state_dict keys and shapes of the torch network), same name, same outputs up to float
    rounding: Linear-ReLU, Linear-ReLU, then the advantage stream, the dueling value stream when ``dueling``, and
    for ``head="quantile"`` per-action quantiles whose mean is Q, for ``head="c51"`` per-action atom logits whose
    distribution's mean over ``support`` is Q. Before the first ``load`` it holds torch's default initialisation
    (uniform in +-1/sqrt(fan_in)), drawn from ``seed``, and the support linspace(v_min, v_max, c51_atoms).
    """

    def __init__(self, obs_shape: tuple[int, ...], n_actions: int, *, dueling: bool = True, hidden: int = 256,
                 head: str = "q", num_quantiles: int = 51, seed: int | None = None, v_min: float = -10.0,
                 v_max: float = 10.0, c51_atoms: int = C51_ATOMS) -> None:
        self._specify(obs_shape, n_actions, dueling=dueling, hidden=hidden, head=head, num_quantiles=num_quantiles,
                      c51_atoms=c51_atoms, v_min=v_min, v_max=v_max)
        if self.kind != "mlp":
            raise ValueError(f"NumpyQNetwork covers vector observations only; {self.obs_shape} needs "
                             "flywheel.nets.QNetwork")
        self.shapes = mlp_parameter_shapes(self.obs_shape, self.n_actions, dueling=self.dueling, hidden=self.hidden,
                                           outputs_per_action=self.per_action, support=head == "c51")
        rng = np.random.default_rng(seed)
        params: dict[str, np.ndarray] = {}
        if head == "c51":
            params["support"] = np.linspace(v_min, v_max, self.per_action, dtype=np.float32)
        for key, shape in self.shapes.items():
            if key == "support":
                continue
            fan_in = self.shapes[key.rsplit(".", 1)[0] + ".weight"][1]
            bound = 1.0 / math.sqrt(fan_in)
            params[key] = rng.uniform(-bound, bound, size=shape).astype(np.float32)
        self._set(params)

    def _set(self, params: dict[str, np.ndarray]) -> None:
        # Weights are kept transposed, (in, out) and C-contiguous, so each layer is one x @ W (a BLAS sgemm).
        def layer(prefix: str) -> tuple[np.ndarray, np.ndarray]:
            weight = np.ascontiguousarray(np.asarray(params[prefix + ".weight"], dtype=np.float32).T)
            return weight, np.array(params[prefix + ".bias"], dtype=np.float32)

        self._torso = layer("torso.1")
        self._fc = layer("fc.0")
        self._advantage = layer("advantage")
        self._value = layer("value") if self.dueling else None
        self._support = np.array(params["support"], dtype=np.float32) if self.head == "c51" else None

    def state_dict(self) -> dict[str, np.ndarray]:
        """Copies of the parameters under QNetwork's state_dict keys and shapes."""
        out: dict[str, np.ndarray] = {}
        layers = {"torso.1": self._torso, "fc.0": self._fc, "advantage": self._advantage}
        if self._value is not None:
            layers["value"] = self._value
        for prefix, (weight, bias) in layers.items():
            out[prefix + ".weight"] = np.ascontiguousarray(weight.T)
            out[prefix + ".bias"] = bias.copy()
        if self._support is not None:
            out["support"] = self._support.copy()
        return out

    def load(self, msg: proto.Weights) -> None:
        """Take a Weights message; raises WeightsMismatch before changing anything if it does not fit."""
        check_weights(msg, self.name, self.shapes)
        self._set(msg.tensors)

    def outputs(self, obs: np.ndarray) -> np.ndarray:
        """The head's own output: (B, A) Q-values, (B, A, N) quantiles (quantile) or atom logits (c51)."""
        obs = np.asarray(obs)
        x = obs.reshape(len(obs), -1)
        x = x.astype(np.float32) / np.float32(255.0) if x.dtype == np.uint8 else x.astype(np.float32, copy=False)
        h = x @ self._torso[0]
        h += self._torso[1]
        np.maximum(h, 0, out=h)
        h2 = h @ self._fc[0]
        h2 += self._fc[1]
        np.maximum(h2, 0, out=h2)
        adv = h2 @ self._advantage[0]
        adv += self._advantage[1]
        if self.head != "q":
            adv = adv.reshape(len(obs), self.n_actions, self.per_action)
        if self._value is None:
            return adv
        value = h2 @ self._value[0]
        value += self._value[1]
        value = value.reshape(len(obs), 1, self.per_action) if self.head != "q" else value
        return value + adv - adv.mean(axis=1, keepdims=True)

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        """(B, n_actions) float32 Q-values for a (B, *obs_shape) batch (the quantiles' or the c51 atoms' mean)."""
        out = self.outputs(obs)
        if self.head == "q":
            return out
        if self._support is None:
            return out.mean(axis=2)
        shifted = np.exp(out - out.max(axis=2, keepdims=True))
        return ((shifted @ self._support) / shifted.sum(axis=2)).astype(np.float32, copy=False)
