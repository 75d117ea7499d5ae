"""RingStorage and ReplayCore: FIFO positions, schema checks, priorities, weights, uniform mode, state."""

from __future__ import annotations

import numpy as np
import pytest
from replay_helpers import make_core, transitions

from flywheel import proto
from flywheel.services.replay.core import InsertRejected, ReplayCore
from flywheel.services.replay.storage import SchemaMismatch, TransitionStorage


def insert_rows(storage: TransitionStorage, batch: proto.TransitionBatch) -> np.ndarray:
    keys = np.zeros(len(batch), np.uint64)
    slots, evicted = storage.insert(batch, keys)
    assert evicted.size == 0  # vector observations are stored whole: only FIFO eviction
    return slots


def gather(storage: TransitionStorage, slots: np.ndarray) -> dict[str, np.ndarray]:
    obs = np.empty((len(slots), *storage.obs_shape), storage.obs_dtype)
    next_obs = np.empty_like(obs)
    return {**storage.gather(slots, obs, next_obs), "obs": obs, "next_obs": next_obs}


def test_storage_fifo_eviction_and_global_positions() -> None:
    storage = TransitionStorage(5)
    assert storage.size == 0
    assert np.array_equal(insert_rows(storage, transitions(0, 3)), [0, 1, 2])
    assert np.array_equal(insert_rows(storage, transitions(3, 4)), [3, 4, 0, 1])
    assert storage.size == 5 and storage.next_position == 7 and storage.frames is None
    # Slots now hold ids 5, 6, 2, 3, 4 and those ids are their global positions.
    slots = np.arange(5)
    assert np.array_equal(gather(storage, slots)["action"], [5, 6, 2, 3, 4])
    assert np.array_equal(storage.positions_of(slots), [5, 6, 2, 3, 4])
    live, live_slots = storage.live_slots(np.array([0, 1, 2, 6, 7, -1]))
    assert np.array_equal(live, [False, False, True, True, False, False])
    assert np.array_equal(live_slots[live], [2, 1])


def test_storage_batch_larger_than_capacity_keeps_newest() -> None:
    storage = TransitionStorage(4)
    insert_rows(storage, transitions(0, 10))
    assert storage.next_position == 10 and storage.size == 4
    slots = np.arange(4)
    data = gather(storage, slots)
    assert np.array_equal(data["action"], storage.positions_of(slots))
    assert sorted(data["action"]) == [6, 7, 8, 9]
    np.testing.assert_array_equal(data["next_obs"][:, 0], data["obs"][:, 0] + 1)


def test_schema_mismatch_rejected_with_storage_untouched() -> None:
    core = make_core(8)
    core.insert(transitions(0, 3))
    before = {k: v.copy() for k, v in core.storage.arrays.items()}
    tree_before = core.tree.tree.copy()
    counts = (core.limiter.inserts, core.storage.next_position)
    for bad in (transitions(3, 2, obs_shape=(5,)), transitions(3, 2, dtype="uint8"),
                transitions(3, 2, obs_shape=(2, 2))):
        with pytest.raises(SchemaMismatch):
            core.insert(bad)
    for name, array in core.storage.arrays.items():
        assert np.array_equal(array, before[name])
    assert np.array_equal(core.tree.tree, tree_before)
    assert (core.limiter.inserts, core.storage.next_position) == counts


@pytest.mark.parametrize("field, value", [
    ("reward", np.nan), ("reward", np.inf), ("discount", 1.5), ("discount", -0.1), ("discount", np.nan),
    ("action", -1), ("obs", np.nan), ("next_obs", np.inf),
])
def test_bad_values_rejected_with_storage_untouched(field: str, value: float) -> None:
    core = make_core(8)
    core.insert(transitions(0, 3))
    before = {k: v.copy() for k, v in core.storage.arrays.items()}
    bad = transitions(3, 2)
    array = getattr(bad, field).copy()
    array.reshape(2, -1)[1, 0] = value
    setattr(bad, field, array)
    with pytest.raises(InsertRejected):
        core.insert(bad)
    assert core.size == 3 and core.limiter.inserts == 3
    for name, array in core.storage.arrays.items():
        assert np.array_equal(array, before[name])


def test_actor_priorities_are_used_with_alpha() -> None:
    core = make_core(8, alpha=0.5, priority_eps=0.0)
    core.insert(transitions(0, 3, priority=[4.0, 9.0, 16.0]))
    np.testing.assert_allclose(core.tree.get(np.arange(3)), [2.0, 3.0, 4.0])
    assert core.max_priority == pytest.approx(4.0)
    core.insert(transitions(3, 2))  # no priorities: the max so far
    np.testing.assert_allclose(core.tree.get([3, 4]), [4.0, 4.0])


@pytest.mark.parametrize("garbage", [[1.0, np.nan], [1.0, -2.0], [np.inf, 1.0]])
def test_garbage_actor_priorities_replaced_by_max(garbage: list[float]) -> None:
    core = make_core(8, alpha=1.0, priority_eps=0.0)
    core.insert(transitions(0, 1, priority=[7.0]))
    core.insert(transitions(1, 2, priority=garbage))
    np.testing.assert_allclose(core.tree.get([1, 2]), [7.0, 7.0])
    assert np.isfinite(core.tree.total) and core.tree.total == pytest.approx(21.0)


