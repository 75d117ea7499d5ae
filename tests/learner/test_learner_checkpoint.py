"""Learner checkpoints: exact round trip, atomic files, and one-line errors for missing or foreign ones."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from learner_helpers import make_batch

from flywheel.services.learner.checkpoint import (
    CHECKPOINT_FILE,
    CheckpointError,
    load_checkpoint,
    save_checkpoint,
)
from flywheel.services.learner.core import CoreConfig, LearnerCore

CONFIG = CoreConfig(lr=1e-3, target_update_interval=4)


def _trained(updates: int) -> LearnerCore:
    core = LearnerCore((4,), 2, CONFIG)
    rng = np.random.default_rng(0)
    for _ in range(updates):
        core.update(make_batch(rng, 32))
    return core


def test_round_trip_restores_everything_and_training_continues_identically(tmp_path: Path) -> None:
    core = _trained(6)
    path = save_checkpoint(tmp_path, core, weight_version=3)
    assert path == tmp_path / CHECKPOINT_FILE
    assert [p.name for p in tmp_path.iterdir()] == [CHECKPOINT_FILE]  # no temporary files left behind
    torch.manual_seed(123)
    restored = LearnerCore((4,), 2, CONFIG)
    info = load_checkpoint(tmp_path, restored)
    assert (info.updates, info.weight_version, info.network) == (6, 3, "mlp-4-2-dueling")
    assert restored.updates == 6
    for a, b in ((core.online, restored.online), (core.target, restored.target)):
        assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True))
    batch = make_batch(np.random.default_rng(9), 32)
    r1, r2 = core.update(batch), restored.update(batch)  # same Adam moments and step -> same update
    np.testing.assert_array_equal(r1.priorities(), r2.priorities())
    for x, y in zip(core.online.parameters(), restored.online.parameters(), strict=True):
        torch.testing.assert_close(x, y, rtol=0, atol=0)
    assert core.updates == restored.updates == 7


def test_save_replaces_the_previous_checkpoint(tmp_path: Path) -> None:
    core = _trained(2)
    save_checkpoint(tmp_path, core, 1)
    core.update(make_batch(np.random.default_rng(1), 32))
    save_checkpoint(tmp_path, core, 2)
    assert load_checkpoint(tmp_path, LearnerCore((4,), 2, CONFIG)).weight_version == 2


def test_missing_checkpoint_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="no learner checkpoint at .*--resume") as err:
        load_checkpoint(tmp_path / "nowhere", LearnerCore((4,), 2, CONFIG))
    assert "\n" not in str(err.value)


def test_checkpoint_of_another_network_is_refused_untouched(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, _trained(1), 1)
    other = LearnerCore((4,), 3, CONFIG)
    before = [p.clone() for p in other.online.parameters()]
    with pytest.raises(CheckpointError, match="mlp-4-2-dueling.*mlp-4-3-dueling"):
        load_checkpoint(tmp_path, other)
    assert all(torch.equal(a, b) for a, b in zip(before, other.online.parameters(), strict=True))
    assert other.updates == 0
    with pytest.raises(CheckpointError, match="network"):
        load_checkpoint(tmp_path, LearnerCore((4,), 2, CoreConfig(dueling=False)))


def test_garbage_and_foreign_files_are_refused(tmp_path: Path) -> None:
    (tmp_path / CHECKPOINT_FILE).write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
    with pytest.raises(CheckpointError, match="not a readable"):
        load_checkpoint(tmp_path, LearnerCore((4,), 2, CONFIG))
    from safetensors.torch import save_file

    save_file({"x": torch.zeros(2)}, str(tmp_path / CHECKPOINT_FILE))
    with pytest.raises(CheckpointError, match="not a flywheel learner checkpoint"):
        load_checkpoint(tmp_path, LearnerCore((4,), 2, CONFIG))


def test_rng_steps_and_skipped_survive_a_round_trip(tmp_path: Path) -> None:
    core = _trained(3)
    nan_batch = make_batch(np.random.default_rng(5), 32)
    nan_batch.reward[0] = np.nan
    core.update(nan_batch)  # a skipped step
    save_checkpoint(tmp_path, core, weight_version=9)
    expected = torch.rand(5)
    torch.manual_seed(77)
    restored = LearnerCore((4,), 2, CONFIG)
    load_checkpoint(tmp_path, restored)
    torch.testing.assert_close(torch.rand(5), expected, rtol=0, atol=0)  # the RNG continues where it was
    assert (restored.steps, restored.updates, restored.skipped) == (4, 3, 1)


def test_quantile_checkpoint_refuses_a_plain_learner(tmp_path: Path) -> None:
    quantile = LearnerCore((4,), 2, CoreConfig(head="quantile", num_quantiles=8))
    save_checkpoint(tmp_path, quantile, 1)
    with pytest.raises(CheckpointError, match="qr8.*--head") as err:
        load_checkpoint(tmp_path, LearnerCore((4,), 2, CONFIG))
    assert "\n" not in str(err.value)
    assert load_checkpoint(tmp_path, LearnerCore((4,), 2, CoreConfig(head="quantile", num_quantiles=8))).updates == 0


def test_c51_checkpoint_keeps_its_support_and_refuses_another(tmp_path: Path) -> None:
    wide = CoreConfig(head="c51", c51_v_min=-4.0, c51_v_max=40.0)
    save_checkpoint(tmp_path, LearnerCore((4,), 2, wide), 1)
    with pytest.raises(CheckpointError, match=r"support is \[-4, 40\].*\[-10, 10\].*--c51-v-min") as err:
        load_checkpoint(tmp_path, LearnerCore((4,), 2, CoreConfig(head="c51")))
    assert "\n" not in str(err.value)
    restored = LearnerCore((4,), 2, wide)
    assert load_checkpoint(tmp_path, restored).updates == 0
    torch.testing.assert_close(restored.target.support, torch.linspace(-4.0, 40.0, 51))


def test_c51_checkpoint_refuses_a_learner_with_other_atoms(tmp_path: Path) -> None:
    coarse = LearnerCore((4,), 2, CoreConfig(head="c51", c51_atoms=21))
    save_checkpoint(tmp_path, coarse, 1)
    with pytest.raises(CheckpointError, match=r"c21.*c51.*--c51-atoms") as err:
        load_checkpoint(tmp_path, LearnerCore((4,), 2, CoreConfig(head="c51")))
    assert "\n" not in str(err.value)
    restored = LearnerCore((4,), 2, CoreConfig(head="c51", c51_atoms=21))
    assert load_checkpoint(tmp_path, restored).updates == 0
    torch.testing.assert_close(restored.online.support, coarse.online.support)


def test_gradient_scaler_state_round_trips(tmp_path: Path) -> None:
    core = LearnerCore((4,), 2, CoreConfig(precision="fp16"))
    assert core.scaler is not None
    core.update(make_batch(np.random.default_rng(6), 16))
    core.scaler.update(1234.0)
    save_checkpoint(tmp_path, core, 1)
    restored = LearnerCore((4,), 2, CoreConfig(precision="fp16"))
    load_checkpoint(tmp_path, restored)
    assert restored.scaler is not None and restored.scaler.get_scale() == 1234.0


def test_foreign_entries_are_refused(tmp_path: Path) -> None:
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    save_checkpoint(tmp_path, _trained(1), 1)
    path = tmp_path / CHECKPOINT_FILE
    with safe_open(str(path), "pt") as fh:
        meta = fh.metadata()
    tensors = load_file(str(path))
    save_file({**tensors, "rng.gpu": torch.zeros(4, dtype=torch.uint8)}, str(path), metadata=meta)
    with pytest.raises(CheckpointError, match="rng.gpu"):
        load_checkpoint(tmp_path, LearnerCore((4,), 2, CONFIG))
    save_file({**tensors, "pickle.data": torch.zeros(1)}, str(path), metadata=meta)
    with pytest.raises(CheckpointError, match="unexpected entry"):
        load_checkpoint(tmp_path, LearnerCore((4,), 2, CONFIG))


def test_the_acting_average_round_trips_and_starts_at_the_online_network_where_none_was_kept(tmp_path: Path) -> None:
    averaged = CoreConfig(lr=1e-3, target_update_interval=4, acting_ema=0.1)
    core = LearnerCore((4,), 2, averaged)
    rng = np.random.default_rng(0)
    for _ in range(4):
        core.update(make_batch(rng, 32))
    save_checkpoint(tmp_path, core, weight_version=2)
    restored = LearnerCore((4,), 2, averaged)
    load_checkpoint(tmp_path, restored)
    for a, b in zip(core.acting.state_dict().values(), restored.acting.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    plain = LearnerCore((4,), 2, CONFIG)  # a run without the average resumes from it: the average is left out
    load_checkpoint(tmp_path, plain)
    assert plain.acting is plain.online
    for a, b in zip(core.online.state_dict().values(), plain.online.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    save_checkpoint(tmp_path, _trained(3), weight_version=1)  # no average kept: a new one starts at online
    fresh = LearnerCore((4,), 2, averaged)
    load_checkpoint(tmp_path, fresh)
    for a, b in zip(fresh.acting.state_dict().values(), fresh.online.state_dict().values(), strict=True):
        assert torch.equal(a, b)


def test_the_policy_of_a_checkpoint_is_its_acting_average(tmp_path: Path) -> None:
    from flywheel.policy import Policy

    core = LearnerCore((4,), 2, CoreConfig(lr=1e-2, acting_ema=0.1))
    rng = np.random.default_rng(0)
    for _ in range(5):
        core.update(make_batch(rng, 32))
    core.env_id = "CartPole-v1"  # type: ignore[attr-defined]  # what services/learner/main.py sets
    save_checkpoint(tmp_path / "learner", core, weight_version=3)
    obs = np.random.default_rng(1).normal(size=(64, 4)).astype(np.float32)
    with torch.no_grad():
        acting, online = core.acting(torch.from_numpy(obs)).numpy(), core.online(torch.from_numpy(obs)).numpy()
    assert not np.allclose(acting, online, atol=1e-4)  # the average lags the online network
    np.testing.assert_allclose(Policy.load(tmp_path).q_values(obs), acting, atol=1e-6)


def test_a_damaged_acting_average_is_refused_untouched_by_the_learner_and_by_play(tmp_path: Path) -> None:
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    from flywheel.policy import Policy, PolicyError

    averaged = CoreConfig(lr=1e-3, target_update_interval=4, acting_ema=0.1)
    core = LearnerCore((4,), 2, averaged)
    core.env_id = "CartPole-v1"  # type: ignore[attr-defined]  # what services/learner/main.py sets
    path = save_checkpoint(tmp_path, core, weight_version=1)
    with safe_open(str(path), "pt") as fh:
        meta = fh.metadata()
    tensors = load_file(str(path))
    dropped = next(key for key in tensors if key.startswith("acting."))
    save_file({k: v for k, v in tensors.items() if k != dropped}, str(path), metadata=meta)
    fresh = LearnerCore((4,), 2, averaged)
    before = [p.detach().clone() for p in fresh.acting.parameters()]
    with pytest.raises(CheckpointError, match="acting network keys differ"):
        load_checkpoint(tmp_path, fresh)
    assert all(torch.equal(a, b) for a, b in zip(before, fresh.acting.parameters(), strict=True))
    with pytest.raises(PolicyError, match="the policy network's tensors do not fit"):
        Policy.load(tmp_path, which="latest")
