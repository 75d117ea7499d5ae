"""A checkpoint's policy as one ONNX or TorchScript graph, and the check that the graph acts as the policy does.

The ``flywheel export`` command, and the model card folder it writes, are in flywheel.tools.export_cli.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import importlib.util
import io
import json
import logging
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from flywheel.extras import MissingExtra

if TYPE_CHECKING:
    import torch

FORMATS = {"onnx": "model.onnx", "torchscript": "model.pt"}
INPUT, OUTPUTS = "obs", ("q_values", "actions")
PARITY_ATOL = 1e-4  # |Q(exported) - Q(Policy)| the CLI's own check accepts (float32 op order only)


class ExportError(Exception):
    """A checkpoint, env, output path or missing package that stops an export; the message is one line."""


@functools.cache
def _graph_class() -> type[Any]:
    """PolicyGraph, defined on first use so that ``flywheel --help`` does not import torch."""
    import torch
    from torch import nn

    class PolicyGraph(nn.Module):
        """``obs`` in the env's dtype -> (``q_values`` float32 (B, A), ``actions`` int64 (B,)), as ``Policy`` acts.

        uint8 frames go in raw (the network scales them by 1/255 inside the graph); any other dtype is cast to
        float32, as ``Policy.q_values`` does; actions are the first argmax, as ``Policy.predict(obs, 0)``.
        """

        def __init__(self, net: nn.Module, raw_uint8: bool) -> None:
            super().__init__()
            self.net = net
            self.raw_uint8 = raw_uint8

        def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            if self.raw_uint8:
                if obs.dtype != torch.uint8:
                    raise RuntimeError("this policy takes uint8 observations (raw frames, scaled inside the graph)")
                x = obs
            else:
                x = obs.to(torch.float32)
            q = self.net(x).to(torch.float32)
            return q, torch.argmax(q, dim=1)

    return PolicyGraph


def observation_dtype(policy: Any, obs_dtype: str | np.dtype[Any] | None = None) -> np.dtype[Any]:
    """The graph's input dtype: ``obs_dtype``, else the policy's env's (uint8 for frames, float32 for CartPole)."""
    if obs_dtype is None:
        from flywheel.envs import env_spec

        obs_dtype = env_spec(policy.env_id).obs_dtype
    return np.dtype(obs_dtype)


def _graph(policy: Any, dtype: np.dtype[Any]) -> tuple[torch.nn.Module, torch.Tensor]:
    """A CPU copy of the policy's network wrapped as a PolicyGraph, and an example batch of two."""
    import torch

    net = copy.deepcopy(policy.net).to("cpu").eval().requires_grad_(False)  # outputs need no .detach()
    graph = _graph_class()(net, dtype == np.uint8).eval()
    example = torch.from_numpy(np.zeros((2, *policy.obs_shape), dtype=dtype))
    return graph, example


def model_metadata(policy: Any, dtype: np.dtype[Any]) -> dict[str, str]:
    """What the exported file says about itself (ONNX metadata_props / a TorchScript extra file)."""
    net = policy.net
    return {"flywheel.env_id": policy.env_id, "flywheel.network": policy.network,
            "flywheel.obs_shape": json.dumps(list(policy.obs_shape)), "flywheel.obs_dtype": dtype.name,
            "flywheel.n_actions": str(policy.n_actions), "flywheel.dueling": json.dumps(bool(net.dueling)),
            "flywheel.head": str(net.head), "flywheel.updates": str(policy.updates),
            "flywheel.weight_version": str(policy.weight_version),
            "flywheel.checkpoint": policy.path.name if policy.path is not None else ""}


