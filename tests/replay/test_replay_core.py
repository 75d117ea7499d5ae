"""RingStorage and ReplayCore: FIFO positions, schema checks, priorities, weights, uniform mode, state."""

from __future__ import annotations

import numpy as np
import pytest
from replay_helpers import make_core, transitions

from flywheel import proto
from flywheel.services.replay.core import ReplayCore
from flywheel.services.replay.storage import RingStorage, SchemaMismatch


def as_dict(batch: proto.TransitionBatch) -> dict[str, np.ndarray]:
    return {"obs": batch.obs, "action": batch.action, "reward": batch.reward, "discount": batch.discount,
            "next_obs": batch.next_obs}


def test_storage_fifo_eviction_and_global_positions() -> None:
    storage = RingStorage(5)
    assert storage.size == 0
    assert np.array_equal(storage.insert(as_dict(transitions(0, 3))), [0, 1, 2])
    assert np.array_equal(storage.insert(as_dict(transitions(3, 4))), [3, 4, 0, 1])
    assert storage.size == 5 and storage.next_position == 7
    # Slots now hold ids 5, 6, 2, 3, 4 and those ids are their global positions.
    slots = np.arange(5)
    assert np.array_equal(storage.gather(slots)["action"], [5, 6, 2, 3, 4])
    assert np.array_equal(storage.positions_of(slots), [5, 6, 2, 3, 4])
    live, live_slots = storage.live_slots(np.array([0, 1, 2, 6, 7, -1]))
    assert np.array_equal(live, [False, False, True, True, False, False])
    assert np.array_equal(live_slots[live], [2, 1])


def test_storage_batch_larger_than_capacity_keeps_newest() -> None:
    storage = RingStorage(4)
    storage.insert(as_dict(transitions(0, 10)))
    assert storage.next_position == 10 and storage.size == 4
    slots = np.arange(4)
    data = storage.gather(slots)
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
    assert np.array_equal(restored.storage.gather(np.array([40 % 16]))["action"], [40])


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
    state = core.state_dict()
    state["storage.next_position"] = np.array(9, dtype=np.int64)
    target = make_core(8)
    with pytest.raises(ValueError, match="inconsistent"):
        target.load_state_dict(state)
    assert target.size == 0 and target.storage.next_position == 0  # a refused checkpoint changes nothing
    state = core.state_dict()
    state["storage.reward"] = state["storage.reward"][:2]
    with pytest.raises(ValueError, match="rows"):
        make_core(8).load_state_dict(state)
