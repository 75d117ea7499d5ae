"""The transition record: its field specs build storage and message schemas, and every record of transitions derives
from it (actor rows, wire messages, device batches, demonstration files)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from flywheel import proto
from flywheel.demos.format import DemoFrames
from flywheel.proto.schema import ArraySpec
from flywheel.services.actor.nstep import Emitted
from flywheel.services.learner.staging import DeviceBatch


def test_the_fields_are_the_transition_and_their_rules() -> None:
    specs = {spec.name: spec for spec in proto.TRANSITION_FIELDS}
    assert tuple(specs) == proto.TRANSITION_NAMES == ("obs", "action", "reward", "discount", "next_obs")
    assert [s.name for s in proto.OBSERVATION_FIELDS] == ["obs", "next_obs"]
    assert [s.name for s in proto.SCALAR_FIELDS] == ["action", "reward", "discount"]
    assert specs["obs"].zeros(3, (4, 84, 84), "uint8").shape == (3, 4, 84, 84)
    assert specs["next_obs"].zeros(2, (5,), np.float32).dtype == np.float32
    assert specs["action"].zeros(3, (4, 84, 84), "uint8").dtype == np.int64
    assert specs["reward"].zeros(3, (5,), "float32").shape == (3,)
    assert specs["obs"].wire == ArraySpec(proto.OBS_DTYPES, 2, 4)
    assert specs["discount"].wire == ArraySpec(("float32",))


@pytest.mark.parametrize("record", [proto.TransitionBatch, proto.SampleBatch, Emitted, DeviceBatch])
def test_every_record_of_transitions_starts_with_the_record_s_fields(record: type) -> None:
    assert issubclass(record, proto.Transition)
    assert tuple(f.name for f in dataclasses.fields(record))[:5] == proto.TRANSITION_NAMES
    assert proto.array_fields(record)[:5] == proto.TRANSITION_FIELDS


@pytest.mark.parametrize("message", [proto.TransitionBatch, proto.SampleBatch])
def test_message_schemas_come_from_the_specs(message: type[proto.Message]) -> None:
    assert list(message.ARRAYS)[:5] == list(proto.TRANSITION_NAMES)
    for spec in proto.TRANSITION_FIELDS:
        assert message.ARRAYS[spec.name] == spec.wire


def test_select_takes_rows_of_every_array_field_and_keeps_absent_ones() -> None:
    obs = np.arange(12, dtype=np.float32).reshape(6, 2)
    rows = Emitted(obs=obs, action=np.arange(6), reward=np.ones(6, np.float32), discount=np.zeros(6, np.float32),
                   next_obs=obs + 1, priority=np.arange(6, dtype=np.float32))
    picked = rows.select(np.array([True, False, True, False, False, True]))
    assert len(picked) == 3 and picked.stream is None
    assert picked.priority.tolist() == [0, 2, 5] and picked.action.tolist() == [0, 2, 5]
    assert np.array_equal(picked.next_obs, obs[[0, 2, 5]] + 1)
    device = DeviceBatch(**{k: torch.from_numpy(v) for k, v in rows.transitions().arrays().items()},
                         weight=torch.ones(6), is_demo=torch.ones(6, dtype=torch.uint8))
    halves = device.split(4)
    assert [h.size for h in halves] == [4, 2] and halves[1].is_demo is not None and halves[1].weight.shape == (2,)
    assert halves[1].obs.data_ptr() == device.obs[4:].data_ptr()  # views, no copies


def test_demo_frames_gather_observations_by_row_number() -> None:
    observations = np.arange(10, dtype=np.float32).reshape(5, 2)
    rows = proto.Transition(obs=np.array([0, 1, 2]), action=np.array([1, 0, 1]), reward=np.ones(3, np.float32),
                            discount=np.array([0.9, 0.9, 0.0], np.float32), next_obs=np.array([1, 2, 4]))
    one = DemoFrames(observations, rows)
    both = DemoFrames.concatenate([one, one])
    assert len(both) == 6 and both.observations.shape == (10, 2)
    taken = both.take(np.array([4, 5]))
    assert np.array_equal(taken.obs, observations[[1, 2]]) and np.array_equal(taken.next_obs, observations[[2, 4]])
    assert np.allclose(taken.discount, [0.9, 0.0]) and taken.action.tolist() == [0, 1]
