"""Learner test setup: a fixed seed and one torch thread (tiny networks; robust on a busy 2-core machine)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _seed_and_threads() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)  # tiny nets: one thread is fastest, and robust on a busy machine
