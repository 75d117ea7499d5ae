"""``flywheel export``: the command's flags and run, and the Hugging Face model card folder it writes (``--card``).

The graphs themselves and their parity check are flywheel.export.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from flywheel.evaluation import EPSILON, FIRST_SEED
from flywheel.export import (
    EXPORTERS,
    FORMATS,
    INPUT,
    ExportError,
    check_parity,
    observation_dtype,
    random_observations,
    require_packages,
    sample_observations,
)

VIDEOS = ("replay.mp4", "video.mp4")  # copied into a card as replay.mp4, the first one found


def find_beside(checkpoint: Path, names: Sequence[str]) -> Path | None:
    """The first of ``names`` next to the checkpoint file or one folder up (a flywheel run folder)."""
    for folder in (checkpoint.parent, checkpoint.parent.parent):
        for name in names:
            if (folder / name).is_file():
                return folder / name
    return None


def card_evaluation(policy: Any, episodes: int, *, seed: int = FIRST_SEED, workers: int = 1,
                    max_steps: int | None = None, epsilon: float = EPSILON) -> dict[str, Any]:
    """The checkpoint file played under the protocol of ``flywheel eval`` (flywheel.evaluation.run_protocol: seeds
    seed..seed+episodes-1 at ``epsilon``, the env preset's no-op starts, no stall rule), as results.json holds it."""
    from flywheel.evaluation import Protocol, run_protocol

    protocol = Protocol(episodes=episodes, seed=seed, epsilons=(epsilon,), max_steps=max_steps)
    result = run_protocol(policy.env_id, str(policy.path), protocol, workers=workers)
    [row] = result["rows"]
    returns = [float(r["return"]) for r in row["records"]]
    ret, success = row["return"], row["success"]
    return {"env_id": policy.env_id, "mean_reward": ret["mean"], "std_reward": float(np.std(returns)),
            "median_reward": ret["median"], "ci95_mean": [ret["ci_low"], ret["ci_high"]],
            "ci95_median": [ret["median_ci_low"], ret["median_ci_high"]],
            "measures": row["measures"] if row["progress"] and success else {},  # the card shows both or neither
            "progress": row["progress"], "success_rate": success["rate"] if success else None,
            "ci95_success": [success["ci_low"], success["ci_high"]] if success else None,
            "n_eval_episodes": episodes, "seeds": protocol.seeds, "epsilon": epsilon,
            "is_deterministic": epsilon == 0.0, "max_steps": max_steps, "stall_steps": protocol.stall_steps,
            "noop_max": result["protocol"]["noop_max"], "protocol": result["described"],
            "eval_datetime": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "episodes": row["records"]}


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
    picked = ("the weights that did best in the learner's evaluations" if name == "best.safetensors"
              else "the newest weights")
    seeds, named = results["seeds"], results["measures"]
    low, high = results["ci95_mean"]
    again = (f"flywheel eval CHECKPOINT_DIR --which {'best' if name == 'best.safetensors' else 'latest'} --episodes "
             f"{results['n_eval_episodes']} --seed {seeds[0]} --epsilon {results['epsilon']:g}"
             + (f" --max-steps {results['max_steps']}" if results["max_steps"] else ""))
    lines = [
        f"# DQN agent for {env} (Flywheel)", "",
        f"A `{policy.network}` Q-network trained with Flywheel (distributed Ape-X DQN), exported as `{model_file}` "
        f"from `{name}` ({picked}, chosen by `--which {which}`; weight version {policy.weight_version}, "
        f"{policy.updates} learner updates).", "",
        "## Evaluation", "",
        f"Played with `flywheel.evaluation` under the protocol of `flywheel eval`: {results['protocol']}. Each "
        "episode's seed resets the env and draws its no-ops and random actions, so another machine plays the same "
        f"episodes: `{again}`.", "",
        "| mean return (95% CI) | std | median return (95% CI) |"
        + (f" mean {named['progress']} (95% CI) | {named['success']} rate (95% CI) |" if named else ""),
        "| --- | --- | --- |" + (" --- | --- |" if named else ""),
        f"| {results['mean_reward']:.2f} ({low:.2f} .. {high:.2f}) | {results['std_reward']:.2f} | "
        f"{results['median_reward']:.2f} ({results['ci95_median'][0]:.2f} .. {results['ci95_median'][1]:.2f}) |"
        + (f" {results['progress']['mean']:,.0f} ({results['progress']['ci_low']:,.0f} .. "
           f"{results['progress']['ci_high']:,.0f}) | {results['success_rate']:.0%} ({results['ci95_success'][0]:.0%}"
           f" .. {results['ci95_success'][1]:.0%}) |" if named else ""),
        "", "Intervals: percentile bootstrap of the mean and the median; Wilson for a rate.", "",
        "| seed | no-ops | return | length | end |" + (f" {named['progress']} | {named['success']} |" if named else ""),
        "| --- | --- | --- | --- | --- |" + (" --- | --- |" if named else ""),
    ]
    for r in results["episodes"]:
        row = f"| {r['seed']} | {r['noops']} | {r['return']:.2f} | {r['length']} | {r['end']} |"
        lines.append(row + (f" {r['progress']:g} | {'yes' if r['success'] else 'no'} |" if named else ""))
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
                    "num_quantiles": int(net.num_quantiles), "c51_atoms": int(net.c51_atoms)},
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
                        help="best: the weights that did best in the learner's evaluations; latest: the "
                             "newest; auto (default): best when the run kept one, else latest")
    parser.add_argument("--env", default=None, help="environment id (default: the checkpoint's or run.json's)")
    parser.add_argument("--card", action="store_true",
                        help="write a model folder: README.md (Hugging Face card), model, config, results, video")
    parser.add_argument("--card-episodes", type=int, default=10,
                        help="evaluation episodes, played as flywheel eval plays them (default 10)")
    parser.add_argument("--card-seed", type=int, default=FIRST_SEED,
                        help=f"seed of the first evaluation episode (default {FIRST_SEED}, as flywheel eval)")
    parser.add_argument("--card-epsilon", type=float, default=EPSILON,
                        help=f"the evaluation's exploration rate (default {EPSILON:g}, as flywheel eval)")
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
                               ("--card-max-steps", args.card_max_steps, 1), ("--card-seed", args.card_seed, 0)):
        if value is not None and value < least:
            print(f"error: flywheel export: {flag} must be at least {least}, got {value}", file=sys.stderr)
            return 2
    if not 0.0 <= args.card_epsilon <= 1.0:
        print(f"error: flywheel export: --card-epsilon must be in [0, 1], got {args.card_epsilon}", file=sys.stderr)
        return 2
    try:
        if args.format == "onnx":
            require_packages("onnx", "onnxscript", "onnxruntime")
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
                                      max_steps=args.card_max_steps, epsilon=args.card_epsilon)
            parity = {"observations": len(obs), "source": source, "max_abs_dq": worst,
                      "runtime": "onnxruntime" if args.format == "onnx" else "torch.jit"}
            readme = write_card(base, policy, model, results, which=args.which, obs_dtype=dtype, parity=parity)
            print(f"wrote the model card {readme}: mean return {results['mean_reward']:.2f} +/- "
                  f"{results['std_reward']:.2f} ({results['protocol']})", flush=True)
    except (ExportError, OSError, ValueError, RuntimeError) as exc:
        text = str(exc).strip()
        print(f"error: flywheel export: {text.splitlines()[0] if text else type(exc).__name__}", file=sys.stderr)
        return 2
    return 0
