"""Ape-X exploration: the schedule over actors and over all env slots, the set_exploration command, the core's rates."""

from __future__ import annotations

import numpy as np
import pytest
from test_actor_core import acted_and_greedy, make_core

from flywheel import proto
from flywheel.services.actor.exploration import Exploration, apex_epsilon, apex_epsilons


def test_apex_epsilon() -> None:
    assert apex_epsilon(0, 8) == pytest.approx(0.4)
    assert apex_epsilon(7, 8) == pytest.approx(0.4**8)
    assert apex_epsilon(0, 1) == pytest.approx(0.4)
    assert apex_epsilon(1, 3) == pytest.approx(0.4**4.5)
    values = [apex_epsilon(i, 16) for i in range(16)]
    assert values == sorted(values, reverse=True)
    assert apex_epsilon(3, 4, base=0.5, alpha=1.0) == pytest.approx(0.25)


@pytest.mark.parametrize("args", [
    {"epsilon": "abc"}, {"epsilon": 1.5}, {"epsilon": -0.1}, {"epsilon": True}, {"base": 0.0}, {"base": "x"},
    {"alpha": -1}, {"alpha": 1e9}, {"epsilon": 0.1, "alpha": "x"}, {}, {"epsilon": 0.1, "base": 0.5},
])
def test_bad_exploration_command_is_refused_and_changes_nothing(args: dict) -> None:
    exploration = Exploration(None, 0.4, 7.0)
    with pytest.raises(proto.CommandError):  # set_exploration's one rule: no bad value reaches the actor
        exploration.apply(proto.ExplorationArgs(**args))
    with pytest.raises(proto.CommandError):
        proto.parse_args("set_exploration", args)
    assert exploration == Exploration(None, 0.4, 7.0)


def test_exploration_command_sets_fixed_epsilon_or_schedule() -> None:
    exploration = Exploration(None, 0.4, 7.0)
    exploration.apply(proto.ExplorationArgs(epsilon=0.05))
    assert exploration == Exploration(0.05, 0.4, 7.0)
    np.testing.assert_array_equal(exploration.rates(1, 3, 4), np.full(4, 0.05))
    exploration.apply(proto.ExplorationArgs(base=0.5, alpha=3))
    assert exploration == Exploration(None, 0.5, 3.0)
    np.testing.assert_allclose(exploration.rates(1, 3, 4), apex_epsilons(1, 3, 4, base=0.5, alpha=3.0))
    exploration.apply(proto.ExplorationArgs(alpha=1))  # base stays
    assert exploration == Exploration(None, 0.5, 1.0)


def test_slots_of_all_actors_cover_the_whole_schedule() -> None:
    """2 actors x 4 envs: 8 distinct rates, 0.4 ** (1 + j) for slot j, as Ape-X gives 8 single-env actors."""
    rates = np.concatenate([apex_epsilons(i, 2, 4) for i in range(2)])
    np.testing.assert_allclose(rates, [apex_epsilon(j, 8) for j in range(8)])
    np.testing.assert_allclose(rates, 0.4 ** (1 + np.arange(8)))
    assert len(set(rates.round(12))) == 8


def test_slot_rates_follow_the_lease_as_actors_come_and_go() -> None:
    three = np.concatenate([apex_epsilons(i, 3, 4) for i in range(3)])
    assert three[0] == pytest.approx(0.4) and three[-1] == pytest.approx(0.4**8)
    assert np.all(np.diff(three) < 0)
    one = apex_epsilons(0, 1, 4)  # the last actor standing spans the schedule alone
    assert one[0] == pytest.approx(0.4) and one[-1] == pytest.approx(0.4**8)
    np.testing.assert_allclose(apex_epsilons(0, 1, 1), [0.4])
    np.testing.assert_allclose(apex_epsilons(1, 2, 2, base=0.5, alpha=1.0), 0.5 ** (1 + np.array([2, 3]) / 3))


def test_core_explores_each_slot_at_its_own_rate() -> None:
    """Slot 0 at epsilon 1 and slot 1 at epsilon 0: only slot 0's actions differ from greedy."""
    core = make_core(num_envs=2, n_step=1)
    actions, greedy_actions, streams = acted_and_greedy(core, np.array([1.0, 0.0]), steps=80)
    assert core.epsilon == 1.0 and core.slots == 2
    assert np.array_equal(actions[streams == 1], greedy_actions[streams == 1])
    assert np.mean(actions[streams == 0] != greedy_actions[streams == 0]) > 0.3
    with pytest.raises(ValueError, match="expected one epsilon or 2"):
        core.epsilon = np.array([0.1, 0.2, 0.3])
