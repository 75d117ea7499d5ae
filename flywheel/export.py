"""``flywheel export``: a checkpoint's policy as one ONNX or TorchScript graph, optionally in a model card folder."""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import importlib.util
import io
import json
import logging
import shutil
import sys
import time
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
VIDEOS = ("replay.mp4", "video.mp4")  # copied into a card as replay.mp4, the first one found


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


def _require(*modules: str) -> None:
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
    _require("onnx", "onnxscript")
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


def find_beside(checkpoint: Path, names: Sequence[str]) -> Path | None:
    """The first of ``names`` next to the checkpoint file or one folder up (a flywheel run folder)."""
    for folder in (checkpoint.parent, checkpoint.parent.parent):
        for name in names:
            if (folder / name).is_file():
                return folder / name
    return None


def card_evaluation(policy: Any, episodes: int, *, seed: int = 0, workers: int = 1,
                    max_steps: int | None = None) -> dict[str, Any]:
    """Greedy (epsilon 0) episodes of the checkpoint file with flywheel.evaluation, seeds seed..seed+episodes-1."""
    from flywheel.evaluation import STALL_STEPS, evaluate, summarize

    seeds = list(range(seed, seed + episodes))
    records = evaluate(policy.env_id, seeds, checkpoint=str(policy.path), epsilon=0.0, workers=workers,
                       max_steps=max_steps)
    returns = [float(r["return"]) for r in records]
    mario = any(r["x_pos_max"] is not None for r in records)
    summary = summarize(returns, [bool(r["flag"]) for r in records] if mario else None)
    return {"env_id": policy.env_id, "mean_reward": summary["mean"], "std_reward": float(np.std(returns)),
            "median_reward": summary["median"], "ci95_mean": [summary["ci_low"], summary["ci_high"]],
            "flag_rate": summary["flag_rate"], "n_eval_episodes": len(seeds), "seeds": seeds, "epsilon": 0.0,
            "is_deterministic": True, "max_steps": max_steps, "stall_steps": STALL_STEPS if mario else None,
            "eval_datetime": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "episodes": records}


def front_matter(policy: Any, results: dict[str, Any], fmt: str) -> str:
    """Hugging Face model card metadata for an RL model: tags, library, a model-index with mean_reward (strings as
    JSON strings, which YAML reads as double-quoted scalars)."""
    env, name = json.dumps(policy.env_id), json.dumps(f"DQN-{policy.env_id}")
    value = json.dumps(f"{results['mean_reward']:.2f} +/- {results['std_reward']:.2f}")
    return "\n".join([
        "---", "library_name: flywheel", "tags:", f"- {env}", "- reinforcement-learning",
        "- deep-reinforcement-learning", "- dqn", f"- {fmt}", "model-index:", f"- name: {name}",
        "  results:", "  - task:", "      type: reinforcement-learning", "      name: reinforcement-learning",
        "    dataset:", f"      name: {env}", f"      type: {env}", "    metrics:",
        "    - type: mean_reward", f"      value: {value}", "      name: mean_reward", "      verified: false",
        "---", ""])