def test_importance_weights_max_normalised_with_beta() -> None:
    core = make_core(4, alpha=1.0, priority_eps=0.0)
    priorities = np.array([1.0, 2.0, 3.0, 4.0])
    core.insert(transitions(0, 4, priority=priorities))
    batch = core.sample(256, beta=0.5)
    probs = priorities / priorities.sum()
    expected = (4 * probs) ** -0.5
    expected /= expected.max()
    np.testing.assert_allclose(batch.weight, expected[batch.index], rtol=1e-6)
    assert batch.weight.dtype == np.float32 and batch.weight.max() == pytest.approx(1.0)
    assert batch.replay_size == 4
    np.testing.assert_allclose(core.sample(64, beta=0.0).weight, 1.0)
    # Rows are consistent: the tagged id equals the reported position.
    assert np.array_equal(batch.action, batch.index)
    np.testing.assert_array_equal(batch.obs[:, 0], batch.index)
    batch.validate()


def test_update_priorities_applies_live_and_ignores_evicted_and_garbage() -> None:
    core = make_core(4, alpha=1.0, priority_eps=0.0)
    core.insert(transitions(0, 6))  # positions 2..5 live, slots 2,3,0,1
    before = core.tree.tree.copy()
    applied = core.update_priorities(np.array([0, 1, 6, 100]), np.array([5.0, 5.0, 5.0, 5.0]))
    assert applied == 0 and np.array_equal(core.tree.tree, before)
    assert core.stale_priority_updates == 4
    applied = core.update_priorities(np.array([2, 5, 3, 4, 0]), np.array([10.0, 20.0, np.nan, -1.0, 9.0]))
    assert applied == 2
    np.testing.assert_allclose(core.tree.get([2, 1, 3, 0]), [10.0, 20.0, 1.0, 1.0])
    assert core.max_priority == pytest.approx(20.0)
    core.insert(transitions(6, 1))  # new items get the max priority
    assert core.tree.get([2])[0] == pytest.approx(20.0)


def test_sample_after_wraparound_returns_matching_positions() -> None:
    core = make_core(7)
    for start in range(0, 50, 5):
        core.insert(transitions(start, 5, priority=np.linspace(0.1, 3, 5)))
        batch = core.sample(32, beta=0.4)
        assert np.array_equal(batch.action, batch.index)
        live, _ = core.storage.live_slots(batch.index)
        assert live.all()


def test_uniform_mode() -> None:
    core = make_core(10, prioritized=False)
    core.insert(transitions(0, 10, priority=[100.0] + [0.001] * 9))
    assert core.tree is None
    batch = core.sample(20_000, beta=0.4)
    np.testing.assert_array_equal(batch.weight, 1.0)
    counts = np.bincount(batch.index, minlength=10)
    assert counts.min() > 1500 and counts.max() < 2500  # ~2000 each, priorities ignored
    assert core.update_priorities(np.arange(3), np.ones(3)) == 0


def test_sample_empty_raises() -> None:
    with pytest.raises(ValueError):
        make_core(4).sample(2, 0.4)


def test_state_round_trip_gives_identical_samples() -> None:
    core = make_core(16, seed=7)
    for start in range(0, 40, 8):
        core.insert(transitions(start, 8, priority=np.random.default_rng(start).uniform(0, 4, 8)))
    core.update_priorities(np.array([30, 31, 39]), np.array([9.0, 0.5, 3.0]))
    state = {k: np.array(v, copy=True) for k, v in core.state_dict().items()}
    reference = make_core(16, seed=7)
    reference.load_state_dict({k: v.copy() for k, v in state.items()})
    restored = make_core(16, seed=7)
    restored.load_state_dict(state)
    assert restored.size == core.size and restored.storage.next_position == core.storage.next_position
    assert (restored.limiter.inserts, restored.max_priority) == (core.limiter.inserts, core.max_priority)
    assert np.array_equal(restored.tree.tree, core.tree.tree)
    for _ in range(3):
        a, b = reference.sample(32, 0.6), restored.sample(32, 0.6)
        for name in ("obs", "action", "reward", "discount", "next_obs", "index", "weight"):
            assert np.array_equal(getattr(a, name), getattr(b, name)), name
    # And it keeps working: new inserts land at the right positions.
    restored.insert(transitions(40, 3))
    assert np.array_equal(gather(restored.storage, np.array([40 % 16]))["action"], [40])


def test_state_from_uniform_into_prioritized() -> None:
    uniform = make_core(8, prioritized=False)
    uniform.insert(transitions(0, 5))
    core = make_core(8)
    core.load_state_dict(uniform.state_dict())
    assert core.tree.total == pytest.approx(5.0)
    assert core.sample(8, 0.4).index.max() < 5


def test_capacity_mismatch_checkpoint_is_refused() -> None:
    core = make_core(16)
    core.insert(transitions(0, 4))
    other: ReplayCore = make_core(32)
    with pytest.raises(ValueError, match="capacity"):
        other.load_state_dict(core.state_dict())
    assert other.size == 0


