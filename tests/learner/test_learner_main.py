"""The learner entry point: clean stop on SIGTERM with a checkpoint, and one-line startup errors."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import zmq

from flywheel import proto
from flywheel.services.learner.checkpoint import CHECKPOINT_FILE, load_checkpoint
from flywheel.services.learner.core import CoreConfig, LearnerCore
from flywheel.services.learner.main import main
from flywheel.services.learner.settings import LearnerSettings
from flywheel.testing.ports import free_port

SPEC = SimpleNamespace(obs_shape=(4,), n_actions=2)

SCRIPT = """
import sys
from types import SimpleNamespace
from flywheel.services.learner.main import main
from flywheel.services.learner.settings import LearnerSettings
sys.exit(main(LearnerSettings(), spec=SimpleNamespace(obs_shape=(4,), n_actions=2)))
"""


def _env(tmp_path: Path, weights_port: int, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLYWHEEL_")}
    env.update({
        "FLYWHEEL_LEARNER_CHECKPOINT_DIR": str(tmp_path), "FLYWHEEL_LEARNER_WEIGHTS_BIND":
        f"tcp://127.0.0.1:{weights_port}", "FLYWHEEL_LEARNER_SAMPLE_ENDPOINT": f"tcp://127.0.0.1:{free_port()}",
        "FLYWHEEL_LEARNER_TELEMETRY_ENDPOINT": f"tcp://127.0.0.1:{free_port()}",
        "FLYWHEEL_LEARNER_CONTROL_ENDPOINT": f"tcp://127.0.0.1:{free_port()}",
        "FLYWHEEL_LEARNER_TORCH_THREADS": "1", "FLYWHEEL_LEARNER_DEVICE": "cpu", **extra,
    })
    return env


def test_sigterm_leaves_a_checkpoint_and_exits_zero(tmp_path: Path) -> None:
    port = free_port()
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.LINGER, 0)
    sub.connect(f"tcp://127.0.0.1:{port}")
    env = _env(tmp_path, port, FLYWHEEL_LEARNER_WEIGHTS_REPUBLISH_S="0.2")
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT], env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert sub.poll(60_000), "no weights published"  # version 1 at start (and repeated); slow imports when busy
        weights = proto.decode(sub.recv_multipart(), expect=proto.Weights)
        assert weights.version == 1 and weights.network == "mlp-4-2-dueling"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=40)
    finally:
        proc.kill()
        sub.close()
        ctx.term()
    assert proc.returncode == 0, err
    assert "learner: device cpu" in err
    info = load_checkpoint(tmp_path, LearnerCore((4,), 2, CoreConfig()))
    assert info.weight_version == 1 and info.updates == 0
    assert (tmp_path / CHECKPOINT_FILE).exists()


def test_resume_without_checkpoint_fails_with_one_line(tmp_path: Path, caplog) -> None:
    settings = LearnerSettings(checkpoint_dir=str(tmp_path), resume=True, device="cpu",
                               weights_bind=f"tcp://127.0.0.1:{free_port()}")
    assert main(settings, spec=SPEC) == 2
    assert any("no learner checkpoint" in r.getMessage() for r in caplog.records)


def test_weights_endpoint_in_use_fails_with_one_line(caplog) -> None:
    ctx = zmq.Context()
    holder = ctx.socket(zmq.PUB)
    holder.setsockopt(zmq.LINGER, 0)
    port = holder.bind_to_random_port("tcp://127.0.0.1")
    try:
        settings = LearnerSettings(device="cpu", weights_bind=f"tcp://127.0.0.1:{port}")
        assert main(settings, spec=SPEC) == 2
    finally:
        holder.close()
        ctx.term()
    assert any("already in use" in r.getMessage() and "--weights-bind" in r.getMessage() for r in caplog.records)


def test_env_spec_is_used_when_no_spec_given(tmp_path: Path, caplog) -> None:
    settings = LearnerSettings(env_id="CartPole-v1", device="cpu", max_updates=1, checkpoint_dir=str(tmp_path),
                               resume=True, weights_bind=f"tcp://127.0.0.1:{free_port()}")
    start = time.monotonic()
    assert main(settings) == 2  # looked up CartPole (4,) x 2, then found no checkpoint
    assert time.monotonic() - start < 25
    assert any("no learner checkpoint" in r.getMessage() for r in caplog.records)
    assert main(LearnerSettings(env_id="NoSuchEnv-v9", device="cpu")) == 2


def test_build_core_uses_every_core_on_cpu_and_resolves_auto_settings() -> None:
    import torch

    from flywheel.services.learner.main import build_core, usable_cores

    settings = LearnerSettings(device="cpu", torch_threads=0, seed=3, head="quantile", num_quantiles=5,
                               grad_accum_steps=2)
    assert settings.compile == "auto" and settings.precision == "auto"
    core = build_core(settings, (4,), 2, torch.device("cpu"))
    assert torch.get_num_threads() == usable_cores()
    config = core.config
    assert (config.precision, config.compile, config.head, config.num_quantiles, config.grad_accum_steps) == (
        "fp32", False, "quantile", 5, 2)
    twin = build_core(settings.model_copy(update={"torch_threads": 1}), (4,), 2, torch.device("cpu"))
    assert torch.get_num_threads() == 1
    assert all(torch.equal(a, b) for a, b in zip(core.params, twin.params, strict=True))  # the seed
    assert LearnerSettings(compile="true").compile == "on" and LearnerSettings(compile=False).compile == "off"


def test_channels_last_follows_compile_on_a_cpu_and_refuses_bad_values() -> None:
    import pytest
    import torch
    from pydantic import ValidationError

    from flywheel.services.learner.main import core_config

    cpu = torch.device("cpu")
    assert core_config(LearnerSettings(device="cpu", compile="on"), cpu).channels_last is True
    assert core_config(LearnerSettings(device="cpu", compile="off"), cpu).channels_last is False
    assert core_config(LearnerSettings(device="cpu", compile="off", channels_last="on"), cpu).channels_last is True
    assert core_config(LearnerSettings(device="cpu", compile="on", channels_last=False), cpu).channels_last is False
    with pytest.raises(ValidationError, match="channels_last"):
        LearnerSettings(channels_last="sometimes")