def _card_body(policy: Any, results: dict[str, Any], model_file: str, dtype: np.dtype[Any], which: str,
               files: list[str], parity: dict[str, Any] | None) -> str:
    env, shape = policy.env_id, ", ".join(str(d) for d in policy.obs_shape)
    name = policy.path.name if policy.path else "?"
    picked = ("the weights that did best in the learner's greedy evaluations" if name == "best.safetensors"
              else "the newest weights")
    seeds = results["seeds"]
    mario = results["flag_rate"] is not None
    low, high = results["ci95_mean"]
    lines = [
        f"# DQN agent for {env} (Flywheel)", "",
        f"A `{policy.network}` Q-network trained with Flywheel (distributed Ape-X DQN), exported as `{model_file}` "
        f"from `{name}` ({picked}, chosen by `--which {which}`; weight version {policy.weight_version}, "
        f"{policy.updates} learner updates).", "",
        "## Evaluation", "",
        f"{results['n_eval_episodes']} episodes with `flywheel.evaluation`, one per seed "
        f"({seeds[0]}..{seeds[-1]}: each episode's env reset seed), epsilon {results['epsilon']:g} (greedy)"
        + (f", an episode cut after {results['stall_steps']} agent steps without progress (the stall rule)"
           if mario else "")
        + (f", at most {results['max_steps']} agent steps" if results["max_steps"] else "") + ".", "",
        "| mean return | std | median | 95% CI of the mean (bootstrap) |" + (" flag rate |" if mario else ""),
        "| --- | --- | --- | --- |" + (" --- |" if mario else ""),
        f"| {results['mean_reward']:.2f} | {results['std_reward']:.2f} | {results['median_reward']:.2f} | "
        f"{low:.2f} .. {high:.2f} |" + (f" {results['flag_rate']:.0%} |" if mario else ""), "",
        "| seed | return | length | end |" + (" max x | flag |" if mario else ""),
        "| --- | --- | --- | --- |" + (" --- | --- |" if mario else ""),
    ]
    for r in results["episodes"]:
        row = f"| {r['seed']} | {r['return']:.2f} | {r['length']} | {r['end']} |"
        lines.append(row + (f" {r['x_pos_max']} | {'yes' if r['flag'] else 'no'} |" if mario else ""))
    lines += [
        "", "Every episode, with its seed, is in `results.json`. The episodes ran the checkpoint's network in "
        "PyTorch" + (f"; the exported graph gave the same actions and Q-values within {parity['max_abs_dq']:.1e} "
                     f"({parity['runtime']}) on {parity['observations']} {parity['source']} observations of the env."
                     if parity else "."), "",
        "## Use", "",
        f"Input `{INPUT}`: {dtype.name} `(batch, {shape})`, the env's raw observation"
        + (" (frames are scaled by 1/255 inside the graph)" if dtype == np.uint8 else "") + "; any batch size.",
        f"Outputs `q_values`: float32 `(batch, {policy.n_actions})`; `actions`: int64 `(batch,)`, the greedy "
        "action (argmax of the Q-values).", "",
    ]
    if model_file.endswith(".onnx"):
        lines += ["```python", "import onnxruntime", "", f'session = onnxruntime.InferenceSession("{model_file}")',
                  f'q_values, actions = session.run(None, {{"{INPUT}": obs[None]}})  # obs from the env', "```"]
    else:
        lines += ["```python", "import torch", "", f'policy = torch.jit.load("{model_file}")',
                  "q_values, actions = policy(torch.from_numpy(obs[None]))  # obs from the env", "```"]
    lines += ["", "## Files", ""] + [f"- `{name}`" for name in files] + [""]
    return "\n".join(lines)


