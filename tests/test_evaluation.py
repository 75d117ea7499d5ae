"""flywheel.evaluation: the protocol's defaults and rows, the stall rule on the real Mario emulator, workers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from flywheel.evaluation import STALL_STEPS, Protocol, default_noop_max, evaluate, run_protocol
from flywheel.policy import Policy
from flywheel.services.learner.checkpoint import save_checkpoint
from flywheel.services.learner.core import CoreConfig, LearnerCore

MARIO = "SuperMarioBros-1-1-v0"


def _noop_checkpoint(folder: Path) -> Path:
    """A real Mario learner checkpoint whose network always prefers action 0 (NOOP)."""
    core = LearnerCore((4, 84, 84), 7, CoreConfig())
    core.env_id = MARIO  # type: ignore[attr-defined]
    with torch.no_grad():
        core.online.advantage.weight.zero_()
        core.online.advantage.bias.copy_(torch.tensor([1.0, 0, 0, 0, 0, 0, 0]))
    save_checkpoint(folder, core, weight_version=1)
    return folder


def test_stall_rule_ends_a_standing_mario_long_before_the_clock(tmp_path: Path) -> None:
    seen: list[dict] = []
    [record] = evaluate(MARIO, [5], checkpoint=str(_noop_checkpoint(tmp_path)), epsilon=0.0, stall_steps=120,
                        progress=seen.append)
    assert record["end"] == "stall" and record["length"] == 120 and record["success"] is False
    assert record["progress"] < 100 and seen == [record]  # NOOP: Mario stands at the start (~x 40)


@pytest.mark.system
def test_two_workers_give_the_same_per_seed_results_as_one() -> None:
    seeds = [11, 12, 13, 14]
    one = evaluate(MARIO, seeds, workers=1, stall_steps=80)
    two = evaluate(MARIO, seeds, workers=2, stall_steps=80)
    strip = [{k: v for k, v in r.items() if k != "seconds"} for r in one]
    assert strip == [{k: v for k, v in r.items() if k != "seconds"} for r in two]
    assert [r["seed"] for r in two] == seeds
    assert len({(r["progress"], r["length"]) for r in one}) > 1  # the seeds drive different random actions
    assert all(r["end"] in ("death", "stall", "clock") for r in one)


@pytest.mark.system
def test_noop_starts_and_the_stall_rule_figure_kept_beside_the_plain_one() -> None:
    seeds = [21, 22]
    cut = evaluate(MARIO, seeds, workers=2, stall_steps=STALL_STEPS, noop_max=30)
    plain = evaluate(MARIO, seeds, workers=2, stall_steps=0, noop_max=30)
    for c, p in zip(cut, plain, strict=True):
        assert 0 <= c["noops"] == p["noops"] <= 30  # drawn from the episode's own rng
        assert p["end"] != "stall" and c["progress"] == c["progress_stall_rule"]
        assert p["progress_stall_rule"] == c["progress"]  # what the rule would have kept, from the same episode
        assert p["success_stall_rule"] == c["success"] and p["progress"] >= c["progress"]
        assert p["length"] >= c["length"]
    assert [r["noops"] for r in evaluate(MARIO, [21, 22], stall_steps=60, noop_max=0)] == [0, 0]
    with pytest.raises(ValueError):
        evaluate(MARIO, [1], noop_max=-1)


@pytest.mark.slow  # thousands of emulator frames
def test_a_policy_object_plays_as_its_checkpoint_folder(tmp_path: Path) -> None:
    folder = _noop_checkpoint(tmp_path)
    from_folder = evaluate(MARIO, [5, 6], checkpoint=str(folder), epsilon=0.5, stall_steps=60)
    from_policy = evaluate(MARIO, [5, 6], checkpoint=Policy.load(folder), epsilon=0.5, stall_steps=60)
    assert [{k: v for k, v in r.items() if k != "seconds"} for r in from_policy] == \
        [{k: v for k, v in r.items() if k != "seconds"} for r in from_folder]
    random = evaluate(MARIO, [5, 6], epsilon=0.5, stall_steps=60)  # the checkpoint's half of the actions matter
    assert [r["length"] for r in random] != [r["length"] for r in from_policy]


@pytest.mark.slow  # thousands of emulator frames
def test_the_defaults_are_the_protocol_no_stall_rule_and_the_presets_no_op_starts(tmp_path: Path) -> None:
    """Before, an episode was cut after 250 steps without progress and began with no no-ops unless asked."""
    assert [default_noop_max(e) for e in (MARIO, "CartPole-v1", "SuperMarioBros-v0")] == [30, 0, 0]
    folder = _noop_checkpoint(tmp_path)  # Mario stands still: only a cut-off ends the episode early
    records = evaluate(MARIO, [21, 22], checkpoint=str(folder), epsilon=0.0, max_steps=STALL_STEPS + 5)
    assert [r["end"] for r in records] == ["max_steps"] * 2 and {r["length"] for r in records} == {STALL_STEPS + 5}
    assert [r["noops"] for r in records] == [9, 23]  # drawn from each episode's rng: default_rng(seed).integers(31)


def test_a_protocol_plays_each_epsilon_on_the_same_seeds(tmp_path: Path) -> None:
    from flywheel.stats import summarize

    core = LearnerCore((4,), 2, CoreConfig())
    core.env_id = "CartPole-v1"  # type: ignore[attr-defined]
    save_checkpoint(tmp_path, core, weight_version=3)
    seen: list[tuple[float, int]] = []
    out = run_protocol("CartPole-v1", str(tmp_path), Protocol(episodes=4, seed=7, epsilons=(0.5, 0.0)),
                       progress=lambda eps, r: seen.append((eps, r["seed"])))
    assert out["protocol"] == {"episodes": 4, "seed": 7, "epsilons": [0.5, 0.0], "noop_max": 0, "stall_steps": 0,
                               "max_steps": None}
    assert out["described"].startswith("4 episodes (seeds 7..10), epsilon 0.5 and 0, no no-op starts, no stall")
    assert sorted(seen) == sorted([(e, s) for e in (0.5, 0.0) for s in range(7, 11)])
    greedy = evaluate("CartPole-v1", range(7, 11), checkpoint=str(tmp_path), epsilon=0.0)
    half, zero = out["rows"]
    assert (half["epsilon"], zero["epsilon"]) == (0.5, 0.0) and zero["records"] == [
        {**r, "seconds": z["seconds"]} for r, z in zip(greedy, zero["records"], strict=True)]
    assert zero["return"] == summarize([r["return"] for r in greedy])
    assert zero["progress"] is zero["success"] is None and zero["measures"] == out["measures"] == {}  # CartPole: none
    for bad in ({"epsilons": (1.5,)}, {"epsilons": (0.1, 0.1)}, {"epsilons": ()}, {"episodes": 0},
                {"stall_steps": -1}, {"noop_max": -2}, {"max_steps": 0}):
        with pytest.raises(ValueError):
            Protocol(**bad)  # type: ignore[arg-type]
