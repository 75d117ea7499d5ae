"""SumTree: sums, prefix-sum search, proportional sampling, odd capacities, state and input checks."""

from __future__ import annotations

import numpy as np
import pytest

from flywheel.services.replay.sumtree import SumTree


def brute_find(leaves: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """Index i with cumsum[i-1] <= target < cumsum[i] (the first such leaf with a positive value)."""
    cums = np.cumsum(leaves)
    return np.searchsorted(cums, targets, side="right")


@pytest.mark.parametrize("capacity", [1, 2, 3, 5, 7, 8, 13, 100, 1000])
def test_total_equals_sum_of_leaves_after_random_sets(capacity: int) -> None:
    rng = np.random.default_rng(capacity)
    tree = SumTree(capacity)
    reference = np.zeros(capacity)
    for _ in range(200):
        count = int(rng.integers(1, 2 * capacity + 2))
        slots = rng.integers(0, capacity, count)  # duplicates included: overwrites
        values = rng.exponential(1.0, count) * (rng.random(count) > 0.1)
        tree.set(slots, values)
        for slot, value in zip(slots, values, strict=True):  # later duplicates win
            reference[slot] = value
        assert np.array_equal(tree.get(np.arange(capacity)), reference)
        assert tree.total == pytest.approx(reference.sum(), rel=1e-12, abs=1e-12)
    # Every inner node is the sum of its children.
    inner = np.arange(1, tree.leaves)
    np.testing.assert_allclose(tree.tree[inner], tree.tree[2 * inner] + tree.tree[2 * inner + 1], rtol=1e-12)


@pytest.mark.parametrize("capacity", [1, 3, 6, 17, 64, 333])
def test_find_matches_brute_force_prefix_search(capacity: int) -> None:
    rng = np.random.default_rng(10 + capacity)
    tree = SumTree(capacity)
    leaves = rng.integers(0, 5, capacity).astype(np.float64)  # integers: exact sums, zeros included
    leaves[0] = max(leaves[0], 1.0)
    tree.set(np.arange(capacity), leaves)
    targets = np.concatenate([rng.uniform(0, leaves.sum(), 2000), np.cumsum(leaves)[:-1], [0.0]])
    targets = targets[targets < leaves.sum()]
    found = tree.find(targets)
    assert np.array_equal(found, brute_find(leaves, targets))
    assert np.all(leaves[found] > 0)


@pytest.mark.parametrize("capacity", [5, 12, 100])
def test_sample_frequencies_are_proportional_to_priorities(capacity: int) -> None:
    rng = np.random.default_rng(3)
    tree = SumTree(capacity)
    priorities = rng.uniform(0.1, 5.0, capacity)
    priorities[1] = 0.0  # never sampled
    tree.set(np.arange(capacity), priorities)
    draws = 200_000
    counts = np.zeros(capacity)
    for _ in range(20):
        np.add.at(counts, tree.sample(draws // 20, rng, capacity), 1)
    expected = priorities / priorities.sum() * draws
    assert counts[1] == 0
    live = expected > 0
    chi2 = float(((counts[live] - expected[live]) ** 2 / expected[live]).sum())
    dof = int(live.sum()) - 1
    # Stratified sampling is less noisy than multinomial; this bound is far above the 99.9th percentile.
    assert chi2 < dof + 6 * np.sqrt(2 * dof) + 10
    np.testing.assert_allclose(counts / draws, priorities / priorities.sum(), atol=0.01)


def test_sample_respects_limit_and_skips_empty_leaves() -> None:
    tree = SumTree(10)
    tree.set(np.arange(4), [1.0, 2.0, 3.0, 4.0])
    slots = tree.sample(5000, np.random.default_rng(0), 4)
    assert slots.min() >= 0 and slots.max() < 4
    assert set(np.unique(slots)) == {0, 1, 2, 3}


def test_capacity_one() -> None:
    tree = SumTree(1)
    tree.set([0], [2.5])
    assert tree.total == 2.5
    assert np.array_equal(tree.find([0.0, 1.0, 2.4]), [0, 0, 0])
    assert np.array_equal(tree.sample(7, np.random.default_rng(0), 1), np.zeros(7))
    tree.set([0], [0.5])
    assert tree.total == 0.5
    with pytest.raises(ValueError):
        SumTree(0)


def test_sample_zero_and_empty_tree() -> None:
    tree = SumTree(4)
    assert tree.sample(0, np.random.default_rng(0), 1).shape == (0,)
    with pytest.raises(ValueError, match="empty"):
        tree.sample(3, np.random.default_rng(0), 1)


def test_state_round_trip() -> None:
    rng = np.random.default_rng(1)
    tree = SumTree(37)
    tree.set(np.arange(37), rng.uniform(0, 3, 37))
    other = SumTree(37)
    other.load_state_dict(tree.state_dict())
    assert np.array_equal(other.tree, tree.tree)
    assert np.array_equal(other.sample(64, np.random.default_rng(5), 37), tree.sample(64, np.random.default_rng(5), 37))
    with pytest.raises(ValueError, match="leaves"):
        SumTree(36).load_state_dict(tree.state_dict())


@pytest.mark.parametrize("bad", [-1.0, np.nan, np.inf])
def test_rejects_negative_and_non_finite_values_untouched(bad: float) -> None:
    tree = SumTree(4)
    tree.set(np.arange(4), [1.0, 1.0, 1.0, 1.0])
    before = tree.tree.copy()
    with pytest.raises(ValueError):
        tree.set([0, 2], [2.0, bad])
    assert np.array_equal(tree.tree, before)
    with pytest.raises(IndexError):
        tree.set([4], [1.0])
    with pytest.raises(IndexError):
        tree.set([-1], [1.0])