def test_inconsistent_storage_state_is_refused() -> None:
    core = make_core(8)
    core.insert(transitions(0, 4))
    state = dict(core.state_dict())
    state["storage.positions"] = np.array([20, 9], dtype=np.int64)  # oldest after next
    target = make_core(8)
    with pytest.raises(ValueError, match="positions"):
        target.load_state_dict(state)
    assert target.size == 0 and target.storage.next_position == 0  # a refused checkpoint changes nothing
    state = dict(core.state_dict())
    state["storage.reward"] = state["storage.reward"][:2]
    with pytest.raises(ValueError, match="reward"):
        make_core(8).load_state_dict(state)
    state = dict(core.state_dict())
    state["sampler.leaves"] = np.full(8, np.nan)
    with pytest.raises(ValueError, match="priorities"):
        make_core(8).load_state_dict(state)


def test_set_ratio_validates_and_applies() -> None:
    core = make_core(8, samples_per_insert=1.0, error_buffer=10.0)
    core.set_ratio(proto.ReplayRatioArgs(4.0))
    assert (core.limiter.samples_per_insert, core.limiter.error_buffer) == (4.0, 10.0)
    core.set_ratio(proto.ReplayRatioArgs(2, 0))
    assert (core.limiter.samples_per_insert, core.limiter.error_buffer) == (2.0, 0.0)
    assert isinstance(core.limiter.samples_per_insert, float)
    for bad in ((0.0, None), (-1.0, None), (float("nan"), None), (True, None), ("4", None), (1.0, -1.0),
                (1.0, float("inf"))):
        with pytest.raises(proto.CommandError):  # the one rule of set_replay_ratio, before the core is reached
            core.set_ratio(proto.ReplayRatioArgs(*bad))
    assert (core.limiter.samples_per_insert, core.limiter.error_buffer) == (2.0, 0.0)


def test_prioritized_sampling_frequencies_follow_priorities_to_the_alpha() -> None:
    core = make_core(50, alpha=0.5, priority_eps=0.0, seed=3)
    priorities = np.random.default_rng(4).uniform(0.0, 9.0, 50)
    priorities[7] = 0.0  # never sampled
    core.insert(transitions(0, 50))
    core.update_priorities(np.arange(50), priorities)
    counts = np.zeros(50)
    draws = 0
    for _ in range(200):
        batch = core.sample(500, beta=1.0)
        np.add.at(counts, batch.index, 1)
        draws += 500
    expected = priorities ** 0.5 / (priorities ** 0.5).sum() * draws
    assert counts[7] == 0
    live = expected > 0
    chi2 = float(((counts[live] - expected[live]) ** 2 / expected[live]).sum())
    dof = int(live.sum()) - 1
    assert chi2 < dof + 6 * np.sqrt(2 * dof) + 10  # far above the 99.9th percentile of chi2(dof)
    # With beta = 1 the weighted sample is unbiased: mean of w * p over draws ~ uniform weighting.
    batch = core.sample(5000, beta=1.0)
    probs = priorities[batch.index] ** 0.5 / (priorities ** 0.5).sum()
    np.testing.assert_allclose(batch.weight, (1 / (50 * probs)) / (1 / (50 * probs)).max(), rtol=1e-5)


def test_demo_ratio_takes_a_fixed_share_and_weights_both_tables() -> None:
    core = make_core(100, demo_ratio=0.25, alpha=1.0, priority_eps=0.0, seed=5)
    core.insert(transitions(0, 100))
    core.load_demos(20, (4,), np.float32, [transitions(1000, 12), transitions(1012, 8)])
    assert core.demos.size == 20 and core.limiter.inserts == 100  # demonstrations are not actor inserts
    batch = core.sample(64, beta=0.5)
    assert int(batch.is_demo.sum()) == 16 and batch.is_demo.dtype == np.uint8
    demo = batch.is_demo == 1
    assert np.all(batch.action[demo] >= 1000) and np.all(batch.index[demo] == -1 - (batch.action[demo] - 1000))
    # Every row of each table has priority 1: a main row has probability 0.75/100, a demo row 0.25/20.
    p_main, p_demo = 0.75 / 100, 0.25 / 20
    w_main, w_demo = (120 * p_main) ** -0.5, (120 * p_demo) ** -0.5
    top = max(w_main, w_demo)
    np.testing.assert_allclose(batch.weight[~demo], w_main / top, rtol=1e-5)
    np.testing.assert_allclose(batch.weight[demo], w_demo / top, rtol=1e-5)
    assert core.limiter.samples == 48  # only the main table's rows count against the ratio
    # Demonstrations are never evicted, however much the actors send.
    core.insert(transitions(100, 500))
    assert core.demos.size == 20 and core.size == 100
    assert core.update_priorities(np.array([-1, -20, -21, 5]), np.array([4.0, 4.0, 4.0, 4.0])) == 2
    with pytest.raises(SchemaMismatch):
        core.load_demos(4, (5,), np.float32, [transitions(0, 4, obs_shape=(5,))])
