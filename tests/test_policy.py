"""flywheel.policy: a real learner checkpoint (written by the learner's own code) loads and acts greedily."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from flywheel.policy import Policy, PolicyError
from flywheel.services.learner.checkpoint import CheckpointError, save_checkpoint
from flywheel.services.learner.core import CoreConfig, LearnerCore


def _core(env_id: str | None = "CartPole-v1", **config: object) -> LearnerCore:
    torch.manual_seed(0)
    core = LearnerCore((4,), 2, CoreConfig(**config))  # type: ignore[arg-type]
    if env_id is not None:
        core.env_id = env_id  # type: ignore[attr-defined]  # what services/learner/main.py sets
    return core


def _strip_new_metadata(path: Path) -> None:
    """Rewrite a checkpoint as an older learner wrote it: no env_id and no network_spec in its metadata."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as fh:
        meta = json.loads(fh.metadata()["flywheel"])
    tensors = load_file(str(path))
    meta.pop("env_id"), meta.pop("network_spec")
    save_file(tensors, str(path), metadata={"flywheel": json.dumps(meta)})


def test_policy_loads_the_online_network_and_acts_greedily(tmp_path: Path) -> None:
    core = _core(hidden=64, dueling=False)
    save_checkpoint(tmp_path / "learner", core, weight_version=7)
    policy = Policy.load(tmp_path)  # a flywheel run folder: DIR/learner/learner.safetensors
    assert (policy.env_id, policy.n_actions, policy.obs_shape) == ("CartPole-v1", 2, (4,))
    assert (policy.updates, policy.weight_version, policy.network) == (core.updates, 7, "mlp-4-2-plain-h64")
    obs = np.random.default_rng(0).normal(size=(16, 4)).astype(np.float32)
    q = policy.q_values(obs)
    with torch.no_grad():
        expected = core.online(torch.from_numpy(obs)).numpy()
    assert q.shape == (16, 2) and np.allclose(q, expected, atol=1e-6)
    actions = policy.predict(obs)
    assert actions.shape == (16,) and actions.dtype == np.int64 and (actions == q.argmax(axis=1)).all()
    assert policy.predict(obs[0]).shape == (1,) and policy.predict(obs[0])[0] == actions[0]
    explore = policy.predict(np.repeat(obs[:1], 2000, axis=0), epsilon=1.0, rng=np.random.default_rng(1))
    assert set(explore.tolist()) == {0, 1}
    same = policy.predict(obs, epsilon=0.5, rng=np.random.default_rng(3))
    assert (same == policy.predict(obs, epsilon=0.5, rng=np.random.default_rng(3))).all()
    with pytest.raises(ValueError, match="do not fit"):
        policy.predict(np.zeros((2, 5), np.float32))


def test_missing_folder_or_checkpoint_is_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="does not exist"):
        Policy.load(tmp_path / "nowhere")
    with pytest.raises(PolicyError, match="no learner checkpoint in"):
        Policy.load(tmp_path)
    (tmp_path / "learner.safetensors").write_bytes(b"not a checkpoint")
    with pytest.raises(PolicyError, match="not a readable learner checkpoint"):
        Policy.load(tmp_path)


def test_old_metadata_falls_back_to_the_argument_then_run_json(tmp_path: Path) -> None:
    core = _core(env_id=None, hidden=32)
    path = save_checkpoint(tmp_path / "learner", core, weight_version=1)
    _strip_new_metadata(path)
    with pytest.raises(PolicyError, match="does not name its env"):
        Policy.load(tmp_path / "learner")
    assert Policy.load(tmp_path / "learner", env_id="CartPole-v1").network == "mlp-4-2-dueling-h32"
    (tmp_path / "run.json").write_text(json.dumps({"format": "flywheel-run", "env_id": "CartPole-v1"}))
    policy = Policy.load(tmp_path / "learner")
    assert policy.env_id == "CartPole-v1"
    obs = np.ones((3, 4), np.float32)
    with torch.no_grad():
        assert (policy.predict(obs) == core.online(torch.from_numpy(obs)).argmax(dim=1).numpy()).all()
    with pytest.raises(PolicyError, match="builds"):  # another env's shapes do not fit the saved network
        Policy.load(tmp_path / "learner", env_id="Acrobot-v1")


@pytest.mark.system
def test_a_real_learner_process_notes_its_env_and_network(tmp_path: Path) -> None:
    """services/learner/main.py writes env_id and the network spec into the checkpoint it leaves on SIGTERM."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLYWHEEL_")}
    settings = {"ENV_ID": "CartPole-v1", "CHECKPOINT_DIR": str(tmp_path), "HIDDEN": "48", "TORCH_THREADS": "1",
                "DEVICE": "cpu", "WEIGHTS_BIND": "tcp://127.0.0.1:0",  # a port the kernel picks: nobody connects
                "SAMPLE_ENDPOINT": "inproc://no-replay", "TELEMETRY_ENDPOINT": "inproc://no-gateway",
                "CONTROL_ENDPOINT": "inproc://no-gateway-control"}
    env.update({f"FLYWHEEL_LEARNER_{k}": v for k, v in settings.items()})
    proc = subprocess.Popen([sys.executable, "-m", "flywheel", "learner"], env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        for line in proc.stderr:  # up once it logs its device line; EOF (an early exit) ends the loop
            if "learner: device" in line:
                break
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    policy = Policy.load(tmp_path)  # no env_id given, no run.json: the metadata names it
    assert (policy.env_id, policy.network, policy.obs_shape) == ("CartPole-v1", "mlp-4-2-dueling-h48", (4,))
