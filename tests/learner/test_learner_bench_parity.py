"""The learner benchmark compares like with like: its bare PyTorch loop takes the same step as LearnerCore."""

from __future__ import annotations

import pytest
import torch

from flywheel import proto
from flywheel.bench.parts.learner_fed import fed_cases
from flywheel.bench.parts.learner_loops import ADAM_EPS, CLIP, LR, BareLoop, Case, interleaved
from flywheel.bench.runner import BenchContext, BenchError
from flywheel.services.learner.core import CoreConfig, LearnerCore


def test_bare_loop_and_learner_core_take_the_same_step() -> None:
    case = Case("tiny", "tiny", (4,), 3, 64, 1, 1)
    bare = BareLoop(case, torch.device("cpu"), None, seed=5)
    torch.manual_seed(5)
    core = LearnerCore((4,), 3, CoreConfig(lr=LR, adam_eps=ADAM_EPS, grad_clip_norm=CLIP))
    for a, b in zip(bare.online.parameters(), core.params, strict=True):
        assert torch.equal(a, b)  # same seed, same network
    t = {k: v.numpy() for k, v in bare.t.items()}
    batch = proto.SampleBatch(request_id=0, replay_size=1, index=torch.arange(64).numpy(), **t)
    for _ in range(3):
        td_bare = bare.step()
        result = core.update(batch)
        torch.testing.assert_close(result.td_abs, td_bare)
    for a, b in zip(bare.online.parameters(), core.params, strict=True):
        torch.testing.assert_close(a, b)


def test_interleaved_runs_every_loop_in_rotating_order() -> None:
    order: list[str] = []

    def loop(name: str):
        def seconds(n: int) -> float:
            order.append(name)
            return 0.5 * n

        return seconds

    rates = interleaved({"a": loop("a"), "b": loop("b"), "c": loop("c")}, n=30, rounds=3)
    assert rates == {"a": 2.0, "b": 2.0, "c": 2.0}
    assert order == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]


def test_fed_cases_are_the_nature_cnn_cases_batch_32_alone_when_quick() -> None:
    assert [c.key for c in fed_cases(BenchContext("learner"))] == ["nature32", "nature512"]
    assert [c.key for c in fed_cases(BenchContext("learner", quick=True))] == ["nature32"]
    picked = fed_cases(BenchContext("learner", options={"fed_cases": " nature512"}))
    assert [(c.key, c.batch, c.obs_shape, c.n_actions) for c in picked] == [("nature512", 512, (4, 84, 84), 7)]
    for bad in ("mlp128", "", "nature32,nature64"):
        with pytest.raises(BenchError, match="fed_cases="):
            fed_cases(BenchContext("learner", options={"fed_cases": bad}))