def require_packages(*modules: str) -> None:
    missing = [name for name in modules if importlib.util.find_spec(name) is None]
    if missing:
        raise ExportError(str(MissingExtra("export", "ONNX export", ImportError(f"missing: {', '.join(missing)}"))))


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Hide the exporters' progress lines, deprecation warnings and torchvision notes (not errors)."""
    loggers = [logging.getLogger(name) for name in ("torch.onnx", "onnxscript", "onnx_ir")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


def export_onnx(policy: Any, path: str | Path, *, obs_dtype: str | np.dtype[Any] | None = None) -> Path:
    """Write the policy as one self-contained ONNX file (torch.export + onnxscript): obs (batch, *obs_shape)."""
    require_packages("onnx", "onnxscript")
    import torch

    dtype = observation_dtype(policy, obs_dtype)
    graph, example = _graph(policy, dtype)
    path = Path(path)
    with _quiet():
        program = torch.onnx.export(graph, (example,), dynamo=True, input_names=[INPUT], output_names=list(OUTPUTS),
                                    dynamic_shapes=({0: torch.export.Dim("batch", min=1)},), verbose=False,
                                    external_data=False)
    if program is None:
        raise ExportError("torch.onnx.export returned no program")
    program.model.metadata_props.update(model_metadata(policy, dtype))
    program.save(str(path), external_data=False)
    return path


def export_torchscript(policy: Any, path: str | Path, *, obs_dtype: str | np.dtype[Any] | None = None) -> Path:
    """Write the policy as a scripted module (``torch.jit.load(path)(obs)`` -> q_values, actions); any batch size."""
    import torch

    dtype = observation_dtype(policy, obs_dtype)
    path = Path(path)
    with _quiet():
        module = _scripted(policy, dtype)
        torch.jit.save(module, str(path), _extra_files={"flywheel.json": json.dumps(model_metadata(policy, dtype))})
    return path


def _scripted(policy: Any, dtype: np.dtype[Any]) -> Any:
    """The scripted module of the policy's graph: what export_torchscript saves."""
    import torch

    graph, _ = _graph(policy, dtype)
    return torch.jit.script(graph)


EXPORTERS = {"onnx": export_onnx, "torchscript": export_torchscript}


def run_exported(path: str | Path, fmt: str, obs: np.ndarray, policy: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """(q_values, actions) of an exported policy for a batch: the ONNX file through onnxruntime; for TorchScript
    the module ``export_torchscript`` scripts and saves, in memory (loading a TorchScript file means torch.jit.load,
    which unpickles: this package loads no pickle, so the file's own round trip is left to torch.jit.load users)."""
    if fmt == "onnx":
        if importlib.util.find_spec("onnxruntime") is None:
            raise ExportError(str(MissingExtra("export", "running an ONNX policy",
                                               ImportError("missing: onnxruntime"))))
        import onnxruntime

        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        q, actions = session.run(list(OUTPUTS), {INPUT: np.ascontiguousarray(obs)})
        return np.asarray(q), np.asarray(actions)
    import torch

    if policy is None:
        raise ExportError("checking a TorchScript export needs the policy it was made from")
    with _quiet():
        module = _scripted(policy, observation_dtype(policy, obs.dtype))
    with torch.inference_mode():
        q_t, actions_t = module(torch.from_numpy(np.ascontiguousarray(obs)))
    return q_t.numpy(), actions_t.numpy()


def sample_observations(env_id: str, count: int, seed: int = 0) -> np.ndarray:
    """``count`` real observations of ``env_id``: its reset and uniformly random steps from there (reset on end)."""
    from flywheel.envs import make_env

    env = make_env(env_id, seed=seed)
    try:
        obs, _ = env.reset(seed=seed)
        seen = [np.asarray(obs)]
        while len(seen) < count:
            obs, _, terminated, truncated, _ = env.step(env.action_space.sample())
            if terminated or truncated:
                obs, _ = env.reset()
            seen.append(np.asarray(obs))
    finally:
        env.close()
    return np.stack(seen)


def random_observations(shape: Sequence[int], dtype: np.dtype[Any], count: int, seed: int = 0) -> np.ndarray:
    """``count`` random observations: uniform 0..255 for uint8, standard normal otherwise."""
    rng = np.random.default_rng(seed)
    if dtype == np.uint8:
        return rng.integers(0, 256, size=(count, *shape), dtype=np.uint8)
    return rng.standard_normal((count, *shape)).astype(dtype)


def check_parity(policy: Any, path: str | Path, fmt: str, obs: np.ndarray) -> float:
    """Max |dQ| of the exported file against ``policy.q_values`` on ``obs``; an ExportError if actions differ."""
    q, actions = run_exported(path, fmt, obs, policy)
    expected = policy.q_values(obs)
    worst = float(np.abs(q - expected).max())
    if q.shape != expected.shape or worst > PARITY_ATOL or not (actions == policy.predict(obs, 0.0)).all():
        raise ExportError(f"{path} does not reproduce the policy: max |dQ| {worst:.3g} (or different actions)")
    return worst
