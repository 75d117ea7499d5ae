"""Learner test setup: a fixed seed, one torch thread (tiny networks; robust on a busy 2-core machine), harness."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from learner_harness import Harness


@pytest.fixture(autouse=True)
def _seed_and_threads() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(1)  # tiny nets: one thread is fastest, and robust on a busy machine


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Callable[..., Harness]]:
    """Makes learner services on real sockets (closed at the end of the test)."""
    made: list[Harness] = []

    def make(device: str = "cpu", **overrides: object) -> Harness:
        made.append(Harness(tmp_path, device, **overrides))
        return made[-1]

    yield make
    for h in made:
        h.close()
