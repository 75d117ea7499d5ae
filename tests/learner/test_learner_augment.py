"""DrQ random shifts: the same images as pad-with-edges-then-crop, and the core trains on shifted batches."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from learner_helpers import make_batch
from pydantic import ValidationError

from flywheel import proto
from flywheel.services.learner.augment import random_shift
from flywheel.services.learner.core import CoreConfig, LearnerCore
from flywheel.services.learner.main import main
from flywheel.services.learner.settings import LearnerSettings
from flywheel.services.learner.startup import core_config


def _shift_of(image: np.ndarray, shifted: np.ndarray, pad: int) -> tuple[int, int] | None:
    """The (rows, columns) offset at which ``shifted`` is a crop of ``image`` padded by ``pad`` edge pixels."""
    padded = np.pad(image, ((0, 0), (pad, pad), (pad, pad)), mode="edge")
    height, width = image.shape[1:]
    found = [(dy - pad, dx - pad) for dy in range(2 * pad + 1) for dx in range(2 * pad + 1)
             if np.array_equal(padded[:, dy:dy + height, dx:dx + width], shifted)]
    return found[0] if found else None


def test_each_image_is_a_crop_of_its_edge_padded_self_with_all_channels_alike() -> None:
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (64, 4, 12, 10), dtype=np.uint8)
    before = images.copy()
    out = random_shift(torch.from_numpy(images), 2, torch.Generator().manual_seed(1))
    assert out.dtype == torch.uint8 and tuple(out.shape) == images.shape
    shifts = [_shift_of(image, shifted, 2) for image, shifted in zip(images, out.numpy(), strict=True)]
    assert all(shift is not None and max(map(abs, shift)) <= 2 for shift in shifts)
    assert len(set(shifts)) >= 15  # 25 possible offsets, 64 draws: images move independently
    np.testing.assert_array_equal(images, before)  # the batch it read (a replay slot's view) is not written


def test_random_offsets_cover_minus_pad_to_pad() -> None:
    images = torch.arange(6 * 6, dtype=torch.float32).reshape(1, 1, 6, 6).repeat(400, 1, 1, 1)
    out = random_shift(images, 1, torch.Generator().manual_seed(2))
    shifts = {_shift_of(image, shifted, 1) for image, shifted in zip(images.numpy(), out.numpy(), strict=True)}
    assert shifts == {(dy, dx) for dy in (-1, 0, 1) for dx in (-1, 0, 1)}


def test_no_shift_at_pad_zero_and_a_clear_error_for_non_images() -> None:
    images = torch.zeros(2, 1, 4, 4)
    assert random_shift(images, 0) is images
    with pytest.raises(ValueError, match="batch, channels, height, width"):
        random_shift(torch.zeros(2, 4, 4), 1)


def _flat_batch(batch: proto.SampleBatch) -> proto.SampleBatch:
    """The batch with every image one grey level (its first pixel's), which no shift changes."""
    flat = {name: np.broadcast_to(getattr(batch, name)[:, :1, :1, :1], getattr(batch, name).shape).copy()
            for name in ("obs", "next_obs")}
    return proto.SampleBatch(request_id=0, replay_size=batch.replay_size, obs=flat["obs"], action=batch.action,
                             reward=batch.reward, discount=batch.discount, next_obs=flat["next_obs"],
                             index=batch.index, weight=batch.weight)


def _loss(shift: int, batch: proto.SampleBatch) -> float:
    torch.manual_seed(3)
    core = LearnerCore((2, 20, 20), 3, CoreConfig(lr=1e-3, random_shift=shift))
    torch.manual_seed(4)
    return core.update(batch).stats()["loss"]


def test_the_core_trains_on_shifted_images() -> None:
    batch = make_batch(np.random.default_rng(5), 16, obs_shape=(2, 20, 20), n_actions=3, pixels=True)
    assert _loss(3, batch) != _loss(0, batch)  # noise images: the shifted batch is another batch
    flat = _flat_batch(batch)
    assert _loss(3, flat) == pytest.approx(_loss(0, flat), rel=1e-6)  # the same nets, the same data otherwise


def test_random_shift_reaches_the_core_and_needs_images() -> None:
    assert core_config(LearnerSettings(device="cpu", random_shift=2), torch.device("cpu")).random_shift == 2
    with pytest.raises(ValidationError, match="random_shift"):
        LearnerSettings(random_shift=-1)
    with pytest.raises(ValueError, match="random_shift augments images"):
        LearnerCore((4,), 2, CoreConfig(random_shift=2))


def test_the_learner_refuses_random_shift_on_vector_observations_with_one_line(caplog) -> None:
    assert main(LearnerSettings(env_id="CartPole-v1", device="cpu", random_shift=2)) == 2
    assert any("random_shift augments images" in r.getMessage() and "(4,)" in r.getMessage()
               for r in caplog.records)
