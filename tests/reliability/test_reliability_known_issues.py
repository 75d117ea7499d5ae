"""Regressions for faults reported from real runs: each failed before its fix."""

from __future__ import annotations

import numpy as np
import pytest

from flywheel import proto
from flywheel.services.replay.core import ReplayConfig, ReplayCore

pytestmark = pytest.mark.timeout(60)
PIXELS = (4, 84, 84)


def _rows(count: int, start: int = 0) -> proto.Transition[np.ndarray]:
    obs = np.zeros((count, *PIXELS), np.uint8)
    obs[:, :, 0, 0] = (np.arange(start, start + count) % 251)[:, None]
    return proto.Transition(obs=obs, action=np.zeros(count, np.int64), reward=np.ones(count, np.float32),
                            discount=np.full(count, 0.99, np.float32), next_obs=obs + 1)


@pytest.mark.parametrize("dedup", [True, False])
def test_zero_new_rows_store_nothing_and_do_not_crash(dedup: bool) -> None:
    """storage._insert_frames once raised 'need at least one array to concatenate' on an empty chunk."""
    core = ReplayCore(ReplayConfig(capacity=64, min_size_to_sample=1, dedup_frames=dedup, seed=0))
    assert core.load_demos(5, PIXELS, np.uint8, [_rows(3), _rows(0), _rows(2, 3)]) == 5
    table = core.main
    keys = np.zeros(0, np.uint64)
    empty = _rows(0)
    assert table.insert(empty, keys, None) == 0
    full = _rows(4)
    table.insert(full, np.zeros(4, np.uint64), None)
    assert table.insert(empty, keys, None) == 0
    assert core.size == 4
    batch = core.sample(8, 0.4)
    assert batch.obs.shape == (8, *PIXELS)
