"""The core's DQfD term during RL: the large-margin loss on is_demo rows only, weighted by lambda, and its metrics."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from learner_helpers import make_batch

from flywheel import proto
from flywheel.services.learner.core import CoreConfig, LearnerCore
from flywheel.services.learner.losses import large_margin_loss, q_td_loss
from flywheel.services.learner.staging import BatchStager


def _core(weight: float, margin: float = 0.8, lr: float = 1e-4) -> LearnerCore:
    torch.manual_seed(0)
    return LearnerCore((4,), 2, CoreConfig(hidden=32, demo_loss_weight=weight, demo_margin=margin, lr=lr))


def _expected(core: LearnerCore, batch: proto.SampleBatch, weight: float, margin: float) -> tuple[float, float]:
    """Loss and demo rows' margin sum from the pure loss functions, before the core's update changes the weights."""
    obs, next_obs = torch.from_numpy(batch.obs), torch.from_numpy(batch.next_obs)
    action = torch.from_numpy(batch.action)
    with torch.no_grad():
        out = core.online.outputs(obs)
        terms = q_td_loss(out, action, torch.from_numpy(batch.reward), torch.from_numpy(batch.discount),
                          core.target.outputs(next_obs), core.online.outputs(next_obs))
        demo = torch.from_numpy(batch.is_demo).float()
        margins = demo * large_margin_loss(out, action, margin)
        per_sample = terms.per_sample + weight * margins
        return float((torch.from_numpy(batch.weight) * per_sample).mean()), float(margins.sum())


@pytest.mark.parametrize("weight", [0.0, 1.0, 2.5])
def test_margin_term_applies_to_demo_rows_only_with_its_weight(weight: float) -> None:
    batch = make_batch(np.random.default_rng(1), size=16)
    batch.is_demo = np.zeros(16, np.uint8)
    batch.is_demo[12:] = 1  # the replay puts demonstration rows last
    core = _core(weight, margin=0.5)
    expected_loss, expected_margin = _expected(core, batch, weight, 0.5)
    result = core.update(batch)
    assert float(result.loss) == pytest.approx(expected_loss, rel=1e-5)
    sums = core.drain_metrics()
    assert sums.demo_rows == 4
    assert sums.margin_loss == pytest.approx(expected_margin if weight > 0 else 0.0, rel=1e-5, abs=1e-7)
    assert core.drain_metrics().demo_rows == 0  # read once


def test_no_demo_rows_leaves_the_td_loss_unchanged() -> None:
    batch = make_batch(np.random.default_rng(2), size=16)
    batch.is_demo = np.zeros(16, np.uint8)
    with_column, without = _core(1.0), _core(1.0)
    a = with_column.update(batch)
    batch.is_demo = None
    b = without.update(batch)
    assert float(a.loss) == pytest.approx(float(b.loss), rel=1e-6)
    assert with_column.drain_metrics().demo_rows == 0 and without.drain_metrics().demo_rows == 0


def test_margin_loss_moves_demo_rows_towards_the_expert_action() -> None:
    rng = np.random.default_rng(3)
    batch = make_batch(rng, size=64)
    batch.is_demo = np.ones(64, np.uint8)
    batch.reward[:] = 0.0
    batch.discount[:] = 0.0  # TD pulls every Q(s, a) towards 0; only the margin separates the expert's action
    core = _core(1.0, lr=1e-3)
    for _ in range(300):
        core.update(batch)
    greedy = core.q_values(batch.obs).argmax(axis=1)
    assert (greedy == batch.action).mean() >= 0.9


def test_split_batches_keep_their_demo_rows() -> None:
    batch = make_batch(np.random.default_rng(4), size=8)
    batch.is_demo = np.array([0, 0, 0, 0, 0, 0, 1, 1], np.uint8)
    parts = BatchStager(torch.device("cpu")).stage(batch).split(4)
    assert [p.is_demo.tolist() for p in parts] == [[0, 0, 0, 0], [0, 0, 1, 1]]


def test_service_reports_demo_rows_and_margin_loss(harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """A replay whose batches end with demonstration rows (as the real one's do): counted, and the margin reported."""
    import learner_harness

    def with_demo_rows(*args: object, **kwargs: object) -> proto.SampleBatch:
        batch = make_batch(*args, **kwargs)
        batch.is_demo = np.zeros(batch.action.shape[0], np.uint8)
        batch.is_demo[-batch.action.shape[0] // 4:] = 1
        return batch

    monkeypatch.setattr(learner_harness, "make_batch", with_demo_rows)
    h = harness(metrics_interval_updates=5)
    h.loop.start()
    h.drive(lambda: h.counter("demo_samples_total") >= 64 and "margin_loss" in h.reports[-1].gauges, timeout=30)
    samples = h.counter("samples_total")
    assert h.counter("demo_samples_total") <= samples / 4 + 32  # a quarter of the rows, up to one unread batch
    assert h.reports[-1].gauges["margin_loss"] >= 0


def test_spread_demos_gives_every_training_batch_its_share_of_demonstration_rows() -> None:
    from flywheel.services.learner.batches import spread_demos

    rows, size = 1024, 256
    is_demo = np.zeros(rows, np.uint8)
    is_demo[-128:] = 1  # the replay appends its demonstration rows after the main table's
    obs = np.arange(rows * 4, dtype=np.float32).reshape(rows, 4)
    batch = proto.SampleBatch(request_id=1, replay_size=rows, obs=obs, action=np.arange(rows), next_obs=obs + 1,
                              reward=np.arange(rows, dtype=np.float32), discount=np.ones(rows, np.float32),
                              index=np.arange(rows), weight=np.linspace(0.1, 1, rows, dtype=np.float32),
                              is_demo=is_demo)
    spread = spread_demos(batch, size)
    assert [int(spread.is_demo[i:i + size].sum()) for i in range(0, rows, size)] == [32, 32, 32, 32]
    # rows stay whole: every column moved with its row, and none was lost or repeated
    assert sorted(spread.index.tolist()) == list(range(rows))
    for name in ("action", "reward", "weight", "is_demo"):
        assert np.array_equal(getattr(spread, name), getattr(batch, name)[spread.index])
    assert np.array_equal(spread.obs, obs[spread.index]) and np.array_equal(spread.next_obs, obs[spread.index] + 1)
    no_demos = dataclasses.replace(batch, is_demo=np.zeros(rows, np.uint8))
    assert spread_demos(no_demos, size) is no_demos  # nothing to spread: no copy
    assert spread_demos(batch, rows) is batch  # one training batch per reply: nothing to spread
