"""The actor's acting network: NumPy for MLPs (the actor then never imports torch), torch for convolutional nets."""

from __future__ import annotations

import logging
import warnings
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np

from flywheel import proto
from flywheel.netspec import C51_ATOMS, network_kind

if TYPE_CHECKING:
    from flywheel.nets import QNetwork

Backend = Literal["auto", "numpy", "torch"]
log = logging.getLogger("flywheel.actor")


class Policy(Protocol):
    """Q-values for a batch of observations, and newer weights from the learner."""

    name: str  # the network name weights must carry, e.g. "mlp-4-2-dueling-h128"

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        """(B, n_actions) float32 Q-values for a (B, *obs_shape) batch."""
        ...

    def load(self, msg: proto.Weights) -> None:
        """Take a Weights message; raises flywheel.netspec.WeightsMismatch, changing nothing, if it does not fit."""
        ...


class TorchPolicy:
    """A ``flywheel.nets.QNetwork`` in eval mode, run under ``torch.inference_mode`` on the CPU.

    With ``freeze`` the forward pass runs as a frozen TorchScript trace of the network (traced for ``obs_dtype``):
    the same operations and results, with the weights as graph constants, which makes the Nature CNN's forward
    pass cheaper on CPU (see docs/benchmarks/actor.md). The constants share storage with the network's
    parameters, and ``load`` copies new weights into those in place, so the trace never has to be rebuilt.
    """

    def __init__(self, net: QNetwork, *, freeze: bool = False, obs_dtype: str = "float32") -> None:
        import torch

        self._torch = torch
        self.net = net.eval()
        self.name = net.name
        self.obs_dtype = np.dtype(obs_dtype)
        self.frozen: Any = None
        if freeze:
            example = torch.zeros((1, *net.obs_shape), dtype=getattr(torch, self.obs_dtype.name))
            try:
                with torch.no_grad(), warnings.catch_warnings():
                    warnings.simplefilter("ignore", DeprecationWarning)  # TorchScript is deprecated in recent torch
                    # check_trace=False: trace's own check compares through torch.testing, which imports sympy (via
                    # torch.distributed), and the actor image leaves sympy out; the same check, done here:
                    frozen = torch.jit.freeze(torch.jit.trace(net, example, check_trace=False))
                    if not torch.allclose(frozen(example), net(example), rtol=1e-4, atol=1e-5):
                        raise RuntimeError("the frozen trace computes other Q-values than the network")
                    self.frozen = frozen
            except (AttributeError, RuntimeError, ImportError) as exc:  # no TorchScript here: the eager module
                log.warning("cannot freeze %s (%s): running the eager module", net.name, exc)

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        obs = np.asarray(obs)
        forward = self.frozen if self.frozen is not None and obs.dtype == self.obs_dtype else self.net
        with self._torch.inference_mode():
            return forward(self._torch.from_numpy(obs)).float().numpy()

    def load(self, msg: proto.Weights) -> None:
        from flywheel.nets import load_weights

        load_weights(self.net, msg, self.name)  # in place: the frozen trace's constants follow


def resolve_backend(obs_shape: tuple[int, ...], backend: Backend = "auto") -> Literal["numpy", "torch"]:
    """"auto": NumPy for vector observations (the MLP), torch for images and grids (convolutions)."""
    mlp = network_kind(tuple(obs_shape)) == "mlp"
    if backend == "numpy" and not mlp:
        raise ValueError(f"inference=numpy covers the MLP of vector observations; {tuple(obs_shape)} needs torch")
    if backend == "auto":
        return "numpy" if mlp else "torch"
    return backend


def build_policy(obs_shape: tuple[int, ...], n_actions: int, *, dueling: bool = True, hidden: int = 256,
                 head: str = "q", num_quantiles: int = 51, c51_atoms: int = C51_ATOMS,
                 backend: Backend = "auto", threads: int | None = 1,
                 seed: int | None = None, freeze: bool = False, obs_dtype: str = "float32") -> Policy:
    """The acting network for ``obs_shape``; ``threads`` (unless None) caps the math library's threads.

    ``seed`` draws the network's initial weights (for torch, by seeding torch's global generator); ``freeze``
    and ``obs_dtype`` (the observations' dtype) apply to torch networks (see :class:`TorchPolicy`).
    """
    if resolve_backend(obs_shape, backend) == "numpy":
        from flywheel.nets_numpy import NumpyQNetwork

        from .blas import limit_blas_threads

        if threads is not None:
            limit_blas_threads(threads)
        return NumpyQNetwork(obs_shape, n_actions, dueling=dueling, hidden=hidden, head=head,
                             num_quantiles=num_quantiles, c51_atoms=c51_atoms, seed=seed)
    import torch

    from flywheel.nets import build_q_network

    if threads is not None:
        torch.set_num_threads(threads)
    if seed is not None:
        torch.manual_seed(seed)
    net = build_q_network(obs_shape, n_actions, dueling=dueling, hidden=hidden, head=head,
                          num_quantiles=num_quantiles, c51_atoms=c51_atoms)
    return TorchPolicy(net, freeze=freeze, obs_dtype=obs_dtype)
