"""flywheel.evaluation: bootstrap summaries on known data, the stall rule on the real Mario emulator, workers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from flywheel.evaluation import STALL_STEPS, evaluate, summarize, wilson_interval
from flywheel.policy import Policy
from flywheel.services.learner.checkpoint import save_checkpoint
from flywheel.services.learner.core import CoreConfig, LearnerCore

MARIO = "SuperMarioBros-1-1-v0"


def test_summarize_known_data_and_a_seeded_bootstrap() -> None:
    s = summarize([1.0, 2.0, 3.0, 4.0], [True, False, False, False])
    assert (s["n"], s["mean"], s["median"], s["flag_rate"]) == (4, 2.5, 2.5, 0.25)
    assert 1.0 <= s["ci_low"] < 2.5 < s["ci_high"] <= 4.0
    assert summarize([1.0, 2.0, 3.0, 4.0]) == {**s, "flag_rate": None, "flag_ci_low": None,
                                               "flag_ci_high": None}  # the same resamples every time
    assert s["median_ci_low"] <= s["median"] <= s["median_ci_high"]
    assert s["flag_ci_low"] < 0.25 < s["flag_ci_high"]
    assert summarize([7.0] * 5)[("ci_low")] == summarize([7.0] * 5)["ci_high"] == 7.0
    data = np.random.default_rng(0).normal(100.0, 10.0, size=400)
    wide = summarize(data.tolist())
    half = 1.96 * data.std() / np.sqrt(len(data))  # the normal approximation the bootstrap should match
    assert wide["ci_low"] == pytest.approx(data.mean() - half, abs=0.15 * half)
    assert wide["ci_high"] == pytest.approx(data.mean() + half, abs=0.15 * half)
    with pytest.raises(ValueError):
        summarize([])
    with pytest.raises(ValueError):
        summarize([1.0, 2.0], [True])


def test_wilson_interval_matches_published_values() -> None:
    assert wilson_interval(0, 100) == pytest.approx((0.0, 0.0370), abs=5e-4)  # the rule of three's neighbour
    assert wilson_interval(50, 100) == pytest.approx((0.4038, 0.5962), abs=5e-4)
    assert wilson_interval(100, 100) == pytest.approx((0.9630, 1.0), abs=5e-4)
    with pytest.raises(ValueError):
        wilson_interval(3, 2)


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
    assert record["end"] == "stall" and record["length"] == 120 and record["flag"] is False
    assert record["x_pos_max"] < 100 and seen == [record]  # NOOP: Mario stands at the start (~x 40)


def test_two_workers_give_the_same_per_seed_results_as_one() -> None:
    seeds = [11, 12, 13, 14]
    one = evaluate(MARIO, seeds, workers=1, stall_steps=80)
    two = evaluate(MARIO, seeds, workers=2, stall_steps=80)
    strip = [{k: v for k, v in r.items() if k != "seconds"} for r in one]
    assert strip == [{k: v for k, v in r.items() if k != "seconds"} for r in two]
    assert [r["seed"] for r in two] == seeds
    assert len({(r["x_pos_max"], r["length"]) for r in one}) > 1  # the seeds drive different random actions
    assert all(r["end"] in ("death", "stall", "clock") for r in one)


def test_noop_starts_and_the_stall_rule_figure_kept_beside_the_plain_one() -> None:
    seeds = [21, 22]
    cut = evaluate(MARIO, seeds, workers=2, stall_steps=STALL_STEPS, noop_max=30)
    plain = evaluate(MARIO, seeds, workers=2, stall_steps=0, noop_max=30)
    for c, p in zip(cut, plain, strict=True):
        assert 0 <= c["noops"] == p["noops"] <= 30  # drawn from the episode's own rng
        assert p["end"] != "stall" and c["x_pos_max"] == c["x_pos_max_stall_rule"]
        assert p["x_pos_max_stall_rule"] == c["x_pos_max"]  # what the rule would have kept, from the same episode
        assert p["flag_stall_rule"] == c["flag"] and p["x_pos_max"] >= c["x_pos_max"]
        assert p["length"] >= c["length"]
    assert [r["noops"] for r in evaluate(MARIO, [21, 22], stall_steps=60, noop_max=0)] == [0, 0]
    with pytest.raises(ValueError):
        evaluate(MARIO, [1], noop_max=-1)


def test_a_policy_object_plays_as_its_checkpoint_folder(tmp_path: Path) -> None:
    folder = _noop_checkpoint(tmp_path)
    from_folder = evaluate(MARIO, [5, 6], checkpoint=str(folder), epsilon=0.5, stall_steps=60)
    from_policy = evaluate(MARIO, [5, 6], checkpoint=Policy.load(folder), epsilon=0.5, stall_steps=60)
    assert [{k: v for k, v in r.items() if k != "seconds"} for r in from_policy] == \
        [{k: v for k, v in r.items() if k != "seconds"} for r in from_folder]
    random = evaluate(MARIO, [5, 6], epsilon=0.5, stall_steps=60)  # the checkpoint's half of the actions matter
    assert [r["length"] for r in random] != [r["length"] for r in from_policy]
