"""The learner benchmark compares like with like: its bare PyTorch loop takes the same step as LearnerCore."""

from __future__ import annotations

import torch

from flywheel import proto
from flywheel.bench.suites.learner import ADAM_EPS, CLIP, LR, BareLoop, Case, _interleaved
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

    rates = _interleaved({"a": loop("a"), "b": loop("b"), "c": loop("c")}, n=30, rounds=3)
    assert rates == {"a": 2.0, "b": 2.0, "c": 2.0}
    assert order == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
