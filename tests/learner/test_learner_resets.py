"""Shrink-and-perturb and weight decay: the schedule, the interpolation, AdamW's decoupled decay, and the loop
resetting on its schedule with a log line and a counter."""

from __future__ import annotations

import logging
import re

import numpy as np
import pytest
import torch
from learner_helpers import make_batch

from flywheel.services.learner.core import CoreConfig, LearnerCore, network_for
from flywheel.services.learner.resets import ResetSchedule, shrink_and_perturb
from flywheel.services.learner.settings import LearnerSettings


def test_the_schedule_resets_at_start_then_every_interval() -> None:
    schedule = ResetSchedule(interval=5, start=10)
    assert [u for u in range(30) if schedule.due(u)] == [10, 15, 20, 25]
    assert not any(ResetSchedule(interval=0, start=0).due(u) for u in range(30))  # off
    assert [u for u in range(8) if ResetSchedule(interval=3).due(u)] == [0, 3, 6]
    ending = ResetSchedule(interval=5, start=10, end=20)  # none after update 20: the last stretch stays free
    assert [u for u in range(40) if ending.due(u)] == [10, 15, 20]
    assert [u for u in range(40) if ResetSchedule(interval=5, start=10, end=24).due(u)] == [10, 15, 20]
    for bad in ({"interval": -1}, {"start": -1}, {"end": -1}, {"shrink": 1.5}):
        with pytest.raises(ValueError, match="reset"):
            ResetSchedule(**bad)  # type: ignore[arg-type]


def test_shrink_and_perturb_interpolates_towards_a_fresh_network() -> None:
    config = CoreConfig(hidden=16)
    torch.manual_seed(0)
    online, fresh = network_for((4,), 3, config), network_for((4,), 3, config)
    before = [p.detach().clone() for p in online.parameters()]
    shrink_and_perturb(online, fresh, 0.8)
    for old, new, f in zip(before, online.parameters(), fresh.parameters(), strict=True):
        torch.testing.assert_close(new.detach(), 0.8 * old + 0.2 * f.detach())
    assert any(not torch.equal(a, b.detach()) for a, b in zip(before, online.parameters(), strict=True))
    shrink_and_perturb(online, fresh, 0.0)  # all the way: the fresh network itself
    for new, f in zip(online.parameters(), fresh.parameters(), strict=True):
        torch.testing.assert_close(new.detach(), f.detach())
    with pytest.raises(ValueError, match="same architecture"):
        shrink_and_perturb(online, network_for((4,), 5, config), 0.5)


def test_weight_decay_takes_lr_times_its_share_of_every_weight_each_update() -> None:
    batch = make_batch(np.random.default_rng(1), 32)
    cores = []
    for decay in (0.0, 0.5):
        torch.manual_seed(3)
        cores.append(LearnerCore((4,), 2, CoreConfig(lr=1e-3, weight_decay=decay)))
    plain, decayed = cores
    assert type(plain.optimizer) is torch.optim.Adam and type(decayed.optimizer) is torch.optim.AdamW
    start = [p.detach().clone() for p in plain.online.parameters()]
    plain.update(batch)
    decayed.update(batch)
    for s, a, b in zip(start, plain.online.parameters(), decayed.online.parameters(), strict=True):
        torch.testing.assert_close(b.detach() - a.detach(), -1e-3 * 0.5 * s, atol=1e-7, rtol=1e-4)


def test_settings_validate_the_reset_and_decay_values() -> None:
    for bad in ({"reset_shrink": 1.5}, {"reset_interval_updates": -1}, {"reset_end_updates": -1},
                {"weight_decay": -0.1}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            LearnerSettings(**bad)  # type: ignore[arg-type]


def test_the_loop_shrinks_and_perturbs_on_its_schedule(harness, caplog: pytest.LogCaptureFixture) -> None:
    h = harness(reset_interval_updates=6, reset_start_updates=4, reset_shrink=0.5)
    with caplog.at_level(logging.INFO, logger="flywheel.learner"):
        h.loop.start()
        h.drive(lambda: h.core.steps >= 18 and h.counter("resets_total") >= 3)
    at = [int(m.group(1)) for r in caplog.records
          if (m := re.search(r"shrink-and-perturb at update (\d+): each online weight is now 0.50", r.getMessage()))]
    assert at[:3] == [4, 10, 16]
    # the loop runs on while the test reads: the last report counts the resets up to it, the log those after it too
    assert 3 <= h.counter("resets_total") <= len(at)
    off = harness()
    off.loop.start()
    off.drive(lambda: off.core.steps >= 10 and off.reports != [])
    assert "resets_total" not in off.reports[-1].counters  # not scheduled: not reported
