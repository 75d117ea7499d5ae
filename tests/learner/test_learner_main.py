"""The learner entry point: clean stop on SIGTERM with a checkpoint, and one-line startup errors."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import zmq
from learner_helpers import SPEC, first_weights_then_stop

from flywheel.services.learner.checkpoint import CHECKPOINT_FILE, load_checkpoint
from flywheel.services.learner.core import CoreConfig, LearnerCore
from flywheel.services.learner.main import main
from flywheel.services.learner.settings import LearnerSettings


@pytest.mark.system
def test_sigterm_leaves_a_checkpoint_and_exits_zero(tmp_path: Path) -> None:
    run = first_weights_then_stop(tmp_path)  # version 1 at start (and repeated); slow imports when busy
    assert run.weights.version == 1 and run.weights.network == "mlp-4-2-dueling"
    assert run.returncode == 0, run.err
    assert "learner: device cpu" in run.err
    info = load_checkpoint(tmp_path, LearnerCore((4,), 2, CoreConfig()))
    assert info.weight_version == 1 and info.updates == 0
    assert (tmp_path / CHECKPOINT_FILE).exists()


def test_resume_without_checkpoint_fails_with_one_line(tmp_path: Path, caplog) -> None:
    settings = LearnerSettings(checkpoint_dir=str(tmp_path), resume=True, device="cpu",
                               weights_bind="tcp://127.0.0.1:0")
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
                               resume=True, weights_bind="tcp://127.0.0.1:0")
    start = time.monotonic()
    assert main(settings) == 2  # looked up CartPole (4,) x 2, then found no checkpoint
    assert time.monotonic() - start < 25
    assert any("no learner checkpoint" in r.getMessage() for r in caplog.records)
    assert main(LearnerSettings(env_id="NoSuchEnv-v9", device="cpu")) == 2


def test_build_core_uses_every_core_on_cpu_and_resolves_auto_settings() -> None:
    import torch

    from flywheel.services.learner.startup import build_core, usable_cores

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

    from flywheel.services.learner.startup import core_config

    cpu = torch.device("cpu")
    assert core_config(LearnerSettings(device="cpu", compile="on"), cpu).channels_last is True
    assert core_config(LearnerSettings(device="cpu", compile="off"), cpu).channels_last is False
    assert core_config(LearnerSettings(device="cpu", compile="off", channels_last="on"), cpu).channels_last is True
    assert core_config(LearnerSettings(device="cpu", compile="on", channels_last=False), cpu).channels_last is False
    with pytest.raises(ValidationError, match="channels_last"):
        LearnerSettings(channels_last="sometimes")


def test_compile_mode_auto_is_cuda_graphs_on_a_gpu_only() -> None:
    """auto: reduce-overhead (CUDA graphs) on a GPU, measured 2.3x default there (docs/LEARNER.md); default on a CPU."""
    import pytest
    import torch
    from pydantic import ValidationError

    from flywheel.services.learner.startup import core_config

    cuda, cpu = torch.device("cuda"), torch.device("cpu")  # a device object needs no GPU; nothing runs on it here
    assert core_config(LearnerSettings(device="cpu"), cuda).compile_mode == "reduce-overhead"
    assert core_config(LearnerSettings(device="cpu"), cpu).compile_mode == "default"
    assert core_config(LearnerSettings(device="cpu", compile_mode="default"), cuda).compile_mode == "default"
    with pytest.raises(ValidationError, match="compile_mode"):
        LearnerSettings(compile_mode="fast")


def test_host_staging_reaches_the_core_and_the_cpu_stager_keeps_views() -> None:
    """learner.host_staging goes from settings to the core's stager; on a CPU either value stages zero-copy views
    (only a GPU copies, through a pinned ring or straight from the batch's memory); a typo is refused at start."""
    import numpy as np
    import pytest
    import torch
    from pydantic import ValidationError

    from flywheel import proto
    from flywheel.services.learner.startup import core_config

    cpu = torch.device("cpu")
    assert core_config(LearnerSettings(device="cpu"), cpu).host_staging == "pinned"
    config = core_config(LearnerSettings(device="cpu", host_staging="direct"), cpu)
    core = LearnerCore((4,), 2, config, cpu)
    assert config.host_staging == "direct" and core.stager.direct and core.stager.keeps_views
    obs = np.arange(32, dtype=np.float32).reshape(8, 4)
    batch = proto.SampleBatch(request_id=1, replay_size=8, obs=obs, action=np.zeros(8, np.int64),
                              reward=np.zeros(8, np.float32), discount=np.ones(8, np.float32), next_obs=obs + 1,
                              index=np.arange(8), weight=np.ones(8, np.float32))
    assert np.shares_memory(core.stager.stage(batch).obs.numpy(), obs)
    assert core.update(batch).batch_size == 8
    with pytest.raises(ValidationError, match="host_staging"):
        LearnerSettings(host_staging="zero-copy")


def test_munchausen_settings_reach_the_core_and_need_the_q_head() -> None:
    import pytest
    import torch
    from pydantic import ValidationError

    from flywheel.services.learner.startup import core_config

    config = core_config(LearnerSettings(device="cpu", munchausen=True, munchausen_tau=0.05), torch.device("cpu"))
    assert (config.munchausen, config.munchausen_tau, config.munchausen_alpha, config.munchausen_clip) == (
        True, 0.05, 0.9, -1.0)
    with pytest.raises(ValidationError, match="munchausen needs head q"):
        LearnerSettings(munchausen=True, head="quantile")
    with pytest.raises(ValidationError, match="munchausen_clip"):
        LearnerSettings(munchausen_clip=0.5)


def test_an_lr_schedule_needs_both_its_settings() -> None:
    import pytest
    from pydantic import ValidationError

    assert LearnerSettings(lr=2.5e-4, lr_final=1e-4, lr_decay_updates=200_000).lr_decay_updates == 200_000
    for half in ({"lr_final": 1e-4}, {"lr_decay_updates": 1000}):
        with pytest.raises(ValidationError, match="an lr schedule needs both"):
            LearnerSettings(**half)
    with pytest.raises(ValidationError, match="lr_final"):
        LearnerSettings(lr_final=-1e-4, lr_decay_updates=1000)
