"""flywheel export: ONNX / TorchScript graphs of real learner checkpoints match Policy on real env observations."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
import yaml
from checkpoint_helpers import learner_checkpoint

from flywheel.envs import make_env
from flywheel.evaluation import evaluate
from flywheel.export import ExportError, export_onnx, export_torchscript
from flywheel.policy import Policy
from flywheel.stats import summarize

MARIO = "SuperMarioBros-1-1-v0"
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning")
Runner = Callable[[np.ndarray], tuple[np.ndarray, np.ndarray]]  # a batch -> (q_values, actions)


@pytest.fixture(scope="module")
def cartpole(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return learner_checkpoint(tmp_path_factory.mktemp("cartpole"), "CartPole-v1", (4,), 2)


@pytest.fixture(scope="module")
def mario(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return learner_checkpoint(tmp_path_factory.mktemp("mario"), MARIO, (4, 84, 84), 7)


def real_observations(env_id: str, count: int) -> np.ndarray:
    """Observations the env itself gives: its reset, then steps with a fixed, varied action sequence."""
    env = make_env(env_id, seed=3)
    try:
        obs, _ = env.reset(seed=3)
        seen = [np.asarray(obs)]
        while len(seen) < count:
            obs, _, terminated, truncated, _ = env.step(len(seen) * 7 % int(env.action_space.n))
            seen.append(np.asarray(obs))
            if terminated or truncated:
                obs, _ = env.reset()
    finally:
        env.close()
    return np.stack(seen)


def assert_parity(policy: Policy, run: Runner, obs: np.ndarray) -> None:
    """Batches of 1 and 7 (the graph's batch dimension is dynamic): Q within 1e-5, the same greedy actions."""
    for batch in (obs[:1], obs[:7]):
        q, actions = run(batch)
        assert q.dtype == np.float32 and q.shape == (len(batch), policy.n_actions)
        assert actions.dtype == np.int64 and actions.shape == (len(batch),)
        np.testing.assert_allclose(q, policy.q_values(batch), rtol=0, atol=1e-5)
        assert (actions == policy.predict(batch, epsilon=0.0)).all()


def onnx_runner(path: Path) -> Runner:
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return lambda batch: tuple(session.run(["q_values", "actions"], {"obs": batch}))


def jit_runner(path: Path) -> Runner:
    module = torch.jit.load(str(path))

    def run(batch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        q, actions = module(torch.from_numpy(batch))
        return q.numpy(), actions.numpy()

    return run


@pytest.mark.parametrize("env_id", ["CartPole-v1", MARIO])
def test_onnx_graph_takes_raw_observations_and_matches_the_policy(env_id: str, cartpole: Path, mario: Path,
                                                                  tmp_path: Path) -> None:
    policy = Policy.load(cartpole if env_id == "CartPole-v1" else mario, which="latest")
    obs = real_observations(env_id, 9)
    raw = "uint8" if env_id == MARIO else "float32"
    assert obs.dtype == np.dtype(raw) and obs.shape[1:] == policy.obs_shape
    path = export_onnx(policy, tmp_path / "model.onnx")
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    [inp] = session.get_inputs()
    elem = {"uint8": "tensor(uint8)", "float32": "tensor(float)"}[raw]
    assert (inp.name, inp.type, inp.shape[1:]) == ("obs", elem, list(policy.obs_shape))
    assert isinstance(inp.shape[0], str)  # a named, dynamic batch dimension
    assert [(o.name, o.type) for o in session.get_outputs()] == [("q_values", "tensor(float)"),
                                                                  ("actions", "tensor(int64)")]
    assert_parity(policy, onnx_runner(path), obs)
    meta = {p.key: p.value for p in onnx.load(str(path)).metadata_props}
    assert meta["flywheel.env_id"] == env_id and meta["flywheel.obs_dtype"] == raw
    assert not list(tmp_path.glob("*.data"))  # one self-contained file
    if env_id == MARIO:
        assert obs.max() > 1  # real frames in 0..255, scaled inside the graph
        with pytest.raises(Exception, match="(?i)type|dtype"):
            session.run(None, {"obs": obs[:2].astype(np.float32)})


@pytest.mark.parametrize("env_id", ["CartPole-v1", MARIO])
def test_torchscript_module_matches_the_policy(env_id: str, cartpole: Path, mario: Path, tmp_path: Path) -> None:
    policy = Policy.load(cartpole if env_id == "CartPole-v1" else mario, which="auto")
    obs = real_observations(env_id, 9)
    path = export_torchscript(policy, tmp_path / "model.pt")
    assert_parity(policy, jit_runner(path), obs)
    extra = {"flywheel.json": ""}
    torch.jit.load(str(path), _extra_files=extra)
    assert json.loads(extra["flywheel.json"])["flywheel.n_actions"] == str(policy.n_actions)
    if env_id == MARIO:
        with pytest.raises(Exception, match="uint8"):
            torch.jit.load(str(path))(torch.from_numpy(obs[:2].astype(np.float32)))


def test_a_qr_dqn_head_without_dueling_exports_its_mean_q(tmp_path: Path) -> None:
    folder = learner_checkpoint(tmp_path, "CartPole-v1", (4,), 2, head="quantile", num_quantiles=11, dueling=False)
    policy = Policy.load(folder)
    assert policy.network.endswith("-qr11")
    obs = real_observations("CartPole-v1", 9)
    assert_parity(policy, onnx_runner(export_onnx(policy, tmp_path / "model.onnx")), obs)
    assert_parity(policy, jit_runner(export_torchscript(policy, tmp_path / "model.pt")), obs)


def test_a_c51_head_exports_its_mean_q_with_the_checkpoints_support(tmp_path: Path) -> None:
    folder = learner_checkpoint(tmp_path, "CartPole-v1", (4,), 2, head="c51", c51_atoms=21, c51_v_min=-3.0,
                                c51_v_max=30.0)
    policy = Policy.load(folder)  # built with the default support, then the checkpoint's loaded over it
    assert policy.network.endswith("-c21") and float(policy.net.support[-1]) == 30.0
    obs = real_observations("CartPole-v1", 9)
    assert_parity(policy, onnx_runner(export_onnx(policy, tmp_path / "model.onnx")), obs)
    assert_parity(policy, jit_runner(export_torchscript(policy, tmp_path / "model.pt")), obs)


def test_missing_onnx_packages_are_one_clear_error(cartpole: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "onnxscript" else real(name, *a))
    with pytest.raises(ExportError, match=r"onnxscript.*pip install 'flywheel-rl\[export\]'"):
        export_onnx(Policy.load(cartpole), tmp_path / "model.onnx")
    assert not (tmp_path / "model.onnx").exists()


def flywheel_export(*args: str | Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLYWHEEL_")}
    return subprocess.run([sys.executable, "-m", "flywheel", "export", *map(str, args)], env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.system
def test_cli_writes_a_model_card_folder(cartpole: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(cartpole, run)
    (run / "run.json").write_text(json.dumps({"env_id": "CartPole-v1", "actors": 2}))
    (run / "video.mp4").write_bytes(b"not really an mp4")
    result = flywheel_export(run, "--card", "--card-episodes", "3", "--card-seed", "4")
    assert result.returncode == 0, result.stderr
    folder = run / "export"
    assert sorted(p.name for p in folder.iterdir()) == ["README.md", "config.json", "model.onnx", "replay.mp4",
                                                       "results.json", "run.json"]
    assert (folder / "replay.mp4").read_bytes() == b"not really an mp4"
    assert json.loads((folder / "run.json").read_text())["actors"] == 2
    results = json.loads((folder / "results.json").read_text())
    assert (results["n_eval_episodes"], results["seeds"], results["epsilon"]) == (3, [4, 5, 6], 0.05)
    assert (results["noop_max"], results["stall_steps"], results["is_deterministic"]) == (0, 0, False)
    returns = [e["return"] for e in results["episodes"]]  # played as flywheel eval plays them
    assert returns == [r["return"] for r in evaluate("CartPole-v1", [4, 5, 6], checkpoint=str(run), epsilon=0.05)]
    assert results["ci95_mean"] == [summarize(returns)["ci_low"], summarize(returns)["ci_high"]]
    assert results["mean_reward"] == pytest.approx(np.mean(returns))
    assert results["std_reward"] == pytest.approx(np.std(returns))
    readme = (folder / "README.md").read_text()
    _, front, body = readme.split("---\n", 2)
    meta = yaml.safe_load(front)
    assert meta["library_name"] == "flywheel"
    assert {"reinforcement-learning", "deep-reinforcement-learning", "CartPole-v1"} <= set(meta["tags"])
    [entry] = meta["model-index"]
    [res] = entry["results"]
    assert res["task"]["type"] == "reinforcement-learning"
    assert res["dataset"]["name"] == res["dataset"]["type"] == "CartPole-v1"
    [metric] = res["metrics"]
    assert metric["type"] == "mean_reward"
    assert metric["value"] == f"{results['mean_reward']:.2f} +/- {results['std_reward']:.2f}"
    assert "the protocol of `flywheel eval`: 3 episodes (seeds 4..6), epsilon 0.05, no no-op starts, no stall " \
        "rule" in body
    assert "`flywheel eval CHECKPOINT_DIR --which latest --episodes 3 --seed 4 --epsilon 0.05`" in body
    config = json.loads((folder / "config.json").read_text())
    assert config["inputs"]["obs"] == {"dtype": "float32", "shape": ["batch", 4]}
    assert config["parity"]["source"] == "real" and config["parity"]["max_abs_dq"] < 1e-5
    assert_parity(Policy.load(run), onnx_runner(folder / "model.onnx"), real_observations("CartPole-v1", 9))


@pytest.mark.system
def test_cli_which_picks_best_or_latest(cartpole: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(cartpole, run)
    other = learner_checkpoint(tmp_path / "other", "CartPole-v1", (4,), 2, seed=1)
    shutil.copyfile(other / "learner" / "learner.safetensors", run / "learner" / "best.safetensors")
    obs = real_observations("CartPole-v1", 9)
    for which, flags in (("best", ()), ("latest", ("--which", "latest"))):
        out = tmp_path / f"{which}.pt"
        result = flywheel_export(run, "--format", "torchscript", "--out", out, *flags)
        assert result.returncode == 0, result.stderr
        assert f"{which if which == 'best' else 'learner'}.safetensors" in result.stdout
        assert_parity(Policy.load(run, which=which), jit_runner(out), obs)
    assert not (Policy.load(run, which="best").q_values(obs) == Policy.load(run, which="latest").q_values(obs)).all()


@pytest.mark.system
def test_cli_bad_input_is_one_error_line(tmp_path: Path) -> None:
    for folder in (tmp_path / "missing", tmp_path):  # no folder; a folder with no checkpoint
        result = flywheel_export(folder)
        assert result.returncode == 2 and result.stdout == ""
        assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith("error: flywheel export: ")
    result = flywheel_export(tmp_path, "--card", "--card-episodes", "0")
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1
    result = flywheel_export(tmp_path, "--card", "--card-epsilon", "1.5")
    assert result.returncode == 2 and result.stderr.splitlines() == [
        "error: flywheel export: --card-epsilon must be in [0, 1], got 1.5"]