def write_card(folder: str | Path, policy: Any, model_path: str | Path, results: dict[str, Any], *,
               which: str = "auto", obs_dtype: str | np.dtype[Any] | None = None,
               parity: dict[str, Any] | None = None) -> Path:
    """A model folder as the Hugging Face tools upload it: README.md (YAML front matter), the model, config.json,
    results.json, and the run's run.json, best.json and replay video when they sit beside the checkpoint."""
    folder, model_path = Path(folder), Path(model_path)
    folder.mkdir(parents=True, exist_ok=True)
    dtype = observation_dtype(policy, obs_dtype)
    fmt = "onnx" if model_path.suffix == ".onnx" else "torchscript"
    if model_path.resolve() != (folder / model_path.name).resolve():
        shutil.copyfile(model_path, folder / model_path.name)
    net = policy.net
    config = {"format": fmt, "file": model_path.name, "env_id": policy.env_id, "inputs": {INPUT: {
        "dtype": dtype.name, "shape": ["batch", *policy.obs_shape]}}, "outputs": {
        "q_values": {"dtype": "float32", "shape": ["batch", policy.n_actions]},
        "actions": {"dtype": "int64", "shape": ["batch"]}},
        "network": {"name": policy.network, "obs_shape": list(policy.obs_shape), "n_actions": policy.n_actions,
                    "dueling": bool(net.dueling), "hidden": int(net.hidden), "head": str(net.head),
                    "num_quantiles": int(net.num_quantiles)},
        "checkpoint": {"file": policy.path.name if policy.path else None, "which": which,
                       "updates": policy.updates, "weight_version": policy.weight_version}, "parity": parity}
    (folder / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    (folder / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    files = [model_path.name, "config.json", "results.json"]
    if policy.path is not None:
        for names, target in ((("run.json",), "run.json"), (VIDEOS, "replay.mp4")):
            found = find_beside(policy.path, names)
            if found is not None:
                shutil.copyfile(found, folder / target)
                files.append(target)
        best = policy.path.parent / "best.json"
        if policy.path.name == "best.safetensors" and best.is_file():
            shutil.copyfile(best, folder / "best.json")
            files.append("best.json")
    readme = front_matter(policy, results, fmt) + _card_body(policy, results, model_path.name, dtype, which,
                                                            ["README.md", *files], parity)
    (folder / "README.md").write_text(readme)
    return folder / "README.md"


def add_export_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint_dir", type=Path, metavar="CHECKPOINT_DIR",
                        help="a flywheel run --checkpoint-dir (or its learner/ folder)")
    parser.add_argument("--format", choices=tuple(FORMATS), default="onnx", help="onnx (default) or torchscript")
    parser.add_argument("--out", type=Path, default=None, metavar="PATH",
                        help="the model file (default CHECKPOINT_DIR/export/model.onnx or model.pt); with --card, "
                             "the card folder (default CHECKPOINT_DIR/export)")
    parser.add_argument("--which", choices=("auto", "best", "latest"), default="auto",
                        help="best: the weights that did best in the learner's greedy evaluations; latest: the "
                             "newest; auto (default): best when the run kept one, else latest")
    parser.add_argument("--env", default=None, help="environment id (default: the checkpoint's or run.json's)")
    parser.add_argument("--card", action="store_true",
                        help="write a model folder: README.md (Hugging Face card), model, config, results, video")
    parser.add_argument("--card-episodes", type=int, default=10, help="greedy evaluation episodes (default 10)")
    parser.add_argument("--card-seed", type=int, default=0, help="seed of the first evaluation episode (default 0)")
    parser.add_argument("--card-workers", type=int, default=1, help="evaluation processes (default 1)")
    parser.add_argument("--card-max-steps", type=int, default=None, help="cut evaluation episodes at this length")


def _load(args: argparse.Namespace) -> Any:
    from flywheel.envs import env_spec
    from flywheel.policy import Policy

    try:
        policy = Policy.load(args.checkpoint_dir, env_id=args.env, device="cpu", which=args.which)
        spec = env_spec(policy.env_id)
    except Exception as exc:  # the policy's own one-line errors: missing, damaged or foreign checkpoints
        text = str(exc).strip()
        raise ExportError(text.splitlines()[0].replace("pass env_id", "pass --env ENV_ID") if text
                          else type(exc).__name__) from None
    if (tuple(spec.obs_shape), spec.n_actions) != (tuple(policy.obs_shape), policy.n_actions):
        raise ExportError(f"the checkpoint is for observations {tuple(policy.obs_shape)} and {policy.n_actions} "
                          f"actions, but {policy.env_id} has {tuple(spec.obs_shape)} and {spec.n_actions}: pass "
                          "the env it was trained on (--env)")
    return policy


def run_export(args: argparse.Namespace) -> int:
    for flag, value, least in (("--card-episodes", args.card_episodes, 1), ("--card-workers", args.card_workers, 1),
                               ("--card-max-steps", args.card_max_steps, 1)):
        if value is not None and value < least:
            print(f"error: flywheel export: {flag} must be at least {least}, got {value}", file=sys.stderr)
            return 2
    try:
        if args.format == "onnx":
            _require("onnx", "onnxscript", "onnxruntime")
        policy = _load(args)
        base = args.out if args.out is not None else args.checkpoint_dir / "export"
        model = base / FORMATS[args.format] if args.card or args.out is None or args.out.is_dir() else base
        model.parent.mkdir(parents=True, exist_ok=True)
        dtype = observation_dtype(policy)
        EXPORTERS[args.format](policy, model, obs_dtype=dtype)
        try:
            obs, source = sample_observations(policy.env_id, 32, seed=0).astype(dtype, copy=False), "real"
        except ValueError:  # an env make_env does not build alone (MettaGrid): random observations of its kind
            obs, source = random_observations(policy.obs_shape, dtype, 32), "random"
        worst = check_parity(policy, model, args.format, obs)
        print(f"wrote {model} from {policy.path} (weight version {policy.weight_version}): {INPUT} {dtype.name} "
              f"(batch, {', '.join(map(str, policy.obs_shape))}) -> q_values float32 (batch, {policy.n_actions}), "
              f"actions int64 (batch,); matches the policy on {len(obs)} {source} {policy.env_id} observations "
              f"(max |dQ| {worst:.1e})", flush=True)
        if args.card:
            results = card_evaluation(policy, args.card_episodes, seed=args.card_seed, workers=args.card_workers,
                                      max_steps=args.card_max_steps)
            parity = {"observations": len(obs), "source": source, "max_abs_dq": worst,
                      "runtime": "onnxruntime" if args.format == "onnx" else "torch.jit"}
            readme = write_card(base, policy, model, results, which=args.which, obs_dtype=dtype, parity=parity)
            print(f"wrote the model card {readme}: mean return {results['mean_reward']:.2f} +/- "
                  f"{results['std_reward']:.2f} over {results['n_eval_episodes']} greedy episodes (seeds "
                  f"{args.card_seed}..{args.card_seed + args.card_episodes - 1})", flush=True)
    except (ExportError, OSError, ValueError, RuntimeError) as exc:
        text = str(exc).strip()
        print(f"error: flywheel export: {text.splitlines()[0] if text else type(exc).__name__}", file=sys.stderr)
        return 2
    return 0
